#!/usr/bin/env python3
"""The llama.cpp side of `rag-bench model`: same measurements, same JSON shape.

Runs llama.cpp through the llama-cpp-python package, installed OUTSIDE this repository:
    python3 -m venv /work/venvs/llama
    CMAKE_ARGS="-DGGML_NATIVE=ON" /work/venvs/llama/bin/pip install llama-cpp-python==0.3.36
    /work/venvs/llama/bin/python scripts/peers/llamacpp_bench.py --model PATH --threads 2

Measures, like ours: prefill tok/s for T=128 and 512 (one batch, logits of the last token),
decode tok/s at depth 0 and 1000 (one token per call), and the verify-cost curve: one forward
of N = 1..64 new tokens at depth 1000 with logits for every new token (what speculative
verification needs), the sizes taking turns, median of 3x --reps rounds.
"""
import argparse, json, random, resource, statistics, time

import llama_cpp


def timed(fn, reps):
    xs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=32)
    a = ap.parse_args()
    rng = random.Random(0)

    def make(logits_all):
        return llama_cpp.Llama(model_path=a.model, n_ctx=2048, n_batch=512, n_ubatch=512,
                               n_threads=a.threads, n_threads_batch=a.threads,
                               logits_all=logits_all, verbose=False)

    m = make(False)
    vocab = m.n_vocab()
    toks = [rng.randrange(1000, min(vocab, 30000)) for _ in range(1200)]
    out = {"engine": "llama.cpp (llama-cpp-python %s)" % llama_cpp.__version__,
           "model": a.model, "threads": a.threads, "prefill_tok_s": {}, "decode_tok_s": {}, "verify_ms": {}}

    for t in (128, 512):
        def run():
            m.n_tokens = 0
            m.eval(toks[:t])
        m.n_tokens = 0; m.eval(toks[:8])  # warm-up
        out["prefill_tok_s"][str(t)] = t / (timed(run, a.reps) / 1000.0)

    for depth in (0, 1000):
        m.n_tokens = 0
        if depth:
            m.eval(toks[:depth])
        m.eval([toks[depth]])
        t0 = time.perf_counter()
        for i in range(a.decode_tokens):
            m.eval([toks[depth + 1 + i]])
        dt = time.perf_counter() - t0
        out["decode_tok_s"][str(depth)] = a.decode_tokens / dt
    del m

    m = make(True)
    m.n_tokens = 0
    m.eval(toks[:1000])
    # As ours: the sizes take turns, one forward each per round, 3x reps rounds after a
    # warm-up round, the median per size.
    sizes = (1, 2, 4, 8, 16, 32, 64)
    times = {n: [] for n in sizes}
    for r in range(3 * a.reps + 1):
        for n in sizes:
            m.n_tokens = 1000
            t = time.perf_counter()
            m.eval(toks[1000:1000 + n])
            if r > 0:
                times[n].append((time.perf_counter() - t) * 1000.0)
    for n in sizes:
        out["verify_ms"][str(n)] = statistics.median(times[n])
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
