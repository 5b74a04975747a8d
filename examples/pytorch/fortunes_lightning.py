"""fortunes_lightning.py - the fortunes task (fortunes.py) on Lightning's Trainer: Lightning's own ddp, or ZeRO
through ZeroShard, chosen by the Trainer's strategy= argument and nothing else.

    mpirun -np 2 python3 examples/pytorch/fortunes_lightning.py --strategy zeroshard_stage_2 --steps 30 --dim 64

The switch is one line (build_trainer):

    trainer = L.Trainer(strategy="zeroshard_stage_2", ...)    # was: strategy="ddp" (or "deepspeed_stage_2")

--strategy picks that string: ddp, zeroshard_stage_0..3, zeroshard_stage_2_offload, zeroshard_stage_3_offload.
Lightning's fsdp is not offered: Lightning refuses it without a CUDA accelerator. Every strategy sees the same
global batches (micro-batch x ranks x accum: a DistributedSampler seeded by --seed, each epoch cut to a multiple
of --accum batches). --save-dir / --save-at save through ModelCheckpoint; --resume continues from the newest
checkpoint there, the sampler skipping the batches its epoch had used (the module's checkpoint hooks).
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fortunes  # noqa: E402

STRATEGIES = ["ddp", "zeroshard_stage_0", "zeroshard_stage_1", "zeroshard_stage_2", "zeroshard_stage_3",
              "zeroshard_stage_2_offload", "zeroshard_stage_3_offload"]


def lightning_parts():
    """The classes below need torch and lightning; built here so `--help` works without them."""
    import torch
    import lightning.pytorch as L

    class ResumableSampler(torch.utils.data.DistributedSampler):
        """The rank's share of a seeded shuffle; after a resume, the first pass skips what the epoch used."""
        skip = 0

        def __iter__(self):
            idx = list(super().__iter__())[self.skip:]
            self.skip = 0
            return iter(idx)

    class Fortunes(L.LightningModule):
        def __init__(self, a, vocab_size, sampler):
            super().__init__()
            self.a, self.sampler = a, sampler
            self.model = fortunes.build_model(a, vocab_size)
            self.losses, self._micro, self._batches = [], [], 0

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            self._micro.append(loss.detach().float())
            self._batches = batch_idx + 1
            if len(self._micro) == self.a.accum:   # the step's loss, known before ModelCheckpoint saves it
                mean = self.trainer.strategy.reduce(torch.stack(self._micro).mean(), reduce_op="mean")
                self._micro = []
                self.losses.append(float(mean))
                if self.global_rank == 0:
                    fortunes.log_step(self.a, len(self.losses), self.losses[-1])
            return loss

        def validation_step(self, batch, batch_idx):
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            keep = batch["keep"].float()
            right = ((logits.argmax(-1) == batch["labels"]).float() * keep).sum()
            n = len(keep)
            self.log("correct", right, reduce_fx="sum", sync_dist=True, batch_size=n)
            self.log("seen", keep.sum(), reduce_fx="sum", sync_dist=True, batch_size=n)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(fortunes.decay_groups(self.model, self.a.weight_decay), lr=self.a.lr)
            return {"optimizer": opt,
                    "lr_scheduler": {"scheduler": fortunes.linear_warmup(opt, self.a), "interval": "step"}}

        def on_save_checkpoint(self, checkpoint):
            checkpoint["fortunes"] = {"batches": self._batches, "losses": list(self.losses)}

        def on_load_checkpoint(self, checkpoint):
            mine = checkpoint["fortunes"]
            self.losses = list(mine["losses"])
            self.sampler.skip = mine["batches"] * self.a.micro_batch

    return torch, L, ResumableSampler, Fortunes


class Share:
    """Rank r's share of the test split, every share one length (a pad repeats item 0 with keep 0), so the
    ranks run as many evaluation batches and no fortune is counted twice."""

    def __init__(self, data, rank, world):
        n = len(data)
        self.data, self.idx = data, list(range(rank, n, world))
        self.pad = (n + world - 1) // world - len(self.idx)

    def __len__(self):
        return len(self.idx) + self.pad

    def __getitem__(self, i):
        import torch
        row = dict(self.data[self.idx[i] if i < len(self.idx) else 0])
        row["keep"] = torch.tensor(int(i < len(self.idx)))
        return row


def build_trainer(a, L, world, ckpt, per_epoch):
    extra = {"devices": world} if a.strategy == "ddp" else {}
    # ZeRO through ZeroShard: this strategy= argument is the whole switch (import zeroshard.lightning first)
    return L.Trainer(strategy=a.strategy, accelerator=a.accelerator, **extra,
                     max_steps=a.steps, limit_train_batches=per_epoch, accumulate_grad_batches=a.accum, gradient_clip_val=a.clip or None,
                     precision=a.precision, use_distributed_sampler=False, callbacks=ckpt,
                     enable_checkpointing=bool(ckpt), logger=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0)


def newest_checkpoint(d):
    steps = [(int(m.group(1)), f) for f in os.listdir(d) if (m := re.fullmatch(r"step(\d+)\.ckpt", f))]
    if not steps:
        raise SystemExit(f"fortunes_lightning: --resume: no step<N>.ckpt in {d}")
    return os.path.join(d, max(steps)[1])


def run(argv=None):
    """One training run as the flags say; returns the result row (on rank 0; None elsewhere). The tests call it
    several times in one process, one strategy after another."""
    p = fortunes.parser(__doc__)
    p.add_argument("--strategy", choices=STRATEGIES, default="zeroshard_stage_2")
    p.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu",
                   help="gpu: the engine on zeroshard.device \"cuda\", a GPU per rank (ranks beyond the GPUs share)")
    a = p.parse_args(argv)
    if a.strategy == "ddp":
        fortunes.mpi_to_torch_env()
    import zeroshard.lightning  # noqa: F401  (registers the zeroshard_* names strategy= takes; nothing else)
    torch, L, ResumableSampler, Fortunes = lightning_parts()
    from lightning.pytorch.callbacks import ModelCheckpoint
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))

    train, test, vocab = fortunes.datasets(a)
    sampler = ResumableSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=a.seed, drop_last=True)
    loader = torch.utils.data.DataLoader(train, batch_size=a.micro_batch, sampler=sampler, drop_last=True)
    per_epoch = len(loader) - len(loader) % a.accum   # each epoch ends at an optimizer step
    model = Fortunes(a, len(vocab), sampler)
    ckpt = [ModelCheckpoint(dirpath=a.save_dir, filename="step{step}", auto_insert_metric_name=False,
                            every_n_train_steps=a.save_at or a.steps, save_top_k=-1)] if a.save_dir else []
    trainer = build_trainer(a, L, world, ckpt, per_epoch)
    t0 = time.time()
    trainer.fit(model, train_dataloaders=loader,
                ckpt_path=newest_checkpoint(a.save_dir) if a.resume else None)
    train_s = time.time() - t0

    acc = None
    if not a.no_eval:
        val = torch.utils.data.DataLoader(Share(test, rank, world), batch_size=a.micro_batch)
        out = trainer.validate(model, dataloaders=val, verbose=False)[0]
        acc = round(out["correct"] / out["seen"], 4)
    named = list(model.model.named_parameters())
    engine = trainer.strategy.model
    if a.strategy.startswith("zeroshard"):
        from zeroshard.utils import safe_get_full_fp32_param
        named = [(n, safe_get_full_fp32_param(p)) for n, p in named]   # gathered at stage 3
    phash = fortunes.params_hash(named)
    rss = trainer.strategy.all_gather(torch.tensor([fortunes.peak_rss_mib()], dtype=torch.float64))
    row = None
    if trainer.is_global_zero:
        row = fortunes.result(a, "fortunes_lightning.py", a.strategy, world, train_s, acc, rss.reshape(-1).tolist(),
                              phash, model.losses)
    if a.strategy.startswith("zeroshard"):
        engine.destroy()   # collective: every rank ends its engine here, not whenever its garbage is collected
    return row


if __name__ == "__main__":
    run()
