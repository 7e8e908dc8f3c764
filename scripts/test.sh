#!/usr/bin/env bash
# The project's test command: fetch the models the tests use (idempotent), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh smollm2-135m qwen2.5-coder-0.5b minilm-l6-v2 qnn-htp
# The C ABI's tests link its shared library, which `cargo test` does not build.
cargo build --release -p rag-capi
cargo test --release --workspace "$@"
# `rag serve` driven by the official openai Python client (skips if pip cannot reach its
# index); reuses the binary the tests above built.
RAG_BIN="${CARGO_TARGET_DIR:-target}/release/rag" scripts/test-server.sh
