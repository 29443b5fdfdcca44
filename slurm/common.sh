# Sourced by the sbatch scripts here: picks the launcher and sets threads and
# binding from the allocation. No site-specific modules are loaded; load your
# site's MPI / compiler modules before sbatch or in your own copy.
#
#   OVERLAP_LAUNCHER=srun|mpirun   (srun) srun, or the MPI's own launcher
#   OVERLAP_HOME=DIR               where the scripts find this file: overlap's
#                                  source tree or <prefix>/share/overlap (the
#                                  installed copies know their prefix)
#   OVERLAP_BUILD=DIR              (<submit dir>/build) a build tree; its apps
#                                  are used when present, else the installed
#                                  ones (<prefix>/bin), else those on PATH
#   OVERLAP_MPIEXEC=PATH           (the build's MPIEXEC_EXECUTABLE, else mpirun)
#                                  the launcher of OVERLAP_LAUNCHER=mpirun:
#                                  Open MPI's mpirun or MPICH's mpiexec (Hydra)
#   OVERLAP_SRUN_MPI=TYPE          srun's --mpi plugin (`srun --mpi=list` shows
#                                  a site's). Unset: srun's own choice, i.e.
#                                  SLURM_MPI_TYPE or the site's MpiDefault;
#                                  with neither, pmi2 for an MPICH build (the
#                                  PMI Debian's MPICH and Slurm share)

: "${OVERLAP_LAUNCHER:=srun}"
: "${OVERLAP_BUILD:=${SLURM_SUBMIT_DIR:-.}/build}"
overlap_share=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The apps: the build tree's, else the installed ones beside this file
# (<prefix>/share/overlap/slurm -> <prefix>/bin), else PATH's.
if [ -z "${OVERLAP_BIN:-}" ]; then
  if [ -x "$OVERLAP_BUILD/apps/overlap-bench" ]; then
    OVERLAP_BIN=$OVERLAP_BUILD/apps
  elif [ -x "$overlap_share/../../bin/overlap-bench" ]; then
    OVERLAP_BIN=$(cd "$overlap_share/../../bin" && pwd)
  else
    OVERLAP_BIN=$(dirname "$(command -v overlap-bench 2>/dev/null || echo ./overlap-bench)")
  fi
fi
if [ -z "${OVERLAP_MPIEXEC:-}" ]; then
  OVERLAP_MPIEXEC=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$OVERLAP_BUILD/CMakeCache.txt" 2>/dev/null || true)
  : "${OVERLAP_MPIEXEC:=mpirun}"
fi
# The MPI behind the build, told as the tests tell it (tools/mpi/stack).
# shellcheck source=tools/mpi/stack
source "$overlap_share/tools/mpi/stack"
overlap_mpi=$(_mpi_stack_detect "$OVERLAP_MPIEXEC" 2>/dev/null) || overlap_mpi=openmpi
# srun's PMI: the site's unless overridden (never a hard-coded plugin: sites
# run pmix, pmi2, cray_shasta, ...).
overlap_srun_mpi=()
if [ -n "${OVERLAP_SRUN_MPI:-}" ]; then
  overlap_srun_mpi=(--mpi="$OVERLAP_SRUN_MPI")
elif [ -z "${SLURM_MPI_TYPE:-}" ] && [ "$overlap_mpi" = mpich ]; then
  overlap_srun_mpi=(--mpi=pmi2)
fi
# One OpenMP team per rank, sized by --cpus-per-task. The progress policy is
# chosen per rank (docs/cluster.md): with every CPU of the task computing, as
# here, no CPU is left for a progress thread and it polls between GEMM bands.
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
# A rank that never arrives (a bug, a node that hangs) ends the job after
# 10 minutes with a report of what the others waited for, instead of holding
# the allocation until its time limit. Raise it if your program keeps its
# peers waiting longer between two calls (e.g. rank 0 writing a checkpoint).
export OVERLAP_TIMEOUT_S=${OVERLAP_TIMEOUT_S:-600}

# Every OVERLAP_* and OpenMP setting of this script goes to the ranks, also
# at sites whose sbatch runs with --export=NONE (Slurm then tells srun, through
# SLURM_EXPORT_ENV, to pass the ranks nothing of this script's environment):
# exported here, passed by srun --export=ALL, and named to Open MPI's mpirun.
for overlap_var in $(compgen -v OVERLAP_) $(compgen -v OMP_); do export "${overlap_var?}"; done
overlap_settings() { compgen -e | grep -E '^(OVERLAP|OMP)_' || true; }

# launch PROGRAM ARGS...: one rank per task of the allocation, each bound to
# its --cpus-per-task cores (srun does not pass --cpus-per-task on to its
# steps since Slurm 22.05: -c says it again). A rank that exits non-zero ends
# the step at once instead of leaving the others waiting.
launch() {
  local cpus=${SLURM_CPUS_PER_TASK:-1} v
  case $OVERLAP_LAUNCHER in
    srun)
      # ${a[@]+"${a[@]}"}: an empty array under set -u, which bash before 4.4 (RHEL 7's) rejects as unbound.
      srun ${overlap_srun_mpi[@]+"${overlap_srun_mpi[@]}"} -c "$cpus" --cpu-bind=cores --kill-on-bad-exit=1 \
        --export=ALL "$@" ;;
    mpirun)
      # The launcher starts its daemons through srun: they too get everything.
      export SLURM_EXPORT_ENV=ALL
      if [ "$overlap_mpi" = mpich ]; then  # Hydra launches through Slurm by itself and passes the whole environment
        "$OVERLAP_MPIEXEC" -n "${SLURM_NTASKS:?}" -bind-to "core:$cpus" "$@"
      else
        local forward=()
        for v in $(overlap_settings); do forward+=(-x "$v"); done
        "$OVERLAP_MPIEXEC" -np "${SLURM_NTASKS:?}" --map-by "slot:PE=$cpus" --bind-to core \
          ${forward[@]+"${forward[@]}"} "$@"
      fi
      ;;
    *) echo "OVERLAP_LAUNCHER must be srun or mpirun, not '$OVERLAP_LAUNCHER'" >&2; return 2 ;;
  esac
}

overlap_pmi="srun ${overlap_srun_mpi[*]:---mpi from ${SLURM_MPI_TYPE:+SLURM_MPI_TYPE=}${SLURM_MPI_TYPE:-the site default, MpiDefault}}"
echo "job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NODELIST:-?}: ${SLURM_NTASKS:-?} ranks x ${OMP_NUM_THREADS} threads," \
     "launcher ${OVERLAP_LAUNCHER} ($overlap_mpi$([ "$OVERLAP_LAUNCHER" = srun ] && echo ", $overlap_pmi")), apps in $OVERLAP_BIN"
