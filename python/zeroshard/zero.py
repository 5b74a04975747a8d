"""zeroshard.zero: deepspeed.zero's Init (build a model straight into shards) and GatheredParameters (read,
and with modifier_rank write, full parameters at stage 3, or of a model built under Init before initialize).

zero.Init design: every nn.Module subclass's own __init__ is wrapped while the context is open (and classes
defined inside it, through __init_subclass__). When the outermost __init__ of a module returns, its own new
parameters are written in fp32 to this process's spill file and each becomes a zero-stride view of a
one-element "stand-in" tensor: p.shape, p.dtype, p.numel() still answer as before (model code reads them),
no memory is held, and the engine registers the parameter with zs_param_add_init, whose callback reads only
the elements this rank stores back from the file. Wrapping __init__ rather than a registration hook matters:
a model that builds its blocks in a list before handing them to nn.ModuleList (GPT-2 does) would otherwise
hold them all at once.
"""
import contextlib
import ctypes
import functools
import os
import tempfile
import weakref

from . import _lib as L


def _torch():
    import torch
    return torch


# ---------------------------------------------------------------------------- the spill store

class _Store:
    """One per process and zero.Init context: an unlinked file (so nothing is left behind whatever happens)
    holding each spilled parameter's fp32 values, written once at the end of its module's __init__ and read
    back by the engine's fill for just the rank's elements. Closed when no spilled parameter refers to it."""

    def __init__(self, directory):
        fd, path = tempfile.mkstemp(prefix="zeroshard-init-", suffix=".f32", dir=directory)
        os.unlink(path)
        self.fd, self.dir, self.end, self.live = fd, directory, 0, 0

    def put(self, values, offset=None):
        """values: a contiguous fp32 tensor; appended (offset None) or overwritten at offset."""
        buf = memoryview(values.numpy()).cast("B")
        at = self.end if offset is None else offset
        done = 0
        while done < len(buf):
            done += os.pwrite(self.fd, buf[done:], at + done)
        if offset is None:
            self.end += len(buf)
        return at

    def get(self, offset, first, count, dst):
        """Elements [first, first + count) of the parameter stored at offset, into the float* dst."""
        want, at, done = count * 4, offset + first * 4, 0
        base = dst if isinstance(dst, int) else ctypes.cast(dst, ctypes.c_void_p).value
        while done < want:
            chunk = os.pread(self.fd, min(want - done, 1 << 26), at + done)
            if not chunk:
                raise OSError(f"zeroshard.zero.Init: spill file in '{self.dir}' ended early at byte {at + done}")
            ctypes.memmove(base + done, chunk, len(chunk))
            done += len(chunk)

    def drop(self):
        self.live -= 1
        if self.live == 0 and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Spill:
    """A spilled parameter's record (p.ds_spill): where its values are, the stand-in its data views, and
    the store's hold on it, let go at set-up (_init_done) or when the parameter dies unregistered (the head
    a model replaces by tying it to the embedding)."""
    __slots__ = ("store", "offset", "stand_in", "name", "hold")

    def __init__(self, p, store, offset, stand_in, name):
        self.store, self.offset, self.stand_in, self.name = store, offset, stand_in, name
        store.live += 1
        self.hold = weakref.finalize(p, store.drop)


def _spill_of(p):
    """The parameter's spill record while its data is still the stand-in (None otherwise)."""
    sp = getattr(p, "ds_spill", None)
    if sp is None or sp.store.fd < 0:
        return None
    if p.data.untyped_storage().data_ptr() != sp.stand_in.untyped_storage().data_ptr():
        return None   # p.data was replaced after the spill: the values in p are the ones to use
    return sp


def _spill_dir(config):
    """The config's offload_param.nvme_path, else $ZEROSHARD_SPILL_DIR, else the temp dir ($TMPDIR, /tmp)."""
    z = config.get("zero_optimization", {}) if isinstance(config, dict) else {}
    nvme = (z.get("offload_param") or {}).get("nvme_path") if isinstance(z, dict) else None
    d = nvme or os.environ.get("ZEROSHARD_SPILL_DIR") or tempfile.gettempdir()
    if os.path.realpath(d).startswith("/dev/shm"):
        raise ValueError(f"zeroshard.zero.Init: spill directory '{d}' is memory (/dev/shm); set "
                         "ZEROSHARD_SPILL_DIR or TMPDIR to a directory on disk")
    return d


def _spill_param(store, p, name, dtype=None):
    torch = _torch()
    values = p.detach().to("cpu", torch.float32).contiguous()
    offset = store.put(values)
    stand_in = torch.zeros(1, dtype=dtype or p.dtype)
    shape = tuple(p.shape)
    with torch.no_grad():
        p.data = stand_in.expand(shape) if shape else stand_in.view(())
    p.ds_shape, p.ds_numel = torch.Size(shape), values.numel()
    p.ds_spill = _Spill(p, store, offset, stand_in, name)
    _stand_ins[stand_in.untyped_storage().data_ptr()] = (weakref.ref(p), name)


def _read_full(p, sp):
    """A spilled parameter's whole fp32 values as a new tensor of its shape."""
    torch = _torch()
    out = torch.empty(p.ds_numel, dtype=torch.float32)
    if p.ds_numel:
        sp.store.get(sp.offset, 0, p.ds_numel, ctypes.cast(out.data_ptr(), ctypes.POINTER(ctypes.c_float)))
    return out.view(p.ds_shape)


def _init_source(p):
    """The engine's hook: None for an ordinary parameter; for one built under zero.Init, fill(first, count,
    dst) writing elements [first, first + count) of its fp32 initial values to the float* dst."""
    sp = _spill_of(p)
    if sp is None:
        rec = getattr(p, "ds_spill", None)
        if rec is not None and rec.store.fd >= 0 and p.dtype != rec.stand_in.dtype and not p.data.any():
            raise ValueError(f"zeroshard.zero.Init: parameter '{rec.name}' was cast to {p.dtype} after zero.Init "
                             "built it (model.half(), model.to(dtype)): the cast copied its stand-in, not its "
                             "values; leave the model in its dtype (the config's bf16/fp16 sets the training one)")
        return None

    def fill(first, count, dst):
        sp.store.get(sp.offset, first, count, dst)
    return fill


def _init_done(p):
    """The engine's hook after zs_setup: the parameter's values live in the library now; its spill record
    goes, and the spill file is closed (freed) with the last one."""
    sp = getattr(p, "ds_spill", None)
    if sp is not None:
        del p.ds_spill
        _stand_ins.pop(sp.stand_in.untyped_storage().data_ptr(), None)
        sp.hold()


# ---------------------------------------------------------------------------- zero.Init

_active = []          # the open Init contexts, innermost last
_building = []        # modules whose __init__ is running (outermost call of each)
_wrapped = []         # (class, original __init__) to restore
_patched = []         # (class, attribute, original)


_TRIM_BYTES = 4 << 20
_libc = None


def _trim():
    """glibc raises its mmap threshold after the first large free, so freed parameter storage stays in the
    heap (the aligned blocks torch asks for then rarely fit it): without giving it back, the process would
    grow towards the model's size although nothing holds the values."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None)
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def _module_done(m):
    if not _active:
        return
    init = _active[-1]
    freed = 0
    for name, p in m.named_parameters(recurse=False):
        if p is not None and p.device.type != "meta" and getattr(p, "ds_spill", None) is None:
            freed += p.numel() * p.element_size()
            _spill_param(init._store_get(), p, f"{type(m).__name__}.{name}", init.dtype)
    if freed >= _TRIM_BYTES:
        _trim()


def _wrap_class(cls):
    orig = cls.__dict__.get("__init__")
    if orig is None or getattr(orig, "_zs_orig", None) is not None:
        return

    @functools.wraps(orig)
    def init(self, *args, **kwargs):
        if not _active or any(m is self for m in _building):
            return orig(self, *args, **kwargs)
        _building.append(self)
        try:
            orig(self, *args, **kwargs)
        finally:
            _building.pop()
        _module_done(self)

    init._zs_orig = orig
    cls.__init__ = init
    _wrapped.append((cls, orig))


def _subclasses(root):
    seen, pending = {}, [root]
    while pending:
        for c in pending.pop().__subclasses__():
            if c not in seen:
                seen[c] = True
                pending.append(c)
    return list(seen)


class Init:
    """with zeroshard.zero.Init(): model = Model(...) builds the model with every parameter's values in this
    process's spill file, never all in memory at once; initialize() then gives each rank just its shard.
    Every rank must build the same model with the same seed (the values are not broadcast). The spill
    directory is the config's zero_optimization.offload_param.nvme_path, else $ZEROSHARD_SPILL_DIR, else
    $TMPDIR (/tmp); its file is unlinked at once and freed after initialize's set-up.
    data_parallel_group, remote_device, pin_memory and mem_efficient_linear are accepted and have no effect;
    dtype is the dtype the parameters report (the training dtype comes from the config)."""

    def __init__(self, module=None, data_parallel_group=None, config_dict_or_path=None, config=None,
                 enabled=True, remote_device=None, pin_memory=False, dtype=None, mem_efficient_linear=True):
        cfg = config_dict_or_path if config_dict_or_path is not None else config
        if isinstance(cfg, (str, os.PathLike)):
            import json
            with open(cfg) as f:
                cfg = json.load(f)
        self.enabled, self.dtype, self._dir = enabled, dtype, _spill_dir(cfg or {}) if enabled else None
        self._store = None
        if enabled and module is not None:   # an existing model: its parameters go to the store now
            self._active_push()
            try:
                for m in module.modules():
                    _module_done(m)
            finally:
                self._active_pop()

    def _store_get(self):
        if self._store is None or self._store.fd < 0:
            self._store = _Store(self._dir)
        return self._store

    def _active_push(self):
        torch = _torch()
        if not _active:
            for cls in _subclasses(torch.nn.Module):
                _wrap_class(cls)
            _patched.append((torch.nn.Module, "__init_subclass__", torch.nn.Module.__dict__.get("__init_subclass__")))
            torch.nn.Module.__init_subclass__ = classmethod(_init_subclass)
        _active.append(self)

    def _active_pop(self):
        _active.remove(self)
        if _active:
            return
        while _wrapped:
            cls, orig = _wrapped.pop()
            cls.__init__ = orig
        while _patched:
            cls, name, orig = _patched.pop()
            if orig is None:
                delattr(cls, name)
            else:
                setattr(cls, name, orig)

    def __enter__(self):
        if self.enabled:
            self._active_push()
            self._mode = _writes_through()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._mode.__exit__(*exc)
            self._active_pop()
        return False


def _init_subclass(cls, **kwargs):
    super(_torch().nn.Module, cls).__init_subclass__(**kwargs)
    if _active:
        _wrap_class(cls)


_stand_ins = {}   # stand-in storage address -> (weak reference to the parameter, its name)
_NOT_WRITES = {"requires_grad_", "share_memory_", "retain_grad"}


def _stand_in_of(t):
    """(parameter, name, whole) when tensor t views a spilled parameter's stand-in (whole: all of it)."""
    torch = _torch()
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
        return None
    hit = _stand_ins.get(t.untyped_storage().data_ptr())
    p = hit[0]() if hit else None
    if p is None or _spill_of(p) is None:
        return None
    return p, hit[1], t.shape == p.ds_shape and t.storage_offset() == 0


def _writes_through():
    """Inside Init, an in-place write to a whole spilled parameter after its module's __init__ (a model's
    weight init in post_init, `p.data.normal_()`, `p.data[i] = v`) reads its values from the spill store,
    runs on them and writes them back: one parameter in memory at a time, the same values as without Init.
    A write to part of one through a view (`p.data[:4].zero_()`) cannot be traced back and is refused naming
    the parameter. Reads outside an in-place call see the stand-in (zeros): gather to read."""
    from torch.overrides import TorchFunctionMode
    torch = _torch()

    def is_write(name):
        return name not in _NOT_WRITES and (name.endswith("_") and not name.endswith("__") or name == "__setitem__")

    class WriteThrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            args, kwargs = list(args), dict(kwargs or {})
            name = getattr(func, "__name__", "")
            # the written tensor: the first argument (torch.nn.init's functions pass it by keyword)
            slots = [(args, i) for i in range(len(args))] + [(kwargs, k) for k in kwargs]
            if not slots or not is_write(name) or _stand_in_of(slots[0][0][slots[0][1]]) is None:
                return func(*args, **kwargs)
            target, first = None, slots[0][0][slots[0][1]]
            for box, key in slots:
                hit = _stand_in_of(box[key])
                if hit is None:
                    continue
                p, who, whole = hit
                if not whole:
                    raise RuntimeError(f"zeroshard.zero.Init: in-place '{name}' on part of parameter '{who}' "
                                       "after its module's __init__: its values are in the spill store; write "
                                       "it inside zeroshard.zero.GatheredParameters(param, modifier_rank=0)")
                box[key] = _read_full(p, _spill_of(p)).to(p.dtype)
                if target is None:
                    target = (p, box[key])
            with torch.no_grad():
                out = func(*args, **kwargs)
            p, vals = target
            sp = _spill_of(p)
            sp.store.put(vals.to(torch.float32).contiguous(), sp.offset)
            res = first if out is vals else out
            del out, vals, target, args, kwargs, box   # the materialised values go before the trim
            if p.ds_numel * 4 >= _TRIM_BYTES:
                _trim()
            return res
    return WriteThrough()


# ---------------------------------------------------------------------------- world (before an engine)

def _world():
    lib = L.lib()
    if not hasattr(lib, "zs_world_info"):   # an older library: the launcher's word for the world size
        env = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE")
        return 0, max([int(os.environ[k]) for k in env if k in os.environ] or [1])
    L.init_mpi()
    r, w, lr, ls = (ctypes.c_int32() for _ in range(4))
    L.check(lib.zs_world_info(ctypes.byref(r), ctypes.byref(w), ctypes.byref(lr), ctypes.byref(ls)),
            "zs_world_info")
    return r.value, w.value


def _bcast(t, root):
    """Rank root's contiguous tensor t to every rank, in place (MPI_COMM_WORLD)."""
    lib = L.lib()
    if not hasattr(lib, "zs_world_bcast"):
        raise L.ZsError("zeroshard.zero: this libzeroshard has no zs_world_bcast (needed for modifier_rank "
                        "before initialize with more than one rank)")
    L.check(lib.zs_world_bcast(ctypes.c_void_p(t.data_ptr()), t.numel() * t.element_size(), root), "zs_world_bcast")


# ---------------------------------------------------------------------------- GatheredParameters

@contextlib.contextmanager
def _spill_gathered(params, modifier_rank=None, local=False):
    """Spilled parameters (built under Init, not yet given to an engine) hold their real values inside;
    with modifier_rank, that rank's values go back to every rank's spill store on exit; with local, each
    rank's own values go back to its own store (code every rank runs alike, such as a model's weight init)."""
    torch = _torch()
    held = [(p, sp) for p, sp in ((p, _spill_of(p)) for p in params) if sp is not None]
    for p, sp in held:
        with torch.no_grad():
            p.data = _read_full(p, sp).to(p.dtype)
    failed = False
    try:
        yield
    except BaseException:
        failed = True   # no writes (nor their collectives) after an exception
        raise
    finally:
        try:
            if modifier_rank is not None and held and not failed:
                _, world = _world()
                for p, sp in held:
                    vals = p.detach().to(torch.float32).contiguous()
                    if world > 1:
                        _bcast(vals, modifier_rank)
                    sp.store.put(vals, sp.offset)
            elif local:
                for p, sp in held:
                    sp.store.put(p.detach().to(torch.float32).contiguous(), sp.offset)
        finally:
            for p, sp in held:
                with torch.no_grad():
                    p.data = sp.stand_in.expand(p.ds_shape) if len(p.ds_shape) else sp.stand_in.view(())


class GatheredParameters:
    """with GatheredParameters(params, modifier_rank=None): the full parameters are readable on every rank
    inside the block. With modifier_rank=r, rank r's values on exit (changed in place, any dtype) become the
    parameters' values on every rank: the fp32 masters, the shards and the working copies (zs_param_write);
    for parameters built under zero.Init before initialize, the spill store. Collective when modifier_rank
    is given or at stage 3: every rank must enter with the same parameters.

    Tensors taken inside at stage 3 (a state_dict()) stay valid after the block: inside, each parameter's
    data is a torch-owned copy of the gathered values, not the library's gathered buffer (which is freed on
    exit). With modifier_rank at stages 0-2 the parameters are copies too, so that an unchanged parameter's
    fp32 master is not rewritten from its 16-bit working copy."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        from .engine import _engines
        if not isinstance(params, (list, tuple)):
            params = [params] if hasattr(params, "data_ptr") else list(params)
        self._params = [p for p in params if p is not None]
        self._modifier = modifier_rank
        self._enabled = enabled
        self._engine, self._units, self._mine = None, [], []
        if not enabled:
            return
        for e in list(_engines):
            mine = [p for p in self._params if p in e._pinfo]
            if mine:
                self._engine, self._mine = e, mine
                self._units = sorted({e._pinfo[p] for p in mine}, key=lambda u: u.idx)
                break
        self._spilled = _spill_gathered([p for p in self._params if p not in set(self._mine)], modifier_rank)

    def __enter__(self):
        if not self._enabled:
            return self
        self._spilled.__enter__()
        e = self._engine
        if e is None:
            return self
        for u in self._units:
            e._acquire(u)
        if e.stage == 3 or self._modifier is not None:
            torch = e._torch
            with torch.no_grad():
                for p in self._mine:
                    p.data = p.data.clone()
        return self

    def __exit__(self, *exc):
        if not self._enabled:
            return False
        try:
            if self._engine is not None:
                self._exit_engine(write=exc[0] is None)   # after an exception, no writes (nor their collectives)
        finally:
            self._spilled.__exit__(*exc)
        return False

    def _changed(self):
        """Per parameter (in order), whether modifier_rank changed it: rank r's verdict, sent to all."""
        e, torch = self._engine, self._engine._torch
        flags = torch.zeros(len(self._mine), dtype=torch.uint8)
        if e.global_rank == self._modifier:
            for i, p in enumerate(self._mine):
                off, n = e._poff[p]
                u = e._pinfo[p]
                flags[i] = not torch.equal(p.data.reshape(-1), u.flat[off:off + n])
        if e.world_size > 1:
            _bcast(flags, self._modifier)
        return flags.tolist()

    def _exit_engine(self, write):
        e, torch = self._engine, self._engine._torch
        writes = []
        if self._modifier is not None and write:
            for p, changed in zip(self._mine, self._changed()):
                if changed:
                    vals = p.detach().to(torch.float32).contiguous() if e.global_rank == self._modifier else None
                    writes.append((p, vals))
        for u in reversed(self._units):
            e._release(u)
            if u.refs > 0 or e.stage < 3:   # still fetched: its parameters view the library's buffer again
                for p, off, n, shape in u.params:
                    p.data = u.flat[off:off + n].view(shape)
        for p, vals in writes:
            ptr = ctypes.c_void_p(vals.data_ptr()) if vals is not None else None
            L.check(e.lib.zs_param_write(e.ctx, e._pid[p], L.STATE_PARAM, ptr, self._modifier),
                    f"zs_param_write of '{e._names.get(id(p), '?')}'")


def register_external_parameter(module, parameter):
    """deepspeed.zero.register_external_parameter: nothing to do here (units are fetched by the module
    that owns the parameter, and tied parameters are fetched by every module using them)."""

