#!/usr/bin/env bash
# P5 for `make bench`: the ring pieces' GEMM rate against one GEMM of the
# same work (bench/engine_bench.cpp, gemm/pieces and gemm_bf16/pieces), with
# B as stored and packed once per call, f32 and bf16, one rank alone and
# every core computing at once (one rank per core), at this machine's ISA and
# with oneDNN capped at AVX2. One JSON file per ISA, rank count and rank:
# OUT/engine-<isa>-<n>ranks.<rank>.json.
# Usage: pieces.sh ENGINE_BENCH OUT_DIR [REPETITIONS]
set -uo pipefail
engine=$1 out=$2 reps=${3:-7}
export OMP_NUM_THREADS=1
# The build's MPI stack (tools/mpi/stack): its launcher, flags and
# environment, and VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$(dirname "$0")/../tools/mpi/stack"
mpi_stack_setup "" "$(cd "$(dirname "$engine")/.." && pwd)" || exit 1
cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it honours OMP_NUM_THREADS
for isa in native AVX2; do
  for n in 1 "$cores"; do
    echo "[pieces] ISA $isa, $n rank(s) computing at once" >&2
    env=()
    [ "$isa" = native ] || env=(ONEDNN_MAX_CPU_ISA="$isa")
    MPI_BIND=core mpi_run "$n" env "${env[@]}" sh -c 'exec "$0" \
      --benchmark_filter="gemm(_bf16)?/pieces" --benchmark_repetitions="$1" \
      --benchmark_enable_random_interleaving=true --benchmark_out="$2.${OMPI_COMM_WORLD_RANK:-$PMI_RANK}.json" \
      --benchmark_out_format=json > /dev/null' "$engine" "$reps" "$out/engine-$isa-${n}ranks" || exit 1
  done
done
