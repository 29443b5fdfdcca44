# shellcheck shell=bash
# shellcheck disable=SC2034  # job_state, job_rc, job_runtime: read by the callers
# Shared by the Slurm tests (sourced): install slurm-wlm and munge when
# missing, start munged with a private key and socket, wait for nodes and
# jobs with bounded timeouts, and stop every daemon started here by PID.
# The caller sets `dir` (a private directory) and calls slurm_cleanup on exit.

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; [ -n "${dir:-}" ] && tail -n 20 "$dir"/log/*.log 2>/dev/null; exit 1; }

pids=()

# Installs slurm-wlm and munge when a daemon is missing (root), else skips.
slurm_install() {
  [ "$(id -u)" -eq 0 ] || skip "needs root to run slurmd and munged"
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
  echo "installing slurm-wlm and munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge > /tmp/slurm-apt.log 2>&1 ||
    { apt-get update -q > /dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        slurm-wlm munge > /tmp/slurm-apt.log 2>&1; } || skip "cannot install slurm-wlm and munge (see /tmp/slurm-apt.log)"
}

# slurm_dirs [BASE]: makes $dir (mode 755, under BASE, default /tmp) with
# munge, spool, state, log and jobs folders.
slurm_dirs() {
  dir=$(mktemp -d "${1:-/tmp}/overlap-slurm.XXXXXX")
  chmod 755 "$dir"
  mkdir -p "$dir"/{munge,spool,state,log,jobs}
  chmod 755 "$dir/munge"
}

# Stops every daemon in pids (TERM, then KILL after 5 s) and removes $dir;
# SLURM_TEST_KEEP_LOGS=DIR keeps its logs and job outputs there.
slurm_cleanup() {
  local p
  [ -n "${SLURM_TEST_KEEP_LOGS:-}" ] && [ -n "${dir:-}" ] && cp -r "$dir/log" "$dir/jobs" "$SLURM_TEST_KEEP_LOGS" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  [ -n "${dir:-}" ] && rm -rf "$dir"
}

# slurm_start_munge [DIR]: a munged with the test's own key (made on the
# first call) and its socket at DIR/munge.socket (default $dir/munge). A real
# cluster runs one per node with one key; so do the multi-node tests (one
# munged decodes each credential once).
slurm_start_munge() {
  local at=${1:-$dir/munge} key="$dir/munge/munge.key"
  mkdir -p "$at" && chmod 755 "$at"
  if [ ! -f "$key" ]; then
    dd if=/dev/urandom of="$key" bs=1024 count=1 2>/dev/null
    chmod 400 "$key"
  fi
  munged --foreground --force --key-file="$key" --socket="$at/munge.socket" \
    --pid-file="$at/munged.pid" --log-file="$dir/log/munged-$(basename "$at").log" --seed-file="$at/seed" &
  pids+=($!)
  for _ in $(seq 50); do [ -S "$at/munge.socket" ] && return 0; sleep 0.1; done
  fail "munged did not start ($at)"
}

# The slurm.conf keys every test uses (the nodes and partition are the caller's).
# As at a site: tasks are bound to their CPUs (task/affinity) and srun's PMI
# is the site's default (MpiDefault, pmix as for Open MPI); the scripts of
# slurm/ pass no --mpi of their own.
slurm_conf_common() {
  cat <<CONF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmctldPort=${SLURM_TEST_PORT:-16817}
SlurmdPort=$(( ${SLURM_TEST_PORT:-16817} + 1 ))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=pmix
MailProg=/bin/true
MinJobAge=600
CONF
}

# slurm_wait_idle N CMD...: waits (20 s at most) until CMD's sinfo shows N idle nodes.
slurm_wait_idle() {
  local want=$1 idle=0; shift
  for _ in $(seq 100); do
    idle=$("$@" sinfo -h -N -o %T 2>/dev/null | grep -c '^idle$')
    [ "$idle" -ge "$want" ] && return 0
    sleep 0.2
  done
  fail "$idle of $want nodes became idle"
}

# slurm_wait_job ID DEADLINE CMD...: waits for a job to end (CMD prefixes
# scontrol, e.g. to run it in a namespace) until SECONDS reaches DEADLINE;
# sets job_state, job_rc and job_runtime.
slurm_wait_job() {
  local id=$1 deadline=$2 info; shift 2
  while :; do
    info=$("$@" scontrol show job "$id" 2>/dev/null)
    job_state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<< "$info")
    case $job_state in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) break ;; esac
    [ $SECONDS -lt "$deadline" ] || { "$@" scancel "$id"; fail "job $id still '$job_state' after the timeout"; }
    sleep 0.5
  done
  job_rc=$(sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' <<< "$info")
  job_runtime=$(sed -n 's/.*RunTime=\([0-9:-]*\).*/\1/p' <<< "$info")
}
