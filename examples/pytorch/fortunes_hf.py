"""fortunes_hf.py - the fortunes walk-through with the Hugging Face Trainer: DistilBERT learns which fortunes
file a fortune comes from, under the plain Trainer (DDP over gloo) or under the Trainer's own DeepSpeed
integration, which zeroshard-run points at ZeroShard.

    mpirun -np 2 python3 examples/pytorch/fortunes_hf.py --strategy trainer
    zeroshard-run -np 2 examples/pytorch/fortunes_hf.py --strategy zeroshard_stage_2

The Trainer is `transformers.Trainer` in both. A zeroshard_* strategy only adds the ZeRO config, as any
DeepSpeed user does: TrainingArguments(deepspeed=config) (see `zero_config`); the launch line is the switch.
Everything else (the weight-decay groups, AdamW, the linear warm-up, accumulation, clipping, evaluation,
checkpoints) is the Trainer's own, and the same script runs on DeepSpeed under `deepspeed`. The last line
printed is `RESULT {json}` (fortunes.result).
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fortunes  # noqa: E402

STRATEGIES = ["trainer", "zeroshard_stage_0", "zeroshard_stage_1", "zeroshard_stage_2", "zeroshard_stage_3",
              "zeroshard_stage_2_offload", "zeroshard_stage_3_offload"]


def zero_config(strategy):
    """zeroshard_stage_<n>[_offload]: ZeRO stage n (optimizer, and at stage 3 parameters, offloaded to the
    CPU's own memory pool); everything else "auto", filled by the Trainer from TrainingArguments. The
    Trainer's own optimizer (a torch AdamW) steps on the CPU, offloaded or not."""
    stage = int(strategy.split("_")[2])
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True   # save_model writes model.safetensors
    if strategy.endswith("_offload"):
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    return {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
            "zero_force_ds_cpu_optimizer": False}


def training_args(a, out):
    """The plain Trainer runs on the CPU with use_cpu=True; a DeepSpeed config must go without it (use_cpu
    turns Accelerate's DeepSpeed path off): on a machine without a GPU the device is the CPU anyway."""
    from transformers import TrainingArguments
    zeroshard = a.strategy != "trainer"
    ds = {"deepspeed": a.deepspeed or zero_config(a.strategy)} if zeroshard else {"use_cpu": True}
    return TrainingArguments(
        **ds, output_dir=out, seed=a.seed, data_seed=a.seed, max_steps=a.steps,
        per_device_train_batch_size=a.micro_batch, per_device_eval_batch_size=64,
        gradient_accumulation_steps=a.accum, learning_rate=a.lr, weight_decay=a.weight_decay,
        warmup_steps=a.warmup, lr_scheduler_type="linear", max_grad_norm=a.clip,
        bf16=a.precision.startswith("bf16"), logging_steps=1, report_to=[], disable_tqdm=True,
        eval_strategy="no" if a.no_eval else "steps", eval_steps=a.steps,
        save_strategy="steps" if a.save_dir and a.save_at else "no", save_steps=a.save_at or a.steps)


def accuracy(pred):
    import numpy as np
    return {"accuracy": float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())}


def full_params(trainer, zeroshard):
    """(name, full fp32 tensor) in model.named_parameters() order: the engine's fp32 masters under DeepSpeed
    (gathered from the shards, on every rank)."""
    if zeroshard:
        from deepspeed.utils import safe_get_full_fp32_param
        return [(n, safe_get_full_fp32_param(p)) for n, p in trainer.model.named_parameters()]
    return [(n, p.detach().float()) for n, p in trainer.model.named_parameters()]


def main(argv=None):
    """Trains, evaluates and prints the RESULT line; returns (trainer, the result row or None off rank 0)."""
    p = fortunes.parser(__doc__, steps=200)
    p.add_argument("--strategy", choices=STRATEGIES, default="trainer")
    p.add_argument("--deepspeed", help="a DeepSpeed JSON to use instead of a zeroshard_* strategy's config")
    a = p.parse_args(argv)
    zeroshard = a.strategy != "trainer"
    if not zeroshard:
        fortunes.mpi_to_torch_env()   # the plain Trainer's DDP reads torch.distributed's variables
    from transformers import Trainer
    out = a.save_dir or tempfile.mkdtemp(prefix="fortunes_hf.")
    args = training_args(a, out)   # before the model: at stage 3 the Trainer's zero.Init then partitions it
    train, test, vocab = fortunes.datasets(a)
    model = fortunes.build_model(a, len(vocab))
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=test, compute_metrics=accuracy)
    resume = None
    if a.resume:
        resume = os.path.join(out, f"checkpoint-{a.save_at}") if a.save_at else True
    t0 = time.time()
    trainer.train(resume_from_checkpoint=resume)
    train_s = time.time() - t0
    if a.save_dir:
        trainer.save_model()   # the trained model, loadable with from_pretrained, into --save-dir
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_initialized() else 1
    rss = [None] * world
    if world > 1:
        dist.all_gather_object(rss, fortunes.peak_rss_mib())
    else:
        rss = [fortunes.peak_rss_mib()]
    phash = fortunes.params_hash(full_params(trainer, zeroshard))
    if not trainer.is_world_process_zero():
        return trainer, None
    logs = trainer.state.log_history
    losses = [r["loss"] for r in logs if "loss" in r]
    for r in logs:
        if "loss" in r:
            fortunes.log_step(a, r["step"], r["loss"])
    acc = next((r["eval_accuracy"] for r in reversed(logs) if "eval_accuracy" in r), None)
    return trainer, fortunes.result(a, "fortunes_hf.py", a.strategy, world, train_s, acc, rss, phash, losses)


if __name__ == "__main__":
    main()
