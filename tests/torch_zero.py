"""torch_zero.py - zeroshard.zero (Init, GatheredParameters with modifier_rank) and zeroshard.utils'
safe_get_full_* / safe_set_full_* against plain PyTorch; torch_zero.sh runs it under mpirun. Modes (every
rank runs the same mode; rank 0 prints the verdict; exit 1 on a mismatch, 77 to skip):

  memory   4 ranks, stage 3: a 252 MB (fp32) GPT-2 (a 201 MB MLP without transformers, saying so) built
           under zero.Init with a device budget below the model (zeroshard.device_memory), trained 2 steps. The peak RSS of the build and of build + set-up
           per rank are printed against the model's size; the build must stay under a quarter of it, build +
           set-up under the library's own bytes (zs_memory) + the largest unit + half the model
           (without Init the module alone would add the whole model); the spill file is closed after set-up.
  parity   2 ranks: a model built under zero.Init holds no values (zero-stride stand-ins with the right
           shapes) and gives, gathered and after set-up at stages 0 and 3, the bits of the same model built
           without Init; a write to part of a spilled parameter and a cast before initialize are refused; trained 10 steps it matches single-process torch.optim.AdamW within PARAM_ATOL. With
           transformers: a GPT-2 (GPT2Config, tied head, post_init's weight init) likewise, bit for bit.
  gather   2 ranks, stages 1 and 3: GatheredParameters(modifier_rank=0) changing embedding rows (the other
           rank writing something else) is seen on every rank and by the next steps, which match torch doing
           the same edit; a state_dict() taken inside a stage-3 gather keeps its values after it; an
           embedding resized under zero.Init before initialize (rows copied inside GatheredParameters) gives
           every rank the new rows; with bf16, the edit reaches the fp32 masters and an unchanged parameter
           gathered with it keeps its master's bits.
  utils    2 ranks, stages 0, 2 and 3: after 5 steps safe_get_full_fp32_param / _optimizer_state("exp_avg",
           "exp_avg_sq") match torch.optim.AdamW's, safe_get_full_grad between backward and step matches
           torch's gradient; safe_set_full_fp32_param changes the next forward as in torch.

Tolerances: as tests/torch_api.py (fp32 both sides, different summation orders): PARAM_ATOL 2e-5 for
parameters and Adam's m; Adam's v (squares of gradients of ~1e-2) within 1e-7; gradients within 1e-6.
GPT-2: GPT2_ATOL 2e-4 after 3 steps (measured 4e-5: Adam's first steps divide by the root of v, so a
gradient near zero turns a ~1e-7 relative difference into a visible part of an lr-sized step).
"""
import os
import sys

try:
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"torch_zero: skipped: torch cannot be imported ({e})")
    sys.exit(77)

import zeroshard
from zeroshard import utils, zero
from zeroshard.zero import GatheredParameters

PARAM_ATOL = 2e-5
GPT2_ATOL = 2e-4
LR = 0.01
FAILED = []
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def fail(msg):
    FAILED.append(msg)
    print(f"torch_zero: FAIL (rank {RANK}): {msg}", flush=True)


def say(msg):
    if RANK == 0:
        print(msg, flush=True)


def maxdiff(a, b):
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


class Net(nn.Module):
    """An embedding (vocab rows, width 10) tied to the head, two blocks; odd sizes pad stage 3's shards."""

    def __init__(self, vocab=13):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, 10)
        self.h = nn.ModuleList(nn.Sequential(nn.LayerNorm(10), nn.Linear(10, 10), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(10, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx, tgt):
        x = self.emb(idx)
        for b in self.h:
            x = x + b(x)
        return nn.functional.cross_entropy(self.head(x).view(-1, self.vocab), tgt.view(-1))


def make_net(vocab=13, under_init=False):
    torch.manual_seed(3)
    if not under_init:
        return Net(vocab)
    with zero.Init():
        return Net(vocab)


def batch(step, n, vocab=13):
    g = torch.Generator().manual_seed(1000 + step)
    idx = torch.randint(0, vocab, (n, 6), generator=g)
    return idx, (idx * 7 + 3) % vocab


def config(stage, micro=2, extra=None):
    z = {"stage": stage, "reduce_bucket_size": 200, "stage3_param_persistence_threshold": 0}
    c = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "steps_per_print": 0,
         "zero_optimization": z,
         "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.1}}}
    if os.environ.get("TORCH_API_DEVICE"):   # torch_cuda_emu.sh: the same checks on the emulated GPU
        c["zeroshard"] = {"device": os.environ["TORCH_API_DEVICE"]}
    c.update(extra or {})
    return c


def torch_opt(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def zs_step(engine, s, vocab=13):
    r, w, micro = engine.global_rank, engine.world_size, engine.train_micro_batch_size_per_gpu()
    idx, tgt = batch(s, micro * w, vocab)
    loss = engine(idx[r * micro:(r + 1) * micro], tgt[r * micro:(r + 1) * micro])
    engine.backward(loss)
    return loss


def torch_step(model, opt, s, n, vocab=13):
    idx, tgt = batch(s, n, vocab)
    opt.zero_grad(set_to_none=True)
    model(idx, tgt).backward()
    opt.step()


def gathered(module):
    with GatheredParameters(list(module.parameters())):
        return [p.detach().float().clone() for p in module.parameters()]


# ---------------------------------------------------------------------------- memory

def rss_reset():
    """Resets this process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def library_bytes(engine):
    """zs_memory's params + grads + optimizer + buffers (the leading fields of zs_memory_report)."""
    import ctypes
    import struct
    buf = ctypes.create_string_buffer(4096)
    if engine.lib.zs_memory(engine.ctx, buf) != 0:
        fail("zs_memory failed")
        return 0
    return sum(struct.unpack_from("<3i4x4Q", buf.raw)[3:])


def spill_fds():
    d = "/proc/self/fd"
    out = []
    for fd in os.listdir(d):
        try:
            if "zeroshard-init-" in os.readlink(os.path.join(d, fd)):
                out.append(fd)
        except OSError:
            pass
    return out


class Mlp(nn.Module):
    def __init__(self, dim, layers):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) for _ in range(layers))

    def forward(self, x):
        for lin in self.layers:
            x = lin(x)
        return (x * x).mean()


def memory_model():
    """(build, batch(step) -> forward kwargs or args, largest unit's elements, what): a 252 MB GPT-2 (8
    layers of 768, vocab 8192, tied head) when transformers imports, else a 201 MB MLP (12 layers of 2048)."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"torch_zero memory: GPT-2 SKIPPED (transformers cannot be imported: {e}); an MLP instead", flush=True)
        dim = 2048

        def mlp_batch(s):   # requires_grad: at stage 3 the first layer's bias gradient must not arrive while
            g = torch.Generator().manual_seed(s * 10 + RANK)   # its unit is released
            return (torch.randn(1, dim, generator=g).requires_grad_(),), {}
        return (lambda: Mlp(dim, 12)), mlp_batch, dim * dim + dim, "MLP"
    gc = GPT2Config(n_layer=8, n_embd=768, n_head=12, vocab_size=8192, n_positions=64, bos_token_id=0,
                    eos_token_id=0)

    def gpt_batch(s):
        ids = torch.randint(0, 8192, (1, 16), generator=torch.Generator().manual_seed(s * 10 + RANK))
        return (), {"input_ids": ids, "labels": ids}
    return (lambda: GPT2LMHeadModel(gc)), gpt_batch, 8192 * 768 + 64 * 768 + 2 * 768, "GPT-2"


def mode_memory():
    global RANK
    build, make_batch, unit_numel, what = memory_model()
    # a first engine pays the one-time costs (MPI, torch.distributed's group, the library's threads), so the
    # figures below are the model's
    zeroshard.initialize(model=Mlp(8, 2), config=config(3, micro=1))[0].destroy()
    torch.manual_seed(0)
    rss_reset()
    base = rss_kb("VmRSS")
    with zero.Init():
        model = build()
    build_mb = (rss_kb("VmHWM") - base) / 1024
    model_mb = sum(p.ds_numel for p in model.parameters()) * 4 / 2**20
    if not spill_fds():
        fail("no spill file open after the build under zero.Init")
    cfg = config(3, micro=1, extra={"zeroshard": {"device_memory": int(model_mb * 0.85) << 20}})
    cfg["zero_optimization"].update({"reduce_bucket_size": unit_numel, "stage3_max_live_parameters": 2 * unit_numel,
                                     "offload_optimizer": {"device": "cpu"}})
    engine, _, _, _ = zeroshard.initialize(model=model, config=cfg)
    setup_mb = (rss_kb("VmHWM") - base) / 1024
    lib_mb, unit_mb = library_bytes(engine) / 2**20, unit_numel * 4 / 2**20
    RANK = engine.global_rank
    if spill_fds():
        fail(f"spill file still open after set-up: fds {spill_fds()}")
    for s in range(2):
        args, kwargs = make_batch(s)
        out = engine(*args, **kwargs)
        loss = out if isinstance(out, torch.Tensor) else out.loss
        engine.backward(loss)
        engine.step()
        if not torch.isfinite(loss):
            fail(f"step {s}: loss {loss.item()}")
    print(f"torch_zero memory: rank {RANK}: {what} of {model_mb:.0f} MB fp32: peak RSS growth {build_mb:.0f} MB for "
          f"the build under zero.Init, {setup_mb:.0f} MB with set-up, of which the library's own {lib_mb:.0f} MB "
          f"({engine.world_size} ranks, stage 3, device budget {cfg['zeroshard']['device_memory'] >> 20} MB)",
          flush=True)
    if build_mb > model_mb / 4:
        fail(f"the build under zero.Init grew RSS by {build_mb:.0f} MB (model {model_mb:.0f} MB)")
    if setup_mb > lib_mb + unit_mb + model_mb / 2:
        fail(f"build + set-up grew RSS by {setup_mb:.0f} MB: more than the library's {lib_mb:.0f} MB, the largest "
             f"unit ({unit_mb:.0f} MB) and half the model ({model_mb:.0f} MB)")
    engine.destroy()


# ---------------------------------------------------------------------------- parity

def check_stand_ins(model, ref, what):
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        if p.shape != q.shape or tuple(p.ds_shape) != tuple(q.shape) or p.ds_numel != q.numel():
            fail(f"{what}: '{n}' reports shape {tuple(p.shape)} / ds_shape {tuple(p.ds_shape)}, expected {tuple(q.shape)}")
        if p.numel() > 1 and any(st != 0 for st in p.stride()):
            fail(f"{what}: '{n}' holds values (stride {p.stride()}) after zero.Init")
    if not all(torch.equal(a, b) for a, b in zip(gathered(model), ref.parameters())):
        fail(f"{what}: values gathered from the spill store differ from the model built without zero.Init")


def parity_gpt2():
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"torch_zero parity: GPT-2 part SKIPPED: transformers cannot be imported ({e})", flush=True)
        return
    gc = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    def build(under):
        torch.manual_seed(5)
        if not under:
            return GPT2LMHeadModel(gc)
        with zero.Init():
            return GPT2LMHeadModel(gc)
    ref, model = build(False), build(True)
    if model.lm_head.weight is not model.transformer.wte.weight:
        fail("GPT-2 under zero.Init: lm_head.weight is not tied to wte.weight")
    check_stand_ins(model, ref, "GPT-2 under zero.Init")
    engine, _, _, _ = zeroshard.initialize(model=model, config=config(3))
    opt = torch_opt(ref)
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(9))
    r, w = engine.global_rank, engine.world_size
    for s in range(3):
        sl = slice(r * 4 // w, (r + 1) * 4 // w)
        loss = engine(input_ids=ids[sl], labels=ids[sl]).loss
        engine.backward(loss)
        engine.step()
        opt.zero_grad()
        ref(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    d = maxdiff(gathered(engine.module), list(ref.parameters()))
    say(f"torch_zero parity: GPT-2 built under zero.Init, 3 steps at stage 3: max |diff| {d:.2e} vs torch")
    if d > GPT2_ATOL:
        fail(f"GPT-2 under zero.Init: parameters differ from torch by {d:.2e} after 3 steps (limit {GPT2_ATOL})")
    engine.destroy()


def expect_error(what, fn, needle):
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        if needle not in str(e):
            fail(f"{what}: the error does not say '{needle}': {e}")
        return
    fail(f"{what}: not refused")


def parity_refusals():
    """What zero.Init cannot trace is refused naming the parameter: a write to part of one through a view
    inside the context, and a cast of the model (which copies the stand-ins) before initialize."""
    def partial_write():
        with zero.Init():
            m = Net()
            m.h[0][1].weight.data[:2].zero_()

    def cast_then_initialize():
        with zero.Init():
            m = Net()
        zeroshard.initialize(model=m.half(), config=config(0))
    expect_error("a write to part of a spilled parameter", partial_write, "on part of parameter 'Linear.weight'")
    expect_error("model.half() after zero.Init", cast_then_initialize, "'Embedding.weight' was cast to torch.float16")


def mode_parity():
    global RANK
    parity_refusals()
    for stage in (0, 3):
        ref, model = make_net(), make_net(under_init=True)
        check_stand_ins(model, ref, f"stage {stage}")
        engine, _, _, _ = zeroshard.initialize(model=model, config=config(stage))
        RANK = engine.global_rank
        if not all(torch.equal(a, b) for a, b in zip(gathered(engine.module), ref.parameters())):
            fail(f"stage {stage}: the parameters after set-up differ from the model built without zero.Init")
        opt, n = torch_opt(ref), 2 * engine.world_size
        for s in range(10):
            zs_step(engine, s)
            engine.step()
            torch_step(ref, opt, s, n)
        d = maxdiff(gathered(engine.module), list(ref.parameters()))
        say(f"torch_zero parity: stage {stage}: built under zero.Init, 10 steps: max |diff| {d:.2e} vs torch")
        if d > PARAM_ATOL:
            fail(f"stage {stage}: parameters differ from torch by {d:.2e} (limit {PARAM_ATOL})")
        engine.destroy()
    parity_gpt2()


# ---------------------------------------------------------------------------- gather

def edit_rows(emb, rank):
    """Rank 0's edit; the other ranks write something else, which modifier_rank=0 must discard."""
    with torch.no_grad():
        emb.weight[2:4] = 0.25 if rank == 0 else -7.0


def gather_stage(stage):
    ref, engine = make_net(), zeroshard.initialize(model=make_net(), config=config(stage))[0]
    r, n, opt = engine.global_rank, 2 * engine.world_size, torch_opt(ref)
    for s in range(6):
        if s == 3:
            with GatheredParameters([engine.module.emb.weight], modifier_rank=0):
                edit_rows(engine.module.emb, r)
            edit_rows(ref.emb, 0)
            seen = gathered(engine.module)[0][2:4]
            if not torch.all(seen == 0.25):
                fail(f"stage {stage}: after GatheredParameters(modifier_rank=0) rank {r} reads rows {seen[:, :3]}")
        zs_step(engine, s)
        engine.step()
        torch_step(ref, opt, s, n)
    d = maxdiff(gathered(engine.module), list(ref.parameters()))
    say(f"torch_zero gather: stage {stage}: rows set by rank 0 at step 3, 3 more steps: max |diff| {d:.2e} "
          "vs torch")
    if d > PARAM_ATOL:
        fail(f"stage {stage}: after the modifier gather, parameters differ from torch by {d:.2e}")
    if stage == 3:
        with GatheredParameters(list(engine.module.parameters())):
            sd = engine.module.state_dict()
            inside = {k: v.clone() for k, v in sd.items()}
        for s in (6, 7):   # a step, then a forward that gathers its new values into the freed buffers
            zs_step(engine, s)
            engine.step()
        bad = [k for k in sd if sd[k].shape != inside[k].shape or not torch.equal(sd[k], inside[k])]
        if bad:
            fail(f"stage 3: state_dict() taken inside GatheredParameters changed after it: {bad[:3]}")
    engine.destroy()


def gather_resize():
    """Hugging Face's resize_token_embeddings under DeepSpeed: the new embedding built under zero.Init, the
    old rows copied inside GatheredParameters(modifier_rank=0), before initialize."""
    def resize(model, under):
        old = model.emb
        torch.manual_seed(11)
        if under:
            with zero.Init():
                new = nn.Embedding(17, 10)
        else:
            new = nn.Embedding(17, 10)
        with GatheredParameters([old.weight, new.weight], modifier_rank=0):
            with torch.no_grad():
                new.weight[:13] = old.weight
                if under and RANK != 0:
                    new.weight[13:] = -7.0   # discarded: rank 0's values win
        model.emb, model.vocab = new, 17
        model.head = nn.Linear(10, 17, bias=False)
        model.head.weight = new.weight
        return model
    model, ref = resize(make_net(under_init=True), True), resize(make_net(), False)
    engine = zeroshard.initialize(model=model, config=config(3))[0]
    d = maxdiff(gathered(engine.module), list(ref.parameters()))
    if d != 0:
        fail(f"embedding resized under zero.Init: rank {engine.global_rank} differs from torch by {d:.2e}")
    say(f"torch_zero gather: embedding resized 13 -> 17 under zero.Init before initialize: max |diff| {d:.2e}")
    engine.destroy()


def gather_bf16():
    """bf16 at stage 3: rank 0's bf16 edit reaches the fp32 masters; a parameter gathered with it but left
    unchanged keeps its fp32 master bits (it is not rewritten from its bf16 copy)."""
    engine = zeroshard.initialize(model=make_net(), config=config(3, extra={"bf16": {"enabled": True}}))[0]
    for s in range(2):
        zs_step(engine, s)
        engine.step()
    emb, lin = engine.module.emb.weight, engine.module.h[0][1].weight
    before = utils.safe_get_full_fp32_param(lin)
    with GatheredParameters([emb, lin], modifier_rank=0):
        edit_rows(engine.module.emb, engine.global_rank)
    rows, after = utils.safe_get_full_fp32_param(emb)[2:4], utils.safe_get_full_fp32_param(lin)
    if not torch.all(rows == 0.25):
        fail(f"bf16: rank {engine.global_rank}'s fp32 master of the edited rows reads {rows[:, :3]}")
    if not torch.equal(before, after):
        fail(f"bf16: an unchanged parameter's fp32 master moved by {(before - after).abs().max().item():.2e} "
             "through GatheredParameters(modifier_rank=0)")
    say("torch_zero gather: bf16 stage 3: rank 0's edit in the fp32 masters, an unchanged parameter's master kept")
    engine.destroy()


def mode_gather():
    for stage in (1, 3):
        gather_stage(stage)
    gather_resize()
    gather_bf16()


# ---------------------------------------------------------------------------- utils

def mode_utils():
    global RANK
    for stage in (0, 2, 3):
        ref, engine = make_net(), zeroshard.initialize(model=make_net(), config=config(stage))[0]
        RANK, n, opt = engine.global_rank, 2 * engine.world_size, torch_opt(ref)
        zp, rp = list(engine.module.parameters()), list(ref.parameters())
        worst = {"param": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0, "grad": 0.0}
        for s in range(5):
            zs_step(engine, s)
            idx, tgt = batch(s, n)
            opt.zero_grad(set_to_none=True)
            ref(idx, tgt).backward()
            if s == 4:
                worst["grad"] = maxdiff([utils.safe_get_full_grad(p) for p in zp], [q.grad for q in rp])
            engine.step()
            opt.step()
        worst["param"] = maxdiff([utils.safe_get_full_fp32_param(p) for p in zp], rp)
        for key in ("exp_avg", "exp_avg_sq"):
            worst[key] = maxdiff([utils.safe_get_full_optimizer_state(p, key) for p in zp],
                                 [opt.state[q][key] for q in rp])
        shapes = [tuple(utils.safe_get_full_fp32_param(p).shape) for p in zp]
        if shapes != [tuple(q.shape) for q in rp]:
            fail(f"stage {stage}: safe_get_full_fp32_param shapes {shapes}")
        say(f"torch_zero utils: stage {stage}: after 5 steps vs torch.optim.AdamW: " +
            ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
        limits = {"param": PARAM_ATOL, "exp_avg": PARAM_ATOL, "exp_avg_sq": 1e-7, "grad": 1e-6}
        for k, v in worst.items():
            if v > limits[k]:
                fail(f"stage {stage}: safe_get_full {k} differs from torch by {v:.2e} (limit {limits[k]})")
        # safe_set_full_fp32_param: rank 0's value, seen by the next forward
        w = torch.full((10, 10), 0.125) + 0.01 * torch.arange(100.0).view(10, 10)
        utils.safe_set_full_fp32_param(engine.module.h[0][1].weight, w if RANK == 0 else torch.zeros(10, 10))
        with torch.no_grad():
            ref.h[0][1].weight.copy_(w)
        idx, tgt = batch(99, 2)
        with torch.no_grad():
            a, b = engine(idx, tgt).item(), ref(idx, tgt).item()
        if abs(a - b) > 1e-5:
            fail(f"stage {stage}: after safe_set_full_fp32_param the loss is {a}, torch's {b}")
        engine.destroy()


def main():
    mode = sys.argv[1]
    {"memory": mode_memory, "parity": mode_parity, "gather": mode_gather, "utils": mode_utils}[mode]()
    if FAILED:
        sys.exit(1)
    if RANK == 0:
        print(f"torch_zero {mode}: passed", flush=True)


if __name__ == "__main__":
    main()
