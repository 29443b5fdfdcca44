#!/usr/bin/env bash
# overlap-layer, tiny, at 2 and 3 ranks (uneven tokens, heads and MLP
# columns): one JSON object per mode with the names issue 14 fixes (mode,
# step_ms, speedup_vs_bulk, max_rel_err), every mode within f32 accuracy of
# the double-precision block, also without sequence parallelism and with a
# cp axis; OVERLAP_TRACE gives a Chrome trace per rank
# with the layer's phases and step spans, which render.py draws and
# summary.py sums; bad shapes fail with a message and a non-zero status.
set -euo pipefail
# The MPI stack of the tests (tools/mpi/stack: its launcher and flags).
source "$(dirname "$0")/../../tools/mpi/stack"
mpi_stack_setup
layer=${1:?usage: layer_app_test.sh OVERLAP_LAYER TOOLS_TRACE_DIR}
tools=${2:?usage: layer_app_test.sh OVERLAP_LAYER TOOLS_TRACE_DIR}
dir=$(mktemp -d /tmp/overlap-layer-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
dims=(--seq 37 --hidden 32 --heads 4 --ffn 48)
shape=("${dims[@]}" --steps 2 --warmup 1)
for np in 2 3; do
  mpi_run "$np" "$layer" "${shape[@]}" --modes ring,bidirectional,automatic \
    --json "$dir/$np.jsonl" > "$dir/$np.txt"
  grep -q "comm only" "$dir/$np.txt" && grep -q "compute only" "$dir/$np.txt"
  grep -qE "^machine: .+, ISA [a-z0-9_]+; .+; oneDNN [0-9.]+; overlap [0-9.]+;" "$dir/$np.txt"
  python3 - "$dir/$np.jsonl" $np <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["mode"] for r in rows] == ["bulk", "ring", "bidirectional", "automatic"], rows
for r in rows:
    assert r["ranks"] == int(sys.argv[2]) and r["seq"] == 37 and r["hidden"] == 32 and r["heads"] == 4, r
    assert r["step_ms"] > 0 and r["comm_ms"] > 0 and r["compute_ms"] > 0, r
    assert r["max_rel_err"] is not None and r["max_rel_err"] < 1e-5, r
    assert r["speedup_vs_bulk"] > 0, r
    assert r["cpu"] and r["mpi"] and r["onednn"] and len(r["date"]) == 10, r
    assert r["isa"] and r["isa"] != "unknown" and r["overlap"].count(".") == 2 and r["transport"], r
assert rows[0]["speedup_vs_bulk"] == 1.0
# automatic's schedule for each op shape, with the plan it ran.
choices = rows[-1]["automatic_choices"]
assert choices and all(c["plan"].startswith("overlap::") and c["schedule"] for c in choices), rows[-1]
assert all("automatic_choices" not in r for r in rows[:-1]), rows
print("layer json ok at", sys.argv[2], "ranks")
PY
done
# Four modes keep every plan: the plans built (OVERLAP_VERBOSE=1 prints each)
# do not grow with the steps timed.
for steps in 2 4; do
  OVERLAP_VERBOSE=1 mpi_run 2 "$layer" "${dims[@]}" --steps $steps --modes ring,bidirectional,automatic --no-check \
    2> "$dir/verbose-$steps.txt" > /dev/null
done
[ "$(grep -c 'overlap: plan' "$dir/verbose-2.txt")" -eq "$(grep -c 'overlap: plan' "$dir/verbose-4.txt")" ] ||
  { echo "overlap-layer rebuilt plans while timing"; exit 1; }
# Without sequence parallelism (matmul_all_reduce) and with a cp axis (ring
# attention between the shares), also together: every mode within f32
# accuracy of the double-precision block, the mesh in the JSON.
for extra in "--no-sequence-parallel" "--cp 2" "--cp 2 --no-sequence-parallel" "--cp 3"; do
  np=4
  [[ $extra == "--cp 3" ]] && np=3
  rm -f "$dir/mode.jsonl"
  # shellcheck disable=SC2086  # extra is two words on purpose
  mpi_run $np "$layer" "${shape[@]}" --modes ring,automatic $extra --json "$dir/mode.jsonl" > "$dir/mode.txt"
  python3 - "$dir/mode.jsonl" $np "$extra" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
extra = sys.argv[3].split()
cp = int(extra[extra.index("--cp") + 1]) if "--cp" in extra else 1
assert [r["mode"] for r in rows] == ["bulk", "ring", "automatic"], rows
for r in rows:
    assert r["cp"] == cp and r["tp"] * cp == int(sys.argv[2]) and r["dp"] == 1, r
    assert r["sequence_parallel"] == ("--no-sequence-parallel" not in extra), r
    assert r["max_rel_err"] is not None and r["max_rel_err"] < 1e-5, r
    assert r["step_ms"] > 0 and r["comm_ms"] > 0 and r["compute_ms"] > 0, r
print("layer", sys.argv[3], "ok")
PY
done
grep -q "ring attention.s K/V gathers" "$dir/mode.txt"  # the last run had a cp axis
# bf16: the same rows, bf16's accuracy.
mpi_run 2 "$layer" "${shape[@]}" --dtype bf16 --json "$dir/bf16.jsonl" > /dev/null
python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$dir/bf16.jsonl')]
assert [r['mode'] for r in rows] == ['bulk', 'automatic'] and all(r['dtype'] == 'bf16' for r in rows), rows
assert all(0 < r['max_rel_err'] < 3e-2 for r in rows), rows
"
# The timeline: layer phases and one span per training step on every rank.
for mode in bulk ring; do
  OVERLAP_TRACE="$dir/trace-$mode" mpi_run 3 "$layer" "${shape[@]}" --only \
    --modes $mode --no-check > /dev/null
done
python3 - "$dir/trace-ring" <<'PY'
import json, os, sys
for r in range(3):
    ev = json.load(open(os.path.join(sys.argv[1], f"rank{r}.json")))["traceEvents"]
    layer = [e for e in ev if e.get("cat") == "layer"]
    steps = [e for e in layer if e["name"] == "step"]
    assert len(steps) == 3, steps  # warmup + 2 steps
    names = {e["name"] for e in layer}
    for want in ("attention (local heads)", "QKV projection (all-gather matmul)", "MLP up weight gradient",
                 "QKV backward (started matmul reduce-scatter)"):
        assert want in names, (want, names)
    assert any(e["ph"] == "M" and e.get("args", {}).get("name") == "layer phases" for e in ev)
print("layer trace ok")
PY
python3 "$tools/render.py" "$dir/layer.svg" "$dir/trace-bulk:bulk" "$dir/trace-ring:ring" > /dev/null
grep -q "rank 2 layer" "$dir/layer.svg"
python3 "$tools/summary.py" "$dir/trace-bulk" bulk | python3 -c "
import json, sys
d = json.load(sys.stdin)
assert sorted(d['ranks']) == ['0', '1', '2'] and all(r['collective_ms'] > 0 for r in d['ranks'].values()), d
"
# The N-block model (--blocks): one row per --dp-sync mode at dp 2 and
# dp 3 (tp 1), with a trace whose data-parallel track holds the rings
# beside the backward; bulk and overlapped sum the same rings: equal losses.
# Then the sharded optimizer state at dp 2.
for np in 2 3; do
  OVERLAP_TRACE="$dir/trace-stack$np" mpi_run "$np" "$layer" "${dims[@]}" --blocks 2 --tp 1 \
    --dp-sync bulk,overlapped,none --bucket-mib 0.001 --steps 2 --warmup 1 --json "$dir/stack$np.jsonl" \
    > "$dir/stack$np.txt"
  grep -q "dp comm only" "$dir/stack$np.txt"
  python3 - "$dir/stack$np.jsonl" "$dir/trace-stack$np/rank0.json" "$np" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["dp_sync"] for r in rows] == ["bulk", "overlapped", "none"], rows
for r in rows:
    assert r["step_ms"] > 0 and r["blocks"] == 2 and r["dp"] == int(sys.argv[3]) and r["tp"] == 1, r
    assert r["dp_comm_ms"] > 0 and r["bucket_bytes"] == 1048, r
assert rows[0]["loss"] == rows[1]["loss"] and rows[2]["loss"] != rows[0]["loss"], rows
ev = json.load(open(sys.argv[2]))["traceEvents"]
dp = [e for e in ev if e.get("cat") == "dp"]
assert dp and all(e["tid"] == 3 and e["args"]["bytes"] > 0 for e in dp), dp[:3]
assert {e["name"] for e in dp} == {"all-reduce"}, {e["name"] for e in dp}
assert any(e["ph"] == "M" and e.get("args", {}).get("name") == "data-parallel collectives" for e in ev)
print("stack json and trace ok at", sys.argv[3], "ranks")
PY
done
python3 "$tools/render.py" "$dir/stack.svg" "$dir/trace-stack2:overlapped=step overlapped" \
  "$dir/trace-stack2:bulk=step bulk" > /dev/null
grep -q "rank 0 dp" "$dir/stack.svg"
mpi_run 2 "$layer" "${dims[@]}" --blocks 2 --tp 1 --optimizer sharded --dp-sync overlapped --steps 1 --warmup 0 \
  --json "$dir/sharded.jsonl" > /dev/null
python3 -c "
import json, sys
r = [json.loads(l) for l in open('$dir/sharded.jsonl')]
assert len(r) == 1 and r[0]['optimizer'] == 'sharded' and r[0]['dp_sync'] == 'overlapped' and r[0]['dp'] == 2, r
"
if timeout 60 "$MPIEXEC" "${MPI_FLAGS[@]}" -n 2 "$layer" "${dims[@]}" --blocks 2 --modes ring,bulk \
     > "$dir/bad.txt" 2>&1; then
  echo "--blocks with two --modes was accepted"; exit 1
fi
grep -q "give --modes one value" "$dir/bad.txt"
# Bad input: a message and a non-zero status, no hang.
if timeout 60 "$MPIEXEC" "${MPI_FLAGS[@]}" -n 2 "$layer" --seq 8 --hidden 30 --heads 4 \
     > "$dir/bad.txt" 2>&1; then
  echo "hidden 30 with 4 heads was accepted"; exit 1
fi
grep -q "divisible by heads" "$dir/bad.txt"
if timeout 60 "$MPIEXEC" "${MPI_FLAGS[@]}" -n 2 "$layer" --seq 8 --hidden 32 --heads 4 --cp 3 \
     > "$dir/bad.txt" 2>&1; then
  echo "--cp 3 on 2 ranks was accepted"; exit 1
fi
grep -q "does not divide the 2 ranks" "$dir/bad.txt"
echo "layer app test: ok"
