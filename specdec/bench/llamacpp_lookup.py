#!/usr/bin/env python3
"""llama.cpp's prompt-lookup decoding on the same prompts as `rag-bench specdec`.

Runs llama.cpp through the llama-cpp-python package installed OUTSIDE this repository
(e.g. a virtualenv at /work/venvs/llama):

    /work/venvs/llama/bin/python specdec/bench/llamacpp_lookup.py \
        --model ~/.cache/rag/models/qwen2.5-coder-0.5b.gguf --category summarization \
        --limit 10 --max-tokens 128 --threads 2 --tokens-out /tmp/prompts.jsonl

Prompts: first turn of each record of the category, formatted with the model's own chat
template (GGUF metadata, rendered by llama-cpp-python's Jinja2 formatter) and tokenized by
llama.cpp. `--tokens-out` writes them as JSONL {question_id, tokens} so that
`rag-bench specdec --prompt-tokens FILE` runs on exactly the same token ids.

Modes: `none` (greedy, one token per step) and `lookup` (LlamaPromptLookupDecoding with
its defaults max_ngram_size=2, num_pred_tokens=10), both greedy (temperature 0).
Decode time is measured from the first generated token to the last, like ours.
"""
import argparse, json, os, time

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATASET = os.path.join(HERE, "..", "..", "..", "shared", "data", "spec_bench", "question.jsonl")
UI_DATASET = os.path.join(HERE, "..", "..", "..", "shared", "data", "ui", "droidtask_ui.jsonl")


def load_prompts(path, category, limit):
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("category") == category:
                out.append((r["question_id"], r["turns"][0]))
            if len(out) == limit:
                break
    return out


def run(llm, tokens, max_tokens, eog):
    llm.reset()
    t0 = time.perf_counter()
    t_first = None
    out = []
    for tok in llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        if t_first is None:
            t_first = time.perf_counter()
        if tok in eog:
            break
        out.append(int(tok))
        if len(out) >= max_tokens:
            break
    t_end = time.perf_counter()
    return out, (t_first - t0) * 1e3, (t_end - t_first) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset")
    ap.add_argument("--category", default="summarization")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="none,lookup")
    ap.add_argument("--tokens-out")
    a = ap.parse_args()
    dataset = a.dataset or (UI_DATASET if a.category == "ui" else DEFAULT_DATASET)
    prompts = load_prompts(dataset, a.category, a.limit)
    if not prompts:
        raise SystemExit("no prompts of category %r in %s" % (a.category, dataset))

    def make(draft):
        return llama_cpp.Llama(model_path=os.path.expanduser(a.model), n_ctx=4096, n_batch=512,
                               n_threads=a.threads, n_threads_batch=a.threads, verbose=False,
                               draft_model=draft,
                               # llama-cpp-python 0.3.36 sizes its score buffer from this
                               # argument even though a draft model forces all logits on.
                               logits_all=draft is not None)

    base = make(None)
    meta = base.metadata
    fmt = Jinja2ChatFormatter(template=meta["tokenizer.chat_template"],
                              eos_token=base.detokenize([base.token_eos()]).decode("utf-8", "ignore"),
                              bos_token=base.detokenize([base.token_bos()]).decode("utf-8", "ignore"))
    eog = {base.token_eos()}
    for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eos_token_id"):
        if k in meta:
            eog.add(int(meta[k]))
    toks = []
    for qid, text in prompts:
        rendered = fmt(messages=[{"role": "user", "content": text}]).prompt
        toks.append((qid, base.tokenize(rendered.encode("utf-8"), add_bos=True, special=True)))
    if a.tokens_out:
        with open(a.tokens_out, "w") as f:
            for qid, t in toks:
                f.write(json.dumps({"question_id": qid, "tokens": t}) + "\n")

    modes = a.modes.split(",")
    result = {"engine": "llama.cpp (llama-cpp-python %s)" % llama_cpp.__version__,
              "model": os.path.basename(a.model), "category": a.category, "prompts": len(toks),
              "max_tokens": a.max_tokens, "threads": a.threads, "modes": {}}
    outputs = {}
    for mode in modes:
        llm = base if mode == "none" else make(LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10))
        n_dec, dec_ms, pre_ms = 0, 0.0, 0.0
        outs = []
        for qid, t in toks:
            out, p, d = run(llm, t, a.max_tokens, eog)
            outs.append(out)
            n_dec += max(0, len(out) - 1)
            dec_ms += d
            pre_ms += p
        outputs[mode] = outs
        result["modes"][mode] = {"decode_tok_s": 1e3 * n_dec / dec_ms if dec_ms > 0 else 0.0,
                                 "ms_per_token": dec_ms / n_dec if n_dec else 0.0,
                                 "prefill_ms": pre_ms / len(toks)}
    if "none" in outputs:
        for mode in modes:
            m = result["modes"][mode]
            m["speedup"] = result["modes"]["none"]["ms_per_token"] / m["ms_per_token"] if m["ms_per_token"] else 0.0
            m["mismatches"] = sum(1 for x, y in zip(outputs[mode], outputs["none"]) if x != y)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
