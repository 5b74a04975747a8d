"""train_gpt.py - a DeepSpeed-style training script: zs-train-gpt's byte-level GPT written in PyTorch.

    mpirun -np 2 python3 examples/pytorch/train_gpt.py --config examples/configs/gpt_zero3.json --steps 50

The training loop is DeepSpeed's (deepspeed.initialize, engine(x), engine.backward(loss), engine.step(),
engine.save_checkpoint). The one line that picks the backend is the import below: `import zeroshard as
deepspeed` (the default) or `import deepspeed` (ZS_BACKEND=deepspeed; DeepSpeed on a CPU-only machine uses
its CPU accelerator and the gloo backend, e.g. `deepspeed --num_gpus 2 train_gpt.py ...`). Nothing else
changes, the config file included.

The model is examples/gpt's: token and position embeddings, pre-LayerNorm blocks (causal multi-head
attention, tanh-GELU MLP of 4x width), a final LayerNorm, the output head tied to the token embedding; the
parameters carry Hugging Face GPT-2's names and Conv1D layout (weights [in, out]).
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

if os.environ.get("ZS_BACKEND") == "deepspeed":
    import deepspeed
else:
    import zeroshard as deepspeed


class Conv1D(nn.Module):
    """GPT-2's linear layer: y = x @ W + b with W [in, out]"""

    def __init__(self, n_in, n_out, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * std)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, dim, heads, proj_std):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(dim, 3 * dim, 0.02)
        self.c_proj = Conv1D(dim, dim, proj_std)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hs).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim, proj_std):
        super().__init__()
        self.c_fc = Conv1D(dim, 4 * dim, 0.02)
        self.c_proj = Conv1D(4 * dim, dim, proj_std)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads, layers):
        super().__init__()
        proj_std = 0.02 / math.sqrt(2 * layers)   # GPT-2's residual projections
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = Attention(dim, heads, proj_std)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim, proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, ctx, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.h = nn.ModuleList(Block(dim, heads, layers) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight   # tied, as GPT-2 (and the C example) ties them

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def default_data():
    for p in ("/usr/share/games/fortunes/fortunes", os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                                  "data", "parity.txt")):
        if os.path.exists(p):
            return p
    sys.exit("train_gpt: no --data given and no default text found")


def batches(data, ctx, step, rank, micro, world, accum, seed):
    """This rank's micro-batches of global step `step`: the global batch is the same at any world size
    (sequence g of a step starts at a position drawn from (seed, step, g)); rank r's micro-step m takes
    sequences (m * world + r) * micro ..."""
    g = torch.Generator().manual_seed(seed * 1000003 + step)
    starts = torch.randint(0, len(data) - ctx - 1, (micro * world * accum,), generator=g)
    for m in range(accum):
        first = (m * world + rank) * micro
        rows = torch.stack([data[s:s + ctx + 1] for s in starts[first:first + micro].tolist()])
        yield rows[:, :-1].long(), rows[:, 1:].long()


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="DeepSpeed JSON config")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=None, help="a text file (default: Debian's fortunes)")
    ap.add_argument("--save-dir", default=None)
    ap.add_argument("--load", default=None, help="resume from this checkpoint directory")
    ap.add_argument("--metrics", default=None, help="one JSON line per step (rank 0)")
    ap.add_argument("--local_rank", type=int, default=-1)   # the deepspeed launcher passes it
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.dim, args.heads, args.ctx)
    with open(args.config) as f:
        config = json.load(f)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank, world = engine.global_rank, engine.world_size
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    with open(args.data or default_data(), "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    start = 0
    if args.load:
        _, client = engine.load_checkpoint(args.load)
        start = (client or {}).get("step", 0)
    dtype = next(engine.module.parameters()).dtype   # bf16/fp16 configs give the module 16-bit parameters
    metrics = open(args.metrics, "a") if args.metrics and rank == 0 else None
    engine.train()
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        total = torch.zeros(())
        for x, y in batches(data, args.ctx, step, rank, micro, world, accum, args.seed):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float() / accum
        dt = time.perf_counter() - t0
        if rank == 0:
            line = {"step": step + 1, "loss": total.item(), "lr": engine.get_lr()[0], "time": dt,
                    "tokens_per_s": micro * accum * world * args.ctx / dt, "rss_mib": rss_mib(),
                    "dtype": str(dtype).replace("torch.", "")}
            print(" ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in line.items()),
                  flush=True)
            if metrics:
                metrics.write(json.dumps(line) + "\n")
                metrics.flush()
    if args.save_dir:
        engine.save_checkpoint(args.save_dir, client_state={"step": args.steps})
    print(f"rank {rank} peak_rss_mib {rss_mib():.1f}", flush=True)


if __name__ == "__main__":
    main()
