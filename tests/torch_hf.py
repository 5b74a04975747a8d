"""torch_hf.py - Hugging Face models (transformers and peft, built from configs: no hub) trained through
`import zeroshard as deepspeed` the way fine-tuning scripts drive DeepSpeed, each against the same model and
optimizer in one plain PyTorch process on the same global batches. torch_hf.sh runs it under mpirun.

Modes (rank 0 prints the verdict; exit 1 on a mismatch, 77 when transformers or peft cannot be imported):
  distilbert   2 ranks: DistilBERT sequence classification, embeddings frozen, model_parameters= the
               trainable tensors, optimizer from the config; stages 0-3 x offload none/cpu.
  lora         2 ranks: peft LoRA adapters (r 4 on c_attn) on a frozen GPT-2; no model_parameters.
  trainer      2 ranks: GPT-2 (tied head) with the Trainer's weight-decay groups, a client torch.optim.AdamW
               and transformers.get_linear_schedule_with_warmup; accumulation 4 the Trainer's way (loss / 4,
               engine.backward(loss, scale_wrt_gas=False)).
  accelerate   the same with accumulation driven Accelerate's way (set_gradient_accumulation_boundary before
               each backward, engine.step() after each).
  actckpt      2 ranks: GPT-2 with activation checkpointing (the model's own, reentrant and not) at stage 3,
               and stage 0 without, one params-hash.
  resume-save DIR / resume-load DIR   2 ranks train 20 steps saving at 10 with tag "checkpoint"; then 3
               ranks train 3 steps of their own, load that checkpoint mid-training and finish the 20.
               resume-hf-save / resume-hf-load: the same with groups, a frozen tensor, a client optimizer
               and scheduler (whose state must come back too).
  misuse       1 rank: an unknown optimizer class, a parameter in two groups, a frozen parameter given to
               the optimizer, a tag with a slash (after a safe tag is taken): each refused, naming it.

Every run of a sweep must give the same fp32 parameters bit for bit (one params-hash: sha256 of the
gathered parameters; with accumulation one for stages 0-1 and one for 2-3, see sweep), frozen tensors their
initial bits, and the parameters must match PyTorch within TOL,
max |diff| / max |param|. Both sides compute in fp32 with different summation orders (the ranks' reduction,
BLAS blocking); Adam divides by sqrt(v) + eps, which turns that noise in tiny gradients into whole steps:
two PyTorch runs differing only in the batch's split measured 8e-6 at eps 1e-8 and 3e-7 at eps 1e-6 (lr
1e-3, 20 steps), hence eps 1e-6 here and TOL 1e-5.
"""
import hashlib
import os
import sys

try:
    import torch
    import transformers
    from transformers import (DistilBertConfig, DistilBertForSequenceClassification, GPT2Config,
                              GPT2LMHeadModel, get_linear_schedule_with_warmup)
except ImportError as e:
    print(f"torch_hf: SKIP: torch and transformers cannot be imported ({e}); bash tools/setup_tests.sh installs them")
    sys.exit(77)

import zeroshard
from zeroshard.zero import GatheredParameters

transformers.logging.set_verbosity_error()
TOL = 1e-5
STEPS = 20
LR, EPS, BETAS, WD = 1e-3, 1e-6, (0.9, 0.95), 0.01
SEQ = 16
FAILED = []
RANK = 0


def fail(msg):
    FAILED.append(msg)
    print(f"torch_hf: FAIL: {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- models
def gpt2(frozen=()):
    torch.manual_seed(5)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    for n, p in m.named_parameters():
        if n in frozen:
            p.requires_grad_(False)
    return m


def distilbert():
    torch.manual_seed(6)
    m = DistilBertForSequenceClassification(DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                                             vocab_size=256, max_position_embeddings=64,
                                                             dropout=0.0, attention_dropout=0.0,
                                                             seq_classif_dropout=0.0, num_labels=2))
    m.distilbert.embeddings.requires_grad_(False)
    return m


def lora():
    from peft import LoraConfig, get_peft_model
    m = gpt2()
    torch.manual_seed(7)
    return get_peft_model(m, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"],
                                        fan_in_fan_out=True))


def lm_batch(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 256, (n, SEQ), generator=g)
    return {"input_ids": x, "labels": x}


def cls_batch(step, n):
    g = torch.Generator().manual_seed(2000 + step)
    x = torch.randint(0, 256, (n, SEQ), generator=g)
    return {"input_ids": x, "labels": (x[:, 0] + x[:, -1]) % 2}


def piece(batch, lo, hi):
    return {k: v[lo:hi] for k, v in batch.items()}


def decay_groups(model, params=None):
    """The Hugging Face Trainer's groups: weight decay for everything but biases and LayerNorm weights"""
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if n in decay], "weight_decay": 0.1},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]


def client_optimizer(model):
    opt = torch.optim.AdamW(decay_groups(model), lr=LR, betas=BETAS, eps=EPS)
    return opt, get_linear_schedule_with_warmup(opt, num_warmup_steps=5, num_training_steps=STEPS)


# ---------------------------------------------------------------------------------------------- configs
def config(stage, offload=None, micro=4, accum=1, optimizer=True):
    z = {"stage": stage, "reduce_bucket_size": 20000, "stage3_param_persistence_threshold": 0}
    if offload:
        z["offload_optimizer"] = {"device": offload}
    c = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
         "gradient_clipping": 1.0, "steps_per_print": 0, "zero_optimization": z}
    if optimizer:
        c["optimizer"] = {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                      "weight_decay": WD}}
    return c


SWEEP = [("stage 0", 0, None)] + [(f"stage {s}{' offload cpu' if o else ''}", s, o)
                                    for s in (1, 2, 3) for o in (None, "cpu")]


# ---------------------------------------------------------------------------------------------- runs
def full_params(engine_or_model):
    """name -> fp32 tensor, every parameter (frozen ones too), gathered at stage 3"""
    m = getattr(engine_or_model, "module", engine_or_model)
    named = list(m.named_parameters())
    with GatheredParameters([p for _, p in named]):
        return {n: p.detach().float().clone() for n, p in named}


def params_hash(params):
    h = hashlib.sha256()
    for n in sorted(params):
        h.update(n.encode())
        h.update(params[n].contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def train_steps(engine, data, start, stop, way="plain"):
    """DeepSpeed's loop: each rank its slice of the step's global batch; `way` is how the script drives
    accumulation (plain: engine.backward(loss), the engine dividing by the accumulation steps)"""
    r, w = engine.global_rank, engine.world_size
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    for s in range(start, stop):
        batch = data(s, micro * w * accum)
        for m in range(accum):
            lo = (m * w + r) * micro
            if way == "accelerate":
                engine.set_gradient_accumulation_boundary(m == accum - 1)
            loss = engine(**piece(batch, lo, lo + micro)).loss
            if way == "trainer":
                engine.backward(loss / accum, scale_wrt_gas=False)
            else:
                engine.backward(loss)
            engine.step()


def run_zs(build, data, cfg, model_parameters=None, client=False, way="plain", steps=STEPS):
    model = build()
    kw = {}
    if model_parameters is not None:
        kw["model_parameters"] = model_parameters(model)
    if client:
        kw["optimizer"], kw["lr_scheduler"] = client_optimizer(model)
    engine, _, _, _ = zeroshard.initialize(model=model, config=cfg, **kw)
    global RANK
    RANK = engine.global_rank
    train_steps(engine, data, 0, steps, way)
    out = full_params(engine)
    engine.destroy()
    return out


def run_torch(build, data, global_n, client=False, steps=STEPS, activation_ckpt=False):
    """One process, the whole global batch at once (its mean loss is the mean of the ranks' micro-batch
    means), torch.optim.AdamW over the trainable tensors, clipping as the config's gradient_clipping"""
    model = build()
    if activation_ckpt:
        model.activation_checkpointing_enable()
    if client:
        opt, sched = client_optimizer(model)
    else:
        opt, sched = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, betas=BETAS,
                                       eps=EPS, weight_decay=WD), None
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        model(**data(s, global_n)).loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        if sched:
            sched.step()
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def compare(name, got, ref, init=None, against="PyTorch"):
    """TOL against the reference; frozen tensors (init given) must keep their initial bits"""
    if set(got) != set(ref):
        fail(f"{name}: parameter names differ from {against}'s: {sorted(set(got) ^ set(ref))[:4]}")
        return
    scale = max(t.abs().max().item() for t in ref.values())
    worst = max(((got[n] - ref[n]).abs().max().item(), n) for n in ref)
    rel = worst[0] / scale
    print(f"{name}: max |param - {against}| / max |param| = {rel:.2e} (at '{worst[1]}', limit {TOL:.0e})")
    if not rel < TOL:
        fail(f"{name}: {rel:.2e} from {against} at '{worst[1]}' (limit {TOL:.0e})")
    for n, t in (init or {}).items():
        if not torch.equal(got[n], t):
            fail(f"{name}: frozen '{n}' changed in training")


def sweep(title, build, data, runs, global_n, client=False, model_parameters=None, way="plain", accum=1,
          activation_ckpt=False):
    """runs: (label, cfg) trained in turn; all must share one params-hash and match PyTorch. With
    accumulation, stages 0-1 sum the micro-batches' gradients before the ranks' reduction and stages 2-3
    after it (each micro-batch reduced as it is handed over), so each side rounds its own way: one
    params-hash per side then, both within TOL of PyTorch."""
    results, side = {}, {}
    for label, cfg in runs:
        results[label] = run_zs(build, data, cfg, model_parameters, client, way)
        side[label] = cfg["zero_optimization"]["stage"] >= 2 if accum > 1 else False
    if RANK != 0:
        return
    hashes = {label: params_hash(p) for label, p in results.items()}
    for label, h in hashes.items():
        print(f"{title}: {label:24s} params-hash {h}")
    for s in sorted(set(side.values())):
        mine = {hashes[label] for label in hashes if side[label] == s}
        if len(mine) != 1:
            who = "the runs" if accum == 1 else f"stages {'2-3' if s else '0-1'}"
            fail(f"{title}: {who} give {len(mine)} different params-hashes")
    model = build()
    frozen = {n: p.detach().float().clone() for n, p in model.named_parameters() if not p.requires_grad}
    print(f"{title}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{sum(p.numel() for p in model.parameters() if not p.requires_grad)} frozen; PyTorch reference...",
          flush=True)
    ref = run_torch(build, data, global_n, client, activation_ckpt=activation_ckpt)
    for s in sorted(set(side.values())):
        first = next(label for label in results if side[label] == s)
        compare(f"{title}: {first}", results[first], ref, frozen)


def sweep_runs(**kw):
    return [(label, config(st, off, **kw)) for label, st, off in SWEEP]


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


# ---------------------------------------------------------------------------------------------- modes
def mode_distilbert(_):
    sweep("distilbert frozen embeddings", distilbert, cls_batch, sweep_runs(), 8, model_parameters=trainable)


def mode_lora(_):
    sweep("gpt2 lora", lora, lm_batch, sweep_runs(), 8)


def accum_runs():
    return sweep_runs(micro=2, accum=4, optimizer=False)


def mode_trainer(_):
    sweep("gpt2 groups+client AdamW, accumulation 4, Trainer", gpt2, lm_batch,
          accum_runs(), 16, client=True, way="trainer", accum=4)


def mode_accelerate(_):
    sweep("gpt2 groups+client AdamW, accumulation 4, Accelerate", gpt2, lm_batch,
          accum_runs(), 16, client=True, way="accelerate", accum=4)


def checkpointed(reentrant):
    def build():
        m = gpt2()
        m.activation_checkpointing_enable({"use_reentrant": reentrant})
        return m
    return build


def mode_actckpt(_):
    # stage 0 without checkpointing is the baseline the checkpointed stage-3 runs must reproduce bit for bit
    results = {"stage 0": run_zs(gpt2, lm_batch, config(0))}
    for reentrant in (False, True):
        for off in (None, "cpu"):
            label = f"stage 3{' offload cpu' if off else ''} reentrant={reentrant}"
            results[label] = run_zs(checkpointed(reentrant), lm_batch, config(3, off))
    if RANK != 0:
        return
    hashes = {label: params_hash(p) for label, p in results.items()}
    for label, h in hashes.items():
        print(f"gpt2 activation checkpointing: {label:32s} params-hash {h}")
    if len(set(hashes.values())) != 1:
        fail("gpt2 activation checkpointing: stage 3 with checkpointing differs from stage 0 without")
    compare("gpt2 activation checkpointing: stage 3", results["stage 3 reentrant=False"],
            run_torch(gpt2, lm_batch, 8, activation_ckpt=True))


# Resuming: 2 ranks x micro 3 and 3 ranks x micro 2 both take global batches of 6
SAVE_AT, OWN = 10, 3


def resume_build(hf):
    return (lambda: gpt2(frozen=("transformer.wpe.weight",))) if hf else gpt2


def resume_init(hf, micro, stage):
    model = resume_build(hf)()
    kw = {}
    if hf:
        kw["optimizer"], kw["lr_scheduler"] = client_optimizer(model)
    cfg = config(stage, micro=micro, optimizer=not hf)
    engine, opt, _, sched = zeroshard.initialize(model=model, config=cfg, **kw)
    global RANK
    RANK = engine.global_rank
    return engine, sched


def mode_resume_save(args, hf=False):
    d = args[0]
    engine, _ = resume_init(hf, 3, 3)
    train_steps(engine, lm_batch, 0, SAVE_AT)
    engine.save_checkpoint(d, tag="checkpoint")
    train_steps(engine, lm_batch, SAVE_AT, STEPS)
    out = full_params(engine)
    engine.destroy()
    if RANK == 0:
        torch.save(out, os.path.join(d, "uninterrupted.pt"))
        print(f"resume: 2 ranks, stage 3: saved tag 'checkpoint' at step {SAVE_AT}, trained on to {STEPS}; "
              f"params-hash {params_hash(out)}")


def mode_resume_load(args, hf=False):
    d = args[0]
    engine, sched = resume_init(hf, 2, 2)
    # its own steps first (other batches): the load must replace everything they changed
    train_steps(engine, lambda s, n: lm_batch(500 + s, n), 0, OWN)
    path, _ = engine.load_checkpoint(d, tag="checkpoint")
    if path is None or os.path.basename(os.path.normpath(path)) != "checkpoint":
        fail(f"resume: load_checkpoint(tag='checkpoint') returned {path!r}")
    if engine.global_steps != SAVE_AT:
        fail(f"resume: global_steps {engine.global_steps} after the load, expected {SAVE_AT}")
    if hf:   # linear decay from step 5 to 20: at step 10 the lr is 10/15 of the peak
        want = LR * (STEPS - SAVE_AT) / (STEPS - 5)
        got = sched.get_last_lr()[0]
        if abs(got - want) > 1e-12:
            fail(f"resume: the scheduler's lr is {got} after the load, expected {want} (its state not restored)")
    train_steps(engine, lm_batch, SAVE_AT, STEPS)
    out = full_params(engine)
    engine.destroy()
    if RANK != 0:
        return
    full = torch.load(os.path.join(d, "uninterrupted.pt"))
    print(f"resume: 3 ranks, stage 2: trained {OWN} steps, loaded step {SAVE_AT}, trained to {STEPS}; "
          f"params-hash {params_hash(out)}")
    build = resume_build(hf)
    frozen = {n: p.detach().float().clone() for n, p in build().named_parameters() if not p.requires_grad}
    compare("resume", out, full, frozen, against="the uninterrupted 2-rank run")
    compare("resume", out, run_torch(build, lm_batch, 6, client=hf))


def expect_error(what, fn, *needles):
    try:
        fn()
    except Exception as e:   # the error's type is the front end's choice; its text must name the culprit
        text = str(e)
        missing = [n for n in needles if n.lower() not in text.lower()]
        if missing:
            fail(f"misuse {what}: the error does not name {missing}: {type(e).__name__}: {text}")
        else:
            print(f"misuse {what}: refused: {type(e).__name__}: {text}")
        return
    fail(f"misuse {what}: accepted")


def mode_misuse(args):
    import tempfile

    def unknown_optimizer():
        m = gpt2()
        zeroshard.initialize(model=m, optimizer=torch.optim.RMSprop(m.parameters(), lr=LR),
                             config=config(0, optimizer=False))

    def twice():
        m = gpt2()
        ln = m.transformer.ln_f.weight
        groups = [{"params": list(m.parameters())}, {"params": [ln], "weight_decay": 0.0}]
        zeroshard.initialize(model=m, model_parameters=groups, config=config(0))

    def frozen_given():
        m = gpt2(frozen=("transformer.wpe.weight",))
        zeroshard.initialize(model=m, optimizer=torch.optim.AdamW(m.parameters(), lr=LR),
                             config=config(0, optimizer=False))

    def slash_tag():
        engine, _, _, _ = zeroshard.initialize(model=gpt2(), config=config(0, micro=2))
        try:
            train_steps(engine, lm_batch, 0, 1)
            with tempfile.TemporaryDirectory() as d:
                engine.save_checkpoint(d, tag="run-1")   # a safe name is taken: the refusal is the slash's
                engine.save_checkpoint(d, tag="run/1")
        finally:
            engine.destroy()

    expect_error("unknown optimizer class", unknown_optimizer, "RMSprop")
    expect_error("a parameter in two groups", twice, "transformer.ln_f.weight")
    expect_error("a frozen parameter given to the optimizer", frozen_given, "transformer.wpe.weight")
    expect_error("a checkpoint tag with a slash", slash_tag, "run/1")


MODES = {"distilbert": mode_distilbert, "lora": mode_lora, "trainer": mode_trainer,
         "accelerate": mode_accelerate, "actckpt": mode_actckpt,
         "resume-save": mode_resume_save, "resume-load": mode_resume_load,
         "resume-hf-save": lambda a: mode_resume_save(a, hf=True),
         "resume-hf-load": lambda a: mode_resume_load(a, hf=True), "misuse": mode_misuse}


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in MODES:
        sys.exit(f"torch_hf.py: unknown mode '{mode}' (one of {', '.join(MODES)})")
    if mode == "lora":
        try:
            import peft  # noqa: F401
        except ImportError as e:
            print(f"torch_hf: SKIP: peft cannot be imported ({e}); bash tools/setup_tests.sh installs it")
            sys.exit(77)
    torch.set_num_threads(1)
    MODES[mode](sys.argv[2:])
    if RANK == 0:
        print(f"torch_hf {mode}: {'FAILED (' + str(len(FAILED)) + ')' if FAILED else 'passed'}", flush=True)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
