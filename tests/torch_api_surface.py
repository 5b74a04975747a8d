"""torch_api_surface.py - the PyTorch front end's DeepSpeed engine surface against plain PyTorch: client optimizers
and schedulers, parameter groups, frozen parameters, accumulation driven by the caller, checkpoint tags and
load flags, torch.distributed. torch_api.sh runs it under mpirun (torch_api.sh MODE with the modes below).

  client    2 ranks: a client torch.optim.AdamW with two groups (no weight decay for biases and LayerNorm) and a
            torch LambdaLR; a client SGD with momentum and nesterov; each at stages 0 and 3, and a client
            Adagrad at stage 0, against the same optimizer and scheduler in one process; DeepSpeed's
            FusedAdam recognised by name (adam_w_mode); a callable building the optimizer.
  frozen    2 ranks: a frozen embedding and a block with a frozen Linear beside trainable LayerNorm (a mixed
            unit, registered as two), and model_parameters listing a subset, at stages 0 and 3.
  accum     2 ranks, accumulation 2: backward(scale_wrt_gas=False) with the loss divided by the script,
            set_gradient_accumulation_boundary as Accelerate calls it (False at a full window refused), no_sync at
            stage 1 (same numbers) and refused at stage 3.
  tags      2 ranks: save_checkpoint(tag="checkpoint") mid-training with client_state and a client scheduler,
            train on, load it mid-training (step, parameters, scheduler and client_state back), then train to
            the end equal to the uninterrupted run; load_checkpoint on a directory without `latest` is
            (None, None); load_module_only keeps the running step; engine.state_dict() / load_state_dict
            with full values at stage 3.
  dist      2 ranks: comm.get_rank() before initialize; initialize creates a gloo group: dist.all_reduce and
            zeroshard.comm's calls work; engine.local_rank from MPI's node-local split.

Tolerance: both sides compute in fp32 with different summation orders (~1e-7 relative in the gradients);
after 10 steps at lr 0.01 the parameters agree within PARAM_ATOL 2e-5 (as torch_api.py's stages mode).
"""
import os
import sys

try:
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"torch_api_surface: skipped: torch cannot be imported ({e})")
    sys.exit(77)

import zeroshard
import torch_api as T

STEPS = 10
PARAM_ATOL = 2e-5


def base_config(stage, accum=1, micro=2):
    c = T.config(stage, micro=micro, accum=accum)
    del c["optimizer"]
    return c


def decay_groups(model, wd=0.1):
    """Hugging Face's split: no weight decay for biases and LayerNorm weights."""
    no = [p for n, p in model.named_parameters() if n.endswith("bias") or ".ln." in n]
    yes = [p for n, p in model.named_parameters() if not (n.endswith("bias") or ".ln." in n)]
    return [{"params": yes, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]


def warm(step):
    return min(1.0, (step + 1) / 4)


def run_zs(cfg, make_opt=None, make_sched=None, steps=STEPS, prepare=None, model_parameters=None, accum=1,
           drive=None):
    """Trains T.make_model() steps through zeroshard.initialize; returns (parameters, engine info)."""
    model = T.make_model()
    if prepare:
        prepare(model)
    opt = make_opt(model) if make_opt else None
    sched = make_sched(opt) if make_sched and opt is not None else None
    engine, zopt, _, zsched = zeroshard.initialize(model=model, config=cfg, optimizer=opt,
                                                   model_parameters=model_parameters(model) if model_parameters else None,
                                                   lr_scheduler=sched)
    r, w = engine.global_rank, engine.world_size
    T.RANK = r
    micro = engine.train_micro_batch_size_per_gpu()
    lrs = []
    for s in range(steps):
        idx, tgt = T.global_batch(s, micro * w * accum)
        for m in range(accum):
            sl = slice((m * w + r) * micro, (m * w + r + 1) * micro)
            if drive:
                drive(engine, idx[sl], tgt[sl], m, accum)
            else:
                engine.backward(engine(idx[sl], tgt[sl]))
                engine.step()
        lrs.append(engine.get_lr())
    out = T.params_of(engine)
    engine.destroy()
    return out, lrs


def run_torch(make_opt, make_sched=None, steps=STEPS, prepare=None, accum=1, micro=2, world=2):
    model = T.make_model()
    if prepare:
        prepare(model)
    opt = make_opt(model)
    sched = make_sched(opt) if make_sched else None
    n = micro * world * accum
    lrs = []
    for s in range(steps):
        idx, tgt = T.global_batch(s, n)
        opt.zero_grad(set_to_none=True)
        for m in range(accum):
            sl = slice(m * micro * world, (m + 1) * micro * world)
            (model(idx[sl], tgt[sl]) / accum).backward()
        live = [p for g in opt.param_groups for p in g["params"]]   # the norm is over the optimized ones
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(live, 1.0)
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        if sched:
            sched.step()
    return [p.detach().float().clone() for p in model.parameters()], lrs


def compare(what, got, want, tol=PARAM_ATOL):
    d = T.maxdiff(got, want)
    if T.RANK == 0:
        print(f"  {what}: max |diff| from PyTorch {d:.3g} (limit {tol})")
    if d > tol:
        T.fail(f"{what}: parameters differ from PyTorch's by {d:.3g} > {tol}")


# ---------------------------------------------------------------------------------------------- modes
def mode_client():
    def adamw(m):
        return torch.optim.AdamW(decay_groups(m), lr=T.LR, betas=(0.9, 0.99), eps=1e-8)

    def lam(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, warm) if opt is not None else None

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)

    want_adamw, want_lrs = run_torch(adamw, lam)
    want_sgd, _ = run_torch(sgd)
    for st in (0, 3):
        got, lrs = run_zs(base_config(st), adamw, lam)
        compare(f"stage {st}: client AdamW, 2 groups, LambdaLR", got, want_adamw)
        if [round(x, 12) for x in lrs[0]] != [round(x, 12) for x in want_lrs[0]]:
            T.fail(f"stage {st}: get_lr() after the first step {lrs[0]}, torch used {want_lrs[0]}")
        got, _ = run_zs(base_config(st), sgd)
        compare(f"stage {st}: client SGD momentum 0.9 nesterov", got, want_sgd)
    def adagrad(m):
        return torch.optim.Adagrad(m.parameters(), lr=0.05, eps=1e-10, weight_decay=0.01)

    want_ada, _ = run_torch(adagrad)
    got, _ = run_zs(base_config(0), adagrad)
    compare("stage 0: client Adagrad", got, want_ada)

    class FusedAdam(torch.optim.Optimizer):   # DeepSpeed's, recognised by its class name
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adam_w_mode=True):
            super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                      "bias_correction": True})
            self.adam_w_mode = adam_w_mode

    for w_mode, want_type in ((True, "AdamW"), (False, "Adam")):
        model = T.make_model()
        engine, _, _, _ = zeroshard.initialize(model=model, config=base_config(0),
                                               optimizer=FusedAdam(model.parameters(), adam_w_mode=w_mode))
        kind = engine.config["optimizer"]["type"]
        engine.destroy()
        if kind != want_type:
            T.fail(f"FusedAdam(adam_w_mode={w_mode}) ran as {kind}, expected {want_type}")
        elif T.RANK == 0:
            print(f"  FusedAdam(adam_w_mode={w_mode}): config optimizer type {kind}")
    # a callable: DeepSpeed calls optimizer(model_parameters)
    model = T.make_model()
    engine, opt, _, _ = zeroshard.initialize(model=model, config=base_config(0), model_parameters=model.parameters(),
                                             optimizer=lambda ps: torch.optim.Adam(ps, lr=0.002))
    kind = engine.config["optimizer"]
    if kind["type"] != "Adam" or kind["params"].get("adam_w_mode") is not False or opt.param_groups[0]["lr"] != 0.002:
        T.fail(f"callable optimizer: config section {kind}, lr {opt.param_groups[0]['lr']}")
    elif T.RANK == 0:
        print(f"  callable optimizer: config section {kind}")
    engine.destroy()


def mode_frozen():
    def freeze(m):
        m.emb.weight.requires_grad_(False)   # the tied head too
        m.h[1].fc.requires_grad_(False)      # block 1: a frozen Linear beside a trainable LayerNorm

    def adamw(m):
        return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=T.LR, betas=(0.9, 0.99),
                                 eps=1e-8, weight_decay=0.1)

    want, _ = run_torch(adamw, prepare=freeze)
    start = [p.detach().clone() for p in T.make_model().parameters()]
    for st in (0, 3):
        got, _ = run_zs(base_config(st), adamw, prepare=freeze)
        compare(f"stage {st}: frozen embedding and a mixed block", got, want)
        names = [n for n, _ in T.make_model().named_parameters()]
        for n in ("emb.weight", "h.1.fc.weight"):
            i = names.index(n)
            if not torch.equal(got[i], start[i]):
                T.fail(f"stage {st}: frozen '{n}' moved")
    model = T.make_model()
    freeze(model)
    engine, _, _, _ = zeroshard.initialize(model=model, config=base_config(3), optimizer=adamw(model))
    units = [(u.name, u.frozen) for u in engine.units]
    engine.destroy()
    want_units = [("rest", True), ("h.0", False), ("h.1", False), ("h.1.frozen", True), ("h.2", False)]
    if units != want_units:
        T.fail(f"units {units}, expected {want_units}")
    elif T.RANK == 0:
        print(f"  units (name, frozen): {units}")
    # model_parameters as a subset: the rest is frozen for the optimizer (requires_grad stays)
    cfg = T.config(3)

    def subset(m):
        return [p for n, p in m.named_parameters() if n.startswith("h.")]

    def adamw_subset(m):
        return torch.optim.AdamW(subset(m), lr=T.LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)

    want, _ = run_torch(adamw_subset)
    got, _ = run_zs(cfg, model_parameters=subset)
    compare("stage 3: model_parameters a subset (the embedding not optimized)", got, want)


def sgd_config(stage, accum):
    """SGD without clipping: the update is proportional to the gradient (Adam's and clipping's are not), so a
    gradient scaled by the accumulation steps shows."""
    c = T.config(stage, micro=1, accum=accum)
    c["gradient_clipping"] = 0
    c["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    return c


def mode_accum():
    cfg = sgd_config(2, 2)
    ref, _ = run_zs(cfg, accum=2)

    def trainer(engine, idx, tgt, m, accum):   # Hugging Face Trainer: divides, passes scale_wrt_gas=False
        engine.backward(engine(idx, tgt) / accum, scale_wrt_gas=False)
        engine.step()

    def accelerate(engine, idx, tgt, m, accum):
        engine.set_gradient_accumulation_boundary(m == accum - 1)
        engine.backward(engine(idx, tgt))
        engine.step()

    def accelerate_sync(engine, idx, tgt, m, accum):   # Accelerate 1.x: engine.step() only when it syncs
        engine.set_gradient_accumulation_boundary(m == accum - 1)
        engine.backward(engine(idx, tgt))
        if m == accum - 1:
            engine.step()

    for name, drive in (("scale_wrt_gas=False, loss divided by the script", trainer),
                        ("set_gradient_accumulation_boundary", accelerate),
                        ("set_gradient_accumulation_boundary, step() only at the boundary", accelerate_sync)):
        got, _ = run_zs(cfg, accum=2, drive=drive)
        d = T.maxdiff(got, ref)
        if T.RANK == 0:
            print(f"  {name}: max |diff| from engine.backward(loss) {d:.3g} (limit {PARAM_ATOL})")
        if d > PARAM_ATOL:
            T.fail(f"{name}: differs from the default accumulation by {d:.3g}")
    plain, _ = run_zs(sgd_config(1, 2), accum=2)

    def quiet(engine, idx, tgt, m, accum):
        if m < accum - 1:
            with engine.no_sync():
                engine.backward(engine(idx, tgt))
                engine.step()
        else:
            engine.backward(engine(idx, tgt))
            engine.step()

    got, _ = run_zs(sgd_config(1, 2), accum=2, drive=quiet)
    if not T.bits_equal(got, plain):
        T.fail("stage 1: no_sync changed the parameters")
    elif T.RANK == 0:
        print("  stage 1: no_sync on the first micro-batch: parameters bit-identical to without")
    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=T.config(3, micro=1, accum=2))
    engine.set_gradient_accumulation_boundary(False)   # micro-batch 1 of 2: the count agrees
    idx, tgt = T.global_batch(0, 2)
    engine.backward(engine(idx[T.RANK:T.RANK + 1], tgt[T.RANK:T.RANK + 1]))
    engine.step()
    T.expect_error("set_gradient_accumulation_boundary(False) on micro-batch 2 of 2",
                   lambda: engine.set_gradient_accumulation_boundary(False), "gradient_accumulation_steps 2")

    def in_no_sync():
        with engine.no_sync():
            pass
    T.expect_error("no_sync at stage 3", in_no_sync, "incompatible with gradient partitioning")
    engine.destroy()


def mode_tags(d):
    def adamw(m):
        return torch.optim.AdamW(decay_groups(m), lr=T.LR, betas=(0.9, 0.99), eps=1e-8)

    def lam(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, warm) if opt is not None else None

    full, _ = run_zs(base_config(3), adamw, lam)
    model = T.make_model()
    opt = adamw(model)
    engine, zopt, _, sched = zeroshard.initialize(model=model, config=base_config(3), optimizer=opt,
                                                  lr_scheduler=lam(opt))
    r = engine.global_rank
    T.RANK = r
    got = engine.load_checkpoint(d)
    if got != (None, None):
        T.fail(f"load_checkpoint of a directory without 'latest': {got}, expected (None, None)")

    def one(s):
        idx, tgt = T.global_batch(s, 4)
        engine.backward(engine(idx[r * 2:r * 2 + 2], tgt[r * 2:r * 2 + 2]))
        engine.step()

    for s in range(4):
        one(s)
    engine.save_checkpoint(d, tag="checkpoint", client_state={"epoch": 7}, save_latest=False)
    at4 = T.params_of(engine)
    for s in range(4, 7):
        one(s)
    path, client = engine.load_checkpoint(d, tag="checkpoint")
    if engine.global_steps != 4 or client.get("epoch") != 7 or sched.last_epoch != 4:
        T.fail(f"loaded mid-training: step {engine.global_steps}, client_state {client}, scheduler at "
               f"{sched.last_epoch}; expected 4, epoch 7, 4")
    if not T.bits_equal(T.params_of(engine), at4):
        T.fail("loaded parameters differ from the saved ones")
    for s in range(4, STEPS):
        one(s)
    if not T.bits_equal(T.params_of(engine), full):
        T.fail("resumed run differs from the uninterrupted one")
    elif r == 0:
        print(f"  tag 'checkpoint' saved at 4, trained to 7, loaded ({path}), trained to {STEPS}: bit-identical "
              "to the uninterrupted run; (None, None) without 'latest'")
    if os.path.exists(os.path.join(d, "latest")):
        T.fail("save_latest=False wrote 'latest'")
    step = engine.global_steps
    engine.load_checkpoint(d, tag="checkpoint", load_module_only=True)
    if engine.global_steps != step:
        T.fail(f"load_module_only moved the step from {step} to {engine.global_steps}")
    T.expect_error("tag with a slash", lambda: engine.save_checkpoint(d, tag="a/b"), "a/b")
    check_state_dict(engine)
    engine.destroy()


def check_state_dict(engine):
    """Stage 3: engine.state_dict() holds full copies (gathered unit by unit); load_state_dict of another
    model's values (the model's own names) sets them, the tied head with the embedding."""
    sd = engine.state_dict()
    full = T.params_of(engine)
    names = T.names_of(engine.module)
    same = all(torch.equal(sd["module." + n], p) for n, p in zip(names, full)) and "module.head.weight" in sd
    other = T.make_model()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    engine.load_state_dict(other.state_dict())
    back = T.params_of(engine)
    loaded = T.bits_equal(back, [p.detach() for p in other.parameters()])
    if T.RANK == 0:
        print(f"  stage 3 state_dict: {len(sd)} entries, full values: {same}; load_state_dict of another model's: "
              f"{loaded}")
    if not same or not loaded:
        T.fail(f"state_dict full values {same}, load_state_dict took the values {loaded}")


def mode_dist():
    from zeroshard import comm
    import torch.distributed as dist
    rank = comm.get_rank()
    engine, _, _, _ = zeroshard.initialize(model=T.make_model(), config=T.config(0))
    T.RANK = engine.global_rank
    if rank != engine.global_rank:
        T.fail(f"comm.get_rank() before initialize {rank}, the engine's {engine.global_rank}")
    if not dist.is_initialized():
        T.fail("initialize left torch.distributed uninitialised")
        return
    t = torch.tensor([float(engine.global_rank + 1)])
    dist.all_reduce(t)
    comm.barrier()
    b = torch.tensor([float(engine.global_rank * 10 + 5)])
    comm.broadcast(b, 0)
    ok = t.item() == 3.0 and b.item() == 5.0 and comm.get_world_size() == 2 and engine.local_rank == T.RANK
    if T.RANK == 0:
        print(f"  gloo over the MPI world: all_reduce {t.item()}, broadcast {b.item()}, world "
              f"{comm.get_world_size()}, local_rank {engine.local_rank}")
    if not ok:
        T.fail(f"rank {T.RANK}: all_reduce {t.item()} (want 3), broadcast {b.item()} (want 5), local_rank "
               f"{engine.local_rank}")
    engine.destroy()


NEEDS = {"client": "zs_group_add", "frozen": "zs_param_freeze", "tags": "zs_checkpoint_save_opts",
         "dist": "zs_world_bcast"}


def main():
    mode = sys.argv[1]
    need = NEEDS.get(mode)
    if need and not hasattr(zeroshard._lib.lib(), need):
        print(f"torch_api {mode}: skipped: this libzeroshard lacks {need}")
        sys.exit(77)
    modes = {"client": mode_client, "frozen": mode_frozen, "accum": mode_accum, "dist": mode_dist}
    if mode == "tags":
        mode_tags(sys.argv[2])
    elif mode in modes:
        modes[mode]()
    else:
        sys.exit(f"torch_api_surface: unknown mode {mode}")
    T.finish(mode)


if __name__ == "__main__":
    main()
