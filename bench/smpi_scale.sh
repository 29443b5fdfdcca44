#!/usr/bin/env bash
# make bench-smpi-scale (issue 59): overlap-bench's three ops at scale on the
# simulated 1024-node fat trees of tools/smpi/, timing only, into
# docs/results/smpi/scale/ and then docs/scaling.md (its opening tables) and
# docs/results.md (the cost model against every case), by
# bench/smpi_scale_report.py.
#
#   groups  one tensor group of 8, 16, 32 and 64 ranks (SCALE_TP) on each
#           fat tree (SCALE_RATES, Gbit/s), each op (SCALE_OPS): bulk, ring
#           and automatic, whose measured choice times its three best
#           candidates, so every case also gives three (predicted,
#           simulated) pairs of the cost model.
#   meshes  the same ops on 1024 ranks as dp x tp meshes (SCALE_MESHES,
#           "TP:OP:RATE" each): every group runs at once on its own nodes.
#           The fat tree has full bisection and each group's traffic stays on
#           its own links, so a mesh's times are its group's; a mesh run
#           checks that, and that the simulation holds 1024 ranks (wall
#           time and real memory: tools/smpi/measure). A mesh times bulk,
#           ring and automatic only (overlap-bench --no-halves): the limit's
#           halves are its group's, and at 1024 ranks they cost a quarter of
#           the run.
#   layers  overlap-layer's training step (forward and backward of its
#           default block: seq 2048, hidden 1024, 16 heads, ffn 4096, f32)
#           at 1024 ranks of the 100 Gbit/s tree (SCALE_LAYERS, "TP:CP" each;
#           default tp 8 x dp 128, and tp 8 x cp 2 x dp 64 with ring
#           attention over cp), bulk against automatic, with the step's
#           collectives alone and its computation alone. The ops' GEMMs are
#           charged from the 8-rank group's calibration; attention, layer
#           norms, GELU and the weight gradients are sampled on their first
#           3 real runs in the simulation, then charged (backend::work_sampler).
#   nodes128  the groups part again on nodes of 128 cores (SCALE_128_RATES,
#           default 25, 100 and 200 Gbit/s; SCALE_128_TP, default 8 16 32): the
#           calibration's node GEMM rates times 4, the rule of the
#           projection (a node's rate = its cores x one core's), written
#           beside the rows as calibration-PLATFORM-TPranks-128cores.json.
#   rings   one tensor group of 128 and 256 ranks (SCALE_RINGS) at 100 Gbit/s,
#           bulk and the ring, the MLP block's two products of
#           bench/projection.cpp (tokens 4096, hidden 4096, ffn 16384), beside
#           that projection from the same calibration: a single ring of 1024
#           ranks stays a projection, and these check it where the
#           simulation can still follow every message. The 64-rank group's
#           calibration serves (its links span two leaves, as theirs do).
#           $PROJECTION is the projection's binary (make bench-smpi-scale
#           passes build/bench/overlap-projection; without it, no projection).
#
# Each rank of a group holds a shard of the same product, 65536 x 8192 x 8192
# f32 (M x N x K; the per-group problem of the issue's 1024-rank command):
# on 3.2 Tf nodes a rank's GEMMs take about 350-380 ms at tp 8 and 8 times
# less at tp 64, so the cases run from bound by their GEMMs to bound by
# their transfers across the group sizes and rates. GEMMs are charged from the platform's
# calibration for the group size (OVERLAP_SIM_COMPUTE=calibrated,
# docs/results/smpi/model-PLATFORM-TPranks-calibration.json, picked by
# tools/smpi/run): no GEMM runs, so the figures do not depend on this
# machine's load, and the cost model and the simulation see the same compute.
# The simulator's precision is 1e-6 (SMPI_PRECISION; tools/smpi/run's own is
# 1e-9 up to 64 ranks, for the model sweeps, and 1e-6 beyond): SimGrid handles
# flows that end within 1 us as one event, so an all-to-all's flows that end
# together cost one solve of the network's sharing, not one each. On a tensor
# group of 64 ranks (ag, moving the other operands) the run went from 165 s
# to 26 s, its simulated times moving by under 0.3% (docs/smpi.md).
# The default SCALE_MESHES are the tp 64 x dp 16 mesh's three ops at 100
# Gbit/s (the issue's command is its all-gather) and the tp 8 x dp 128
# mesh's three ops at 100 and its all-gather at 25 and 200, heaviest first.
# Every run here has SMPI_HOST_TIMING=off (tools/smpi/run): the library
# charges every GEMM, copy and sum of these timing-only runs itself, and
# samples a layer's local work, so SMPI times no host code (docs/smpi.md,
# "Scale").
# The simulations run SCALE_JOBS at a time (default 2, this machine's
# cores; each is one thread): the first mesh beside the group cases, then
# the other meshes, the layers and the rings, two by two. Every run is
# bounded by SCALE_LIMIT_S (default 600 s); one that passes it is recorded
# as such (tools/smpi/measure's rc 124) and the sweep goes on.
#
#   bench/smpi_scale.sh BUILD_SMPI_DIR
set -euo pipefail
build=$(cd "${1:?usage: smpi_scale.sh BUILD_SMPI_DIR}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/docs/results/smpi/scale"
bench="$build/apps/overlap-bench"
rates=${SCALE_RATES-25 100 200}
tps=${SCALE_TP-8 16 32 64}
ops=${SCALE_OPS-ag rs ar}
meshes=${SCALE_MESHES-64:ar:100 64:ag:100 64:rs:100 8:ar:100 8:rs:100 8:ag:100 8:ag:25 8:ag:200}
rings=${SCALE_RINGS-128 256}
layers=${SCALE_LAYERS-8:1 8:2}
rates128=${SCALE_128_RATES-25 100 200}
tps128=${SCALE_128_TP-8 16 32}
limit=${SCALE_LIMIT_S:-600}
shape=(-m 65536 -n 8192 -k 8192)
mkdir -p "$out"
export OMP_NUM_THREADS=1 OVERLAP_SIM_COMPUTE=calibrated SMPI_PRECISION=${SMPI_PRECISION:-1e-6} SMPI_HOST_TIMING=${SMPI_HOST_TIMING:-off} \
  OVERLAP_SIM_SAMPLES=${OVERLAP_SIM_SAMPLES:-3}
t_start=$SECONDS

# one KIND PLATFORM NP TP OP [BENCH_ARGS...]: one overlap-bench run of OP, its
# rows into KIND-PLATFORM.jsonl and its wall time and peak PSS into
# cost.jsonl ($OVERLAP_CALIBRATION, when set, instead of tools/smpi/run's
# choice). BENCH_ARGS default to the groups' shape, --tp TP and bulk, ring and
# automatic.
one() {
  local kind=$1 p=$2 np=$3 tp=$4 op=$5
  shift 5
  local args=("$@")
  [ ${#args[@]} -gt 0 ] || args=("${shape[@]}" --tp "$tp" --strategies "ring,automatic")
  echo "[smpi scale] $kind $p: $np ranks, tp $tp, $op ($((SECONDS - t_start)) s)" >&2
  OVERLAP_TRANSPORT="smpi, $p, $np ranks" MEASURE_OUT="$out/cost.jsonl" MEASURE_LABEL="$kind $p $np $tp $op" \
    "$root/tools/smpi/measure" timeout "$limit" "$root/tools/smpi/run" "$p" "$np" "$bench" --op "$op" "${args[@]}" \
    --iters 1 --warmup 0 --no-peers --no-check --json "${JSON_OUT:-$out/$kind-$p.jsonl}" > /dev/null ||
    echo "[smpi scale] exit $? (timeout: 124)" >&2
}

# groups KIND RATES TPS GEMM_FACTOR: every op on one tensor group of each size
# in TPS at each rate, the group's calibration with its node GEMM rates times
# GEMM_FACTOR (written beside the rows when not 1).
groups() {
  local kind=$1 rates=$2 tps=$3 factor=$4 rate tp op p cal
  for rate in $rates; do
    p="fattree1024-${rate}gbit"
    for tp in $tps; do
      cal="$root/docs/results/smpi/model-$p-${tp}ranks-calibration.json"
      if [ "$factor" != 1 ]; then
        python3 -c "import json, sys
c = json.load(open(sys.argv[1]))
c['gemm']['f32']['gflops'] = [float(sys.argv[3]) * g for g in c['gemm']['f32']['gflops']]
json.dump(c, open(sys.argv[2], 'w'), indent=1)" "$cal" "$out/calibration-$p-${tp}ranks-$((32 * factor))cores.json" "$factor"
        cal="$out/calibration-$p-${tp}ranks-$((32 * factor))cores.json"
      fi
      for op in $ops; do OVERLAP_CALIBRATION="$cal" one "$kind" "$p" "$tp" "$tp" "$op"; done
    done
  done
}

# fresh KIND: a part that runs replaces its own earlier rows (and costs) only,
# so that SCALE_RATES= SCALE_MESHES= ... reruns one part.
fresh() {
  rm -f "$out/$1"-*.jsonl
  if [ -f "$out/cost.jsonl" ]; then
    grep -v "\"label\": \"$1 " "$out/cost.jsonl" > "$out/cost.jsonl.tmp" || true
    mv "$out/cost.jsonl.tmp" "$out/cost.jsonl"
  fi
}
# fresh_mesh TP OP PLATFORM: a mesh's run replaces that mesh's earlier rows
# and cost only, so that SCALE_MESHES=... adds meshes beside the others.
fresh_mesh() {
  python3 - "$out/mesh-$3.jsonl" "$out/cost.jsonl" "$1" "$2" "mesh $3 1024 $1 $2" <<'EOF'
import json, os, sys
rows, cost, tp, op, label = sys.argv[1:6]
name = {"ag": "all_gather_matmul", "rs": "matmul_reduce_scatter", "ar": "matmul_all_reduce"}[op]
def keep(path, ok):
    if os.path.exists(path):
        lines = [l for l in open(path) if l.strip() and ok(json.loads(l))]
        open(path, "w").writelines(lines)
keep(rows, lambda r: not (r.get("ranks") == int(tp) and r.get("op") == name))
keep(cost, lambda r: r.get("label") != label)
EOF
}

# layer PLATFORM TP CP: overlap-layer's training step at 1024 ranks, tp x cp
# x dp, bulk against automatic, its rows into layer-PLATFORM.jsonl.
layer() {
  local p=$1 tp=$2 cp=$3
  echo "[smpi scale] layer $p: 1024 ranks, tp $tp, cp $cp ($((SECONDS - t_start)) s)" >&2
  OVERLAP_CALIBRATION="$root/docs/results/smpi/model-$p-${tp}ranks-calibration.json" \
    OVERLAP_TRANSPORT="smpi, $p, 1024 ranks" MEASURE_OUT="$out/cost.jsonl" MEASURE_LABEL="layer $p 1024 $tp cp$cp" \
    "$root/tools/smpi/measure" timeout "$limit" "$root/tools/smpi/run" "$p" 1024 "$build/apps/overlap-layer" \
    --modes automatic --steps 1 --warmup 1 --no-check --tp "$tp" --cp "$cp" \
    --json "${JSON_OUT:-$out/layer-$p.jsonl}" > /dev/null ||
    echo "[smpi scale] exit $? (timeout: 124)" >&2
}

# rings: single tensor groups of SCALE_RINGS ranks, then the projection.
rings() {
  local p=fattree1024-100gbit np lat
  local cal="$root/docs/results/smpi/model-$p-64ranks-calibration.json"
  for np in $rings; do
    OVERLAP_CALIBRATION="$cal" one rings "$p" "$np" "$np" ag -m 4096 -k 4096 -n 16384 --strategies ring
    OVERLAP_CALIBRATION="$cal" one rings "$p" "$np" "$np" rs -m 4096 -n 4096 -k 16384 --strategies ring
  done
  # The projection of the same platform: the calibration's node GEMM rates
  # (one "core" of --cores 1 is the node), its links' latency, the fat tree's rate.
  if [ -x "${PROJECTION:-}" ]; then
    lat=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['links']['network']['latency_us'])" "$cal")
    "$PROJECTION" "$cal" --cores 1 --efficiency 1 --gbit 100 --latency-us "$lat" --slowdown 1 \
      --tokens 4096 --hidden 4096 > "$out/rings-projection.jsonl"
  fi
}

# The simulations run SCALE_JOBS at a time (default 2): each is one thread,
# this machine has two cores, and a 1024-rank one holds about 4 GiB.
# spawn FINAL CMD...: CMD in the background once fewer than SCALE_JOBS run.
# With FINAL a file, CMD's rows go to a part file of their own, and collect
# appends them to FINAL in the order the jobs were spawned (the meshes of a
# platform share a file, as the layers do); FINAL "-": CMD writes files of
# its own, which no other job writes.
jobs_max=${SCALE_JOBS:-2}
parts=$(mktemp -d "$out/.parts.XXXXXX")
trap 'rm -rf "$parts"' EXIT
finals=()
spawn() {
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  local final=$1
  shift
  finals+=("$final")
  if [ "$final" = - ]; then
    "$@" &
  else
    JSON_OUT="$parts/${#finals[@]}.jsonl" "$@" &
  fi
}
collect() {
  wait
  local i
  for i in "${!finals[@]}"; do
    if [ "${finals[i]}" != - ] && [ -f "$parts/$((i + 1)).jsonl" ]; then
      cat "$parts/$((i + 1)).jsonl" >> "${finals[i]}"
    fi
  done
}

# Every part that runs replaces its own earlier rows first.
[ -n "$rates" ] && [ -n "$tps" ] && [ -n "$ops" ] && fresh groups
[ -n "$rates128" ] && [ -n "$tps128" ] && [ -n "$ops" ] && fresh groups128
for m in $meshes; do
  IFS=: read -r tp op rate <<< "$m"
  fresh_mesh "$tp" "$op" "fattree1024-${rate}gbit"
done
[ -n "$layers" ] && fresh layer
[ -n "$rings" ] && fresh rings
# The first mesh (by default the heaviest, tp 64 x dp 16's all-reduce) runs
# beside the small group cases; the other 1024-rank runs two at a time.
first=1
for m in $meshes; do
  IFS=: read -r tp op rate <<< "$m"
  spawn "$out/mesh-fattree1024-${rate}gbit.jsonl" \
    one mesh "fattree1024-${rate}gbit" 1024 "$tp" "$op" "${shape[@]}" --tp "$tp" --strategies ring,automatic --no-halves
  if [ $first = 1 ]; then
    spawn - groups groups "$rates" "$tps" 1
    spawn - groups groups128 "$rates128" "$tps128" 4
    first=0
  fi
done
if [ $first = 1 ]; then
  spawn - groups groups "$rates" "$tps" 1
  spawn - groups groups128 "$rates128" "$tps128" 4
fi
for l in $layers; do
  IFS=: read -r tp cp <<< "$l"
  spawn "$out/layer-fattree1024-100gbit.jsonl" layer fattree1024-100gbit "$tp" "$cp"
done
[ -n "$rings" ] && spawn - rings
collect
echo "[smpi scale] every simulation done at $((SECONDS - t_start)) s" >&2
python3 "$root/bench/smpi_scale_report.py" "$out" "$root/docs/scaling.md" "$root/docs/results.md"
