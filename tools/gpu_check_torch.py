"""gpu_check_torch.py - the GPU check's PyTorch stage (tools/gpu_check.sh runs it after the C stages): ZeroShard's
PyTorch front end training a GPT-2-shaped Hugging Face model (from a config) in bf16 on the GPU, against plain
PyTorch and DeepSpeed. Every run is a process of its own (tools/gpu_check_torch_worker.py) under a timeout.

    gpu_check_torch.py parity --ranks 1|2    ZeroShard at stages 0 and 3 (2 ranks share the GPU), 20 steps: the
                                             loss within 1e-3 of plain PyTorch's, stage 0 and 3 the same bits
    gpu_check_torch.py perf                  tokens/s and peak memory of ZeroShard and DeepSpeed over PyTorch's,
                                             one rank, the runs interleaved rep by rep: medians, spreads, ratios
    gpu_check_torch.py offload --backend zeroshard|deepspeed
                                             ZeRO-Offload (stage 2, optimizer on the CPU): the largest model that
                                             trains, doubling its depth until a failure, the time cap or the
                                             host-memory guard
    gpu_check_torch.py all                   the four in turn (what the CPU test runs)

--device cpu runs the same code on a small model through ZeroShard's CPU path (fewer steps, memory as peak RSS).
The step's time comes from ZS_STEP_END (a Unix time; gpu_check.sh sets it) or --time; no run starts without the
time it needs. DeepSpeed: from --ds-wheels DIR (the bundle's wheels, unpacked into the scratch folder), else the
python3's own; where it cannot be imported, or its CPU Adam op does not compile, its lines are SKIP naming why.
Prints `gpu_check_torch: CHECK: PASS|FAIL|SKIP figures` per check, `gpu_check_torch: result: ...` (the digest
gpu_check.sh quotes), then `gpu_check_torch: summary: P passed, F failed, S skipped in T s`. Exit: 1 when a check
failed, 77 when every check was skipped, else 0.
"""
import argparse
import glob
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "gpu_check_torch_worker.py")
LOSS_TOL = 1e-3
MIN_RUN = 10        # seconds: a run with less time left than this is not started
HOST_BYTES = 20     # bytes of host memory a parameter needs under ZeRO-Offload (fp32 master, moments, gradient)
# per device: the parity model (layers,width,heads,vocab), sequence, global batch, steps; the perf batch, warm-up
# and timed steps, reps; the offload probe's width, heads, vocab, sequence, batch, first depth, steps, cap a size
PRESETS = {
    "cuda": dict(model="4,256,4,1024", seq=128, batch=16, steps=20, perf_batch=32, warmup=3, perf_steps=10, reps=3,
                 probe=(2048, 16, 50304), probe_seq=1024, probe_batch=4, probe_layers=4, probe_steps=2,
                 size_cap=150, max_sizes=8),
    "cpu": dict(model="2,64,4,256", seq=32, batch=8, steps=10, perf_batch=8, warmup=1, perf_steps=3, reps=2,
                probe=(64, 4, 256), probe_seq=32, probe_batch=2, probe_layers=1, probe_steps=2,
                size_cap=60, max_sizes=2),
}


# --------------------------------------------------------------------------------------------------- verdicts
class Report:
    def __init__(self):
        self.t0, self.n = time.time(), {"PASS": 0, "FAIL": 0, "SKIP": 0}
        self.digest = []

    def line(self, name, verdict, text):
        self.n[verdict] += 1
        say(f"{name}: {verdict} {text}")

    def finish(self):
        if self.digest:
            say("result: " + "; ".join(self.digest))
        say(f"summary: {self.n['PASS']} passed, {self.n['FAIL']} failed, {self.n['SKIP']} skipped in "
            f"{time.time() - self.t0:.0f} s")
        if self.n["FAIL"]:
            return 1
        return 77 if self.n["PASS"] == 0 else 0


def say(text):
    print("gpu_check_torch: " + text, flush=True)


def show_tail(log, n=25):
    try:
        with open(log, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for ln in lines[-n:]:
        print("  | " + ln)


def why(log):
    """The line of a run's output that says why it stopped."""
    try:
        with open(log, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "no output"
    pat = re.compile(r"(Error|Exception|error:|out of memory|Killed|exited on signal|Traceback)")
    for ln in reversed(lines):
        if pat.search(ln) and not ln.startswith("Traceback"):
            return ln[:240]
    return lines[-1][:240] if lines else "no output"


def fmt_params(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def fmt_bytes(b):
    return f"{b / 2**30:.2f} GiB" if abs(b) >= 2**30 else f"{b / 2**20:.0f} MiB"


def spread(values, f="{:.3g}"):
    return f"{f.format(statistics.median(values))} [{f.format(min(values))}-{f.format(max(values))}]"


# ----------------------------------------------------------------------------------------------------- runs
class Runner:
    """Starts the worker runs, each in a session of its own under the time left, and kills the whole session
    (mpirun and its ranks) when the time is up."""

    def __init__(self, a):
        self.a, self.scratch = a, a.scratch
        self.end = time.time() + a.time
        env_end = os.environ.get("ZS_STEP_END")
        if env_end:
            self.end = min(self.end, float(env_end) - 3)   # 3 s for the verdicts
        self.count = 0
        self.ds_site = None

    def left(self):
        return self.end - time.time()

    def env(self, backend):
        e = dict(os.environ, PYTHONUNBUFFERED="1", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1",
                 TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
        path = [os.path.join(ROOT, "python")]
        if backend == "deepspeed":
            # a build stopped at its time limit leaves torch's lock, and the next would wait on it for ever
            for lock in glob.glob(os.path.join(self.scratch, "torch_ext", "*", "lock")):
                os.remove(lock)
            for k in ("ZEROSHARD_RUN", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
                e.pop(k, None)
            if self.ds_site:
                path.insert(0, self.ds_site)
            e.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()), TORCH_EXTENSIONS_DIR=os.path.join(self.scratch, "torch_ext"))
        e["PYTHONPATH"] = os.pathsep.join(path + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
        return e

    def run(self, name, mode, backend, args, ranks=1, cap=None):
        """The worker in MODE; returns (rc, rank-0 result or None, log). rc is 'deadline' when not started,
        'timeout' when stopped at the time limit."""
        self.count += 1
        out = os.path.join(self.scratch, f"{self.count:02d}_{name}")
        log = out + ".log"
        limit = self.left() if cap is None else min(cap, self.left())
        if limit < MIN_RUN:
            return "deadline", None, log
        cmd = [WORKER, mode, "--out", out, "--device", self.a.device, "--backend", backend] + args
        if backend == "zeroshard":
            cmd = [sys.executable, "-m", "zeroshard.run", "-np", str(ranks), "--oversubscribe"] + cmd
        else:
            cmd = [sys.executable] + cmd
        print(f"  $ {' '.join(cmd)}  (limit {limit:.0f} s, log {log})", flush=True)
        t0 = time.time()
        rc = run_session(cmd, self.env(backend), limit, log)
        print(f"  rc {rc} in {time.time() - t0:.1f} s", flush=True)
        results = [load(f"{out}.r{r}") for r in range(ranks)]
        if rc == 0 and any(r is None for r in results):
            rc = "no result"
        return rc, (results if ranks > 1 else results[0]), log


RUNNING = []   # the session of the run in progress, for the SIGTERM handler


def on_sigterm(signum, _frame):
    """Stopped from outside (gpu_check.sh's timeout): the run in progress, in its own session, goes too."""
    for sid in RUNNING:
        kill_session(sid, signal.SIGKILL)
    say(f"stopped by signal {signum}")
    sys.exit(128 + signum)


def run_session(cmd, env, limit, log):
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        RUNNING[:] = [p.pid]
        try:
            return p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_session(p.pid, signal.SIGTERM)   # mpirun stops its ranks on SIGTERM
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            kill_session(p.pid, signal.SIGKILL)
            p.wait()
            return "timeout"
        finally:
            RUNNING.clear()


def kill_session(sid, sig):
    """Every process of session SID (the run's, which start_new_session made; its ranks inherit it)."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:   # after the name: state, ppid, pgrp, session
                os.kill(int(stat.split("/")[2]), sig)
        except (OSError, ValueError, IndexError):
            pass


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failed(rep, name, rc, log, what):
    text = {"deadline": "not started: the step's time is used",
            "timeout": "stopped at the step's time limit"}.get(rc, f"rc {rc}: {why(log)}")
    rep.line(name, "FAIL", f"{what}: {text}")
    if rc != "deadline":
        show_tail(log)


# ------------------------------------------------------------------------------------------------- DeepSpeed
def deepspeed_ready(runner, a):
    """None when DeepSpeed can be imported (from the bundle's wheels, unpacked once into the scratch folder, or
    python3's own), else why not. The outcome is kept beside the unpacked wheels for the next step."""
    if a.deepspeed == "off":
        return "left out (--deepspeed off)"
    site, note = None, os.path.join(a.scratch, "ds-site.status")
    if a.ds_wheels:
        wheels = sorted(glob.glob(os.path.join(a.ds_wheels, "*.whl")))
        if not any(os.path.basename(w).startswith("deepspeed-") for w in wheels):
            reason = open(os.path.join(a.ds_wheels, "WHY")).read().strip() if os.path.exists(
                os.path.join(a.ds_wheels, "WHY")) else "no deepspeed-*.whl there"
            return f"the bundle carries no DeepSpeed wheel ({a.ds_wheels}: {reason})"
        site = os.path.join(a.scratch, "ds-site")
        if not os.path.isdir(site):
            os.makedirs(site)
            for w in wheels:   # a wheel is a zip of the files a --target install writes
                with zipfile.ZipFile(w) as z:
                    z.extractall(site)
    runner.ds_site = site
    if os.path.exists(note):
        text = open(note).read()
        return None if text.startswith("ok") else text
    check = ("import os, deepspeed; from deepspeed.accelerator import get_accelerator as g; "
             "print('deepspeed', deepspeed.__version__, 'from', os.path.dirname(deepspeed.__path__[0]), "
             "'accelerator', g().device_name())")
    try:
        p = subprocess.run([sys.executable, "-c", check], env=runner.env("deepspeed"), capture_output=True,
                           text=True, timeout=max(5, min(120, runner.left())))
        text = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None
        if text is None:
            lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
            err = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else f"rc {p.returncode}")
            text = f"import deepspeed failed: {err.strip()[:200]}"
        elif a.device.startswith("cuda") and not text.endswith("cuda"):
            text = f"DeepSpeed does not see the GPU ({text})"
        else:
            say(f"DeepSpeed: {text}")
            text = "ok " + text
    except subprocess.TimeoutExpired:
        text = "import deepspeed did not finish in time"
    with open(note, "w") as f:
        f.write(text)
    return None if text.startswith("ok") else text


# ---------------------------------------------------------------------------------------------------- checks
def check_parity(runner, rep, a, p):
    """ZeroShard at RANKS ranks, stages 0 and 3, against plain PyTorch on rank 0, in one job."""
    r = a.ranks
    name = f"parity np{r}"
    args = ["--model", p["model"], "--seq", str(p["seq"]), "--batch", str(p["batch"]), "--steps", str(p["steps"]),
            "--stages", "0,3", "--ref"] + (["--ref-lr", str(a.ref_lr)] if a.ref_lr else [])
    rc, res, log = runner.run(f"parity_np{r}", "parity", "zeroshard", args, ranks=r)
    if rc != 0:
        failed(rep, name, rc, log, f"bf16, {r} rank(s), stages 0 and 3")
        rep.digest.append(f"{name}: failed")
        return
    res = res if isinstance(res, list) else [res]
    say(f"{name}: torch {res[0]['torch_version']}, libzeroshard {res[0]['zeroshard_lib']}")
    ref = res[0]["runs"]["torch"]["losses"]
    diffs, hashes = [], {}
    for st in (0, 3):
        runs = [x["runs"][f"stage{st}"] for x in res]
        loss = [statistics.fmean(v) for v in zip(*(run["losses"] for run in runs))]   # the global batch's
        d_end, d_max = abs(loss[-1] - ref[-1]), max(abs(x - y) for x, y in zip(loss, ref))
        hashes[st] = runs[0]["params_hash"]
        verdict = "PASS" if d_end <= LOSS_TOL else "FAIL"
        rep.line(f"{name} stage {st}", verdict, f"loss {loss[-1]:.5f}, plain PyTorch {ref[-1]:.5f} after "
                 f"{len(ref)} steps: |diff| {d_end:.2e} (limit {LOSS_TOL:g}; largest over the steps {d_max:.2e})")
        diffs.append(f"{d_end:.1e}")
    same = hashes[0] == hashes[3]
    rep.line(f"{name} stage 0 = stage 3", "PASS" if same else "FAIL",
             f"params-hash of the fp32 masters {hashes[0]} at stage 0, {hashes[3]} at stage 3")
    rep.digest.append(f"{name} bf16: |loss - PyTorch| {' and '.join(diffs)} at stages 0 and 3 (limit "
                      f"{LOSS_TOL:g}), stage 0 {'=' if same else '!='} stage 3 bits ({hashes[0][:8]})")


def check_perf(runner, rep, a, p):
    """torch, ZeroShard (and DeepSpeed) in turn, rep after rep; each rep's ratio pairs runs made side by side."""
    backends = ["torch", "zeroshard"]
    ds_why = deepspeed_ready(runner, a)
    if ds_why is None:
        backends.append("deepspeed")
    args = ["--model", p["model"], "--seq", str(p["seq"]), "--batch", str(p["perf_batch"]), "--stage", "0",
            "--steps", str(p["perf_steps"]), "--warmup", str(p["warmup"])]
    got = {b: [] for b in backends}
    rep_time, ds_log = 0.0, None
    for i in range(p["reps"]):
        if i > 0 and runner.left() < rep_time * 1.2:
            say(f"perf: {i} of {p['reps']} reps: no time for another")
            break
        t0 = time.time()
        for b in list(backends):
            rc, res, log = runner.run(f"perf_{b}_{i}", "perf", b, args)
            if rc == 0:
                got[b].append(res)
            elif rc == "deadline" and i > 0:
                break
            elif b == "deepspeed":
                ds_why = "no time left for its run" if rc == "deadline" else f"its run failed, rc {rc}: {why(log)}"
                ds_log = log if rc != "deadline" else None
                backends.remove(b)
                del got[b]
            else:
                failed(rep, f"perf {b}", rc, log, f"rep {i + 1}")
                rep.digest.append(f"perf: {b} failed")
                return
        else:
            rep_time = time.time() - t0
            continue
        say(f"perf: the time ran out during rep {i + 1}: it is left out")
        for b in got:
            del got[b][i:]
        break
    n = len(got["torch"])
    setup = (f"median of {n} rep(s) of {p['perf_steps']} steps after {p['warmup']} warm-up, batch "
             f"{p['perf_batch']} x {p['seq']} tokens, model {p['model']}, stage 0, bf16, 1 rank")
    what = got["torch"][0]["mem_what"]
    say(f"perf: memory is the {what}, its peak at the ends of forward, backward and step, less its value "
        f"before the model was built")
    torch_tps = [statistics.median(r["tokens_per_s"]) for r in got["torch"]]
    torch_mem = [r["mem_run"] for r in got["torch"]]
    digest = []
    for b, label in (("zeroshard", "ZeroShard"), ("deepspeed", "DeepSpeed")):
        if b not in got:
            rep.line("perf DeepSpeed", "SKIP", f"DeepSpeed not compared: {ds_why}")
            digest.append(f"DeepSpeed skipped: {ds_why}")
            if ds_log:
                show_tail(ds_log)
            continue
        tps = [statistics.median(r["tokens_per_s"]) for r in got[b]]
        mem = [r["mem_run"] for r in got[b]]
        ratio = [x / y for x, y in zip(tps, torch_tps)]
        mratio = [x / y if y > 0 else float("nan") for x, y in zip(mem, torch_mem)]
        rep.line(f"perf {label} tokens/s", "PASS", f"{label}/PyTorch {spread(ratio, '{:.2f}')}; {label} "
                 f"{spread(tps, '{:.0f}')}, PyTorch {spread(torch_tps, '{:.0f}')} tokens/s ({setup})")
        rep.line(f"perf {label} memory", "PASS", f"{label}/PyTorch {spread(mratio, '{:.2f}')}; {label} "
                 f"{fmt_bytes(statistics.median(mem))}, PyTorch {fmt_bytes(statistics.median(torch_mem))} ({what}, "
                 f"above the process's base of {fmt_bytes(got[b][0]['mem_base'])})")
        digest.append(f"{label}/PyTorch tokens/s {statistics.median(ratio):.2f}, memory "
                      f"{statistics.median(mratio):.2f}")
    rep.digest.append("perf: " + ", ".join(digest) + f" ({n} reps)")


def probe_size(p, layers):
    width, heads, vocab = p["probe"]
    n = layers * (12 * width * width + 13 * width) + (vocab + p["probe_seq"] + 2) * width
    return n, ["--model", f"{layers},{width},{heads},{vocab}", "--seq", str(p["probe_seq"]),
               "--batch", str(p["probe_batch"]), "--steps", str(p["probe_steps"])]


def host_available():
    with open("/proc/meminfo") as f:
        for ln in f:
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1]) * 1024
    return 0


def check_offload(runner, rep, a, p):
    b = a.backend
    label = {"zeroshard": "ZeroShard", "deepspeed": "DeepSpeed"}[b]
    name = f"offload {label}"
    if b == "deepspeed":
        if a.device.startswith("cuda") and not cuda_visible():
            rep.line(name, "FAIL", "torch sees no CUDA device")
            return
        ds_why, log = deepspeed_ready(runner, a), None
        if ds_why is None:
            rc, res, log = runner.run("ds_ops", "ds-ops", b, [], cap=240)
            if rc != 0:
                ds_why = {"deadline": "no time left to build its CPU Adam op (DeepSpeedCPUAdam, JIT)",
                          "timeout": "its CPU Adam op (DeepSpeedCPUAdam, JIT) did not build in the time left"}.get(
                    rc, f"its CPU Adam op (DeepSpeedCPUAdam, JIT) did not build: rc {rc}: {why(log)}")
            else:
                log = None
                say(f"DeepSpeed's CPU Adam op built in {res['built_s']:.0f} s")
        if ds_why is not None:
            rep.line(name, "SKIP", f"DeepSpeed's ZeRO-Offload not probed: {ds_why}")
            rep.digest.append(f"{name}: skipped: {ds_why}")
            if log:
                show_tail(log)
            return
    best, stop, layers, failed_log = None, None, p["probe_layers"], None
    for _ in range(p["max_sizes"]):
        n, args = probe_size(p, layers)
        need, avail = n * HOST_BYTES, host_available()
        if need > 0.8 * avail:
            stop = (f"{fmt_params(n)} parameters not tried: the host-memory guard (~{fmt_bytes(need)} at "
                    f"{HOST_BYTES} B a parameter, {fmt_bytes(avail)} available)")
            break
        rc, res, log = runner.run(f"offload_{b}_{layers}", "probe", b, args, cap=p["size_cap"])
        if rc != 0:
            text = {"deadline": "the time cap", "timeout": f"the time cap (not done in {p['size_cap']} s or "
                    "the step's time left)"}.get(rc, f"rc {rc}: {why(log)}")
            stop = f"{fmt_params(n)} parameters ({layers} layers) stopped by {text}"
            failed_log = log if rc != "deadline" else None
            break
        best = (layers, res)
        say(f"offload {label}: {fmt_params(res['params'])} parameters ({layers} layers): steps "
            f"{', '.join(f'{t:.2f}' for t in res['step_s'])} s; set-up {res['setup_s']:.1f} s; peak "
            f"{fmt_bytes(res['mem_peak'])} ({res['mem_what']}), host peak RSS {fmt_bytes(res['host_peak_rss'])}")
        layers *= 2
    else:
        stop = f"the size limit ({p['max_sizes']} sizes)"
    width = p["probe"][0]
    if best is None:
        verdict = "SKIP" if b == "deepspeed" else "FAIL"
        rep.line(name, verdict, f"the smallest size did not train one step: {stop}")
        rep.digest.append(f"{name}: the smallest size failed")
        if failed_log:
            show_tail(failed_log)
        return
    layers, res = best
    t = res["step_s"]
    rep.line(name, "PASS", f"largest {fmt_params(res['params'])} parameters ({layers} layers x {width}, stage 2, "
             f"optimizer on the CPU, bf16): a step in {t[-1]:.2f} s (the first {t[0]:.2f} s), peak "
             f"{fmt_bytes(res['mem_peak'])} ({res['mem_what']}); next: {stop}")
    if failed_log:
        show_tail(failed_log, 12)
    rep.digest.append(f"{name}: {fmt_params(res['params'])} parameters, {t[-1]:.2f} s a step")


def cuda_visible():
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")   # asked of NVML: no CUDA context in the driver
    import torch
    return torch.cuda.is_available()


# ------------------------------------------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["parity", "perf", "offload", "all"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--ranks", type=int, default=1, choices=[1, 2])
    ap.add_argument("--backend", default="zeroshard", choices=["zeroshard", "deepspeed"])
    ap.add_argument("--deepspeed", default="auto", choices=["auto", "off"])
    ap.add_argument("--ds-wheels", help="a folder of wheels: deepspeed-*.whl and what it needs that python3 lacks")
    ap.add_argument("--scratch", help="a folder for the runs' results and logs (default: a new one in TMPDIR)")
    ap.add_argument("--time", type=float, default=600, help="seconds for all of it (ZS_STEP_END may say less)")
    ap.add_argument("--reps", type=int, help="perf: reps (default: the device's preset)")
    ap.add_argument("--ref-lr", type=float, help="parity: another learning rate for the plain-PyTorch reference, "
                    "so that the comparison must fail (the CPU test checks that it does)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    a.scratch = a.scratch or tempfile.mkdtemp(prefix="gpu_check_torch.")
    os.makedirs(a.scratch, exist_ok=True)
    p = dict(PRESETS[a.device])
    if a.reps:
        p["reps"] = a.reps
    runner, rep = Runner(a), Report()
    say(f"{a.what} on {a.device}: model {p['model']} (layers,width,heads,vocab), scratch {a.scratch}, "
        f"{runner.left():.0f} s")
    if a.device == "cuda" and not cuda_visible():
        rep.line(a.what, "FAIL", "torch sees no CUDA device (torch.cuda.is_available() is False)")
        return rep.finish()
    if a.what == "all":
        for a.ranks in (1, 2):
            check_parity(runner, rep, a, p)
        check_perf(runner, rep, a, p)
        for a.backend in ("zeroshard", "deepspeed"):
            check_offload(runner, rep, a, p)
    else:
        {"parity": check_parity, "perf": check_perf, "offload": check_offload}[a.what](runner, rep, a, p)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
