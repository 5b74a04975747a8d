"""gpt_bench_torch.py - the PyTorch side of bench/gpt_bench.sh: zs-train-gpt's transformer (tests/gpt_torch.py)
trained on the CPU as one process, under DDP and under FSDP (FSDP2's fully_shard; gloo, mp.spawn; one FSDP
unit per block as ZeroShard has one unit per block), with AdamW and gradient clipping, on the same batches.

  python3 gpt_bench_torch.py MODE --world W --threads N --data FILE --layers L --dim D --heads H --ctx T
      --batch GLOBAL_SEQUENCES --steps S [--bf16]
MODE is single, ddp or fsdp. --bf16: the forward under torch.autocast("cpu", bfloat16) (PyTorch's own mixed
precision: fp32 parameters, bf16 matrix products through oneDNN, fp32 sums), backward outside it. Prints one JSON line per rank:
{"mode", "rank", "world", "step_times": [...], "peak_rss_kb", "import_rss_kb" (after importing torch, before
the model)}; the first step is the caller's to discard.
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import gpt_torch  # noqa: E402  defines: GPT, Block, Corpus


def run(rank, a):
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # torch imported, nothing built yet
    torch.set_num_threads(a.threads)
    if a.mode != "single":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(a.port))
        dist.init_process_group("gloo", rank=rank, world_size=a.world)
    model = gpt_torch.GPT(a.layers, a.dim, a.heads, a.ctx)
    model.init_normal(1)
    if a.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif a.mode == "fsdp":  # FSDP2: FSDP1 refuses a machine without an accelerator
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (a.world,))
        for blk in model.h:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    corpus = gpt_torch.Corpus(a.data, a.ctx)
    micro = a.batch // a.world
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        inputs, targets = corpus.batch(1, step, rank * micro, micro)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": a.mode, "rank": rank, "world": a.world, "step_times": times, "peak_rss_kb": rss,
                      "import_rss_kb": base}),
          flush=True)
    if a.mode != "single":
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["single", "ddp", "fsdp"])
    ap.add_argument("--data", required=True)
    for flag, default in (("--world", 1), ("--threads", 1), ("--layers", 6), ("--dim", 384), ("--heads", 6),
                          ("--ctx", 256), ("--batch", 8), ("--steps", 5), ("--port", 29517)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    if a.mode == "single":
        a.world = 1
        run(0, a)
    else:
        mp.spawn(run, args=(a,), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
