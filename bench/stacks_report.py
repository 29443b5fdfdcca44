#!/usr/bin/env python3
"""docs/results.md's per-stack table from bench/stacks.sh's JSON lines.

    bench/stacks_report.py OUT/stacks.jsonl RESULTS_MD

Replaces the block between <!-- stacks: begin --> and <!-- stacks: end -->
(appended at the end the first time). Names the stacks "Open MPI (ob1)",
"UCX" and "MPICH" as docs/cluster.md does.
"""
import json
import sys

from results_block import replace_block

NAMES = {"openmpi": "Open MPI (ob1)", "openmpi-ucx": "UCX", "mpich": "MPICH"}
BEGIN, END = "<!-- stacks: begin -->", "<!-- stacks: end -->"


def stack_of(row):
    return row["transport"].rsplit(", ", 1)[-1]


def op_rows(rows):
    out = ["| stack | op | compute only ms | comm only ms | bulk ms | ring ms | automatic ms (chose) "
           "| ring / limit | ring speedup vs bulk | automatic speedup vs bulk | max rel err |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    cases = {}
    for r in rows:
        if "op" in r:
            cases.setdefault((stack_of(r), r["op"]), {})[r["strategy"]] = r
    for (stack, op), by in cases.items():
        bulk, ring, auto = by.get("bulk"), by.get("ring"), by.get("automatic")
        if not (bulk and ring and auto):
            continue
        sched = auto.get("schedule") if isinstance(auto.get("schedule"), dict) else {}
        chose = "others" if sched.get("algorithm") == "others" else sched.get("strategy", "?")
        err = max(x["max_rel_err"] or 0.0 for x in (bulk, ring, auto))
        out.append(f"| {NAMES.get(stack, stack)} | {op} | {ring['compute_only_ms']:.1f} | {ring['comm_only_ms']:.1f} "
                   f"| {bulk['time_ms']:.1f} | {ring['time_ms']:.1f} | {auto['time_ms']:.1f} ({chose}) "
                   f"| {ring['ratio_to_limit']:.2f} | {ring['speedup_vs_bulk']:.2f} | {auto['speedup_vs_bulk']:.2f} "
                   f"| {err:.1e} |")
    return out


def layer_rows(rows):
    out = ["| stack | mode | step ms | speedup vs bulk | comm only ms | comm hidden | compute only ms | max rel err |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "mode" in r and "step_ms" in r:
            out.append(f"| {NAMES.get(stack_of(r), stack_of(r))} | {r['mode']} | {r['step_ms']:.0f} "
                       f"| {r['speedup_vs_bulk']:.2f} | {r['comm_ms']:.0f} | {100 * r['comm_hidden']:.0f}% "
                       f"| {r['compute_ms']:.0f} | {r['max_rel_err']:.1e} |")
    return out


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    block = ["", "overlap-bench, f32 2048^3 (ms, median of the iterations, max over ranks):", ""]
    block += op_rows(rows)
    block += ["", "overlap-layer's training step (seq 2048, hidden 1024, 16 heads, ffn 4096, f32):", ""]
    block += layer_rows(rows)
    block += [""]
    replace_block(sys.argv[2], BEGIN, END, block)


if __name__ == "__main__":
    main()
