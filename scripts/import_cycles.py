#!/usr/bin/env python3
"""Import loops between the files of a Rust crate (issue #24's goal: none), and between its
top-level modules (issue #62's: dependencies point down only).

Usage: scripts/import_cycles.py crates/paradraft/src [crates/paradraft-cli/src ...]

Each file is a module; an edge A -> B is a `crate::`/`super::`/`self::` path in A's non-test
code (comments ignored) that names B or an item of B. A module's own ancestors (its parent
facade, e.g. `dflash/mod.rs` for `dflash/model.rs`) do not count. Prints every strongly
connected set of two or more files, then of two or more top-level modules (a file's edges
counted for the module it is in; test-only files, `tests.rs`, left out), and exits 1 when there
is one.
"""
import collections
import os
import re
import sys


def modules(root):
    files = {}
    for dp, _, fn in os.walk(root):
        for f in fn:
            if f.endswith(".rs"):
                rel = os.path.relpath(os.path.join(dp, f), root)
                mod = rel[:-3].replace("/mod", "").replace("/", "::")
                files["" if mod in ("lib", "main") else mod] = open(os.path.join(dp, f)).read()
    return files


def resolve(files, path, cur):
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    elif parts[0] == "super":
        base, parts = (cur.split("::")[:-1] if cur else []), parts[1:]
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    elif parts[0] == "self":
        base, parts = (cur.split("::") if cur else []), parts[1:]
    else:
        return None
    for i in range(len(parts), -1, -1):
        m = "::".join(base + parts[:i])
        if m in files:
            return m
    return None


def edges(files):
    e = collections.defaultdict(set)
    for mod, src in files.items():
        code = src.split("#[cfg(test)]")[0]
        code = "\n".join(l for l in code.split("\n") if not l.strip().startswith("//"))
        for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)(?:::\{([^;]*?)\})?", code):
            items = [m.group(1)]
            for it in (m.group(2) or "").split(","):
                it = it.strip().split(" as ")[0].strip("{} \n")
                if it:
                    items.append(m.group(1) + "::" + it.split("::{")[0])
            for it in items:
                t = resolve(files, it, mod)
                ancestor = t is not None and (t == "" or mod.startswith(t + "::"))
                if t is not None and t != mod and not ancestor:
                    e[mod].add(t)
    return e


def cycles(e, nodes):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in e.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def top_level(e):
    """The edges between top-level modules (`a::b` counts for `a`), tests left out."""
    top = collections.defaultdict(set)
    for a, bs in e.items():
        if a.split("::")[-1] == "tests":
            continue
        for b in bs:
            ta, tb = a.split("::")[0], b.split("::")[0]
            if ta != tb and ta and tb:
                top[ta].add(tb)
    return top


def main():
    found = 0
    for root in sys.argv[1:]:
        files = modules(root)
        e = edges(files)
        for c in cycles(e, list(files)):
            print(f"{root}: import loop between {', '.join(c)}")
            found += 1
        top = top_level(e)
        for c in cycles(top, sorted({m.split("::")[0] for m in files if m})):
            print(f"{root}: module loop between {', '.join(c)}")
            found += 1
    print(f"{found} import loop(s)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
