"""fw_accelerate.py MODE [DIR] - zeroshard.accelerate against Accelerate (run by fw_accelerate.sh).

  parity   (2 ranks) examples/pytorch/fortunes_accelerate.py in one process under Accelerate's own Accelerator
           and ZeroShard's at stages 0-3, accumulation 2 and clipping that bites (and at stage 0 without
           clipping, the engine then stepping at optimizer.step()): losses agree within LOSS_TOL,
           accuracy above the majority class; stages 0-3 one params-hash without accumulation (0-1 and 2-3
           one each with it); gather_for_metrics over the test split sees each fortune once
  resume   (2 ranks) DIR/full.json (20 steps, saved after 16) against DIR/resumed.json (a fresh process that
           load_state'd and went on): the same losses and params-hash
  misuse   (1 rank) where the ZeRO config comes from (zeroshard_config, a YAML, DeepSpeedPlugin,
           ACCELERATE_DEEPSPEED_CONFIG_FILE), each unsupported request raising naming it, and the norm
           clip_grad_norm_ returns (this step's, before clipping)
"""
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "pytorch"))

# the largest loss difference measured between Accelerate (DDP over gloo) and ZeroShard on these 20 steps: 1.8e-7
LOSS_TOL = 1e-5
TINY = ["--steps", "20", "--dim", "32", "--layers", "1", "--heads", "2", "--seq", "64", "--micro-batch", "8",
        "--accum", "2", "--lr", "1.5e-2", "--warmup", "2", "--clip", "0.1"]


def fail(msg):
    """Exits at once: a normal exit would wait in the collective end for ranks still in a collective."""
    print(f"fw_accelerate: FAIL: {msg}", flush=True)
    os._exit(1)


def mode_parity():
    import fortunes_accelerate as ex
    rows = {s: ex.run(ex.parse(TINY + ["--strategy", s])) for s in ex.STRATEGIES[:5]}
    # without clip_grad_norm_ the engine steps at optimizer.step() (with it, already at the clip)
    unclipped = {s: ex.run(ex.parse(TINY + ["--strategy", s, "--clip", "0", "--no-eval"]))
                 for s in ex.STRATEGIES[:2]}
    once = {s: ex.run(ex.parse(TINY + ["--strategy", s, "--accum", "1", "--steps", "10", "--no-eval"]))
            for s in ex.STRATEGIES[1:5]}
    if torch.distributed.get_rank() != 0:
        return check_gather(ex)
    worst = 0.0
    for s, r, ref in [(s, r, rows["accelerate"]) for s, r in rows.items()] + \
            [("zeroshard_stage_0 unclipped", unclipped["zeroshard_stage_0"], unclipped["accelerate"])]:
        diff = max(abs(x - y) for x, y in zip(r["losses"], ref["losses"]))
        worst = max(worst, diff)
        if len(r["losses"]) != 20 or diff > LOSS_TOL:
            fail(f"{s}: losses differ from Accelerate's by {diff:.3g} (> {LOSS_TOL}): {r['losses']}")
    hashes = {s: r["params_hash"] for s, r in once.items()}
    if len(set(hashes.values())) != 1:
        fail(f"ZeroShard stages 0-3 without accumulation give different params-hashes: {hashes}")
    # under accumulation stages 0-1 sum the micro-batches' gradients and reduce the sum, stages 2-3 reduce each
    # micro-batch's into the partition and sum those: two summation orders, one params-hash each
    accum = [rows[f"zeroshard_stage_{i}"]["params_hash"] for i in range(4)]
    if accum[0] != accum[1] or accum[2] != accum[3]:
        fail(f"under accumulation stages 0/1 or 2/3 give different params-hashes: {accum}")
    if max(abs(x - y) for x, y in zip(unclipped["zeroshard_stage_0"]["losses"],
                                      rows["zeroshard_stage_0"]["losses"])) < 1e-3:
        fail("clipping at 0.1 does not change the losses: the parity does not cover clipping")
    ones = ex.fortunes.datasets(ex.parse(TINY))[1].labels.float().mean().item()
    majority = max(ones, 1 - ones)
    for s, r in rows.items():
        if not r["test_acc"] > majority + 0.05:
            fail(f"{s}: test accuracy {r['test_acc']:.3f} is not above the majority class's {majority:.3f}")
    check_gather(ex)
    accs = ", ".join("%.3f" % r["test_acc"] for r in rows.values())
    print(f"fw_accelerate parity: passed (losses within {worst:.2g} of Accelerate's; stages 0-3 one params-hash "
          f"without accumulation, 0-1 and 2-3 one each with it; accuracy {accs}, majority class {majority:.3f})")


def check_gather(ex):
    """The test split through a prepared loader: gather_for_metrics drops the copies the last batch is padded
    with, so every fortune is counted once."""
    from zeroshard.accelerate import Accelerator
    acc = Accelerator()
    test = ex.fortunes.datasets(ex.parse(TINY))[1]
    loader = acc.prepare(torch.utils.data.DataLoader(test, batch_size=8))
    seen = []
    for batch in loader:
        seen.append(acc.gather_for_metrics(batch["labels"]))
    seen = torch.cat(seen)
    if len(seen) != len(test) or int(seen.sum()) != int(test.labels.sum()):
        fail(f"gather_for_metrics saw {len(seen)} fortunes ({int(seen.sum())} of label 1), the split has "
             f"{len(test)} ({int(test.labels.sum())})")


def mode_resume(d):
    full = json.load(open(os.path.join(d, "full.json")))
    resumed = json.load(open(os.path.join(d, "resumed.json")))
    if full["losses"] != resumed["losses"] or full["params_hash"] != resumed["params_hash"]:
        fail(f"resumed run differs: losses {full['losses']} vs {resumed['losses']}, params-hash "
             f"{full['params_hash']} vs {resumed['params_hash']}")
    print(f"fw_accelerate resume: passed (load_state after step 16, stage 3: steps 17-20 and params-hash "
          f"{full['params_hash']} bit-identical)")


# ---------------------------------------------------------------------------------------------- misuse
def model_and_optimizer(loader=True):
    """A small model, its optimizer and (what gives the micro-batch) a data loader."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(3, 4)), batch_size=1)
    return (model, torch.optim.AdamW(model.parameters(), lr=1e-3)) + ((data,) if loader else ())


def raises(what, fn, *words):
    try:
        fn()
    except (NotImplementedError, ValueError, RuntimeError) as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            fail(f"{what}: the error does not name {missing}: {e}")
        return
    fail(f"{what}: no error")


def stage_of(**kw):
    from zeroshard.accelerate import Accelerator
    acc = Accelerator(**kw)
    engine, _, _ = acc.prepare(*model_and_optimizer())
    stage = engine.zero_optimization_stage()
    acc.free_memory()
    return stage


def check_sources(d):
    import accelerate
    if stage_of() != 2:
        fail("no ZeRO config: the default is not stage 2")
    if stage_of(zeroshard_config={"zero_optimization": {"stage": 3}}) != 3:
        fail("zeroshard_config's stage not taken")
    with open(os.path.join(d, "ds.json"), "w") as f:
        json.dump({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto"}, f)
    with open(os.path.join(d, "acc.yaml"), "w") as f:
        f.write("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n")
    if stage_of(zeroshard_config=os.path.join(d, "acc.yaml")) != 1:
        fail("the Accelerate YAML's deepspeed_config_file not taken")
    plugin = accelerate.DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}})
    if stage_of(deepspeed_plugin=plugin) != 3:
        fail("DeepSpeedPlugin(hf_ds_config=...) not taken")
    os.environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = os.path.join(d, "ds.json")
    try:
        if stage_of() != 1:
            fail("ACCELERATE_DEEPSPEED_CONFIG_FILE not taken")
    finally:
        del os.environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"]


def check_refusals():
    import accelerate
    from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, GradientAccumulationPlugin
    from zeroshard.accelerate import Accelerator
    for kw, word in (({"fsdp_plugin": object()}, "fsdp_plugin"), ({"log_with": "tensorboard"}, "log_with"),
                     ({"dynamo_backend": "inductor"}, "dynamo_backend"), ({"mixed_precision": "fp8"}, "fp8"),
                     ({"kwargs_handlers": [DistributedDataParallelKwargs()]}, "kwargs_handlers"),
                     ({"dataloader_config": DataLoaderConfiguration(split_batches=True)}, "split_batches"),
                     ({"zeroshard_config": {"zeroshard": {"device": "cuda"}}}, "zeroshard.device")):
        raises(f"Accelerator({word})", lambda: Accelerator(**kw).prepare(*model_and_optimizer()), word)
    for var, value in (("ACCELERATE_USE_FSDP", "true"), ("ACCELERATE_TORCH_DEVICE", "cuda")):
        os.environ[var] = value
        raises(var, Accelerator, var)
        del os.environ[var]
    raises("two configs", lambda: Accelerator(zeroshard_config={}, deepspeed_plugin=accelerate.DeepSpeedPlugin()),
           "zeroshard_config", "deepspeed_plugin")

    acc = Accelerator(zeroshard_config={"gradient_clipping": 1.0},
                      gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    model, opt = model_and_optimizer(loader=False)
    raises("model alone", lambda: acc.prepare(model), "without its optimizer")
    raises("no micro-batch", lambda: acc.prepare(model, opt), "train_micro_batch_size_per_gpu")
    engine, opt, loader = acc.prepare(*model_and_optimizer())
    raises("second model", lambda: acc.prepare(*model_and_optimizer()), "a second model")
    for name in ("init_trackers", "log", "prepare_model"):
        raises(f"accelerator.{name}", lambda: getattr(acc, name), name)
    raises("no_sync", lambda: acc.no_sync(engine), "no_sync")
    params = list(engine.parameters())
    raises("clip_grad_value_", lambda: acc.clip_grad_value_(params, 1.0), "clip_grad_value_")
    raises("clip_grad_norm_ other value", lambda: acc.clip_grad_norm_(params, 0.5), "gradient_clipping")
    raises("clip_grad_norm_ norm_type", lambda: acc.clip_grad_norm_(params, 1.0, norm_type=1), "norm_type")
    raises("clip_grad_norm_ subset", lambda: acc.clip_grad_norm_(params[:1], 1.0), "clip_grad_norm_")
    raises("gather_object", lambda: acc.gather_for_metrics([1], use_gather_object=True), "use_gather_object")
    raises("optimizer.step(closure)", lambda: opt.step(lambda: 0), "closure")
    raises("backward(inputs=)", lambda: acc.backward(engine(torch.ones(1, 4)).sum(), inputs=params), "inputs")
    raises("save_state()", lambda: acc.save_state(), "output_dir")
    # an accumulation cut short by the loader's end (3 micro-batches, accumulation 2, sync_with_dataloader)

    def epoch():
        for (x,) in loader:
            with acc.accumulate(engine):
                acc.backward(engine(x).sum())
                opt.step()
    raises("sync_with_dataloader", epoch, "sync_with_dataloader")
    acc.free_memory()
    raises("config optimizer and client optimizer", lambda: Accelerator(
        zeroshard_config={"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}).prepare(*model_and_optimizer()),
        "client optimizer")


def check_clip_norm():
    """clip_grad_norm_ returns this step's gradient norm before clipping, as torch's does."""
    import copy
    from zeroshard.accelerate import Accelerator
    acc = Accelerator(zeroshard_config={"gradient_clipping": 1.0})
    model, opt, data = model_and_optimizer()
    twin = copy.deepcopy(model)
    engine, opt, data = acc.prepare(model, opt, data)
    x = torch.arange(8.0).reshape(2, 4)
    acc.backward(engine(x).square().sum())
    got = float(acc.clip_grad_norm_(engine.parameters(), 1.0))
    opt.step()
    acc.free_memory()
    twin(x).square().sum().backward()
    want = float(torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0))
    if not abs(got - want) <= 1e-5 * want:
        fail(f"clip_grad_norm_ returned {got}, torch's norm of the same gradients is {want}")


def mode_misuse():
    with tempfile.TemporaryDirectory() as d:
        check_sources(d)
    check_refusals()
    check_clip_norm()
    print("fw_accelerate misuse: passed (the config's four sources; each unsupported request named; "
          "clip_grad_norm_'s norm)")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "parity":
        mode_parity()
    elif mode == "resume":
        mode_resume(sys.argv[2])
    elif mode == "misuse":
        mode_misuse()
    else:
        fail(f"unknown mode {mode}")
