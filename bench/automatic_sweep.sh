#!/usr/bin/env bash
# Whether strategy::automatic is never the slow one: overlap-bench runs bulk,
# ring and automatic side by side (interleaved, median of the slowest rank)
# for all_gather_matmul, matmul_reduce_scatter and matmul_all_reduce on 8
# shapes each, thin to square, on the emulated 2-node star and 4-node ring
# (1 Gbit/s); automatic measures its candidates first (OVERLAP_AUTOMATIC,
# default measured) and is timed once settled. Appends one JSON row per
# strategy to docs/results/automatic-<cluster>.jsonl, then prints
# automatic / bulk and automatic / the faster of bulk and ring per shape
# (bench/automatic_report.py).
#
#   bench/automatic_sweep.sh BUILD_DIR [star2|ring4 ...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:?usage: automatic_sweep.sh BUILD_DIR [star2|ring4 ...]}
shift
clusters=("$@")
[ ${#clusters[@]} -eq 0 ] && clusters=(star2 ring4)
bench="$(cd "$build" && pwd)/apps/overlap-bench"
export OMP_NUM_THREADS=1
# shellcheck source=tools/mpi/stack
source "$root/tools/mpi/stack"
mpi_stack_setup "" "$(cd "$build" && pwd)" || exit 1
vc="$root/tools/vcluster/vcluster"
reason=$("$vc" check 2>&1) || { echo "automatic_sweep: cannot emulate a cluster here: $reason" >&2; exit 77; }
export VCLUSTER_PREFIX=ovlauto VCLUSTER_STATE=/tmp/overlap-vcluster-auto.$$
trap '"$vc" down >/dev/null 2>&1' EXIT
# M N K: thin (the other operand's free dimension small) to square.
shapes=("2048 64 2048" "2048 128 2048" "2048 256 2048" "2048 512 2048" "2048 1024 2048" "1024 1024 1024"
        "2048 2048 2048" "4096 1024 2048")
for cluster in "${clusters[@]}"; do
  case $cluster in
    star2) nodes=2 topology=star ;;
    ring4) nodes=4 topology=ring ;;
    *) echo "automatic_sweep: unknown cluster $cluster (star2, ring4)" >&2; exit 2 ;;
  esac
  json="$root/docs/results/automatic-$cluster.jsonl"
  rm -f "$json"
  "$vc" down >/dev/null 2>&1
  "$vc" up --nodes "$nodes" --rate 1gbit --topology "$topology" >/dev/null || exit 1
  for op in ag rs ar; do
    for s in "${shapes[@]}"; do
      read -r m n k <<<"$s"
      echo "[$cluster] $op M=$m N=$n K=$k" >&2
      "$vc" run -np "$nodes" "$bench" --op "$op" -m "$m" -n "$n" -k "$k" --strategies ring,automatic --iters 5 \
        --no-check --json "$json" >/dev/null || exit 1
    done
  done
  "$vc" down >/dev/null 2>&1
  python3 "$here/automatic_report.py" "$json"
done
