"""What zeroshard.lightning's strategies (Trainer and Fabric) share: the ZeRO config Lightning's switches describe
(stage, offload, precision, clipping, batch sizes) merged into the user's DeepSpeed JSON, every conflict an error
naming the key."""
import copy

from ._plan import load_config

# the framework's precision names -> the config's section enabled ("" = fp32)
PRECISIONS = {"32": "", "32-true": "", "no": "", "fp32": "", None: None,
              "bf16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16",
              "16": "fp16", "16-mixed": "fp16", "fp16": "fp16"}
OFFLOADS = (None, "none", "cpu", "nvme")


def _set(cfg, path, value, where):
    """cfg[path...] = value unless the user's config already holds another value there."""
    *head, last = path
    d = cfg
    for k in head:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise ValueError(f"{where}: config key '{'.'.join(head)}' is not an object")
    old = d.get(last, "auto")
    if old != "auto" and old != value:
        raise ValueError(f"{where}: config key '{'.'.join(path)}' is {old!r} but the {where} argument asks for "
                         f"{value!r}; set one of them")
    d[last] = value


def precision_of(precision, where):
    """The config section a framework precision name enables ('' for fp32); unknown names are refused."""
    key = str(precision) if precision is not None else None
    if key not in PRECISIONS:
        raise ValueError(f"{where}: precision {precision!r} is not supported (ZeroShard takes "
                         "'32-true', 'bf16-mixed', 'bf16-true', '16-mixed')")
    return PRECISIONS[key]


def dtype_of(precision, where):
    """The torch dtype the engine's parameters take under a framework precision name."""
    import torch
    return {"": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision_of(precision, where)]


def framework_config(config=None, *, where, stage=None, offload_optimizer=None, offload_parameters=None,
                     nvme_path=None, precision=None, micro_batch=None, accum=None, clip=None):
    """A DeepSpeed-style config dict: the user's (path, JSON text or dict; copied) with the framework's switches
    merged in. A switch left None keeps the config's value; one the config contradicts is an error naming
    the key. `where` names the caller in messages ("ZeroShardStrategy", "Accelerator", ...)."""
    cfg = copy.deepcopy(load_config(config)) if config is not None else {}
    if stage is not None:
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"{where}: stage {stage!r}: ZeRO stages are 0, 1, 2 and 3")
        _set(cfg, ("zero_optimization", "stage"), stage, where)
    for key, dev in (("offload_optimizer", offload_optimizer), ("offload_param", offload_parameters)):
        if dev is None:
            continue
        dev = "none" if dev is False else ("cpu" if dev is True else dev)
        if dev not in OFFLOADS:
            raise ValueError(f"{where}: {key} device {dev!r}: 'cpu', 'nvme' or 'none'")
        _set(cfg, ("zero_optimization", key, "device"), dev, where)
        if dev == "nvme":
            if nvme_path is None and "nvme_path" not in cfg["zero_optimization"][key]:
                raise ValueError(f"{where}: {key} to nvme needs nvme_path (zero_optimization.{key}.nvme_path)")
            if nvme_path is not None:
                _set(cfg, ("zero_optimization", key, "nvme_path"), str(nvme_path), where)
    prec = precision_of(precision, where) if precision is not None else None
    if prec is not None:
        for sect in ("bf16", "fp16"):
            on = cfg.get(sect, {}).get("enabled", False)
            if on not in (True, False, "auto"):
                raise ValueError(f"{where}: config key '{sect}.enabled' is {on!r}")
            if sect == prec:
                _set(cfg, (sect, "enabled"), True, where)
            elif on is True:
                raise ValueError(f"{where}: config key '{sect}.enabled' is true but precision {precision!r} "
                                 f"asks for {prec or 'fp32'}")
            elif sect in cfg:
                cfg[sect]["enabled"] = False
    if micro_batch is not None:
        _set(cfg, ("train_micro_batch_size_per_gpu",), int(micro_batch), where)
    if accum is not None:
        _set(cfg, ("gradient_accumulation_steps",), int(accum), where)
    if clip is not None:
        _set(cfg, ("gradient_clipping",), float(clip), where)
    return cfg
