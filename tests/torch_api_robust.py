"""torch_api_robust.py - the PyTorch front end where scripts and machines go wrong, and its precision rules;
torch_api.sh runs it under mpirun (2 ranks).

  robust     the library search takes build/ before build-asan/ and never an ASan build unasked; the libmpi
             promoted to RTLD_GLOBAL is the one libzeroshard maps; zs_init_opts' MPI_Comm slot as wide as
             zs_mpi_comm_bytes says; zeroshard.device "cuda" refused from Python; an exception inside a
             stage-3 forward releases what it fetched (the next step trains, parameters stand-ins after it);
             stage 3 with raw features into the first block (its weights' gradients need no weight) equals
             stage 0; a
             dropped engine is finalised (collective: every rank drops it) and another one trains; a
             save_16bit_model whose file rank 0 cannot write raises on every rank, naming the file, with no
             hang; misuse errors (an optimizer class ZeroShard does not run, a parameter in two groups, a
             frozen parameter given to the optimizer, a client optimizer beside a config section).
  precision  bf16: a module's fp32 buffers are cast with it (a buffer multiplied into a bf16 activation
             would otherwise promote it to fp32 and fail in the next Linear), bool buffers stay. (fp16's loss
             is scaled after .float(), as DeepSpeed does; the gradients are the same either way, since the
             cast's backward rounds the scaled gradient back to fp16, so there is nothing to hold.)
  uncaught   rank 0 raises after initialize: its process exits at once (no collective end), so the job
             ends within seconds instead of rank 1 waiting out zeroshard.timeout_s (torch_api.sh checks).
  checkpointing  stage 3 with torch.utils.checkpoint around each block (use_reentrant False and True,
             zeroshard.checkpointing.checkpoint, and around block.forward itself, whose recomputation runs
             no hook of the block, as Hugging Face's gradient checkpointing) gives stage 0's parameters bit
             for bit.
"""
import gc
import os
import sys
import tempfile
import weakref

try:
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"torch_api_robust: skipped: torch cannot be imported ({e})")
    sys.exit(77)

import zeroshard
import zeroshard._lib as L
import torch_api as T


def say(msg):
    if T.RANK == 0:
        print("  " + msg, flush=True)


def one_step(engine, s=0):
    r = engine.global_rank
    idx, tgt = T.global_batch(s, 4)
    engine.backward(engine(idx[r * 2:r * 2 + 2], tgt[r * 2:r * 2 + 2]))
    engine.step()


# ---------------------------------------------------------------------------------------------- robust
def check_search():
    with tempfile.TemporaryDirectory() as d:
        for sub, body in (("build-asan", b"\x7fELF needs libasan.so.8"), ("build", b"\x7fELF"),
                          ("build-rel", b"\x7fELF")):
            os.makedirs(os.path.join(d, sub))
            with open(os.path.join(d, sub, "libzeroshard.so"), "wb") as f:
                f.write(body)
        saved = {k: os.environ.pop(k) for k in ("ZEROSHARD_LIB", "ZEROSHARD_PREFIX") if k in os.environ}
        try:
            got = [os.path.relpath(p, d) for p in L._candidates(src=d) if p.startswith(d)]
        finally:
            os.environ.update(saved)
    want = ["build/libzeroshard.so", "build-rel/libzeroshard.so"]
    say(f"library search in a checkout with build-asan/, build/, build-rel/: {got}")
    if got != want:
        T.fail(f"library search order {got}, expected {want} (build/ first, no ASan build)")


def check_mpi():
    mapped = L._mapped_mpi()
    name = getattr(L._mpi, "_name", None)
    ok = mapped is not None and name is not None and os.path.realpath(name) == os.path.realpath(mapped)
    say(f"libmpi promoted: {name}; mapped by libzeroshard: {mapped}")
    if not ok:
        T.fail(f"the libmpi opened RTLD_GLOBAL ({name}) is not the one mapped ({mapped})")


def check_comm_width():
    real = L.lib().zs_mpi_comm_bytes()
    widths = {}
    for w in (4, 8):
        L._lib.zs_mpi_comm_bytes = lambda w=w: w
        o = L.init_opts()
        widths[w] = (type(o).comm.size, type(o).use_comm.offset)
    del L._lib.zs_mpi_comm_bytes
    L._declare(L._lib)
    L.init_opts()
    say(f"zs_init_opts comm (size, use_comm offset) for MPI_Comm of 4 and 8 bytes: {widths}; this MPI: {real}")
    if widths != {4: (4, 20), 8: (8, 24)}:
        T.fail(f"InitOpts.comm not sized by zs_mpi_comm_bytes: {widths}")


def check_cuda_refused():
    """Without a GPU (or a CUDA backend in the build), zeroshard.device "cuda" is refused naming the key."""
    cfg = T.config(0)
    cfg["zeroshard"] = {"device": "cuda"}
    T.expect_error("zeroshard.device cuda without a GPU", lambda: zeroshard.initialize(model=T.make_model(),
                   config=cfg), 'zeroshard.device: "cuda"')


class Boom(nn.Module):
    """Net whose block 1 raises inside its forward (in its Linear, after the block fetched its unit)."""

    def __init__(self):
        super().__init__()
        self.net = T.make_model()
        self.explode = False
        self.net.h[1].fc.register_forward_pre_hook(self.maybe)

    def maybe(self, _m, _a):
        if self.explode:
            raise ValueError("boom in block 1")

    def forward(self, idx, tgt):
        return self.net(idx, tgt)


def check_module():
    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=T.config(0))
    ok = isinstance(engine, nn.Module) and engine.module in list(engine.children()) and engine.to("cpu") is engine
    engine.eval()
    ok = ok and not engine.training and not engine.module.training
    engine.train()
    ok = ok and engine.training and engine.module.h[0].training and engine.device == torch.device("cpu")
    say(f"the engine is an nn.Module with `module` its child, train()/eval() reach the model, to('cpu'): {ok}")
    if not ok:
        T.fail("the engine is not the nn.Module DeepSpeed's is")
    T.expect_error("engine.to('cuda') of a CPU engine", lambda: engine.to("cuda"), 'zeroshard.device "cpu"')
    engine.destroy()


def check_forward_exception():
    model = Boom()
    engine, _, _, _ = zeroshard.initialize(model=model, config=T.config(3))
    model.explode = True
    r = engine.global_rank
    idx, tgt = T.global_batch(0, 4)
    try:
        engine(idx[r * 2:r * 2 + 2], tgt[r * 2:r * 2 + 2])
        T.fail("the forward did not raise")
    except ValueError:
        pass
    held = [u.name for u in engine.units if u.refs]
    model.explode = False
    one_step(engine)
    stand = engine._stand.untyped_storage().data_ptr()   # a released parameter's zero-stride stand-in
    empty = all(p.untyped_storage().data_ptr() == stand for p in engine.module.parameters())
    say(f"stage 3, exception in block 1's forward: units still fetched after it {held}; next step trained, "
        f"parameters empty after it: {empty}")
    if held or not empty:
        T.fail(f"a failed stage-3 forward left units fetched ({held}) or parameters holding storage")
    sizes = [(tuple(p.ds_shape), p.ds_numel) for p in engine.module.parameters()]
    want = [(tuple(p.shape), p.numel()) for p in T.make_model().parameters()]
    if sizes != want:
        T.fail(f"stage 3: ds_shape/ds_numel {sizes[:3]}..., expected {want[:3]}...")
    engine.destroy()


class Raw(nn.Module):
    """Blocks whose first one takes raw features (no requires_grad): its weights' gradients need no weight in
    backward, so nothing fetches its unit again before autograd accumulates them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(3)])
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).pow(2).mean()


def check_raw_input():
    got = {}
    for stage in (0, 3):
        engine, _, _, _ = zeroshard.initialize(model=Raw(), config=T.config(stage))
        g = torch.Generator().manual_seed(7)
        for s in range(3):
            x = torch.randn(4, 16, generator=g)[engine.global_rank * 2:engine.global_rank * 2 + 2]
            engine.backward(engine(x))
            engine.step()
        got[stage] = T.params_of(engine)
        engine.destroy()
    say("stage 3, raw features into the first block (no input gradient): trains, parameters equal stage 0's: "
        f"{T.bits_equal(got[3], got[0])}")
    if not T.bits_equal(got[3], got[0]):
        T.fail("stage 3 with raw input features differs from stage 0")


def check_dropped():
    model = T.make_model()
    engine, opt, _, _ = zeroshard.initialize(model=model, config=T.config(3))
    one_step(engine)
    ref = weakref.ref(engine)
    gc.disable()   # by reference counting alone, so at the same point on every rank (no cycle left to gc)
    del engine, opt
    gone = ref() is None
    gc.enable()
    released = all(p.numel() == 0 for p in model.parameters())
    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=T.config(3))
    one_step(engine)
    engine.destroy()
    say(f"engine dropped (del, no gc): finalised {gone}, the model's parameters released {released}; a new engine "
        "trains")
    if not gone or not released:
        T.fail("a dropped engine was not finalised")


def check_export_failure():
    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=T.config(3))
    one_step(engine)
    with tempfile.NamedTemporaryFile() as f:   # a file where the directory should be: rank 0 cannot write
        target = os.path.join(f.name, "out")
        T.expect_error("save_16bit_model into an unwritable directory", lambda: engine.save_16bit_model(target),
                       os.path.join(target, "model.safetensors"))
    one_step(engine, 1)   # every rank still in step
    engine.destroy()


def check_misuse():
    m = T.make_model()
    T.expect_error("unknown optimizer class",
                   lambda: zeroshard.initialize(model=m, config=_no_optim(),
                                                optimizer=torch.optim.RMSprop(m.parameters())),
                   "torch.optim.rmsprop.RMSprop is not supported")
    m = T.make_model()
    ps = list(m.parameters())
    T.expect_error("a parameter in two groups",
                   lambda: zeroshard.initialize(model=m, config=T.config(0),
                                                model_parameters=[{"params": ps[:3]}, {"params": ps[2:]}]),
                   f"'{T.names_of(m)[2]}' is in param_groups[0] and param_groups[1]")
    m = T.make_model()
    m.h[0].fc.weight.requires_grad_(False)
    T.expect_error("a frozen parameter given to the optimizer",
                   lambda: zeroshard.initialize(model=m, config=_no_optim(),
                                                optimizer=torch.optim.AdamW(m.parameters())),
                   "'h.0.fc.weight' has requires_grad=False")
    m = T.make_model()
    T.expect_error("client optimizer and config section",
                   lambda: zeroshard.initialize(model=m, config=T.config(0), optimizer=torch.optim.AdamW(m.parameters())),
                   "both a client optimizer")


def _no_optim():
    c = T.config(0)
    del c["optimizer"]
    return c


def mode_robust():
    T.RANK = L.world_info()[0]
    check_search()
    check_mpi()
    check_comm_width()
    check_cuda_refused()
    check_module()
    check_misuse()
    check_forward_exception()
    check_raw_input()
    check_dropped()
    check_export_failure()


# ---------------------------------------------------------------------------------------------- precision
class Scaled(nn.Module):
    """A fp32 buffer multiplied into the activations, and a bool mask buffer (as GPT-2's attention bias)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.a = nn.Linear(10, 10)
        self.b = nn.Linear(10, 10)
        self.register_buffer("gain", torch.full((10,), 1.5))
        self.register_buffer("mask", torch.ones(10, dtype=torch.bool))

    def forward(self, x):
        y = self.a(x) * self.gain
        return self.b(y.masked_fill(~self.mask, 0)).pow(2).sum()


def mode_precision():
    cfg = T.config(0, dtype="bf16")
    model = Scaled()
    engine, _, _, _ = zeroshard.initialize(model=model, config=cfg)
    T.RANK = engine.global_rank
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    try:
        engine.backward(engine(x))
        engine.step()
        ok = True
    except RuntimeError as e:
        ok = False
        T.fail(f"bf16 with a fp32 buffer: {e}")
    say(f"bf16: buffers gain {model.gain.dtype}, mask {model.mask.dtype}; a step ran: {ok}")
    if model.gain.dtype != torch.bfloat16 or model.mask.dtype != torch.bool:
        T.fail(f"buffers gain {model.gain.dtype} (want bf16), mask {model.mask.dtype} (want bool)")
    engine.destroy()


# ---------------------------------------------------------------------------------------------- checkpointing
class CkptNet(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.net = T.make_model()
        self.how = how
        if how == "forward":   # as Hugging Face's GradientCheckpointingLayer: forward checkpoints itself
            for b in self.net.h:
                b.forward = (lambda f: lambda x: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False))(b.forward)

    def forward(self, idx, tgt):
        n = self.net
        x = n.emb(idx)
        for b in n.h:
            if self.how == "none":
                x = b(x)
            elif self.how == "zeroshard":
                x = zeroshard.checkpointing.checkpoint(b, x)
            elif self.how == "forward":   # inside the block's forward: the recomputation runs no hook of it
                x = b(x)
            else:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=self.how == "reentrant")
        return nn.functional.cross_entropy(n.head(x).view(-1, 13), tgt.view(-1))


def train_ckpt(stage, how, steps=6):
    engine, _, _, _ = zeroshard.initialize(model=CkptNet(how), config=T.config(stage))
    T.RANK = engine.global_rank
    for s in range(steps):
        one_step(engine, s)
    out = T.params_of(engine)
    engine.destroy()
    return out


def mode_checkpointing():
    ref = train_ckpt(0, "none")
    for how in ("non-reentrant", "reentrant", "zeroshard", "forward"):
        got = train_ckpt(3, how)
        same = T.bits_equal(got, ref)
        say(f"stage 3, activation checkpointing ({how}): parameters bit-identical to stage 0 without: {same}")
        if not same:
            T.fail(f"stage 3 with checkpointing ({how}) differs from stage 0 by {T.maxdiff(got, ref):.3g}")


# ---------------------------------------------------------------------------------------------- uncaught
def mode_uncaught():
    """Rank 0 raises right after initialize and rank 1 goes on to a step: torch_api.sh expects the job to end
    with rank 0's notice, not with rank 1's timeout (ZS_TIMEOUT is set long there)."""
    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=T.config(3))
    if engine.global_rank == 0:
        raise ValueError("torch_api_robust: rank 0 fails on purpose")
    one_step(engine)


def main():
    mode = sys.argv[1]
    modes = {"robust": mode_robust, "precision": mode_precision, "checkpointing": mode_checkpointing,
             "uncaught": mode_uncaught}
    if mode not in modes:
        sys.exit(f"torch_api_robust: unknown mode {mode}")
    modes[mode]()
    T.finish(mode)


if __name__ == "__main__":
    main()
