"""deepspeed.accelerator: get_accelerator() for the device ZeroShard's PyTorch front end trains on: CUDA where
torch sees a GPU (as DeepSpeed picks it; the engine then takes zeroshard.device "cuda" from the model's
device), the CPU otherwise."""
from .. import _missing


class CPU_Accelerator:
    """DeepSpeed's accelerator interface as scripts and transformers call it, for the CPU."""

    def __init__(self):
        self._name = "cpu"
        self._communication_backend_name = "gloo"

    def device_name(self, device_index=None):
        return "cpu"

    def current_device_name(self):
        return "cpu"

    def device(self, device_index=None):
        import torch
        return torch.device("cpu")

    def current_device(self):
        return 0

    def set_device(self, device_index):
        """One device: nothing to select."""

    def device_count(self):
        import os
        return int(os.environ.get("LOCAL_WORLD_SIZE", 1))

    def is_available(self):
        return True

    def is_synchronized_device(self):
        return True

    def synchronize(self, device_index=None):
        """The CPU runs in order."""

    def empty_cache(self):
        """No caching allocator to empty."""

    def communication_backend_name(self):
        return self._communication_backend_name

    def is_bf16_supported(self):
        return True

    def is_fp16_supported(self):
        return True

    def supported_dtypes(self):
        import torch
        return [torch.float32, torch.bfloat16, torch.float16]

    def manual_seed(self, seed):
        import torch
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        import torch
        torch.manual_seed(seed)

    def initial_seed(self):
        import torch
        return torch.initial_seed()

    def pin_memory(self, tensor, align_bytes=1):
        return tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == "cpu"

    def memory_allocated(self, device_index=None):
        return 0

    def max_memory_allocated(self, device_index=None):
        return 0

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _missing.missing(f"deepspeed.accelerator.get_accelerator().{name}")


class CUDA_Accelerator(CPU_Accelerator):
    """DeepSpeed's CUDA accelerator, over torch.cuda: the process group backend nccl, the device cuda:N."""

    def __init__(self):
        self._name = "cuda"
        self._communication_backend_name = "nccl"

    @staticmethod
    def _cuda():
        import torch
        return torch.cuda

    def device_name(self, device_index=None):
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def current_device_name(self):
        return f"cuda:{self._cuda().current_device()}"

    def device(self, device_index=None):
        import torch
        return torch.device("cuda", self._cuda().current_device() if device_index is None else device_index)

    def current_device(self):
        return self._cuda().current_device()

    def set_device(self, device_index):
        self._cuda().set_device(device_index)

    def device_count(self):
        return self._cuda().device_count()

    def is_synchronized_device(self):
        return False

    def synchronize(self, device_index=None):
        self._cuda().synchronize(device_index)

    def empty_cache(self):
        self._cuda().empty_cache()

    def is_bf16_supported(self):
        return self._cuda().is_bf16_supported()

    def manual_seed(self, seed):
        self._cuda().manual_seed(seed)

    def manual_seed_all(self, seed):
        self._cuda().manual_seed_all(seed)

    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory()

    def on_accelerator(self, tensor):
        return tensor.device.type == "cuda"

    def memory_allocated(self, device_index=None):
        return self._cuda().memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return self._cuda().max_memory_allocated(device_index)


_ACCELERATOR = None


def get_accelerator():
    global _ACCELERATOR
    if _ACCELERATOR is None:
        import torch
        _ACCELERATOR = CUDA_Accelerator() if torch.cuda.is_available() else CPU_Accelerator()
    return _ACCELERATOR


def set_accelerator(accel_obj):
    raise _missing.missing("deepspeed.accelerator.set_accelerator (ZeroShard picks the CPU or CUDA itself)")


__getattr__ = _missing.module_getattr("deepspeed.accelerator")
