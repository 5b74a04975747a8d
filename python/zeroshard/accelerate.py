"""ZeroShard for Accelerate: an `Accelerator` taking the calls an Accelerate training script makes, with the model
and optimizer trained by the ZeroShard engine. The switch is one import:

    from zeroshard.accelerate import Accelerator          # was: from accelerate import Accelerator
    accelerator = Accelerator(gradient_accumulation_steps=2, mixed_precision="bf16")
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

The ZeRO config is `Accelerator(zeroshard_config=path_or_dict)` (a DeepSpeed JSON, or an Accelerate YAML whose
deepspeed_config.deepspeed_config_file names one), else a `deepspeed_plugin=DeepSpeedPlugin(...)`'s, else the
file ACCELERATE_DEEPSPEED_CONFIG_FILE names (as `accelerate launch` exports it), else stage 2. Launched with
`mpirun -np N python train.py`. What Accelerate offers and ZeroShard does not do raises naming it.
"""
import contextlib
import dataclasses
import inspect
import math
import os
import random
import weakref

try:
    import accelerate as _accelerate
    from accelerate.data_loader import BatchSamplerShard
    from accelerate.utils import DataLoaderConfiguration
except ImportError as e:   # pragma: no cover - said once, clearly
    raise ImportError("zeroshard.accelerate needs the accelerate package (pip install 'zeroshard[accelerate]')") from e

import torch

from . import _launch
from ._lib import world_info
from .comm import init_distributed

WHERE = "zeroshard.accelerate.Accelerator"
DEFAULT_CONFIG = {"zero_optimization": {"stage": 2}}
PRECISIONS = {"no": "no", "fp32": "no", "bf16": "bf16", "fp16": "fp16"}
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
RNG_FILE = "random_states_{}.pkl"   # Accelerate's name for each rank's random states


def _refuse(what, why=""):
    return NotImplementedError(f"{WHERE}: {what} is not supported" + (f" ({why})" if why else ""))


# ---------------------------------------------------------------------------------------------- the ZeRO config
def _yaml_ds_file(path):
    """The DeepSpeed JSON an Accelerate YAML config names (deepspeed_config.deepspeed_config_file)."""
    import yaml
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    ds = (doc.get("deepspeed_config") or {}).get("deepspeed_config_file")
    if not ds:
        raise ValueError(f"{WHERE}: Accelerate config '{path}' has no deepspeed_config.deepspeed_config_file")
    return ds if os.path.isabs(ds) else os.path.join(os.path.dirname(os.path.abspath(path)), ds)


def _user_config(zeroshard_config, deepspeed_plugin):
    """The user's ZeRO config (path, dict or YAML) by the precedence the module docstring gives."""
    if zeroshard_config is not None and deepspeed_plugin is not None:
        raise ValueError(f"{WHERE}: both zeroshard_config= and deepspeed_plugin=; pass one of them")
    if deepspeed_plugin is not None:
        if isinstance(deepspeed_plugin, dict):
            raise _refuse("several DeepSpeed plugins (deepspeed_plugin as a dict)")
        cfg = dict(deepspeed_plugin.deepspeed_config)
        if not math.isfinite(float(cfg.get("steps_per_print", 0))):
            del cfg["steps_per_print"]   # the plugin's "never": ZeroShard has no such printing
        return cfg
    src = zeroshard_config if zeroshard_config is not None else os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if isinstance(src, (str, os.PathLike)) and str(src).endswith((".yaml", ".yml")):
        src = _yaml_ds_file(src)
    return src if src is not None else dict(DEFAULT_CONFIG)


def _fill_autos(cfg, world):
    """What DeepSpeed's "auto" means here: train_batch_size from the micro-batch and accumulation, clipping
    from ACCELERATE_GRADIENT_CLIPPING (what `accelerate launch` exports) or none."""
    if cfg.get("gradient_clipping") == "auto":
        clip = os.environ.get("ACCELERATE_GRADIENT_CLIPPING")
        if clip is None:
            del cfg["gradient_clipping"]
        else:
            cfg["gradient_clipping"] = float(clip)
    micro, accum = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("gradient_accumulation_steps", 1)
    if micro in (None, "auto") and cfg.get("train_batch_size") in (None, "auto"):
        raise ValueError(f"{WHERE}: no micro-batch size: prepare a data loader (its batch_size) with the model and "
                         "optimizer, or set config key 'train_micro_batch_size_per_gpu'")
    if cfg.get("train_batch_size") == "auto":
        cfg["train_batch_size"] = micro * accum * world
    elif micro == "auto":
        del cfg["train_micro_batch_size_per_gpu"]
    return cfg


def _check_defaults(fn, given, allowed):
    """Each keyword of Accelerate's `fn` given a value other than its default (or one `allowed` lists for it) is
    refused, naming it."""
    sig = inspect.signature(fn).parameters
    for k, v in given.items():
        if k not in sig:
            raise TypeError(f"{WHERE}: unexpected keyword argument '{k}'")
        default = sig[k].default
        if v is not None and v is not default and v != default and v not in allowed.get(k, ()):
            raise _refuse(f"{k}={v!r}")


# ---------------------------------------------------------------------------------------------- wrappers
class _Loader:
    """A data loader sharded per rank the way Accelerate shards one (BatchSamplerShard: rank r takes batches
    r, r+N, ... of the original batch sampler, the last ones padded so every rank has as many), which marks its
    last batch so gather_for_metrics can drop the padding and accumulate() can see an epoch's end."""

    def __init__(self, acc, loader, generator):
        self._acc, self.generator = acc, generator
        shard = BatchSamplerShard(loader.batch_sampler, num_processes=acc.num_processes,
                                  process_index=acc.process_index, split_batches=False, even_batches=True)
        self._dl = torch.utils.data.DataLoader(
            loader.dataset, batch_sampler=shard, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            persistent_workers=loader.persistent_workers, generator=loader.generator)
        self.dataset, self.batch_size = loader.dataset, loader.batch_size
        self.total_batch_size = loader.batch_size * acc.num_processes
        self.remainder = len(loader.dataset) % self.total_batch_size
        self.end_of_dataloader = False
        self._skip = 0            # batches skip_first_batches asked to pass over at the next iteration
        self._epoch_rng = None    # the shuffling generator's state when the current iteration began

    def __len__(self):
        return len(self._dl)

    def __iter__(self):
        skip, self._skip = self._skip, 0
        self._epoch_rng = self.generator.get_state() if self.generator is not None else None
        self.end_of_dataloader = False
        self._acc._active.append(self)
        try:
            it = iter(self._dl)
            cur, n = next(it, StopIteration), 0
            while cur is not StopIteration:
                nxt, n = next(it, StopIteration), n + 1
                self.end_of_dataloader = nxt is StopIteration
                if n > skip:
                    yield cur
                cur = nxt
        finally:
            self._acc._active.remove(self)

    def set_epoch(self, epoch):
        """Accelerate's loaders take it; the shuffle here follows its generator, which needs no epoch."""

    def state(self):
        """The shuffling generator's state at the start of the current pass (between passes: now), so that
        load_state replays the pass; the script's skip_first_batches then passes over what it had used."""
        if self.generator is None:
            return None
        return self._epoch_rng if self._epoch_rng is not None and not self.end_of_dataloader else \
            self.generator.get_state()

    def load(self, rng):
        if rng is not None:
            self.generator.set_state(rng)
        self._epoch_rng, self.end_of_dataloader = None, False


class _Optimizer(torch.optim.Optimizer):
    """What prepare returns for the optimizer: the engine's param_groups (the client optimizer's dicts, which a
    scheduler writes); step() runs the engine's step at a sync step and does nothing otherwise, as Accelerate's
    AcceleratedOptimizer; zero_grad() is nothing (the engine's step clears the gradients)."""

    def __init__(self, acc, engine):   # no Optimizer.__init__: the groups are the engine's, already checked
        self._acc, self._engine = acc, engine
        self.param_groups = engine.optimizer.param_groups
        self.defaults = engine.optimizer.defaults
        self.state = {}
        self.step_was_skipped = False

    def step(self, closure=None):
        if closure is not None:
            raise _refuse("optimizer.step(closure)", "the engine's step takes no closure")
        if self._acc.sync_gradients:
            self._acc._engine_step()

    def zero_grad(self, set_to_none=True):
        """The gradients are ZeroShard's and cleared by its step."""

    def state_dict(self):
        return self._engine.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self._engine.optimizer.load_state_dict(state_dict)


class _Scheduler:
    """Accelerate's AcceleratedScheduler: steps only when the optimizer did (a sync step whose update was not
    skipped for fp16 overflow), and then once per process, since Accelerate's loaders hand each rank 1/N of the
    batches a scheduler sized on the unsharded loader counts (split_batches is refused)."""

    def __init__(self, acc, scheduler):
        self._acc, self.scheduler = acc, scheduler

    def step(self, *args, **kwargs):
        acc = self._acc
        if not acc.step_scheduler_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not acc.sync_gradients:
            if acc._plugin.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if acc._optimizer is not None and acc._optimizer.step_was_skipped:
            return
        self.scheduler.optimizer._opt_called = True   # torch would warn of a scheduler stepped first otherwise
        for _ in range(acc.num_processes):
            if self.scheduler._step_count <= getattr(self.scheduler, "total_steps", math.inf):
                self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name):   # get_last_lr, state_dict, load_state_dict, ...: the scheduler's
        return getattr(self.scheduler, name)


# ---------------------------------------------------------------------------------------------- the Accelerator
class Accelerator:
    """accelerate.Accelerator's interface over the ZeroShard engine (see the module docstring). Keywords of
    Accelerate's constructor that ask for something else (another device, FSDP, Megatron, tensor parallelism,
    dynamo, trackers, kwargs handlers, split or dispatched batches) raise naming the keyword."""

    def __init__(self, device_placement=True, mixed_precision=None, gradient_accumulation_steps=1, cpu=False,
                 dataloader_config=None, deepspeed_plugin=None, gradient_accumulation_plugin=None,
                 step_scheduler_with_optimizer=True, project_dir=None, *, zeroshard_config=None, **others):
        _check_defaults(_accelerate.Accelerator.__init__, others,
                        {"split_batches": (False,), "dynamo_backend": ("no", "NO")})
        if os.environ.get("ACCELERATE_TORCH_DEVICE", "cpu") != "cpu":
            raise _refuse(f"ACCELERATE_TORCH_DEVICE={os.environ['ACCELERATE_TORCH_DEVICE']}",
                          "the PyTorch front end trains on the CPU")
        if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            raise _refuse("FSDP (ACCELERATE_USE_FSDP)", "ZeroShard shards with ZeRO; pick a ZeRO stage instead")
        if dataloader_config is not None:
            _check_defaults(DataLoaderConfiguration, dataclasses.asdict(dataloader_config), {})
        self._config = _user_config(zeroshard_config, deepspeed_plugin)
        mp = mixed_precision or os.environ.get("ACCELERATE_MIXED_PRECISION") or "no"
        if str(mp) not in PRECISIONS:
            raise _refuse(f"mixed_precision={mp!r}", "ZeroShard takes 'no', 'bf16' and 'fp16'")
        self.mixed_precision = PRECISIONS[str(mp)]
        if gradient_accumulation_plugin is not None:
            if gradient_accumulation_steps != 1:
                raise ValueError(f"{WHERE}: gradient_accumulation_steps and gradient_accumulation_plugin; pass one")
            if gradient_accumulation_plugin.sync_each_batch:
                raise _refuse("GradientAccumulationPlugin(sync_each_batch=True)",
                              "ZeroShard reduces every micro-batch's gradients at stages 2-3 anyway")
        else:
            steps = int(os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", gradient_accumulation_steps))
            gradient_accumulation_plugin = _accelerate.utils.GradientAccumulationPlugin(num_steps=steps)
        self._plugin = gradient_accumulation_plugin
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.project_dir = project_dir
        init_distributed()
        dist = torch.distributed
        self.num_processes, self.process_index = dist.get_world_size(), dist.get_rank()
        self.local_process_index = world_info()[2]
        self.device = torch.device("cpu")
        self.sync_gradients = True
        self.step = 0                 # micro-batches since the last sync, as Accelerate counts them
        self._engine = None
        self._optimizer = None
        self._originals = {}          # id(client optimizer) -> the _Optimizer prepare made of it
        self._loaders = []
        self._active = []             # loaders being iterated, innermost last
        self._schedulers = []
        self._custom = []
        self._step_due = False        # a sync step's backward ran; the engine's step has not

    # ------------------------------------------------------------------ processes
    @property
    def is_main_process(self):
        return self.process_index == 0

    @property
    def is_local_main_process(self):
        return self.local_process_index == 0

    @property
    def is_last_process(self):
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self):
        return self.num_processes > 1

    @property
    def gradient_accumulation_steps(self):
        return self._plugin.num_steps

    def print(self, *args, **kwargs):
        if self.is_local_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self):
        torch.distributed.barrier()

    @contextlib.contextmanager
    def main_process_first(self):
        yield from self._first(self.is_main_process)

    @contextlib.contextmanager
    def local_main_process_first(self):
        yield from self._first(self.is_local_main_process)

    def _first(self, main):
        if not main:
            self.wait_for_everyone()
        yield
        if main:
            self.wait_for_everyone()

    # ------------------------------------------------------------------ prepare
    def prepare(self, *args, device_placement=None):
        """Each object in its place: the model and its optimizer (prepared together) become the engine and an
        optimizer over its param_groups; data loaders are sharded per rank; schedulers step with the
        optimizer. Anything else comes back as it is, as in Accelerate."""
        models = [a for a in args if isinstance(a, torch.nn.Module)]
        opts = [a for a in args if isinstance(a, torch.optim.Optimizer) and not isinstance(a, _Optimizer)]
        if len(models) > 1 or (models and self._engine is not None):
            raise _refuse("a second model", "one engine per Accelerator: prepare one model with its optimizer")
        if len(opts) > 1:
            raise _refuse("several optimizers", "the engine runs one optimizer")
        if bool(models) != bool(opts):
            raise _refuse("prepare() of a model without its optimizer (or an optimizer without its model)",
                          "the engine is built from both: pass them to the same prepare() call")
        out = [self._prepare_loader(a) if isinstance(a, torch.utils.data.DataLoader) else a for a in args]
        if models:
            batch = [a.batch_size for a in args if isinstance(a, torch.utils.data.DataLoader) and a.batch_size] \
                or [ld.batch_size for ld in self._loaders]
            engine, opt = self._build(models[0], opts[0], min(batch) if batch else None)
            out = [engine if a is models[0] else opt if a is opts[0] else o for a, o in zip(args, out)]
        out = [self._prepare_scheduler(a) if isinstance(a, torch.optim.lr_scheduler.LRScheduler) else o
               for a, o in zip(args, out)]
        return out[0] if len(out) == 1 else tuple(out)

    def _build(self, model, optimizer, micro_batch):
        import zeroshard
        cfg = _launch.framework_config(self._config, where=WHERE, precision=self.mixed_precision,
                                       micro_batch=micro_batch, accum=self.gradient_accumulation_steps)
        engine, _, _, _ = zeroshard.initialize(model=model, optimizer=optimizer,
                                               config=_fill_autos(cfg, self.num_processes))
        engine._client_scheduler = True   # param_groups are the truth across a load; the schedulers are ours
        if self.mixed_precision != "no":   # as Accelerate does for its models: fp32 inputs meet bf16 weights
            engine.forward = _autocast_forward(engine, AUTOCAST[self.mixed_precision])
        self._engine, self._optimizer = engine, _Optimizer(self, engine)
        self._originals[id(optimizer)] = self._optimizer
        return engine, self._optimizer

    def _prepare_loader(self, loader):
        if isinstance(loader.dataset, torch.utils.data.IterableDataset):
            raise _refuse("a data loader over an IterableDataset", "map-style datasets are sharded by index")
        if loader.batch_size is None:
            raise _refuse("a data loader with its own batch_sampler", "give it batch_size")
        sampler = loader.sampler
        gen = getattr(sampler, "generator", None) if isinstance(sampler, torch.utils.data.RandomSampler) else None
        if isinstance(sampler, torch.utils.data.RandomSampler) and gen is None:
            # as Accelerate: a generator seeded from the global RNG, rank 0's seed on every rank
            seed = torch.empty((), dtype=torch.int64).random_()
            torch.distributed.broadcast(seed, 0)
            gen = sampler.generator = torch.Generator().manual_seed(int(seed))
        wrapped = _Loader(self, loader, gen)
        self._loaders.append(wrapped)
        return wrapped

    def _prepare_scheduler(self, scheduler):
        if id(scheduler.optimizer) not in self._originals and not isinstance(scheduler.optimizer, _Optimizer):
            raise ValueError(f"{WHERE}: a scheduler over an optimizer prepare() has not seen; prepare the "
                             "optimizer (with its model) first or in the same call")
        wrapped = _Scheduler(self, scheduler)
        self._schedulers.append(wrapped)
        return wrapped

    def skip_first_batches(self, dataloader, num_batches=0):
        """The loader's next pass starts after num_batches batches (the resumed epoch's)."""
        if not isinstance(dataloader, _Loader):
            raise ValueError(f"{WHERE}: skip_first_batches takes a loader prepare() returned")
        dataloader._skip = int(num_batches)
        return dataloader

    # ------------------------------------------------------------------ training
    @contextlib.contextmanager
    def accumulate(self, *models):
        """Accelerate's: sync_gradients every gradient_accumulation_steps micro-batches. The engine steps on
        that count, so an accumulation cut short by a loader's end (sync_with_dataloader) is refused."""
        for m in models:
            if m is not self._engine:
                raise ValueError(f"{WHERE}: accumulate() takes the model prepare() returned")
        end = self._plugin.sync_with_dataloader and self._active and self._active[-1].end_of_dataloader
        self.step += 1
        self.sync_gradients = self.step % self.gradient_accumulation_steps == 0
        if end and not self.sync_gradients:
            raise _refuse(f"a sync at the end of the data loader after {self.step} of "
                          f"{self.gradient_accumulation_steps} accumulation micro-batches (sync_with_dataloader)",
                          "ZeroShard steps every gradient_accumulation_steps micro-batches: pass "
                          "GradientAccumulationPlugin(num_steps=..., sync_with_dataloader=False)")
        if self.sync_gradients:
            self.step = 0
        yield

    def no_sync(self, model):
        raise _refuse("no_sync()", "use accumulate(model) with gradient_accumulation_steps")

    def backward(self, loss, **kwargs):
        """The engine's backward (which averages over the accumulation steps, as Accelerate divides the loss)."""
        extra = set(kwargs) - {"retain_graph"}
        if extra:
            raise _refuse(f"backward({', '.join(sorted(extra))}=...)")
        e = self._need_engine("backward")
        if self._step_due:
            raise RuntimeError(f"{WHERE}: backward() again after a sync step without optimizer.step()")
        e.set_gradient_accumulation_boundary(self.sync_gradients)
        e.backward(loss, retain_graph=kwargs.get("retain_graph", False))
        self._step_due = self.sync_gradients

    def _engine_step(self):
        if self._step_due:
            self._engine.step()
            self._step_due = False
            self._optimizer.step_was_skipped = not self._engine.was_step_applied()

    @property
    def optimizer_step_was_skipped(self):
        return self._optimizer is not None and self._optimizer.step_was_skipped

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        """ZeroShard clips inside its step, with the config's gradient_clipping: max_norm must be that value and
        the parameters all the model's trainable ones. At a sync step the engine's step runs here (so the norm
        returned is this step's, before clipping) and optimizer.step() then has nothing left to do."""
        e = self._need_engine("clip_grad_norm_")
        if float(norm_type) != 2.0:
            raise _refuse(f"clip_grad_norm_(norm_type={norm_type})", "ZeroShard clips by the global 2-norm")
        clip = float(e.config.get("gradient_clipping", 0.0) or 0.0)
        if float(max_norm) != clip:
            raise ValueError(f"{WHERE}: clip_grad_norm_(max_norm={max_norm}) but the ZeRO config's gradient_clipping "
                             f"is {clip or 'unset'}: ZeroShard clips inside its step, set config key "
                             f"'gradient_clipping' to {max_norm}")
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        ours = {id(p) for g in e.optimizer.param_groups for p in g["params"]}
        if {id(p) for p in params if p.requires_grad} != ours:
            raise _refuse("clip_grad_norm_ over other parameters than the optimizer's",
                          "the engine clips all its parameters together")
        if not self.sync_gradients:
            return None
        self._engine_step()
        return torch.tensor(e.get_global_grad_norm())

    def clip_grad_value_(self, parameters, clip_value):
        raise _refuse("clip_grad_value_", "ZeroShard clips by the global norm: config key 'gradient_clipping'")

    def autocast(self, autocast_handler=None):
        """torch.autocast in the mixed-precision dtype (the prepared model's forward runs under it already)."""
        if autocast_handler is not None:
            raise _refuse("autocast(autocast_handler=...)")
        if self.mixed_precision == "no":
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=AUTOCAST[self.mixed_precision])

    def _need_engine(self, what):
        if self._engine is None:
            raise RuntimeError(f"{WHERE}: {what} before prepare(model, optimizer)")
        return self._engine

    # ------------------------------------------------------------------ collectives
    def gather(self, tensor):
        """Every rank's tensors concatenated along dim 0 (0-dim ones stacked), in nested lists/tuples/dicts."""
        return _apply(tensor, self._gather_one)

    def _gather_one(self, t):
        t = t.reshape(1) if t.dim() == 0 else t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.num_processes)]
        torch.distributed.all_gather(parts, t)
        return torch.cat(parts)

    def gather_for_metrics(self, input_data, use_gather_object=False):
        """gather, then at the last batch of a loader the copies its sharding padded on are dropped."""
        if use_gather_object:
            raise _refuse("gather_for_metrics(use_gather_object=True)", "gather tensors")
        data = self.gather(input_data)
        loader = self._active[-1] if self._active else None
        if loader is not None and loader.end_of_dataloader and loader.remainder > 0:
            return _apply(data, lambda t: t[:loader.remainder])
        return data

    def reduce(self, tensor, reduction="sum", scale=1.0):
        if reduction not in ("sum", "mean", "none"):
            raise ValueError(f"{WHERE}: reduce(reduction={reduction!r}): 'sum', 'mean' or 'none'")

        def one(t):
            t = t.clone() * scale
            if reduction != "none":
                torch.distributed.all_reduce(t)
            return t / self.num_processes if reduction == "mean" else t
        return _apply(tensor, one)

    def pad_across_processes(self, tensor, dim=0, pad_index=0, pad_first=False):
        def one(t):
            size = torch.tensor([t.shape[dim]])
            top = int(self.gather(size).max())
            if top == t.shape[dim]:
                return t
            shape = list(t.shape)
            shape[dim] = top
            out = t.new_full(shape, pad_index)
            idx = [slice(None)] * t.dim()
            idx[dim] = slice(top - t.shape[dim], top) if pad_first else slice(0, t.shape[dim])
            out[tuple(idx)] = t
            return out
        return _apply(tensor, one)

    # ------------------------------------------------------------------ models
    def unwrap_model(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
        return model.module if model is self._engine and model is not None else model

    def get_state_dict(self, model, unwrap=True):
        """The full model's state_dict (the model's own names; "module."-prefixed with unwrap=False), fp32
        masters for the parameters. Collective."""
        e = self._need_engine("get_state_dict")
        if model is not e and model is not e.module:
            raise ValueError(f"{WHERE}: get_state_dict takes the model prepare() returned")
        sd = e.module_state_dict()
        if e.dtype != torch.float32:
            from .utils import safe_get_full_fp32_param
            full = {}   # a tied parameter's names share one tensor, as in module_state_dict
            for name, p in e.module.named_parameters(remove_duplicate=False):
                if id(p) not in full:
                    full[id(p)] = safe_get_full_fp32_param(p)
                sd[name] = full[id(p)]
        return sd if unwrap else {"module." + k: v for k, v in sd.items()}

    def save_model(self, model, save_directory, max_shard_size="10GB", safe_serialization=True):
        """The full fp32 model in one file (model.safetensors, or pytorch_model.bin), tied tensors once, written
        by rank 0. Collective."""
        if max_shard_size != "10GB":
            raise _refuse(f"save_model(max_shard_size={max_shard_size!r})", "one file is written")
        sd = self.get_state_dict(model)
        if not self.is_main_process:
            return
        seen, out = set(), {}
        for k, v in sd.items():
            if id(v) not in seen:
                seen.add(id(v))
                out[k] = v.contiguous()
        os.makedirs(save_directory, exist_ok=True)
        if safe_serialization:
            from safetensors.torch import save_file
            save_file(out, os.path.join(save_directory, "model.safetensors"), metadata={"format": "pt"})
        else:
            torch.save(out, os.path.join(save_directory, "pytorch_model.bin"))

    # ------------------------------------------------------------------ checkpoints
    def register_for_checkpointing(self, *objects):
        bad = [type(o).__name__ for o in objects if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))]
        if bad:
            raise ValueError(f"{WHERE}: register_for_checkpointing: {', '.join(bad)} lack state_dict / "
                             "load_state_dict")
        self._custom.extend(objects)

    def save_state(self, output_dir=None, safe_serialization=True, **save_model_func_kwargs):
        """Collective. The engine's checkpoint in output_dir, holding the schedulers', the registered objects' and
        the loaders' states; each rank's random states beside it (random_states_<rank>.pkl)."""
        if output_dir is None:
            raise _refuse("save_state() without output_dir", "automatic checkpoint naming")
        if save_model_func_kwargs:
            raise _refuse(f"save_state({', '.join(save_model_func_kwargs)}=...)")
        e = self._need_engine("save_state")
        if self._step_due:
            raise RuntimeError(f"{WHERE}: save_state between a sync step's backward() and optimizer.step()")
        client = {"schedulers": [s.state_dict() for s in self._schedulers],
                  "custom": [o.state_dict() for o in self._custom],
                  "loaders": [ld.state() for ld in self._loaders], "step": self.step}
        os.makedirs(output_dir, exist_ok=True)
        e.save_checkpoint(output_dir, client_state=client)
        torch.save(_rng_states(), os.path.join(output_dir, RNG_FILE.format(self.process_index)))
        self.wait_for_everyone()
        return output_dir

    def load_state(self, input_dir=None, **load_model_func_kwargs):
        """Collective: what save_state wrote, so training continues bit for bit (the loaders replay the saved
        pass from its start: skip_first_batches passes over the batches already used)."""
        if input_dir is None:
            raise _refuse("load_state() without input_dir", "automatic checkpoint naming")
        if load_model_func_kwargs:
            raise _refuse(f"load_state({', '.join(load_model_func_kwargs)}=...)")
        e = self._need_engine("load_state")
        path, client = e.load_checkpoint(input_dir)
        if path is None:
            raise FileNotFoundError(f"{WHERE}: load_state: no checkpoint in '{input_dir}'")
        for what, mine, saved in (("schedulers", self._schedulers, client["schedulers"]),
                                  ("registered objects", self._custom, client["custom"]),
                                  ("data loaders", self._loaders, client["loaders"])):
            if len(mine) != len(saved):
                raise ValueError(f"{WHERE}: load_state: the checkpoint has {len(saved)} {what}, this script "
                                 f"prepared {len(mine)}")
        for s, st in zip(self._schedulers, client["schedulers"]):
            s.load_state_dict(st)
        for o, st in zip(self._custom, client["custom"]):
            o.load_state_dict(st)
        for ld, st in zip(self._loaders, client["loaders"]):
            ld.load(st)
        self.step = client["step"]
        _set_rng_states(torch.load(os.path.join(input_dir, RNG_FILE.format(self.process_index)),
                                   weights_only=False))

    def end_training(self):
        self.wait_for_everyone()

    def free_memory(self, *objects):
        """Collective: the engine is destroyed on every rank and what prepare() made is let go (Accelerate's
        call to release prepared objects); returns None for each object passed, as Accelerate does."""
        if self._engine is not None:
            self._engine.destroy()
        self._engine = self._optimizer = None
        self._originals, self._loaders, self._schedulers, self._custom = {}, [], [], []
        self._step_due, self.step, self.sync_gradients = False, 0, True
        return [None] * len(objects)

    def __getattr__(self, name):
        if not name.startswith("_") and hasattr(_accelerate.Accelerator, name):
            raise _refuse(name)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")


def _autocast_forward(engine, dtype):
    """The engine's forward under torch.autocast; through a weak reference, so the engine keeps no cycle (a
    dropped engine is finalised at once, on every rank)."""
    ref, forward = weakref.ref(engine), type(engine).forward

    def call(*args, **kwargs):
        with torch.autocast("cpu", dtype=dtype):
            return forward(ref(), *args, **kwargs)
    return call


def _apply(data, fn):
    """fn over every tensor of nested lists / tuples / dicts."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (list, tuple)):
        return type(data)(_apply(d, fn) for d in data)
    if isinstance(data, dict):
        return type(data)({k: _apply(v, fn) for k, v in data.items()})
    raise TypeError(f"{WHERE}: cannot gather a {type(data).__name__} (tensors in lists, tuples and dicts)")


def _rng_states():
    import numpy as np
    return {"random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
            "torch_manual_seed": torch.get_rng_state()}


def _set_rng_states(st):
    import numpy as np
    random.setstate(st["random_state"])
    np.random.set_state(st["numpy_random_seed"])
    torch.set_rng_state(st["torch_manual_seed"])
