"""Indexing and retrieval through the Python API, checked against `rag search --json`."""

import shutil
import threading
import time

import pytest

import ragkit
from conftest import run_json

QUERIES = [
    "How long is the warranty?",
    "factory reset",
    "kestrelctl calibrate anemometer",
    "battery replacement interval",
]


def test_reindexing_unchanged_corpus_reads_nothing(assistant, corpus):
    again = assistant.add_paths([corpus])
    assert again.files_indexed == 0
    assert again.files_unchanged + sum(again.skipped.values()) == again.files_seen
    assert again.chunks_added == 0 and again.chunks_removed == 0


def test_hits_carry_locations_and_text(assistant, corpus):
    hits = assistant.search("How long is the warranty?", 3)
    assert 1 <= len(hits) <= 3
    best = hits[0]
    assert best.path == str(corpus / "warranty.txt")
    first, last = best.lines
    assert 1 <= first <= last
    assert best.page is None
    assert best.location == f"{best.path}:{first}-{last}"
    assert "warranty" in best.text.lower()
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("mode", ["hybrid", "bm25", "dense"])
def test_search_equals_the_cli(assistant, index_dir, rag_bin, query, mode):
    hits = assistant.search(query, 5, mode=mode)
    cli = run_json(rag_bin, "search", query, "--index-dir", str(index_dir), "-k", "5", "--mode", mode)
    assert len(hits) == len(cli) > 0
    for h, c in zip(hits, cli):
        assert h.chunk_id == c["chunk_id"]
        assert h.path == c["path"]
        assert h.lines == (tuple(c["lines"]) if c["lines"] else None)
        assert h.page == c["page"]
        assert h.heading == c["heading"]
        assert h.text == c["text"]
        assert h.score == pytest.approx(c["score"], rel=1e-6, abs=1e-7)
        assert h.bm25_rank == c["bm25_rank"]
        assert h.dense_rank == c["dense_rank"]


def test_bm25_hits_have_no_dense_rank(assistant):
    hits = assistant.search("anemometer", 4, mode="bm25")
    assert hits and all(h.dense_rank is None and h.bm25_rank is not None for h in hits)


def test_remove_path_drops_its_chunks(tmp_path, corpus):
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(corpus / "warranty.txt", docs / "warranty.txt")
    shutil.copy(corpus / "specs.txt", docs / "specs.txt")
    a = ragkit.Assistant(tmp_path / "idx", dense=False)
    phases = []
    summary = a.add_paths([docs], progress=lambda phase, done, total, current: phases.append(phase))
    assert summary.files_indexed == 2
    assert "parse" in phases
    warranty = str((docs / "warranty.txt").resolve())
    assert warranty in {h.path for h in a.search("warranty", 10, mode="bm25")}
    assert a.remove_path(docs / "warranty.txt") == 1
    assert warranty not in {h.path for h in a.search("warranty", 10, mode="bm25")}
    assert a.remove_path(docs / "warranty.txt") == 0


def test_indexing_releases_the_gil(tmp_path, corpus):
    """Another Python thread runs while add_paths works (it would stall if the GIL were held)."""
    a = ragkit.Assistant(tmp_path / "idx", dense=True)
    done = threading.Event()
    ticks = 0

    def index():
        try:
            a.add_paths([corpus])
        finally:
            done.set()

    t = threading.Thread(target=index)
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    # Embedding 40+ chunks takes far longer than 20 ms on any machine.
    assert ticks > 20
