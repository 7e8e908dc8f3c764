#!/usr/bin/env bash
# The project's test command: fetch the models the tests use (idempotent), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh smollm2-135m qwen2.5-coder-0.5b minilm-l6-v2 qnn-htp
cargo test --release --workspace "$@"
