"""zeroshard._ds_ckpt: DeepSpeed 0.19.8's ZeRO checkpoints read without DeepSpeed installed (resumed on ZeroShard
at any world size by engine.load_checkpoint), and deepspeed.utils.zero_to_fp32's functions over DeepSpeed's
checkpoints and ZeroShard's own (ckpt/ckpt_format.h)."""
import collections
import glob
import json
import math
import os
import pickle
import re

__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_fp32_state_dict",
           "convert_zero_checkpoint_to_state_dict", "load_state_dict_from_zero_checkpoint", "get_model_state_file",
           "get_optim_files", "get_model_state_files", "get_checkpoint_files", "is_deepspeed_checkpoint"]

# the model-states file's own keys; the rest is the client_state the saving script passed
DS_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "frozen_param_fragments",
           "shared_params", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
           "csr_tensor_module_names", "skipped_steps", "global_steps", "global_samples", "dp_world_size",
           "mp_world_size", "checkpoint_parallel_dimensions", "ds_config", "ds_version", "universal_checkpoint_info"}


def _torch():
    import torch
    return torch


# ---------------------------------------------------------------------------------------------------- unpickling
class DsObject:
    """Stands in for a DeepSpeed class pickled by reference (LossScaler, fragment_address, ...): keeps the
    state it was pickled with as attributes, and its DeepSpeed path in _ds_path."""
    _ds_path = "deepspeed"

    def __init__(self, *args, **kwargs):
        self._args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:   # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.__dict__.update(state if isinstance(state, dict) else {"_state": state})

    def __repr__(self):
        return f"<{self._ds_path} {self.__dict__}>"


def _zero_stage(value):
    return int(value)   # ZeroStageEnum is an IntEnum: disabled 0, optimizer_states 1, gradients 2, weights 3


_STAND_INS = {}


def _ds_class(module, name):
    if (module, name) == ("deepspeed.runtime.zero.config", "ZeroStageEnum"):
        return _zero_stage
    key = f"{module}.{name}"
    if key not in _STAND_INS:
        _STAND_INS[key] = type(name, (DsObject,), {"_ds_path": key})
    return _STAND_INS[key]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "deepspeed" or module.startswith("deepspeed."):
            return _ds_class(module, name)
        return super().find_class(module, name)


class _PickleModule:
    """torch.load's pickle_module: DeepSpeed's classes become stand-ins, so DeepSpeed need not be installed."""
    Unpickler = _Unpickler
    __name__ = "zeroshard._ds_ckpt"

    @staticmethod
    def load(f, **kw):
        return _Unpickler(f, **kw).load()


def _load(path, what="file"):
    """A DeepSpeed .pt file, or an error naming it (a missing file is FileNotFoundError)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"zeroshard: DeepSpeed checkpoint: {what} '{path}' is missing")
    try:
        return _torch().load(path, map_location="cpu", weights_only=False, pickle_module=_PickleModule)
    except Exception as e:   # noqa: BLE001 (a truncated zip, a bad pickle: named with the file)
        raise ValueError(f"zeroshard: DeepSpeed checkpoint: {what} '{path}' cannot be read "
                         f"({type(e).__name__}: {e})") from e


def _key(d, key, path, where=""):
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{path}': no key '{where}{key}'")
    return d[key]


# ---------------------------------------------------------------------------------------------------- layout
def resolve_tag(checkpoint_dir, tag):
    if tag is not None:
        return str(tag)
    latest = os.path.join(checkpoint_dir, "latest")
    if not os.path.isfile(latest):
        raise ValueError(f"Unable to find 'latest' file at {latest}")
    with open(latest) as f:
        return f.read().strip()


def is_deepspeed_checkpoint(tag_dir):
    """A DeepSpeed tag directory: model-states files and no ZeroShard manifest."""
    return (os.path.isdir(tag_dir) and not os.path.isfile(os.path.join(tag_dir, "manifest.json")) and
            bool(glob.glob(os.path.join(glob.escape(tag_dir), "*_model_states.pt"))))


def _natural(text):
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", text)]


def get_checkpoint_files(checkpoint_dir, glob_pattern):
    files = sorted(glob.glob(os.path.join(checkpoint_dir, glob_pattern)), key=_natural)
    if not files:
        raise FileNotFoundError(f"can't find {glob_pattern} files in directory '{checkpoint_dir}'")
    return files


def get_optim_files(checkpoint_dir):
    """DeepSpeed's: a DeepSpeed tag directory's optim files in rank order."""
    return get_checkpoint_files(checkpoint_dir, "*_optim_states.pt")


def get_model_state_files(checkpoint_dir):
    return get_checkpoint_files(checkpoint_dir, "*_model_states.pt")


def get_model_state_file(checkpoint_dir, zero_stage):
    """DeepSpeed's: the model-states file of a DeepSpeed tag directory written at zero_stage."""
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"Directory '{checkpoint_dir}' doesn't exist")
    name = "mp_rank_00_model_states.pt" if int(zero_stage) <= 2 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    file = os.path.join(checkpoint_dir, name)
    if not os.path.exists(file):
        raise FileNotFoundError(f"can't find model states file at '{file}'")
    return file


class DsCheckpoint:
    """One DeepSpeed tag directory, reassembled: full fp32 parameters (and moments) by name."""

    def __init__(self):
        self.params = collections.OrderedDict()   # trainable, param_shapes order: fp32, model shapes
        self.frozen = collections.OrderedDict()   # frozen_param_fragments, as saved (zero_to_fp32 keeps dtype)
        self.exp_avg, self.exp_avg_sq = {}, {}
        self.buffers = collections.OrderedDict()
        self.shared = {}
        self.groups, self.steps = [], None


def _model_file(tag_dir):
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if os.path.isfile(os.path.join(tag_dir, name)):
            return os.path.join(tag_dir, name)
    raise FileNotFoundError(f"zeroshard: DeepSpeed checkpoint '{tag_dir}': no mp_rank_00_model_states.pt or "
                            "zero_pp_rank_0_mp_rank_00_model_states.pt")


def _optim_names(tag_dir, world):
    prefix = "bf16_" if os.path.isfile(os.path.join(tag_dir, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")) else ""
    names = [os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt") for r in range(world)]
    found = glob.glob(os.path.join(glob.escape(tag_dir), "*_optim_states.pt"))
    extra = sorted(set(found) - set(names))
    if extra:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{tag_dir}': {os.path.basename(extra[0])} is not one of "
                         f"the {world} ranks' optim files (dp_world_size {world})")
    return names


def read_ds_checkpoint(tag_dir, moments=True):
    """Reads every rank's files of DeepSpeed tag directory tag_dir (stages 1-3) into a DsCheckpoint; moments:
    Adam's exp_avg / exp_avg_sq too. Errors name the file and key."""
    ck = DsCheckpoint()
    ck.model_file = _model_file(tag_dir)
    meta = _load(ck.model_file, "model-states file")
    ck.meta = {k: v for k, v in meta.items() if k != "module"}
    world = int(_key(meta, "dp_world_size", ck.model_file))
    ck.optim_files = _optim_names(tag_dir, world)
    optims = []
    for r, f in enumerate(ck.optim_files):
        sd = _load(f, f"rank {r}'s optim file")
        osd = _key(sd, "optimizer_state_dict", f)
        if not moments:
            osd.pop("optimizer_state_dict", None)
            osd.pop("base_optimizer_state", None)
        optims.append(osd)
    first = ck.optim_files[0]
    ck.stage = int(_key(optims[0], "zero_stage", first, "optimizer_state_dict."))
    ck.world = world
    pc = optims[0].get("partition_count")
    if pc is not None and (max(pc) if isinstance(pc, (list, tuple)) else int(pc)) != world:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{first}': optimizer_state_dict.partition_count {pc} is "
                         f"not dp_world_size {world} ('{ck.model_file}')")
    ck.loss_scaler = optims[0].get("loss_scaler")
    ck.dynamic_loss_scale = optims[0].get("dynamic_loss_scale")
    names = set(meta.get("buffer_names") or [])
    module = meta.get("module") or {}
    ck.buffers.update((k, v.float() if v.is_floating_point() else v) for k, v in module.items() if k in names)
    ck.shared = dict(meta.get("shared_params") or {})
    shapes = _key(meta, "param_shapes", ck.model_file)
    if ck.stage <= 2:
        _merge_zero2(ck, shapes, optims, moments)
    elif ck.stage == 3:
        _merge_zero3(ck, shapes, optims, moments)
    else:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{first}': unknown zero_stage {ck.stage}")
    _merge_frozen(ck, meta, tag_dir, world)
    return ck


def _group_state(osd, g, path, stage):
    """Group g's (stage 1/2) or sub-group g's (stage 3) Adam state in one rank's optimizer_state_dict."""
    key = "base_optimizer_state" if stage <= 2 else "optimizer_state_dict"
    base = _key(osd, key, path, "optimizer_state_dict.")
    if isinstance(base, list):   # elastic: one lean state per group
        st = base[g]
    else:
        order = [p for grp in _key(base, "param_groups", path, f"optimizer_state_dict.{key}.") for p in grp["params"]]
        st = _key(base, "state", path, f"optimizer_state_dict.{key}.").get(order[g] if g < len(order) else g)
    if not isinstance(st, dict) or "exp_avg" not in st or "exp_avg_sq" not in st:
        have = sorted(st) if isinstance(st, dict) else st
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{path}': optimizer_state_dict.{key} state {g} holds "
                         f"{have}, not Adam's exp_avg and exp_avg_sq (ZeroShard resumes Adam and AdamW)")
    return st


def _note_groups(ck, osd, path):
    base = osd.get("base_optimizer_state" if ck.stage <= 2 else "optimizer_state_dict")
    if isinstance(base, dict):
        ck.groups = [{k: v for k, v in g.items() if k != "params"} for g in base.get("param_groups", [])]


def _note_step(ck, st, path):
    s = st.get("step")
    s = int(s.item() if hasattr(s, "item") else s) if s is not None else None
    if ck.steps is not None and s != ck.steps:
        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{path}': the optimizer's step {s} differs from another "
                         f"group's {ck.steps}")
    ck.steps = s


def _merge_zero2(ck, shapes, optims, moments):
    """Stage 1/2: each group's flat fp32 vector is the ranks' partitions end to end; parameters follow one
    another in param_shapes order with param_alignment_paddings between them (zero_to_fp32's reading)."""
    torch = _torch()
    first = ck.optim_files[0]
    paddings = optims[0].get("param_alignment_paddings")
    for g, group in enumerate(shapes):
        parts = [_key(o, "single_partition_of_fp32_groups", f, "optimizer_state_dict.")[g]
                 for o, f in zip(optims, ck.optim_files)]
        full = torch.cat(parts, 0)
        mom = None
        if moments:
            sts = [_group_state(o, g, f, ck.stage) for o, f in zip(optims, ck.optim_files)]
            for st, f, part in zip(sts, ck.optim_files, parts):
                _note_step(ck, st, f)
                for k in ("exp_avg", "exp_avg_sq"):
                    if st[k].numel() > part.numel():
                        raise ValueError(f"zeroshard: DeepSpeed checkpoint '{f}': group {g}'s {k} has "
                                         f"{st[k].numel()} elements, its fp32 partition {part.numel()}")
            mom = {k: torch.cat([st[k].float() for st in sts], 0) for k in ("exp_avg", "exp_avg_sq")}
            _note_groups(ck, optims[0], first)
        pads = paddings[g] if paddings is not None else [0] * len(group)
        if len(pads) != len(group):
            raise ValueError(f"zeroshard: DeepSpeed checkpoint '{first}': param_alignment_paddings[{g}] has "
                             f"{len(pads)} entries for {len(group)} parameters")
        off = 0
        for (name, shape), pad in zip(group.items(), pads):
            n = math.prod(shape)
            if off + n > full.numel():
                raise ValueError(f"zeroshard: DeepSpeed checkpoint '{first}': parameter '{name}' ends at element "
                                 f"{off + n} of group {g}, whose partitions hold {full.numel()}")
            ck.params[name] = full.narrow(0, off, n).view(shape)
            if mom is not None:
                ck.exp_avg[name] = mom["exp_avg"].narrow(0, off, n).view(shape)
                ck.exp_avg_sq[name] = mom["exp_avg_sq"].narrow(0, off, n).view(shape)
            off += n + pad
        align = 2 * ck.world
        if align * math.ceil(off / align) != align * math.ceil(full.numel() / align):
            raise ValueError(f"zeroshard: DeepSpeed checkpoint '{first}': group {g}'s parameters take {off} "
                             f"elements, its partitions hold {full.numel()}")


def _merge_zero3(ck, shapes, optims, moments):
    """Stage 3: every parameter is split across the ranks, ceil(numel / world) elements each (the last rank's
    part padded); each rank's flat groups hold its parts end to end in param_shapes order."""
    torch = _torch()
    flats = [torch.cat(list(_key(o, "fp32_flat_groups", f, "optimizer_state_dict.")), 0)
             for o, f in zip(optims, ck.optim_files)]
    moms = None
    if moments:
        moms = {"exp_avg": [], "exp_avg_sq": []}
        for o, f, flat in zip(optims, ck.optim_files, flats):
            n_sub = len(o["fp32_flat_groups"])
            sts = [_group_state(o, i, f, ck.stage) for i in range(n_sub)]
            for k in moms:
                v = torch.cat([st[k].float().reshape(-1) for st in sts], 0)
                if v.numel() != flat.numel():
                    raise ValueError(f"zeroshard: DeepSpeed checkpoint '{f}': {k} has {v.numel()} elements, the "
                                     f"fp32 partitions {flat.numel()}")
                moms[k].append(v)
            for st in sts:
                _note_step(ck, st, f)
        _note_groups(ck, optims[0], ck.optim_files[0])
    merged = {k: v for d in shapes for k, v in d.items()}
    off = 0
    for name, shape in merged.items():
        n = math.prod(shape)
        part = math.ceil(n / ck.world)
        if off + part > flats[0].numel():
            raise ValueError(f"zeroshard: DeepSpeed checkpoint '{ck.optim_files[0]}': parameter '{name}' ends at "
                             f"element {off + part} of the rank's {flats[0].numel()}")
        ck.params[name] = torch.cat([f[off:off + part] for f in flats], 0)[:n].view(shape)
        if moms is not None:
            for k, dst in (("exp_avg", ck.exp_avg), ("exp_avg_sq", ck.exp_avg_sq)):
                dst[name] = torch.cat([m[off:off + part] for m in moms[k]], 0)[:n].view(shape)
        off += part
    for f, flat in zip(ck.optim_files, flats):
        if off != flat.numel():
            raise ValueError(f"zeroshard: DeepSpeed checkpoint '{f}': the parameters take {off} elements of each "
                             f"rank's partition, this rank's fp32_flat_groups hold {flat.numel()}")


def _merge_frozen(ck, meta, tag_dir, world):
    shapes = meta.get("frozen_param_shapes") or {}
    if not shapes:
        return
    torch = _torch()
    if ck.stage <= 2:
        frags = meta.get("frozen_param_fragments") or {}
        for name in shapes:
            ck.frozen[name] = _key(frags, name, ck.model_file, "frozen_param_fragments.")
        return
    files = [os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt") for r in range(world)]
    metas = [meta] + [_load(f, f"rank {r}'s model-states file") for r, f in enumerate(files) if r > 0]
    for name, shape in shapes.items():
        parts = [_key(m.get("frozen_param_fragments") or {}, name, f, "frozen_param_fragments.")
                 for m, f in zip(metas, files)]
        ck.frozen[name] = torch.cat(parts, 0).narrow(0, 0, math.prod(shape)).view(shape)


# ---------------------------------------------------------------------------------------------------- ZeroShard's
def read_zs_checkpoint(tag_dir, exclude_frozen_parameters=False):
    """A ZeroShard tag directory's fp32 master parameters by name, in the manifest's order (its format:
    ckpt/ckpt_format.h). Each unit is rebuilt from its "param" segments, which must cover it exactly once."""
    import numpy as np
    torch = _torch()
    mpath = os.path.join(tag_dir, "manifest.json")
    try:
        with open(mpath) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"zeroshard: checkpoint '{mpath}' cannot be read ({e})") from e
    if m.get("format") != "zeroshard-checkpoint":
        raise ValueError(f"zeroshard: '{mpath}': format {m.get('format')!r} is not 'zeroshard-checkpoint'")
    units = m["units"]
    flats = [np.zeros(u["numel"], dtype="<f4") for u in units]
    covered = [0] * len(units)
    files = m["files"]
    for i, s in enumerate(m["segments"]):
        if s["kind"] != "param":
            continue
        fname = os.path.join(tag_dir, files[s["file"]]["name"])
        begin, count = s["begin"], s["count"]
        if begin < 0 or begin + count > units[s["unit"]]["numel"]:
            raise ValueError(f"zeroshard: '{mpath}': segments[{i}] [{begin}, {begin + count}) is outside unit "
                             f"'{units[s['unit']]['name']}'")
        try:
            data = np.fromfile(fname, dtype="<f4", count=count, offset=s["offset"])
        except OSError as e:
            raise FileNotFoundError(f"zeroshard: checkpoint file '{fname}' cannot be read ({e})") from e
        if data.size != count:
            raise ValueError(f"zeroshard: checkpoint file '{fname}' ends before segments[{i}]'s {count * 4} bytes "
                             f"at offset {s['offset']}")
        flats[s["unit"]][begin:begin + count] = data
        covered[s["unit"]] += count
    out = collections.OrderedDict()
    for ui, u in enumerate(units):
        if covered[ui] != u["numel"]:
            raise ValueError(f"zeroshard: '{mpath}': unit '{u['name']}' has {covered[ui]} of {u['numel']} elements "
                             "in param segments")
        t = torch.from_numpy(flats[ui])
        for p in u["params"]:
            if exclude_frozen_parameters and p.get("frozen"):
                continue
            out[p["name"]] = t[p["offset"]:p["offset"] + p["numel"]].clone().view(p["shape"])
    return out


# ---------------------------------------------------------------------------------------------------- zero_to_fp32
def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """deepspeed.utils.zero_to_fp32's: an OrderedDict name -> fp32 tensor in the model's shapes, from a DeepSpeed
    checkpoint (buffers, frozen parameters, trainable ones, tied names, as DeepSpeed orders them) or a ZeroShard
    one (its parameters in the manifest's order; ZeroShard checkpoints hold no buffers and each tied parameter
    under its first name). lazy_mode is accepted; the tensors are always materialised."""
    tag = resolve_tag(checkpoint_dir, tag)
    tag_dir = os.path.join(checkpoint_dir, tag)
    if not os.path.isdir(tag_dir):
        raise FileNotFoundError(f"Directory '{tag_dir}' doesn't exist")
    if os.path.isfile(os.path.join(tag_dir, "manifest.json")):
        return read_zs_checkpoint(tag_dir, exclude_frozen_parameters)
    ck = read_ds_checkpoint(tag_dir, moments=False)
    sd = collections.OrderedDict(ck.buffers)
    if not exclude_frozen_parameters:
        sd.update(ck.frozen)
    sd.update((k, v.contiguous()) for k, v in ck.params.items())
    for name, src in ck.shared.items():
        if src in sd:
            sd[name] = sd[src]
    return sd


def convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, dtype=None, max_shard_size="5GB",
                                          safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """deepspeed.utils.zero_to_fp32's: the consolidated state_dict written to output_dir as pytorch_model.bin
    (or model.safetensors), sharded by huggingface_hub past max_shard_size with an index file."""
    torch = _torch()
    dtype = _resolve_dtype(torch, torch.float32 if dtype is None else dtype)
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
    weights = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    os.makedirs(output_dir, exist_ok=True)
    if max_shard_size is not None:
        from huggingface_hub import split_torch_state_dict_into_shards
        pattern = weights.replace(".bin", "{suffix}.bin").replace(".safetensors", "{suffix}.safetensors")
        split = split_torch_state_dict_into_shards(sd, filename_pattern=pattern, max_shard_size=max_shard_size)
        shards, sharded = split.filename_to_tensors, split.is_sharded
    else:
        shards, sharded, split = {weights: list(sd)}, False, None
    for name, keys in shards.items():
        part = {k: sd[k].contiguous() for k in keys}
        path = os.path.join(output_dir, name)
        if safe_serialization:
            from safetensors.torch import save_file
            save_file(part, path, metadata={"format": "pt"})
        else:
            torch.save(part, path)
    if sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        name = "model.safetensors.index.json" if safe_serialization else "pytorch_model.bin.index.json"
        with open(os.path.join(output_dir, name), "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """deepspeed.utils.zero_to_fp32's: convert_zero_checkpoint_to_state_dict in fp32."""
    return convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, dtype=_torch().float32,
                                                 max_shard_size=max_shard_size, safe_serialization=safe_serialization,
                                                 tag=tag, exclude_frozen_parameters=exclude_frozen_parameters)


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """deepspeed.utils.zero_to_fp32's: the model moved to the CPU with the checkpoint's values (strict=False)."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(sd, strict=False)
    return model


def _resolve_dtype(torch, dtype):
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if isinstance(dtype, str):
        dtype = names.get(dtype[6:] if dtype.startswith("torch.") else dtype.lower())
    if dtype not in set(names.values()):
        raise ValueError(f"Unsupported output dtype {dtype!r}. Choose one of: {', '.join(sorted(names))}")
    return dtype

