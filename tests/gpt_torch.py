"""gpt_torch.py - zs-train-gpt's transformer, batches, AdamW and schedule written in PyTorch: the twin the
parity test (gpt_parity.sh) trains beside the C program, and the PyTorch side of bench/gpt_bench.sh.

Every rule here restates a C file: the model examples/gpt/layers_tmpl.h and passes_tmpl.h (pre-LayerNorm
eps 1e-5, tanh GELU, attention scores times 1/sqrt(head size), head tied to wte, Conv1D layout y = x @ W + b),
the batches examples/gpt/data.c's header comment, the learning rate runtime/schedule.c (called by
runtime/step.c with the optimizer step + 1), clipping runtime/step.c (coef = clip / (norm + 1e-6) when < 1).

  python3 gpt_torch.py parity --config C.json --data FILE --world W --steps S --layers L --dim D --heads H
      --ctx T --seed N --init INIT.safetensors --final FINAL.safetensors --metrics METRICS.jsonl
      [--loss-rtol 1e-4] [--param-atol 5e-5] [--kbias-atol 1e-3]
exits 0 when the losses and final parameters agree, 1 when they do not, 77 when torch cannot be imported.

The tolerances. Both sides compute in fp32 and sum in different orders (BLAS blocking, the ranks'
reduction), so gradients differ by rounding (~1e-7 relative); Adam divides by sqrt(v), which in its first
steps magnifies the relative error of small gradients. Measured on the test's model (20 steps, lr 0.01,
parameters moving up to 0.14): losses within 3e-7 relative, parameters within 5e-6: the limits, 1e-4 and
5e-5, leave 10x or more. The key third of each c_attn.bias is compared apart: softmax ignores a constant
added to a query's scores, so its true gradient is exactly zero and both sides move it by rounding noise
that Adam scales up to a fraction of lr per step (measured 2e-5; limit 1e-3, 20 steps x lr 0.01 x 1/2).
"""
import argparse
import json
import math
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the caller decides; parity prints the skip
    torch = None
    TORCH_ERROR = str(e)

MASK = (1 << 64) - 1


# ---------------------------------------------------------------- data (examples/gpt/data.c)

def mix(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class Corpus:
    """One text file's bytes, split as data.c splits them (a directory is not needed by the tests)."""

    def __init__(self, path, ctx):
        with open(path, "rb") as f:
            self.bytes = f.read()
        self.len = len(self.bytes)
        self.train_len = self.len - self.len // 10
        self.ctx = ctx

    def starts(self, seed, step, first, count):
        span = self.train_len - self.ctx - 1
        return [mix((mix((mix(seed) + step) & MASK) + first + i) & MASK) % span for i in range(count)]

    def batch(self, seed, step, first, count):
        """inputs and targets [count, ctx] of global sequences first .. first + count - 1 of a step"""
        T = self.ctx
        rows = [self.bytes[o:o + T + 1] for o in self.starts(seed, step, first, count)]
        t = torch.tensor([list(r) for r in rows], dtype=torch.long)
        return t[:, :T].contiguous(), t[:, 1:].contiguous()


# ---------------------------------------------------------------- the model (examples/gpt/*.c)

BLOCK_TENSORS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias")
Module = torch.nn.Module if torch else object


class Block(Module):
    """one pre-LayerNorm block; a module of its own, so FSDP can wrap it as ZeroShard makes it a unit"""

    def __init__(self, dim, heads):
        super().__init__()
        C = dim
        shapes = (C,), (C,), (C, 3 * C), (3 * C,), (C, C), (C,), (C,), (C,), (C, 4 * C), (4 * C,), (4 * C, C), (C,)
        self.heads = heads
        self.p = torch.nn.ParameterDict(
            {n.replace(".", "_"): torch.nn.Parameter(torch.zeros(sh)) for n, sh in zip(BLOCK_TENSORS, shapes)})

    def w(self, name):
        return self.p[name.replace(".", "_")]

    def forward(self, x):
        w = self.w
        B, T, C = x.shape
        H, hs = self.heads, C // self.heads
        h = F.layer_norm(x, (C,), w("ln_1.weight"), w("ln_1.bias"), eps=1e-5)
        qkv = h @ w("attn.c_attn.weight") + w("attn.c_attn.bias")
        q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w("attn.c_proj.weight") + w("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), w("ln_2.weight"), w("ln_2.bias"), eps=1e-5)
        h = F.gelu(h @ w("mlp.c_fc.weight") + w("mlp.c_fc.bias"), approximate="tanh")
        return x + h @ w("mlp.c_proj.weight") + w("mlp.c_proj.bias")


class GPT(Module):
    """parameters known by their C (Hugging Face GPT-2) names, listed in C's registration order"""

    def __init__(self, layers, dim, heads, ctx, vocab=256):
        super().__init__()
        self.layers, self.dim, self.heads, self.ctx = layers, dim, heads, ctx
        self.wte = torch.nn.Parameter(torch.zeros(vocab, dim))
        self.wpe = torch.nn.Parameter(torch.zeros(ctx, dim))
        self.h = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f_weight = torch.nn.Parameter(torch.ones(dim))
        self.ln_f_bias = torch.nn.Parameter(torch.zeros(dim))
        self.names = ["wte.weight", "wpe.weight"] + [f"h.{l}.{n}" for l in range(layers) for n in BLOCK_TENSORS] + \
            ["ln_f.weight", "ln_f.bias"]

    def w(self, name):
        if name.startswith("h."):
            _, l, rest = name.split(".", 2)
            return self.h[int(l)].w(rest)
        return getattr(self, {"wte.weight": "wte", "wpe.weight": "wpe"}.get(name, name.replace(".", "_")))

    def ordered(self):
        return [self.w(n) for n in self.names]

    def load(self, tensors):
        with torch.no_grad():
            for n in self.names:
                self.w(n).copy_(tensors[n])

    def init_normal(self, seed):
        """GPT-2's initial values in distribution (the benchmark's; parity loads the C model's own)"""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n in self.names:
                p = self.w(n)
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * self.layers) if n.endswith("c_proj.weight") else 0.02
                    p.copy_(torch.randn(p.shape, generator=g) * std)
                else:
                    p.fill_(1.0 if n.endswith("ln_1.weight") or n.endswith("ln_2.weight") or n == "ln_f.weight" else 0.0)

    def forward(self, inputs, targets):
        """the mean cross-entropy over every target of the batch"""
        T = inputs.shape[1]
        x = self.wte[inputs] + self.wpe[:T]
        for blk in self.h:
            x = blk(x)
        x = F.layer_norm(x, (self.dim,), self.ln_f_weight, self.ln_f_bias, eps=1e-5)
        logits = x @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# ---------------------------------------------------------------- optimizer and schedule (runtime/)

def lr_at(sched, base_lr, step):
    """runtime/schedule.c's learning rate for 0-based optimizer step `step` (it = step - 1)"""
    it = step - 1
    kind = sched.get("type") if sched else None
    p = sched.get("params", {}) if sched else {}
    warm = max(2, int(p.get("warmup_num_steps", 1000)))
    gamma = lambda i: i / warm if p.get("warmup_type", "log") == "linear" else math.log(i + 1) / math.log(warm)
    if kind in ("WarmupLR", "WarmupDecayLR"):
        lo, hi = float(p.get("warmup_min_lr", 0.0)), float(p.get("warmup_max_lr", 0.001))
        if it < 0:
            return lo
        if it < warm:
            g = gamma(it)
        elif kind == "WarmupDecayLR":
            total = int(p["total_num_steps"])
            g = max(0.0, (total - it) / max(1.0, float(total - warm)))
        else:
            g = 1.0
        return lo + (hi - lo) * g
    if kind == "WarmupCosineLR":
        if it < 0:
            return 0.0
        lo_ratio = float(p.get("warmup_min_ratio", 0.0))
        if it < warm:
            return base_lr * (lo_ratio + gamma(it) * (1.0 - lo_ratio))
        total = max(1.0, float(int(p["total_num_steps"]) - warm))
        r = (1.0 + math.cos(math.pi * (it - warm + 1) / total)) / 2.0
        cos_min = float(p.get("cos_min_ratio", 0.0001))
        return base_lr * max(0.0, cos_min + (1.0 - cos_min) * r)
    return base_lr


def make_optimizer(model, cfg):
    """AdamW with lr 1 and a LambdaLR whose factor is the absolute learning rate, so that the decay
    (lr x weight_decay) uses the scheduled lr as the C kernel does"""
    op = cfg["optimizer"]["params"]
    betas = tuple(op.get("betas", (0.9, 0.999)))
    opt = torch.optim.AdamW(model.ordered(), lr=1.0, betas=betas, eps=float(op.get("eps", 1e-8)),
                            weight_decay=float(op.get("weight_decay", 0.01)), foreach=False)
    base = float(op["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_at(cfg.get("scheduler"), base, k))
    return opt, sched


def train_step(model, opt, sched, corpus, cfg, seed, step, global_batch, clip):
    """one optimizer step over the whole global batch (what every rank and micro-step of C sees together)"""
    opt.zero_grad(set_to_none=True)
    inputs, targets = corpus.batch(seed, step, 0, global_batch)
    loss = model(inputs, targets)
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.ordered(), clip)
    opt.step()
    sched.step()
    return loss.item()


# ---------------------------------------------------------------- safetensors (fp32 only)

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {t['dtype']}, only F32 is read")
        a, b = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(t["shape"])
    return out


# ---------------------------------------------------------------- the parity check

def parity(a):
    with open(a.config) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    micro, gas = int(cfg["train_micro_batch_size_per_gpu"]), int(cfg.get("gradient_accumulation_steps", 1))
    global_batch = micro * gas * a.world
    corpus = Corpus(a.data, a.ctx)
    model = GPT(a.layers, a.dim, a.heads, a.ctx)
    model.load(read_safetensors(a.init))
    opt, sched = make_optimizer(model, cfg)
    c_loss = {}
    with open(a.metrics) as f:
        for line in f:
            m = json.loads(line)
            c_loss[m["step"]] = m["loss"]
    worst_loss = 0.0
    for s in range(a.steps):
        lr = sched.get_last_lr()[0]
        lt = train_step(model, opt, sched, corpus, cfg, a.seed, s, global_batch, float(cfg.get("gradient_clipping", 0)))
        lc = c_loss.get(s + 1)
        if lc is None:
            print(f"parity: the C metrics have no step {s + 1}")
            return 1
        rel = abs(lc - lt) / abs(lt)
        worst_loss = max(worst_loss, rel)
        print(f"step {s + 1:3d} loss C {lc:.6f} torch {lt:.6f} rel diff {rel:.2e} lr {lr:.3g}")
    final, init = read_safetensors(a.final), read_safetensors(a.init)
    worst, where, kbias, moved = 0.0, "", 0.0, 0.0
    for n in model.names:
        d = (final[n] - model.w(n).detach()).abs()
        moved = max(moved, (final[n] - init[n]).abs().max().item())
        if n.endswith("attn.c_attn.bias"):  # its key third apart: see the module's docstring
            kbias = max(kbias, d[a.dim:2 * a.dim].max().item())
            d = torch.cat([d[:a.dim], d[2 * a.dim:]])
        if d.max().item() > worst:
            worst, where = d.max().item(), n
    ok = worst_loss <= a.loss_rtol and worst <= a.param_atol and kbias <= a.kbias_atol
    print(f"parity: {a.steps} steps, loss max rel diff {worst_loss:.3e} (limit {a.loss_rtol:g}); final parameters "
          f"max abs diff {worst:.3e} at {where} (limit {a.param_atol:g}), key biases {kbias:.3e} (limit "
          f"{a.kbias_atol:g}); largest move from the initial weights {moved:.3e}: {'agree' if ok else 'DIFFER'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["parity"])
    for flag in ("--config", "--data", "--init", "--final", "--metrics"):
        ap.add_argument(flag, required=True)
    for flag in ("--world", "--steps", "--layers", "--dim", "--heads", "--ctx", "--seed"):
        ap.add_argument(flag, type=int, required=True)
    ap.add_argument("--loss-rtol", type=float, default=1e-4)
    ap.add_argument("--param-atol", type=float, default=5e-5)
    ap.add_argument("--kbias-atol", type=float, default=1e-3)
    a = ap.parse_args()
    if torch is None:
        print(f"parity: skipped: torch cannot be imported ({TORCH_ERROR})")
        return 77
    return parity(a)


if __name__ == "__main__":
    sys.exit(main())
