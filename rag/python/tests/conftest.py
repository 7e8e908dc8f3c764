"""Shared fixtures: the sample corpus indexed once per session, and the `rag` binary.

Environment:
- RAG_BIN: path of the `rag` binary; the tests that compare with the Rust CLI's output
  are skipped without it (scripts/test-python.sh builds it and sets it).
- RAG_MODEL_DIR: where the models are (default ~/.cache/rag/models; the tests use
  smollm2-135m and minilm-l6-v2, fetched by scripts/fetch-model.sh).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

import ragkit

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "examples" / "sample-corpus"
MODEL = "smollm2-135m"


@pytest.fixture(scope="session")
def corpus() -> Path:
    assert CORPUS.is_dir(), f"sample corpus missing at {CORPUS}"
    return CORPUS


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("index")


@pytest.fixture(scope="session")
def assistant(index_dir, corpus) -> ragkit.Assistant:
    """The sample corpus, indexed with dense vectors, answering with SmolLM2-135M."""
    a = ragkit.Assistant(index_dir, model=MODEL, threads=2)
    summary = a.add_paths([corpus])
    assert summary.files_indexed > 0 and summary.chunks_total > 0
    return a


@pytest.fixture(scope="session")
def rag_bin():
    path = os.environ.get("RAG_BIN")
    if not path:
        pytest.skip("RAG_BIN is not set: no `rag` binary to compare with")
    assert Path(path).is_file(), f"RAG_BIN={path} does not exist"
    return path


def run_json(rag_bin: str, *args: str):
    """Runs `rag ARGS --json` and parses its standard output."""
    out = subprocess.run(
        [rag_bin, *args, "--json"], check=True, capture_output=True, text=True, timeout=600
    )
    return json.loads(out.stdout)
