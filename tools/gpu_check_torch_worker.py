"""gpu_check_torch_worker.py - one run of the GPU check's PyTorch stage (tools/gpu_check_torch.py starts it, each
run in its own process): a GPT-2-shaped Hugging Face model from a config, fixed random token batches, bf16, trained
by ZeroShard (under zeroshard-run), by plain PyTorch or by DeepSpeed; writes what it measured as JSON.

    gpu_check_torch_worker.py parity --out F --device D --model L,D,H,V --seq T --batch B --steps S [--ref]
    gpu_check_torch_worker.py perf   --out F --device D --backend torch|zeroshard|deepspeed ... --warmup W
    gpu_check_torch_worker.py probe  --out F --device D --backend zeroshard|deepspeed ...   (ZeRO-Offload, 1 size)
    gpu_check_torch_worker.py ds-ops --out F                  (compiles DeepSpeed's CPU Adam op; what failed if not)

The plain-PyTorch reference trains as ZeroShard's bf16 does (docs/pytorch.md, "Zero copy"): bf16 parameters in the
module, fp32 masters beside them that start from the model's fp32 values (DeepSpeed's start from their bf16
roundings), the bf16 gradients widened, clipped at 1.0 and stepped by torch.optim.AdamW on the masters, which are
rounded back into the module. Each rank writes F.rRANK.
"""
import argparse
import hashlib
import json
import os
import resource
import sys
import time

SEED = 11
LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
POOL = 4   # distinct batches, cycled: the model can learn them, so the losses move and the optimizer shows


# ------------------------------------------------------------------------------------------------- the model
def build(spec, seq, device="cpu", dtype=None):
    """GPT-2 from a config (nothing from a hub): SPEC is layers,width,heads,vocab; no dropout, so runs repeat.
    Built with the default dtype DTYPE on DEVICE (the offload probe's large models are made where they train)."""
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    from transformers import GPT2Config, GPT2LMHeadModel
    layers, width, heads, vocab = spec
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(SEED)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        with torch.device(device):
            return GPT2LMHeadModel(cfg)
    finally:
        torch.set_default_dtype(old)


def batch(step, n, vocab, seq):
    import torch
    g = torch.Generator().manual_seed(1000 + step % POOL)
    return torch.randint(0, vocab, (n, seq), generator=g)


def count_params(model):
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------ measuring
class Meter:
    """Peak memory in this process's own terms. On the GPU: the device's used memory (cudaMemGetInfo: total -
    free, device-wide, so the engine's own cudaMalloc arena counts, which torch.cuda.max_memory_allocated does
    not see), sampled at the peak points (after forward, after backward, after the step), with the base taken
    once the CUDA context is up and before the model is built. On the CPU: peak RSS (getrusage) against the RSS
    after the imports."""

    def __init__(self, device):
        import torch
        self.torch, self.cuda = torch, device.startswith("cuda")
        if self.cuda:
            torch.zeros(1, device=device)
            torch.cuda.synchronize()
            self.what = "GPU used memory, device-wide (torch.cuda.mem_get_info)"
        else:
            self.what = "peak RSS of the process (getrusage)"
        self.base = self.used()
        self.peak = self.base

    def used(self):
        if self.cuda:
            free, total = self.torch.cuda.mem_get_info()
            return total - free
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def sample(self):
        self.sync()
        if self.cuda:
            self.peak = max(self.peak, self.used())
        else:
            self.peak = max(self.peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    def report(self):
        r = {"mem_what": self.what, "mem_base": self.base, "mem_peak": self.peak, "mem_run": self.peak - self.base}
        if self.cuda:
            r["torch_max_allocated"] = self.torch.cuda.max_memory_allocated()
        return r


# ------------------------------------------------------------------------------------------------ the loops
class TorchBf16:
    """Plain PyTorch trained as ZeroShard's bf16 is (the module's parameters bf16, the optimizer's fp32)."""

    def __init__(self, model, device, lr=LR):
        import torch
        self.torch = torch
        # the masters are the model's fp32 values, not their bf16 roundings (ZeroShard keeps them so)
        self.masters = [p.detach().to(device, torch.float32, copy=True) for p in model.parameters()]
        self.model = model.to(device).to(torch.bfloat16)
        self.params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(self.masters, lr=lr, betas=BETAS, eps=EPS, weight_decay=WD)

    def forward(self, x):
        for p in self.params:
            p.grad = None
        return self.model(input_ids=x, labels=x).loss

    def backward(self, loss):
        loss.backward()

    def step(self):
        torch = self.torch
        for m, p in zip(self.masters, self.params):
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
        torch.nn.utils.clip_grad_norm_(self.masters, CLIP)
        self.opt.step()
        with torch.no_grad():
            for m, p in zip(self.masters, self.params):
                p.copy_(m)

    def fp32_params(self):
        return [m.detach().cpu() for m in self.masters]


class Engine:
    """ZeroShard's or DeepSpeed's engine behind the loop's three calls."""

    def __init__(self, engine):
        self.engine = engine

    def forward(self, x):
        return self.engine(input_ids=x, labels=x).loss

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.engine.step()


def ds_config(a, stage, offload=False):
    """One config for ZeroShard and DeepSpeed. DeepSpeed's optimizer: torch.optim.AdamW (torch_adam) unless the
    optimizer is offloaded, where its ZeRO-Offload uses its compiled CPU Adam."""
    z = {"stage": stage}
    if offload:
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    params = {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}
    if a.backend == "deepspeed" and not offload:
        params["torch_adam"] = True
    c = {"train_micro_batch_size_per_gpu": a.batch // a.world, "gradient_accumulation_steps": 1,
         "gradient_clipping": CLIP, "steps_per_print": 10 ** 9, "bf16": {"enabled": True},
         "zero_optimization": z, "optimizer": {"type": "AdamW", "params": params}}
    if a.backend == "zeroshard":
        c["zeroshard"] = {"device": "cuda" if a.device.startswith("cuda") else "cpu"}
    return c


def make_engine(a, model, stage, offload=False):
    if a.backend == "deepspeed":
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        if a.device.startswith("cuda") and get_accelerator().device_name() != "cuda":
            raise RuntimeError(f"DeepSpeed's accelerator is {get_accelerator().device_name()}, not cuda")
    else:
        import zeroshard as deepspeed
    engine = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                  config=ds_config(a, stage, offload))[0]
    return Engine(engine), engine


def train(a, trainer, meter, steps, rank, world, warmup=0):
    """STEPS steps on the fixed batches, this rank's rows of each; per step the local loss and the wall time
    between synchronised ends (the first WARMUP steps are timed too, and the caller leaves them out)."""
    losses, times = [], []
    for s in range(steps):
        x = batch(s, a.batch, a.model[3], a.seq)
        mine = x[rank * (a.batch // world):(rank + 1) * (a.batch // world)].to(a.device)
        meter.sync()
        t0 = time.perf_counter()
        loss = trainer.forward(mine)
        meter.sample()
        trainer.backward(loss)
        meter.sample()
        trainer.step()
        meter.sample()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    return losses, times


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def mapped(name):
    """The file of a library this process has mapped whose name starts with NAME (which libzeroshard ran)."""
    with open("/proc/self/maps") as f:
        for ln in f:
            path = ln.split()[-1]
            if os.path.basename(path).startswith(name):
                return path
    return None


def zs_params_hash(engine):
    """The fp32 masters, full, in the module's parameter order (collective: every rank reads each one)."""
    from zeroshard.utils import safe_get_full_fp32_param
    return digest(safe_get_full_fp32_param(p) for p in engine.module.parameters())


# ------------------------------------------------------------------------------------------------ the modes
def rank_world():
    try:
        from zeroshard import comm
        return comm.get_rank(), comm.get_world_size()
    except Exception:   # noqa: BLE001  outside MPI: one process
        return 0, 1


def mode_parity(a):
    """Rank 0: the plain-PyTorch reference first (with --ref); then ZeroShard at each stage of --stages."""
    import torch
    rank, world = rank_world()
    a.world = world
    out = {"rank": rank, "world": world, "runs": {}}
    meter = Meter(a.device)
    if a.ref and rank == 0:
        ref = TorchBf16(build(a.model, a.seq), a.device, a.ref_lr or LR)
        losses, _ = train(a, ref, meter, a.steps, 0, 1)
        out["runs"]["torch"] = {"losses": losses, "params_hash": digest(ref.fp32_params())}
        del ref
    for stage in a.stages:
        trainer, engine = make_engine(a, build(a.model, a.seq), stage)
        losses, _ = train(a, trainer, meter, a.steps, rank, world)
        out["runs"][f"stage{stage}"] = {"losses": losses, "params_hash": zs_params_hash(engine)}
        engine.destroy()
    out.update(torch_version=torch.__version__, zeroshard_lib=mapped("libzeroshard"))
    write(a.out, rank, out)


def mode_perf(a):
    """One backend, one rank: --warmup steps, then --steps timed; tokens/s per timed step and the peak memory."""
    import torch
    a.world = 1
    meter = Meter(a.device)
    model = build(a.model, a.seq)
    n = count_params(model)
    if a.backend == "torch":
        trainer = TorchBf16(model, a.device)
    else:
        trainer, _ = make_engine(a, model, a.stage)
    _, times = train(a, trainer, meter, a.warmup + a.steps, 0, 1)
    tokens = a.batch * a.seq
    out = {"backend": a.backend, "params": n, "tokens_per_s": [tokens / t for t in times[a.warmup:]],
           "torch_version": torch.__version__, **meter.report()}
    write(a.out, 0, out)


def mode_probe(a):
    """ZeRO-Offload at one size: stage 2, the optimizer offloaded to the CPU, bf16, the model built on the device
    in bf16; --steps steps (the first warms up). Writes the step times and peaks, or nothing if it fails."""
    import torch
    a.world = 1
    meter = Meter(a.device)
    t0 = time.perf_counter()
    model = build(a.model, a.seq, device=a.device, dtype=torch.bfloat16)
    n = count_params(model)
    trainer, _ = make_engine(a, model, 2, offload=True)
    setup = time.perf_counter() - t0
    losses, times = train(a, trainer, meter, a.steps, 0, 1)
    write(a.out, 0, {"backend": a.backend, "params": n, "setup_s": setup, "step_s": times, "losses": losses,
                     "host_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **meter.report()})


def mode_ds_ops(a):
    """DeepSpeed's CPU Adam op, JIT-compiled (its offload needs it); the compiler's last lines if it fails."""
    t0 = time.perf_counter()
    from deepspeed.ops.op_builder import CPUAdamBuilder
    CPUAdamBuilder().load()
    write(a.out, 0, {"built_s": time.perf_counter() - t0})


def write(path, rank, obj):
    with open(f"{path}.r{rank}", "w") as f:
        json.dump(obj, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["parity", "perf", "probe", "ds-ops"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="zeroshard", choices=["torch", "zeroshard", "deepspeed"])
    ap.add_argument("--model", default="4,256,4,1024", help="layers,width,heads,vocab")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="the global batch, in sequences")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--stages", default="0,3")
    ap.add_argument("--ref", action="store_true", help="parity: rank 0 trains the plain-PyTorch reference first")
    ap.add_argument("--ref-lr", type=float, help="parity: the reference's learning rate (the test's broken run)")
    a = ap.parse_args()
    a.model = [int(v) for v in a.model.split(",")]
    a.stages = [int(v) for v in a.stages.split(",")]
    {"parity": mode_parity, "perf": mode_perf, "probe": mode_probe, "ds-ops": mode_ds_ops}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
