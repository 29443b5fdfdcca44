#!/usr/bin/env python3
"""automatic against bulk and the faster of bulk and ring, per shape, from
overlap-bench JSON rows (bench/automatic_sweep.sh): a Markdown table and the
counts the issue's targets name (automatic never more than 2% slower than
bulk; within 3% of the best on at least 90% of the shapes)."""
import json
import sys


def main(path):
    rows = {}
    transport = ""
    for line in open(path):
        r = json.loads(line)
        key = (r["op"], r["m"], r["n"], r["k"])
        rows.setdefault(key, {})[r["strategy"]] = r
        transport = r.get("transport", transport)
    print(f"\n{path}: {transport}\n")
    print("| op | M | N | K | bulk ms | ring ms | automatic ms | auto / bulk | auto / best | automatic ran |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    over_bulk = within_best = 0
    for key in sorted(rows):
        s = rows[key]
        if not all(x in s for x in ("bulk", "ring", "automatic")):
            continue
        b, g, a = s["bulk"]["time_ms"], s["ring"]["time_ms"], s["automatic"]["time_ms"]
        best = min(b, g)
        chose = (s["automatic"].get("schedule") or {}).get("strategy", "?")
        algo = (s["automatic"].get("schedule") or {}).get("algorithm", "")
        chunks = (s["automatic"].get("schedule") or {}).get("chunks", 0)
        ran = chose + (" others" if algo == "others" else "") + (f", {chunks} chunks" if chunks else "")
        over_bulk += a > 1.02 * b
        within_best += a <= 1.03 * best
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {b:.1f} | {g:.1f} | {a:.1f} | {a / b:.3f} | "
              f"{a / best:.3f} | {ran} |")
    n = sum(1 for s in rows.values() if all(x in s for x in ("bulk", "ring", "automatic")))
    print(f"\n{n} shapes: automatic more than 2% slower than bulk on {over_bulk}; "
          f"within 3% of the faster of bulk and ring on {within_best} ({100 * within_best / max(n, 1):.0f}%)")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
