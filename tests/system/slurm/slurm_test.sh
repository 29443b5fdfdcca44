#!/usr/bin/env bash
# Starts a real single-node Slurm (munged, slurmctld, slurmd) in a private
# directory, submits every script of slurm/ with tiny sizes via sbatch from
# outside the source tree (and the installed copies from an install prefix),
# with 1 CPU per task and with every CPU to one task (its OpenMP threads and
# binding checked), and once as under sbatch --export=NONE; waits
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

common_env=(OVERLAP_HOME="$src" OVERLAP_BUILD="$build" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            OMPI_MCA_rmaps_base_oversubscribe=1)
probe="$src/tests/system/slurm/binding_probe.sh"
mlp="$build/tests/examples/tensor_parallel_mlp"
# The scripts find slurm/common.sh through OVERLAP_HOME, or, installed, through
# the prefix they were installed under: jobs are submitted from elsewhere
# (the job folder), as a user submits from a work directory.
jobs=()
names=()
cd "$dir/jobs" || fail "cannot enter $dir/jobs"
submit() {  # submit NAME SBATCH_OPTIONS... -- SCRIPT [ENV...] [++ SCRIPT_ARGS...]
  local name=$1 opts=() vars=() id; shift
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  local script=$1; shift
  while [ $# -gt 0 ] && [ "$1" != ++ ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  id=$(env "${common_env[@]}" "${vars[@]}" sbatch --parsable "${opts[@]}" --output="$dir/jobs/$name-%j.out" "$script" \
         "$@") ||
    fail "sbatch $name"
  jobs+=("$id"); names+=("$name")
}
two=(--nodes=1 --ntasks-per-node=2 --cpus-per-task=1)
for launcher in srun mpirun; do
  submit "demo-$launcher" "${two[@]}" -- "$src/slurm/demo.sbatch" OVERLAP_LAUNCHER=$launcher OVERLAP_DEMO_SIZE=64
  # Every CPU of the node to one rank: 2 CPUs per task, 2 OpenMP threads bound to both cores.
  submit "threads-$launcher" --nodes=1 --ntasks=1 --cpus-per-task=2 -- "$src/slurm/template.sbatch" \
    OVERLAP_LAUNCHER=$launcher OVERLAP_PROGRAM="$probe" OVERLAP_PROBE_SETTING=given ++ "$mlp"
done
submit bench "${two[@]}" -- "$src/slurm/bench.sbatch" OVERLAP_SWEEP_SIZES="32 64" OVERLAP_SWEEP_M=64 \
  OVERLAP_JSON="$dir/jobs/sweep.jsonl"
submit template "${two[@]}" -- "$src/slurm/template.sbatch" OVERLAP_PROGRAM="$probe" OVERLAP_PROBE_SETTING=given \
  OVERLAP_LAUNCHER=srun ++ "$mlp"
# A site whose sbatch exports nothing but what is named (--export=NONE plus
# the settings the user passes): what common.sh sets inside the job, and what
# was named, still reach every rank.
exported=$(IFS=,; echo "${common_env[*]}"),OVERLAP_PROGRAM=$probe,OVERLAP_PROBE_SETTING=given
submit export-none "${two[@]}" --export="$exported" -- "$src/slurm/template.sbatch" ++ "$mlp"
# Installed: the scripts under <prefix>/share/overlap find common.sh and the
# installed apps by themselves, with neither OVERLAP_HOME nor a build tree.
cmake --install "$build" --prefix "$dir/prefix" > "$dir/log/install.log" 2>&1 || fail "cmake --install"
id=$(env -u OVERLAP_HOME -u OVERLAP_BUILD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       OMPI_MCA_rmaps_base_oversubscribe=1 OVERLAP_DEMO_SIZE=64 sbatch --parsable "${two[@]}" \
       --output="$dir/jobs/installed-%j.out" "$dir/prefix/share/overlap/slurm/demo.sbatch") || fail "sbatch installed"
jobs+=("$id"); names+=("installed")

deadline=$((SECONDS + ${SLURM_TEST_TIMEOUT:-240}))
status=0
for i in "${!jobs[@]}"; do
  id=${jobs[$i]} name=${names[$i]}
  slurm_wait_job "$id" "$deadline"
  st=$job_state rc=$job_rc run=$job_runtime
  out=$(ls "$dir"/jobs/"$name"-"$id".out 2>/dev/null)
  echo "job $id $name: $st exit $rc run time $run"
  if [ "$st" != COMPLETED ] || [ "$rc" != 0:0 ]; then status=1; cat "$out" 2>/dev/null; continue; fi
  probes=$(grep '^probe ' "$out" | sort)
  case $name in
    demo-* | installed)
      grep -q "^ring " "$out" && grep -q "^bulk " "$out" || { echo "$name: no bulk/ring lines"; cat "$out"; status=1; } ;;
    bench) [ "$(wc -l < "$dir/jobs/sweep.jsonl")" -ge 8 ] || { echo "bench: too few JSON lines"; status=1; } ;;
    threads-*)
      want="probe rank 0 cpus 0-$((cpus - 1)) threads $cpus bind close timeout 600 setting given"
      [ "$cpus" -ge 2 ] || want="probe rank 0 cpus 0 threads 1 bind close timeout 600 setting given"
      [ "$probes" = "$want" ] || { echo "$name: '$probes', want '$want'"; cat "$out"; status=1; }
      [ "$(grep -c ' ok$' "$out")" -eq 1 ] || { echo "$name: the program did not verify"; cat "$out"; status=1; } ;;
    template | export-none)
      # One CPU each, each rank on its own core, and the settings on both ranks.
      want=$'probe rank 0 cpus 0 threads 1 bind close timeout 600 setting given\nprobe rank 1 cpus 1 threads 1 bind close timeout 600 setting given'
      [ "$probes" = "$want" ] || { echo "$name: '$probes', want '$want'"; cat "$out"; status=1; }
      [ "$(grep -c ' ok$' "$out")" -eq 2 ] || { echo "$name: the program did not verify on 2 ranks"; cat "$out"; status=1; } ;;
  esac
done
[ $status -eq 0 ] || fail "some jobs failed"
echo "slurm test: ok (${#jobs[@]} jobs, srun and the MPI's launcher, 1 and $cpus CPUs per task, --export=NONE," \
     "installed scripts, ${OVERLAP_MPI_STACK:-openmpi})"
