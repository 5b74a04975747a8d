"""largest.py - the largest GPT-2-shaped model that trains N steps under a memory limit, for ZeroShard
(`import zeroshard as deepspeed`) and DeepSpeed itself, with the same script and config, one after the other in
one invocation.

  python3 bench/largest.py [--backends zeroshard,deepspeed] [--width 2304 --heads 18 --ctx 64] [--ranks 2]
                           [--steps 3] [--start 4] [--resolution 2] [--max-layers 96] [--mem-limit GiB]
                           [--nvme DIR] [--ds-python PY] [--at L ...] [--trial-timeout S]

The probe runs on the layer count at a fixed width: it doubles from --start while a run trains (trying
--max-layers itself before it stops there), then bisects between the last size that trained and the first that
did not, down to --resolution layers. A trial trains when
every rank finishes --steps steps of micro-batch 1 (the script below: a Hugging Face GPT2LMHeadModel built under
zero.Init, AdamW, stage 3 with offload_param and offload_optimizer on NVMe) while the job's processes together
stay under --mem-limit of memory (default: 92% of MemAvailable at the start); a guard sums their proportional set
sizes (PSS: the ranks' shared buffers once) every 0.2 s and kills the job at the limit, before the kernel's OOM
killer would pick a process of its own. Then
each backend also runs at the other's largest size that it trains (--at adds sizes), so that both step times are
measured at DeepSpeed's largest.

Per trial: layers, parameters, the outcome, s/step (the median of the steps after the first) and the largest
rank's peak RSS (the job's VmHWM, or the guard's highest sample when it was killed); for ZeroShard also the
engine's bytes at the peak (engine.memory()) beside zs-estimate's prediction for that size. Both backends are
launched by mpirun with the same binding (DeepSpeed gets RANK / WORLD_SIZE / MASTER_ADDR from Open MPI's
variables and uses its CPU accelerator). Every command is printed before it runs. DeepSpeed must be importable
by --ds-python; DeepSpeed's CPU ranks leave shared-memory buffers in /dev/shm, removed after each of its runs.
"""
import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 1 << 20


def ds_config(a):
    nv = {"device": "nvme", "nvme_path": a.nvme}
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {"stage": 3, "sub_group_size": 5e7, "stage3_max_live_parameters": 1e8,
                                  "stage3_max_reuse_distance": 0, "offload_optimizer": dict(nv),
                                  # DeepSpeed's swapper needs a buffer as large as the largest parameter (the
                                  # embedding); ZeroShard sizes its own from the units and ignores the key
                                  "offload_param": dict(nv, buffer_size=int(1.2e8))}}


def units(a, layers):
    """ZeroShard's units of the model (python/zeroshard/_plan.py: each block, then the rest): for zs-estimate."""
    d = a.width
    block = 12 * d * d + 13 * d
    rest = a.vocab * d + a.ctx * d + 2 * d
    return [rest] + [block] * layers


def params(a, layers):
    return sum(units(a, layers))


# ---------------------------------------------------------------- the job (one rank)

def job(a):
    backend = os.environ.get("ZS_BACKEND", "zeroshard")
    if backend == "zeroshard":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import zeroshard as deepspeed
    else:
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = json.load(open(a.config))
    c = GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=a.heads, vocab_size=a.vocab, n_positions=a.ctx,
                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = GPT2LMHeadModel(c)
    eng, _, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(a.steps):
        x = torch.randint(0, a.vocab, (1, a.ctx), generator=g)
        t = time.time()
        loss = eng(input_ids=x, labels=x).loss
        eng.backward(loss)
        eng.step()
        times.append(time.time() - t)
        print(f"rank {eng.global_rank} step {len(times)} {times[-1]:.2f} s loss {loss.item():.4f}", flush=True)
    hwm = [int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0]
    out = {"rank": eng.global_rank, "step_s": times, "peak_rss": hwm}
    if backend == "zeroshard":
        m = eng.memory()
        out["engine_at_peak"] = m["peak"]["engine_total"]
        out["peak_sampled"] = m["peak"]["rss"]
        out["torch_at_peak"] = m["peak"]["torch"] + m["peak"]["heap_free"]
        out["peers_at_peak"] = m["peak"]["peers_shared"]
    print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- the driver

def tree(pid):
    """pid and its descendants (from /proc)."""
    kids = {}
    for st in glob.glob("/proc/[0-9]*/stat"):
        try:
            f = open(st).read().rsplit(")", 1)[1].split()
            kids.setdefault(int(f[1]), []).append(int(st.split("/")[2]))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def field(path, name):
    try:
        for ln in open(path):
            if ln.startswith(name):
                return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss(pid):
    return field(f"/proc/{pid}/status", "VmRSS:")


def pss(pid):
    """The process's share of the memory it maps: a page shared by k processes counts 1/k in each (the ranks'
    shared-memory collectives' buffers once in the sum, where RSS would count them in every rank)."""
    return field(f"/proc/{pid}/smaps_rollup", "Pss:")


def guarded(cmd, env, limit, timeout, log):
    """Runs cmd in a session of its own; kills it when its processes' PSS together pass limit. Returns (exit code,
    'ok' / 'over the memory limit' / 'timed out', highest summed PSS, highest RSS of one process)."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, shell=True, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    state = {"why": "ok", "sum": 0, "one": 0}

    def watch():
        t0 = time.time()
        while p.poll() is None:
            procs = tree(p.pid)
            total = sum(pss(q) for q in procs)
            state["sum"] = max(state["sum"], total)
            state["one"] = max([state["one"]] + [rss(q) for q in procs])
            if total > limit or time.time() - t0 > timeout:
                state["why"] = "over the memory limit" if total > limit else "timed out"
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            time.sleep(0.2)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    rc = p.wait()
    w.join()
    return rc, state["why"], state["sum"], state["one"]


def estimate(a, layers, cfg_path):
    exe = a.estimate
    if not exe or not os.path.exists(exe):
        return None
    us = ",".join(str(u) for u in units(a, layers))
    p = subprocess.run([exe, "--world", str(a.ranks), "--units", us, "--config", cfg_path, "--json"],
                       capture_output=True, text=True)
    if p.returncode:
        return None
    e = json.loads(p.stdout)["estimate"]
    return sum(e.get(k, 0) for k in ("params", "grads", "optimizer", "comm_buffers", "swap_buffers", "prefetch_cap"))


def trial(a, backend, layers, tmp, cache):
    key = (backend, layers)
    if key in cache:
        return cache[key]
    cfg_path = os.path.join(tmp, "ds.json")
    port = 29600 + len(cache)
    script = os.path.abspath(__file__)
    args = (f"job --layers {layers} --width {a.width} --heads {a.heads} --ctx {a.ctx} --vocab {a.vocab} "
            f"--steps {a.steps} --config {cfg_path}")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore")
    py = sys.executable if backend == "zeroshard" else a.ds_python
    inner = (f"RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK "
             f"LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE exec {py} {script} {args}")
    cmd = (f"mpirun --oversubscribe -np {a.ranks} -x ZS_BACKEND={backend} -x MASTER_ADDR=127.0.0.1 "
           f"-x MASTER_PORT={port} bash -c '{inner}'")
    print(f"$ {cmd}", flush=True)
    log = os.path.join(tmp, f"{backend}-{layers}.log")
    t0 = time.time()
    rc, why, peak_sum, peak_one = guarded(cmd, env, a.limit, a.trial_timeout, log)
    if backend == "deepspeed":
        for f in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{port}_*"):
            os.remove(f)
    res = [json.loads(ln[7:]) for ln in open(log) if ln.startswith("RESULT ")]
    ok = why == "ok" and rc == 0 and len(res) == a.ranks
    if why == "ok" and not ok:
        lines = [ln.strip() for ln in open(log) if ln.strip()]
        err = [ln for ln in lines if "Error" in ln or "error:" in ln or "Killed" in ln]
        why = f"failed (exit {rc}): {(err or lines or ['no output'])[-1][:160]}"
    r = {"backend": backend, "layers": layers, "params": params(a, layers), "ok": ok, "why": why,
         "wall_s": time.time() - t0, "peak_rss": max([x["peak_rss"] for x in res] or [peak_one]),
         "peak_sum": peak_sum, "log": log}
    r["pss"] = peak_sum
    if ok:
        steps = [statistics.median(x["step_s"][i] for x in res) for i in range(a.steps)]
        kept = steps[1:] or steps
        r.update(step_s=statistics.median(kept), step_range=(min(kept), max(kept)), steps=steps)
        if backend == "zeroshard":
            r["engine"] = max(x["engine_at_peak"] for x in res)
            r["torch"] = max(x["torch_at_peak"] for x in res)
            r["peers"] = max(x["peers_at_peak"] for x in res)
            r["estimate"] = estimate(a, layers, cfg_path)
    cache[key] = r
    show(r)
    return r


def show(r):
    s = (f"  {r['backend']:9s} {r['layers']:3d} layers {r['params'] / 1e9:6.3f}B: "
         f"{'trains' if r['ok'] else r['why']}")
    if r["ok"]:
        s += (f", {r['step_s']:.1f} s/step ({r['step_range'][0]:.1f}..{r['step_range'][1]:.1f}), "
              f"peak RSS {r['peak_rss'] / MiB:.0f} MiB/rank, PSS of the job {r['pss'] / MiB:.0f} MiB")
        if r.get("engine") is not None:
            est = f"{r['estimate'] / MiB:.0f}" if r.get("estimate") else "-"
            s += (f", at the peak the engine {r['engine'] / MiB:.0f} MiB (zs-estimate {est}), torch's heap "
                  f"{r['torch'] / MiB:.0f} MiB, the peer's shared pages {r['peers'] / MiB:.0f} MiB")
    else:
        s += f" (highest RSS of a process {r['peak_rss'] / MiB:.0f} MiB, PSS of the job {r['peak_sum'] / MiB:.0f} MiB)"
    print(s + f" [{r['wall_s']:.0f} s]", flush=True)


def probe(a, backend, tmp, cache):
    """The largest layer count that trains: doubling, then bisecting. 0 when even --start does not."""
    good, bad, L = 0, None, a.start
    while L <= a.max_layers:
        if trial(a, backend, L, tmp, cache)["ok"]:
            good = L
            L = a.max_layers if L < a.max_layers < 2 * L else 2 * L   # the cap itself once, before stopping
        else:
            bad = L
            break
    if bad is None:
        return good   # --max-layers trains: the largest is at least that
    while good and bad - good > a.resolution:
        mid = (good + bad) // 2
        if trial(a, backend, mid, tmp, cache)["ok"]:
            good = mid
        else:
            bad = mid
    return good


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "job":
        ap = argparse.ArgumentParser()
        ap.add_argument("job")
        for k in ("layers", "width", "heads", "ctx", "vocab", "steps"):
            ap.add_argument("--" + k, type=int, required=True)
        ap.add_argument("--config", required=True)
        return job(ap.parse_args())
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="zeroshard,deepspeed")
    ap.add_argument("--width", type=int, default=2304)
    ap.add_argument("--heads", type=int, default=18)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--start", type=int, default=4)
    ap.add_argument("--resolution", type=int, default=2)
    ap.add_argument("--max-layers", type=int, default=96)
    ap.add_argument("--mem-limit", type=float, help="GiB for the job's processes together")
    ap.add_argument("--nvme", default=None, help="the swap directory (default: a folder under the scratch dir)")
    ap.add_argument("--ds-python", default=sys.executable)
    ap.add_argument("--estimate", default=os.path.join(ROOT, "build", "zs-estimate"))
    ap.add_argument("--at", type=int, nargs="*", default=[], help="more layer counts to run on every backend")
    ap.add_argument("--trial-timeout", type=float, default=1800)
    a = ap.parse_args()
    avail = [int(ln.split()[1]) * 1024 for ln in open("/proc/meminfo") if ln.startswith("MemAvailable")][0]
    a.limit = int(a.mem_limit * (1 << 30)) if a.mem_limit else int(0.92 * avail)
    tmp = tempfile.mkdtemp(prefix="largest-", dir=os.environ.get("TMPDIR", "/tmp"))
    a.nvme = a.nvme or os.path.join(tmp, "nvme")
    os.makedirs(a.nvme, exist_ok=True)
    json.dump(ds_config(a), open(os.path.join(tmp, "ds.json"), "w"))
    backends = a.backends.split(",")
    print(f"# {' '.join(sys.argv)}\n# width {a.width}, {a.heads} heads, context {a.ctx}, {a.ranks} ranks, "
          f"{a.steps} steps, memory limit {a.limit / (1 << 30):.1f} GiB for the job (MemAvailable "
          f"{avail / (1 << 30):.1f} GiB); config {json.dumps(ds_config(a))}", flush=True)
    cache, largest = {}, {}
    for b in backends:
        print(f"# {b}: probing", flush=True)
        largest[b] = probe(a, b, tmp, cache)
    for b in backends:   # each at the others' largest, and at --at
        for L in sorted(set(a.at) | {largest[o] for o in backends if largest[o]}):
            trial(a, b, L, tmp, cache)
    print("\n| backend | largest that trains | params | s/step there | peak RSS/rank |\n|---|---|---|---|---|")
    for b in backends:
        r = cache.get((b, largest[b]))
        if r and r["ok"]:
            cap = " (at least: --max-layers)" if largest[b] == a.max_layers else ""
            print(f"| {b} | {largest[b]} layers{cap} | {r['params'] / 1e9:.2f}B | {r['step_s']:.1f} | "
                  f"{r['peak_rss'] / MiB:.0f} MiB |")
        else:
            print(f"| {b} | none from {a.start} layers | | | |")
    print("\n| layers | params | " + " | ".join(f"{b} s/step, peak RSS/rank" for b in backends) + " |")
    print("|---|---|" + "---|" * len(backends))
    for L in sorted({k[1] for k in cache}):
        row = []
        for b in backends:
            r = cache.get((b, L))
            row.append("" if not r else f"{r['step_s']:.1f} s, {r['peak_rss'] / MiB:.0f} MiB" if r["ok"] else r["why"])
        print(f"| {L} | {params(a, L) / 1e9:.2f}B | " + " | ".join(row) + " |")
    print(f"\n(logs in {tmp})")


if __name__ == "__main__":
    main()
