#!/usr/bin/env bash
# Tests of the Python package (rag/python): builds and installs it with pip into a fresh
# virtual environment outside the source tree (under the cargo target directory), then runs
# its pytest suite, which also compares results with the `rag` binary built here.
# Only pip reaches a package registry (the build requirement maturin, pytest, the models).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
venv="$target/python-tests-venv"
scripts/fetch-model.sh smollm2-135m minilm-l6-v2
cargo build --release -p rag-cli
rm -rf "$venv"
python3 -m venv "$venv"
# The same build a user gets from `python3 -m pip install ./rag/python`; it shares the
# target directory, so it compiles only what the cargo build above did not.
CARGO_TARGET_DIR="$target" "$venv/bin/python" -m pip install --quiet ./rag/python "pytest==9.2.0"
cd rag/python/tests
RAG_BIN="$target/release/rag" "$venv/bin/python" -m pytest -q "$@"
