"""A deepspeed.initialize training loop in the style of DeepSpeedExamples' training/HelloDeepSpeed: the config
from --deepspeed_config, the experiment folder made by the rank that reads RANK == 0, a checkpoint with
client_state every --save-every steps, and a resume from the latest one. Written for `deepspeed script.py` and
run unchanged by `zeroshard-run` (tests/ds_compat.sh). Prints one line per step and, last, a hash of the full
parameters (gathered at stage 3).

    ds_loop.py --deepspeed_config ds.json --out DIR [--steps 8] [--save-every 4] [--load]
"""
import argparse
import hashlib
import json
import os

import deepspeed
import torch


class Net(torch.nn.Module):
    def __init__(self, d=32, h=64, layers=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.Tanh(),
                                                              torch.nn.Linear(h, d)) for _ in range(layers))
        self.out = torch.nn.Linear(d, 1)

    def forward(self, x, y):
        for b in self.blocks:
            x = x + b(x)
        return torch.nn.functional.mse_loss(self.out(x).squeeze(-1), y)


def batch(step, rank, micro, d=32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(micro, d, generator=g)
    return x, x.sum(-1).sin()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--local_rank", type=int, default=-1)
    ap = deepspeed.add_config_arguments(ap)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])   # as HelloDeepSpeed: set by DeepSpeed's launcher (and zeroshard-run)
    exp = os.path.join(args.out, "experiment")
    if rank == 0:
        os.makedirs(exp, exist_ok=True)
    torch.manual_seed(0)
    model = Net()
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    start = 0
    if args.load:
        path, client = engine.load_checkpoint(exp)
        start = client["checkpoint_step"]
        print(f"rank {rank}: resumed from {os.path.basename(path)} at step {start}", flush=True)
    micro = engine.train_micro_batch_size_per_gpu()
    losses = []
    engine.train()
    for step in range(start, args.steps):
        x, y = batch(step, rank, micro)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.9g}", flush=True)
        if (step + 1) % args.save_every == 0:
            engine.save_checkpoint(exp, client_state={"checkpoint_step": step + 1})
    if engine.zero_optimization_stage() == 3:
        sd = engine._zero3_consolidated_16bit_state_dict()
    else:
        sd = {k: v for k, v in engine.module.state_dict().items()}
    if rank == 0:
        h = hashlib.sha256()
        for k in sorted(sd):
            h.update(k.encode())
            h.update(sd[k].detach().float().contiguous().numpy().tobytes())
        print(f"params-sha256 {h.hexdigest()[:16]}", flush=True)
        with open(os.path.join(args.out, f"losses{'-resumed' if args.load else ''}.json"), "w") as f:
            json.dump({"start": start, "losses": losses, "hash": h.hexdigest()[:16]}, f)


if __name__ == "__main__":
    main()
