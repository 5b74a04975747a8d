"""finetune.py - fine-tuning a Hugging Face GPT-2 with a frozen base the way DeepSpeed scripts do it: the
Trainer's weight-decay groups in a client torch.optim.AdamW, a linear warmup schedule from transformers, a
checkpoint under a fixed tag, and resuming from it.

    mpirun -np 2 python3 examples/pytorch/finetune.py --steps 40 --save-dir ckpt
    mpirun -np 2 python3 examples/pytorch/finetune.py --steps 60 --save-dir ckpt --resume   # on to 60

The model is built from a GPT2Config (byte-level, no hub download); --init FILE loads base weights from a
safetensors file first. The base is frozen (requires_grad=False: the embeddings, whose transpose is also the
tied output head, and all blocks but the last --train-blocks), or with --lora it stays whole and frozen while
peft's LoRA adapters train. ZeroShard partitions and gathers frozen tensors like the others at stage 3, but
gives them no gradient buffers and no optimizer state. `ZS_BACKEND=deepspeed` runs the same loop on
DeepSpeed (`deepspeed --num_gpus 2 --no_local_rank examples/pytorch/finetune.py ...`).
"""
import argparse
import json
import os
import warnings

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, get_linear_schedule_with_warmup

if os.environ.get("ZS_BACKEND") == "deepspeed":
    import deepspeed
else:
    import zeroshard as deepspeed

HERE = os.path.dirname(os.path.abspath(__file__))
TAG = "last"   # one fixed tag, as Lightning and Accelerate keep theirs: each save replaces the previous


def build_model(a):
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(GPT2Config(n_layer=a.layers, n_embd=a.dim, n_head=a.heads, vocab_size=256,
                                       n_positions=a.ctx, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    if a.init:
        from safetensors.torch import load_file
        model.load_state_dict(load_file(a.init), strict=False)
    if a.lora:
        from peft import LoraConfig, get_peft_model
        # peft still asks transformers for the name it deprecated; the warning is theirs, once per rank
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["c_attn"],
                                                fan_in_fan_out=True))
    model.transformer.wte.requires_grad_(False)
    model.transformer.wpe.requires_grad_(False)
    for block in model.transformer.h[:a.layers - a.train_blocks]:
        block.requires_grad_(False)
    return model


def param_groups(model, weight_decay):
    """The Hugging Face Trainer's rule: no decay for biases and LayerNorm weights; frozen tensors left out"""
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]


def batch(data, step, n, ctx):
    """n windows of ctx + 1 bytes, drawn by a generator seeded with the step: a resumed run sees the batches
    the uninterrupted one would have"""
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, len(data) - ctx - 1, (n,), generator=g)
    return torch.stack([data[s:s + ctx] for s in starts])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="train until this global step")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "tests", "data", "parity.txt"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--train-blocks", type=int, default=1, help="the last N blocks train; the rest is frozen")
    ap.add_argument("--lora", action="store_true", help="freeze the whole model and train LoRA adapters")
    ap.add_argument("--init", help="base weights (safetensors, Hugging Face GPT-2 names)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--offload", action="store_true", help="offload_optimizer to the CPU")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--total-steps", type=int, default=100, help="the schedule's length (decays to 0 there)")
    ap.add_argument("--save-dir")
    ap.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only at the end)")
    ap.add_argument("--resume", action="store_true", help="load --save-dir's checkpoint first")
    ap.add_argument("--metrics", help="rank 0 appends one JSON line per step")
    a = ap.parse_args()
    transformers.logging.set_verbosity_error()   # a config without the hub's token ids warns per rank

    model = build_model(a)
    n_all = sum(p.numel() for p in model.parameters())   # before initialize: at stage 3 they become shards
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    zero = {"stage": a.stage}
    if a.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    # no "optimizer" or "scheduler" section: the client's below are used, as the Trainer passes them
    config = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": a.accum,
              "gradient_clipping": 1.0, "steps_per_print": 0, "zero_optimization": zero}
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    scheduler = get_linear_schedule_with_warmup(optimizer, a.warmup, a.total_steps)
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                           lr_scheduler=scheduler, config=config)
    rank, world = engine.global_rank, engine.world_size
    if rank == 0:
        print(f"finetune: {n_all} parameters, {n_train} trainable ({100 * n_train / n_all:.1f}%), stage {a.stage}, "
              f"{world} ranks")
    if a.resume:
        path, client = engine.load_checkpoint(a.save_dir, tag=TAG)
        if path is None:
            raise SystemExit(f"finetune: no checkpoint '{TAG}' in {a.save_dir}")
        if rank == 0:
            print(f"finetune: resumed from {path} at step {engine.global_steps} (saved after step "
                  f"{client.get('step')}, lr {scheduler.get_last_lr()[0]:.2e})")

    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    micro = a.micro_batch
    engine.train()
    while engine.global_steps < a.steps:
        step = engine.global_steps
        x = batch(data, step, micro * world * a.accum, a.ctx)
        losses = []
        for m in range(a.accum):
            mine = x[(m * world + rank) * micro:(m * world + rank + 1) * micro]
            loss = engine(input_ids=mine, labels=mine).loss
            engine.backward(loss)
            engine.step()   # steps the optimizer and the scheduler at the accumulation boundary
            losses.append(loss.item())
        if rank == 0:
            row = {"step": step + 1, "loss": sum(losses) / len(losses), "lr": scheduler.get_last_lr()[0]}
            if (step + 1) % 10 == 0 or step + 1 == a.steps:
                print(f"finetune: step {row['step']} loss {row['loss']:.4f} lr {row['lr']:.2e}", flush=True)
            if a.metrics:
                with open(a.metrics, "a") as f:
                    f.write(json.dumps(row) + "\n")
        if a.save_dir and ((a.save_every and (step + 1) % a.save_every == 0) or step + 1 == a.steps):
            engine.save_checkpoint(a.save_dir, tag=TAG, client_state={"step": step + 1})


if __name__ == "__main__":
    main()
