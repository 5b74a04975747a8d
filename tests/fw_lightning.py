"""fw_lightning.py MODE [DIR] - the Lightning Trainer on ZeroShard (zeroshard.lightning.ZeroShardStrategy),
driven through examples/pytorch/fortunes_lightning.py's run():

  parity  (mpirun -np 2) ddp and ZeroShard stages 0-3 on the same 20 steps (accumulation 2, a clipping norm that
          binds): losses within LOSS_TOL of ddp's, one params-hash for stages 0-1 and one for 2-3 (the
          reductions' order differs with accumulation), accuracy above chance; stage 2 at bf16-mixed off fp32's
          losses by bf16's rounding only, and above chance
  save    (mpirun -np 2) stage 3 with offload, 20 steps, ModelCheckpoint at steps 10 and 20 in DIR
  resume  (mpirun -np 2) a fresh process resumes DIR's step-10 checkpoint: its losses and final params-hash
          are the uninterrupted run's, bit for bit
  cuda    (mpirun -np 2, over libzeroshard_cudaemu.so) ZeroShardStrategy at stages 2 and 3 on zeroshard.device
          "cuda" (the emulated GPU) ends on the "cpu" device's parameters bit for bit
  surface (one process, a world of one) every unsupported request raises, naming it; an lr scheduler with
          interval "epoch" moves the lr ZeroShard uses; configure_model and trainer.init_module at stage 3
          (zero.Init) train as the same module built in __init__; an epoch that ends between accumulation
          boundaries is refused; lightning_module_state_dict gathers full values; trainer.save_checkpoint
          writes the engine's directory and trainer.validate(ckpt_path=) loads it
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "examples", "pytorch"))
import fortunes_lightning as FL  # noqa: E402

# the task, tiny: 2 ranks x micro-batch 8 x accumulation 2 = global batch 32
TINY = ["--steps", "20", "--dim", "64", "--layers", "1", "--heads", "2", "--seq", "48", "--micro-batch", "8",
        "--accum", "2", "--lr", "3e-3", "--warmup", "3", "--clip", "0.05"]
# measured: ZeroShard's fp32 losses against ddp's differ by at most 1.2e-7 over the 20 steps (summation order)
LOSS_TOL = 1e-5
# measured: bf16-mixed losses against ddp's fp32 differ by up to 0.006 (bf16's 8-bit mantissa); fp32 by ~1e-7
BF16_MIN, BF16_TOL = 1e-4, 0.05


def check(ok, msg):
    if not ok:
        print(f"fw_lightning: FAIL: {msg}", flush=True)
        sys.exit(1)


def majority_share():
    train, test, _ = FL.fortunes.load_task(FL.fortunes.add_args(__import__("argparse").ArgumentParser())
                                           .parse_args([]))
    ones = sum(lbl for _, lbl in test)
    return max(ones, len(test) - ones) / len(test)


def parity():
    rows = {s: FL.run(TINY + ["--strategy", s])
            for s in ["ddp", "zeroshard_stage_0", "zeroshard_stage_1", "zeroshard_stage_2", "zeroshard_stage_3"]}
    bf16 = FL.run(TINY + ["--strategy", "zeroshard_stage_2", "--precision", "bf16-mixed"])
    once = {s: FL.run(TINY + ["--strategy", s, "--accum", "1", "--no-eval"])
            for s in ("zeroshard_stage_0", "zeroshard_stage_3")}
    if rows["ddp"] is None:   # not rank 0
        return
    ref = rows["ddp"]["losses"]
    chance = majority_share()
    for s, r in rows.items():
        check(len(r["losses"]) == 20, f"{s}: {len(r['losses'])} losses, expected one per step (20)")
        worst = max(abs(x - y) for x, y in zip(r["losses"], ref))
        check(worst <= LOSS_TOL, f"{s}: losses differ from ddp's by {worst:.3g} (> {LOSS_TOL})")
        check(r["test_acc"] > chance, f"{s}: test accuracy {r['test_acc']} is not above chance {chance:.4f}")
        print(f"fw_lightning: {s}: loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}, |loss - ddp| <= "
              f"{worst:.2g}, accuracy {r['test_acc']} (chance {chance:.4f}), hash {r['params_hash']}", flush=True)
    # with accumulation, stages 0-1 sum the micro-batches' gradients before the ranks' reduction and stages 2-3
    # after it: one params-hash for each pair (at accumulation 1 one for all four: stages 0 and 3 are checked)
    for pair in ((0, 1), (2, 3)):
        hashes = {rows[f"zeroshard_stage_{k}"]["params_hash"] for k in pair}
        check(len(hashes) == 1, f"stages {pair[0]}-{pair[1]} end with different parameters: {hashes}")
    hashes = {r["params_hash"] for r in once.values()}
    check(len(hashes) == 1, f"at accumulation 1 stages 0 and 3 end with different parameters: {hashes}")
    # bf16-mixed: the engine trains in bf16 (the losses move off fp32's, by bf16's rounding only) and learns
    worst = max(abs(x - y) for x, y in zip(bf16["losses"], ref))
    check(BF16_MIN < worst <= BF16_TOL, f"bf16-mixed: losses differ from ddp's fp32 by {worst:.3g} (expected "
          f"{BF16_MIN} < diff <= {BF16_TOL})")
    check(bf16["test_acc"] > chance, f"bf16-mixed: test accuracy {bf16['test_acc']} is not above chance {chance:.4f}")
    print(f"fw_lightning: zeroshard_stage_2 bf16-mixed: |loss - ddp fp32| <= {worst:.2g}, accuracy "
          f"{bf16['test_acc']}", flush=True)
    print("fw_lightning: parity passed", flush=True)


def save(d):
    r = FL.run(TINY + ["--strategy", "zeroshard_stage_3_offload", "--save-dir", d, "--save-at", "10", "--no-eval"])
    if r is not None:
        with open(os.path.join(d, "uninterrupted.json"), "w") as f:
            json.dump(r, f)


def resume(d):
    r = FL.run(TINY + ["--strategy", "zeroshard_stage_3_offload", "--save-dir", d, "--resume", "--no-eval"])
    if r is None:
        return
    with open(os.path.join(d, "uninterrupted.json")) as f:
        ref = json.load(f)
    check(r["losses"] == ref["losses"], f"resumed losses {r['losses'][9:]} != uninterrupted {ref['losses'][9:]}")
    check(r["params_hash"] == ref["params_hash"],
          f"resumed params-hash {r['params_hash']} != uninterrupted {ref['params_hash']}")
    print(f"fw_lightning: resume passed (step 10 -> 20, hash {r['params_hash']})", flush=True)


def tiny_parts():
    import torch
    import lightning.pytorch as L

    class Tiny(L.LightningModule):
        """Two linear blocks (two units at stage 3); built in __init__ or, with late=True, in configure_model."""

        def __init__(self, two=False, manual=False, clip_hook=False, late=False, epoch_sched=False):
            super().__init__()
            self.two, self.late, self.epoch_sched = two, late, epoch_sched
            self.automatic_optimization = not manual
            if clip_hook:
                self.configure_gradient_clipping = lambda *a, **k: None
            if not late:
                self.build()

        def build(self):
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))

        def configure_model(self):
            if self.late and not hasattr(self, "net"):
                self.build()
                self.built_stride = self.net[0].weight.stride()

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).square().mean()

        def validation_step(self, batch, batch_idx):
            self.log("val", self.net(batch[0]).square().mean(), sync_dist=True)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
            if self.two:
                return [opt, torch.optim.SGD(self.net.parameters(), lr=0.1)]
            if self.epoch_sched:
                return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(
                    opt, step_size=1, gamma=0.5), "interval": "epoch"}}
            return opt

    torch.manual_seed(1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)

    def trainer(**kw):
        kw.setdefault("strategy", "zeroshard_stage_2")
        kw.setdefault("accelerator", "cpu")
        kw.setdefault("max_steps", 1)
        return L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, **kw)
    return torch, Tiny, data, trainer


def expect(words, fn):
    try:
        fn()
    except Exception as e:   # noqa: BLE001 - any error, as long as it names the request
        msg = str(e)
        check(all(w in msg for w in words), f"the error for {words} does not name it: {msg}")
        print(f"fw_lightning: refused, naming {words}: {msg[:110]}", flush=True)
        return
    check(False, f"{words}: accepted, expected an error naming it")


def misuse():
    import zeroshard.lightning as ZL
    from lightning.pytorch.accelerators import CUDAAccelerator
    _, Tiny, data, trainer = tiny_parts()
    s = ZL.ZeroShardStrategy()
    from lightning.pytorch.accelerators import MPSAccelerator
    expect(["MPSAccelerator", "gpu"], lambda: setattr(s, "accelerator", MPSAccelerator()))
    s.accelerator = CUDAAccelerator()   # accelerator 'gpu': the engine on zeroshard.device "cuda"
    check(s._base_config().get("zeroshard", {}).get("device") == "cuda",
          f"accelerator CUDAAccelerator: zeroshard {s._base_config().get('zeroshard')}, expected device \"cuda\"")
    expect(["CUDA"], lambda: trainer(accelerator="cuda"))
    expect(["precision", "64"], lambda: trainer(precision="64-true"))
    expect(["precision", "16-true"], lambda: trainer(precision="16-true"))
    expect(["gradient_clip_algorithm", "value"],
           lambda: trainer(gradient_clip_val=1.0, gradient_clip_algorithm="value").fit(Tiny(), data))
    expect(["multiple optimizers"], lambda: trainer().fit(Tiny(two=True), data))
    expect(["manual optimization"], lambda: trainer().fit(Tiny(manual=True), data))
    expect(["configure_gradient_clipping"], lambda: trainer().fit(Tiny(clip_hook=True), data))
    expect(["stage 5"], lambda: trainer(strategy=ZL.ZeroShardStrategy(stage=5)).fit(Tiny(), data))
    expect(["zero_optimization.stage"], lambda: trainer(
        strategy=ZL.ZeroShardStrategy(stage=3, config={"zero_optimization": {"stage": 1}})).fit(Tiny(), data))
    print("fw_lightning: misuse passed", flush=True)


def surface(d):
    misuse()
    torch, Tiny, data, trainer = tiny_parts()
    from zeroshard.utils import safe_get_full_fp32_param

    # interval "epoch": 3 epochs of 2 steps, the lr halved after each; the last step used 0.1 / 4
    t = trainer(max_epochs=3, max_steps=-1)
    t.fit(Tiny(epoch_sched=True), data)
    lrs = t.strategy.model.get_lr()
    check(lrs == [0.025], f"interval 'epoch': ZeroShard's last step used lr {lrs}, expected [0.025]")
    t.strategy.model.destroy()

    # stage 3: built in configure_model under zero.Init, or in __init__: the same training, the same state
    states = []
    for late in (False, True):
        t = trainer(strategy="zeroshard_stage_3", max_steps=2)
        m = Tiny(late=late)
        t.fit(m, data)
        full = t.strategy.lightning_module_state_dict()
        for n, p in m.named_parameters():
            check(torch.equal(full[n], safe_get_full_fp32_param(p)), f"lightning_module_state_dict()['{n}'] "
                  "is not the gathered parameter")
        states.append(full)
        if late:
            check(m.built_stride == (0, 0), f"configure_model at stage 3 built full tensors (stride "
                  f"{m.built_stride}), not zero.Init's stand-ins")   # trainer.save_checkpoint, then validate from it
            path = os.path.join(d, "saved.ckpt")
            t.save_checkpoint(path)
            check(os.path.isdir(os.path.join(path, "checkpoint")), f"trainer.save_checkpoint wrote no engine "
                  f"checkpoint in {path}")
            t.validate(m, data, ckpt_path=path, verbose=False)
            # Lightning's conversion of a ZeRO checkpoint to one fp32 file, on ZeroShard's checkpoint
            from zeroshard.lightning import convert_zero_checkpoint_to_fp32_state_dict
            conv = convert_zero_checkpoint_to_fp32_state_dict(path, os.path.join(d, "fp32.pt"))
            back = torch.load(os.path.join(d, "fp32.pt"), weights_only=False)
            check(back["global_step"] == 2 and "epoch" in back, f"converted file lacks Lightning's state: {sorted(back)}")
            for n, p in m.named_parameters():
                check(torch.equal(back["state_dict"][n], safe_get_full_fp32_param(p)),
                      f"convert_zero_checkpoint_to_fp32_state_dict: '{n}' is not the trained parameter")
            check(sorted(conv["state_dict"]) == sorted(n for n, _ in m.named_parameters()),
                  f"converted keys {sorted(conv['state_dict'])}")
        t.strategy.model.destroy()
    t = trainer(strategy="zeroshard_stage_3", max_steps=2)
    with t.init_module():
        m = Tiny()
    check(m.net[0].weight.stride() == (0, 0), "trainer.init_module at stage 3 built full tensors, not zero.Init's "
          "stand-ins")
    t.fit(m, data)
    states.append(t.strategy.lightning_module_state_dict())
    t.strategy.model.destroy()
    for k in states[0]:
        for way, st in (("configure_model", states[1]), ("trainer.init_module", states[2])):
            check(torch.equal(states[0][k], st[k]), f"{way} at stage 3: '{k}' differs from the module built in "
                  "__init__")
    # validate before fit on one Trainer (Lightning's usual sanity check of a fresh model): the fit then trains
    # the validated module as a fit alone does; a second fit stays refused
    for strat in ("zeroshard_stage_2", "zeroshard_stage_3"):
        ref = trainer(strategy=strat, max_steps=2)
        m_ref = Tiny()
        ref.fit(m_ref, data)
        want = {n: safe_get_full_fp32_param(p) for n, p in m_ref.named_parameters()}
        ref.strategy.model.destroy()
        t = trainer(strategy=strat, max_steps=2)
        m = Tiny()
        t.validate(m, data, verbose=False)
        t.fit(m, data)
        for n, p in m.named_parameters():
            check(torch.equal(safe_get_full_fp32_param(p), want[n]), f"{strat}: validate then fit: '{n}' differs "
                  "from fit alone")
        expect(["second fit"], lambda: t.fit(m, data))
        t.strategy._engine.destroy()
        print(f"fw_lightning: {strat}: validate() then fit() trains as fit() alone", flush=True)

    # accumulate_grad_batches=3 over epochs of 2 batches: each epoch ends a short window (Lightning steps at an
    # epoch's last batch, the loss divided by 3); the same parameters as Lightning's own single-device loop
    got = {}
    for strat in ("zeroshard_stage_2", "zeroshard_stage_3", "auto"):
        t = trainer(strategy=strat, accumulate_grad_batches=3, max_epochs=3, max_steps=-1)
        m = Tiny()
        t.fit(m, data)
        got[strat] = {n: (safe_get_full_fp32_param(p) if strat != "auto" else p.detach().clone())
                      for n, p in m.named_parameters()}
        check(t.global_step == 3, f"{strat}: {t.global_step} optimizer steps over 3 epochs of one short window")
        if strat != "auto":
            t.strategy.model.destroy()
    for strat in ("zeroshard_stage_2", "zeroshard_stage_3"):
        diff = max((got[strat][n] - got["auto"][n]).abs().max().item() for n in got["auto"])
        check(diff <= 1e-6, f"{strat}: short windows differ from Lightning's own loop by {diff}")
        print(f"fw_lightning: {strat}, accumulate_grad_batches=3 over epochs of 2: within {diff:.1e} of "
              "Lightning's own loop", flush=True)
    print("fw_lightning: surface passed (epoch scheduler, configure_model at stage 3, gathered state, "
          "trainer.save_checkpoint)", flush=True)


def cuda():
    """Over libzeroshard_cudaemu.so (fw_lightning.sh cuda): the Trainer with ZeroShardStrategy at stages 2 and 3
    on zeroshard.device "cuda" (the emulated GPU) ends on the "cpu" device's parameters bit for bit."""
    import hashlib
    import zeroshard.lightning as ZL
    from zeroshard.zero import GatheredParameters
    torch, Tiny, _, trainer = tiny_parts()
    torch.manual_seed(2)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=4)
    for stage in (2, 3):
        got = {}
        for dev in ("cpu", "cuda"):
            t = trainer(strategy=ZL.ZeroShardStrategy(stage=stage, config={"zeroshard": {"device": dev}}),
                        max_steps=4, accumulate_grad_batches=2, gradient_clip_val=0.5)
            t.fit(Tiny(), data)
            engine = t.strategy.model
            check(engine._mem.kind == ("cuda (emulated)" if dev == "cuda" else "cpu"),
                  f"zeroshard.device {dev}: the engine's memory is {engine._mem.kind}")
            h = hashlib.sha256()
            with GatheredParameters(list(engine.module.parameters())):
                for p in engine.module.parameters():
                    h.update(p.detach().float().numpy().tobytes())
            got[dev] = h.hexdigest()[:16]
            engine.destroy()
        check(got["cpu"] == got["cuda"], f"stage {stage}: zeroshard.device cuda {got['cuda']}, cpu {got['cpu']}")
        print(f"fw_lightning: stage {stage} on zeroshard.device \"cuda\" (emulated): the cpu device's parameters "
              f"bit for bit ({got['cuda']})", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "parity":
        parity()
    elif mode == "cuda":
        cuda()
    else:
        {"save": save, "resume": resume, "surface": surface}[mode](sys.argv[2])
