"""fw_hf.py MODE DIR - the Hugging Face Trainer on ZeroShard (zeroshard.hf.Trainer), through the walk-through
examples/pytorch/fortunes_hf.py, at tiny settings (fw_hf.sh runs it under mpirun).

  parity  the plain Trainer (DDP over gloo) and ZeroShard stages 0-3, the same 20 steps at accumulation 2 with
          clipping: losses agree with the Trainer's within LOSS_TOL; stages 0-1 one params-hash and 2-3 one;
          accuracy above the majority class
  ckpt    stage 3 with save_steps: resume_from_checkpoint from checkpoint-10 ends on the uninterrupted run's
          params-hash and losses; save_model's model.safetensors + config.json loads with from_pretrained
          and gives the trained model's logits; a peft LoRA fine-tune (stage 2) leaves the base bit-identical,
          trains the adapters and lowers the loss
  misuse  (one process) each refused TrainingArguments, and a config contradicting them, raise naming it;
          the config's own optimizer and scheduler sections, all "auto", run with the Trainer's decay groups
Every mode: the deepspeed package is never imported.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "examples", "pytorch"))
import fortunes_hf  # noqa: E402  (imports zeroshard.hf on use)

# losses of the plain Trainer against ZeroShard's, per step: the parameters differ only by the rounding of the
# ranks' reduction and of the accumulation (DDP's against ZeroShard's); measured at most 2.4e-7 apart (on
# losses near 2.77) over the 20 steps at every stage
LOSS_TOL = 1e-5
MAJORITY = 0.5404   # the test split's larger class
TINY = ["--dim", "64", "--layers", "1", "--heads", "4", "--seq", "48", "--micro-batch", "8", "--accum", "2",
        "--lr", "5e-3", "--warmup", "3", "--clip", "1.0", "--steps", "20"]


def fail(msg):
    """Exits at once: mpirun then stops the other ranks rather than leaving them in their next collective."""
    print(f"fw_hf: FAIL: {msg}", flush=True)
    sys.stderr.flush()
    os._exit(1)


def rank0():
    import torch.distributed as dist
    return not dist.is_initialized() or dist.get_rank() == 0


def run(*argv, started=0):
    """One training of the example, which must start at step `started`; the engine (if any) is ended at once,
    on every rank together."""
    trainer, row = fortunes_hf.main(list(TINY) + list(argv))
    if trainer._initial_global_step != started:
        fail(f"{argv}: training started at step {trainer._initial_global_step}, not {started}")
    if getattr(trainer, "engine", None) is not None:
        trainer.engine.destroy()
    return row


def no_deepspeed():
    if "deepspeed" in sys.modules:
        fail("the deepspeed package was imported")


def mode_parity(_tmp):
    rows = {s: run("--strategy", s) for s in [f"zeroshard_stage_{n}" for n in range(4)]}
    once = {s: run("--strategy", s, "--accum", "1", "--no-eval") for s in ("zeroshard_stage_0", "zeroshard_stage_3")}
    no_deepspeed()   # before the plain Trainer, which imports it (Accelerate's unwrapping, when installed)
    rows["trainer"] = run("--strategy", "trainer")
    if not rank0():
        return
    ref = rows.pop("trainer")
    for s, r in rows.items():
        diff = max(abs(x - y) for x, y in zip(r["losses"], ref["losses"]))
        if len(r["losses"]) != len(ref["losses"]) or diff > LOSS_TOL:
            fail(f"{s}: losses {r['losses']} against the Trainer's {ref['losses']} (max diff {diff:.2e})")
        print(f"fw_hf parity: {s}: losses within {diff:.1e} of the Trainer's, accuracy {r['test_acc']:.3f}, "
              f"params {r['params_hash']}")
        if r["test_acc"] is None or r["test_acc"] <= MAJORITY:
            fail(f"{s}: test accuracy {r['test_acc']} is not above the majority class {MAJORITY}")
    # Under accumulation stages 0-1 share one params-hash and stages 2-3 another: at 0-1 autograd accumulates
    # the micro-batches' gradients in the gradient buffer itself, at 2-3 each micro-batch's are added into its
    # bucket slot once complete, which rounds differently (at accumulation 1 all four share one: stages 0 and 3
    # are checked)
    h = {s: r["params_hash"] for s, r in rows.items()}
    if h["zeroshard_stage_0"] != h["zeroshard_stage_1"] or h["zeroshard_stage_2"] != h["zeroshard_stage_3"]:
        fail(f"params-hashes {h}: stages 0 and 1, and stages 2 and 3, should each share one")
    if len({r["params_hash"] for r in once.values()}) != 1:
        fail(f"at accumulation 1 stages 0 and 3 end with different parameters: "
             f"{ {s: r['params_hash'] for s, r in once.items()} }")
    print(f"fw_hf parity: passed (stages 0-1 one params-hash, 2-3 one, the Trainer's accuracy {ref['test_acc']:.3f})")


def mode_ckpt(tmp):
    import torch
    save = ["--strategy", "zeroshard_stage_3", "--save-dir", os.path.join(tmp, "run"), "--save-at", "10"]
    full = run(*save)
    resumed = run(*save, "--resume", started=10)
    if rank0():
        # the resumed Trainer's log history holds the checkpoint's first 10 steps, then its own
        if resumed["params_hash"] != full["params_hash"] or resumed["losses"] != full["losses"]:
            fail(f"resumed at step 10: params {resumed['params_hash']} losses {resumed['losses'][10:]}; "
                 f"uninterrupted: params {full['params_hash']} losses {full['losses'][10:]}")
        print(f"fw_hf ckpt: resume_from_checkpoint(checkpoint-10) ends bit-exactly (params {full['params_hash']})")
    saved_logits(tmp, torch)
    lora(torch)
    no_deepspeed()
    if rank0():
        print("fw_hf ckpt: passed")


def saved_logits(tmp, torch):
    """save_model at stage 3 (every rank gathers), from_pretrained on rank 0: the same logits."""
    from transformers import AutoModelForSequenceClassification
    trainer, _ = fortunes_hf.main(TINY + ["--strategy", "zeroshard_stage_3", "--no-eval"])
    out = os.path.join(tmp, "model")
    trainer.save_model(out)
    batch = trainer.eval_dataset[:16]
    trainer.engine.eval()
    with torch.no_grad():
        want = trainer.engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    trainer.engine.destroy()
    if not rank0():
        return
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        fail(f"save_model wrote {sorted(os.listdir(out))}, no model.safetensors")
    back = AutoModelForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        got = back(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    if not torch.equal(got, want):
        fail(f"from_pretrained's logits differ from the trained model's by {(got - want).abs().max():.3g}")
    print("fw_hf ckpt: save_model -> from_pretrained gives the trained model's logits bit for bit")


def lora(torch):
    trainer, row = fortunes_hf.main(TINY + ["--strategy", "zeroshard_stage_2", "--lora", "--no-eval"])
    from zeroshard.utils import safe_get_full_fp32_param
    named = list(trainer.model.named_parameters())
    after = {n: safe_get_full_fp32_param(p) for n, p in named}
    trainer.engine.destroy()
    if not rank0():
        return
    a = fortunes_hf.fortunes.parser("").parse_args(TINY + ["--lora"])
    _, _, vocab = fortunes_hf.fortunes.datasets(a)
    before = dict(fortunes_hf.fortunes.build_model(a, len(vocab)).named_parameters())
    frozen = [n for n, p in named if not p.requires_grad]
    adapters = [n for n, p in named if p.requires_grad and "lora_" in n]
    changed = [n for n in frozen if not torch.equal(after[n], before[n].detach())]
    still = [n for n in adapters if "lora_B" in n and torch.equal(after[n], before[n].detach())]
    if not frozen or changed:
        fail(f"LoRA: frozen base parameters changed: {changed[:4]}")
    if not adapters or still:
        fail(f"LoRA: adapters not trained: {still[:4]} (of {len(adapters)})")
    first, last = sum(row["losses"][:4]) / 4, sum(row["losses"][-4:]) / 4
    if not last < first:
        fail(f"LoRA: loss did not fall ({first:.4f} -> {last:.4f})")
    print(f"fw_hf ckpt: LoRA: {len(frozen)} base tensors bit-identical, {len(adapters)} adapters trained, "
          f"loss {first:.4f} -> {last:.4f}")


def expect(what, needle, fn):
    try:
        fn()
    except (NotImplementedError, ValueError) as e:
        if needle not in str(e):
            fail(f"{what}: the error does not name '{needle}': {e}")
        print(f"fw_hf misuse: {what}: {type(e).__name__}: {e}")
        return
    fail(f"{what}: no error")


def mode_misuse(tmp):
    import torch
    from transformers import TrainingArguments
    from zeroshard.hf import Trainer
    model = torch.nn.Linear(2, 2)

    def with_arg(name, value):
        def build():
            args = TrainingArguments(output_dir=tmp, use_cpu=True, report_to=[], max_steps=1)
            setattr(args, name, value)   # set after construction: TrainingArguments acts on some of them itself
            Trainer(model=model, args=args)
        return build

    for name, value in (("deepspeed", "ds_config.json"), ("fsdp", ["full_shard"]), ("torch_compile", True),
                        ("use_cpu", False), ("auto_find_batch_size", True), ("load_best_model_at_end", True),
                        ("push_to_hub", True), ("bf16_full_eval", True)):
        expect(f"TrainingArguments({name}={value!r})", name, with_arg(name, value))

    a = fortunes_hf.fortunes.parser("").parse_args(TINY)
    train, _, vocab = fortunes_hf.fortunes.datasets(a)

    def train_with(config, **kw):
        def go():
            args = TrainingArguments(**{"output_dir": tmp, "use_cpu": True, "report_to": [], "max_steps": 1,
                                        "per_device_train_batch_size": 8, **kw})
            Trainer(model=fortunes_hf.fortunes.build_model(a, len(vocab)), args=args, train_dataset=train,
                    zeroshard_config=config).train()
        return go

    expect("a config's micro-batch against per_device_train_batch_size", "train_micro_batch_size_per_gpu",
           train_with({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}))
    expect("a config's gradient_clipping against max_grad_norm", "gradient_clipping",
           train_with({"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5}))
    expect("a config's bf16 section against bf16=False", "bf16.enabled",
           train_with({"zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}))
    expect("training across an epoch end the accumulation does not divide", "gradient_accumulation_steps",
           train_with(None, per_device_train_batch_size=9, gradient_accumulation_steps=2, max_steps=200))
    config_sections(tmp, a, train, vocab)
    no_deepspeed()
    print("fw_hf misuse: passed")


def config_sections(tmp, a, train, vocab):
    """The config's optimizer and scheduler, all "auto": the Trainer's decay groups kept, the learning rate
    the config schedule's (warm-up to the Trainer's learning_rate, then down)."""
    from transformers import TrainingArguments
    from zeroshard.hf import Trainer
    auto = {"zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {k: "auto" for k in ("lr", "betas", "eps", "weight_decay")}},
            "scheduler": {"type": "WarmupDecayLR", "params": {k: "auto" for k in (
                "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")}}}
    args = TrainingArguments(output_dir=tmp, use_cpu=True, report_to=[], max_steps=6, warmup_steps=3,
                             learning_rate=1e-3, weight_decay=0.05, per_device_train_batch_size=8,
                             logging_steps=1, disable_tqdm=True)
    trainer = Trainer(model=fortunes_hf.fortunes.build_model(a, len(vocab)), args=args, train_dataset=train,
                      zeroshard_config=auto)
    trainer.train()
    lrs = [r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r]
    decays = [g["weight_decay"] for g in trainer.engine.optimizer.param_groups]
    trainer.engine.destroy()
    if decays != [0.05, 0.0]:
        fail(f"the config's optimizer: param_groups' weight decays {decays}, not the Trainer's [0.05, 0.0]")
    peak = lrs.index(max(lrs))
    if abs(max(lrs) - 1e-3) > 1e-9 or lrs[:peak] != sorted(lrs[:peak]) or lrs[peak:] != sorted(lrs[peak:])[::-1]:
        fail(f"the config's WarmupDecayLR: learning rates {lrs} do not rise to 1e-3 and fall")
    print(f"fw_hf misuse: the config's optimizer and scheduler run: weight decays {decays}, learning rates "
          f"{['%.2g' % x for x in lrs]}")


MODES = {"parity": mode_parity, "ckpt": mode_ckpt, "misuse": mode_misuse}

if __name__ == "__main__":
    MODES[sys.argv[1]](sys.argv[2])
