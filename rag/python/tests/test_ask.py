"""Answers through the Python API: blocking, streamed, cancelled, over given context."""

import threading
import time

import pytest

import ragkit
from conftest import MODEL, run_json

QUESTION = "How long is the warranty of the Kestrel K2?"


def test_ask_answers_with_sources_and_timings(assistant, corpus):
    pieces = []
    answer = assistant.ask(QUESTION, top_k=4, max_tokens=24, on_text=pieces.append)
    assert answer.answer and answer.tokens_generated > 0
    assert "".join(pieces).strip() == answer.answer
    assert str(answer) == answer.answer
    assert not answer.cancelled
    assert [s.number for s in answer.sources] == list(range(1, len(answer.sources) + 1))
    assert answer.sources[0].path == str(corpus / "warranty.txt")
    t = answer.timings
    assert t.prefill_ms > 0 and t.first_token_ms > 0 and t.retrieve_ms >= 0
    assert answer.prompt_tokens > answer.reused_prompt_tokens >= 0
    assert answer.backend == "cpu"
    assert answer.speculation.mode == "sdnpu" and answer.speculation.steps > 0


def test_ask_equals_the_cli(assistant, index_dir, rag_bin):
    """Same index, question and options: the Rust CLI gives the same answer and sources."""
    q = "How do I factory reset the console?"
    answer = assistant.ask(q, top_k=4, max_tokens=32)
    cli = run_json(
        rag_bin, "ask", q, "--index-dir", str(index_dir), "--model", MODEL,
        "-k", "4", "--max-tokens", "32", "--threads", "2",
    )
    assert answer.answer == cli["answer"]
    assert answer.tokens_generated == cli["tokens_generated"]
    assert answer.prompt_tokens == cli["prompt_tokens"]
    assert [(s.number, s.path, s.chunk_id) for s in answer.sources] == [
        (s["number"], s["path"], s["chunk_id"]) for s in cli["sources"]
    ]


def test_stream_yields_the_same_answer_as_ask(assistant):
    q = "What does the warranty not cover?"
    blocking = assistant.ask(q, max_tokens=24)
    stream = assistant.ask_stream(q, max_tokens=24)
    assert stream.answer is None
    pieces = list(stream)
    assert len(pieces) > 1
    assert "".join(pieces).strip() == blocking.answer
    assert stream.answer is not None
    assert stream.answer.answer == blocking.answer
    assert [s.chunk_id for s in stream.answer.sources] == [s.chunk_id for s in blocking.sources]
    assert list(stream) == []  # exhausted


def test_on_text_returning_false_stops_generation(assistant):
    seen = []

    def two_pieces(piece):
        seen.append(piece)
        return len(seen) < 2

    answer = assistant.ask(QUESTION, max_tokens=64, on_text=two_pieces)
    assert answer.cancelled
    assert len(seen) == 2
    assert answer.tokens_generated < 64


def test_on_text_exception_propagates(assistant):
    def boom(piece):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        assistant.ask(QUESTION, max_tokens=16, on_text=boom)
    # The assistant still answers afterwards.
    assert assistant.ask(QUESTION, max_tokens=4).tokens_generated > 0


def test_cancel_stops_a_stream(assistant):
    with assistant.ask_stream(QUESTION, max_tokens=200) as stream:
        first = next(stream)
        assert first
        stream.cancel()
        rest = list(stream)  # pieces already on their way, then the end
    assert stream.answer.cancelled
    assert stream.answer.tokens_generated < 200
    assert len(rest) < 199


def test_leaving_a_with_block_cancels(assistant):
    with assistant.ask_stream(QUESTION, max_tokens=200) as stream:
        for _ in stream:
            break
    list(stream)
    assert stream.answer.cancelled and stream.answer.tokens_generated < 200


@pytest.fixture(scope="module")
def counting(tmp_path_factory, corpus):
    """BM25 only and no speculation: every generated token costs one model step, so the
    time of a generation is proportional to its length."""
    a = ragkit.Assistant(
        tmp_path_factory.mktemp("plain"), model=MODEL, spec="none", dense=False, threads=2
    )
    a.add_paths([corpus])
    return a


COUNT = "Count from 1 to 300, one number per line, with no other text."
LONG = "How do I factory reset the console?"  # SmolLM2 rambles past 100 tokens


def test_breaking_out_of_the_loop_cancels_generation(counting):
    full = counting.ask_stream(LONG, max_tokens=100, mode="bm25")
    assert len(list(full)) > 50
    assert full.answer.tokens_generated == 100 and not full.answer.cancelled
    decode_s = full.answer.timings.decode_ms / 1e3

    for _ in counting.ask_stream(LONG, max_tokens=100, mode="bm25"):
        break
    # The dropped stream cancelled the generation: the next question does not wait for
    # the other 99 tokens to be generated for nobody (one generation runs at a time).
    start = time.perf_counter()
    counting.ask_with_context("Say hi.", "", max_tokens=1)
    waited_s = time.perf_counter() - start
    assert waited_s < decode_s / 2, (waited_s, decode_s)


def test_ask_with_context_answers_from_the_context(counting):
    screen = "<button id=3>Send</button>\n<input id=4>To</input>"
    answer = counting.ask_with_context(
        "Task: send the draft. Next action?",
        screen,
        "Reply with one action: click(ID) or input(ID, \"text\").",
        max_tokens=16,
    )
    assert answer.answer and answer.sources == [] and answer.tokens_generated <= 16


def test_generation_releases_the_gil(counting):
    done = threading.Event()
    ticks = 0

    def generate():
        try:
            counting.ask_with_context(COUNT, "", max_tokens=48)
        finally:
            done.set()

    t = threading.Thread(target=generate)
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert ticks > 20


def test_a_residency_budget_switches_graphs_and_keeps_the_answer(
    assistant, index_dir, tmp_path, monkeypatch
):
    """`npu_memory_mb` below both forms of the block graphs: the prefill switches them
    progressively (on the CPU backend too, where a form is its activation buffers) and the
    answer stays the same; a budget below one form per block is a RagError."""
    monkeypatch.setenv("RAG_PROFILE_DIR", str(tmp_path))
    q = "How do I factory reset the console?"
    resident = assistant.ask(q, max_tokens=16)
    assert resident.timings.switching is None
    switching = ragkit.Assistant(index_dir, model=MODEL, threads=2, npu_memory_mb=5)
    answer = switching.ask(q, max_tokens=16)
    assert answer.answer == resident.answer
    sw = answer.timings.switching
    assert sw is not None and sw.schedule == "progressive-ls" and sw.switches == 1
    assert sw.stall_ms >= 0 and "progressive-ls" in repr(sw)
    too_small = ragkit.Assistant(index_dir, model=MODEL, threads=2, npu_memory_mb=1)
    with pytest.raises(ragkit.RagError, match="cannot hold one form of every block"):
        too_small.ask(q, max_tokens=4)


def test_sampling_is_reproducible_by_seed_and_equals_the_cli(assistant, index_dir, rag_bin):
    q = "What does the warranty not cover?"
    greedy = assistant.ask(q, max_tokens=24)
    assert assistant.ask(q, max_tokens=24, temperature=0.0, seed=3).answer == greedy.answer
    hot = [assistant.ask(q, max_tokens=24, temperature=1.3, seed=s).answer for s in (1, 2, 3)]
    assert assistant.ask(q, max_tokens=24, temperature=1.3, seed=1).answer == hot[0]
    streamed = "".join(assistant.ask_stream(q, max_tokens=24, temperature=1.3, seed=2))
    assert streamed.strip() == hot[1]
    assert len(set(hot)) > 1 and any(h != greedy.answer for h in hot), hot
    cli = run_json(
        rag_bin, "ask", q, "--index-dir", str(index_dir), "--model", MODEL,
        "--max-tokens", "24", "--threads", "2", "--temperature", "1.3", "--seed", "3",
    )
    assert cli["answer"] == hot[2]
    with pytest.raises(ValueError):
        assistant.ask(q, max_tokens=4, temperature=-1.0)
    with pytest.raises(ValueError):
        assistant.ask(q, max_tokens=4, top_p=0.0)


def test_samples_keep_one_answer_and_equal_the_cli(assistant, index_dir, rag_bin):
    q = "What does the warranty not cover?"
    single = assistant.ask(q, max_tokens=16, temperature=1.0, seed=7)
    assert single.candidates == []
    pieces = []
    many = assistant.ask(
        q, max_tokens=16, temperature=1.0, seed=7, samples=4, on_text=pieces.append
    )
    assert len(many.candidates) == 4
    assert many.candidates[0].text == single.answer
    assert "".join(pieces).strip() == many.answer
    top = max(c.votes for c in many.candidates)
    assert any(c.text == many.answer and c.votes == top for c in many.candidates)
    conf = assistant.ask(q, max_tokens=16, temperature=1.0, seed=7, samples=4, select="logprob")
    best = max(c.mean_logprob for c in conf.candidates)
    assert any(c.text == conf.answer and c.mean_logprob == best for c in conf.candidates)
    cli = run_json(
        rag_bin, "ask", q, "--index-dir", str(index_dir), "--model", MODEL,
        "--max-tokens", "16", "--threads", "2", "--temperature", "1.0", "--seed", "7",
        "--samples", "4",
    )
    assert [c["text"] for c in cli["candidates"]] == [c.text for c in many.candidates]
    assert cli["answer"] == many.answer
    cut = assistant.ask_with_context(
        "Next action:", "<button id=1>OK</button>", max_tokens=16, temperature=1.0,
        seed=7, samples=3, stop=[" "],
    )
    assert all(" " not in c.text for c in cut.candidates), cut.candidates
    with pytest.raises(ValueError):
        assistant.ask(q, max_tokens=4, samples=0)
    with pytest.raises(ValueError):
        assistant.ask(q, max_tokens=4, samples=2, select="best")
