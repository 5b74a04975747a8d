"""The cluster environment of processes started by mpirun (Open MPI, MPICH, Slurm's srun with PMI): ranks from
libzeroshard's MPI world (zs_world_info), no mpi4py. The torch.distributed group the strategies use is
zeroshard.comm's gloo group, whose rendezvous goes over MPI; main_address / main_port report it."""
import os

from lightning.fabric.plugins.environments import ClusterEnvironment

from .. import _lib as L


def launched_by_mpi():
    env = os.environ
    return any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))


class MPIEnvironment(ClusterEnvironment):
    """Ranks as MPI numbers them; a world of one when the script runs without mpirun."""

    def __init__(self):
        super().__init__()
        self._rank, self._world, self._local_rank, self._local_size = L.world_info()

    @property
    def creates_processes_externally(self):
        return True   # mpirun started every process: Lightning must not spawn any

    @property
    def main_address(self):
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self):
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect():
        return launched_by_mpi()

    def world_size(self):
        return self._world

    def set_world_size(self, size):
        if size != self._world:
            raise ValueError(f"zeroshard.lightning: the MPI world has {self._world} ranks but Lightning asks "
                             f"for {size} (devices x num_nodes); launch with mpirun -np {size}, or leave "
                             "devices and num_nodes at their defaults")

    def global_rank(self):
        return self._rank

    def set_global_rank(self, rank):
        if rank != self._rank:
            raise ValueError(f"zeroshard.lightning: Lightning computed rank {rank} for MPI rank {self._rank}")

    def local_rank(self):
        return self._local_rank

    def node_rank(self):
        return self._rank // max(self._local_size, 1)
