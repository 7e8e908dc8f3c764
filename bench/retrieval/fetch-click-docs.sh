#!/usr/bin/env bash
# Fetch the corpus of bench/retrieval/click-docs.jsonl: the documentation folder of the
# click 8.1.7 source distribution, checked by sha256 before it is unpacked.
# Usage: bench/retrieval/fetch-click-docs.sh DIR   (the corpus is DIR/click-8.1.7/docs)
set -euo pipefail
dir=${1:?usage: $0 DIR}
mkdir -p "$dir"
req=$(mktemp)
trap 'rm -f "$req"' EXIT
echo "click==8.1.7 --hash=sha256:ca9853ad459e787e2192211578cc907e7594e294c7ccc834310722b41b9ca6de" >"$req"
python3 -m pip download --quiet --no-deps --no-binary :all: --require-hashes -r "$req" -d "$dir"
tar -xzf "$dir/click-8.1.7.tar.gz" -C "$dir" click-8.1.7/docs
echo "$dir/click-8.1.7/docs"
