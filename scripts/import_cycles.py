#!/usr/bin/env python3
"""Import cycles between the files of Rust crates: every group of files that reach each other
through `crate::` and `super::` paths in code (comments and `#[cfg(test)]` parts aside), each
path resolved to the deepest module file it names. A child module's plain `name::` paths to
its own children are not followed (they are the module's own parts).

    python3 scripts/import_cycles.py allocator/src config/src runtime/src

Prints each cycle and exits 1 when there is one; `cargo xtask lint` runs it on the library
crates."""

import os
import re
import sys
from collections import defaultdict

PATH = re.compile(r"\b(crate|super)((?:::\w+)+)")


def modules(src):
    """Module path (a tuple of names) → its file, for every `.rs` file under `src`."""
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            files[tuple(parts)] = path
    return files


def code_of(path):
    """The file's code: before its first `#[cfg(test)]`, without comments."""
    text = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def edges(files):
    """File → the files its code names."""
    graph = defaultdict(set)
    for module, path in files.items():
        for kind, rest in PATH.findall(code_of(path)):
            names = rest.strip(":").split("::")
            # `super` is the module's parent (wherever its file is); each further `super`,
            # the parent's parent.
            base = [] if kind == "crate" else list(module[:-1])
            while kind == "super" and names and names[0] == "super":
                base, names = base[:-1], names[1:]
            full = base + names
            target = next(
                (tuple(full[:k]) for k in range(len(full), 0, -1) if tuple(full[:k]) in files),
                None,
            )
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def cycles(graph, nodes):
    """The strongly connected groups of more than one file (Tarjan's, without recursion)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def main(srcs):
    total = 0
    for src in srcs:
        files = modules(src)
        for group in cycles(edges(files), sorted(files)):
            total += 1
            print(f"{src}: a cycle of {len(group)} files: "
                  + ", ".join("/".join(m) or "lib" for m in group))
    print(f"import cycles: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["allocator/src", "config/src", "runtime/src"]))
