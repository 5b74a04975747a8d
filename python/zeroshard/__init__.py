"""ZeroShard for PyTorch: `import zeroshard as deepspeed` and a DeepSpeed training loop runs on libzeroshard.

    engine, optimizer, _, scheduler = zeroshard.initialize(model=model, config="ds_config.json")
    loss = engine(batch); engine.backward(loss); engine.step()

Launched with `mpirun -np N python train.py`: the library initialises MPI itself.
"""
import os
import weakref

from ._lib import ZsError


def _check_launcher():
    """ZeroShard's ranks are the MPI job's. A launcher that starts plain processes with WORLD_SIZE > 1 (torchrun,
    accelerate launch, DeepSpeed's) would give N separate one-rank trainings: refused at import, naming the
    launch line to use instead."""
    from ._mpienv import mpi_rank_env
    env = os.environ
    world = env.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) <= 1 or mpi_rank_env() is not None:
        return
    if "ACCELERATE_DYNAMO_BACKEND" in env or "ACCELERATE_MIXED_PRECISION" in env:
        by = "accelerate launch"
    elif "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env:
        by = "torchrun"
    elif "LOCAL_SIZE" in env:
        by = "the deepspeed launcher"
    else:
        by = "a launcher that is not MPI"
    raise RuntimeError(f"zeroshard: this process was started by {by} (WORLD_SIZE={world}, RANK={env.get('RANK', '?')}"
                       ") outside an MPI job, so it would train alone as rank 0 of 1. ZeroShard's ranks are MPI "
                       f"processes: launch with `zeroshard-run -np {world} SCRIPT ARGS` (or `mpirun -np {world} "
                       "python -m zeroshard.run SCRIPT ARGS`); docs/frameworks.md")


_check_launcher()
from . import zero

__version__ = "0.1.0"
__all__ = ["initialize", "init_distributed", "ZsError", "zero", "comm", "checkpointing"]


class _Scheduler:
    """The config's `scheduler` section runs inside ZeroShard's step; this reports its learning rates as
    DeepSpeed's scheduler objects do: get_last_lr() is each group's lr for the next optimizer step (what the
    param_groups hold after DeepSpeed's scheduler.step())."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)   # no cycle: a dropped engine goes at once, on every rank

    def step(self, *a, **k):
        """Stepped by engine.step() at each accumulation boundary, as DeepSpeed does."""

    def get_lr(self):
        return self._engine().next_lrs()

    get_last_lr = get_lr

    def state_dict(self):
        return {}   # the schedule's position is in ZeroShard's checkpoints

    def load_state_dict(self, state_dict):
        """The schedule's position comes back with the checkpoint."""


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               config_params=None):
    """deepspeed.initialize's signature; returns (engine, optimizer, dataloader, lr_scheduler).

    optimizer: a torch.optim Adam / AdamW / SGD / Adagrad (or DeepSpeed's FusedAdam / DeepSpeedCPUAdam)
    instance, whose class and defaults become the config's `optimizer` section and whose param_groups become
    ZeroShard's groups, or a callable building one from model_parameters. model_parameters: tensors (the
    model's other parameters are left alone: frozen) or torch-style group dicts. lr_scheduler: a torch
    scheduler or a callable(optimizer) making one; engine.step() steps it at each applied boundary.
    """
    from .engine import ZeroShardEngine, _torch
    from ._plan import initialize_config
    from .optim import resolve

    torch = _torch()
    cfg = initialize_config(args, config, config_params)
    if cfg is None:
        raise ValueError("zeroshard.initialize: no config (pass config=path_or_dict)")
    if model is None:
        raise ValueError("zeroshard.initialize: model= is required")
    if mpu is not None:
        raise NotImplementedError("zeroshard.initialize: mpu= is not supported (no model parallelism)")
    if lr_scheduler is not None and "scheduler" in cfg:
        raise ValueError("zeroshard.initialize: both a client scheduler (lr_scheduler=) and the config's "
                         "'scheduler' section; pass one of them (DeepSpeed refuses both too)")
    groups, bridge = resolve(torch, model, cfg, optimizer, model_parameters)
    if dist_init_required is not False:
        from .comm import init_distributed as init
        init(required=False)
    engine = ZeroShardEngine(model, cfg, groups=groups, bridge=bridge)
    loader = None
    if training_data is not None:
        sampler = torch.utils.data.distributed.DistributedSampler(training_data, num_replicas=engine.world_size,
                                                                  rank=engine.global_rank)
        loader = torch.utils.data.DataLoader(training_data, batch_size=engine.train_micro_batch_size_per_gpu(),
                                             sampler=sampler, collate_fn=collate_fn)
    sched = None
    if lr_scheduler is not None:
        is_sched = hasattr(lr_scheduler, "step") and hasattr(lr_scheduler, "state_dict")
        sched = lr_scheduler if is_sched else lr_scheduler(engine.optimizer)
        engine._client_scheduler = True
    elif "scheduler" in engine.config:
        sched = _Scheduler(engine)
    engine.lr_scheduler = sched
    return engine, engine.optimizer, loader, sched


def init_distributed(dist_backend="gloo", auto_mpi_discovery=True, distributed_port=None, verbose=True,
                     timeout=None, init_method=None, dist_init_required=None, config=None, rank=-1,
                     world_size=-1):
    """deepspeed.init_distributed: a torch.distributed process group over the MPI world (gloo: the front end
    is CPU-only), unless one exists. zeroshard.comm has the details."""
    from .comm import init_distributed as init
    return init(dist_backend=dist_backend, distributed_port=distributed_port, timeout=timeout,
                init_method=init_method)


from . import comm  # noqa: E402  (deepspeed.comm's calls a training script makes)
from . import checkpointing  # noqa: E402  (deepspeed.checkpointing.checkpoint)
from . import utils  # noqa: E402  (deepspeed.utils: safe_get_full_* / safe_set_full_*)
