"""Which MPI rank this process is, from the launcher's environment alone (no MPI call): what zeroshard-run and
the import-time launcher check need before MPI is initialised."""
import os


def mpi_rank_env():
    """(rank, world, local_rank, local_size) from an MPI launcher's variables (Open MPI, PMIx, MPICH's PMI,
    Slurm's srun), or None outside an MPI job. A Slurm batch shell has SLURM_PROCID but is no job step's rank."""
    env = os.environ

    def first(*names, default=None):
        for n in names:
            if n in env and env[n].isdigit():
                return int(env[n])
        return default
    slurm = ("SLURM_PROCID",) if "SLURM_STEP_ID" in env else ()
    rank = first("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", *slurm)
    if rank is None:
        return None
    world = first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1)
    local = first("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID", default=0)
    lsize = first("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE",
                  default=world)
    return rank, world, local, lsize
