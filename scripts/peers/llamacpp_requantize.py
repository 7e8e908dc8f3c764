#!/usr/bin/env python3
"""Re-quantize a GGUF with llama.cpp (through llama-cpp-python, installed OUTSIDE this repo),
e.g. Q4_K_M -> Q4_0, llama.cpp's best CPU format, for `rag-bench vs-llamacpp --requant q4_0`.

    /work/venvs/llama/bin/python scripts/peers/llamacpp_requantize.py IN.gguf OUT.gguf --type q4_0
"""
import argparse, ctypes, sys

import llama_cpp

TYPES = {"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--type", choices=sorted(TYPES), default="q4_0")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = TYPES[a.type]
    p.nthread = a.threads
    p.allow_requantize = True  # the source is already quantized
    rc = llama_cpp.llama_model_quantize(a.input.encode(), a.output.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed with code {rc}")


if __name__ == "__main__":
    main()
