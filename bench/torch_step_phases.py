"""torch_step_phases.py - where one training step of examples/pytorch/train_gpt.py's model goes: forward,
backward and step (medians over the steps after the first 2), and for ZeroShard the time spent inside the
library's calls (gathers, reductions and the waits on the other ranks in them, the optimizer) against the
front end's own Python (hooks, views, ctypes) around them.

  mpirun -np 2 python3 bench/torch_step_phases.py --config CFG [--layers 4 --dim 256 --heads 4 --ctx 128]
  mpirun -np 2 -x ZS_BACKEND=deepspeed -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 bash -c \
      'RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE exec DSPY bench/torch_step_phases.py --config CFG'

Each rank prints one line: ms per step in forward / backward / step, and (ZeroShard) ms per step in each
front-end method with the library calls it makes, whose difference is the front end's own cost.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "pytorch")]
import train_gpt as T   # noqa: E402  (picks the backend from ZS_BACKEND, as the example does)

DROP = 2


def timed(obj, name, acc, key):
    f = getattr(obj, name)

    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
    setattr(obj, name, g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    for k, v in (("layers", 4), ("dim", 256), ("heads", 4), ("ctx", 128), ("steps", 10)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--data", default=os.path.join(ROOT, "tests", "data", "parity.txt"))
    a = ap.parse_args()
    acc = {}
    zs = os.environ.get("ZS_BACKEND") != "deepspeed"
    if zs:   # wrapped before initialize, which registers the hooks as bound methods
        import zeroshard._lib as L
        import zeroshard.engine as E
        for n in ("_grad_hook", "_hand", "_acquire", "_release", "_pack", "_unpack"):
            timed(E.ZeroShardEngine, n, acc, "py " + n)
        lib = L.lib()
        for n in ("zs_grad_ready", "zs_grad_buffer", "zs_unit_fetch", "zs_unit_release", "zs_step"):
            timed(lib, n, acc, "C " + n)
    T.torch.manual_seed(1)
    model = T.GPT(a.layers, a.dim, a.heads, a.ctx)
    with open(a.config) as f:
        cfg = json.load(f)
    eng, *_ = T.deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    with open(a.data, "rb") as f:
        data = T.torch.frombuffer(bytearray(f.read()), dtype=T.torch.uint8)
    rows = []
    for s in range(a.steps):
        if s == DROP:
            acc.clear()
        for x, y in T.batches(data, a.ctx, s, eng.global_rank, eng.train_micro_batch_size_per_gpu(),
                              eng.world_size, 1, 1):
            t0 = time.perf_counter()
            loss = eng(x, y)
            t1 = time.perf_counter()
            eng.backward(loss)
            t2 = time.perf_counter()
            eng.step()
            rows.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    med = [statistics.median(c) * 1e3 for c in zip(*rows[DROP:])]
    kept = a.steps - DROP
    extra = " ".join(f"{k} {v * 1e3 / kept:.2f}" for k, v in sorted(acc.items()))
    print(f"rank {eng.global_rank} {'zeroshard' if zs else 'deepspeed'} ms/step: forward {med[0]:.1f} "
          f"backward {med[1]:.1f} step {med[2]:.1f}" + (f" | {extra}" if extra else ""), flush=True)


if __name__ == "__main__":
    main()
