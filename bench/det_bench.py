"""det_bench.py - the cost of zeroshard.deterministic "world_size_invariant" on the transformer benchmark's
model (bench/gpt_bench.py: 6 layers, width 384, 6 heads, context 256, global batch 8): zs-train-gpt at 2
ranks in the normal mode and in deterministic mode (micro_shard_size 4, one micro-shard per micro-batch at
2 ranks, and with --shard1 also 1, one forward/backward per sequence), at stages 0 and 3, fp32, interleaved rep by rep; the
first step of each run is discarded. Prints the median step time (min-max), the slowdown against the
normal mode of the same stage, the median time of the step's end (norm, exact sum and optimizer: the
zs_stats time_optimizer), each rank's CPU seconds (user + system over the whole run, divided by the
steps: what a loaded machine's wall clock hides), each rank's peak RSS and the bytes of gradients each rank hands to the
collectives per step (from zs_memory's element count) and the gradient bytes zs_memory reports. A benchmark: nothing is asserted.
With --compare OLD_BUILD, each rep also runs deterministic mode (shard 4) with OLD_BUILD's zs-train-gpt
(rows "deterministic, old build"): a change's before and after, interleaved in one run.
Usage: python3 bench/det_bench.py [--build build] [--steps 5] [--reps 2] [--shard1] [--compare OLD_BUILD [--old-bytes 9]]
"""
import argparse
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt_bench import launch_zs, med  # noqa: E402


def config(path, stage, shard):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "steps_per_print": 0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                     "weight_decay": 0.1}},
           "zero_optimization": {"stage": stage, "overlap_comm": True, "stage3_param_persistence_threshold": 0}}
    if shard:
        cfg["zeroshard"] = {"deterministic": "world_size_invariant", "micro_shard_size": shard}
    with open(path, "w") as f:
        json.dump(cfg, f)


def run(a, tmp, stage, shard):
    old = shard == "old"
    shard = 4 if old else shard
    cfg = f"{tmp}/s{stage}_{shard}.json"
    config(cfg, stage, shard)
    p, steps = launch_zs(argparse.Namespace(**{**vars(a), "build": a.compare}) if old else a, tmp, cfg, 2,
                         ["--memory-json"])
    grads = [int(x) for x in re.findall(r'"grads": (\d+)', p.stdout)]
    numel = [int(x) for x in re.findall(r'"numel": (\d+)', p.stdout)]
    return {"time": [s["time"] for s in steps], "optimizer": [s["optimizer"] for s in steps], "rss_kb": [int(x) for x in re.findall(r"peak_rss_kb (\d+)", p.stderr)],
            "cpu": [(float(u) + float(s)) / (len(steps) + 1) for u, s in re.findall(r"cpu_s ([\d.]+) ([\d.]+)", p.stderr)],
            "numel": numel[0] if numel else 0, "grads": max(grads) if grads else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "tests", "data", "parity.txt"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--shard1", action="store_true", help="also micro_shard_size 1 (a pass per sequence)")
    ap.add_argument("--compare", help="an older build: its deterministic mode (shard 4) interleaved too")
    ap.add_argument("--old-bytes", type=int, default=9,
                    help="bytes per parameter the --compare build hands to the collectives (24 before merge 4bfcfe1)")
    for flag, default in (("--layers", 6), ("--dim", 384), ("--heads", 6), ("--ctx", 256)):
        ap.add_argument(flag, type=int, default=default)
    a = ap.parse_args()
    a.build, a.data = os.path.abspath(a.build), os.path.abspath(a.data)
    a.compare = a.compare and os.path.abspath(a.compare)
    keys = [(s, m) for s in (0, 3) for m in [0, 4] + ([1] if a.shard1 else []) + (["old"] if a.compare else [])]
    res = {k: {"time": [], "optimizer": [], "rss_kb": [], "cpu": [], "grads": 0} for k in keys}
    numel = 0
    print(f"command: python3 bench/det_bench.py --steps {a.steps} --reps {a.reps}"
          f"{' --compare ' + a.compare if a.compare else ''}; 2 ranks, fp32, batch 8, "
          f"nproc {os.cpu_count()} (a shared machine: figures are noisy)")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.reps):
            for k in keys:
                r = run(a, tmp, *k)
                res[k]["time"] += r["time"]
                res[k]["optimizer"] += r["optimizer"]
                res[k]["rss_kb"] += r["rss_kb"]
                res[k]["cpu"] += r["cpu"]
                numel = r["numel"] or numel
                res[k]["grads"] = r["grads"]
    print(f"{'stage':>5} {'mode':<26} {'step s (median, min-max)':<28} {'vs normal':>9} {'step-end s':>10} "
          f"{'CPU s/rank/step':>22} {'vs normal':>9} {'peak RSS/rank MB':>17} "
          f"{'gradient memory/rank MB':>23} {'into collectives/rank/step':>26}")
    for s, m in keys:
        t = res[(s, m)]["time"]
        base = med(res[(s, 0)]["time"])
        rss = max(res[(s, m)]["rss_kb"]) / 1024
        # normal: fp32 gradients into a reduce-scatter (+ all-gather at stage 0); deterministic: an int8
        # top band per element into an all-reduce, an int64 sum per element into a reduce-scatter (MPI's
        # own algorithms move their own multiples of that)
        gbytes = numel * (a.old_bytes if m == "old" else 9 if m else 4)
        c, cbase = res[(s, m)]["cpu"], med(res[(s, 0)]["cpu"])
        mode = "normal" if not m else "deterministic, old build" if m == "old" else f"deterministic, shard {m}"
        print(f"{s:>5} {mode:<26} {med(t):.3f} ({min(t):.3f}-{max(t):.3f}){'':<8} {med(t) / base - 1:>+8.1%} "
              f"{med(res[(s, m)]['optimizer']):>10.3f} {med(c):>7.2f} ({min(c):.2f}-{max(c):.2f}) {med(c) / cbase - 1:>+9.1%} "
              f"{rss:>17.0f} {res[(s, m)]['grads'] / 1e6:>23.1f} {gbytes / 1e6:>23.1f} MB")
    print("det_bench " + json.dumps({f"s{s}_{m}": {"median_s": med(res[(s, m)]["time"]),
                                                  "cpu_s": med(res[(s, m)]["cpu"]),
                                                  "rss_mb": max(res[(s, m)]["rss_kb"]) / 1024} for s, m in keys}))


if __name__ == "__main__":
    main()
