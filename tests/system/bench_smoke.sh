#!/usr/bin/env bash
# overlap-bench in a tiny configuration: it must verify its own results (exit
# 0), print its table, and write JSON lines with every field the reports and
# checks rely on.
set -euo pipefail
# The MPI stack of the tests (tools/mpi/stack: its launcher and flags).
source "$(dirname "$0")/../../tools/mpi/stack"
mpi_stack_setup
bench=${1:?usage: bench_smoke.sh OVERLAP_BENCH}
json=$(mktemp /tmp/overlap-bench-smoke.XXXXXX.json)
trap 'rm -f "$json"' EXIT
run() { mpi_run "$1" "$bench" -m 33 -n 20 -k 17 --iters 2 --warmup 0 \
          --json "$json" --transport "shared memory" "${@:2}"; }
# The table says where it was measured (the JSON's provenance, as one line).
run 2 --op ag --variant lhs_rows | tee /dev/stderr | grep -E "^machine: .+, ISA [a-z0-9_]+; .+; oneDNN [0-9.]+; overlap [0-9.]+;" > /dev/null
run 3 --op rs --variant rows
run 3 --op ag --variant rhs_cols --dtype bf16
run 2 --op rs --variant cols --dtype f64
# The other-operands algorithm and the library's own choice, with a calibration file
# (on one node automatic uses the model only when given one).
cal=$(mktemp /tmp/overlap-bench-smoke.XXXXXX.cal.json)
trap 'rm -f "$json" "$cal"' EXIT
mpi_run 2 "$(dirname "$bench")/overlap-calibrate" -o "$cal" --sizes 16,64 \
  --dtypes f32 > /dev/null
# The calibration file says where it was measured.
python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))["measured_on"]; assert m["cpu"] and m["isa"] and m["mpi"] and m["onednn"] and m["overlap"] and m["date"], m' "$cal"
OVERLAP_CALIBRATION=$cal run 2 --op ag --variant lhs_cols --strategies ring,others,automatic
# A dp x tp mesh: 2 tensor groups of 2 ranks at once (the peers are skipped), and
# a group size that does not divide the ranks (exit 2, no JSON).
run 4 --op rs --variant cols --tp 2 --strategies ring
if run 3 --op rs --tp 2 2> /dev/null; then echo "--tp 2 on 3 ranks was accepted"; exit 1; fi
python3 - "$json" <<'PY'
import json, re, sys
fields = ["op", "variant", "strategy", "dtype", "ranks", "m", "n", "k", "time_ms", "compute_only_ms",
          "comm_only_ms", "bulk_ms", "speedup_vs_bulk", "max_rel_err", "limit_ms", "ratio_to_limit", "transport",
          "gemm_path", "one_gemm_ms", "bulk_comm_only_ms", "stable_limit_ms", "ratio_to_stable_limit",
          "decomposition_overhead"]
rows = [json.loads(line) for line in open(sys.argv[1])]
strategies = {(r["op"], r["variant"], r["dtype"], r["strategy"]) for r in rows}
ring = ("bulk", "ring", "bidirectional")
expected = {("all_gather_matmul", "lhs_rows", "f32", s) for s in ring + ("iallgatherv_pipeline",)}
expected |= {("matmul_reduce_scatter", "rows", "f32", s) for s in ring + ("ireduce_scatter_pipeline",)}
expected |= {("all_gather_matmul", "rhs_cols", "bf16", s) for s in ring}
expected |= {("matmul_reduce_scatter", "cols", "f64", s) for s in ring}
expected |= {("all_gather_matmul", "lhs_cols", "f32", s) for s in ("bulk", "ring", "others", "automatic")}
expected |= {("matmul_reduce_scatter", "cols", "f32", s) for s in ("bulk", "ring")}
# The ScaLAPACK peer is there when overlap-bench was built against it (f32 only).
optional = {(op, v, "f32", "scalapack_psgemm") for op, v, d, _ in expected if d == "f32"}
assert expected <= strategies <= expected | optional, f"cases {sorted(strategies)} != {sorted(expected)}"
for r in rows:
    missing = [f for f in fields if f not in r]
    assert not missing, f"missing {missing} in {r}"
    assert r["time_ms"] > 0 and r["limit_ms"] > 0 and r["m"] == 33 and r["n"] == 20 and r["k"] == 17
    # Where it was measured: the tools write it themselves.
    assert r["cpu"] and r["cpu"] != "unknown" and r["mpi"] and r["onednn"].count(".") == 2, r
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]), r
    assert r["isa"] in r["gemm_path"] or r["gemm_path"].startswith("eigen"), r
    assert re.fullmatch(r"\d+\.\d+\.\d+", r["overlap"]) and r["transport"], r
    # Ranks per tensor group, groups: 2 x 2 for the mesh run, one group otherwise.
    mesh = r["op"] == "matmul_reduce_scatter" and r["variant"] == "cols" and r["dtype"] == "f32"
    assert (r["ranks"], r["tensor_groups"]) == ((2, 2) if mesh else (r["ranks"], 1)), r
    assert r["max_rel_err"] < (2e-2 if r["dtype"] == "bf16" else 1e-4), r
    # The GEMM path names the element type it multiplies in (bf16: native or widened f32).
    assert r["dtype"] in r["gemm_path"] or "widened bf16" in r["gemm_path"], r
    # Decomposed strategies report their own schedule's compute-only and comm-only times.
    own = r["own_comm_only_ms"] is not None and r["own_compute_only_ms"] is not None
    assert own == (r["strategy"] in ("ring", "bidirectional", "others")), r
    # automatic names the schedule it ran and the cost model's table.
    if r["strategy"] == "automatic":
        sched = r["schedule"]
        assert sched["by_model"] and len(sched["candidates"]) == 3, sched
        assert all(c["predicted_ms"] > 0 for c in sched["candidates"]), sched
        assert (sched["strategy"], sched["algorithm"]) in {(c["strategy"], c["algorithm"]) for c in sched["candidates"]}
    else:
        assert r["schedule"] is None, r
    # The stable limit: one GEMM of the whole work (bulk's, alone) against the schedule's transfers.
    assert r["one_gemm_ms"] > 0 and r["bulk_comm_only_ms"] > 0, r
    assert r["stable_limit_ms"] == max(r["one_gemm_ms"], r["comm_only_ms"]), r
    assert (r["decomposition_overhead"] is not None) == own, r
    if own:
        assert abs(r["decomposition_overhead"] - r["own_compute_only_ms"] / r["one_gemm_ms"]) < 1e-9, r
print(f"overlap-bench smoke test: {len(rows)} cases, all fields present, results verified")
PY
