#!/usr/bin/env bash
# `make bench`: sweeps both ops from compute-bound to comm-bound shapes on the
# emulated cluster (2 nodes star at 1 Gbit/s, 4 nodes ring at 1 Gbit/s), or on
# shared memory where the machine cannot emulate one, then writes
# docs/results.md with tables and plots (docs/results/*.svg) and keeps the
# JSON lines in docs/results/*.jsonl.
#
#   bench/sweep.sh BUILD_DIR [--quick]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:?usage: sweep.sh BUILD_DIR [--quick]}
quick=${2:-}
bench="$(cd "$build" && pwd)/apps/overlap-bench"
out="$root/docs/results"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
iters=5
sizes="256 512 1024 2048 4096"
[ "$quick" = --quick ] && sizes="256 2048" && iters=3

# sweep NAME NP LAUNCHER...: AG (lhs_rows) over N and RS (rows) over K, M = 2048.
sweep() {
  local name=$1 np=$2; shift 2
  local json="$out/$name.jsonl" s
  rm -f "$json"
  for s in $sizes; do
    echo "[$name] all_gather_matmul lhs_rows  M=2048 K=2048 N=$s" >&2
    "$@" "$bench" --op ag --variant lhs_rows -m 2048 -k 2048 -n "$s" --iters $iters --json "$json" > /dev/null || return 1
    echo "[$name] matmul_reduce_scatter rows  M=2048 N=2048 K=$s" >&2
    "$@" "$bench" --op rs --variant rows -m 2048 -n 2048 -k "$s" --iters $iters --json "$json" > /dev/null || return 1
  done
}

runs=()
if reason=$("$here/vcluster/vcluster" check 2>&1); then
  vc="$here/vcluster/vcluster"
  export VCLUSTER_PREFIX=ovlbench VCLUSTER_STATE=/tmp/overlap-vcluster-bench.$$
  trap '"$vc" down >/dev/null 2>&1' EXIT
  "$vc" up --nodes 2 --rate 1gbit --topology star >&2 || exit 1
  OVERLAP_TRANSPORT="tcp, emulated 2-node star, 1 Gbit/s" sweep star2 2 "$vc" run -np 2 || exit 1
  runs+=(star2)
  "$vc" up --nodes 4 --rate 1gbit --topology ring >&2 || exit 1
  OVERLAP_TRANSPORT="tcp, emulated 4-node ring, 1 Gbit/s per link" sweep ring4 4 "$vc" run -np 4 || exit 1
  runs+=(ring4)
  "$vc" down
else
  echo "cannot emulate a cluster here (${reason#vcluster: }): sweeping shared memory only" >&2
  OVERLAP_TRANSPORT="shared memory" sweep shm2 2 mpirun -np 2 --oversubscribe --bind-to none || exit 1
  runs+=(shm2)
fi
python3 "$here/report.py" "$out" "$root/docs/results.md" "${runs[@]}"
