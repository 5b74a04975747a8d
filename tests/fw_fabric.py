"""fw_fabric.py MODE DIR - examples/pytorch/fortunes_fabric.py driven in one process per mode (under mpirun, 2 ranks):

  parity  DIR  ddp and ZeroShard stages 0-3, 20 steps: losses within TOL of ddp's, one params-hash over the
               stages, test accuracy above the majority class; stage 2 at accumulation 2 against ddp's (losses
               only: stages 0-1 add the micro-batches' gradients before the reduction, 2-3 after it, so the
               bits differ);
               stage 3 saves at step SAVE_AT into DIR (its final hash kept in DIR/parity.json)
  resume  DIR  a fresh process loads DIR's checkpoint and continues: the final hash is the uninterrupted one;
               then LoRA through Fabric (base bit-identical, adapters moved, loss falls); then misuse, each
               request ZeroShard does not do raising naming it
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "examples", "pytorch"))
import fortunes  # noqa: E402
import fortunes_fabric as ff  # noqa: E402

TINY = ["--steps", "20", "--dim", "64", "--layers", "1", "--seq", "48", "--micro-batch", "16", "--lr", "5e-3",
        "--warmup", "5", "--vocab", "2048", "--clip", "0.2"]   # the clip acts on about half the steps
TOL = 1e-6      # largest |loss - ddp's loss| over the 20 steps allowed (seen: 0 at accumulation 1, 6e-8 at 2)
SAVE_AT = 10


def train(strategy, *extra):
    """One run of the example; the ZeroShard engine is destroyed after it (collective), so runs do not pile up."""
    row, model = ff.run(ff.parse(TINY + ["--strategy", strategy] + list(extra)))
    inner = model._forward_module
    if hasattr(inner, "destroy"):
        inner.destroy()
    return row


def fail(msg):
    print(f"fw_fabric: FAIL: {msg}", flush=True)
    os._exit(1)   # not sys.exit: MPI_Finalize at exit would wait for the other rank, which goes on


def majority(a):
    _, test, _ = fortunes.datasets(a)
    ones = int(test.labels.sum())
    return max(ones, len(test.labels) - ones) / len(test.labels)


def parity(d):
    rows = {s: train(s) for s in ("ddp", "zeroshard_stage_0", "zeroshard_stage_1", "zeroshard_stage_2")}
    rows["zeroshard_stage_3"] = train("zeroshard_stage_3", "--save-dir", d, "--save-at", str(SAVE_AT))
    acc2 = {s: train(s, "--accum", "2", "--steps", "6") for s in ("ddp", "zeroshard_stage_2")}
    if rows["ddp"] is None:
        return   # rank 0 checks
    ref = rows["ddp"]["losses"]
    worst = 0.0
    for s, r in list(rows.items()) + [(f"{s} accum 2", r) for s, r in acc2.items()]:
        base = acc2["ddp"]["losses"] if "accum" in s else ref
        diff = max(abs(x - y) for x, y in zip(r["losses"], base))
        worst = max(worst, diff)
        if len(r["losses"]) != len(base) or diff > TOL:
            fail(f"{s}: losses differ from ddp's by {diff:.3g} (tolerance {TOL})")
    hashes = {s: r["params_hash"] for s, r in rows.items() if s != "ddp"}
    if len(set(hashes.values())) != 1:
        fail(f"stages 0-3 give different params-hashes: {hashes}")
    chance = majority(ff.parse(TINY))
    low = {s: r["test_acc"] for s, r in rows.items() if r["test_acc"] <= chance + 0.02}
    if low:
        fail(f"test accuracy not above the majority class ({chance:.3f}): {low}")
    with open(os.path.join(d, "parity.json"), "w") as f:
        json.dump(rows["zeroshard_stage_3"], f)
    print(f"fw_fabric parity: passed (losses within {worst:.3g} of ddp's, one params-hash "
          f"{hashes['zeroshard_stage_0']} over stages 0-3, accuracy {rows['zeroshard_stage_2']['test_acc']:.3f} > majority {chance:.3f})", flush=True)


def resume(d):
    row = train("zeroshard_stage_3", "--save-dir", d, "--resume")
    if row is not None:
        want = json.load(open(os.path.join(d, "parity.json")))
        if row["params_hash"] != want["params_hash"] or row["losses"] != want["losses"]:
            fail(f"resumed at step {SAVE_AT}: params-hash {row['params_hash']} (uninterrupted {want['params_hash']}), "
                 f"losses equal: {row['losses'] == want['losses']}")
        print(f"fw_fabric resume: passed (saved at step {SAVE_AT}, loaded in a fresh process: params-hash "
              f"{row['params_hash']} and losses as uninterrupted)", flush=True)
    lora()
    misuse()


def lora():
    import torch
    a = ff.parse(TINY + ["--lora", "--lr", "1e-2"])
    _, _, vocab = fortunes.datasets(a)
    built = fortunes.build_model(a, len(vocab))
    before = {n: p.detach().clone() for n, p in built.named_parameters()}
    trainable = {n for n, p in built.named_parameters() if p.requires_grad}   # adapters and peft's head copies
    row, model = ff.run(ff.parse(TINY + ["--lora", "--lr", "1e-2", "--strategy", "zeroshard_stage_2"]))
    after = dict(ff.full_params(model))
    model._forward_module.destroy()
    if row is None:
        return
    moved = [n for n in after if not torch.equal(after[n], before[n])]
    bad = [n for n in moved if n not in trainable]
    if bad or not any("lora_" in n for n in moved):
        fail(f"LoRA: changed {bad[:3]} outside the trainable adapters ({len(moved)} tensors changed)")
    first, last = sum(row["losses"][:5]) / 5, sum(row["losses"][-5:]) / 5
    if not last < first:
        fail(f"LoRA: loss did not fall ({first:.4f} -> {last:.4f})")
    print(f"fw_fabric lora: passed ({len(moved)} of {len(trainable)} trainable tensors moved, the "
          f"{len(before) - len(trainable)} frozen ones bit-identical, loss {first:.3f} -> {last:.3f})", flush=True)


def expect(what, needle, fn):
    try:
        fn()
    except Exception as e:   # noqa: BLE001 - any kind, as long as it names the thing
        if needle not in str(e):
            fail(f"misuse {what}: raised {type(e).__name__} without '{needle}': {e}")
        return
    fail(f"misuse {what}: did not raise")


def misuse():
    import lightning as L
    import torch
    from lightning.fabric.accelerators import CUDAAccelerator
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from zeroshard.lightning import ZeroShardFabricStrategy as Z

    def fabric(**kw):
        f = L.Fabric(accelerator="cpu", strategy=Z(**kw))
        f.launch()
        return f

    def parts():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

    def step(f, model, opt, x=torch.ones(2, 4)):
        f.backward(model(x).sum())
        return opt

    names = {"zeroshard": (2, None, None), "zeroshard_stage_0": (0, None, None), "zeroshard_stage_1": (1, None, None),
             "zeroshard_stage_2": (2, None, None), "zeroshard_stage_2_offload": (2, "cpu", None), "zeroshard_stage_3": (3, None, None),
             "zeroshard_stage_3_offload": (3, "cpu", "cpu")}
    for name, want in names.items():
        s = STRATEGY_REGISTRY.get(name)
        s._format_config()
        zo = s.config["zero_optimization"]
        got = (zo["stage"], zo.get("offload_optimizer", {}).get("device"), zo.get("offload_param", {}).get("device"))
        if not isinstance(s, Z) or got != want:
            fail(f"strategy name '{name}': {type(s).__name__} with (stage, offload_optimizer, offload_param) {got}")

    def accel():
        from lightning.fabric.accelerators import MPSAccelerator
        Z().accelerator = MPSAccelerator()
    expect("accelerator='mps'", "accelerator MPSAccelerator", accel)
    on_gpu = Z()   # accelerator 'gpu': the engine on zeroshard.device "cuda", the root device a GPU
    on_gpu.accelerator = CUDAAccelerator()
    on_gpu._format_config()
    if on_gpu.config.get("zeroshard", {}).get("device") != "cuda" or on_gpu.root_device.type != "cuda":
        fail(f"accelerator CUDAAccelerator: zeroshard {on_gpu.config.get('zeroshard')}, root device "
             f"{on_gpu.root_device}; expected zeroshard.device \"cuda\" on a cuda root device")
    expect("precision '64-true'", "precision '64-true'", lambda: Z(precision="64-true"))
    expect("Fabric(precision='16-true')", "precision '16-true'",
           lambda: L.Fabric(accelerator="cpu", strategy="zeroshard", precision="16-true"))
    expect("setup without an optimizer", "setup_module", lambda: fabric().setup(parts()[0]))
    expect("setup_optimizers", "setup_optimizers", lambda: fabric().setup_optimizers(parts()[1]))
    f = fabric(config={"gradient_clipping": 1.0, "gradient_accumulation_steps": 2})
    model, opt = f.setup(*parts())
    expect("clip_val", "clip_val", lambda: f.clip_gradients(model, step(f, model, opt), clip_val=0.5))
    expect("max_norm other than the config's", "gradient_clipping",
           lambda: f.clip_gradients(model, opt, max_norm=2.0))
    expect("step before the boundary", "gradient_accumulation_steps", lambda: opt.step())
    step(f, model, opt)
    opt.step()
    expect("save with filter", "filter", lambda: f.save("/nonexistent", {"model": model}, filter={"model": len}))
    expect("load without state", "state=", lambda: f.load("/nonexistent"))
    model._forward_module.destroy()
    # accumulation 2, the loss divided by it: the gradient ZeroShard steps on is the mean's, as torch's sum of
    # the two backwards (Adam and clipping hide a factor in the losses; the norm does not)
    ref, xs = parts()[0], [torch.linspace(-1, 1, 8).reshape(2, 4), torch.linspace(2, 0, 8).reshape(2, 4)]
    for x in xs:
        (ref(x).sum() / 2).backward()
    want = torch.sqrt(sum((p.grad ** 2).sum() for p in ref.parameters())).item()
    f2 = fabric(stage=2, config={"gradient_accumulation_steps": 2})
    model, opt = f2.setup(*parts())
    for i, x in enumerate(xs):
        with f2.no_backward_sync(model, enabled=i == 0):
            f2.backward(model(x).sum() / 2)
    opt.step()
    got = f2.strategy.model.get_global_grad_norm()
    if abs(got - want) > 1e-5 * want:
        fail(f"accumulation 2: ZeroShard's gradient norm {got} against torch's {want}")
    model._forward_module.destroy()
    # stage 3: built under fabric.init_module() (zero.Init), the full state (gathered) is what a plain build gives
    want = {k: v.clone() for k, v in parts()[0].state_dict().items()}
    f3 = fabric(stage=3)
    with f3.init_module():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    if not all(hasattr(p, "ds_spill") for p in m.parameters()):   # zero.Init keeps the values in its spill file
        fail("stage 3: fabric.init_module() did not build the model under zeroshard.zero.Init")
    model, _ = f3.setup(m, torch.optim.AdamW(m.parameters(), lr=1e-3))
    got = f3.strategy.get_module_state_dict(model)
    if sorted(got) != sorted(want) or any(not torch.equal(got[k], want[k]) for k in want):
        fail("stage 3: get_module_state_dict is not the full values the model was built with")
    # Fabric's wrapper hands state_dict() to the model itself, whose stage-3 parameters are released stand-ins
    expect("the wrapped model's state_dict() at stage 3", "'0.weight' is partitioned", lambda: model.state_dict())
    model._forward_module.destroy()
    if f.is_global_zero:
        print("fw_fabric misuse: passed (the seven names' stages and offloads; accelerator, precision x2, setup without optimizer, setup_optimizers, "
              "clip_val, max_norm, step before the boundary, save filter, load without state, a stage-3 state_dict(): each raised "
              "naming it; the accumulated gradient's norm as torch's; stage 3's init_module and full state)", flush=True)


if __name__ == "__main__":
    fortunes.mpi_to_torch_env()
    {"parity": parity, "resume": resume}[sys.argv[1]](sys.argv[2])
