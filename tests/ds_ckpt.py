"""ds_ckpt.py - DeepSpeed 0.19.8's own checkpoints resumed on ZeroShard, and zero_to_fp32 on both formats.
ds_ckpt.sh runs the modes:

  ds STAGE DIR      under torchrun (2 ranks), DeepSpeed itself: trains SAVE_AT steps (torch Adam, the config's
                    WarmupLR), saves DIR/ds (client_state included), trains MORE steps and writes their losses
                    to DIR/ds_losses.json; rank 0 then writes DeepSpeed's own zero_to_fp32 of DIR/ds to
                    DIR/ds_fp32.pt.
  zs STAGE DIR      under mpirun (2 or 3 ranks), ZeroShard with deepspeed unimportable: load_checkpoint(DIR/ds)
                    (client_state, global_steps, lr back), the next MORE losses against DeepSpeed's within
                    LOSS_RTOL; zeroshard._ds_ckpt's get_fp32_state_dict_from_zero_checkpoint of DIR/ds equals
                    DIR/ds_fp32.pt exactly; ZeroShard's own checkpoint of the run read the same way equals
                    safe_get_full_fp32_param exactly; convert_zero_checkpoint_to_fp32_state_dict and
                    load_state_dict_from_zero_checkpoint give the same values.
  errors STAGE DIR  under mpirun (2 ranks): copies of DIR/ds with a rank's optim file truncated, then removed, or
                    marked fp16 in its ds_config; a model whose parameter names differ; an engine running SGD:
                    each load is an error naming the file and key, on every rank.

The data: every rank gets the same batch, a function of the step only. The gradient averaged over ranks is then
the same at any world size, so DeepSpeed's continuation at 2 ranks is the reference for ZeroShard at 2 and at 3
ranks (a batch per rank would give 3 ranks another global batch, and a different run). The model's sizes (13,
27, 5) divide by neither 2 nor 3, so both sides' padding is exercised.

Tolerance: both sides compute in fp32 with different summation orders; the losses agree within 1e-5 relative.
"""
import json
import os
import sys

SAVE_AT, MORE = 4, 5
LOSS_RTOL = 1e-5
LR = 0.01


def config(stage):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": stage},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR,
                                                         "warmup_num_steps": 6}},
            "zero_force_ds_cpu_optimizer": False, "steps_per_print": 100000}


def make_model(torch, names=("inp", "ln", "mid", "out")):
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            a, b, c, d = names
            setattr(self, a, nn.Linear(13, 27))
            setattr(self, b, nn.LayerNorm(27))
            setattr(self, c, nn.Linear(27, 27))
            setattr(self, d, nn.Linear(27, 5))
            self.names = names

        def forward(self, x, y):
            a, b, c, d = (getattr(self, n) for n in self.names)
            h = torch.tanh(b(a(x)))
            h = torch.tanh(c(h))
            return nn.functional.mse_loss(d(h), y)

    torch.manual_seed(0)
    return Net()


def batch(torch, step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(4, 13, generator=g), torch.randn(4, 5, generator=g)


def make_optimizer(torch, model):
    return torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.99), eps=1e-8)


def train(torch, engine, first, count):
    losses = []
    for step in range(first, first + count):
        x, y = batch(torch, step)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


# ---------------------------------------------------------------------------------------------------- DeepSpeed
def run_ds(stage, d):
    import torch
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    model = make_model(torch)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=make_optimizer(torch, model), config=config(stage))
    train(torch, engine, 0, SAVE_AT)
    engine.save_checkpoint(os.path.join(d, "ds"), client_state={"checkpoint_step": SAVE_AT, "note": "ds"})
    losses = train(torch, engine, SAVE_AT, MORE)
    torch.distributed.barrier()
    if engine.global_rank == 0:
        with open(os.path.join(d, "ds_losses.json"), "w") as f:
            json.dump({"losses": losses, "lr_at_save": None}, f)
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        torch.save(get_fp32_state_dict_from_zero_checkpoint(os.path.join(d, "ds")), os.path.join(d, "ds_fp32.pt"))
        print(f"ds_ckpt ds: stage {stage}: losses after the save {losses}")
    torch.distributed.barrier()


# ---------------------------------------------------------------------------------------------------- ZeroShard
def block_deepspeed():
    sys.modules["deepspeed"] = None   # `import deepspeed` fails: the reader must not need it


def run_zs(stage, d):
    block_deepspeed()
    import torch
    import zeroshard
    from zeroshard import _ds_ckpt as Z
    from zeroshard.utils import safe_get_full_fp32_param
    model = make_model(torch)
    engine, _, _, sched = zeroshard.initialize(model=model, optimizer=make_optimizer(torch, model), config=config(stage))
    rank, world = engine.global_rank, engine.world_size
    path, client = engine.load_checkpoint(os.path.join(d, "ds"))
    assert path == os.path.join(d, "ds", f"global_step{SAVE_AT}"), path
    assert client == {"checkpoint_step": SAVE_AT, "note": "ds"}, client
    assert engine.global_steps == SAVE_AT, engine.global_steps
    losses = train(torch, engine, SAVE_AT, MORE)
    with open(os.path.join(d, "ds_losses.json")) as f:
        ref = json.load(f)["losses"]
    # a NaN loss compares False with anything: it must not slip through max()
    diffs = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref)]
    rel = float("inf") if any(d != d for d in diffs) or len(diffs) != MORE else max(diffs)
    if rank == 0:
        print(f"ds_ckpt zs: stage {stage}, {world} ranks: losses {losses}")
        print(f"ds_ckpt zs: stage {stage}, {world} ranks: DeepSpeed's {ref}")
        print(f"ds_ckpt zs: stage {stage}, {world} ranks: max relative loss difference {rel:.3g}")
    assert rel <= LOSS_RTOL, f"stage {stage} at {world} ranks: losses differ by {rel:.3g} relative"

    # zero_to_fp32 on DeepSpeed's checkpoint: what DeepSpeed's own returned, bit for bit
    if rank == 0:
        mine = Z.get_fp32_state_dict_from_zero_checkpoint(os.path.join(d, "ds"))
        theirs = torch.load(os.path.join(d, "ds_fp32.pt"), weights_only=False)
        assert list(mine) == list(theirs), (list(mine), list(theirs))
        for k in theirs:
            assert mine[k].dtype == theirs[k].dtype and torch.equal(mine[k], theirs[k]), k
        print(f"ds_ckpt zs: zero_to_fp32 of DeepSpeed's stage {stage} checkpoint: {len(mine)} tensors equal")

    # ... and on ZeroShard's own checkpoint: the engine's full parameters, bit for bit
    zdir = os.path.join(d, f"zs{world}")
    engine.save_checkpoint(zdir, client_state={"step": engine.global_steps})
    full = {n: safe_get_full_fp32_param(p) for n, p in model.named_parameters()}
    if rank == 0:
        sd = Z.get_fp32_state_dict_from_zero_checkpoint(zdir)
        assert list(sd) == list(full), (list(sd), list(full))
        for k in full:
            assert sd[k].dtype == torch.float32 and torch.equal(sd[k], full[k]), k
        out = os.path.join(d, f"zs{world}_out")
        Z.convert_zero_checkpoint_to_fp32_state_dict(zdir, out, max_shard_size=None)
        saved = torch.load(os.path.join(out, "pytorch_model.bin"), weights_only=True)
        assert all(torch.equal(saved[k], full[k]) for k in full) and len(saved) == len(full)
        fresh = Z.load_state_dict_from_zero_checkpoint(make_model(torch), zdir)
        assert all(torch.equal(p.detach(), full[n]) for n, p in fresh.named_parameters())
        print(f"ds_ckpt zs: zero_to_fp32 of ZeroShard's checkpoint at {world} ranks: {len(sd)} tensors equal "
              "safe_get_full_fp32_param")
    assert "deepspeed" not in sys.modules or sys.modules["deepspeed"] is None


def expect_error(engine, d, what, *needles):
    try:
        engine.load_checkpoint(d)
    except Exception as e:   # noqa: BLE001 (the message is what is checked)
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        assert not missing, f"{what}: the error does not name {missing}: {msg}"
        if engine.global_rank == 0:
            print(f"ds_ckpt errors: {what}: {msg}")
        return
    raise AssertionError(f"{what}: the load succeeded")


def run_errors(stage, d):
    block_deepspeed()
    import shutil
    import torch
    import zeroshard
    model = make_model(torch)
    engine, _, _, _ = zeroshard.initialize(model=model, optimizer=make_optimizer(torch, model), config=config(stage))
    rank = engine.global_rank
    tag = f"global_step{SAVE_AT}"
    bad = os.path.join(d, f"bad{stage}")
    name = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    if rank == 0:
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(os.path.join(d, "ds"), bad)
        f = os.path.join(bad, tag, name)
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)
    zeroshard.comm.barrier()
    expect_error(engine, bad, "a truncated rank file", name)
    zeroshard.comm.barrier()
    if rank == 0:
        os.remove(os.path.join(bad, tag, name))
    zeroshard.comm.barrier()
    expect_error(engine, bad, "a missing rank file", name)
    zeroshard.comm.barrier()
    # the run goes on from its own state after the refused loads
    train(torch, engine, 0, 1)
    other = make_model(torch, names=("inp", "ln", "mid", "head"))
    e2, _, _, _ = zeroshard.initialize(model=other, optimizer=make_optimizer(torch, other), config=config(stage))
    expect_error(e2, os.path.join(d, "ds"), "a parameter name not in the model", "out.weight", "param_shapes")
    sgd = make_model(torch)
    e3, _, _, _ = zeroshard.initialize(model=sgd, optimizer=torch.optim.SGD(sgd.parameters(), lr=LR, momentum=0.9),
                                       config=config(stage))
    expect_error(e3, os.path.join(d, "ds"), "an optimizer type mismatch", "optim_states.pt", "SGD")
    # fp16 loss scaling: the model file's ds_config says fp16 (it pickles only torch's and collections' classes)
    fp16 = os.path.join(d, f"fp16_{stage}")
    model_file = "mp_rank_00_model_states.pt" if stage < 3 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    if rank == 0:
        shutil.rmtree(fp16, ignore_errors=True)
        shutil.copytree(os.path.join(d, "ds"), fp16)
        f = os.path.join(fp16, tag, model_file)
        sd = torch.load(f, weights_only=False)
        sd["ds_config"]["fp16"] = {"enabled": True}
        torch.save(sd, f)
    zeroshard.comm.barrier()
    expect_error(engine, fp16, "fp16 loss-scaler state", "loss_scaler", "optim_states.pt")


if __name__ == "__main__":
    mode, stage, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    {"ds": run_ds, "zs": run_zs, "errors": run_errors}[mode](stage, d)
