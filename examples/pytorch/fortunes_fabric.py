"""fortunes_fabric.py - the fortunes walk-through (fortunes.py) on Lightning Fabric: DDP or ZeroShard by one line.

    mpirun -np 2 python3 examples/pytorch/fortunes_fabric.py --strategy ddp
    mpirun -np 2 python3 examples/pytorch/fortunes_fabric.py --strategy zeroshard_stage_2

The switch is the `strategy` line in make_fabric: everything else (the data, the loop, accumulation with
fabric.no_backward_sync, clipping, fabric.save / fabric.load) is the same code under every strategy:

    strategy = "ddp"                                                          # Lightning's DDP
    strategy = ZeroShardFabricStrategy(stage=2, config=zero_config(a))        # was: strategy="deepspeed_stage_2"

ZeroShard's config carries what it needs fixed when the engine is built: the micro-batch, the accumulation
and the clip. `fsdp` is refused with the reason: Lightning Fabric runs FSDP on GPUs only.
"""
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fortunes  # noqa: E402

ZERO = {"zeroshard_stage_0": (0, None), "zeroshard_stage_1": (1, None), "zeroshard_stage_2": (2, None),
        "zeroshard_stage_3": (3, None), "zeroshard_stage_2_offload": (2, "optimizer"),
        "zeroshard_stage_3_offload": (3, "both")}
STRATEGIES = ["ddp", "fsdp"] + list(ZERO)


def zero_config(a):
    """What ZeroShard fixes when fabric.setup builds the engine (the loop below does the same by hand)."""
    cfg = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": a.accum}
    if a.clip > 0:
        cfg["gradient_clipping"] = a.clip
    return cfg


def make_fabric(a):
    import lightning as L
    if a.strategy == "fsdp":
        raise SystemExit("fortunes_fabric: --strategy fsdp: Lightning Fabric refuses FSDP unless accelerator='gpu' "
                         "('FSDP is only available on GPU'), and this walk-through trains on the CPU")
    if a.strategy == "ddp":
        strategy = "ddp"
    else:
        from zeroshard.lightning import ZeroShardFabricStrategy
        stage, offload = ZERO[a.strategy]
        strategy = ZeroShardFabricStrategy(stage=stage, config=zero_config(a),
                                           offload_optimizer="cpu" if offload else None,
                                           offload_parameters="cpu" if offload == "both" else None)
    env = os.environ   # mpirun's processes: each is one CPU "device" of its node
    local = int(env.get("LOCAL_WORLD_SIZE", "1"))
    return L.Fabric(accelerator="cpu", strategy=strategy, devices=local,
                    num_nodes=int(env.get("WORLD_SIZE", "1")) // local, precision=a.precision)


def batches(loader):
    """Micro-batches forever; Fabric's loader sets the DistributedSampler's epoch at each pass."""
    while True:
        yield from loader


def evaluate(fabric, model, test):
    """Accuracy over the whole test split: rank r takes fortunes r, r + world, ...; every rank runs the same
    number of forwards (stage 3 gathers the parameters collectively), padded with masked rows."""
    import torch
    per = math.ceil(len(test) / fabric.world_size)
    idx = list(range(fabric.global_rank, len(test), fabric.world_size))
    valid = torch.tensor([1] * len(idx) + [0] * (per - len(idx)))
    idx = torch.tensor(idx + [0] * (per - len(idx)), dtype=torch.long)
    correct = torch.zeros(())
    model.eval()
    with torch.no_grad():
        for i in range(0, per, 64):
            j = idx[i:i + 64]
            logits = model(input_ids=test.ids[j], attention_mask=test.mask[j]).logits
            correct += ((logits.argmax(-1) == test.labels[j]) * valid[i:i + 64]).sum()
    model.train()
    return (fabric.all_reduce(correct, reduce_op="sum") / len(test)).item()


def full_params(model):
    """(name, full fp32 value) in the model's named_parameters() order; under ZeroShard the fp32 masters,
    gathered (collective)."""
    from lightning.fabric.wrappers import _unwrap_objects
    inner = _unwrap_objects(model)
    if type(inner).__name__ != "ZeroShardEngine":
        return list(model.module.named_parameters())
    from zeroshard.utils import safe_get_full_fp32_param
    return [(n, safe_get_full_fp32_param(p)) for n, p in inner.module.named_parameters()]


def parse(argv=None):
    p = fortunes.parser(__doc__)
    p.add_argument("--strategy", default="zeroshard_stage_2", choices=STRATEGIES)
    return p.parse_args(argv)


def run(a):
    """Trains and evaluates as `a` says; returns (the RESULT row on rank 0 else None, the set-up model)."""
    import torch
    train, test, vocab = fortunes.datasets(a)
    fabric = make_fabric(a)
    fabric.launch()
    fabric.seed_everything(a.seed)   # the DistributedSampler's shuffle is seeded by it
    # built plainly, not under fabric.init_module(): at stage 3 that is zeroshard.zero.Init, which refuses
    # transformers' post-init write to part of a built parameter (the embedding's padding row)
    model = fortunes.build_model(a, len(vocab))
    optimizer = torch.optim.AdamW(fortunes.decay_groups(model, a.weight_decay), lr=a.lr)
    model, optimizer = fabric.setup(model, optimizer)
    scheduler = fortunes.linear_warmup(optimizer, a)
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(train, batch_size=a.micro_batch, shuffle=True))
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0, "losses": []}
    ckpt = os.path.join(a.save_dir, "state") if a.save_dir else None
    if a.resume:
        fabric.load(ckpt, state)
    it = batches(loader)
    for _ in range(state["step"] * a.accum):   # the data position: the micro-batches the checkpoint has seen
        next(it)
    t0 = time.time()
    while state["step"] < a.steps:
        total = 0.0
        for m in range(a.accum):
            with fabric.no_backward_sync(model, enabled=m < a.accum - 1):
                loss = model(**next(it)).loss
                fabric.backward(loss / a.accum)
            total += loss.item()
        if a.clip > 0:
            fabric.clip_gradients(model, optimizer, max_norm=a.clip)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        state["step"] += 1
        mean = fabric.all_reduce(torch.tensor(total / a.accum), reduce_op="mean").item()
        state["losses"].append(mean)
        if fabric.is_global_zero:
            fortunes.log_step(a, state["step"], mean)
        if ckpt and state["step"] == (a.save_at or a.steps):
            fabric.save(ckpt, state)
    train_s = time.time() - t0
    acc = None if a.no_eval else evaluate(fabric, model, test)
    phash = fortunes.params_hash(full_params(model))
    rss = fabric.all_gather(torch.tensor(fortunes.peak_rss_mib())).reshape(-1).tolist()
    row = None
    if fabric.is_global_zero:
        row = fortunes.result(a, "fortunes_fabric.py", a.strategy, fabric.world_size, train_s, acc, rss, phash,
                              state["losses"])
    return row, model


def main():
    a = parse()
    fortunes.mpi_to_torch_env()
    run(a)


if __name__ == "__main__":
    main()
