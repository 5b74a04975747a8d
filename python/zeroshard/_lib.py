"""ctypes binding of libzeroshard's C API (include/zeroshard.h).

The library is looked for, in order: $ZEROSHARD_LIB (the .so itself or its directory); the one shipped in
this package (zeroshard/libzeroshard.so, which `pip install ./python` builds); $ZEROSHARD_PREFIX/lib*; the
build trees of the source checkout this package sits in (python/zeroshard -> ../../build, then the other
../../build*, never an AddressSanitizer build); the dynamic loader's search path (LD_LIBRARY_PATH,
ldconfig); and the usual install prefixes.
"""
import ctypes
import ctypes.util
import glob
import os

ZS_OK = 0
DTYPES = {0: "fp32", 1: "bf16", 2: "fp16"}


class ZsError(RuntimeError):
    """A ZeroShard call failed; the message is the library's zs_last_error()."""


class AutoValues(ctypes.Structure):
    _fields_ = [("micro_batch_size", ctypes.c_int64), ("grad_accum_steps", ctypes.c_int64),
                ("lr", ctypes.c_double), ("total_num_steps", ctypes.c_int64),
                ("warmup_num_steps", ctypes.c_int64), ("gradient_clipping", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double)]


def _init_opts_class(comm_bytes):
    """zs_init_opts with its MPI_Comm field as wide as the library's MPI has it (zs_mpi_comm_bytes: a pointer
    in Open MPI, an int in MPICH), so the fields after it sit where the library reads them."""
    comm = ctypes.c_int32 if comm_bytes == 4 else ctypes.c_void_p

    class InitOpts(ctypes.Structure):
        _fields_ = [("config_path", ctypes.c_char_p), ("config_json", ctypes.c_char_p),
                    ("comm", comm), ("use_comm", ctypes.c_int), ("auto_values", AutoValues),
                    ("quiet", ctypes.c_int)]
    return InitOpts


InitOpts = _init_opts_class(ctypes.sizeof(ctypes.c_void_p))   # the layout before the library is loaded


def init_opts(**fields):
    """A zs_init_opts laid out for the loaded library's MPI (zero comm with use_comm 0: MPI_COMM_WORLD)."""
    global InitOpts
    f = getattr(lib(), "zs_mpi_comm_bytes", None)
    width = f() if f is not None else ctypes.sizeof(ctypes.c_void_p)
    if ctypes.sizeof(InitOpts._fields_[2][1]) != (4 if width == 4 else ctypes.sizeof(ctypes.c_void_p)):
        InitOpts = _init_opts_class(width)
    return InitOpts(**fields)


class StepStats(ctypes.Structure):
    _fields_ = [("global_step", ctypes.c_int64), ("micro_step", ctypes.c_int64), ("stepped", ctypes.c_int32),
                ("skipped", ctypes.c_int32), ("lr", ctypes.c_double), ("grad_norm", ctypes.c_double),
                ("clip_coef", ctypes.c_double), ("loss_scale", ctypes.c_double),
                ("time_fetch", ctypes.c_double), ("time_reduce", ctypes.c_double),
                ("time_optimizer", ctypes.c_double), ("time_gather", ctypes.c_double),
                ("time_swap", ctypes.c_double),
                # the accumulation window, filled by a library with zs_window_end (an older one leaves them 0)
                ("window_step", ctypes.c_int64), ("window_end", ctypes.c_int32)]


_U64 = ("params grads optimizer buffers formula live_params peak_live_params numel numel_padded host "
        "device_budget nvme").split()
_U64_2 = ("master expect_params expect_grads expect_optimizer comm_buffers swap_buffers prefetch_cap pinned_pool "
          "nccl_staging").split()
_U64_3 = "shared_heap pool_free engine_rss rss peak_rss rss_file heap_in_use heap_free heap_other shared_peers".split()


class MemoryReport(ctypes.Structure):
    """zs_memory_report (include/zeroshard.h), field for field."""
    _fields_ = ([(n, ctypes.c_int32) for n in ("rank", "world", "stage")] + [(n, ctypes.c_uint64) for n in _U64] +
                [("dtype", ctypes.c_int)] + [(n, ctypes.c_uint64) for n in _U64_2] +
                [("shard_size", ctypes.c_int32), ("hpz_size", ctypes.c_int32), ("hpz_secondary", ctypes.c_uint64)] +
                [(n, ctypes.c_uint64) for n in _U64_3] +
                [("lib_data", ctypes.c_uint64), ("other", ctypes.c_int64), ("step", ctypes.c_int64)])


class GroupOpts(ctypes.Structure):
    """zs_group_opts; `set` holds the ZS_GROUP_* bits of the fields given."""
    _fields_ = [("set", ctypes.c_uint32), ("lr", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("momentum", ctypes.c_double), ("dampening", ctypes.c_double), ("nesterov", ctypes.c_int32)]


GROUP_LR, GROUP_WEIGHT_DECAY, GROUP_BETAS, GROUP_EPS = 1, 2, 4, 8
GROUP_MOMENTUM, GROUP_DAMPENING, GROUP_NESTEROV = 16, 32, 64


class CkptOpts(ctypes.Structure):
    _fields_ = [("tag", ctypes.c_char_p), ("no_latest", ctypes.c_int32), ("module_only", ctypes.c_int32),
                ("no_optimizer", ctypes.c_int32), ("no_scheduler", ctypes.c_int32),
                ("extra_name", ctypes.c_char_p), ("extra_data", ctypes.c_void_p), ("extra_bytes", ctypes.c_size_t)]


STATE_PARAM, STATE_GRAD, STATE_EXP_AVG, STATE_EXP_AVG_SQ = 0, 1, 2, 3
# zs_init_fn: fills dst[0..count) with elements [first, first + count) of parameter `param`
INIT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                           ctypes.POINTER(ctypes.c_float))


def _is_asan(path):
    """A build with AddressSanitizer cannot be loaded into an uninstrumented python (its runtime must come
    first in the process): such a build is only taken when ZEROSHARD_LIB names it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return b"libasan.so" in data or b"__asan_init" in data


def _build_trees(src):
    """The source checkout's build trees, build/ first, then the others by name, without ASan builds."""
    found = sorted(glob.glob(os.path.join(src, "build*", "libzeroshard.so")))
    plain = os.path.join(src, "build", "libzeroshard.so")
    found.sort(key=lambda p: p != plain)
    return [p for p in found if not _is_asan(p)]


def _candidates(src=None):
    env = os.environ.get("ZEROSHARD_LIB")
    if env:
        yield os.path.join(env, "libzeroshard.so") if os.path.isdir(env) else env
    yield os.path.join(os.path.dirname(os.path.abspath(__file__)), "libzeroshard.so")
    prefix = os.environ.get("ZEROSHARD_PREFIX")
    if prefix:
        yield from sorted(glob.glob(os.path.join(prefix, "lib*", "libzeroshard.so*")))
        yield from sorted(glob.glob(os.path.join(prefix, "lib", "*", "libzeroshard.so*")))
    src = src or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    yield from _build_trees(src)
    found = ctypes.util.find_library("zeroshard")
    if found:
        yield found
    for p in ("/usr/local", "/opt/zeroshard", "/usr"):
        yield from sorted(glob.glob(os.path.join(p, "lib*", "libzeroshard.so*")))
        yield from sorted(glob.glob(os.path.join(p, "lib", "*", "libzeroshard.so*")))


def _mapped_mpi():
    """The path of the libmpi mapped into this process (the one libzeroshard was linked with), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
                base = os.path.basename(path)
                if base.startswith(("libmpi.so", "libmpich.so")):
                    return path
    except OSError:
        pass
    return None


def _load_mpi_global():
    """Open MPI loads its components (mca_*.so) with dlopen, and they resolve MPI's symbols from the global
    namespace. ctypes loads libraries RTLD_LOCAL, so libmpi pulled in as libzeroshard's dependency would be
    invisible to them and MPI_Init fails ("undefined symbol: ompi_..."). Opening the very libmpi that
    libzeroshard linked (found in the process's mappings once it is loaded) again with RTLD_GLOBAL promotes
    its symbols there; a libmpi opened by name could be another MPI. Harmless for MPICH."""
    path = _mapped_mpi()
    if path is None:
        return None  # linked statically or not at all: nothing to promote
    try:
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None


def _declare(lib):
    c = ctypes
    P = c.c_void_p
    sigs = {
        "zs_init": [c.POINTER(P), c.POINTER(InitOpts)],
        "zs_finalize": [P],
        "zs_unit_add": [P, c.c_char_p, c.POINTER(c.c_int32)],
        "zs_param_add": [P, c.c_int32, c.c_char_p, c.c_int64, P, c.POINTER(c.c_int32)],
        "zs_param_shape": [P, c.c_int32, c.c_int32, c.POINTER(c.c_int64)],
        "zs_setup": [P],
        "zs_checkpoint_save": [P, c.c_char_p],
        "zs_checkpoint_load": [P, c.c_char_p],
        "zs_import_safetensors": [P, c.c_char_p],
        "zs_unit_fetch": [P, c.c_int32, c.POINTER(P)],
        "zs_unit_release": [P, c.c_int32],
        "zs_grad_buffer": [P, c.c_int32, c.POINTER(P)],
        "zs_grad_ready": [P, c.c_int32],
        "zs_step": [P],
        "zs_window_end": [P],
        "zs_stats": [P, c.POINTER(StepStats)],
        "zs_param_info": [P, c.c_int32, P, P, P, c.POINTER(c.c_int64)],
        "zs_group_add": [P, c.POINTER(GroupOpts), c.POINTER(c.c_int32)],
        "zs_param_group": [P, c.c_int32, c.c_int32],
        "zs_param_freeze": [P, c.c_int32],
        "zs_group_set": [P, c.c_int32, c.POINTER(GroupOpts)],
        "zs_group_get": [P, c.c_int32, c.POINTER(GroupOpts)],
        "zs_group_next_lr": [P, c.c_int32, c.POINTER(c.c_double)],
        "zs_checkpoint_save_opts": [P, c.c_char_p, c.POINTER(CkptOpts)],
        "zs_checkpoint_load_opts": [P, c.c_char_p, c.POINTER(CkptOpts), c.POINTER(c.c_int)],
        "zs_checkpoint_extra": [P, c.c_char_p, c.c_char_p, c.c_char_p, P, c.POINTER(c.c_size_t)],
        "zs_param_read": [P, c.c_int32, c.c_int, P],
        "zs_param_write": [P, c.c_int32, c.c_int, P, c.c_int32],
        "zs_param_add_init": [P, c.c_int32, c.c_char_p, c.c_int64, INIT_FN, P, c.POINTER(c.c_int32)],
        "zs_world_info": [c.POINTER(c.c_int32)] * 4,
        "zs_world_bcast": [P, c.c_int64, c.c_int32],
        "zs_memory": [P, P],
        "zs_memory_peak": [P, P],
        "zs_estimate_memory": [c.c_char_p, c.c_int32, c.c_int32, c.POINTER(c.c_int64), P],
        "zs_allreduce_sum": [P, c.POINTER(c.c_double), c.c_int32],
        "zs_step_counts_set": [P, c.c_int64, c.c_int64, c.c_int64],
        "zs_cuda_set_stream": [P, P],
        "zs_cuda_device": [P, c.POINTER(c.c_int32)],
        "zs_cuda_synchronize": [P],
    }
    for name, args in sigs.items():
        f = getattr(lib, name, None)
        if f is None:   # an older library: the calls that need it say so when made
            continue
        f.argtypes = args
        f.restype = c.c_int
    for name in ("zs_world_size", "zs_rank", "zs_param_dtype", "zs_unit_count", "zs_param_count", "zs_group_count"):
        f = getattr(lib, name, None)
        if f is not None:
            f.argtypes = [P]
            f.restype = c.c_int32
    if hasattr(lib, "zs_mpi_comm_bytes"):
        lib.zs_mpi_comm_bytes.argtypes = []
        lib.zs_mpi_comm_bytes.restype = c.c_int32
    if hasattr(lib, "zs_checkpoint_tag"):
        lib.zs_checkpoint_tag.argtypes = [P]
        lib.zs_checkpoint_tag.restype = c.c_char_p
    for name in ("zs_grad_accum_steps", "zs_micro_batch_size"):
        getattr(lib, name).argtypes = [P]
        getattr(lib, name).restype = c.c_int64
    lib.zs_last_error.restype = c.c_char_p
    lib.zs_last_error.argtypes = []


_lib = None
_mpi = None


def lib():
    """The loaded library (loaded on first use, so `import zeroshard` works without it)."""
    global _lib, _mpi
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if not os.path.sep in path and not path.startswith("lib"):
            continue
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        # tests/cuda_emu's build (libzeroshard_cudaemu.so) defines the CUDA runtime's symbols: in the global
        # namespace they would stand in for torch's own, and torch would see the emulated GPU
        mode = ctypes.RTLD_LOCAL if "cudaemu" in os.path.basename(path) else ctypes.RTLD_GLOBAL
        try:
            handle = ctypes.CDLL(path, mode=mode)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        _mpi = _load_mpi_global()
        _declare(handle)
        _lib = handle
        return _lib
    raise ZsError("zeroshard: libzeroshard.so not found; `pip install ./python` in the source checkout builds it "
                  "into the package, or build it (bash tools/build.sh build) or install it (cmake --install build "
                  "--prefix P) and set ZEROSHARD_LIB=/path/to/libzeroshard.so or ZEROSHARD_PREFIX=P"
                  + ("; tried: " + ", ".join(tried) if tried else ""))


_own_mpi = False


def init_mpi():
    """Initialises MPI here rather than in zs_init, so that zs_finalize (which finalises an MPI it started)
    leaves it up: one process can then create and destroy several engines (the tests do). Finalised at
    exit, after the engines."""
    global _own_mpi
    lib()
    if _mpi is None:
        return
    flag = ctypes.c_int(0)
    _mpi.MPI_Initialized(ctypes.byref(flag))
    if flag.value:
        return
    provided = ctypes.c_int(0)
    # MPI_THREAD_SERIALIZED: on a GPU, backward's hooks (zs_grad_ready) run on autograd's device thread while
    # the main thread waits in loss.backward(): one thread at a time, not always the main one
    if _mpi.MPI_Init_thread(None, None, ctypes.c_int(2), ctypes.byref(provided)) != 0:
        raise ZsError("zeroshard: MPI_Init_thread failed")
    _own_mpi = True
    # MPI started here ends at exit whether or not an engine was ever made (mpirun calls a rank that exits
    # without MPI_Finalize an abnormal termination); _exit's handler ends the engines first, then MPI
    from . import _exit  # noqa: F401


def world_info():
    """(rank, world, local_rank, local_size) in MPI_COMM_WORLD, MPI initialised on demand (zs_world_info);
    a library without it: the launcher's variables (Open MPI, MPICH / Slurm, torchrun)."""
    init_mpi()
    f = getattr(_lib, "zs_world_info", None)
    if f is not None:
        v = [ctypes.c_int32() for _ in range(4)]
        check(f(*[ctypes.byref(x) for x in v]), "zs_world_info")
        return tuple(x.value for x in v)
    env = os.environ

    def first(*names, default="0"):
        return int(next((env[n] for n in names if n in env), default))
    return (first("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"),
            first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE", default="1"),
            first("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"),
            first("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", default="1"))


def world_bcast_bytes(data, root, what):
    """Rank root's bytes (`data`; any value on the other ranks) on every rank of MPI_COMM_WORLD, any length:
    the length first, then the bytes (zs_world_bcast). `what` names the caller in errors."""
    f = getattr(lib(), "zs_world_bcast", None)
    if f is None:
        raise ZsError(f"zeroshard: {what} needs zs_world_bcast, which this libzeroshard lacks")
    init_mpi()
    mine = world_info()[0] == root
    n = (ctypes.c_int64 * 1)(len(data) if mine else 0)
    check(f(n, 8, root), what)
    buf = ctypes.create_string_buffer(max(n[0], 1))
    if mine:
        ctypes.memmove(buf, data, n[0])
    check(f(buf, n[0], root), what)
    return buf.raw[:n[0]]


def finalize_mpi():
    global _own_mpi
    if not _own_mpi:
        return
    flag = ctypes.c_int(0)
    _mpi.MPI_Finalized(ctypes.byref(flag))
    if not flag.value:
        _mpi.MPI_Finalize()
    _own_mpi = False


def check(status, what):
    if status != ZS_OK:
        msg = _lib.zs_last_error()
        text = msg.decode(errors="replace") if msg else f"status {status}"
        raise ZsError(f"zeroshard: {text}" if text.startswith(what.split()[0] + ":") else f"zeroshard: {what}: {text}")
