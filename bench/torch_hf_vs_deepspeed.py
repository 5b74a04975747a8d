"""torch_hf_vs_deepspeed.py - one fine-tuning script for two Hugging Face models (GPT-2 with its tied head,
DistilBERT sequence classification with frozen embeddings; both from configs, no hub) run under ZeroShard
(`import zeroshard as deepspeed`, mpirun), under DeepSpeed itself (its launcher, CPU accelerator, gloo) and
in plain PyTorch (one process, the whole global batch, torch.optim.AdamW): per run the loss of the final
parameters on a held-out batch and their max |diff| / max |param| against PyTorch's, after --steps steps.

    python3 bench/torch_hf_vs_deepspeed.py [--steps 20] [--ranks 2] [--stages 0,3] [--models gpt2,distilbert]

DeepSpeed is not a dependency: `pip install deepspeed==0.19.8` (beside the system's torch); without it its
rows are skipped, loudly. Its first run JIT-compiles its CPU ops (minutes). Every command is printed before
it runs; the script runs itself as the worker (`worker BACKEND MODEL STAGE OUT`).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEQ, MICRO = 32, 4
BETAS, WD = (0.9, 0.95), 0.01
LR, EPS = float(os.environ.get("BENCH_LR", 1e-3)), float(os.environ.get("BENCH_EPS", 1e-6))


# ---------------------------------------------------------------------------------------------- the script
def build(name):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    from transformers import GPT2Config, GPT2LMHeadModel, DistilBertConfig, DistilBertForSequenceClassification
    torch.manual_seed(11)
    if name == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=256, n_positions=SEQ,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    m = DistilBertForSequenceClassification(DistilBertConfig(dim=128, n_layers=4, n_heads=4, hidden_dim=256,
                                                             vocab_size=256, max_position_embeddings=SEQ,
                                                             dropout=0.0, attention_dropout=0.0,
                                                             seq_classif_dropout=0.0, num_labels=4))
    m.distilbert.embeddings.requires_grad_(False)
    return m


def data(name, step, n):
    import torch
    g = torch.Generator().manual_seed(77 + step)
    x = torch.randint(0, 256, (n, SEQ), generator=g)
    return {"input_ids": x, "labels": x if name == "gpt2" else (x[:, 1] * 3 + x[:, -2]) % 4}


def ds_config(stage):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
            "gradient_clipping": 1.0, "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                      "weight_decay": WD}}}


def worker(backend, name, stage, out, steps):
    import torch
    model = build(name)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if backend == "torch":
        ranks = int(os.environ["BENCH_RANKS"])
        opt = torch.optim.AdamW(trainable, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        for s in range(steps):
            opt.zero_grad()
            model(**data(name, s, MICRO * ranks)).loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out)
        return
    if backend == "deepspeed":
        import deepspeed
    else:
        import zeroshard as deepspeed
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                           config=ds_config(stage))
    r, w = engine.global_rank, engine.world_size
    for s in range(steps):
        mine = {k: v[r * MICRO:(r + 1) * MICRO] for k, v in data(name, s, MICRO * w).items()}
        engine.backward(engine(**mine).loss)
        engine.step()
    named = list(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named]):
        full = {n: p.detach().float().clone() for n, p in named}
    if r == 0:
        torch.save(full, out)


# ---------------------------------------------------------------------------------------------- the driver
def maxdiff(a, b):
    return max((a[n] - b[n]).abs().max().item() for n in b)


def held_out_loss(name, params):
    import torch
    m = build(name)
    m.load_state_dict(params, strict=False)
    with torch.no_grad():
        return m(**data(name, 10_000, 64)).loss.item()


def launch(backend, name, stage, a, out, port):
    me = os.path.abspath(__file__)
    args = f"worker {backend} {name} {stage} {out} --steps {a.steps}"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", BENCH_RANKS=str(a.ranks),
               BENCH_LR=str(a.lr), BENCH_EPS=str(a.eps))
    if backend == "torch":
        cmd = f"python3 {me} {args}"
    elif backend == "zeroshard":
        env["PYTHONPATH"] = os.path.join(ROOT, "python") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = f"mpirun --oversubscribe -np {a.ranks} python3 {me} {args}"
    else:   # LOCAL_SIZE: how many "devices" DeepSpeed's CPU accelerator reports, so --num_gpus is honoured
        cmd = (f"LOCAL_SIZE={a.ranks} deepspeed --num_gpus {a.ranks} --no_local_rank --master_port {port} "
               f"{me} {args}")
    print("$ " + cmd, flush=True)
    p = subprocess.run(cmd, shell=True, env=env, capture_output=True, text=True)
    if not os.path.exists(out):
        sys.exit(f"torch_hf_vs_deepspeed: {backend} {name} stage {stage} failed (exit {p.returncode}):\n"
                 f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    if p.returncode != 0:   # DeepSpeed 0.19's CPU stage 3 may abort at interpreter exit, its work done
        print(f"  ({backend}: exit {p.returncode} after writing its parameters)", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        ap = argparse.ArgumentParser()
        ap.add_argument("worker")
        ap.add_argument("backend")
        ap.add_argument("model")
        ap.add_argument("stage", type=int)
        ap.add_argument("out")
        ap.add_argument("--steps", type=int, default=20)
        w = ap.parse_args()
        return worker(w.backend, w.model, w.stage, w.out, w.steps)
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--stages", default="0,3")
    ap.add_argument("--models", default="gpt2,distilbert")
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--eps", type=float, default=EPS)
    a = ap.parse_args()
    import torch
    try:
        import deepspeed  # noqa: F401
        backends = ["zeroshard", "deepspeed"]
    except ImportError as e:
        print(f"torch_hf_vs_deepspeed: SKIP of DeepSpeed's rows: it cannot be imported ({e}); "
              "pip install deepspeed==0.19.8", flush=True)
        backends = ["zeroshard"]
    tmp = tempfile.mkdtemp(prefix="zs-hf-vs-ds-")
    rows, port = [], 29650
    for name in a.models.split(","):
        ref_path = os.path.join(tmp, f"{name}-torch.pt")
        launch("torch", name, 0, a, ref_path, port)
        ref = torch.load(ref_path)
        scale = max(t.abs().max().item() for t in ref.values())
        rows.append((name, "pytorch", "-", held_out_loss(name, ref), 0.0, None))
        for stage in map(int, a.stages.split(",")):
            got = {}
            for backend in backends:
                port += 1
                path = os.path.join(tmp, f"{name}-{backend}-{stage}.pt")
                launch(backend, name, stage, a, path, port)
                got[backend] = torch.load(path)
            for backend, p in got.items():
                other = got.get("deepspeed") if backend == "zeroshard" else None
                rows.append((name, backend, stage, held_out_loss(name, p), maxdiff(p, ref) / scale,
                             maxdiff(p, other) / scale if other else None))
    print(f"\n{a.steps} steps, {a.ranks} ranks x micro-batch {MICRO} (PyTorch: one process, the global batch), "
          f"seq {SEQ}, AdamW lr {a.lr} eps {a.eps}, clipping 1.0, fp32; {os.cpu_count()} cores; "
          f"command: python3 bench/torch_hf_vs_deepspeed.py {shlex.join(sys.argv[1:])}")
    hdr = (f"{'model':11s} {'backend':10s} {'stage':>5s} {'held-out loss':>14s} {'vs PyTorch':>11s} "
           f"{'vs DeepSpeed':>13s}")
    print(hdr + "\n" + "-" * len(hdr))
    for name, backend, stage, loss, rel, rel_ds in rows:
        print(f"{name:11s} {backend:10s} {stage!s:>5s} {loss:14.6f} {rel:11.2e} "
              f"{'' if rel_ds is None else f'{rel_ds:.2e}':>13s}")
    print("(vs: max |param - theirs| / max |param of PyTorch's run|, over every parameter after the last step)")
    print("torch_hf_vs_deepspeed " + json.dumps([dict(zip(("model", "backend", "stage", "loss", "vs_pytorch",
                                                           "vs_deepspeed"), r)) for r in rows]))


if __name__ == "__main__":
    main()
