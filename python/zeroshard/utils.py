"""zeroshard.utils: deepspeed.utils' readers and writers of a parameter's full state (safe_get_full_*,
safe_set_full_*), whatever the stage: zs_param_read / zs_param_write gather or scatter the shards.

Every call is collective over the engine's ranks (each rank must make it, for the same parameter, in the
same order) and returns an fp32 tensor of the parameter's shape on every rank. Valid at a step boundary;
safe_get_full_grad between engine.backward() at the accumulation boundary and engine.step() (the reduced
gradient, averaged over ranks and micro-batches, before clipping). The setters take rank 0's value (DeepSpeed
expects every rank to pass the same one). A parameter no engine holds answers from itself: its values (or,
built under zero.Init, the spill store's), its .grad, and None for optimizer state.
"""
import ctypes

from . import _lib as L
from . import zero

_KEYS = {"exp_avg": L.STATE_EXP_AVG, "exp_avg_sq": L.STATE_EXP_AVG_SQ}

__all__ = ["safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_optimizer_state"]


def _owner(p):
    """(engine, C parameter id, shape) of the engine holding p, or None."""
    from .engine import _engines
    for e in list(_engines):
        u = e._pinfo.get(p)
        if u is not None:
            shape = next(s for q, _, _, s in u.params if q is p)
            return e, e._pid[p], shape
    return None


def _state_key(key):
    if key not in _KEYS:
        raise ValueError(f"zeroshard.utils: optimizer state '{key}' is not kept (one of {sorted(_KEYS)})")
    return _KEYS[key]


def _read(p, which, what):
    e, pid, shape = _owner(p)
    torch = e._torch
    out = torch.empty(shape, dtype=torch.float32)   # host memory: the library copies into it
    e._mem.enter()
    L.check(e.lib.zs_param_read(e.ctx, pid, which, ctypes.c_void_p(out.data_ptr())),
            f"{what} of '{e._names.get(id(p), '?')}'")
    return out if e.device.type == "cpu" else out.to(e.device)   # on the engine's device, as DeepSpeed's


def _write(p, value, which, what):
    e, pid, shape = _owner(p)
    torch = e._torch
    vals = torch.as_tensor(value).detach().to("cpu", torch.float32).contiguous()
    if vals.numel() != int(torch.Size(shape).numel()):
        raise ValueError(f"zeroshard.utils: {what} of '{e._names.get(id(p), '?')}': value has {vals.numel()} "
                         f"elements, the parameter {tuple(shape)}")
    e._mem.enter()
    L.check(e.lib.zs_param_write(e.ctx, pid, which, ctypes.c_void_p(vals.data_ptr()), 0),
            f"{what} of '{e._names.get(id(p), '?')}'")
    e._mem.ready(f"{what} of '{e._names.get(id(p), '?')}'")


def safe_get_full_fp32_param(param):
    """The parameter's full fp32 master on every rank. Collective."""
    if _owner(param) is not None:
        return _read(param, L.STATE_PARAM, "safe_get_full_fp32_param")
    sp = zero._spill_of(param)
    if sp is not None:
        return zero._read_full(param, sp)
    return param.detach().float().clone()


def safe_get_full_grad(param):
    """The full reduced fp32 gradient the next step will use, on every rank; None for a frozen parameter.
    Collective."""
    if not param.requires_grad:
        return None
    if _owner(param) is not None:
        return _read(param, L.STATE_GRAD, "safe_get_full_grad")
    return None if param.grad is None else param.grad.detach().float().clone()


def safe_get_full_optimizer_state(param, optim_state_key):
    """The full fp32 optimizer state ("exp_avg": Adam's m or SGD's momentum; "exp_avg_sq": Adam's v) on
    every rank; None for a frozen parameter. Collective."""
    which = _state_key(optim_state_key)
    if not param.requires_grad or _owner(param) is None:
        return None
    return _read(param, which, f"safe_get_full_optimizer_state('{optim_state_key}')")


def safe_set_full_fp32_param(param, value):
    """Rank 0's value becomes the parameter's fp32 master and working copy on every rank (the next forward
    sees it). Collective."""
    if _owner(param) is not None:
        return _write(param, value, L.STATE_PARAM, "safe_set_full_fp32_param")
    with zero.GatheredParameters([param], modifier_rank=0):
        param.data.copy_(zero._torch().as_tensor(value).reshape(param.shape))


def safe_set_full_optimizer_state(param, value, optim_state_key):
    """Rank 0's value becomes the parameter's optimizer state `optim_state_key` on every rank. Collective."""
    which = _state_key(optim_state_key)
    if _owner(param) is None:
        raise ValueError("zeroshard.utils: safe_set_full_optimizer_state: the parameter is not trained by an engine")
    return _write(param, value, which, f"safe_set_full_optimizer_state('{optim_state_key}')")
