"""torch_api_window.py - the epoch-end remainder through the PyTorch front end: torch_api.sh window runs it at 2
ranks (torch_api_window.py SCRATCH_DIR). gradient_accumulation_steps 3 over epochs of 16 micro-batches, 2 epochs, the loop driving the boundary
as Accelerate does at an epoch's end: set_gradient_accumulation_boundary(True) before the epoch's last
backward, step() at each boundary only. Against plain PyTorch in one process with DeepSpeed's divisor: each
micro-batch's loss over the global micro-batch divided by 3, no clipping, optimizer.step() after every 3rd micro-batch of
the epoch and after its 16th (so each epoch's last window holds one micro-batch and its gradient a third of
a full one's weight). At stages 0 and 3, with backward(loss) (scale_wrt_gas) and, at stage 3, with the loss
divided by the script (backward(loss / 3, scale_wrt_gas=False), as the Trainer). Also: is_gradient_
accumulation_boundary() is True after set(True) and at exactly the windows' last micro-batches (the count
restarts after the short window);
set_gradient_accumulation_boundary(False) at a full window stays refused, and so does an early end with a
library that lacks zs_window_end, naming it; a checkpoint saved right after the
first epoch's short window resumes to the straight run's parameters.

Tolerance: both sides compute in fp32 with different summation orders (~1e-7 relative in the gradients);
after 12 steps at lr 0.01 the parameters agree within PARAM_RTOL 1e-6 of the largest parameter's magnitude
(relative L2 over all of them), with 2e-5 absolute per element (torch_api.py's PARAM_ATOL) as a backstop.
"""
import os
import sys

try:
    import torch
except ImportError as e:
    print(f"torch_api: skipped: torch cannot be imported ({e})")
    sys.exit(77)

import zeroshard
import torch_api as T

GAS, EPOCH, EPOCHS, MICRO = 3, 16, 2, 2
PARAM_RTOL = 1e-6


def batch(e, m, n):
    """Micro-batch m of epoch e: n samples (the global micro-batch, n = MICRO x world)."""
    return T.global_batch(100 * e + m, n)


def windows():
    """(epoch, micro-batch) per micro-batch and whether it closes a window: every GAS-th of the epoch and its last."""
    for e in range(EPOCHS):
        for m in range(EPOCH):
            yield e, m, (m + 1) % GAS == 0 or m == EPOCH - 1


def train_torch(world):
    model = T.make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=T.LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    opt.zero_grad(set_to_none=True)
    for e, m, last in windows():
        idx, tgt = batch(e, m, MICRO * world)
        (model(idx, tgt) / GAS).backward()
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return [p.detach().float().clone() for p in model.parameters()]


def config(stage):
    """torch_api.py's config without clipping: this model's gradients are clipped at every step, and a clipped
    step has the same size whatever the divisor, so a wrong one would pass unseen."""
    cfg = T.config(stage, micro=MICRO, accum=GAS)
    cfg["gradient_clipping"] = 0.0
    return cfg


def train_zs(cfg, scaled=True, save=None, load=None, trace=None):
    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=cfg)
    r, w = engine.global_rank, engine.world_size
    T.RANK = r
    start = 0
    if load:
        engine.load_checkpoint(load)
        start = EPOCH   # the checkpoint was saved after epoch 0
        if engine.global_steps != (EPOCH + GAS - 1) // GAS:
            T.fail(f"loaded checkpoint is at step {engine.global_steps}")
    for i, (e, m, last) in enumerate(windows()):
        if i < start:
            continue
        early = m == EPOCH - 1
        if early:
            engine.set_gradient_accumulation_boundary(True)
            if not engine.is_gradient_accumulation_boundary():
                T.fail(f"epoch {e}: is_gradient_accumulation_boundary() False after set(True)")
        idx, tgt = batch(e, m, MICRO * w)
        sl = slice(r * MICRO, (r + 1) * MICRO)
        loss = engine(idx[sl], tgt[sl])
        engine.backward(loss) if scaled else engine.backward(loss / GAS, scale_wrt_gas=False)
        if trace is not None:   # after backward, before step(): the micro-batch just run
            trace.append(engine.is_gradient_accumulation_boundary())
        if last:
            steps = engine.global_steps
            engine.step()
            if engine.global_steps != steps + 1:
                T.fail(f"epoch {e} micro-batch {m}: step() at the boundary did not step")
        if save and e == 0 and m == EPOCH - 1:
            engine.save_checkpoint(save)
    out = T.params_of(engine)
    engine.destroy()
    return out


def rel_l2(a, b):
    num = sum(((x - y) ** 2).sum().item() for x, y in zip(a, b))
    den = sum((y ** 2).sum().item() for y in b)
    return (num / den) ** 0.5


def compare(name, got, ref):
    rel, d = rel_l2(got, ref), T.maxdiff(got, ref)
    if T.RANK == 0:
        print(f"  {name}: relative L2 {rel:.3g} (limit {PARAM_RTOL}), max |diff| {d:.3g} (limit {T.PARAM_ATOL})")
    if rel > PARAM_RTOL or d > T.PARAM_ATOL:
        T.fail(f"{name}: relative L2 {rel:.3g}, max |diff| {d:.3g} from plain PyTorch")


def main():
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    ref = train_torch(world)
    for stage in (0, 3):
        trace = []
        got = train_zs(config(stage), trace=trace)
        compare(f"stage {stage}, backward(loss)", got, ref)
        # a boundary exactly at each window's last micro-batch: the count restarts after the short window
        want = [last for _, _, last in windows()]
        if trace != want:
            bad = next(i for i, (a, b) in enumerate(zip(trace, want)) if a != b)
            T.fail(f"stage {stage}: is_gradient_accumulation_boundary() at micro-batch {bad}: {trace[bad]}, "
                   f"expected {want[bad]}")
    compare("stage 3, backward(loss / 3, scale_wrt_gas=False)",
            train_zs(config(3), scaled=False), ref)

    # a checkpoint after epoch 0's short window (global step 6, 16 micro-batches), resumed at stage 0
    d = os.path.join(sys.argv[1], "ck")
    straight = train_zs(config(3), save=d)
    resumed = train_zs(config(0), load=d)
    compare("saved at stage 3 after the short window, resumed at stage 0", resumed, straight)

    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=config(0))
    for m in range(GAS - 1):
        idx, tgt = batch(0, m, MICRO * world)
        engine.set_gradient_accumulation_boundary(False)
        engine.backward(engine(idx[T.RANK * MICRO:(T.RANK + 1) * MICRO], tgt[T.RANK * MICRO:(T.RANK + 1) * MICRO]))
    T.expect_error("set_gradient_accumulation_boundary(False) on micro-batch 3 of 3",
                   lambda: engine.set_gradient_accumulation_boundary(False), "is a boundary")
    engine.destroy()

    class OlderLibrary:
        """The loaded library as one built before zs_window_end: the symbol missing (ctypes raises
        AttributeError for it), everything else the real one."""

        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            if name == "zs_window_end":
                raise AttributeError(name)
            return getattr(self._lib, name)

    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=config(3))
    engine.lib = OlderLibrary(engine.lib)
    T.expect_error("set_gradient_accumulation_boundary(True) on micro-batch 1 of 3 without zs_window_end",
                   lambda: engine.set_gradient_accumulation_boundary(True), "no zs_window_end")
    engine.lib = engine.lib._lib
    engine.destroy()
    T.finish("window")


if __name__ == "__main__":
    main()
