"""zeroshard.hf: the Hugging Face Trainer on ZeroShard. `zeroshard.hf.Trainer` is transformers.Trainer with one
more argument, the ZeRO config, and its training step going through a ZeroShardEngine instead of DDP:

    from zeroshard.hf import Trainer      # instead of: from transformers import Trainer
    trainer = Trainer(model, TrainingArguments(..., use_cpu=True), train_dataset=..., zeroshard_config="zero.json")

TrainingArguments takes no `deepspeed=` (the DeepSpeed package is never imported): the config's "auto" values
are filled from them as the Trainer's DeepSpeed integration fills them. The Trainer's own optimizer (its
weight-decay groups) and scheduler drive the engine's param_groups, unless the config has `optimizer` /
`scheduler` sections; checkpoints hold the engine's checkpoint beside the Trainer's state. Launched with
`mpirun -np N python script.py`: torch.distributed is a gloo group over the MPI world (zeroshard.comm), which the
Trainer's own collectives (logging, evaluation) use. Tested against transformers 5.24.0.
"""
import contextlib
import os

import safetensors.torch
import torch
import transformers
from transformers.trainer import SAFE_WEIGHTS_NAME, SCHEDULER_NAME
from transformers.trainer_utils import has_length

from . import initialize, init_distributed
from ._launch import framework_config
from .utils import safe_get_full_fp32_param

__all__ = ["Trainer", "DEFAULT_CONFIG"]

# The Trainer's methods overridden or called below: a transformers without one of them would train past the
# engine (an override nothing calls) or fail midway
_TRAINER_METHODS = ("create_accelerator_and_postprocess", "_prepare_for_training", "_wrap_model", "_clip_grad_norm",
                    "_get_grad_norm", "_maybe_log_save_evaluate", "_save_optimizer_and_scheduler",
                    "_load_optimizer_and_scheduler", "_load_from_checkpoint", "save_model", "_save",
                    "create_optimizer", "create_scheduler", "get_decay_parameter_names")
_missing = [m for m in _TRAINER_METHODS if not hasattr(transformers.Trainer, m)]
if _missing:
    raise ImportError(f"zeroshard.hf: transformers {transformers.__version__}'s Trainer lacks {', '.join(_missing)}; "
                      "zeroshard.hf.Trainer is tested against transformers 5.24.0")

# TrainingArguments reads the world (and, under mpirun, would rendezvous through variables mpirun does not
# set) when it is built, which scripts do before the Trainer: the gloo group over MPI is made on import, so
# every rank imports this module (collective over MPI_COMM_WORLD).
init_distributed()

WHERE = "zeroshard.hf.Trainer"
# zeroshard_config=None: ZeRO stage 2, everything else taken from TrainingArguments
DEFAULT_CONFIG = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto",
                  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                  "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}

# TrainingArguments ZeroShard does not do: (argument, is it asked for, why); each is refused by name
_REFUSED = (
    ("deepspeed", lambda a: a.deepspeed is not None, "pass the DeepSpeed JSON as zeroshard_config= instead"),
    ("fsdp", lambda a: bool(a.fsdp), "ZeroShard shards the model itself"),
    ("torch_compile", lambda a: a.torch_compile, "the engine's hooks are not compiled"),
    ("use_cpu", lambda a: not a.use_cpu, "use_cpu=True is required: the PyTorch front end trains on the CPU"),
    ("parallelism_config", lambda a: a.parallelism_config is not None, "no tensor, context or sequence parallelism"),
    ("auto_find_batch_size", lambda a: a.auto_find_batch_size, "the micro-batch is fixed when the engine is built"),
    ("load_best_model_at_end", lambda a: a.load_best_model_at_end, "the best checkpoint is not loaded back"),
    ("push_to_hub", lambda a: a.push_to_hub, "save_model writes the files; upload them apart"),
    ("fp16_full_eval", lambda a: a.fp16_full_eval, "evaluation runs in the training dtype"),
    ("bf16_full_eval", lambda a: a.bf16_full_eval, "evaluation runs in the training dtype"),
)


def _refuse_arguments(args):
    for name, asked, why in _REFUSED:
        if asked(args):
            raise NotImplementedError(f"{WHERE}: TrainingArguments({name}=...) is not supported ({why})")


def _fill(section, key, value):
    """A key the config leaves "auto" takes the Trainer's value."""
    if section.get(key) == "auto":
        section[key] = value


def trainer_config(config, args, max_steps):
    """The ZeRO config (path, JSON or dict; None: DEFAULT_CONFIG) with its "auto" values filled from
    TrainingArguments, as the DeepSpeed integration fills them; a value the config gives that contradicts an
    argument is an error naming the key."""
    precision = "bf16-mixed" if args.bf16 else ("16-mixed" if args.fp16 else "32-true")
    cfg = framework_config(DEFAULT_CONFIG if config is None else config, where=WHERE, precision=precision,
                           micro_batch=args.per_device_train_batch_size, accum=args.gradient_accumulation_steps,
                           clip=args.max_grad_norm)
    _fill(cfg, "train_batch_size",
          args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size)
    opt = cfg.get("optimizer", {}).get("params", {})
    for key, value in (("lr", args.learning_rate), ("betas", [args.adam_beta1, args.adam_beta2]),
                       ("eps", args.adam_epsilon), ("weight_decay", args.weight_decay)):
        _fill(opt, key, value)
    sched = cfg.get("scheduler", {}).get("params", {})
    for key, value in (("warmup_min_lr", 0.0), ("warmup_max_lr", args.learning_rate),
                       ("warmup_num_steps", args.get_warmup_steps(max_steps)), ("total_num_steps", max_steps)):
        _fill(sched, key, value)
    return cfg


class _EngineOptimizer:
    """What the Trainer steps as its optimizer: step() is the engine's step (at the accumulation boundary the
    Trainer's loop reaches it); param_groups are the engine's, which the scheduler writes."""

    def __init__(self, engine):
        self.engine = engine

    @property
    def param_groups(self):
        return self.engine.optimizer.param_groups

    def step(self, closure=None):
        if closure is not None:
            raise NotImplementedError(f"{WHERE}: optimizer.step(closure) is not supported")
        self.engine.step()
        self.engine.optimizer._opt_called = True   # torch warns of a scheduler stepped first otherwise

    def zero_grad(self, set_to_none=True):
        """Gradients are ZeroShard's and cleared by its step."""

    def state_dict(self):
        return self.engine.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.engine.optimizer.load_state_dict(state_dict)


def _no_sync(model=None):
    return contextlib.nullcontext()


class Trainer(transformers.Trainer):
    """transformers.Trainer trained by a ZeroShardEngine. zeroshard_config: the DeepSpeed-style config (path,
    JSON text or dict); None trains at stage 2 with every batch, optimizer and precision value from
    TrainingArguments. The engine is built when train() starts (once per Trainer), after the Trainer has
    counted its steps: `trainer.engine` then holds it."""

    def __init__(self, *args, zeroshard_config=None, **kwargs):
        self.zeroshard_config = zeroshard_config
        self.engine = None
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ set-up
    def create_accelerator_and_postprocess(self):
        """The arguments are checked before the Accelerator is built, which then reaches the engine."""
        _refuse_arguments(self.args)
        super().create_accelerator_and_postprocess()
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise NotImplementedError(f"{WHERE}: the Accelerate configuration enables "
                                      f"{'DeepSpeed' if self.is_deepspeed_enabled else 'FSDP'}; ZeroShard replaces it")
        self._route_accelerator()

    def _route_accelerator(self):
        """The Trainer's loop reaches the model through three Accelerator calls, replaced on this instance:
        backward becomes the engine's; no_sync (entered on micro-batches before the boundary) does nothing, as
        the engine reduces at its own boundary; unwrap_model unwraps the engine (Accelerate's would import the
        deepspeed package, when installed, to recognise DeepSpeed's engine)."""
        self.accelerator.backward = self._backward
        self.accelerator.no_sync = _no_sync
        self.accelerator.unwrap_model = self._unwrap

    def _unwrap(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
        return model.module if self.engine is not None and model is self.engine else model

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        """Builds the engine (no DDP wrapping), the Trainer's optimizer and scheduler on it, and loads the
        engine's checkpoint when resuming. Returns (engine, train_dataloader) as the Trainer's does."""
        if self.engine is not None:
            raise NotImplementedError(f"{WHERE}: train() is called once per Trainer (its engine is built then)")
        self._check_epochs(max_steps, train_dataloader)
        cfg = trainer_config(self.zeroshard_config, self.args, max_steps)
        if "optimizer" in cfg:
            if self.optimizer is not None:
                raise ValueError(f"{WHERE}: both an optimizer (optimizers=) and the config's 'optimizer' section")
            engine, _, _, sched = initialize(model=self.model, model_parameters=self._decay_groups(), config=cfg)
        else:
            engine, _, _, sched = initialize(model=self.model, optimizer=self.create_optimizer(), config=cfg)
        self.engine = self.model_wrapped = engine
        self.optimizer = _EngineOptimizer(engine)
        if sched is not None:   # the config's schedule runs inside ZeroShard's step
            if self.lr_scheduler is not None:
                raise ValueError(f"{WHERE}: both a scheduler (optimizers=) and the config's 'scheduler' section")
            self.lr_scheduler = sched
        else:
            # the Trainer's scheduler writes the engine's param_groups, which a checkpoint load restores as
            # they were (a client scheduler's, as zeroshard.initialize(lr_scheduler=) makes them)
            engine._client_scheduler = True
            self.create_scheduler(num_training_steps=max_steps, optimizer=engine.optimizer)
        if resume_from_checkpoint is not None:
            self._load_optimizer_and_scheduler(resume_from_checkpoint)
        for attr in ("model", "optimizer", "lr_scheduler"):
            setattr(self.callback_handler, attr, getattr(self, attr))
        self.callback_handler.train_dataloader = train_dataloader
        return engine, train_dataloader

    def _check_epochs(self, max_steps, train_dataloader):
        """The Trainer ends an epoch's last accumulation early (with fewer micro-batches); the engine applies
        the optimizer every gradient_accumulation_steps micro-batches, so training that crosses such an epoch
        end is refused."""
        accum = self.args.gradient_accumulation_steps
        per_epoch = len(train_dataloader) if has_length(train_dataloader) else 0
        if per_epoch % accum and max_steps > per_epoch // accum:
            raise ValueError(f"{WHERE}: an epoch has {per_epoch} micro-batches per rank, not a multiple of "
                             f"gradient_accumulation_steps={accum}, and max_steps={max_steps} crosses its end; "
                             "choose a batch size or accumulation that divides it (or dataloader_drop_last)")

    def _decay_groups(self):
        """The Trainer's parameter groups (weight decay except biases and LayerNorm weights) for the config's
        optimizer, whose values fill the rest."""
        decay = set(self.get_decay_parameter_names(self.model))
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
                {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]

    def _wrap_model(self, model, training=True, dataloader=None):
        """The engine is the wrapped model (evaluation included): no DDP."""
        return self.engine if self.engine is not None else super()._wrap_model(model, training, dataloader)

    # ------------------------------------------------------------------ the step
    def _backward(self, loss, **kwargs):
        """The Trainer's accelerator.backward: the Trainer divided the loss for accumulation itself, so the
        engine does not (scale_wrt_gas=False); its accumulation boundary must be the Trainer's."""
        if kwargs:
            raise NotImplementedError(f"{WHERE}: backward({', '.join(kwargs)}=...) is not supported (LOMO optimizers)")
        self.engine.set_gradient_accumulation_boundary(self.accelerator.sync_gradients)
        self.engine.backward(loss, scale_wrt_gas=False)

    def _clip_grad_norm(self, model):
        """Clipping is the engine's (gradient_clipping = max_grad_norm), inside its step."""
        return None

    def _get_grad_norm(self, model, grad_norm=None):
        return None   # known once the engine has stepped: _maybe_log_save_evaluate reads it

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, *args, **kwargs):
        if self.engine is not None:
            grad_norm = self.engine.get_global_grad_norm()
        return super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    # ------------------------------------------------------------------ checkpoints and the model
    def _save_optimizer_and_scheduler(self, output_dir):
        """checkpoint-N/ holds the engine's checkpoint (parameters, optimizer state, step counters,
        param_groups) and the Trainer's scheduler; the Trainer adds its state and each rank's RNG states."""
        if self.engine is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        self.engine.save_checkpoint(output_dir)
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint):
        if self.engine is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        path, _ = self.engine.load_checkpoint(checkpoint)
        if path is None:
            raise FileNotFoundError(f"{WHERE}: '{checkpoint}' holds no ZeroShard checkpoint (no 'latest')")
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """train() calls it before the engine exists; the engine's checkpoint, loaded once the engine is built,
        holds the weights (in fp32, bit for bit), so the model file is not read."""
        if self.engine is not None:
            raise NotImplementedError(f"{WHERE}: loading a checkpoint's model file into a trained engine")

    def save_model(self, output_dir=None, _internal_call=False):
        """model.safetensors and config.json from the full fp32 parameters, gathered one parameter at a time at
        every stage: what from_pretrained loads. A PEFT model saves its adapters its own way. Collective: every
        rank calls it (rank 0 writes)."""
        if self.engine is None:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        state = self.full_state_dict()
        if not isinstance(self.model, transformers.PreTrainedModel):
            return self._save(output_dir, state_dict=state)
        if not self.args.should_save:
            return None
        # written here rather than by save_pretrained, whose unwrapping imports the deepspeed package
        os.makedirs(output_dir, exist_ok=True)
        safetensors.torch.save_file(state, os.path.join(output_dir, SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
        self.model.config.save_pretrained(output_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        return None

    def full_state_dict(self):
        """The model's parameters (each once, under its first name) at their full fp32 values and its
        persistent buffers, names as the model's own. Collective."""
        state = {name: safe_get_full_fp32_param(p) for name, p in self.model.named_parameters()}
        for name, b in self.model.named_buffers():   # the persistent ones (the model's state_dict() is refused
            owner, _, leaf = name.rpartition(".")     # at stage 3: its parameters are partitioned)
            if leaf not in self.model.get_submodule(owner)._non_persistent_buffers_set:
                state[name] = b.detach().clone()
        return state
