"""The bridge between torch's optimizers and schedulers and ZeroShard's: a client optimizer becomes the
config's `optimizer` section plus one parameter group per param_group, and the optimizer initialize returns
exposes real param_groups that a torch scheduler (or the script) writes and the engine hands to the library.
"""
import ctypes
import weakref

from . import _lib as L

# the hyper-parameters a group may carry, per config optimizer type (torch's key names)
_GROUP_KEYS = {
    "Adam": ("lr", "weight_decay", "betas", "eps"),
    "AdamW": ("lr", "weight_decay", "betas", "eps"),
    "SGD": ("lr", "weight_decay", "momentum", "dampening", "nesterov"),
    "Adagrad": ("lr", "weight_decay", "eps"),
    "Lion": ("lr", "weight_decay", "betas"),
}
_DEEPSPEED = ("FusedAdam", "DeepSpeedCPUAdam")
# DeepSpeed's other optimizer classes, by name: the config type each one runs as
_DEEPSPEED_OTHER = {"DeepSpeedCPUAdagrad": "Adagrad", "DeepSpeedCPULion": "Lion", "FusedLion": "Lion"}
_BITS = {"lr": L.GROUP_LR, "weight_decay": L.GROUP_WEIGHT_DECAY, "betas": L.GROUP_BETAS, "eps": L.GROUP_EPS,
         "momentum": L.GROUP_MOMENTUM, "dampening": L.GROUP_DAMPENING, "nesterov": L.GROUP_NESTEROV}
# torch options ZeroShard's kernels do not compute: refused when set rather than silently ignored
_UNSUPPORTED = {"amsgrad": False, "maximize": False, "lr_decay": 0, "initial_accumulator_value": 0}


def _num(v):
    return v.item() if hasattr(v, "item") else v


def _kind(opt):
    """The config optimizer type a client optimizer instance means, or a ValueError naming its class."""
    import torch
    cls = type(opt).__name__
    if isinstance(opt, torch.optim.AdamW):
        return "AdamW"
    if isinstance(opt, torch.optim.Adam):
        return "AdamW" if opt.defaults.get("decoupled_weight_decay") else "Adam"
    if isinstance(opt, torch.optim.SGD):
        return "SGD"
    if isinstance(opt, torch.optim.Adagrad):
        return "Adagrad"
    if cls in _DEEPSPEED:   # DeepSpeed's own (or this module's stand-ins): recognised by name
        return "AdamW" if getattr(opt, "adam_w_mode", True) else "Adam"
    if cls in _DEEPSPEED_OTHER:
        return _DEEPSPEED_OTHER[cls]
    raise ValueError(f"zeroshard.initialize: optimizer {type(opt).__module__}.{cls} is not supported: ZeroShard runs "
                     "torch.optim.Adam, AdamW, SGD and Adagrad and DeepSpeed's FusedAdam / DeepSpeedCPUAdam (or "
                     "use the config's 'optimizer' section)")


def _check_options(cls, where, d):
    for k, ok in _UNSUPPORTED.items():
        if k in d and _num(d[k]) != ok:
            raise ValueError(f"zeroshard.initialize: {cls} {where} {k}={d[k]!r} is not supported (only {ok!r})")


def config_section(opt):
    """(type, {"type", "params"}): the config `optimizer` section a client optimizer instance implies, from
    its defaults (each param_group's own values become groups)."""
    kind = _kind(opt)
    d = opt.defaults
    _check_options(type(opt).__name__, "defaults", d)
    params = {}
    for k in _GROUP_KEYS[kind]:
        if k in d:
            v = d[k]
            params[k] = [float(_num(x)) for x in v] if k == "betas" else (bool(v) if k == "nesterov" else float(_num(v)))
    if kind == "Adam":
        params["adam_w_mode"] = False   # torch.optim.Adam's weight decay is L2, added to the gradient
    return kind, {"type": kind, "params": params}


def group_opts(kind, group, defaults):
    """zs_group_opts holding the fields of `group` that differ from `defaults` (both torch-style dicts)."""
    o = L.GroupOpts()
    for k in _GROUP_KEYS[kind]:
        if k in group and _differs(group[k], defaults.get(k)):
            _put(o, k, group[k])
    return o


def _differs(a, b):
    if b is None:
        return True
    if isinstance(a, (tuple, list)):
        return [float(_num(x)) for x in a] != [float(_num(x)) for x in b]
    return float(_num(a)) != float(_num(b))


def _put(o, k, v):
    o.set |= _BITS[k]
    if k == "betas":
        o.beta1, o.beta2 = float(_num(v[0])), float(_num(v[1]))
    elif k == "nesterov":
        o.nesterov = int(bool(v))
    else:
        setattr(o, k, float(_num(v)))


def _values(kind, group):
    return {k: (tuple(float(_num(x)) for x in group[k]) if k == "betas" else _num(group[k]))
            for k in _GROUP_KEYS[kind] if k in group}


def _config_kind(cfg):
    """The config optimizer's type as _GROUP_KEYS names it (no section: the library's AdamW)."""
    t = str(cfg.get("optimizer", {}).get("type", "AdamW")).lower()
    return {k.lower(): k for k in _GROUP_KEYS}.get(t, "AdamW")


def _dict_groups(kind, groups):
    """model_parameters as a list of dicts (torch's format), over a config optimizer: each dict's own
    hyper-parameters make its group."""
    out = []
    for i, g in enumerate(groups):
        if not isinstance(g, dict) or "params" not in g:
            raise ValueError(f"zeroshard.initialize: model_parameters[{i}] is not a parameter group (a dict with "
                             "'params') while model_parameters[0] is")
        extra = set(g) - {"params", "name"} - set(_GROUP_KEYS[kind]) - set(_UNSUPPORTED)
        if extra:
            raise ValueError(f"zeroshard.initialize: model_parameters[{i}] has {sorted(extra)}, which a {kind} "
                             f"group does not take (it takes {', '.join(_GROUP_KEYS[kind])})")
        _check_options(kind, f"model_parameters[{i}]", g)
        full = dict(g)
        full["params"] = [g["params"]] if hasattr(g["params"], "data_ptr") else list(g["params"])
        out.append(full)
    return out


def _check_groups(groups, names):
    """Each optimized parameter is the model's, trainable, and in one group only."""
    seen = {}
    for i, g in enumerate(groups):
        for p in g["params"]:
            if id(p) not in names:
                raise ValueError(f"zeroshard.initialize: param_groups[{i}] holds a parameter of shape "
                                 f"{tuple(p.shape)} that is not the model's")
            name = names[id(p)]
            if not p.requires_grad:
                raise ValueError(f"zeroshard.initialize: parameter '{name}' has requires_grad=False but is given to "
                                 "the optimizer (leave frozen parameters out of it)")
            if id(p) in seen:
                raise ValueError(f"zeroshard.initialize: parameter '{name}' is in param_groups[{seen[id(p)]}] and "
                                 f"param_groups[{i}] (each parameter belongs to one group)")
            seen[id(p)] = i


def resolve(torch, model, cfg, optimizer=None, model_parameters=None):
    """(groups, bridge): the torch param_groups to train and their mapping onto ZeroShard. A client
    optimizer (an instance, or a callable DeepSpeed calls with model_parameters) sets cfg's `optimizer`
    section; the parameters in no group are frozen for the optimizer."""
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), n)
    if optimizer is not None and "optimizer" in cfg:
        raise ValueError("zeroshard.initialize: both a client optimizer (optimizer=) and the config's 'optimizer' "
                         "section; pass one of them (DeepSpeed refuses both too)")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer) and \
            type(optimizer).__name__ not in _DEEPSPEED and callable(optimizer):
        params = list(model_parameters) if model_parameters is not None else \
            [p for p in model.parameters() if p.requires_grad]
        optimizer = optimizer(params)
    if optimizer is not None:
        kind, cfg["optimizer"] = config_section(optimizer)
        groups = optimizer.param_groups
        for i, g in enumerate(groups):
            _check_options(type(optimizer).__name__, f"param_groups[{i}]", g)
        bridge = GroupBridge(kind, dict(optimizer.defaults))
    else:
        kind = _config_kind(cfg)
        mp = list(model_parameters) if model_parameters is not None else \
            [p for p in model.parameters() if p.requires_grad]
        groups = _dict_groups(kind, mp) if mp and isinstance(mp[0], dict) else [{"params": mp}]
        bridge = GroupBridge(kind, {})
    _check_groups(groups, names)
    return groups, bridge


def default_groups(model, cfg):
    import torch
    return resolve(torch, model, cfg)


class GroupBridge:
    """Maps torch param_groups onto ZeroShard groups and hands what a script or scheduler changed."""

    def __init__(self, kind, defaults):
        self.kind, self.defaults = kind, defaults
        self.ids = []       # ZeroShard group id per param_group
        self.handed = []    # the values the library holds per param_group

    def register(self, lib, ctx, groups, pid_of):
        """Before zs_setup: the first group whose values are the defaults is group 0, every other one is added
        (so a plain single-group optimizer needs no group calls)."""
        zero_used = False
        for i, g in enumerate(groups):
            o = group_opts(self.kind, g, self.defaults)
            if not o.set and not zero_used:
                gid, zero_used = 0, True
            else:
                if not hasattr(lib, "zs_group_add"):
                    raise L.ZsError("zeroshard: parameter groups need zs_group_add, which this libzeroshard lacks")
                out = ctypes.c_int32()
                L.check(lib.zs_group_add(ctx, ctypes.byref(o), ctypes.byref(out)), f"param_groups[{i}]")
                gid = out.value
            for p in g["params"]:
                if gid:
                    L.check(lib.zs_param_group(ctx, pid_of(p), gid), f"param_groups[{i}]")
            self.ids.append(gid)
            self.handed.append(_values(self.kind, g))

    def hand(self, lib, ctx, groups):
        """At a boundary, before zs_step: every group's fields that changed since they were last handed."""
        for i, g in enumerate(groups):
            now = _values(self.kind, g)
            o = L.GroupOpts()
            for k, v in now.items():
                if v != self.handed[i].get(k):
                    _put(o, k, v)
            if not o.set:
                continue
            if not hasattr(lib, "zs_group_set"):
                raise L.ZsError(f"zeroshard: param_groups[{i}] changed ({_names(o)}), but this libzeroshard lacks "
                                "zs_group_set")
            L.check(lib.zs_group_set(ctx, self.ids[i], ctypes.byref(o)), f"param_groups[{i}]")
            self.handed[i] = now

    def fill(self, lib, ctx, groups, cfg):
        """After zs_setup: the values a group did not give are the library's (the config's defaults)."""
        params = cfg.get("optimizer", {}).get("params", {})
        for i, g in enumerate(groups):
            if hasattr(lib, "zs_group_get"):
                o = L.GroupOpts()
                L.check(lib.zs_group_get(ctx, self.ids[i], ctypes.byref(o)), f"param_groups[{i}]")
                lib_values = {"lr": o.lr, "weight_decay": o.weight_decay, "betas": (o.beta1, o.beta2), "eps": o.eps,
                              "momentum": o.momentum, "dampening": o.dampening, "nesterov": bool(o.nesterov)}
            else:   # a library without groups: the config's numbers
                lib_values = {k: (tuple(v) if k == "betas" else v) for k, v in params.items()
                              if k in _GROUP_KEYS[self.kind] and not isinstance(v, str)}
                lib_values.setdefault("lr", 0.0)
            for k in _GROUP_KEYS[self.kind]:
                if k in lib_values:
                    g.setdefault(k, lib_values[k])
            self.handed[i] = _values(self.kind, g)

    def torch_defaults(self, groups):
        if self.defaults:
            return self.defaults
        return {k: v for k, v in groups[0].items() if k != "params"} if groups else {"lr": 0.0}

    def sync_scheduled(self, lib, ctx, groups):
        """After an applied step without a client scheduler: the lr each group used (a config schedule moves
        it) is what param_groups report."""
        lrs = self.lrs(lib, ctx)
        if lrs is None:
            return
        for i, (g, lr) in enumerate(zip(groups, lrs)):
            if lr != self.handed[i].get("lr"):
                g["lr"] = lr
                self.note_lr(i, lr)

    def reset(self, lib, ctx, groups, groups_are_truth):
        """After a checkpoint load. When the param_groups are the truth (no config schedule) they are all handed
        at the next boundary; else the library's (restored) values are what param_groups report."""
        if not hasattr(lib, "zs_group_set"):   # a library without groups: nothing can differ
            return
        if groups_are_truth or not hasattr(lib, "zs_group_get"):
            self.handed = [{} for _ in groups]
            return
        for i, g in enumerate(groups):
            o = L.GroupOpts()
            L.check(lib.zs_group_get(ctx, self.ids[i], ctypes.byref(o)), f"param_groups[{i}]")
            g["lr"] = o.lr
            self.handed[i] = _values(self.kind, g)

    def lrs(self, lib, ctx, upcoming=False):
        """Each group's lr as the last optimizer step used it (zs_group_get), or with upcoming as the next one
        will (zs_group_next_lr); None without the call."""
        if not hasattr(lib, "zs_group_next_lr" if upcoming else "zs_group_get"):
            return None
        out = []
        for gid in self.ids:
            if upcoming:
                v = ctypes.c_double()
                L.check(lib.zs_group_next_lr(ctx, gid, ctypes.byref(v)), f"group {gid}")
                out.append(v.value)
            else:
                o = L.GroupOpts()
                L.check(lib.zs_group_get(ctx, gid, ctypes.byref(o)), f"group {gid}")
                out.append(o.lr)
        return out

    def note_lr(self, i, lr):
        """The library moved group i's lr itself (a config schedule): not a change to hand back."""
        self.handed[i]["lr"] = lr


def _names(o):
    return ", ".join(k for k, b in _BITS.items() if o.set & b)


def make_optimizer_class(torch):
    """torch's LRScheduler accepts only torch.optim.Optimizer instances: the front end's optimizer is one,
    whose param_groups are the client optimizer's dicts (so a scheduler built on either writes the same)."""

    class ZeroShardOptimizer(torch.optim.Optimizer, ZeROOptimizer):
        """What initialize returns as the optimizer. Its param_groups are real (lr, weight_decay, betas, ...
        per group, written by a scheduler or the script, handed to ZeroShard at each boundary); the optimizer
        itself runs inside ZeroShard, whose moments are not in `state` (zeroshard.utils reads them)."""

        def __init__(self, engine, groups, defaults):
            super().__init__(groups, defaults)
            self._engine = weakref.ref(engine)   # no cycle: a dropped engine goes at once, on every rank
            self.overflow = False

        def zero_grad(self, set_to_none=True):
            """Gradients are ZeroShard's and cleared by the step."""

        def step(self, closure=None):
            raise RuntimeError("zeroshard: call engine.step(), not optimizer.step() (as with DeepSpeed)")

        def state_dict(self):
            """param_groups' hyper-parameters only (params as indices, as torch's): the moments live in
            ZeroShard and go into its checkpoints (engine.save_checkpoint)."""
            index, groups = {}, []
            for g in self.param_groups:
                d = {k: v for k, v in g.items() if k != "params"}
                d["params"] = [index.setdefault(id(p), len(index)) for p in g["params"]]
                groups.append(d)
            return {"state": {}, "param_groups": groups}

        def load_state_dict(self, state_dict):
            """Takes the param_groups' hyper-parameters (the moments come from a ZeroShard checkpoint)."""
            saved = state_dict["param_groups"]
            if len(saved) != len(self.param_groups):
                raise ValueError(f"zeroshard: optimizer state_dict has {len(saved)} param_groups, the optimizer "
                                 f"{len(self.param_groups)}")
            for g, s in zip(self.param_groups, saved):
                g.update({k: v for k, v in s.items() if k != "params"})

    return ZeroShardOptimizer


# ---------------------------------------------------------------------------- DeepSpeed's optimizer classes

class DeepSpeedOptimizer:
    """deepspeed.runtime.base_optimizer.DeepSpeedOptimizer: the base of what initialize returns as the
    optimizer (Lightning's Fabric checks isinstance against it)."""


class ZeROOptimizer(DeepSpeedOptimizer):
    """deepspeed.runtime.base_optimizer.ZeROOptimizer."""


def _torch_optimizer():
    import torch
    return torch.optim.Optimizer


def _ds_optimizer(name, kind, defaults_of):
    """A class standing for one of DeepSpeed's optimizers: it holds the param_groups and the defaults that
    initialize turns into the config's optimizer (the algorithm runs inside ZeroShard on the shards); its own
    step() is refused. Made on first use, so that importing deepspeed.ops needs no torch until then."""
    def make():
        class Stand(_torch_optimizer()):
            def __init__(self, params, *args, **kwargs):
                super().__init__(params, defaults_of(*args, **kwargs))
                self.adam_w_mode = self.defaults.pop("adam_w_mode", True)

            def step(self, closure=None):
                raise RuntimeError(f"zeroshard: {name}.step(): pass the optimizer to deepspeed.initialize; "
                                   "engine.step() runs it on ZeroShard's shards")
        Stand.__name__ = Stand.__qualname__ = name
        Stand.__doc__ = f"DeepSpeed's {name}: run by ZeroShard as the config optimizer '{kind}'."
        return Stand
    return make


def _adam_defaults(lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                   amsgrad=False, adamw_mode=True, set_grad_none=True, fp32_optimizer_states=True,
                   adam_w_mode=None, **_ignored):
    if not bias_correction:
        raise ValueError("zeroshard: Adam with bias_correction=False is not supported (ZeroShard's Adam corrects)")
    mode = adamw_mode if adam_w_mode is None else adam_w_mode
    return {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
            "adam_w_mode": bool(mode)}


def _adagrad_defaults(lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False, fp32_optimizer_states=True):
    return {"lr": lr, "eps": eps, "weight_decay": weight_decay, "adam_w_mode": True}


def _lion_defaults(lr=1e-3, betas=(0.9, 0.999), weight_decay=0, fp32_optimizer_states=True):
    return {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "adam_w_mode": True}


_MADE = {}
_CLASSES = {"FusedAdam": ("AdamW", _adam_defaults), "DeepSpeedCPUAdam": ("AdamW", _adam_defaults),
            "DeepSpeedCPUAdagrad": ("Adagrad", _adagrad_defaults), "DeepSpeedCPULion": ("Lion", _lion_defaults),
            "FusedLion": ("Lion", _lion_defaults)}


def __getattr__(name):
    if name in _CLASSES:
        if name not in _MADE:
            kind, defaults = _CLASSES[name]
            _MADE[name] = _ds_optimizer(name, kind, defaults)()
        return _MADE[name]
    raise AttributeError(f"module 'zeroshard.optim' has no attribute '{name}'")
