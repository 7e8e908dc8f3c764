#!/usr/bin/env python3
"""The llama.cpp side of `rag-bench e2e`: a worker that answers prompts greedily.

Runs llama.cpp through the llama-cpp-python package, installed OUTSIDE this repository
(see llamacpp_bench.py). `rag-bench e2e` starts it once per model and talks JSON lines:

  on start      -> {"ready": true, "engine": ..., "load_ms": ...}
  {"op": "tokenize", "text": T}
                -> {"tokens": [...]}   (special tokens parsed, BOS as the model asks)
  {"op": "generate", "tokens": [...], "max_tokens": N}
                -> {"tokens": [...], "text": ..., "ttft_ms": ..., "answer_ms": ...,
                    "prompt_evaluated": ...}
  {"op": "stats"} -> {"peak_rss_mb": ...}

Generation is llama-cpp-python's own `Llama.generate` (which keeps the longest common
prefix of the previous prompt in its KV cache, as a llama.cpp server does), greedy
(temperature 0, no penalties), ending at an end-of-generation token or after N tokens.
"""
import argparse, json, resource, sys, time

import llama_cpp


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    a = ap.parse_args()

    t = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.n_ctx, n_batch=512, n_ubatch=512,
                          n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    load_ms = (time.perf_counter() - t) * 1000.0
    vocab = llm._model.vocab
    reply({"ready": True, "load_ms": load_ms,
           "engine": "llama.cpp (llama-cpp-python %s)" % llama_cpp.__version__})

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "tokenize":
            toks = llm.tokenize(req["text"].encode("utf-8"), add_bos=True, special=True)
            reply({"tokens": toks})
        elif op == "generate":
            prompt = req["tokens"]
            # The prefix generate keeps from the previous prompt (it evaluates the rest,
            # and at least one token).
            kept = _common(prompt, llm._input_ids[:llm.n_tokens])
            evaluated = len(prompt) - min(kept, len(prompt) - 1)
            out, ttft = [], None
            t0 = time.perf_counter()
            for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                    repeat_penalty=1.0, reset=True):
                if ttft is None:
                    ttft = (time.perf_counter() - t0) * 1000.0
                if llama_cpp.llama_vocab_is_eog(vocab, tok):
                    break
                out.append(tok)
                if len(out) >= req["max_tokens"]:
                    break
            answer_ms = (time.perf_counter() - t0) * 1000.0
            text = llm.detokenize(out).decode("utf-8", errors="replace")
            reply({"tokens": out, "text": text, "ttft_ms": ttft, "answer_ms": answer_ms,
                   "prompt_evaluated": evaluated})
        elif op == "stats":
            reply({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0})
        else:
            reply({"error": "unknown op %r" % op})


def _common(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


if __name__ == "__main__":
    main()
