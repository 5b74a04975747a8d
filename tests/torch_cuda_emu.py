"""torch_cuda_emu.py - the PyTorch front end's CUDA path (`zeroshard.device: "cuda"`) over libzeroshard_cudaemu.so,
the library built with tests/cuda_emu's CUDA runtime and NCCL: torch CPU tensors stand for the GPU's (see
python/zeroshard/_devmem.py). torch_cuda_emu.sh runs the modes under mpirun.

  parity  2 ranks: the same model and batches through `zeroshard.device` "cpu" and "cuda", stages 0-3, fp32 and
          bf16, fp16 at stage 2, offload_optimizer cpu at stage 3, ZeRO-Infinity at stage 3 in bf16 (offload_optimizer
          and offload_param nvme, under TORCH_CUDA_EMU_NVME), a client AdamW with two groups and a frozen
          parameter at stage 3: the final parameters are bit-identical (the CUDA backend's kernels and
          collectives give the CPU's bits). On "cuda": the engine computes on the stream the front end handed
          it (zs_cuda_stream returns it), torch waited for the engine before touching its memory, engine.device
          is the device, engine.to() of another device is refused naming zeroshard.device.
  fault   1 rank: the emulator's kernel fault (ZS_CUDA_EMU_FAULT set mid-training to the next launch) ends as a
          ZsError naming the engine operation, within the call that met it.
  nccl    2 ranks, a GPU each, the emulated NCCL (ZS_CUDA_EMU_GPUS=2 ZS_CUDA_EMU_NCCL=1): stage 2 and 3 bits as
          the CPU's over NCCL.
  nccl_fault  the same 2 ranks, rank 1's third NCCL operation failing asynchronously (ZS_CUDA_EMU_NCCL_FAULT=1:3):
          each rank's script gets a ZsError naming NCCL (rank 0's within ZS_TIMEOUT), no hang.
"""
import ctypes
import hashlib
import os
import sys

try:
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"torch_cuda_emu: skipped: torch cannot be imported ({e})")
    sys.exit(77)

import zeroshard
from zeroshard import _lib as L
from zeroshard.zero import GatheredParameters

STEPS = 6


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 24)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(24, 24), nn.LayerNorm(24)) for _ in range(3)])
        self.out = nn.Linear(24, 5)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + torch.relu(b(x))
        return self.out(x)


def config(device, stage, dtype=None, offload=None, optimizer=True):
    z = {"stage": stage, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 0}
    if offload == "nvme":   # ZeRO-Infinity: the optimizer state and the parameter shards in swap files
        path = os.environ["TORCH_CUDA_EMU_NVME"]
        z["offload_optimizer"] = {"device": "nvme", "nvme_path": path}
        z["offload_param"] = {"device": "nvme", "nvme_path": path}
    elif offload:
        z["offload_optimizer"] = {"device": offload}
    c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
         "steps_per_print": 0, "zero_optimization": z, "zeroshard": {"device": device}}
    if optimizer:
        c["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    if dtype == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return c


def train(cfg, client=False, freeze=False, fault_at_step=None):
    torch.manual_seed(0)
    model = Net()
    if freeze:
        model.inp.bias.requires_grad_(False)
    kw = {}
    if client:
        decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("bias")]
        rest = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("bias")]
        kw["optimizer"] = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                             {"params": rest, "weight_decay": 0.0}], lr=0.01)
    engine, *_ = zeroshard.initialize(model=model, config=cfg, **kw)
    g = torch.Generator().manual_seed(100 + engine.global_rank)
    loss = None
    for step in range(STEPS):
        if step == fault_at_step:   # the emulator faults the next kernel launched from here
            os.environ["ZS_CUDA_EMU_FAULT"] = str(engine.lib.zs_emu_launches() + 1)
        for _ in range(2):
            x = torch.randn(4, 12, generator=g).to(engine.device, engine.dtype)
            y = torch.randn(4, 5, generator=g).to(engine.device)
            loss = nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
    h = hashlib.sha256()
    with GatheredParameters(list(engine.module.parameters())):
        for p in engine.module.parameters():
            h.update(p.detach().float().cpu().numpy().tobytes())
    return engine, h.hexdigest()[:16], float(loss.detach())


def check_cuda_engine(engine):
    """What the CUDA path did, beyond the bits."""
    mem = engine._mem
    assert mem.kind == "cuda (emulated)", mem.kind
    s = ctypes.c_void_p()
    engine.lib.zs_cuda_stream.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    L.check(engine.lib.zs_cuda_stream(engine.ctx, ctypes.byref(s)), "zs_cuda_stream")
    assert s.value == mem.stream.value, f"the engine computes on {s.value:#x}, not the handed stream"
    assert mem.syncs > 0, "torch never waited for the engine's stream"
    assert engine.to("cuda") is engine and engine.to(engine.device) is engine
    try:
        engine.to("meta")
    except RuntimeError as e:
        assert "zeroshard.device" in str(e), e
    else:
        raise AssertionError("engine.to('meta') was not refused")


def mode_parity():
    cases = [(st, dt, None, False, False) for st in (0, 1, 2, 3) for dt in (None, "bf16")]
    cases += [(2, "fp16", None, False, False), (3, None, "cpu", False, False), (3, "bf16", "nvme", False, False),
              (3, None, None, True, True),
              (0, None, None, True, True)]
    bad = 0
    for stage, dtype, offload, client, freeze in cases:
        name = f"stage {stage} {dtype or 'fp32'}" + (f" offload {offload}" if offload else "") + \
            (" client AdamW groups + frozen" if client else "")
        res = {}
        for dev in ("cpu", "cuda"):
            engine, h, loss = train(config(dev, stage, dtype, offload, optimizer=not client), client, freeze)
            if dev == "cuda":
                check_cuda_engine(engine)
            engine.destroy()
            res[dev] = (h, loss)
        same = res["cpu"][0] == res["cuda"][0]
        bad += not same
        if engine.global_rank == 0:
            print(f"  {name:42s} cpu {res['cpu'][0]} cuda {res['cuda'][0]} loss {res['cuda'][1]:.5f}: "
                  f"{'bit-identical' if same else 'DIFFERENT'}")
    assert bad == 0, f"{bad} case(s) differ between zeroshard.device cpu and cuda"


def expect_error(fn, words):
    try:
        fn()
    except L.ZsError as e:
        text = str(e)
        assert any(w in text for w in words), f"the error names none of {words}: {text}"
        return text
    raise AssertionError("no error raised")


def mode_fault():
    engine = None

    def run():
        nonlocal engine
        engine, *_ = train(config("cuda", 3), fault_at_step=3)
    text = expect_error(run, ("zs_step", "gradients of unit", "fetch of unit", "gradient buffer", "release of unit"))
    os.environ.pop("ZS_CUDA_EMU_FAULT")
    print(f"  a kernel fault mid-training: {text[:300]}")


def mode_nccl():
    for stage in (2, 3):
        res = {}
        for dev in ("cpu", "cuda"):
            engine, h, _ = train(config(dev, stage))
            engine.destroy()
            res[dev] = h
        assert res["cpu"] == res["cuda"], f"stage {stage} over NCCL: {res}"
        if engine.global_rank == 0:
            print(f"  stage {stage} over the emulated NCCL: bit-identical to the CPU device ({res['cuda']})")


def mode_nccl_fault():
    """Run with ZS_CUDA_EMU_NCCL_FAULT=1:K (rank 1's K-th NCCL operation fails asynchronously)."""
    text = expect_error(lambda: train(config("cuda", 3)), ("NCCL", "nccl"))
    print(f"  rank {L.world_info()[0]}: an asynchronous NCCL error: {text[:400]}")


if __name__ == "__main__":
    {"parity": mode_parity, "fault": mode_fault, "nccl": mode_nccl, "nccl_fault": mode_nccl_fault}[sys.argv[1]]()
    print(f"torch_cuda_emu {sys.argv[1]}: passed")
