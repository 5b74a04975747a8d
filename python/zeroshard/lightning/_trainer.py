"""ZeroShardStrategy: lightning.pytorch's Trainer training a LightningModule through a ZeroShard engine, the way
Lightning's DeepSpeedStrategy drives DeepSpeed's (the engine wraps the module; Lightning's loops call
engine.backward / engine.step; checkpoints are the engine's directories holding Lightning's own state).

    import zeroshard.lightning
    trainer = L.Trainer(strategy="zeroshard_stage_2", accelerator="cpu")   # was: strategy="deepspeed_stage_2"
"""
import contextlib
import os
import shutil

import torch
import lightning.pytorch as pl
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.model_helpers import is_overridden

import zeroshard
from .._launch import dtype_of, framework_config, precision_of
from .._lib import world_info
from ._env import MPIEnvironment

WHERE = "zeroshard.lightning.ZeroShardStrategy"
_TAG = "checkpoint"   # the engine's tag inside each checkpoint directory Lightning names


def _micro_batch(trainer):
    """The training loader's batch size (what ZeroShard reports its batch sizes by), 1 when none is known."""
    source = trainer.fit_loop._data_source
    if trainer.state.fn != TrainerFn.FITTING or not source.is_defined():
        return 1
    return getattr(getattr(source.dataloader(), "batch_sampler", None), "batch_size", None) or 1


def _refuse(what):
    return NotImplementedError(f"{WHERE}: {what} is not supported")


class ZeroShardPrecision(Precision):
    """A precision name becomes the config's bf16 / fp16 section, so the engine's parameters are already in that
    dtype: no autocast on top (it would cast twice), floating inputs are cast to it, backward and the optimizer
    step are the engine's."""

    def __init__(self, precision):
        self.precision = precision
        self.section = precision_of(precision, WHERE)
        self._dtype = dtype_of(precision, WHERE)

    def convert_input(self, data):
        return apply_to_collection(data, torch.Tensor,
                                   lambda t: t.to(self._dtype) if t.is_floating_point() else t)

    def backward(self, tensor, model, optimizer, *args, **kwargs):
        if is_overridden("backward", model, pl.LightningModule):
            raise _refuse("an overridden LightningModule.backward (the engine runs backward)")
        engine = model.trainer.model
        if model.trainer.training and not model.trainer.fit_loop.epoch_loop._should_accumulate():
            # Lightning steps here: at a full window or at the epoch's last batch, whose window may be short
            # (as with DDP); the engine ends its window with it, dividing by accumulate_grad_batches as Lightning
            engine.set_gradient_accumulation_boundary(True)
        # Lightning divided the loss by accumulate_grad_batches already: the engine must not divide again
        engine.backward(tensor, *args, scale_wrt_gas=False, **kwargs)

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        result = closure()
        self._after_closure(model, optimizer)
        if result is None:
            raise _refuse("skipping a step by returning None from training_step")
        engine = model.trainer.model
        if not engine.is_gradient_accumulation_boundary():
            trainer = model.trainer
            raise RuntimeError(f"{WHERE}: Lightning steps the optimizer after batch {trainer.fit_loop.batch_idx + 1} "
                               f"of {trainer.num_training_batches}, which does not end an accumulation window of "
                               f"accumulate_grad_batches={trainer.accumulate_grad_batches} (the backward before it "
                               "ran outside the training loop)")
        engine.step(**kwargs)
        for cfg in model.trainer.lr_scheduler_configs:   # the step ran in ZeroShard: torch would warn of none
            cfg.scheduler.optimizer._opt_called = True
        return result

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=None):
        """The config's gradient_clipping (set from gradient_clip_val) clips inside ZeroShard's step."""


class ZeroShardStrategy(DDPStrategy):
    """ZeRO stages 0-3 for the Trainer. stage None: the config's zero_optimization.stage, or 2 when it has none.
    offload_optimizer / offload_parameters: True (cpu), "cpu", "nvme" (with nvme_path). config: a DeepSpeed
    JSON (path or dict); the Trainer's accumulate_grad_batches, gradient_clip_val and precision are merged
    into it, a contradiction raising naming the key."""

    strategy_name = "zeroshard"

    def __init__(self, stage=None, offload_optimizer=None, offload_parameters=None, nvme_path=None, config=None,
                 cluster_environment=None):
        super().__init__(cluster_environment=cluster_environment or MPIEnvironment(), process_group_backend="gloo")
        self._switches = dict(stage=stage, offload_optimizer=offload_optimizer,
                              offload_parameters=offload_parameters, nvme_path=nvme_path)
        self._user_config = config
        self.config = None
        self._engine = None
        self._fitted = False

    # ------------------------------------------------------------------ what Lightning hands over
    @DDPStrategy.accelerator.setter
    def accelerator(self, accelerator):
        """accelerator='cpu', or 'gpu' (CUDA): then the config's zeroshard.device defaults to "cuda" and each rank
        takes the GPU the engine takes (its node-local rank modulo the GPUs)."""
        if accelerator is not None and not isinstance(accelerator, (CPUAccelerator, CUDAAccelerator)):
            raise _refuse(f"accelerator {type(accelerator).__name__} (ZeroShard runs on accelerator='cpu' or 'gpu')")
        self._accelerator = accelerator

    def _on_gpu(self):
        return isinstance(self._accelerator, CUDAAccelerator)

    @DDPStrategy.precision_plugin.setter
    def precision_plugin(self, plugin):
        """Lightning hands the plugin its precision name picked (autocast for "bf16-mixed", a module cast for
        "bf16-true"); the name is kept, the plugin replaced. Any other plugin is refused."""
        if plugin is None or isinstance(plugin, ZeroShardPrecision):
            self._precision_plugin = plugin or ZeroShardPrecision("32-true")
            return
        if type(plugin) not in (Precision, MixedPrecision, HalfPrecision, DoublePrecision):
            raise _refuse(f"the precision plugin {type(plugin).__name__}")
        self._precision_plugin = ZeroShardPrecision(plugin.precision)

    def set_world_ranks(self):
        """The MPI world decides: devices and num_nodes left at their defaults (1) take its shape."""
        _, world, _, local = world_info()
        local = local or 1
        if len(self.parallel_devices or []) <= 1 and self.num_nodes == 1 and world > 1:
            gpus = torch.cuda.device_count() if self._on_gpu() else 0
            self.parallel_devices = ([torch.device("cuda", i % gpus) for i in range(local)] if gpus
                                     else [torch.device("cpu")] * local)
            self._num_nodes = max(world // local, 1)
        super().set_world_ranks()

    def _configure_launcher(self):
        if not self.cluster_environment.creates_processes_externally:
            raise _refuse(f"the cluster environment {type(self.cluster_environment).__name__}, which would "
                          "spawn processes (launch with mpirun)")

    def setup_distributed(self):
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = "gloo"
        zeroshard.init_distributed(timeout=self._timeout)

    # ------------------------------------------------------------------ the engine
    def _base_config(self):
        """The user's config with the constructor's switches (all that is known before the Trainer runs)."""
        cfg = framework_config(self._user_config, where=WHERE, **self._switches)
        if self._switches["stage"] is None:
            cfg.setdefault("zero_optimization", {}).setdefault("stage", 2)
        if self._on_gpu():
            cfg["zeroshard"] = dict(cfg.get("zeroshard") or {})
            cfg["zeroshard"].setdefault("device", "cuda")
        return cfg

    def _zero_config(self, trainer):
        """The config with the Trainer's switches merged in, built once, at the first setup."""
        if self.config is None:
            self.config = framework_config(self._base_config(), where=WHERE, precision=self.precision_plugin.precision,
                                           micro_batch=_micro_batch(trainer), accum=trainer.accumulate_grad_batches,
                                           clip=trainer.gradient_clip_val or None)
        return self.config

    @property
    def zero_stage_3(self):
        return self._base_config()["zero_optimization"]["stage"] == 3

    def _check_trainer(self, trainer, module):
        if not module.automatic_optimization:
            raise _refuse("manual optimization (automatic_optimization = False)")
        if trainer.gradient_clip_algorithm == GradClipAlgorithmType.VALUE:
            raise _refuse("gradient_clip_algorithm 'value' (ZeroShard clips the global norm: 'norm')")
        if is_overridden("configure_gradient_clipping", module, pl.LightningModule):
            raise _refuse("an overridden configure_gradient_clipping (ZeroShard clips inside its step: "
                          "gradient_clip_val)")

    def setup(self, trainer):
        self.accelerator.setup(trainer)
        module = self.lightning_module
        fitting = trainer.state.fn == TrainerFn.FITTING
        if self._engine is not None and self._engine.module is module:
            if not fitting:
                self.model = self._engine   # validate / test again, or after fit: the same engine
                return
            if self._fitted:
                raise _refuse("a second fit on one ZeroShardStrategy (make a new Trainer)")
            self._drop_inference_engine(module)
        optimizer, scheduler = None, None
        if fitting:
            self._check_trainer(trainer, module)
            optimizers, schedulers = _init_optimizers_and_lr_schedulers(module)
            if len(optimizers) != 1 or len(schedulers) > 1:
                raise _refuse(f"{len(optimizers)} optimizers and {len(schedulers)} lr schedulers from "
                              "configure_optimizers (ZeroShard trains one optimizer, with at most one scheduler)")
            optimizer = optimizers[0]
            scheduler = schedulers[0] if schedulers else None
        engine, zopt, _, _ = zeroshard.initialize(model=module, optimizer=optimizer, config=self._zero_config(trainer),
                                                  lr_scheduler=scheduler.scheduler if scheduler else None,
                                                  dist_init_required=False)
        # Lightning steps the scheduler (interval "step" or "epoch"); the engine hands its param_groups' lr
        # at each boundary and keeps them the truth across checkpoints (a client scheduler)
        engine.lr_scheduler = None
        self._engine = self.model = engine
        self._fitted = fitting
        if fitting:
            self.optimizers = [zopt]
            self.lr_scheduler_configs = [scheduler] if scheduler else []
        self.barrier()

    def _drop_inference_engine(self, module):
        """validate / test before the first fit built an engine without an optimizer: its fp32 parameters go
        back into the module (collective, one parameter at a time) and it is destroyed, so that fit builds the
        training engine from the same values, as Lightning's other strategies train the validated module."""
        from zeroshard.utils import safe_get_full_fp32_param
        engine = self._engine
        values = [(p, safe_get_full_fp32_param(p)) for p in module.parameters()]
        engine.destroy()
        for p, v in values:
            p.data = v
        self._engine = None

    def model_to_device(self):
        """The engine's parameters are ZeroShard's host buffers: nothing to move."""

    @contextlib.contextmanager
    def block_backward_sync(self):
        """Nothing to block: ZeroShard reduces at its own accumulation boundary (and refuses no_sync at 2-3)."""
        yield

    @property
    def handles_gradient_accumulation(self):
        return False   # Lightning skips the step between boundaries; the engine's boundaries are the same

    @property
    def restore_checkpoint_after_setup(self):
        return True    # the engine loads into the buffers it built

    @property
    def lightning_restore_optimizer(self):
        return False   # the moments and param_groups come back with the engine's checkpoint

    # ------------------------------------------------------------------ stage 3 construction
    @contextlib.contextmanager
    def tensor_init_context(self, empty_init=None):
        """trainer.init_module() and configure_model: at stage 3 the modules are built straight into shards
        (zeroshard.zero.Init; every rank builds the same values), else as Lightning builds them."""
        if not self.zero_stage_3:
            with super().tensor_init_context(empty_init):
                yield
            return
        with zeroshard.zero.Init(config_dict_or_path=self._base_config()):
            yield

    # ------------------------------------------------------------------ checkpoints
    def lightning_module_state_dict(self):
        """The module's full state, every parameter gathered (collective at stage 3)."""
        if self._engine is None:
            return super().lightning_module_state_dict()
        return self._engine.module_state_dict()

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        """The engine's checkpoint directory at `filepath`, Lightning's state (epoch, global_step, loops,
        callbacks, schedulers) as its client state; the weights and moments are the engine's own."""
        if storage_options is not None:
            raise _refuse("save_checkpoint(storage_options=...) (the engine writes the directory)")
        if self._engine is None:
            raise RuntimeError(f"{WHERE}: save_checkpoint before the engine exists (fit, validate or test first)")
        filepath = os.fspath(self.broadcast(filepath))
        os.makedirs(os.path.dirname(filepath) or ".", exist_ok=True)   # the engine makes the last level only
        state = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        self._engine.save_checkpoint(filepath, tag=_TAG, client_state=state)

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        checkpoint_path = self.broadcast(checkpoint_path)
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        _, state = self._engine.load_checkpoint(checkpoint_path, tag=_TAG, load_optimizer_states=fitting,
                                                load_lr_scheduler_states=False)
        if state is None:
            raise FileNotFoundError(f"{WHERE}: '{checkpoint_path}' holds no ZeroShard checkpoint (tag "
                                    f"'{_TAG}'); ckpt_path takes a directory this strategy saved")
        return state

    def load_model_state_dict(self, checkpoint, strict=True):
        """The engine loaded the weights in load_checkpoint."""

    def load_optimizer_state_dict(self, checkpoint):
        """The engine loaded the moments and param_groups in load_checkpoint."""

    def remove_checkpoint(self, filepath):
        if self.is_global_zero:
            shutil.rmtree(filepath, ignore_errors=True)

    # ------------------------------------------------------------------ registration
    @classmethod
    def register_strategies(cls, registry):
        off = {"offload_optimizer": True}
        names = {"zeroshard": ({"stage": 2}, ""), "zeroshard_stage_0": ({"stage": 0}, ""),
                 "zeroshard_stage_1": ({"stage": 1}, ""), "zeroshard_stage_2": ({"stage": 2}, ""),
                 "zeroshard_stage_2_offload": ({"stage": 2, **off}, ", the optimizer on cpu"),
                 "zeroshard_stage_3": ({"stage": 3}, ""),
                 "zeroshard_stage_3_offload": ({"stage": 3, **off, "offload_parameters": True},
                                               ", the optimizer and parameters on cpu")}
        for name, (kw, where) in names.items():
            registry.register(name, cls, description=f"ZeroShard, ZeRO stage {kw['stage']}{where}", override=True, **kw)


ZeroShardStrategy.register_strategies(StrategyRegistry)
