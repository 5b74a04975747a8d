"""engine.load_checkpoint on a DeepSpeed checkpoint: rank 0 reads it (zeroshard._ds_ckpt) and checks it against
the engine, every rank learns the verdict, and the full values go in with zs_param_write, the counters with
zs_step_counts_set. Whatever the checkpoint holds that ZeroShard cannot honour is an error naming file and key."""
import ctypes
import io
import os

from . import _lib as L
from . import _ds_ckpt as D
from . import optim as O


def _ckpt_kind(ck):
    """The checkpoint's optimizer as the config names it: the ds_config's type, else the client optimizer's
    groups (torch's Adam records decoupled_weight_decay)."""
    opt = (ck.meta.get("ds_config") or {}).get("optimizer")
    if opt:
        t = str(opt.get("type", "")).lower()
        if t in ("adam", "fusedadam", "cpuadam", "deepspeedcpuadam"):
            return "AdamW" if (opt.get("params") or {}).get("adam_w_mode", True) else "Adam"
        return {"adamw": "AdamW"}.get(t, opt.get("type"))
    return "AdamW" if any(g.get("decoupled_weight_decay") for g in ck.groups) else "Adam"


def _check_optimizer(engine, ck):
    mine = O._config_kind(engine.config)
    theirs = _ckpt_kind(ck)
    where = f"'{ck.optim_files[0]}' (optimizer_state_dict) with '{ck.model_file}' (ds_config.optimizer)"
    if mine not in ("Adam", "AdamW") or theirs not in ("Adam", "AdamW"):
        raise ValueError(f"zeroshard: DeepSpeed checkpoint {where}: optimizer {theirs}, the engine runs {mine}; "
                         "ZeroShard resumes Adam and AdamW moments only")
    decays = [float(g.get("weight_decay", 0) or 0) for g in ck.groups] + \
             [float(g.get("weight_decay", 0) or 0) for g in engine.optimizer.param_groups]
    if mine != theirs and any(decays):
        raise ValueError(f"zeroshard: DeepSpeed checkpoint {where}: optimizer {theirs}, the engine runs {mine}, and "
                         "with weight decay the two differ")


def _check_precision(ck):
    fp16 = (ck.meta.get("ds_config") or {}).get("fp16") or {}
    scaler = ck.loss_scaler
    scale = getattr(scaler, "cur_scale", 1.0)
    if fp16.get("enabled") or ck.dynamic_loss_scale or scale != 1.0:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{ck.optim_files[0]}': optimizer_state_dict.loss_scaler "
                         f"(fp16 loss scaling, scale {scale}, dynamic {bool(ck.dynamic_loss_scale)}; ds_config.fp16 "
                         f"in '{ck.model_file}': {fp16 or None}) is not resumed: ZeroShard resumes fp32 and bf16 "
                         "DeepSpeed runs")


def _match(engine, ck, strict, module_only):
    """{C parameter id: (name in the checkpoint, frozen there)}, checking names, sizes and trainability."""
    model_names = {}
    for n, p in engine.module.named_parameters(remove_duplicate=False):
        model_names.setdefault(n, p)
    found, by_pid = set(), {}
    for name, t in list(ck.params.items()) + list(ck.frozen.items()):
        p = model_names.get(name)
        if p is None or p not in engine._pid:
            raise ValueError(f"zeroshard: DeepSpeed checkpoint '{ck.model_file}': parameter '{name}' (param_shapes) "
                             "is not a parameter of the model")
        want = engine._poff[p][1]
        if t.numel() != want:
            raise ValueError(f"zeroshard: DeepSpeed checkpoint '{ck.model_file}': parameter '{name}' has shape "
                             f"{tuple(t.shape)}, the model's {want} elements")
        frozen_there = name in ck.frozen
        if not module_only and frozen_there != engine._pinfo[p].frozen:
            raise ValueError(f"zeroshard: DeepSpeed checkpoint '{ck.model_file}': parameter '{name}' is "
                             f"{'frozen' if frozen_there else 'trained'} there (frozen_param_shapes), "
                             f"{'frozen' if engine._pinfo[p].frozen else 'trained'} in the engine")
        by_pid[engine._pid[p]] = (name, frozen_there)
        found.add(p)
    missing = [engine._names[id(p)] for u in engine.units for p, *_ in u.params if p not in found]
    if missing and strict:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{ck.model_file}': the model's parameter '{missing[0]}' "
                         f"is not in param_shapes ({len(missing)} missing; load_module_strict=False keeps them)")
    return by_pid


def _plan(engine, tag_dir, flags):
    """Rank 0: the checkpoint read and checked; (values by C id, metadata for every rank)."""
    module_only, optimizer, scheduler, strict = flags
    ck = D.read_ds_checkpoint(tag_dir, moments=not module_only and optimizer)
    _check_precision(ck)
    if not module_only and optimizer:
        _check_optimizer(engine, ck)
    by_pid = _match(engine, ck, strict, module_only)
    values = {}
    for pid, (name, frozen) in by_pid.items():
        v = {"param": (ck.frozen[name] if frozen else ck.params[name]).float().reshape(-1).contiguous()}
        if not frozen and not module_only and optimizer:
            v["exp_avg"] = ck.exp_avg[name].reshape(-1).contiguous()
            v["exp_avg_sq"] = ck.exp_avg_sq[name].reshape(-1).contiguous()
        values[pid] = v
    meta = ck.meta
    sched = meta.get("lr_scheduler")
    sched_steps = -1
    if not module_only and scheduler:
        where = f"'{ck.model_file}': lr_scheduler"
        if engine.lr_scheduler is not None and not engine._client_scheduler:
            if not isinstance(sched, dict) or "last_batch_iteration" not in sched:
                raise ValueError(f"zeroshard: DeepSpeed checkpoint {where} is {sched!r}, with no last_batch_iteration "
                                 "for the config's scheduler")
            sched_steps = int(sched["last_batch_iteration"]) + 1
        elif engine.lr_scheduler is None and sched is not None:
            raise ValueError(f"zeroshard: DeepSpeed checkpoint {where} holds a scheduler's state and the engine has "
                             "none (load_lr_scheduler_states=False leaves it)")
        elif engine._client_scheduler and sched is None:
            raise ValueError(f"zeroshard: DeepSpeed checkpoint {where} is None and the engine has a client scheduler")
    optim_steps = ck.steps if ck.steps is not None else 0
    info = {"client_state": {k: v for k, v in meta.items() if k not in D.DS_KEYS},
            "global_steps": int(meta.get("global_steps", 0)), "skipped_steps": int(meta.get("skipped_steps", 0)),
            "optim_steps": optim_steps if optimizer else 0, "sched_steps": sched_steps, "lr_scheduler": sched,
            "groups": ck.groups, "buffers": dict(ck.buffers), "pids": sorted(values)}
    if not module_only and info["optim_steps"] > info["global_steps"]:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{ck.optim_files[0]}': the optimizer's step "
                         f"{info['optim_steps']} is more than global_steps {info['global_steps']} ('{ck.model_file}')")
    return values, info


def _restore_groups(engine, groups, has_scheduler):
    """The checkpoint's Adam hyper-parameters into param_groups (handed to the library at the next boundary);
    lr too when no scheduler sets it."""
    pg = engine.optimizer.param_groups
    if not groups:
        return
    if len(groups) != len(pg) and any(g != groups[0] for g in groups):
        raise ValueError(f"zeroshard: DeepSpeed checkpoint: {len(groups)} optimizer param_groups, the engine "
                         f"{len(pg)}")
    for i, g in enumerate(pg):
        src = groups[i] if len(groups) == len(pg) else groups[0]
        for k in ("betas", "eps", "weight_decay") + (() if has_scheduler else ("lr",)):
            if k in src and k in g:
                g[k] = tuple(src[k]) if k == "betas" else src[k]


def load_into_engine(engine, load_dir, tag, load_module_strict=True, load_optimizer_states=True,
                     load_lr_scheduler_states=True, load_module_only=False):
    """engine.load_checkpoint's DeepSpeed path: (path, client_state). Collective."""
    torch = engine._torch
    tag_dir = os.path.join(os.fspath(load_dir), tag)
    flags = (bool(load_module_only), bool(load_optimizer_states), bool(load_lr_scheduler_states),
             bool(load_module_strict))
    values, blob = {}, b""
    if engine.global_rank == 0:
        try:
            values, info = _plan(engine, tag_dir, flags)
            buf = io.BytesIO()
            torch.save({"error": None, "info": info}, buf)
        except Exception as e:   # noqa: BLE001 (every rank raises it, below)
            buf = io.BytesIO()
            torch.save({"error": str(e) if str(e).startswith("zeroshard:") else f"zeroshard: {type(e).__name__}: {e}"},
                       buf)
        blob = buf.getvalue()
    got = torch.load(io.BytesIO(L.world_bcast_bytes(blob, 0, "load_checkpoint")), weights_only=False)
    if got["error"]:
        raise L.ZsError(got["error"])
    info = got["info"]
    module_only, optimizer, scheduler, _ = flags
    kinds = [("param", L.STATE_PARAM)]
    if not module_only:
        kinds += [("exp_avg", L.STATE_EXP_AVG), ("exp_avg_sq", L.STATE_EXP_AVG_SQ)]
    pids = set(info["pids"])
    for u in engine.units:   # one order on every rank: each write is collective
        for p, *_ in u.params:
            pid = engine._pid[p]
            if pid not in pids:
                continue   # load_module_strict=False: not in the checkpoint, kept
            for key, which in kinds:
                if key != "param" and u.frozen:
                    continue
                ptr = None
                if engine.global_rank == 0:
                    v = values[pid].get(key)
                    if v is None:   # load_optimizer_states=False: the moments start again
                        v = torch.zeros_like(values[pid]["param"])
                    ptr = ctypes.c_void_p(v.data_ptr())
                L.check(engine.lib.zs_param_write(engine.ctx, pid, which, ptr, 0),
                        f"DeepSpeed checkpoint '{tag_dir}': {key} of '{engine._names[id(p)]}'")
    with torch.no_grad():
        bufs = dict(engine.module.named_buffers())
        for n, b in info["buffers"].items():
            if n in bufs and bufs[n] is not None:
                bufs[n].copy_(b)
    if not module_only:
        if not hasattr(engine.lib, "zs_step_counts_set"):
            raise L.ZsError("zeroshard: resuming a DeepSpeed checkpoint needs zs_step_counts_set, which this "
                            "libzeroshard lacks")
        L.check(engine.lib.zs_step_counts_set(engine.ctx, info["global_steps"], info["optim_steps"],
                                              info["sched_steps"]), f"DeepSpeed checkpoint '{tag_dir}'")
        engine.skipped_steps = info["skipped_steps"]
        has_sched = engine.lr_scheduler is not None and scheduler
        if optimizer:
            _restore_groups(engine, info["groups"], engine.lr_scheduler is not None)
        if has_sched and engine._client_scheduler:
            engine.lr_scheduler.load_state_dict(info["lr_scheduler"])
    engine._refresh_all()
    return tag_dir, info["client_state"]
