#!/usr/bin/env bash
# `rag serve` driven by a client nobody here wrote: the official `openai` Python package,
# installed into a virtualenv made here (cached under the cargo target directory). Chat
# streamed and not, embeddings, models, errors and a 401 without the key, concurrent
# clients with one disconnecting mid-stream (scripts/server_client_test.py).
# Skips (exit 0, reason printed) when pip cannot reach the package index.
# Needs the smollm2-135m and minilm-l6-v2 models (scripts/fetch-model.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=3.51.0
TARGET=${CARGO_TARGET_DIR:-target}
if [ -n "${RAG_BIN:-}" ] && [ -x "$RAG_BIN" ]; then
    RAG=$RAG_BIN
else
    cargo build --release -q -p rag-cli
    RAG=$TARGET/release/rag
fi

VENV=$TARGET/venv-openai-$OPENAI_VERSION
if ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    log=$(mktemp)
    if ! "$VENV/bin/python" -m pip install -q --retries 1 --timeout 20 \
        "openai==$OPENAI_VERSION" >"$log" 2>&1; then
        if grep -qiE "NewConnectionError|ConnectTimeout|ReadTimeout|Max retries|connection broken|Temporary failure in name resolution|Network is unreachable|No route to host|ProxyError" "$log"; then
            echo "SKIP scripts/test-server.sh: pip cannot reach the package index:"
            tail -3 "$log"
            rm -rf "$VENV" "$log"
            exit 0
        fi
        cat "$log"
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
fi

work=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/docs"
printf '# Kestrel K2 console\n\n## Factory reset\n\nTo do a factory reset, hold both PAIR and MODE for 10 seconds until the screen flashes white.\n' >"$work/docs/reset.md"
printf '# Warranty\n\nThe Kestrel K2 console has a warranty of 3 years. The solar panel has a warranty of 5 years.\n' >"$work/docs/warranty.md"
printf '# Herons\n\nGrey herons nest in colonies called heronries, high in trees.\n' >"$work/docs/herons.md"

key=test-key-$RANDOM$RANDOM
RAG_API_KEY=$key "$RAG" serve --port 0 --index-dir "$work/index" --corpus "$work/docs" \
    --model smollm2-135m --threads 2 --max-tokens-limit 4096 >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
    grep -q "listening on" "$work/serve.log" && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "rag serve exited:"; cat "$work/serve.log"; exit 1
    fi
    sleep 0.2
done
url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/serve.log" | head -1)
[ -n "$url" ] || { echo "rag serve did not start:"; cat "$work/serve.log"; exit 1; }
status=0
"$VENV/bin/python" scripts/server_client_test.py "$url" "$key" || status=$?
if [ "$status" -ne 0 ]; then
    echo "--- rag serve log"; cat "$work/serve.log"
fi
exit "$status"
