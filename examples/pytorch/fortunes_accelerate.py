"""fortunes_accelerate.py - the fortunes walk-through (fortunes.py) in Accelerate's idiom, on Accelerate's own
Accelerator: plain (DDP over gloo) or with a DeepSpeed plugin, Accelerate's own DeepSpeed path, which
zeroshard-run points at ZeroShard.

    mpirun -np 2 python3 examples/pytorch/fortunes_accelerate.py --strategy accelerate          # DDP over gloo
    zeroshard-run -np 2 examples/pytorch/fortunes_accelerate.py --strategy zeroshard_stage_3   # ZeRO stage 3

Strategies: accelerate, zeroshard_stage_0..3, zeroshard_stage_2_offload, zeroshard_stage_3_offload. A zeroshard_*
strategy passes Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config)) (see `zero_config`); launched
with `zeroshard-run -np 2 --use_deepspeed --deepspeed_config_file ds.json`, the Accelerator takes that file's
config from the environment instead, as under `accelerate launch`. The loop is Accelerate's: prepare,
accumulate, backward, clip_grad_norm_ at the sync steps, gather_for_metrics, and save_state / load_state for
--save-dir / --save-at / --resume. Global batch = micro-batch x ranks x accum.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fortunes  # noqa: E402

STRATEGIES = ["accelerate"] + [f"zeroshard_stage_{i}" for i in range(4)] + \
    ["zeroshard_stage_2_offload", "zeroshard_stage_3_offload"]
MIXED = {"32-true": "no", "32": "no", "bf16-mixed": "bf16", "bf16-true": "bf16", "16-mixed": "fp16"}


def zero_config(a):
    """The ZeRO config a zeroshard_* strategy names (what a DeepSpeed JSON beside the script would hold)."""
    stage = int(a.strategy.split("_")[2])
    zero = {"stage": stage}
    if a.strategy.endswith("_offload"):
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    cfg = {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
           "gradient_accumulation_steps": "auto", "zero_force_ds_cpu_optimizer": False}
    # the engine clips inside its step (clip_grad_norm_ only reads the norm); 0 is no clipping, said outright
    # since DeepSpeed clips at 1.0 when the key is absent
    cfg["gradient_clipping"] = a.clip
    return cfg


class Progress:
    """The optimizer steps taken and their losses: registered for checkpointing, so a resumed run knows both."""

    def __init__(self):
        self.step, self.losses = 0, []

    def state_dict(self):
        return {"step": self.step, "losses": list(self.losses)}

    def load_state_dict(self, sd):
        self.step, self.losses = sd["step"], list(sd["losses"])


def make_accelerator(a):
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import GradientAccumulationPlugin
    if a.strategy == "accelerate":
        fortunes.mpi_to_torch_env()   # Accelerate reads the ranks from Open MPI; gloo needs MASTER_ADDR/PORT
        kw = {"cpu": True}
    elif os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        kw = {}   # --use_deepspeed --deepspeed_config_file: Accelerator() builds the plugin from the environment
    else:   # no cpu=True: it turns Accelerate's DeepSpeed path off (without a GPU the device is the CPU anyway)
        kw = {"deepspeed_plugin": DeepSpeedPlugin(hf_ds_config=zero_config(a))}
    # sync every --accum micro-batches across epoch ends too, so both give the same global batches
    plugin = GradientAccumulationPlugin(num_steps=a.accum, sync_with_dataloader=False)
    return Accelerator(mixed_precision=MIXED[a.precision], gradient_accumulation_plugin=plugin, **kw)


def train(a, accelerator, model, optimizer, scheduler, loader, progress):
    """--steps optimizer steps from progress.step; each step's loss averaged over ranks and micro-batches."""
    used = progress.step * a.accum % len(loader)   # micro-batches of the current pass already trained on
    batches = accelerator.skip_first_batches(loader, used) if used else loader
    total = torch.zeros(())
    while progress.step < a.steps:
        for batch in batches:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                total += loss.detach().float()
                if accelerator.sync_gradients and a.clip:
                    accelerator.clip_grad_norm_(model.parameters(), a.clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if not accelerator.sync_gradients:
                continue
            progress.step += 1
            progress.losses.append(accelerator.reduce(total / a.accum, "mean").item())
            total.zero_()
            if accelerator.is_main_process:
                fortunes.log_step(a, progress.step, progress.losses[-1])
            if a.save_dir and progress.step == (a.save_at or a.steps):
                accelerator.save_state(a.save_dir)
            if progress.step == a.steps:
                break
        batches = loader


def accuracy(accelerator, model, loader):
    """Test accuracy over the whole held-out split: every rank's share gathered, the padding dropped."""
    model.eval()
    right = seen = 0
    with torch.no_grad():
        for batch in loader:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            pred, label = accelerator.gather_for_metrics((logits.argmax(-1), batch["labels"]))
            right += int((pred == label).sum())
            seen += label.numel()
    return right / seen


def full_params(accelerator, model):
    """(name, full fp32 tensor) in named_parameters() order: the engine's fp32 masters under DeepSpeed
    (gathered from the shards, on every rank)."""
    from accelerate.utils import DistributedType
    named = list(accelerator.unwrap_model(model).named_parameters())
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        from deepspeed.utils import safe_get_full_fp32_param
        return [(n, safe_get_full_fp32_param(p)) for n, p in named]
    return [(n, p.detach().float()) for n, p in named]


def parse(argv=None):
    p = fortunes.parser(__doc__)
    p.add_argument("--strategy", default="zeroshard_stage_2", choices=STRATEGIES)
    return p.parse_args(argv)


def run(a):
    """One training run and its evaluation; returns the RESULT row (on every rank). The Accelerator lets go of
    what it prepared at the end, so a test can run several strategies in one process."""
    from accelerate.utils import set_seed
    from transformers import get_linear_schedule_with_warmup
    accelerator = make_accelerator(a)
    set_seed(a.seed)
    train_set, test_set, vocab = fortunes.datasets(a)
    model = fortunes.build_model(a, len(vocab))
    optimizer = torch.optim.AdamW(fortunes.decay_groups(model, a.weight_decay), lr=a.lr)
    # Accelerate steps a scheduler once per process at each optimizer step (a torch LambdaLR under DeepSpeed
    # too, which the engine does not take): the schedule is sized for that
    world = accelerator.num_processes
    scheduler = get_linear_schedule_with_warmup(optimizer, a.warmup * world, a.steps * world)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=a.micro_batch, shuffle=True,
                                               generator=torch.Generator().manual_seed(a.seed))
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=a.micro_batch)
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, test_loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if a.resume:
        accelerator.load_state(a.save_dir)
    t0 = time.time()
    train(a, accelerator, model, optimizer, scheduler, train_loader, progress)
    train_s = time.time() - t0
    acc = None if a.no_eval else accuracy(accelerator, model, test_loader)
    phash = fortunes.params_hash(full_params(accelerator, model))
    rss = accelerator.gather(torch.tensor([fortunes.peak_rss_mib()])).tolist()
    row = {"strategy": a.strategy, "test_acc": acc, "params_hash": phash, "losses": progress.losses}
    if accelerator.is_main_process:
        row = fortunes.result(a, "fortunes_accelerate.py", a.strategy, world, train_s, acc, rss, phash,
                              progress.losses)
    accelerator.free_memory()
    if a.strategy == "accelerate":   # DDP's gloo group ends here, as Accelerate's examples end theirs
        accelerator.wait_for_everyone()
        accelerator.end_training()
    return row


if __name__ == "__main__":
    run(parse())
