#!/usr/bin/env bash
# Run by a Slurm job as its program (slurm/template.sbatch): prints what this
# rank was given (the CPUs it may run on, its OpenMP threads and binding,
# and two settings: OVERLAP_TIMEOUT_S, which slurm/common.sh sets inside the
# job, and OVERLAP_PROBE_SETTING, which the submitter passes), then runs the
# program in its arguments, if any, in its place.
# The MPI launcher's rank first: under mpirun, SLURM_PROCID is the batch step's.
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-?}}}
cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
echo "probe rank $rank cpus $cpus threads ${OMP_NUM_THREADS:-unset} bind ${OMP_PROC_BIND:-unset}" \
     "timeout ${OVERLAP_TIMEOUT_S:-unset} setting ${OVERLAP_PROBE_SETTING:-unset}"
[ $# -eq 0 ] || exec "$@"
