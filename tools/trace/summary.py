#!/usr/bin/env python3
"""Sums an OVERLAP_TRACE timeline's last training step (the last span named
"step", as render.py draws it) by kind, per rank: the step's length, time in
bulk collectives, in ring-step GEMMs and waits, and in each layer phase.
Prints one JSON object: {"label": ..., "ranks": {rank: {...}}}.

    tools/trace/summary.py DIR [LABEL]"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from render import last_step, load  # noqa: E402


def summarise(events):
    window = last_step(events)
    if window is None:
        sys.exit("summary.py: the trace has no span named step (made by overlap-layer)")
    lo, hi = window
    out = {"step_ms": (hi - lo) / 1e3, "collective_ms": 0.0, "gemm_ms": 0.0, "wait_ms": 0.0, "phases_ms": {}}
    for e in events:
        if e.get("ph") != "X" or e["ts"] < lo or e["ts"] >= hi:
            continue
        ms, cat = e["dur"] / 1e3, e.get("cat", "")
        if cat == "layer" and e["name"] != "step":
            out["phases_ms"][e["name"]] = out["phases_ms"].get(e["name"], 0.0) + ms
        elif cat in ("collective", "gemm", "wait"):
            out[cat + "_ms"] += ms
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ranks = load(sys.argv[1])
    label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    print(json.dumps({"label": label, "ranks": {str(r): summarise(ev) for r, ev in sorted(ranks.items())}}))


if __name__ == "__main__":
    main()
