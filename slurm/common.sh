# Sourced by the sbatch scripts here: picks the launcher and sets threads and
# binding from the allocation. No site-specific modules are loaded; load your
# site's MPI / compiler modules before sbatch or in your own copy.
#
#   OVERLAP_LAUNCHER=srun|mpirun   (srun) srun, or the MPI's own launcher
#   OVERLAP_BUILD=DIR              (<submit dir>/build) where overlap was built
#   OVERLAP_MPIEXEC=PATH           (the build's MPIEXEC_EXECUTABLE, else mpirun)
#                                  the launcher of OVERLAP_LAUNCHER=mpirun:
#                                  Open MPI's mpirun or MPICH's mpiexec (Hydra)
#   OVERLAP_SRUN_MPI=TYPE          srun's --mpi plugin (`srun --mpi=list` shows
#                                  a site's): pmix for Open MPI, pmi2 for
#                                  MPICH (the one Debian's MPICH and Slurm
#                                  share); by default chosen from the launcher

: "${OVERLAP_LAUNCHER:=srun}"
: "${OVERLAP_BUILD:=${SLURM_SUBMIT_DIR:-.}/build}"
if [ -z "${OVERLAP_MPIEXEC:-}" ]; then
  OVERLAP_MPIEXEC=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$OVERLAP_BUILD/CMakeCache.txt" 2>/dev/null || true)
  : "${OVERLAP_MPIEXEC:=mpirun}"
fi
# The MPI behind the build, told as the tests tell it (tools/mpi/stack).
# shellcheck source=tools/mpi/stack
source "$(dirname "${BASH_SOURCE[0]}")/../tools/mpi/stack"
overlap_mpi=$(_mpi_stack_detect "$OVERLAP_MPIEXEC" 2>/dev/null) || overlap_mpi=openmpi
if [ -z "${OVERLAP_SRUN_MPI:-}" ]; then
  if [ "$overlap_mpi" = mpich ]; then OVERLAP_SRUN_MPI=pmi2; else OVERLAP_SRUN_MPI=pmix; fi
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

# launch PROGRAM ARGS...: one rank per task of the allocation, each bound to
# its --cpus-per-task cores.
launch() {
  case $OVERLAP_LAUNCHER in
    srun) srun --mpi="$OVERLAP_SRUN_MPI" --cpu-bind=cores "$@" ;;
    mpirun)
      if [ "$overlap_mpi" = mpich ]; then  # Hydra launches through Slurm by itself
        "$OVERLAP_MPIEXEC" -n "${SLURM_NTASKS:?}" -bind-to "core:${SLURM_CPUS_PER_TASK:-1}" "$@"
      else
        "$OVERLAP_MPIEXEC" -np "${SLURM_NTASKS:?}" --map-by "slot:PE=${SLURM_CPUS_PER_TASK:-1}" --bind-to core "$@"
      fi
      ;;
    *) echo "OVERLAP_LAUNCHER must be srun or mpirun, not '$OVERLAP_LAUNCHER'" >&2; return 2 ;;
  esac
}

echo "job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NODELIST:-?}: ${SLURM_NTASKS:-?} ranks x ${OMP_NUM_THREADS} threads," \
     "launcher ${OVERLAP_LAUNCHER} ($overlap_mpi$([ "$OVERLAP_LAUNCHER" = srun ] && echo ", srun --mpi=$OVERLAP_SRUN_MPI"))"
