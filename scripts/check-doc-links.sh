#!/usr/bin/env bash
# Checks that every relative link in the repository's Markdown files, and every
# `dir/file.md` or `file.md#anchor` cited in a Rust comment (outside quotes and backticks,
# relative to the repository root), points at a file that exists and, when it names an
# anchor, at a heading (GitHub's slug) or an `<a id="...">` in that file.
# Usage: scripts/check-doc-links.sh   (from anywhere inside the repository; exit 1 on a bad link)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
git ls-files '*.md' '*.rs' | python3 -c '
import os, re, sys

def slug(h):
    h = re.sub(r"<[^>]+>", "", h).strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")

anchors_cache = {}
def anchors(path):
    if path not in anchors_cache:
        seen, out, fence = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.lstrip().startswith("```"):
                fence = not fence
            if fence:
                continue
            out.update(re.findall(r"<a id=\"([^\"]+)\"", line))
            m = re.match(r"#{1,6} +(.*?) *#*$", line.rstrip("\n"))
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
        anchors_cache[path] = out
    return anchors_cache[path]

bad = 0
def check(src, lineno, target, base):
    global bad
    path, _, frag = target.partition("#")
    full = os.path.normpath(os.path.join(base, path)) if path else src
    if not os.path.exists(full):
        print(f"{src}:{lineno}: missing file: {target}")
        bad += 1
    elif frag and full.endswith(".md") and frag not in anchors(full):
        print(f"{src}:{lineno}: missing anchor: {target}")
        bad += 1

for src in sys.stdin.read().split():
    if src.startswith("target/") or not os.path.exists(src):
        continue
    fence = False
    for i, line in enumerate(open(src, encoding="utf-8", errors="replace"), 1):
        if src.endswith(".md"):
            if line.lstrip().startswith("```"):
                fence = not fence
            if fence:
                continue
            line = re.sub(r"`[^`]*`", "", line)
            for t in re.findall(r"\]\(([^)\s]+)\)", line):
                if not re.match(r"[a-z]+:", t):
                    check(src, i, t, os.path.dirname(src))
        elif "//" in line:
            comment = re.sub(r"`[^`]*`|\"[^\"]*\"", "", line.split("//", 1)[1])
            for t in re.findall(r"([\w./-]+\.md(?:#[\w-]+)?)", comment):
                if "/" in t or "#" in t:
                    check(src, i, t.rstrip("."), ".")
sys.exit(1 if bad else 0)
'
