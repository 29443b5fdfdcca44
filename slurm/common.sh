# Sourced by the sbatch scripts here: picks the launcher and sets threads and
# binding from the allocation. No site-specific modules are loaded; load your
# site's MPI / compiler modules before sbatch or in your own copy.
#
#   OVERLAP_LAUNCHER=srun|mpirun   (srun) srun --mpi=pmix, or Open MPI's mpirun
#   OVERLAP_BUILD=DIR              (<submit dir>/build) where overlap was built

: "${OVERLAP_LAUNCHER:=srun}"
: "${OVERLAP_BUILD:=${SLURM_SUBMIT_DIR:-.}/build}"
# One OpenMP team per rank, sized by --cpus-per-task. The progress thread
# sleeps between tests, so it needs no core of its own on most nodes.
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
    srun) srun --mpi=pmix --cpu-bind=cores "$@" ;;
    mpirun) mpirun -np "${SLURM_NTASKS:?}" --map-by "slot:PE=${SLURM_CPUS_PER_TASK:-1}" --bind-to core "$@" ;;
    *) echo "OVERLAP_LAUNCHER must be srun or mpirun, not '$OVERLAP_LAUNCHER'" >&2; return 2 ;;
  esac
}

echo "job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NODELIST:-?}: ${SLURM_NTASKS:-?} ranks x ${OMP_NUM_THREADS} threads," \
     "launcher ${OVERLAP_LAUNCHER}"
