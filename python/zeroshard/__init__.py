"""ZeroShard for PyTorch: `import zeroshard as deepspeed` and a DeepSpeed training loop runs on libzeroshard.

    engine, optimizer, _, scheduler = zeroshard.initialize(model=model, config="ds_config.json")
    loss = engine(batch); engine.backward(loss); engine.step()

Launched with `mpirun -np N python train.py`: the library initialises MPI itself.
"""
from ._lib import ZsError
from . import zero

__version__ = "0.1.0"
__all__ = ["initialize", "init_distributed", "ZsError", "zero", "comm"]


class _Optimizer:
    """What initialize returns as the optimizer: the optimizer runs inside ZeroShard (the config's
    `optimizer` section); this object reports its learning rate the way torch optimizers do."""

    def __init__(self, engine):
        self._engine = engine
        self.param_groups = [{"params": list(engine.module.parameters()), "lr": 0.0}]

    def _sync(self):
        self.param_groups[0]["lr"] = self._engine.get_lr()[0]

    def zero_grad(self, set_to_none=True):
        """Gradients are ZeroShard's and cleared by the step."""

    def step(self, closure=None):
        raise RuntimeError("zeroshard: call engine.step(), not optimizer.step() (as with DeepSpeed)")


class _Scheduler:
    """The config's `scheduler` section runs inside ZeroShard's step; this reports its learning rate."""

    def __init__(self, engine):
        self._engine = engine

    def step(self, *a, **k):
        """Stepped by engine.step() at each accumulation boundary, as DeepSpeed does."""

    def get_lr(self):
        return self._engine.get_lr()

    get_last_lr = get_lr


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               config_params=None):
    """deepspeed.initialize's signature; returns (engine, optimizer, dataloader, lr_scheduler)."""
    from .engine import ZeroShardEngine, _torch

    torch = _torch()
    if config is None:
        config = config_params if config_params is not None else getattr(args, "deepspeed_config", None)
    if config is None:
        raise ValueError("zeroshard.initialize: no config (pass config=path_or_dict)")
    if model is None:
        raise ValueError("zeroshard.initialize: model= is required")
    for name, val in (("optimizer", optimizer), ("lr_scheduler", lr_scheduler), ("mpu", mpu)):
        if val is not None:
            raise NotImplementedError(f"zeroshard.initialize: {name}= is not supported: the optimizer and "
                                      "scheduler come from the config's 'optimizer' and 'scheduler' sections")
    if model_parameters is not None:
        given = {id(p) for p in model_parameters}
        missing = [n for n, p in model.named_parameters() if id(p) not in given]
        if missing:
            raise NotImplementedError("zeroshard.initialize: model_parameters must list every parameter of the "
                                      f"model (missing '{missing[0]}')")
    engine = ZeroShardEngine(model, config)
    loader = None
    if training_data is not None:
        sampler = torch.utils.data.distributed.DistributedSampler(training_data, num_replicas=engine.world_size,
                                                                  rank=engine.global_rank)
        loader = torch.utils.data.DataLoader(training_data, batch_size=engine.train_micro_batch_size_per_gpu(),
                                             sampler=sampler, collate_fn=collate_fn)
    opt = _Optimizer(engine)
    sched = _Scheduler(engine) if "scheduler" in engine.config else None
    return engine, opt, loader, sched


def init_distributed(*args, **kwargs):
    """MPI is initialised by the library at initialize(); nothing to do here."""


from . import comm  # noqa: E402  (deepspeed.comm's few calls a training script makes)
