"""ZeroShardFabricStrategy: Lightning Fabric's strategy over the ZeroShard engine, for processes started by mpirun.

    fabric = L.Fabric(accelerator="cpu", strategy=ZeroShardFabricStrategy(stage=3, config=ds_config))
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)      # the engine and its optimizer
    fabric.backward(loss); optimizer.step()                # engine.backward, engine.step

How Fabric's calls map onto the engine: fabric.setup builds it with zeroshard.initialize (the client optimizer's
param_groups become ZeroShard's groups, so a scheduler built on the returned optimizer drives the learning
rate); the config's gradient_accumulation_steps is the loop's accumulation (optimizer.step() is allowed only at
its boundary) and its gradient_clipping the clip fabric.clip_gradients asks for (ZeroShard clips inside the
step); fabric.save / fabric.load are the engine's checkpoint directory, the state's other entries its
client state. Anything else Fabric offers that ZeroShard does not do raises naming it.
"""
import contextlib

import torch
from lightning.fabric.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.plugins.precision.amp import MixedPrecision
from lightning.fabric.plugins.precision.half import HalfPrecision
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.fabric.strategies.parallel import ParallelStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl, _Sharded
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.fabric.utilities.distributed import _sync_ddp_if_available
from lightning.fabric.utilities.load import _move_state_into
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.fabric.wrappers import _unwrap_objects
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

from .. import _lib as L
from .. import initialize, init_distributed, zero
from .._launch import dtype_of, framework_config
from ..engine import ZeroShardEngine
from ._env import MPIEnvironment

WHERE = "ZeroShardFabricStrategy"
TAG = "checkpoint"   # the tag fabric.save writes under the path (Fabric's DeepSpeed strategy uses the same)


class ZeroShardPrecision(Precision):
    """The engine computes in the config's dtype (its parameters are bf16 / fp16 already), so nothing is
    autocast (that would cast twice); floating-point inputs are cast to that dtype and outputs back to fp32.
    Backward (with fp16's loss scale) and the optimizer step are the engine's. "32-true" (Fabric's default)
    leaves the dtype to the config."""

    def __init__(self, precision="32-true"):
        self.precision = str(precision)
        self.dtype = dtype_of(self.precision, WHERE)   # the engine's, once it is built

    def convert_input(self, data):
        return apply_to_collection(data, torch.Tensor, self._cast, self.dtype)

    def convert_output(self, data):
        return apply_to_collection(data, torch.Tensor, self._cast, torch.get_default_dtype())

    @staticmethod
    def _cast(t, dtype):
        return t.to(dtype) if t.is_floating_point() else t

    def backward(self, tensor, model, *args, **kwargs):
        model.backward(tensor, *args, **kwargs)

    def optimizer_step(self, optimizer, **kwargs):
        return optimizer.step(**kwargs)


def _zeroshard_precision(plugin):
    """Fabric builds its own plugin from Fabric(precision=...) and hands it to the strategy: the plain ones
    become ZeroShardPrecision of the same name, any other kind is refused."""
    if plugin is None or isinstance(plugin, ZeroShardPrecision):
        return plugin
    if isinstance(plugin, str):
        return ZeroShardPrecision(plugin)
    if type(plugin) in (Precision, MixedPrecision, HalfPrecision):
        return ZeroShardPrecision(plugin.precision)
    raise NotImplementedError(f"{WHERE}: precision plugin {type(plugin).__name__} is not supported (ZeroShard takes "
                              "precision '32-true', 'bf16-mixed', 'bf16-true', '16-mixed')")


class _SyncControl(_BackwardSyncControl):
    """fabric.no_backward_sync: stages 0-1 reduce only at the accumulation boundary (engine.no_sync); stages 2-3
    reduce-scatter every micro-batch's gradients into their shards as backward runs, which sums the same."""

    def no_backward_sync(self, module, enabled):
        if not enabled or not isinstance(module, ZeroShardEngine) or module.stage >= 2:
            return contextlib.nullcontext()
        return module.no_sync()


class ZeroShardFabricStrategy(ParallelStrategy, _Sharded):
    """stage None: the config's, else 2. offload_optimizer / offload_parameters: True or "cpu" / "nvme" (with
    nvme_path). config: a DeepSpeed-style config (path, JSON text or dict) the switches are merged into,
    conflicts raising naming the key. precision: a Fabric precision name (else Fabric(precision=...)'s)."""

    def __init__(self, stage=None, offload_optimizer=None, offload_parameters=None, nvme_path=None, config=None,
                 cluster_environment=None, precision=None):
        super().__init__(cluster_environment=cluster_environment or MPIEnvironment(), precision=precision)
        self._switches = dict(stage=stage, offload_optimizer=offload_optimizer,
                              offload_parameters=offload_parameters, nvme_path=nvme_path)
        self._user_config = config
        framework_config(config, where=WHERE, **self._switches)   # a bad switch or config raises here, at once
        self.config = None   # the merged config, once the precision is known (setup_environment)
        self._engine = None
        self._num_nodes = 1
        self._backward_sync_control = _SyncControl()

    # ------------------------------------------------------------------ what Fabric sets
    @property
    def precision(self):
        return self._precision if self._precision is not None else ZeroShardPrecision()

    @precision.setter
    def precision(self, plugin):
        self._precision = _zeroshard_precision(plugin)

    @property
    def accelerator(self):
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator):
        """accelerator='cpu', or 'gpu' (CUDA): then the config's zeroshard.device defaults to "cuda" and the root
        device is the GPU the engine takes (the node-local rank modulo the GPUs)."""
        if accelerator is not None and not isinstance(accelerator, (CPUAccelerator, CUDAAccelerator)):
            raise RuntimeError(f"{WHERE}: accelerator {type(accelerator).__name__} is not supported: ZeroShard runs "
                               "on accelerator='cpu' or 'gpu'")
        self._accelerator = accelerator

    def _on_gpu(self):
        return isinstance(self._accelerator, CUDAAccelerator)

    @property
    def root_device(self):
        if self._on_gpu():
            return torch.device("cuda", L.world_info()[2] % max(torch.cuda.device_count(), 1))
        return torch.device("cpu")

    @property
    def num_nodes(self):
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, n):
        self._num_nodes = n

    def _set_world_ranks(self):
        """Fabric's devices x num_nodes, when more than one, must be the MPI world (MPIEnvironment checks)."""
        n = self._num_nodes * len(self.parallel_devices or [None])
        if n > 1:
            self.cluster_environment.set_world_size(n)
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    def _configure_launcher(self):
        """No launcher: mpirun started every process."""

    def setup_environment(self):
        rank, world = L.world_info()[:2]
        env = self.cluster_environment
        if (env.global_rank(), env.world_size()) != (rank, world):
            raise ValueError(f"{WHERE}: cluster_environment {type(env).__name__} says rank {env.global_rank()} of "
                             f"{env.world_size()}, MPI rank {rank} of {world}; leave cluster_environment unset")
        self._set_world_ranks()
        init_distributed()   # torch.distributed over gloo, its rendezvous over MPI
        self._format_config()
        super().setup_environment()

    def _format_config(self):
        self._precision = self.precision   # fixed from here on (the engine's dtype is set on it)
        name = self._precision.precision
        cfg = framework_config(self._user_config, where=WHERE, precision=None if name == "32-true" else name,
                               **self._switches)
        zo = cfg.setdefault("zero_optimization", {})
        if zo.get("stage", "auto") == "auto":
            zo["stage"] = 2
        if "train_batch_size" not in cfg:   # the library needs one; it sizes nothing in the PyTorch front end
            cfg.setdefault("train_micro_batch_size_per_gpu", 1)
        if self._on_gpu():
            cfg["zeroshard"] = dict(cfg.get("zeroshard") or {})
            cfg["zeroshard"].setdefault("device", "cuda")
        self.config = cfg

    @property
    def model(self):
        """The engine fabric.setup built (as Fabric's DeepSpeed strategy names it)."""
        return self._engine

    @property
    def zero_stage(self):
        return self.config["zero_optimization"]["stage"] if self.config else None

    # ------------------------------------------------------------------ set-up
    def setup_module_and_optimizers(self, module, optimizers, scheduler=None):
        if len(optimizers) != 1:
            raise ValueError(f"{WHERE}: fabric.setup with {len(optimizers)} optimizers: ZeroShard trains one")
        if self.config is None:
            raise RuntimeError(f"{WHERE}: fabric.setup before fabric.launch()")
        cfg = dict(self.config)   # initialize adds the optimizer's section to its copy
        engine, opt, _, sched = initialize(model=module, optimizer=optimizers[0], lr_scheduler=scheduler, config=cfg,
                                           dist_init_required=False)
        if sched is None and "scheduler" not in cfg:
            # A scheduler the script builds on the returned optimizer writes param_groups; they are the truth, so
            # a checkpoint load hands their saved values at the next boundary (as with a client scheduler).
            engine._client_scheduler = True
        self.precision.dtype = engine.dtype
        self._engine = engine
        return engine, [opt], sched

    def setup_module(self, module):
        raise NotImplementedError(f"{WHERE}: setup_module / fabric.setup(model) without an optimizer is not "
                                  "supported: ZeroShard builds the model and its optimizer together; call "
                                  "fabric.setup(model, optimizer)")

    def setup_optimizer(self, optimizer):
        raise NotImplementedError(f"{WHERE}: setup_optimizers is not supported: ZeroShard builds the model and its "
                                  "optimizer together; call fabric.setup(model, optimizer)")

    def module_to_device(self, module):
        module.to(self.root_device)

    def module_sharded_context(self):
        """Stage 3: zeroshard.zero.Init, so each parameter's values go to a spill file as the model is built and
        fabric.setup gives each rank only its shard; other stages build the model as usual."""
        if self.config is None:
            raise RuntimeError(f"{WHERE}: fabric.init_module before fabric.launch()")
        return zero.Init(config_dict_or_path=self.config, enabled=self.zero_stage == 3)

    def module_init_context(self, empty_init=None):
        """Stage 3 builds under zero.Init (the values are computed either way: empty_init changes nothing there);
        other stages as Fabric's default (empty_init=True skips the initialisation, for a checkpoint to come)."""
        if self.config is not None and self.zero_stage == 3:
            return self.module_sharded_context()
        return super().module_init_context(empty_init=empty_init)

    # ------------------------------------------------------------------ the training step
    def _need_engine(self, what):
        if self._engine is None:
            raise RuntimeError(f"{WHERE}: {what} before fabric.setup(model, optimizer)")
        return self._engine

    def backward(self, tensor, module, *args, **kwargs):
        engine = self._need_engine("fabric.backward")
        if engine._micro_backward and engine.is_gradient_accumulation_boundary():
            raise RuntimeError(self._accum_error("fabric.backward() again after the boundary micro-batch's backward "
                                                 "without optimizer.step()"))
        # as loss.backward() under DDP, micro-batches' gradients add up (the loop divides the loss by its
        # accumulation): the engine's scale_wrt_gas=False
        kwargs.setdefault("scale_wrt_gas", False)
        super().backward(tensor, engine, *args, **kwargs)

    def optimizer_step(self, optimizer, **kwargs):
        engine = self._need_engine("optimizer.step()")
        if kwargs.get("closure") is not None:
            raise NotImplementedError(f"{WHERE}: optimizer.step(closure) is not supported (the step runs in ZeroShard)")
        if engine._micro_backward and not engine.is_gradient_accumulation_boundary():
            raise RuntimeError(self._accum_error("optimizer.step() before the accumulation boundary"))
        return self.precision.optimizer_step(engine)

    def _accum_error(self, what):
        n = self._engine.gradient_accumulation_steps()
        return (f"{WHERE}: {what}: the config's gradient_accumulation_steps is {n}, so ZeroShard steps every {n} "
                "micro-batches; set it to the loop's accumulation (config={'gradient_accumulation_steps': N})")

    def clip_gradients_norm(self, module, optimizer, max_norm, norm_type=2.0, error_if_nonfinite=True):
        """ZeroShard clips inside optimizer.step() by the config's gradient_clipping (fixed when the engine is
        built), so this only checks that it is the clip asked for. Returns None: the norm is computed in the step
        (engine.get_global_grad_norm() after optimizer.step() reads it)."""
        if float(norm_type) != 2.0:
            raise NotImplementedError(f"{WHERE}: clip_gradients norm_type={norm_type!r} is not supported (ZeroShard "
                                      "clips by the global 2-norm)")
        have = self.config.get("gradient_clipping", 0.0) if self.config else 0.0
        if have in ("auto", None) or float(have) != float(max_norm):
            raise ValueError(f"{WHERE}: clip_gradients(max_norm={max_norm}) but the config's gradient_clipping is "
                             f"{have!r}: ZeroShard clips inside optimizer.step() by the config's value, fixed at "
                             f"fabric.setup; pass config={{'gradient_clipping': {max_norm}}}")
        return None

    def clip_gradients_value(self, module, optimizer, clip_val):
        raise NotImplementedError(f"{WHERE}: clip_gradients(clip_val={clip_val}) (clipping by value) is not supported: "
                                  "ZeroShard clips by the global norm (clip_gradients(max_norm=...) with the config's "
                                  "gradient_clipping)")

    # ------------------------------------------------------------------ collectives (the gloo group)
    def all_reduce(self, tensor, group=None, reduce_op="mean"):
        if isinstance(tensor, torch.Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def barrier(self, *args, **kwargs):
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def broadcast(self, obj, src=0):
        if not torch.distributed.is_initialized():
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src)
        return box[0]

    # ------------------------------------------------------------------ state
    def get_module_state_dict(self, module):
        """The full values (gathered one unit at a time at stage 3: collective)."""
        module = _unwrap_objects(module)
        if isinstance(module, ZeroShardEngine):
            return module.module_state_dict()
        return super().get_module_state_dict(module)

    def load_module_state_dict(self, module, state_dict, strict=True):
        if isinstance(module, ZeroShardEngine):
            module.load_state_dict(state_dict, strict=strict)   # collective: rank 0's values
            return
        super().load_module_state_dict(module, state_dict, strict=strict)

    def _engine_in(self, state, what):
        engines = [v for v in state.values() if isinstance(v, ZeroShardEngine)]
        if len(engines) != 1:
            raise ValueError(f"{WHERE}: {what} needs the model fabric.setup returned in its state (found "
                             f"{len(engines)} ZeroShard models): state={{'model': model, ...}}")
        return engines[0]

    def save_checkpoint(self, path, state, storage_options=None, filter=None):
        """The engine's checkpoint directory at `path` (tag "checkpoint"); the state's other entries (step counters,
        schedulers' and other objects' state_dicts) are its client state. Collective."""
        if storage_options is not None:
            raise TypeError(f"{WHERE}: fabric.save(storage_options=...) is not supported (the engine writes the files)")
        if filter is not None:
            raise NotImplementedError(f"{WHERE}: fabric.save(filter=...) is not supported (the engine saves its whole "
                                      "state)")
        engine = self._engine_in(state, "fabric.save")
        rest = {k: v for k, v in state.items() if v is not engine and v is not engine.optimizer}
        client = self._convert_stateful_objects_in_state(rest, filter={})
        engine.save_checkpoint(self.broadcast(str(path)), tag=TAG, client_state=client)

    def load_checkpoint(self, path, state=None, strict=True, weights_only=None):
        """Back from fabric.save: the engine (and its optimizer's state when the optimizer is in `state`), then
        the state's other entries from the client state (in place for objects with load_state_dict). Returns
        what the checkpoint holds that `state` did not ask for."""
        if not isinstance(state, dict) or not state:
            raise NotImplementedError(f"{WHERE}: fabric.load / load_raw of {type(state).__name__} is not supported: "
                                      "pass state={'model': model, 'optimizer': optimizer, ...} as saved")
        engine = self._engine_in(state, "fabric.load")
        with_optimizer = any(v is engine.optimizer for v in state.values())
        _, client = engine.load_checkpoint(self.broadcast(str(path)), tag=TAG, load_optimizer_states=with_optimizer)
        if client is None:
            raise FileNotFoundError(f"{WHERE}: no ZeroShard checkpoint at '{path}' (fabric.save writes a directory)")
        wanted = {k for k, v in state.items() if v is not engine and v is not engine.optimizer}
        missing = sorted(wanted - set(client))
        if strict and missing:
            raise KeyError(f"{WHERE}: fabric.load: the checkpoint at '{path}' has no '{missing[0]}' (strict=False "
                           "skips it)")
        _move_state_into(source=client, destination=state, keys=wanted)
        return client

    @classmethod
    def register_strategies(cls, registry):
        names = (("zeroshard", {}), ("zeroshard_stage_0", {"stage": 0}), ("zeroshard_stage_1", {"stage": 1}), ("zeroshard_stage_2", {"stage": 2}),
                 ("zeroshard_stage_2_offload", {"stage": 2, "offload_optimizer": "cpu"}),
                 ("zeroshard_stage_3", {"stage": 3}),
                 ("zeroshard_stage_3_offload", {"stage": 3, "offload_optimizer": "cpu", "offload_parameters": "cpu"}))
        for name, kw in names:
            registry.register(name, cls, description=f"ZeroShard {kw or 'stage 2 (or the config)'}", override=True,
                              **kw)


ZeroShardFabricStrategy.register_strategies(STRATEGY_REGISTRY)
