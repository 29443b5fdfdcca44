#!/usr/bin/env python3
"""Fails on an include cycle in include/overlap (make lint runs it).

Two rules:
- between the concern folders (backend, engine, mpi, ops, schedule, ...):
  their includes must form no cycle, so each folder can be read, tested and
  changed knowing only the folders below it;
- between files, anywhere (the top-level headers too): no header may
  include itself through others. One pair is not a cycle: X.hpp including
  its implementation X-inl.hpp at its end, which includes X.hpp back so
  that it also stands alone ({fmt}'s idiom; #pragma once ends it there).
The top-level headers are not a folder in the first rule: they are the
public types every folder uses (errors, settings, views, element types)
and the context and umbrella headers that compose the folders.

    tools/lint/include_cycles.py [INCLUDE_ROOT]   (default: include)
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"(overlap/[^"]+)"', re.M)


def includes(root):
    """{header: [headers it includes]}, paths relative to root."""
    graph = {}
    for path in sorted(root.rglob("*.hpp")):
        rel = path.relative_to(root).as_posix()
        own_inl = rel[: -len(".hpp")] + "-inl.hpp"
        graph[rel] = [m for m in INCLUDE.findall(path.read_text()) if (root / m).exists() and m != own_inl]
    return graph


def folder(header):
    parts = header.split("/")
    return parts[1] if len(parts) > 2 else None  # None: a top-level header


def find_cycle(nodes, edges):
    """A cycle as a list of nodes, or None (iterative DFS, white/grey/black)."""
    state = {n: 0 for n in nodes}
    for start in sorted(nodes):
        if state[start]:
            continue
        stack, path = [(start, iter(sorted(edges.get(start, ()))))], [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt, 2) == 1:
                return path[path.index(nxt):] + [nxt]
            elif state.get(nxt) == 0:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(edges.get(nxt, ())))))
                path.append(nxt)
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "include")
    if not (root / "overlap").is_dir():
        print(f"include_cycles: no {root}/overlap")
        return 2
    graph = includes(root)
    failed = False
    cycle = find_cycle(graph.keys(), graph)
    if cycle:
        print("include cycle between headers: " + " -> ".join(cycle))
        failed = True
    folders, why = {}, {}
    for header, targets in graph.items():
        a = folder(header)
        for t in targets:
            b = folder(t)
            if a and b and a != b:
                folders.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{header} includes {t}")
    nodes = {f for f in map(folder, graph) if f}
    cycle = find_cycle(nodes, folders)
    if cycle:
        print("include cycle between folders of " + str(root / "overlap") + ": " + " -> ".join(f + "/" for f in cycle))
        for a, b in zip(cycle, cycle[1:]):
            print("  " + why[(a, b)])
        failed = True
    if not failed:
        print(f"include_cycles: {len(graph)} headers in {len(nodes)} folders, no cycle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
