"""fortunes_table.py - the walk-through's table: the fortunes fine-tuning (examples/pytorch/fortunes.py) through
Lightning Fabric with its native strategies and with ZeroShard's, and through DeepSpeed's own API on DeepSpeed
and on ZeroShard, at 2 ranks: training time, test accuracy, peak RSS per rank, the final training loss and the
params-hash of the trained parameters (two rows with one hash trained the same parameters, bit for bit).

    python3 bench/fortunes_table.py [--steps 200] [--reps 3] [--ranks 2] [--rows fabric:ddp,...]
                                    [--flags "--dim 128 --lr 1e-3"] [--fabric SCRIPT]

Each row is one example script run by its contract (`mpirun -np N python3 SCRIPT --strategy NAME ... --result
FILE`), once per rep, the rows interleaved rep by rep, each rep starting one row further on (rep k runs
rows k, k+1, ..., wrapping round) so load from other jobs falls on all of them alike; with three rows or more
no row runs twice back to back across a rep's end (reversing every other rep did that to the first and last
rows, whose two runs then took the same stretch of load).
Training time is the script's own (the training loop, not start-up or the evaluation); since
wall time on a shared machine swings, each row also gives its time relative to the `fabric:ddp` row's in the
same rep, as a median with its min-max. Every command is printed before it runs;
a row whose RESULT is missing makes the exit status 1, unless its script refused the strategy saying why
(`--strategy NAME: <reason>`, as the Fabric script does for fsdp on the CPU): that row shows the reason and
runs once. DeepSpeed's rows are skipped, loudly, when it cannot be imported (it is not a dependency:
`pip install deepspeed==0.19.8`).
"""
import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples", "pytorch")
SCRIPTS = {"fabric": os.path.join(EXAMPLES, "fortunes_fabric.py"),
           "deepspeed": os.path.join(EXAMPLES, "fortunes_deepspeed.py")}
ROWS = ["fabric:ddp", "fabric:fsdp", "fabric:zeroshard_stage_2", "fabric:zeroshard_stage_3",
        "fabric:zeroshard_stage_3_offload", "deepspeed:deepspeed_stage_2", "deepspeed:zeroshard_stage_2",
        "deepspeed:deepspeed_stage_3", "deepspeed:zeroshard_stage_3"]
BASE = "fabric:ddp"
DS_SHM = "/dev/shm/deepspeed_allreduce_buffer_*"
FLAGS = "--dim 128 --lr 1e-3 --micro-batch 16"


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rows", default=",".join(ROWS), help="SCRIPT:STRATEGY, comma-separated; SCRIPT is "
                    "fabric or deepspeed")
    ap.add_argument("--flags", default=FLAGS, help="the scripts' common flags (examples/pytorch/fortunes.py)")
    ap.add_argument("--fabric", default=SCRIPTS["fabric"], help="the Fabric script")
    a = ap.parse_args()
    a.rows = a.rows.split(",")
    if any(r.startswith("fabric:") for r in a.rows) and not os.path.exists(a.fabric):
        sys.exit(f"fortunes_table: the Fabric script {a.fabric} is missing (--fabric names another)")
    for row in a.rows:
        script, _, strategy = row.partition(":")
        if script not in SCRIPTS or not strategy:
            sys.exit(f"fortunes_table: --rows entry {row!r} is not SCRIPT:STRATEGY with SCRIPT in "
                     f"{', '.join(SCRIPTS)}")
    return a


def deepspeed_missing():
    """Why DeepSpeed's own rows cannot run here, or None."""
    p = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["import failed"])[-1]


def command(a, row, out):
    script, _, strategy = row.partition(":")
    path = a.fabric if script == "fabric" else SCRIPTS[script]
    return (f"mpirun --oversubscribe -np {a.ranks} python3 {shlex.quote(os.path.relpath(path, ROOT))} "
            f"--strategy {strategy} --steps {a.steps} {a.flags} --result {shlex.quote(out)}")


def run(a, row, out, env):
    """One run: (its RESULT dict or None, why there is none, whether the script refused the strategy)."""
    cmd = command(a, row, out)
    print("$ " + cmd, flush=True)
    shm = set(glob.glob(DS_SHM))
    p = subprocess.run(cmd, shell=True, cwd=ROOT, env=env, capture_output=True, text=True)
    for leaked in set(glob.glob(DS_SHM)) - shm:   # DeepSpeed's CPU runs leave these behind (69 MB each)
        os.remove(leaked)
    if not os.path.exists(out):
        output = p.stdout + p.stderr
        says = f"--strategy {row.partition(':')[2]}: "
        refusal = [ln.split(says, 1)[1].strip() for ln in output.splitlines() if says in ln]
        if refusal:   # the script says why it does not run that strategy here: the row says so too
            print(f"  {row}: refused: {refusal[-1]}", flush=True)
            return None, "not run: " + refusal[-1].replace("|", "/"), True
        tail = output.strip().splitlines()[-15:]
        print(f"  {row}: no RESULT (exit {p.returncode}):\n    " + "\n    ".join(tail), flush=True)
        return None, f"no RESULT (exit {p.returncode}): {reason(output)}", False
    with open(out) as f:
        res = json.load(f)
    if p.returncode != 0:   # DeepSpeed 0.19's CPU stage 3 may abort at interpreter exit, its work done
        print(f"  {row}: exit {p.returncode} after writing its RESULT", flush=True)
    print(f"  {row}: train {res['train_s']:.2f} s, test accuracy {res['test_acc']}, "
          f"loss {res['losses'][-1]:.4f}", flush=True)
    return res, None, False


def reason(output):
    """The line of a failed run's output that says why: its last error, else its last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith("---")]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln or "Exception" in ln]
    return (errors or lines or [""])[-1].replace("|", "/")


def spread(xs, fmt):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def table_row(row, results, base):
    """The markdown cells of one row from its reps' RESULTs (and the ddp row's of the same reps)."""
    times = [r["train_s"] for r in results]
    ratios = [r["train_s"] / b["train_s"] for r, b in zip(results, base) if b is not None]
    accs = sorted({r["test_acc"] for r in results if r["test_acc"] is not None})
    acc = "-" if not accs else (f"{100 * accs[0]:.1f}%" if len(accs) == 1 else
                                f"{100 * accs[0]:.1f}-{100 * accs[-1]:.1f}%")
    rss_max = statistics.median(max(r["peak_rss_mib"]) for r in results)
    rss_sum = statistics.median(sum(r["peak_rss_mib"]) for r in results)
    loss = statistics.median(r["losses"][-1] for r in results)
    hashes = {r["params_hash"] for r in results}
    script, _, strategy = row.partition(":")
    return [script, strategy, spread(times, "{:.1f}"), spread(ratios, "{:.2f}") if ratios else "-", acc,
            f"{rss_max:.0f}", f"{rss_sum:.0f}", f"{loss:.4g}",
            f"`{hashes.pop()}`" if len(hashes) == 1 else "differs between reps"]


HEADER = ["script", "strategy", "train s, median (min-max)", "vs ddp, same rep", "test accuracy",
          "peak RSS/rank MiB (max)", "peak RSS MiB (sum)", "final train loss", "params-hash"]


def main():
    a = parse()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # the package from this tree, and fortunes.py for a Fabric script kept elsewhere
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "python"), EXAMPLES,
                                                      env.get("PYTHONPATH")]))
    why_not, refused = {}, set()
    missing = deepspeed_missing() if any(r.startswith("deepspeed:deepspeed") for r in a.rows) else None
    if missing:
        print(f"fortunes_table: SKIP of DeepSpeed's own rows: it cannot be imported ({missing}); "
              "pip install deepspeed==0.19.8", flush=True)
    rows = [r for r in a.rows if not (missing and r.startswith("deepspeed:deepspeed"))]
    scratch = tempfile.TemporaryDirectory(prefix="zs-fortunes-table-")   # the runs' RESULT files, removed at exit
    tmp = scratch.name
    results = {r: [None] * a.reps for r in rows}
    load0 = os.getloadavg()
    for rep in range(a.reps):
        k = rep % len(rows)
        for row in rows[k:] + rows[:k]:
            if row in refused:
                continue
            out = os.path.join(tmp, f"{row.replace(':', '-')}-{rep}.json")
            results[row][rep], err, refuses = run(a, row, out, env)
            if err:
                why_not[row] = err
            if refuses:
                refused.add(row)
    load1 = os.getloadavg()

    me = shlex.join(["python3", "bench/fortunes_table.py"] + sys.argv[1:])
    print(f"\n`{me}`: {a.steps} steps, {a.ranks} ranks, script flags `{a.flags}`, {a.reps} reps interleaved; "
          f"{os.cpu_count()} cores, load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end. "
          "Wall times on a shared machine: read the ratio to the ddp row of the same rep.\n")
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER))
    base = results.get(BASE, [None] * a.reps)
    for row in rows:
        got = [r for r in results[row] if r is not None]
        if row in why_not or not got:
            script, _, strategy = row.partition(":")
            print(f"| {script} | {strategy} | {why_not.get(row, 'no RESULT')} |" + " |" * (len(HEADER) - 3))
            continue
        print("| " + " | ".join(table_row(row, results[row], base)) + " |")
    keep = ("train_s", "test_acc", "peak_rss_mib", "params_hash")
    runs = {r: [None if x is None else dict({k: x[k] for k in keep}, final_loss=x["losses"][-1])
                for x in results[r]] for r in rows}
    print("fortunes_table " + json.dumps({"command": me, "cores": os.cpu_count(), "steps": a.steps,
                                          "ranks": a.ranks, "flags": a.flags, "rows": runs}))
    failed = [r for r in why_not if r not in refused]
    if failed:
        sys.exit(f"fortunes_table: no RESULT from {', '.join(failed)}")


if __name__ == "__main__":
    main()
