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
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; [ -n "${dir:-}" ] && tail -n 20 "$dir"/log/*.log 2>/dev/null; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmd and munged"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "installing slurm-wlm and munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge > /tmp/slurm-apt.log 2>&1 ||
    { apt-get update -q > /dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        slurm-wlm munge > /tmp/slurm-apt.log 2>&1; } || skip "cannot install slurm-wlm and munge (see /tmp/slurm-apt.log)"
fi

dir=$(mktemp -d /tmp/overlap-slurm.XXXXXX)
chmod 755 "$dir"
mkdir -p "$dir"/{munge,spool,state,log,jobs}
chmod 755 "$dir/munge"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT

# munge with its own key and socket.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$dir/munge/munge.key"
munged --foreground --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" &
pids+=($!)

# nproc honours OMP_NUM_THREADS, which benchmarks and tests often set to 1.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
cat > "$dir/slurm.conf" <<CONF
ClusterName=overlaptest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=${SLURM_TEST_PORT:-16817}
SlurmdPort=$(( ${SLURM_TEST_PORT:-16817} + 1 ))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
MinJobAge=600
NodeName=localhost CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"
for _ in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$dir/munge/munge.socket" ] || fail "munged did not start"
slurmctld -D -f "$SLURM_CONF" > "$dir/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" > "$dir/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %T 2>/dev/null | head -n 1)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "${state:-}" = idle ] || fail "the node did not become idle (state '${state:-none}')"

common_env=(OVERLAP_BUILD="$build" SLURM_SUBMIT_DIR="$src" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            OMPI_MCA_rmaps_base_oversubscribe=1)
# sbatch runs the script from its submit directory; slurm/common.sh is found
# through SLURM_SUBMIT_DIR, which sbatch sets to where it was called: run the
# scripts from the source tree's root.
jobs=()
names=()
cd "$src"
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
  while :; do
    info=$(scontrol show job "$id" 2>/dev/null)
    st=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<< "$info")
    case $st in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) break ;; esac
    [ $SECONDS -lt $deadline ] || { scancel "$id"; fail "job $id ($name) still '$st' after the timeout"; }
    sleep 0.5
  done
  rc=$(sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' <<< "$info")
  run=$(sed -n 's/.*RunTime=\([0-9:-]*\).*/\1/p' <<< "$info")
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
echo "slurm test: ok (${#jobs[@]} jobs, srun --mpi=pmix and mpirun)"
