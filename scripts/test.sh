#!/usr/bin/env bash
# The project's test command: fetch the models the tests use (idempotent), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# qwen2.5-coder-1.5b is the default model of `rag ask` (1.1 GB, cached after the first run);
# multilingual-e5-small (72 MB) is the optional multilingual embedder's golden and index tests.
scripts/fetch-model.sh smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b minilm-l6-v2 multilingual-e5-small qnn-htp
# The C ABI's tests link its shared library, which `cargo test` does not build.
cargo build --release -p rag-capi
cargo test --release --workspace "$@"
# One answer from the default model over the sample corpus must cite its source.
ask_dir=$(mktemp -d)
if ! "${CARGO_TARGET_DIR:-target}/release/rag" ask --index-dir "$ask_dir/index" \
    --corpus examples/sample-corpus --threads 2 --max-tokens 160 \
    "How do I do a factory reset of the Kestrel K2 console?" >"$ask_dir/out" 2>"$ask_dir/err"; then
    cat "$ask_dir/out" "$ask_dir/err"
    echo "FAIL: rag ask with the default model exited non-zero" >&2
    exit 1
fi
cat "$ask_dir/out"
tail -1 "$ask_dir/err"
if ! grep -qx 'Sources:' "$ask_dir/out" ||
    ! grep -qE '^\[[0-9]+\] .*guide/troubleshooting\.md' "$ask_dir/out"; then
    echo "FAIL: rag ask with the default model cited no source line for guide/troubleshooting.md" >&2
    exit 1
fi
rm -rf "$ask_dir"
# `rag serve` driven by the official openai Python client (skips if pip cannot reach its
# index); reuses the binary the tests above built.
RAG_BIN="${CARGO_TARGET_DIR:-target}/release/rag" scripts/test-server.sh
