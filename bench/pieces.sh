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
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it honours OMP_NUM_THREADS
for isa in native AVX2; do
  for n in 1 "$cores"; do
    echo "[pieces] ISA $isa, $n rank(s) computing at once" >&2
    env=()
    [ "$isa" = native ] || env=(-x ONEDNN_MAX_CPU_ISA="$isa")
    mpirun -np "$n" --oversubscribe --bind-to core "${env[@]}" sh -c 'exec "$0" \
      --benchmark_filter="gemm(_bf16)?/pieces" --benchmark_repetitions="$1" \
      --benchmark_enable_random_interleaving=true --benchmark_out="$2.$OMPI_COMM_WORLD_RANK.json" \
      --benchmark_out_format=json > /dev/null' "$engine" "$reps" "$out/engine-$isa-${n}ranks" || exit 1
  done
done
