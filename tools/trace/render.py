#!/usr/bin/env python3
"""Renders OVERLAP_TRACE timelines (DIR/rank<R>.json, Chrome trace format) to
one SVG picture: per rank, a row of ops (ring, collective, local steps), a
row of ring-step GEMMs and waits, and a row per transfer direction (sends,
receives) from post to observed completion, and above them the layer's
phases when the trace comes from overlap-layer, with the data-parallel
collectives of its N-block model (--blocks) in a row of their own. When a trace holds spans
named "step" (overlap-layer marks every training step), only its last step
is drawn; DIR:label=NAME draws the last span named NAME instead (overlap-bench
--op moe --moe-layer marks "step bulk", "step pairwise", "step automatic").
Several traces stack one above
the other on one time axis from each one's first event, e.g. a bulk run and
an overlapped run of the same work:

    tools/trace/render.py out.svg traces/bulk:bulk traces/ring:overlapped

Standard library only (no plotting package needed)."""
import argparse
import glob
import html
import json
import os
import sys

COLOURS = {"layer": "#d4b95e", "op": "#9fb4c7", "collective": "#e07b39", "gemm": "#4c9a5b", "wait": "#c0392b",
           "send": "#3b6fb6", "receive": "#8e6bbf", "dp": "#16a085"}
ROW, GAP, LEFT, WIDTH = 16, 4, 150, 1100


def load(directory):
    """Rank -> events of DIR/rank*.json."""
    ranks = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank*.json"))):
        doc = json.load(open(path))
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        for e in events:
            if e.get("ph") != "M":
                ranks.setdefault(e["pid"], []).append(e)
    if not ranks:
        sys.exit(f"render.py: no rank*.json with events in {directory}")
    return ranks


def spans(events):
    """(row, category, begin, end, label) of every span and transfer."""
    out, open_transfers = [], {}
    for e in events:
        cat = e.get("cat", "")
        if e["ph"] == "X" and cat == "layer":
            if e["name"] != "step":
                out.append(("layer", cat, e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e["ph"] == "X" and cat == "dp":  # a data-parallel collective, beside the layer's work
            out.append(("dp", cat, e["ts"], e["ts"] + e["dur"], f"{e['name']}, {e['args']['bytes']} B"))
        elif e["ph"] == "X":
            row = "ops" if cat in ("op", "collective") or e["name"].startswith("local step") else "steps"
            out.append((row, cat, e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e["ph"] == "b":
            open_transfers[e["id"]] = e
        elif e["ph"] == "e" and e["id"] in open_transfers:
            b = open_transfers.pop(e["id"])
            kind = "send" if b["name"].startswith("send") else "receive"
            out.append((kind, kind, b["ts"], e["ts"], f"{b['name']}, {b['args']['bytes']} B"))
    return out


def last_step(events, name="step"):
    """(begin, end) of the last span named ``name`` on the layer track, or None."""
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "layer" and e["name"] == name]
    if not steps:
        return None
    last = max(steps, key=lambda e: e["ts"])
    return last["ts"], last["ts"] + last["dur"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the SVG to write")
    ap.add_argument("traces", nargs="+", help="DIR, DIR:label or DIR:label=SPAN, one per stacked trace")
    args = ap.parse_args()
    panels = []
    for spec in args.traces:
        directory, _, label = spec.partition(":")
        label, _, window = label.partition("=")
        ranks = load(directory)
        rows = {r: [s for s in spans(ev) if not s[4].startswith("step ")] for r, ev in ranks.items()}
        windows = [w for w in (last_step(ev, window or "step") for ev in ranks.values()) if w]
        if window and not windows:
            sys.exit(f"render.py: no span named {window!r} in {directory}")
        if windows:  # the last training step, from the earliest rank's start to the latest rank's end
            lo, hi = min(w[0] for w in windows), max(w[1] for w in windows)
            rows = {r: [(s[0], s[1], max(s[2], lo), min(s[3], hi), s[4]) for s in sp if s[3] > lo and s[2] < hi]
                    for r, sp in rows.items()}
        t0 = min(s[2] for r in rows.values() for s in r)
        t1 = max(s[3] for r in rows.values() for s in r)
        panels.append((label or directory, rows, t0, t1))
    longest = max(p[3] - p[2] for p in panels) or 1.0
    scale = WIDTH / longest
    kinds = [k for k in ("layer", "dp", "ops", "steps", "send", "receive")
             if any(s[0] == k for _, rows, _, _ in panels for sp in rows.values() for s in sp)]
    body, y = [], 30
    for label, rows, t0, _ in panels:
        body.append(f'<text x="4" y="{y}" font-weight="bold">{html.escape(label)}</text>')
        y += 8
        for rank in sorted(rows):
            for kind in kinds:
                body.append(f'<text x="4" y="{y + ROW - 4}" font-size="11">rank {rank} {kind}</text>')
                for row, cat, b, e, name in rows[rank]:
                    if row != kind:
                        continue
                    x, w = LEFT + (b - t0) * scale, max((e - b) * scale, 0.5)
                    colour = COLOURS.get(cat, "#999999")
                    body.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 2}" fill="{colour}" '
                                f'fill-opacity="0.8"><title>{html.escape(name)} ({(e - b) / 1e3:.3f} ms)</title></rect>')
                    if kind == "layer" and w > 7 * len(name.split(" (")[0]):  # a label where it fits
                        body.append(f'<text x="{x + 2:.2f}" y="{y + ROW - 5}" font-size="10">'
                                    f'{html.escape(name.split(" (")[0])}</text>')
                y += ROW
            y += GAP
        y += 2 * GAP
    # Time axis: ms from each trace's first event.
    ticks = []
    step = 10 ** max(0, len(str(int(longest / 1e3))) - 1)
    t = 0.0
    while t * 1e3 <= longest:
        x = LEFT + t * 1e3 * scale
        ticks.append(f'<line x1="{x:.1f}" y1="20" x2="{x:.1f}" y2="{y}" stroke="#dddddd"/>'
                     f'<text x="{x:.1f}" y="{y + 14}" font-size="11" text-anchor="middle">{t:g} ms</text>')
        t += step
    legend = "".join(f'<rect x="{LEFT + i * 110}" y="4" width="12" height="12" fill="{c}"/>'
                     f'<text x="{LEFT + i * 110 + 16}" y="14" font-size="11">{k}</text>'
                     for i, (k, c) in enumerate(COLOURS.items()))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{y + 24}" '
           f'font-family="sans-serif" font-size="12">' + "".join(ticks) + legend + "".join(body) + "</svg>\n")
    with open(args.out, "w") as f:
        f.write(svg)
    print(f"wrote {args.out} ({len(panels)} trace(s))")


if __name__ == "__main__":
    main()
