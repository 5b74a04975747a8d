"""A training loop in the style of Accelerate's examples/nlp_example.py and by_feature/gradient_accumulation.py:
Accelerator() takes its DeepSpeed plugin from the launcher's environment (`accelerate launch --use_deepspeed
--deepspeed_config_file ds.json`, or the same flags to `zeroshard-run`). Reads distributed_type, uses
accumulate(), gather_for_metrics() and save_state(). Nothing in it knows about ZeroShard.

    accel_loop.py OUT_DIR [--gas 3] [--epochs 2] [--batches 16] [--resume OUT_DIR/stateN --start-epoch N]
"""
import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch.utils.data import DataLoader, TensorDataset


class Classifier(torch.nn.Module):
    def __init__(self, d=24, h=48, classes=3):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, h), torch.nn.GELU())
        self.head = torch.nn.Linear(h, classes)

    def forward(self, x):
        return self.head(self.body(x))


def data(n, seed, d=24, classes=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gas", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batches", type=int, default=16, help="batches per epoch and rank")
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--resume", default=None, help="a save_state folder to load_state from first")
    ap.add_argument("--start-epoch", type=int, default=0, help="the epoch to start at (with --resume)")
    args = ap.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gas)
    set_seed(0)
    model = Classifier()
    world = accelerator.num_processes
    train_dl = DataLoader(data(args.batches * args.micro * world, 1), batch_size=args.micro, shuffle=False)
    eval_dl = DataLoader(data(37, 2), batch_size=5)   # 37 samples: the last batch is short, gather_for_metrics trims
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    steps = args.epochs * -(-args.batches // args.gas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1.0 - s / steps))
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, eval_dl, scheduler)
    if args.resume:
        accelerator.load_state(args.resume)
    log = {"distributed_type": str(accelerator.distributed_type), "num_processes": world,
           "deepspeed": accelerator.distributed_type == DistributedType.DEEPSPEED, "loss": [], "accuracy": [],
           "eval_samples": []}
    for epoch in range(args.start_epoch, args.epochs):
        model.train()
        for x, y in train_dl:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            log["loss"].append(accelerator.gather(loss.detach().reshape(1)).mean().item())
        model.eval()
        correct = total = 0
        for x, y in eval_dl:
            with torch.no_grad():
                pred = model(x).argmax(-1)
            pred, ref = accelerator.gather_for_metrics((pred, y))
            correct += (pred == ref).sum().item()
            total += ref.numel()
        log["accuracy"].append(correct / total)
        log["eval_samples"].append(total)
        accelerator.print(f"epoch {epoch}: accuracy {correct / total:.4f} over {total} samples")
        accelerator.save_state(os.path.join(args.out, f"state{epoch + 1}"))
    if accelerator.is_main_process:
        with open(os.path.join(args.out, "log-resumed.json" if args.resume else "log.json"), "w") as f:
            json.dump(log, f)


if __name__ == "__main__":
    main()
