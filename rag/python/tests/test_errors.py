"""Errors are Python exceptions with the Rust error's message; the module is typed."""

from pathlib import Path

import pytest

import ragkit
from conftest import MODEL


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"spec": "psychic"}, "spec"),
        ({"kv_cache": "f8"}, "kv_cache"),
        ({"backend": "gpu"}, "unknown backend"),
    ],
)
def test_bad_options_raise_value_error(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ragkit.Assistant(tmp_path / "idx", dense=False, **kwargs)


def test_bad_search_mode_raises_value_error(assistant):
    with pytest.raises(ValueError, match="unknown search mode"):
        assistant.search("warranty", mode="psychic")


def test_unopenable_index_raises_rag_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ragkit.RagError, match="opening the index"):
        ragkit.Assistant(blocker / "idx", dense=False)


def test_missing_path_raises_rag_error(tmp_path):
    a = ragkit.Assistant(tmp_path / "idx", dense=False)
    with pytest.raises(ragkit.RagError, match="no-such-folder"):
        a.add_paths([tmp_path / "no-such-folder"])


def test_unknown_model_raises_rag_error_on_first_question(tmp_path):
    a = ragkit.Assistant(tmp_path / "idx", model="no-such-model", dense=False)
    with pytest.raises(ragkit.RagError, match="no-such-model"):
        a.ask("hello", max_tokens=4)


def test_prompt_too_long_for_the_context_raises_rag_error(tmp_path):
    a = ragkit.Assistant(tmp_path / "idx", model=MODEL, dense=False, kv_capacity=64, threads=2)
    with pytest.raises(ragkit.RagError, match="context holds 64"):
        a.ask_with_context("Summarize.", "word " * 200, max_tokens=8)
    # The stream reports the same error when iterated.
    with pytest.raises(ragkit.RagError, match="context holds 64"):
        list(a.ask_stream("word " * 200, max_tokens=8, mode="bm25"))


def test_rag_error_is_an_exception():
    assert issubclass(ragkit.RagError, Exception)


def test_wrong_argument_types_raise_type_error(assistant):
    with pytest.raises(TypeError):
        assistant.add_paths("a string is not a list of paths")
    with pytest.raises(TypeError):
        assistant.search(42)


def test_stub_names_exist_and_package_is_typed():
    pkg = Path(ragkit.__file__).parent
    assert (pkg / "py.typed").is_file()
    stub = next(pkg.glob("*.pyi")).read_text()
    for name in ["Assistant", "Conversation", "AskStream", "Hit", "Source", "Timings",
                 "Speculation", "Answer", "IndexSummary", "RagError"]:
        assert f"class {name}" in stub
        assert hasattr(ragkit, name)
    for method in ["add_paths", "remove_path", "search", "ask", "ask_stream", "chat",
                   "chat_stream", "ask_with_context", "load_model", "finish_background_work"]:
        assert f"def {method}(" in stub
        assert getattr(ragkit.Assistant, method).__doc__
    for method in ["ask", "ask_stream", "reset"]:
        assert getattr(ragkit.Conversation, method).__doc__
