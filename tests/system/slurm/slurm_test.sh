#!/usr/bin/env bash
# Starts a real single-node Slurm (munged, slurmctld, slurmd) in a private
# directory, submits every script of slurm/ with tiny sizes via sbatch, waits
# with a bounded timeout, checks each job's state, exit code and output, and
# stops every daemon it started, by PID, even on failure. Installs slurm-wlm
# and munge when missing (root); exit 77 (skipped) with the reason where the
# machine forbids it.
set -uo pipefail
src=$(cd "${1:?usage: slurm_test.sh SOURCE_DIR BUILD_DIR}" && pwd)
build=$(cd "${2:?}" && pwd)
# shellcheck source=tests/system/slurm/lib.sh
source "$(dirname "$0")/lib.sh"

slurm_install
slurm_dirs
trap slurm_cleanup EXIT
slurm_start_munge

# nproc honours OMP_NUM_THREADS, which benchmarks and tests often set to 1.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
{
  echo "ClusterName=overlaptest"
  echo "SlurmctldHost=localhost"
  echo "SlurmdSpoolDir=$dir/spool"
  echo "SlurmdPidFile=$dir/slurmd.pid"
  echo "SlurmdLogFile=$dir/log/slurmd.log"
  slurm_conf_common
  echo "NodeName=localhost CPUs=$cpus RealMemory=1000 State=UNKNOWN"
  echo "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP"
} > "$dir/slurm.conf"
export SLURM_CONF="$dir/slurm.conf"
slurmctld -D -f "$SLURM_CONF" > "$dir/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" > "$dir/log/slurmd.out" 2>&1 &
pids+=($!)
slurm_wait_idle 1

common_env=(OVERLAP_BUILD="$build" SLURM_SUBMIT_DIR="$src" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            OMPI_MCA_rmaps_base_oversubscribe=1)
# sbatch runs the script from its submit directory; slurm/common.sh is found
# through SLURM_SUBMIT_DIR, which sbatch sets to where it was called: run the
# scripts from the source tree's root.
jobs=()
names=()
cd "$src" || fail "cannot enter $src"
for launcher in srun mpirun; do
  id=$(env "${common_env[@]}" OVERLAP_LAUNCHER=$launcher OVERLAP_DEMO_SIZE=64 \
         sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --output="$dir/jobs/demo-$launcher-%j.out" \
         slurm/demo.sbatch) || fail "sbatch demo ($launcher)"
  jobs+=("$id"); names+=("demo-$launcher")
done
id=$(env "${common_env[@]}" OVERLAP_SWEEP_SIZES="32 64" OVERLAP_SWEEP_M=64 OVERLAP_JSON="$dir/jobs/sweep.jsonl" \
       sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --output="$dir/jobs/bench-%j.out" slurm/bench.sbatch) ||
  fail "sbatch bench"
jobs+=("$id"); names+=("bench")
id=$(env "${common_env[@]}" OVERLAP_PROGRAM="$build/tests/examples/tensor_parallel_mlp" OVERLAP_LAUNCHER=srun \
       sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --output="$dir/jobs/template-%j.out" slurm/template.sbatch) ||
  fail "sbatch template"
jobs+=("$id"); names+=("template")

deadline=$((SECONDS + ${SLURM_TEST_TIMEOUT:-240}))
status=0
for i in "${!jobs[@]}"; do
  id=${jobs[$i]} name=${names[$i]}
  slurm_wait_job "$id" "$deadline"
  st=$job_state rc=$job_rc run=$job_runtime
  out=$(ls "$dir"/jobs/"$name"-"$id".out 2>/dev/null)
  echo "job $id $name: $st exit $rc run time $run"
  if [ "$st" != COMPLETED ] || [ "$rc" != 0:0 ]; then status=1; cat "$out" 2>/dev/null; continue; fi
  case $name in
    demo-*) grep -q "^ring " "$out" && grep -q "^bulk " "$out" || { echo "$name: no bulk/ring lines"; cat "$out"; status=1; } ;;
    bench) [ "$(wc -l < "$dir/jobs/sweep.jsonl")" -ge 8 ] || { echo "bench: too few JSON lines"; status=1; } ;;
    template) [ "$(grep -c ' ok$' "$out")" -eq 2 ] || { echo "template: the program did not verify on 2 ranks"; cat "$out"; status=1; } ;;
  esac
done
[ $status -eq 0 ] || fail "some jobs failed"
echo "slurm test: ok (${#jobs[@]} jobs, srun and the MPI's launcher, ${OVERLAP_MPI_STACK:-openmpi})"
