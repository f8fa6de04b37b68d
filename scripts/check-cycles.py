#!/usr/bin/env python3
"""Lists import cycles between the files of each crate and fails on one.

A file depends on the file that defines each item it names through `crate::`, `super::`
or `self::` paths (in `use` lists and in code). A `pub use` re-export in a module file is
followed to where the item is defined, so a `mod.rs` that re-exports its children is not
a cycle with them; `mod x;` declarations are not dependencies. Inline modules (`mod tests
{ .. }`) belong to their file. usage: scripts/check-cycles.py [CRATE_DIR ...]
"""

import os
import re
import sys

CRATES = ["engine", "backends", "shaders", "cpu", "cli", "tests", "web-demo"]

ITEM = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+|async\s+|const\s+|extern\s+\"C\"\s+)*"
    r"(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+(\w+)"
)
MOD_DECL = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
MOD_INLINE = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{")
USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S | re.M)
PATH = re.compile(r"\b((?:crate|super|self)(?:::\w+)+)")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def expand(tree):
    """`a::{b, c::{d, e as f}}` -> [("a::b", "b"), ("a::c::d", "d"), ("a::c::e", "f")]."""
    tree = re.sub(r"\s*(::|[{},])\s*", r"\1", re.sub(r"\s+", " ", tree.strip()))
    out = []

    def walk(prefix, t):
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(t):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(t[start:i])
                start = i + 1
        parts.append(t[start:])
        for p in filter(None, parts):
            if "{" in p:
                head, rest = p.split("{", 1)
                walk(prefix + head, rest[: rest.rindex("}")])
                continue
            full, _, alias = (prefix + p).partition(" as ")
            segs = full.split("::")
            if segs[-1] == "self":
                segs = segs[:-1]
                full = "::".join(segs)
            out.append((full, alias or segs[-1]))

    walk("", tree)
    return out


def crate_roots(package):
    """Each crate root file of a package: the library, the binary, integration tests."""
    roots = [os.path.join(package, "src", f) for f in ("lib.rs", "main.rs")]
    for d in ("tests", "examples", os.path.join("src", "bin")):
        d = os.path.join(package, d)
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                p = os.path.join(d, f)
                roots.append(p if f.endswith(".rs") else os.path.join(p, "main.rs"))
    return [r for r in roots if os.path.isfile(r)]


class Crate:
    def __init__(self, root_file):
        self.files = {}  # module path (tuple) -> file
        self.children = {}  # module path -> set of child names
        self.load((), root_file, os.path.dirname(root_file))
        self.items = {}
        self.reexports = {}
        self.uses = {}
        for path, f in self.files.items():
            self.scan(path, f)

    def load(self, path, f, directory):
        if path in self.files:
            return
        self.files[path] = f
        self.children[path] = set()
        text = strip_comments(open(f, encoding="utf-8").read())
        base = os.path.basename(f)
        here = directory if base in ("lib.rs", "main.rs", "mod.rs") else os.path.join(
            os.path.dirname(f), base[:-3]
        )
        for line in text.splitlines():
            if line.startswith((" ", "\t")):
                continue
            m = MOD_DECL.match(line)
            if not m:
                continue
            name = m.group(1)
            for cand in [os.path.join(here, name + ".rs"), os.path.join(here, name, "mod.rs")]:
                if os.path.exists(cand):
                    self.children[path].add(name)
                    self.load(path + (name,), cand, os.path.dirname(cand))
                    break

    def scan(self, path, f):
        text = strip_comments(open(f, encoding="utf-8").read())
        items, reexports, uses = set(), {}, []
        # Inline modules: the module path of each line (by indentation).
        stack = []
        lines = text.splitlines()
        line_mod = []
        for line in lines:
            while stack and re.match(r"^" + stack[-1][0] + r"\}", line) and len(line) - len(line.lstrip()) == len(stack[-1][0]):
                stack.pop()
                break
            line_mod.append(path + tuple(n for _, n in stack))
            m = MOD_INLINE.match(line)
            if m:
                stack.append((m.group(1), m.group(2)))
            elif not stack:
                it = ITEM.match(line)
                if it and not line.startswith((" ", "\t")):
                    items.add(it.group(1))
        offsets = []
        pos = 0
        for line, mod in zip(lines, line_mod):
            offsets.append((pos, mod))
            pos += len(line) + 1

        def mod_at(i):
            lo = 0
            for k, (p, mod) in enumerate(offsets):
                if p > i:
                    break
                lo = k
            return offsets[lo][1]

        for m in USE.finditer(text):
            mod = mod_at(m.start())
            for full, name in expand(m.group(2)):
                if m.group(1) and mod == path and not m.group(0).startswith((" ", "\t")):
                    reexports[name] = (full, mod)
                uses.append((full, mod))
        for m in PATH.finditer(text):
            uses.append((m.group(1), mod_at(m.start())))
        self.items[path] = items
        self.reexports[path] = reexports
        self.uses[path] = uses

    def resolve(self, full, mod, seen=()):
        """The file defining what `full` names from module `mod` (None: outside)."""
        segs = full.split("::")
        if segs[0] == "crate":
            cur, segs = (), segs[1:]
        elif segs[0] in ("super", "self"):
            cur = mod
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    cur = cur[:-1]
                segs = segs[1:]
        else:
            return None
        # Inline modules live in their file's module.
        while cur not in self.files and cur:
            cur = cur[:-1]
        for i, s in enumerate(segs):
            if s in self.children.get(cur, ()):
                cur = cur + (s,)
                continue
            if s == "*":
                return self.files.get(cur)
            target = self.reexports.get(cur, {}).get(s)
            if target and (cur, s) not in seen:
                found = self.resolve(target[0], target[1], seen + ((cur, s),))
                if found:
                    return found
            return self.files.get(cur)
        return self.files.get(cur)

    def graph(self):
        edges = {f: set() for f in self.files.values()}
        for path, f in self.files.items():
            for full, mod in self.uses[path]:
                target = self.resolve(full, mod)
                if target and target != f:
                    edges[f].add(target)
        return edges


def cycles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

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
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    packages = sys.argv[1:] or [c for c in CRATES if os.path.isdir(c)]
    roots = [r for p in packages for r in crate_roots(p)]
    found = []
    files = 0
    for root in roots:
        edges = Crate(root).graph()
        files += len(edges)
        found += cycles(edges)
    for comp in found:
        print("import cycle: " + " <-> ".join(comp))
    if found:
        sys.exit(1)
    print(f"check-cycles: no import cycle between the files of {len(roots)} crates ({files} files)")


if __name__ == "__main__":
    main()
