#!/usr/bin/env bash
# The GEMM paths side by side (part of `make bench`): f32 and bf16 through
# all_gather_matmul's plan on 2 ranks computing at once (shared memory), at
# the machine's own ISA and with oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA),
# bf16 native where the CPU has it and widened to f32. The compute-only time
# of the plan's GEMMs is what compares the paths.
# Usage: gemm_paths.sh OVERLAP_BENCH OUT.jsonl [ITERS]
set -uo pipefail
bench=$1 json=$2 iters=${3:-7}
rm -f "$json"
export OMP_NUM_THREADS=1 OVERLAP_TRANSPORT="shared memory"
# The build's MPI stack (tools/mpi/stack): its launcher, flags and
# environment, and VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$(dirname "$0")/../tools/mpi/stack"
mpi_stack_setup "" "$(cd "$(dirname "$bench")/.." && pwd)" || exit 1
run() {  # run ISA_CAP DTYPE BF16_GEMM
  local env=(OVERLAP_BF16_GEMM="$3")
  [ "$1" = native ] || env+=(ONEDNN_MAX_CPU_ISA="$1")
  echo "[gemm paths] ISA ${1}, $2, OVERLAP_BF16_GEMM=$3" >&2
  (
    export "${env[@]}"
    mpi_run 2 "$bench" --op ag -m 2048 -n 2048 -k 2048 \
      --dtype "$2" --strategies ring --no-peers --iters "$iters" --json "$json" > /dev/null
  )
}
for isa in native AVX2; do
  run "$isa" f32 automatic || exit 1
  run "$isa" bf16 automatic || exit 1
  run "$isa" bf16 widened || exit 1
done
