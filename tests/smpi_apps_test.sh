#!/usr/bin/env bash
# The apps under SimGrid SMPI (make smpi): overlap-bench and overlap-layer on
# the simulated mirror of the emulated 2-node star at 1 Gbit/s
# (tools/smpi/star2-1gbit.xml), and at 4 ranks on the 4-node ring. Each must
# verify its own results (exit 0) and write JSON lines whose transport says
# "smpi", so a simulated figure is never taken for a measured one.
set -euo pipefail
src=${1:?usage: smpi_apps_test.sh SOURCE_DIR OVERLAP_BENCH OVERLAP_LAYER}
bench=${2:?usage: smpi_apps_test.sh SOURCE_DIR OVERLAP_BENCH OVERLAP_LAYER}
layer=${3:?usage: smpi_apps_test.sh SOURCE_DIR OVERLAP_BENCH OVERLAP_LAYER}
json=$(mktemp /tmp/overlap-smpi-apps.XXXXXX.json)
trap 'rm -f "$json"' EXIT
export OMP_NUM_THREADS=1
smpi() { "$src/tools/smpi/run" "$@"; }  # smpi PLATFORM NP PROGRAM ARGS...
# smpirun passes the program's arguments on unquoted: a label with spaces goes by the environment.
OVERLAP_TRANSPORT="smpi, star2-1gbit mirror" smpi star2-1gbit 2 "$bench" --op ag --variant lhs_rows -m 64 -n 48 \
  -k 32 --iters 2 --warmup 0 --json "$json"
smpi ring4-1gbit 4 "$bench" --op rs --variant rows -m 64 -n 48 -k 32 --iters 2 --warmup 0 --json "$json"
smpi star2-1gbit 2 "$layer" --seq 32 --hidden 32 --heads 2 --steps 1 --warmup 0 --json "$json"
python3 - "$json" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) >= 4, f"only {len(rows)} JSON lines"
ops = {r.get("op", "layer") for r in rows}
assert {"all_gather_matmul", "matmul_reduce_scatter"} <= ops, ops
for r in rows:
    assert r["transport"].startswith("smpi"), r["transport"]
    assert r["max_rel_err"] < 1e-3, r
    assert r.get("time_ms", r.get("step_ms", 1)) > 0, r
print(f"smpi apps: {len(rows)} JSON lines, every transport smpi, every result checked")
PY
