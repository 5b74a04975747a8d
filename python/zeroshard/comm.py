"""zeroshard.comm: deepspeed.comm's calls a training script makes, over a torch.distributed gloo group that
init_distributed creates on the MPI world (ZeroShard's own traffic goes through the library, not this)."""
import datetime
import os
import socket

from . import _lib as L


def _dist():
    import torch.distributed as dist
    return dist


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _rendezvous(rank, distributed_port):
    """rank 0's address and a free port (MASTER_ADDR / MASTER_PORT when set), sent to every rank over MPI."""
    mine = b""
    if rank == 0:
        addr = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        port = os.environ.get("MASTER_PORT") or distributed_port or _free_port()
        mine = f"{addr}:{port}".encode()
    return L.world_bcast_bytes(mine, 0, "init_distributed").decode()


def _backend(asked, local_size):
    """gloo, or for "nccl" (what the frameworks ask on a GPU) NCCL for CUDA tensors beside gloo for CPU ones, as
    long as each rank on the node has a GPU of its own: NCCL refuses ranks sharing one, which ZeroShard's engine
    allows (its host-staged transport), so there torch.distributed stays on gloo and says so."""
    if asked in (None, "gloo"):
        return "gloo"
    if asked != "nccl":
        raise ValueError(f"zeroshard.init_distributed: backend '{asked}': torch.distributed runs over gloo, or "
                         "nccl on GPUs")
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        raise ValueError("zeroshard.init_distributed: backend 'nccl' with no GPU visible to torch "
                         "(torch.cuda.is_available() is False); use 'gloo'")
    if local_size > gpus:
        if L.world_info()[0] == 0:
            print(f"zeroshard: init_distributed: backend 'nccl' asked, {local_size} ranks share {gpus} GPU(s), "
                  "which NCCL refuses: torch.distributed runs over gloo (the engine's collectives are its own)",
                  flush=True)
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def init_distributed(dist_backend="gloo", distributed_port=None, timeout=None, init_method=None, required=True):
    """A process group over the MPI world (gloo; see _backend for nccl), unless torch.distributed is initialised
    already. Collective
    over MPI_COMM_WORLD (every rank calls it; initialize() does, with required=False: a library without
    zs_world_bcast then leaves torch.distributed alone)."""
    dist = _dist()
    if not dist.is_available() or dist.is_initialized():
        return
    if not required and not hasattr(L.lib(), "zs_world_bcast"):
        return
    rank, world, local_rank, local_size = L.world_info()
    backend = _backend(dist_backend, local_size)
    where = init_method or "tcp://" + _rendezvous(rank, distributed_port)
    kw = {"timeout": timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=timeout)} \
        if timeout else {}
    dist.init_process_group(backend, init_method=where, rank=rank, world_size=world, **kw)
    os.environ.setdefault("LOCAL_RANK", str(local_rank))


def _engine():
    from .engine import _engines
    for e in list(_engines):
        return e
    return None


def is_initialized():
    return _dist().is_initialized()


def get_rank(group=None):
    dist = _dist()
    if dist.is_initialized():
        return dist.get_rank(group)
    e = _engine()
    return e.global_rank if e else L.world_info()[0]


def get_world_size(group=None):
    dist = _dist()
    if dist.is_initialized():
        return dist.get_world_size(group)
    e = _engine()
    return e.world_size if e else L.world_info()[1]


def get_local_rank():
    return L.world_info()[2]


def _need():
    dist = _dist()
    if not dist.is_initialized():
        init_distributed()
    return dist


def barrier(group=None):
    return _need().barrier(group=group)


def all_reduce(tensor, op=None, group=None, async_op=False):
    dist = _need()
    return dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM, group=group, async_op=async_op)


def broadcast(tensor, src, group=None, async_op=False):
    return _need().broadcast(tensor, src, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return _need().all_gather(tensor_list, tensor, group=group, async_op=async_op)


def __getattr__(name):
    if name == "ReduceOp":   # deepspeed.comm.ReduceOp: torch.distributed's
        return _dist().ReduceOp
    raise AttributeError(f"module 'zeroshard.comm' has no attribute '{name}'")
