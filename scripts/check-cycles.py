#!/usr/bin/env python3
"""Fails when two source files of the crate import each other, directly or
through others: a newcomer should read every module top down without meeting
a file twice.

The graph has one node per file under src/. An edge A -> B means A names a
path (in a `use` or in code) that resolves to B's module. A parent module
file (`mod.rs` or `foo.rs` beside `foo/`) naming its own descendants is
allowed and not an edge: that is how a module re-exports its parts. Unit-test
code (`#[cfg(test)] mod tests`, `tests.rs`, `*_tests.rs`) is left out.

Usage: scripts/check-cycles.py [SRC_DIR]   (default: src)
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_path(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def strip_code(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    # Unit tests at the bottom of a file.
    m = re.search(r"#\[cfg\((?:all\()?test[^\]]*\]\s*mod\s+" + IDENT + r"\s*\{", text)
    if m:
        text = text[: m.start()]
    return text


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = tree.strip()
    depth = 0
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                prefix = tree[:i]
                inner = tree[i + 1 : tree.rindex("}")]
                parts, cur, d = [], "", 0
                for c in inner:
                    if c == "{":
                        d += 1
                    elif c == "}":
                        d -= 1
                    if c == "," and d == 0:
                        parts.append(cur)
                        cur = ""
                    else:
                        cur += c
                parts.append(cur)
                out = []
                for p in parts:
                    if p.strip():
                        out += expand_use(prefix + p.strip())
                return out
            depth += 1
    return [re.sub(r"\s+as\s+" + IDENT + "$", "", tree)]


def paths_in(text):
    out = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        out += expand_use(m.group(1))
    for m in re.finditer(r"\b(?:crate|super|self)(?:\s*::\s*" + IDENT + r")+", text):
        out.append(m.group(0))
    return [re.sub(r"\s+", "", p) for p in out]


def resolve(path, here, modules):
    parts = path.split("::")
    if parts[0] == "crate":
        base, rest = (), parts[1:]
    elif parts[0] in ("super", "self"):
        base, rest = here, parts
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    else:
        return None  # an external crate or a local name
    best = None
    for i in range(len(rest) + 1):
        cand = base + tuple(rest[:i])
        if cand in modules:
            best = cand
    return best


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs") and n != "tests.rs" and not n.endswith("_tests.rs"):
                p = os.path.join(root, n)
                files[module_path(src, p)] = p
    modules = set(files)
    edges = {m: set() for m in modules}
    for mod, path in files.items():
        with open(path, encoding="utf-8") as f:
            text = strip_code(f.read())
        for p in paths_in(text):
            target = resolve(p, mod, modules)
            if target is None or target == mod:
                continue
            if target[: len(mod)] == mod:
                continue  # a parent naming its own descendants
            edges[mod].add(target)
    cycles = strongly_connected(edges)
    if not cycles:
        print(f"no import cycles between the {len(files)} files under {src}/")
        return 0
    for comp in cycles:
        names = sorted(files[m] for m in comp)
        print("import cycle: " + " <-> ".join(names))
        for m in sorted(comp):
            for t in sorted(edges[m] & comp):
                print(f"    {files[m]} -> {files[t]}")
    return 1


def strongly_connected(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    sys.exit(main())
