"""gpt_bench.py - run by bench/gpt_bench.sh: trains one transformer (6 layers, width 384, 6 heads, context 256,
10.8M parameters) through zs-train-gpt at stages 0, 2, 3 on 1 and 2 ranks in fp32 and bf16, and through
PyTorch (gpt_bench_torch.py) as one process, DDP (fp32, and under bf16 autocast for the bf16 rows) and FSDP (and one rank's half of the batch alone, the
baseline of their overhead), with one global batch and the node's cores
shared alike (2 ranks take one core each). Configurations are interleaved rep by rep; each run's first step
is discarded. Prints a table (medians over every kept step of every rep, with the min-max spread), the
transformer goals with their figures, and one machine-readable `gpt_bench {...}` line. A benchmark: nothing is
asserted.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_mpi_yield_when_idle": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def zs_config(path, stage, dtype, micro):
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "steps_per_print": 0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                     "weight_decay": 0.1}},
           "zero_optimization": {"stage": stage, "overlap_comm": True, "stage3_param_persistence_threshold": 0}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    with open(path, "w") as f:
        json.dump(cfg, f)


def model_flags(a):
    return ["--layers", str(a.layers), "--dim", str(a.dim), "--heads", str(a.heads), "--ctx", str(a.ctx)]


def launch_zs(a, tmp, cfg, ranks, extra=()):
    """zs-train-gpt on cfg: the finished process and its step metrics, the first step dropped"""
    metrics = f"{tmp}/m.jsonl"
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), "/usr/bin/time", "-f", "peak_rss_kb %M cpu_s %U %S",
           f"{a.build}/zs-train-gpt", "--config", cfg, "--data", a.data, *model_flags(a), "--steps", str(a.steps),
           "--val-every", "0", "--val-batches", "1", "--sample", "0", "--quiet", "--metrics", metrics, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MPI_ENV})
    if p.returncode:
        sys.exit(f"bench: failed ({p.returncode}): {shlex.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    with open(metrics) as f:
        return p, [json.loads(line) for line in f][1:]


def run_zs(a, tmp, stage, ranks, dtype):
    cfg = f"{tmp}/s{stage}_{ranks}_{dtype}.json"
    zs_config(cfg, stage, dtype, a.batch // ranks)
    p, steps = launch_zs(a, tmp, cfg, ranks)
    rss = [int(x) for x in re.findall(r"peak_rss_kb (\d+)", p.stderr)]
    return {"time": [s["time"] for s in steps], "compute": [s["compute"] for s in steps],
            "comm_wait": [s["comm_wait"] for s in steps], "optimizer": [s["optimizer"] for s in steps],
            "rss_kb": rss}


def run_torch(a, mode):
    """single: the whole batch on all cores; share: one rank's half of it on one rank's cores, alone (the
    model's own compute per rank, what FSDP's and DDP's overhead is measured against); ddp, fsdp: 2 ranks"""
    world, threads, batch = {"single": (1, a.cores, a.batch), "share": (1, max(1, a.cores // 2), a.batch // 2)}.get(
        mode, (2, max(1, a.cores // 2), a.batch))
    amp = mode == "ddp_bf16"  # DDP with bf16 autocast: what zeroshard's bf16 rows are held against
    cmd = [sys.executable, f"{HERE}/gpt_bench_torch.py", {"share": "single", "ddp_bf16": "ddp"}.get(mode, mode),
           "--world", str(world), "--threads", str(threads), "--data", a.data, *model_flags(a), "--batch", str(batch),
           "--steps", str(a.steps)] + (["--bf16"] if amp else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [json.loads(m) for m in re.findall(r'\{"mode"[^{}]*\}', p.stdout)]
    if p.returncode or len(lines) != world:
        sys.exit(f"gpt_bench: failed ({p.returncode}): {shlex.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    # a step ends on every rank together (the gradients' all-reduce): the slowest rank's time is the step's
    per_step = [max(r["step_times"][i] for r in lines) for i in range(1, a.steps)]
    return {"time": per_step, "rss_kb": [r["peak_rss_kb"] for r in lines],
            "import_kb": [r["import_rss_kb"] for r in lines]}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "tests", "data", "parity.txt"))
    ap.add_argument("--steps", type=int, default=5, help="steps per run, the first discarded (default 5)")
    ap.add_argument("--reps", type=int, default=2, help="runs of every configuration, interleaved (default 2)")
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences (default 8)")
    for flag, default in (("--layers", 6), ("--dim", 384), ("--heads", 6), ("--ctx", 256)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    a = ap.parse_args()
    if a.steps < 2 or a.batch % 2:
        sys.exit("gpt_bench: --steps must be at least 2 and --batch even")
    a.data = os.path.abspath(a.data)
    zs = [(s, r, d) for d in ("fp32", "bf16") for r in (1, 2) for s in (0, 2, 3)]
    th = ["single", "share", "ddp", "ddp_bf16", "fsdp"]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for key in zs + th:
                name = key if isinstance(key, str) else "zs s%d np%d %s" % key
                print(f"rep {rep + 1}/{a.reps}: {name}", file=sys.stderr, flush=True)
                r = run_zs(a, tmp, *key) if isinstance(key, tuple) else run_torch(a, key)
                acc = res.setdefault(key, {})
                for k, v in r.items():
                    acc.setdefault(k, []).extend(v)
    tokens = a.batch * a.ctx
    ref = {m: med(res[m]["time"]) for m in th}
    print(f"model: {a.layers} layers, dim {a.dim}, {a.heads} heads, ctx {a.ctx}; global batch {a.batch} sequences "
          f"({tokens} tokens) per step; {a.steps - 1} kept steps x {a.reps} reps per row; {a.cores} cores, "
          f"1 rank: {a.cores} threads, 2 ranks: {max(1, a.cores // 2)} each")
    hdr = f"{'run':22s} {'tok/s':>7s} {'step s (min-max)':>20s} {'compute':>8s} {'comm':>7s} {'optim':>7s} " \
          f"{'RSS/rank MiB':>13s} {'vs torch':>9s}"
    print(hdr)
    print("-" * len(hdr))
    out = {}
    for key in zs + th:
        r = res[key]
        t = med(r["time"])
        vs = ref["single"] if key in ("single", "share") or (isinstance(key, tuple) and key[1] == 1) else ref["ddp"]
        if isinstance(key, tuple) and key[1] == 2 and key[2] == "bf16":
            vs = ref["ddp_bf16"]
        if isinstance(key, tuple):
            name = "zeroshard s%d np%d %s" % key
            split = f"{med(r['compute']):8.3f} {med(r['comm_wait']):7.3f} {med(r['optimizer']):7.3f}"
        else:
            name = {"single": "pytorch single", "share": "pytorch 1/2 batch",
                    "ddp_bf16": "pytorch ddp np2 bf16"}.get(key, f"pytorch {key} np2")
            split = f"{'':8s} {'':7s} {'':7s}"
        rss = str(round(max(r["rss_kb"]) / 1024))
        label = "1p" if vs == ref["single"] else "ddp16" if vs == ref["ddp_bf16"] else "ddp"
        ratio = "" if key in ("share", "ddp_bf16") else f"{vs / t:.2f}x {label}"
        tok = tokens // 2 if key == "share" else tokens
        print(f"{name:22s} {tok / t:7.0f} {t:7.3f} ({min(r['time']):.3f}-{max(r['time']):.3f}) {split} "
              f"{rss:>13s} {ratio:>9s}")
        out[name] = {"tokens_per_s": tok / t, "step_s": t, "step_min": min(r["time"]),
                     "step_max": max(r["time"]), "peak_rss_mib": max(r["rss_kb"]) / 1024}
        if isinstance(key, tuple):
            out[name].update({k: med(r[k]) for k in ("compute", "comm_wait", "optimizer")})
    print("(vs torch: the row's tokens/s over PyTorch's, 1p = single process (fp32) for 1 rank, ddp = DDP fp32 "
          "for 2 ranks fp32, ddp16 = DDP under bf16 autocast for 2 ranks bf16; "
          "RSS: the largest rank's peak; comm = waiting on fetch, reduce and gather; 1/2 batch: one rank's "
          "half of the batch on one rank's cores, alone: its tok/s counts that half)")
    print("goals:")
    for d in ("fp32", "bf16"):
        r3, r0 = out[f"zeroshard s3 np2 {d}"], out[f"zeroshard s0 np2 {d}"]
        ratio = r3["step_s"] / r0["step_s"]
        print(f"  stage-3 step time <= 1.15x stage 0's at 2 ranks ({d}): {ratio:.2f}x "
              f"{'met' if ratio <= 1.15 else 'NOT met'}")
    fsdp_over = ref["fsdp"] - ref["share"]  # FSDP's step beyond the same rank's compute alone
    print(f"  (FSDP's overhead: its step {ref['fsdp']:.3f} s minus one rank's share of the batch alone "
          f"{ref['share']:.3f} s; DDP's the same way: {ref['ddp'] - ref['share']:.3f} s)")
    for d in ("fp32", "bf16"):
        r3 = out[f"zeroshard s3 np2 {d}"]
        over = r3["comm_wait"] + r3["optimizer"]
        print(f"  ZeroShard overhead (comm-wait + optimizer, stage 3, 2 ranks, {d}) {over:.3f} s < FSDP's "
              f"{fsdp_over:.3f} s: {'met' if over < fsdp_over else 'NOT met'}")
    for d in ("fp32", "bf16"):
        best = max(out[f"zeroshard s{s} np2 {d}"]["tokens_per_s"] for s in (0, 2, 3))
        r3 = out[f"zeroshard s3 np2 {d}"]["tokens_per_s"]
        for m in ("ddp", "ddp_bf16") if d == "bf16" else ("ddp",):
            ddp = tokens / ref[m]
            print(f"  tokens/s >= 0.8x {'DDP bf16 autocast' if m == 'ddp_bf16' else 'DDP fp32'} ({ddp:.0f}) at 2 "
                  f"ranks, {d}: stage 3 {r3 / ddp:.2f}x, best stage {best / ddp:.2f}x: "
                  f"{'met' if r3 >= 0.8 * ddp else 'NOT met'} at stage 3")
    fs = out["pytorch fsdp np2"]["peak_rss_mib"]
    imp = max(res["fsdp"]["import_kb"]) / 1024  # the CUDA libraries torch loads even on a CPU
    for d in ("fp32", "bf16"):
        m = out[f"zeroshard s3 np2 {d}"]["peak_rss_mib"]
        print(f"  stage-3 peak RSS per rank {m:.0f} MiB < FSDP's {fs:.0f} MiB ({d}): {'met' if m < fs else 'NOT met'}; "
              f"FSDP above its own RSS after `import torch` ({imp:.0f} MiB): {fs - imp:.0f} MiB")
    b, f32 = out["zeroshard s0 np2 bf16"]["tokens_per_s"], out["zeroshard s0 np2 fp32"]["tokens_per_s"]
    b3, f3 = out["zeroshard s3 np2 bf16"]["tokens_per_s"], out["zeroshard s3 np2 fp32"]["tokens_per_s"]
    print(f"  bf16 / fp32 tokens/s, 2 ranks: stage 0 {b / f32:.2f}, stage 3 {b3 / f3:.2f}; PyTorch DDP bf16 "
          f"autocast / fp32: {ref['ddp'] / ref['ddp_bf16']:.2f}")
    print("gpt_bench " + json.dumps({"model": model_flags(a), "batch": a.batch, "steps": a.steps, "reps": a.reps,
                                     "rows": out}))


if __name__ == "__main__":
    main()
