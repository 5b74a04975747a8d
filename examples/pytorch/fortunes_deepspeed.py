"""fortunes_deepspeed.py - the fortunes task (fortunes.py) through DeepSpeed's own API: deepspeed.initialize
with the Hugging Face Trainer's AdamW groups and linear warm-up as client optimizer and scheduler, then
engine(batch), engine.backward(loss), engine.step(). The same script runs on DeepSpeed or on ZeroShard; the
one-line switch is the import (`import deepspeed` / `import zeroshard as deepspeed`), --strategy picks it:

    mpirun -np 2 python3 examples/pytorch/fortunes_deepspeed.py --strategy zeroshard_stage_3
    mpirun -np 2 python3 examples/pytorch/fortunes_deepspeed.py --strategy deepspeed_stage_3   # DeepSpeed

Both run under mpirun (DeepSpeed reads the torch.distributed variables this script derives from Open MPI's,
and runs on its CPU accelerator over gloo; its first run JIT-compiles its CPU ops). Global batch =
--micro-batch x ranks x --accum; every strategy draws the same batches (a DistributedSampler seeded by --seed).
"""
import os
import sys
import time

import fortunes

# Lightning's names: _offload moves the optimizer to the CPU, and at stage 3 the parameters too
STAGES = {"stage_0": (0, False), "stage_1": (1, False), "stage_2": (2, False), "stage_3": (3, False),
          "stage_2_offload": (2, True), "stage_3_offload": (3, True)}
STRATEGIES = [f"{backend}_{s}" for backend in ("zeroshard", "deepspeed") for s in STAGES]
PRECISIONS = {"32-true": {}, "bf16-mixed": {"bf16": {"enabled": True}}}
TAG = "last"   # one checkpoint name: each save replaces the previous


def ds_config(a, stage, offload):
    if a.precision not in PRECISIONS:
        raise SystemExit(f"fortunes_deepspeed: --precision {a.precision!r} is not supported here "
                         f"(takes {', '.join(PRECISIONS)})")
    # no "optimizer" or "scheduler" section: the client's are passed, as the Hugging Face Trainer does
    cfg = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": a.accum,
           "gradient_clipping": a.clip, "steps_per_print": 10 ** 9, "zero_optimization": {"stage": stage},
           **PRECISIONS[a.precision]}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
        cfg["zero_force_ds_cpu_optimizer"] = False   # DeepSpeed: keep the client's torch AdamW when offloading
    return cfg


def micro_batches(train, sampler, a, first_step):
    """The micro-batches of steps first_step+1.. in order, as a DataLoader over the sampler gives them (each
    epoch's last one short): micro-batch i of the run is batch i % n of epoch i // n, so a resumed run takes
    the batches the uninterrupted one would have."""
    per_epoch = -(-len(sampler) // a.micro_batch)
    i = first_step * a.accum
    while True:
        epoch, k = divmod(i, per_epoch)
        sampler.set_epoch(epoch)
        order = list(sampler)
        for j in range(k, per_epoch):
            idx = order[j * a.micro_batch:(j + 1) * a.micro_batch]
            yield {key: t[idx] for key, t in (("input_ids", train.ids), ("attention_mask", train.mask),
                                              ("labels", train.labels))}
        i = (epoch + 1) * per_epoch


def accuracy(engine, test, rank, world, batch=64):
    """Correct / total over the whole test split: rank r takes fortunes r, r + world, ...; every rank runs
    the same number of forwards (stage 3 gathers collectively), padding its last one with rows not counted."""
    import torch
    import torch.distributed as dist
    mine = list(range(rank, len(test), world))
    rounds = -(-((len(test) + world - 1) // world) // batch)
    correct = torch.zeros(2, dtype=torch.float64)
    engine.eval()
    with torch.no_grad():
        for r in range(rounds):
            idx = mine[r * batch:(r + 1) * batch]
            real = len(idx)
            idx = idx + [0] * (batch - real)
            logits = engine(input_ids=test.ids[idx], attention_mask=test.mask[idx]).logits
            hit = (logits.argmax(-1) == test.labels[idx])[:real]
            correct += torch.tensor([hit.sum().item(), real], dtype=torch.float64)
    engine.train()
    dist.all_reduce(correct)
    return correct[0].item() / correct[1].item()


def main():
    p = fortunes.parser(__doc__)
    p.add_argument("--strategy", default="zeroshard_stage_2", choices=STRATEGIES)
    a = p.parse_args()
    backend, stage_name = a.strategy.split("_", 1)
    stage, offload = STAGES[stage_name]
    fortunes.mpi_to_torch_env()   # DeepSpeed under mpirun: RANK, WORLD_SIZE, MASTER_ADDR, ... from Open MPI's
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))   # its CPU "devices"

    # The one-line switch: DeepSpeed's engine, or ZeroShard's behind the same API.
    if backend == "zeroshard":
        import zeroshard as deepspeed
    else:
        import deepspeed

    import torch
    import torch.distributed as dist
    import transformers
    transformers.logging.set_verbosity_error()   # a config without the hub's token ids warns per rank
    train, test, vocab = fortunes.datasets(a)
    model = fortunes.build_model(a, len(vocab))
    optimizer = torch.optim.AdamW(fortunes.decay_groups(model, a.weight_decay), lr=a.lr)
    scheduler = fortunes.linear_warmup(optimizer, a)
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                           lr_scheduler=scheduler,
                                                           config=ds_config(a, stage, offload))
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.resume:
        path, _ = engine.load_checkpoint(a.save_dir, tag=TAG)
        if path is None:
            raise SystemExit(f"fortunes_deepspeed: no checkpoint '{TAG}' in {a.save_dir}")
    sampler = torch.utils.data.distributed.DistributedSampler(train, num_replicas=world, rank=rank,
                                                              shuffle=True, seed=a.seed)
    batches = micro_batches(train, sampler, a, engine.global_steps)
    losses = []
    dist.barrier()
    start = time.perf_counter()
    for step in range(engine.global_steps + 1, a.steps + 1):
        total = 0.0
        for _ in range(a.accum):
            loss = engine(**next(batches)).loss
            engine.backward(loss)
            engine.step()   # the optimizer and the scheduler step at the accumulation boundary
            total += loss.item()
        losses.append(total / a.accum)
        if rank == 0:
            fortunes.log_step(a, step, losses[-1])
            if step % 20 == 0 or step == a.steps:
                print(f"fortunes_deepspeed: step {step} loss {losses[-1]:.4f}", flush=True)
        if a.save_dir and step == (a.save_at or a.steps):
            engine.save_checkpoint(a.save_dir, tag=TAG, client_state={"step": step})
    dist.barrier()
    train_s = time.perf_counter() - start

    mean_losses = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean_losses)
    acc = None if a.no_eval else accuracy(engine, test, rank, world)
    rss = torch.zeros(world, dtype=torch.float64)
    rss[rank] = fortunes.peak_rss_mib()   # after the evaluation: its peak counts too
    dist.all_reduce(rss)
    named = list(engine.module.named_parameters())   # fp32 at 32-true; bf16-mixed hashes the bf16 weights
    with deepspeed.zero.GatheredParameters([p for _, p in named]):
        phash = fortunes.params_hash((n, p) for n, p in named)
    if rank == 0:
        fortunes.result(a, os.path.basename(__file__), a.strategy, world, train_s, acc, rss.tolist(), phash,
                        (mean_losses / world).tolist())


if __name__ == "__main__":
    sys.exit(main())
