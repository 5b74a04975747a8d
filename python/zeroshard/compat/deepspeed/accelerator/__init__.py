"""deepspeed.accelerator: get_accelerator() for the device ZeroShard's PyTorch front end trains on (the CPU:
its parameters are the library's host buffers)."""
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


_ACCELERATOR = None


def get_accelerator():
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = CPU_Accelerator()
    return _ACCELERATOR


def set_accelerator(accel_obj):
    raise _missing.missing("deepspeed.accelerator.set_accelerator (ZeroShard trains on the CPU from PyTorch)")


__getattr__ = _missing.module_getattr("deepspeed.accelerator")
