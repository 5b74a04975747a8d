"""A deepspeed.initialize loop written for elastic runs, as torchrun's elastic agent expects scripts to be: on
every start it resumes from the newest checkpoint in --ckpt if there is one (engine.load_checkpoint with no
tag: `latest`), and takes its data by global sample index, so the global batch of step s is samples
[s * B, (s + 1) * B) whatever the world size (B = train_batch_size, kept by the config's rule). Saves every
--save-every steps. Prints the step, and last a hash of the parameters.

    elastic_loop.py --deepspeed_config ds.json --ckpt DIR [--steps 12] [--save-every 3] [--step-time 0.3]

--step-time stands in for a real model's compute (a sleep per optimizer step), so that a test can kill a rank
at a step of its choosing; --crash-save kills one mid-save, --fail-at makes one raise.
"""
import argparse
import hashlib
import os
import time

import deepspeed
import torch

from ds_loop import Net   # the model of the plain loop beside this script


def samples(index, d=32):
    """The dataset: sample i is the same tensor on every rank and at every world size."""
    x = torch.stack([torch.randn(d, generator=torch.Generator().manual_seed(7919 * i + 1)) for i in index])
    return x, x.sum(-1).sin()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--crash-save", default=None, metavar="RANK:STEP",
                    help="test hook, first attempt only: RANK dies (SIGKILL) halfway through writing its file of "
                         "the checkpoint at STEP (the library's ZS_TEST_CKPT_CRASH)")
    ap.add_argument("--fail-at", default=None, metavar="RANK:STEP",
                    help="test hook, first attempt only: RANK raises an exception after STEP (a transient error)")
    ap.add_argument("--local_rank", type=int, default=-1)
    ap = deepspeed.add_config_arguments(ap)
    args = ap.parse_args()
    if args.crash_save and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os.environ["ZS_TEST_CKPT_CRASH"] = args.crash_save
    torch.manual_seed(0)
    model = Net()
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    rank, world = engine.global_rank, engine.world_size
    path, _ = engine.load_checkpoint(args.ckpt)
    start = engine.global_steps
    if rank == 0:
        print(f"start: world {world}, restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}, "
              f"{'resumed from ' + os.path.basename(path) if path else 'no checkpoint'} at step {start}", flush=True)
    micro, gas, batch = (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
                         engine.train_batch_size())
    engine.train()
    for step in range(start, args.steps):
        for j in range(gas):   # micro-batch j of rank r: the (j * world + r)-th run of `micro` samples of the step
            first = step * batch + (j * world + rank) * micro
            x, y = samples(range(first, first + micro))
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
        time.sleep(args.step_time)
        if args.fail_at and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and \
                args.fail_at == f"{rank}:{step + 1}":
            raise RuntimeError(f"a transient error on rank {rank} after step {step + 1} (--fail-at)")
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.9g}", flush=True)
        if (step + 1) % args.save_every == 0:
            engine.save_checkpoint(args.ckpt)
    if engine.zero_optimization_stage() == 3:
        sd = engine._zero3_consolidated_16bit_state_dict()
    else:
        sd = engine.module.state_dict()
    if rank == 0:
        h = hashlib.sha256()
        for k in sorted(sd):
            h.update(k.encode())
            h.update(sd[k].detach().float().contiguous().numpy().tobytes())
        print(f"params-sha256 {h.hexdigest()[:16]} world {world}", flush=True)


if __name__ == "__main__":
    main()
