#!/usr/bin/env bash
# Issue 12's sweep (part of `make bench`): the cost model against what it
# predicts, on the emulated cluster: 2-node star and 4-node ring, each at
# 1 and 10 Gbit/s, 8 shapes each (both ops, thin to square). Per cluster,
# overlap-calibrate writes the calibration the runs use (kept next to the
# results), then overlap-bench measures bulk, ring, bidirectional (4 nodes),
# the other-operands algorithm, automatic and the peers (ScaLAPACK with its
# best grid and block size) side by side. JSON lines: docs/results/model-*.jsonl.
# Then every shape runs a second time, right after and without the peers
# (docs/results/noise-*.jsonl): the same schedules measured twice in one
# session bound what any model can reach on this machine (the report's
# "noise floor": an oracle that knows the second pass, judged on the first).
#
#   bench/model_sweep.sh BUILD_DIR VCLUSTER [--quick]
# Needs a cluster the vcluster script can bring up; it leaves the cluster down, also on failure.
set -uo pipefail
build=$(cd "${1:?usage: model_sweep.sh BUILD_DIR VCLUSTER [--quick]}" && pwd)
vc=${2:?usage: model_sweep.sh BUILD_DIR VCLUSTER [--quick]}
quick=${3:-}
trap '"$vc" down >/dev/null 2>&1' EXIT  # the cluster this script brings up, on every exit
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/docs/results"
bench="$build/apps/overlap-bench"
calibrate="$build/apps/overlap-calibrate"
export OMP_NUM_THREADS=1
# The build's MPI stack (tools/mpi/stack): its launcher, flags and
# environment, and VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$(dirname "$0")/../tools/mpi/stack"
mpi_stack_setup "" "$build" || exit 1
iters=7
[ "$quick" = --quick ] && iters=3
# op variant M N K: thin to square for each op.
shapes=(
  "ag lhs_rows 2048 128 2048" "ag lhs_rows 2048 512 2048" "ag lhs_rows 2048 2048 2048"
  "ag rhs_cols 256 2048 2048" "ag rhs_cols 2048 2048 2048"
  "rs rows 2048 2048 128" "rs rows 2048 2048 512" "rs rows 2048 2048 2048"
)
[ "$quick" = --quick ] && shapes=("ag lhs_rows 2048 128 2048" "rs rows 2048 2048 2048")

for cluster in "star 2 1gbit" "star 2 10gbit" "ring 4 1gbit" "ring 4 10gbit"; do
  read -r topo nodes rate <<< "$cluster"
  name="model-$topo$nodes-$rate"
  label="tcp, emulated $nodes-node $topo, ${rate%gbit} Gbit/s per link"
  "$vc" up --nodes "$nodes" --rate "$rate" --topology "$topo" >&2 || exit 1
  echo "[$name] overlap-calibrate" >&2
  "$vc" run -np "$nodes" "$calibrate" -o "$out/$name-calibration.json" >&2 || exit 1
  strategies=ring,others,automatic
  [ "$nodes" -ge 3 ] && strategies=ring,bidirectional,others,automatic
  noise="noise-${name#model-}"
  rm -f "$out/$name.jsonl" "$out/$noise.jsonl"
  for pass in "$name" "$noise"; do
    peers=()
    [ "$pass" = "$noise" ] && peers=(--no-peers)
    for s in "${shapes[@]}"; do
      read -r op variant m n k <<< "$s"
      echo "[$pass] $op $variant M=$m N=$n K=$k" >&2
      OVERLAP_CALIBRATION="$out/$name-calibration.json" OVERLAP_TRANSPORT="$label" "$vc" run -np "$nodes" "$bench" \
        --op "$op" --variant "$variant" -m "$m" -n "$n" -k "$k" --strategies "$strategies" --iters $iters \
        "${peers[@]}" --json "$out/$pass.jsonl" > /dev/null || exit 1
    done
  done
done
