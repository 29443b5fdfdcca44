#!/usr/bin/env python3
"""Fails on an include cycle in include/overlap (make lint runs it).

Two rules:
- between the concern folders (backend, engine, mpi, ops, schedule, ...)
  and the top-level headers, each of which counts as a node of its own:
  their includes must form no cycle, so each folder can be read, tested and
  changed knowing only what is below it (a folder that includes
  context.hpp sits above the context, and the context's headers may not
  reach back into it);
- between files, anywhere (the top-level headers too): no header may
  include itself through others. One pair is not a cycle: X.hpp including
  its implementation X-inl.hpp at its end, which includes X.hpp back so
  that it also stands alone ({fmt}'s idiom; #pragma once ends it there).
A forwarding header (one whose text says "overlap: forwarding header": an
old include path kept for users, which only includes the new one) is not
a node: it is compatibility, not structure.

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


FORWARDING = "overlap: forwarding header"


def folder(header):
    parts = header.split("/")
    return parts[1] if len(parts) > 2 else None  # None: a top-level header


def node(header):
    """The header's node in the first rule: its folder, or itself at the top."""
    f = folder(header)
    return f + "/" if f else header.split("/")[-1]


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
    forwarding = {h for h in graph if FORWARDING in (root / h).read_text()}
    folders, why = {}, {}
    for header, targets in graph.items():
        if header in forwarding:
            continue
        a = node(header)
        for t in targets:
            b = node(t)
            if a != b:
                folders.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{header} includes {t}")
    nodes = {node(h) for h in graph if h not in forwarding}
    cycle = find_cycle(nodes, folders)
    if cycle:
        print("include cycle between folders of " + str(root / "overlap") + ": " + " -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            print("  " + why[(a, b)])
        failed = True
    if not failed:
        tops = sum(1 for n in nodes if not n.endswith("/"))
        print(
            f"include_cycles: {len(graph)} headers; {len(nodes) - tops} folders and {tops} top-level headers,"
            f" no cycle ({len(forwarding)} forwarding headers aside)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
