"""_memory.py - engine.memory(): what this rank holds, by category, against its resident set.

The library reads the figures (zs_memory: its own buffers by category, and the process's RSS, C heap, shared and
mapped memory from Linux and glibc) and keeps them as they were at the highest RSS it sampled (zs_memory_peak,
sampled at each engine call: every unit fetch and release, every gradient hand-over, every step). This module
names the front end's part of the rest: torch's tensors are in the C heap beyond the engine's ("torch"), and of
them the model's buffers and stand-ins and the gradients autograd made that are not handed over yet are known
here; Python's objects are in CPython's own arenas (read from its allocator's statistics when the report is
made: they change little once the model is built). Every category is bytes per rank; `other` is the RSS that no
category names.
"""
import ctypes
import re

from . import _lib as L

ENGINE = ("params", "grads", "optimizer", "gathered", "communication", "swap_buffers", "host_pool_unused")


def _engine_parts(r, host_access):
    """The engine's bytes in this process's memory, by category (they sum to engine_rss on the CPU device)."""
    if not host_access:   # on a GPU only the host pool, its staging and the shared heap are in RSS
        return {"host_pool_and_staging": r.engine_rss}
    pinned_free = r.engine_rss - (r.params + r.grads + r.optimizer + r.live_params + r.comm_buffers
                                  + r.swap_buffers)
    return dict(zip(ENGINE, (r.params, r.grads, r.optimizer, r.live_params, r.comm_buffers, r.swap_buffers,
                             max(pinned_free, 0))))


def python_arenas():
    """Bytes of CPython's own allocator's arenas (its objects of up to 512 bytes), from its statistics
    (_PyObject_DebugMallocStats, written into a memory stream); 0 where that is not available."""
    try:
        stats = ctypes.pythonapi._PyObject_DebugMallocStats
        libc = ctypes.CDLL(None)
        libc.open_memstream.restype = ctypes.c_void_p
        libc.fclose.argtypes = libc.free.argtypes = [ctypes.c_void_p]
    except (AttributeError, OSError):
        return 0
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    f = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not f:
        return 0
    stats.argtypes = [ctypes.c_void_p]
    stats(f)
    libc.fclose(f)
    text = ctypes.string_at(buf, size.value).decode("ascii", "replace") if buf.value else ""
    libc.free(buf)
    m = re.search(r"^(\d+) arenas \* (\d+) bytes/arena", text, re.M)
    return int(m.group(1)) * int(m.group(2)) if m else 0


def report(r, host_access, python_objects, front_end=None):
    """One moment's figures as a dict: rss = engine_total + torch + heap_free + python_objects + peers_shared +
    mapped_files + lib_data + other."""
    engine = _engine_parts(r, host_access)
    out = {"step": r.step, "rss": r.rss, "peak_rss": r.peak_rss,
           "engine": engine, "engine_total": r.engine_rss,
           "torch": r.heap_other, "heap_free": r.heap_free, "python_objects": python_objects,
           "peers_shared": r.shared_peers, "mapped_files": r.rss_file, "lib_data": r.lib_data,
           "other": r.other - python_objects,
           "on_nvme": r.nvme, "host_pool": r.pinned_pool, "heap_in_use": r.heap_in_use}
    if front_end:
        out["torch_known"] = front_end
    return out


def engine_memory(engine):
    """engine.memory()'s value: {"now": ..., "peak": ...} for this rank, plus the device's figures on a GPU."""
    now, peak = L.MemoryReport(), L.MemoryReport()
    L.check(engine.lib.zs_memory(engine.ctx, ctypes.byref(now)), "zs_memory")
    L.check(engine.lib.zs_memory_peak(engine.ctx, ctypes.byref(peak)), "zs_memory_peak")
    host = engine.device.type == "cpu"
    torch = engine._torch
    known = {"buffers_and_stand_ins": _buffers_bytes(engine) if host else 0,
             "unhanded_gradients": sum(g.numel() * g.element_size() for u in engine.units for _, g in u.pending
                                       if g is not None and g.device.type == "cpu")}
    py = python_arenas()
    out = {"rank": now.rank, "now": report(now, host, py, known), "peak": report(peak, host, py)}
    if engine.device.type == "cuda":
        out["device"] = {"engine": now.params + now.grads + now.optimizer + now.live_params + now.comm_buffers,
                         "torch_allocated": torch.cuda.memory_allocated(engine.device),
                         "torch_peak_allocated": torch.cuda.max_memory_allocated(engine.device),
                         "torch_reserved": torch.cuda.memory_reserved(engine.device)}
    return out


def _buffers_bytes(engine):
    seen, total = set(), 0
    for t in list(engine.module.buffers()) + [engine._stand, engine._empty]:
        if t is None or t.device.type != "cpu":
            continue
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total
