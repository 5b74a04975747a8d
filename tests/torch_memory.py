"""torch_memory.py - engine.memory() accounts for the process: run under mpirun (torch_memory.sh, 2 ranks), a
small GPT-shaped torch model trains 3 steps at stages 0-3, with and without offload (the optimizer to the host
pool or NVMe, stage 3's parameters too). For each configuration, on every rank:

  - the categories at the report's peak (the engine's by category, torch's C heap, malloc's free memory,
    Python's objects, the peers' shared buffers, code, the libraries' data) add up to within TOL of the
    process's measured peak RSS (VmHWM, reset before each configuration): what no category names ("other")
    and what the samples missed ("peak_rss" less the sampled RSS) are both within it. One configuration's
    forward holds a 256 MiB temporary for 0.3 s, between engine calls: the peak is then the watcher thread's
    sample, and the temporary is in its torch category;
  - the engine's categories are those zs_estimate_memory predicts for the same units and config (params, grads,
    optimizer, swap buffers, host pool, stage 3's gathered cap, the NVMe file), byte for byte;
  - the report reads back sane (its RSS within 20% of /proc's, its step the engine's global step).

Rank 0 prints each configuration's peak line (MiB) and the verdict; exit 1 on a failure, 77 to skip.
"""
import ctypes
import json
import os
import sys
import tempfile
import time

try:
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"torch_memory: skipped: torch cannot be imported ({e})")
    sys.exit(77)

import zeroshard
from zeroshard import _lib as L

TOL = 0.10           # the bound: the categories within 10% of the peak RSS
TRANSIENT = 256 << 20
VOCAB, DIM, LAYERS, CTX, MICRO = 4096, 256, 4, 64, 4
MIB = 1 << 20
failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL rank {RANK}: {msg}", flush=True)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)

    transient = False

    def forward(self, x):
        if self.transient:   # a temporary of the program's, between two engine calls, held a while
            t = torch.ones(TRANSIENT // 4)
            time.sleep(0.3)
            del t
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        logits = self.ln(h) @ self.emb.weight.t()   # the head tied to the embedding, as GPT-2's
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), x.view(-1))


def configs(nvme):
    def cfg(stage, opt=None, param=None):
        z = {"stage": stage, "stage3_param_persistence_threshold": 0}
        for key, dev in (("offload_optimizer", opt), ("offload_param", param)):
            if dev:
                z[key] = {"device": dev, **({"nvme_path": nvme} if dev == "nvme" else {})}
        return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 0,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": z}
    return [("stage 0", cfg(0)), ("stage 2 with a transient", cfg(2)), ("stage 1", cfg(1)), ("stage 2", cfg(2)), ("stage 3", cfg(3)),
            ("stage 1 optimizer nvme", cfg(1, "nvme")), ("stage 2 optimizer cpu", cfg(2, "cpu")),
            ("stage 3 optimizer+params cpu", cfg(3, "cpu", "cpu")),
            ("stage 3 optimizer+params nvme", cfg(3, "nvme", "nvme"))]


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def estimate(engine, text):
    sizes = (ctypes.c_int64 * len(engine.units))(*[u.numel for u in engine.units])
    out = L.MemoryReport()
    if engine.lib.zs_estimate_memory(text.encode(), engine.world_size, len(engine.units), sizes,
                                     ctypes.byref(out)) != 0:
        fail(f"zs_estimate_memory: {engine.lib.zs_last_error().decode()}")
    return out


def run(name, cfg):
    with open("/proc/self/clear_refs", "w") as f:   # VmHWM back to the RSS now: this configuration's peak
        f.write("5")
    torch.manual_seed(5)
    model = Model()
    model.transient = "transient" in name
    engine, _, _, _ = zeroshard.initialize(model=model, config=cfg, model_parameters=model.parameters())
    g = torch.Generator().manual_seed(7 + RANK)
    for _ in range(3):
        x = torch.randint(0, VOCAB, (MICRO, CTX), generator=g)
        engine.backward(engine(x))
        engine.step()
    m = engine.memory()
    now, peak = m["now"], m["peak"]
    hwm = status_kb("VmHWM") * 1024
    named = peak["rss"] - peak["other"]
    missed = hwm - peak["rss"]
    line = (f"{name}: peak RSS {hwm / MIB:.1f} MiB, sampled {peak['rss'] / MIB:.1f} at step {peak['step']}: engine "
            f"{peak['engine_total'] / MIB:.1f} (" + ", ".join(f"{k} {v / MIB:.1f}" for k, v in peak["engine"].items())
            + f"), torch {peak['torch'] / MIB:.1f}, heap free {peak['heap_free'] / MIB:.1f}, python "
            f"{peak['python_objects'] / MIB:.1f}, peers' shared {peak['peers_shared'] / MIB:.1f}, code "
            f"{peak['mapped_files'] / MIB:.1f}, libraries' data {peak['lib_data'] / MIB:.1f}, other "
            f"{peak['other'] / MIB:.1f}; named {100 * named / hwm:.1f}% of the peak")
    if RANK == 0:
        print(line, flush=True)
    if abs(hwm - named) > TOL * hwm:
        fail(f"{name}: the named categories ({named / MIB:.1f} MiB) are not within {TOL:.0%} of the peak RSS "
             f"({hwm / MIB:.1f} MiB): other {peak['other'] / MIB:.1f}, missed by the samples {missed / MIB:.1f}")
    if model.transient and peak["torch"] < TRANSIENT:
        fail(f"{name}: the peak's torch category ({peak['torch'] / MIB:.1f} MiB) misses the forward's "
             f"{TRANSIENT / MIB:.0f} MiB temporary (no engine call sees it: the watcher's samples must)")
    if peak["engine_total"] != sum(peak["engine"].values()):
        fail(f"{name}: the engine's categories ({sum(peak['engine'].values())}) do not add up to its total "
             f"({peak['engine_total']})")
    rss = status_kb("VmRSS") * 1024
    if not 0.8 * rss <= now["rss"] <= 1.2 * rss or now["step"] != engine.global_steps:
        fail(f"{name}: the report reads back wrong: RSS {now['rss']} against /proc's {rss}, step {now['step']} "
             f"against {engine.global_steps} (zs_memory_report's layout in _lib.MemoryReport?)")
    e, r = estimate(engine, json.dumps(engine.config)), L.MemoryReport()
    engine.lib.zs_memory(engine.ctx, ctypes.byref(r))
    for k in ("params", "grads", "optimizer", "swap_buffers", "pinned_pool", "prefetch_cap", "nvme"):
        if getattr(e, k) != getattr(r, k):
            fail(f"{name}: {k}: zs_estimate_memory predicts {getattr(e, k)}, the engine holds {getattr(r, k)}")
    engine.destroy()
    del engine, model


def main():
    global RANK
    RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    nvme = os.path.join(os.environ.get("ZEROSHARD_SPILL_DIR") or tempfile.gettempdir(), "memory_nvme")
    os.makedirs(nvme, exist_ok=True)   # one path on every rank: each rank's file goes in its own folder in it
    for name, cfg in configs(nvme):
        run(name, cfg)
    if RANK == 0:
        print("torch_memory: " + ("ok" if not failures else f"{len(failures)} failure(s) on rank 0"), flush=True)
    sys.exit(1 if failures else 0)


RANK = 0
if __name__ == "__main__":
    main()
