"""deepspeed.comm: the process-group calls scripts and frameworks make, over torch.distributed's gloo group
on the MPI world (zeroshard.comm makes it; ZeroShard's own traffic goes through the library)."""
from zeroshard import comm as _c

from .. import _missing

is_initialized = _c.is_initialized
get_rank = _c.get_rank
get_world_size = _c.get_world_size
get_local_rank = _c.get_local_rank
barrier = _c.barrier
all_reduce = _c.all_reduce
broadcast = _c.broadcast
all_gather = _c.all_gather


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500, verbose=True,
                     timeout=None, init_method=None, dist_init_required=None, config=None, rank=-1, world_size=-1):
    """Collective over MPI_COMM_WORLD; nothing when torch.distributed is up already. rank/world_size, when
    given, must be MPI's: the world that trains is the MPI job's."""
    info = _c.L.world_info()
    if rank not in (-1, None) and rank != info[0] or world_size not in (-1, None) and world_size != info[1]:
        raise ValueError(f"deepspeed.comm.init_distributed: rank {rank} of {world_size} given, but the MPI job "
                         f"says rank {info[0]} of {info[1]} (launch with zeroshard-run -np N)")
    if dist_init_required is False:
        return
    _c.init_distributed(dist_backend=dist_backend, distributed_port=distributed_port, timeout=timeout,
                        init_method=init_method)


def get_world_group():
    import torch.distributed as dist
    return dist.group.WORLD


def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False):
    import torch.distributed as dist
    _c._need()
    return dist.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor, tensor, op=None, group=None, async_op=False):
    import torch.distributed as dist
    _c._need()
    return dist.reduce_scatter_tensor(output_tensor, tensor, op=op if op is not None else dist.ReduceOp.SUM,
                                      group=group, async_op=async_op)


def new_group(ranks=None, **kwargs):
    import torch.distributed as dist
    _c._need()
    return dist.new_group(ranks, **kwargs)


def __getattr__(name):
    if name == "ReduceOp":
        import torch.distributed as dist
        return dist.ReduceOp
    return _missing.module_getattr("deepspeed.comm")(name)
