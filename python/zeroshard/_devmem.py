"""Where the engine's buffers live, as torch sees them, and how torch's work is ordered with the engine's.

Three kinds, chosen once per engine from `zeroshard.device` and the library loaded:
- host: `zeroshard.device` "cpu". Parameters and gradients are torch CPU tensors over the engine's host buffers
  (torch.frombuffer); the engine runs on the calling thread, so there is nothing to order.
- cuda: `zeroshard.device` "cuda" with a GPU. Parameters, gradients and gathered stage-3 units are CUDA tensors
  over the engine's own device memory (its arena, sized from the memory plan at zs_setup: the ZeRO formulas hold
  and an overflow is an error naming the region), wrapped through __cuda_array_interface__; torch's caching
  allocator never holds them. torch's current stream is handed to the engine as its compute stream
  (zs_cuda_set_stream) before each call that queues work or hands out memory, so forward and backward, the
  engine's kernels and, through the engine's events both ways, its collectives are ordered without a host wait.
- emulated: `zeroshard.device` "cuda" over libzeroshard_cudaemu.so, the library built with tests/cuda_emu's
  CUDA runtime and NCCL (its "device memory" is host memory, its streams run queued work as late as CUDA's
  rules allow). torch CPU tensors stand in for CUDA tensors; a stream the emulator made stands in for torch's
  and is handed over the same way; since a torch CPU kernel runs when it is launched, that stream is drained
  before torch touches what the engine handed out (ready()), where on a GPU torch's next kernel would simply
  queue behind the engine's. The front end's CUDA control flow (which buffers, which stream, in which order)
  thereby runs in ctest on a machine without a GPU, the emulator's planted faults included.
"""
import ctypes

from . import _lib as L


def emulated(lib):
    """Whether lib is libzeroshard_cudaemu.so (only tests/cuda_emu's runtime exports zs_emu_counts)."""
    return getattr(lib, "zs_emu_counts", None) is not None


class HostMem:
    kind = "cpu"

    def __init__(self, torch):
        self.torch = torch
        self.device = torch.device("cpu")

    def view(self, ptr, numel, dtype, esize):
        buf = (ctypes.c_char * (numel * esize)).from_address(ptr)
        return self.torch.frombuffer(buf, dtype=dtype, count=numel)

    def enter(self):
        """Before a call that queues work on the engine's compute stream or hands out its memory."""

    def ready(self, what):
        """After such a call, before torch reads or writes what it handed out."""


class _CudaArray:
    """__cuda_array_interface__ (version 2: no stream to synchronise, the caller orders through the stream it
    handed the engine) of numel elements of a 2-byte or 4-byte type at ptr."""

    def __init__(self, ptr, numel, typestr):
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": typestr, "data": (ptr, False),
                                         "strides": None, "version": 2}


class CudaMem:
    kind = "cuda"

    def __init__(self, torch, lib, ctx):
        self.torch, self.lib, self.ctx = torch, lib, ctx
        ordinal = ctypes.c_int32()
        L.check(lib.zs_cuda_device(ctx, ctypes.byref(ordinal)), "zs_cuda_device")
        self.device = torch.device("cuda", ordinal.value)
        torch.cuda.set_device(self.device)   # the engine's GPU is the rank's current device for torch too
        self._stream = None
        # bf16 has no __cuda_array_interface__ type string: its bits are wrapped as int16 and viewed
        self._wrap = {torch.float32: ("<f4", None), torch.float16: ("<f2", None),
                      torch.bfloat16: ("<i2", torch.bfloat16)}

    def view(self, ptr, numel, dtype, esize):
        typestr, as_dtype = self._wrap[dtype]
        t = self.torch.as_tensor(_CudaArray(ptr, numel, typestr), device=self.device)
        return t.view(as_dtype) if as_dtype is not None else t

    def enter(self):
        s = self.torch.cuda.current_stream(self.device).cuda_stream
        if s != self._stream:
            L.check(self.lib.zs_cuda_set_stream(self.ctx, ctypes.c_void_p(s)), "zs_cuda_set_stream")
            self._stream = s

    def ready(self, what):
        """Nothing: torch's next kernel is queued on the stream the engine used."""


class EmulatedMem(HostMem):
    kind = "cuda (emulated)"

    def __init__(self, torch, lib, ctx):
        super().__init__(torch)
        self.lib, self.ctx = lib, ctx
        self.stream = ctypes.c_void_p()
        lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
        if lib.cudaStreamCreateWithFlags(ctypes.byref(self.stream), 1) != 0:   # cudaStreamNonBlocking, as torch's
            raise L.ZsError("zeroshard: the emulated CUDA runtime could not create a stream")
        self._handed = False
        self.syncs = 0   # for the tests: how many times torch waited for the engine's stream

    def enter(self):
        if not self._handed:
            L.check(self.lib.zs_cuda_set_stream(self.ctx, self.stream), "zs_cuda_set_stream")
            self._handed = True

    def ready(self, what):
        """zs_cuda_synchronize rather than cudaStreamSynchronize: behind a failed NCCL collective the stream
        never drains, and the engine's wait ends within its deadline naming the collective."""
        self.syncs += 1
        L.check(self.lib.zs_cuda_synchronize(self.ctx), f"{what}: the engine's stream")

    def close(self):
        """After zs_finalize: the stream was the program's (the engine never destroys a handed stream)."""
        if self.stream:
            self.lib.cudaStreamDestroy(self.stream)
            self.stream = ctypes.c_void_p()


def make(torch, lib, ctx, device):
    """The memory kind for an engine whose config asked for `device` ("cpu" or "cuda")."""
    if device != "cuda":
        return HostMem(torch)
    if emulated(lib):
        return EmulatedMem(torch, lib, ctx)
    return CudaMem(torch, lib, ctx)
