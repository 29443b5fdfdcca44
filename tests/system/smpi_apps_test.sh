#!/usr/bin/env bash
# The apps under SimGrid SMPI (make smpi): overlap-bench and overlap-layer on
# the simulated mirror of the emulated 2-node star at 1 Gbit/s
# (tools/smpi/star2-1gbit.xml), and at 4 ranks on the 4-node ring, and
# overlap-calibrate's link probe on a fat tree whose latency is known. Each must
# verify its own results (exit 0) and write JSON lines whose transport says
# "smpi", so a simulated figure is never taken for a measured one.
set -euo pipefail
usage="usage: smpi_apps_test.sh SOURCE_DIR OVERLAP_BENCH OVERLAP_LAYER OVERLAP_CALIBRATE"
src=${1:?$usage}
bench=${2:?$usage}
layer=${3:?$usage}
calibrate=${4:?$usage}
json=$(mktemp /tmp/overlap-smpi-apps.XXXXXX.json)
trap 'rm -f "$json"' EXIT
export OMP_NUM_THREADS=1
smpi() { "$src/tools/smpi/run" "$@"; }  # smpi PLATFORM NP PROGRAM ARGS...
# smpirun passes the program's arguments on unquoted: a label with spaces goes by the environment.
OVERLAP_TRANSPORT="smpi, star2-1gbit mirror" smpi star2-1gbit 2 "$bench" --op ag --variant lhs_rows -m 64 -n 48 \
  -k 32 --iters 2 --warmup 0 --json "$json"
smpi ring4-1gbit 4 "$bench" --op rs --variant rows -m 64 -n 48 -k 32 --iters 2 --warmup 0 --json "$json"
smpi star2-1gbit 2 "$layer" --seq 32 --hidden 32 --heads 2 --steps 1 --warmup 0 --json "$json"
# The calibration's latency probe reads the platform's own latency: on the
# fat tree, 3 ranks on one leaf, a message crosses 2 links of 1 us. (A probe
# timed from a barrier read 4.0 us here, and 14 us at 64 ranks: the ranks'
# skew on leaving the barrier.)
calibration=$(mktemp /tmp/overlap-smpi-calibration.XXXXXX.json)
trap 'rm -f "$json" "$calibration"' EXIT
"$src/tools/smpi/run" fattree1024-200gbit 3 "$calibrate" --links-only -o "$calibration" \
  > /dev/null
python3 - "$calibration" <<'PY'
import json, sys
links = json.load(open(sys.argv[1]))["links"]["network"]
assert 1.9 <= links["latency_us"] <= 2.3, f"latency probe read {links['latency_us']} us, the platform has 2 us"
assert 190 <= links["gbit_per_s"] <= 201, links["gbit_per_s"]
print(f"smpi calibration: latency {links['latency_us']:.2f} us, {links['gbit_per_s']:.1f} Gbit/s (platform: 2 us, 200)")
PY
# OVERLAP_SIM_COMPUTE=calibrated: refused on every rank without a
# calibration, or with one that has no GEMM rates. With GEMM rates, a GEMM's
# simulated time is its flops over the grid's rate: halving every rate adds
# exactly that figure to overlap-bench's "one GEMM" row (at 1 rank, the
# whole 512^3 product, a grid point; the rest of that row stays the same).
# On the fat tree, whose nodes are 32 of this machine's cores: the grid was
# timed in simulated time there, and is charged as such.
cal_json=$(mktemp /tmp/overlap-smpi-calibrated.XXXXXX.json)
half=$(mktemp /tmp/overlap-smpi-half.XXXXXX.json)
trap 'rm -f "$json" "$calibration" "$cal_json" "$half"' EXIT
refused() {  # refused EXPECTED_MESSAGE ENV...: overlap-bench under ENV fails, saying it on both ranks
  local out
  if out=$(env "${@:2}" "$src/tools/smpi/run" star2-1gbit 2 "$bench" --op ag -m 64 -n 64 -k 64 --iters 1 \
    --warmup 0 --no-check 2>&1); then
    echo "calibrated mode ran with $*" >&2
    exit 1
  fi
  [ "$(grep -c "$1" <<< "$out")" -ge 2 ] || { echo "expected '$1' from both ranks, got:"; echo "$out"; exit 1; } >&2
}
# Set and empty: tools/smpi/run leaves it so, and the library refuses.
refused "set OVERLAP_CALIBRATION" OVERLAP_SIM_COMPUTE=calibrated OVERLAP_CALIBRATION=
# Unset: tools/smpi/run takes the platform's calibration from docs/results/smpi/ and names it.
out=$(env -u OVERLAP_CALIBRATION OVERLAP_SIM_COMPUTE=calibrated "$src/tools/smpi/run" star2-1gbit 2 "$bench" --op ag -m 64 \
  -n 64 -k 64 --iters 1 --warmup 0 --no-check --no-peers --strategies ring 2>&1) ||
  { echo "calibrated mode with the platform's calibration failed:"; echo "$out"; exit 1; } >&2
grep -q "OVERLAP_CALIBRATION=.*/docs/results/smpi/mirror-star2-1gbit-calibration.json" <<< "$out" ||
  { echo "tools/smpi/run named no calibration:"; echo "$out"; exit 1; } >&2
refused "has no GEMM rates" OVERLAP_SIM_COMPUTE=calibrated OVERLAP_CALIBRATION="$calibration"
smpi fattree1024-200gbit 2 "$calibrate" --dtypes f32 --sizes 64 512 -o "$calibration" > /dev/null
python3 - "$calibration" "$half" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["gemm"]["f32"]["gflops"] = [r / 2 for r in c["gemm"]["f32"]["gflops"]]
json.dump(c, open(sys.argv[2], "w"))
PY
for file in "$calibration" "$half"; do
  OVERLAP_SIM_COMPUTE=calibrated OVERLAP_CALIBRATION="$file" smpi fattree1024-200gbit 1 "$bench" --op ag -m 512 -n 512 \
    -k 512 --iters 1 --warmup 1 --no-check --no-peers --strategies ring --json "$cal_json" > /dev/null
done
python3 - "$calibration" "$cal_json" <<'PY'
import json, sys
rate = json.load(open(sys.argv[1]))["gemm"]["f32"]["gflops"][-1] * 1e9  # (512, 512, 512): the grid's last point
full, half = (r["one_gemm_ms"] for r in map(json.loads, open(sys.argv[2])) if r["strategy"] == "ring")
want = 2 * 512**3 / rate * 1e3
assert abs((half - full) / want - 1) < 0.05, (full, half, want)  # 2% seen: a unit or node-speed slip is 2x or more
print(f"smpi calibrated: halving the grid's rates added {(half - full) * 1e3:.3f} simulated us to a 512^3 GEMM, "
      f"its calibrated figure {want * 1e3:.3f}")
PY
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
    assert r["cpu"] and "SimGrid" in r["mpi"] and r["onednn"] and len(r["date"]) == 10, r
    # tools/smpi/run's smpi/host-speed (100Gf), and the platform's host speed.
    assert r["smpi_host_speed_flops"] == 100e9 and r["smpi_platform_speed_flops"] > 0, r
print(f"smpi apps: {len(rows)} JSON lines, every transport smpi, every result checked")
PY
# No silent zero compute: through plain smpirun, without smpi/host-speed,
# SimGrid charges a second of this machine's computation as 20 kflop, next to
# nothing on the mirror's 100 Gflop/s hosts. The library says so once (rank
# 0, one line), and the JSON records the speeds; tools/smpi/run says nothing.
plain=$(mktemp /tmp/overlap-smpi-plain.XXXXXX.json)
trap 'rm -f "$json" "$calibration" "$cal_json" "$half" "$plain"' EXIT
said=$(smpirun -np 2 -platform "$src/tools/smpi/star2-1gbit.xml" -hostfile "$src/tools/smpi/star2-1gbit.hosts" \
  --log=root.thres:error "$bench" --op ag -m 256 -n 256 -k 256 --iters 1 --warmup 0 --strategies ring \
  --json "$plain" 2>&1 >/dev/null | grep -c "overlap: SMPI's smpi/host-speed is") || true
[ "$said" = 1 ] || { echo "plain smpirun: the host-speed warning was printed $said times, expected once" >&2; exit 1; }
python3 - "$plain" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["smpi_host_speed_flops"] < 1e-3 * r["smpi_platform_speed_flops"], r
print(f"smpi plain smpirun: said once; host speed {r['smpi_host_speed_flops']:.3g} against "
      f"{r['smpi_platform_speed_flops']:.3g} flop/s recorded")
PY
quiet=$(smpi star2-1gbit 2 "$bench" --op ag -m 64 -n 64 -k 64 --iters 1 --warmup 0 --no-check 2>&1 >/dev/null |
  grep -c "smpi/host-speed is") || true
[ "$quiet" = 0 ] || { echo "tools/smpi/run: the host-speed warning was printed" >&2; exit 1; }
