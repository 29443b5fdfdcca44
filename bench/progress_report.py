#!/usr/bin/env python3
"""docs/results.md's progress-policy table from bench/progress.sh's JSON lines.

    bench/progress_report.py OUT/progress.jsonl RESULTS_MD

Replaces the block between <!-- progress: begin --> and <!-- progress: end -->
(appended at the end the first time). A row per stack, ranks per node and op:
the ring's time under each policy (the median over the script's rounds), the
one automatic chose, and automatic against the best of thread, poll and none
(the target: within 5%).
"""
import json
import statistics
import sys

from results_block import replace_block

NAMES = {"openmpi": "Open MPI (ob1)", "openmpi-ucx": "UCX", "mpich": "MPICH",
         "mpich+yield": "MPICH, waits yield"}
BEGIN, END = "<!-- progress: begin -->", "<!-- progress: end -->"
POLICIES = ("thread", "poll", "none")


def case_of(row):
    """(stack label, ranks per node) from the transport label."""
    parts = row["transport"].split(", ")
    return parts[-1], int(parts[-2].split()[0])


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    cases = {}
    for r in rows:
        if r.get("strategy") not in ("ring", "bulk"):
            continue
        key = case_of(r) + (r["op"],)
        policy = "automatic" if r.get("progress_automatic") else r["progress"]
        cases.setdefault(key, {}).setdefault(policy, {}).setdefault(r["strategy"], []).append(r)
    table = ["| stack | ranks per node | op | rounds | bulk ms | thread ms | poll ms | none ms "
             "| automatic ms (chose) | automatic / best | chosen policy, all its runs / best |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    misses = pooled_misses = 0
    for (stack, per_node, op), by in sorted(cases.items(), key=lambda kv: (list(NAMES).index(kv[0][0]), kv[0][1:])):
        if not all(p in by and "ring" in by[p] for p in POLICIES + ("automatic",)):
            continue
        ring = {p: statistics.median(x["time_ms"] for x in by[p]["ring"]) for p in POLICIES + ("automatic",)}
        best = min(ring[p] for p in POLICIES)
        auto = by["automatic"]["ring"][0]
        chosen = auto["progress"]
        ratio = ring["automatic"] / best
        # An automatic run is a run of the policy it chose: pooled, the two
        # runs' noise (as large as 5% on this machine) averages out.
        pooled = [x["time_ms"] for x in by[chosen]["ring"] + by["automatic"]["ring"]]
        pooled_ratio = statistics.median(pooled) / best
        misses += ratio > 1.05
        pooled_misses += pooled_ratio > 1.05
        bulk = statistics.median(x["time_ms"] for p in by for x in by[p].get("bulk", []))
        cells = " | ".join(("**%.1f**" if ring[p] == best else "%.1f") % ring[p] for p in POLICIES)
        table.append(f"| {NAMES.get(stack, stack)} | {per_node} | {op} | {len(by['automatic']['ring'])} | {bulk:.1f} "
                     f"| {cells} | {ring['automatic']:.1f} ({chosen}) | {ratio:.2f} | {pooled_ratio:.2f} |")
    reasons = sorted({(case_of(r)[1], r["progress_automatic"]) for r in rows if r.get("progress_automatic")})
    block = ["",
             "overlap-bench f32 2048^3, the ring (ms: per run the median of the iterations and the max over ranks, "
             "then the median over rounds); bulk: the median of its runs beside every policy; "
             "the best of thread, poll and none in bold:", ""]
    block += table
    block += ["", f"Automatic further than 5% from the best: {misses} of {len(table) - 2} by its own runs, "
              f"{pooled_misses} of {len(table) - 2} with every run of the policy it chose. "
              "What it said it chose and why (OVERLAP_VERBOSE), per ranks per node:", ""]
    block += [f"- {n} per node: {why}" for n, why in reasons]
    block += [""]
    replace_block(sys.argv[2], BEGIN, END, block)


if __name__ == "__main__":
    main()
