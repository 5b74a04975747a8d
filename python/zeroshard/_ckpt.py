"""The engine's state in and out: DeepSpeed's save_checkpoint / load_checkpoint over the library's checkpoints,
save_16bit_model, and the full model's state_dict / load_state_dict gathered one unit at a time."""
import ctypes
import io
import json
import os

from . import _elastic
from . import _lib as L

EXTRA = "client_state.pt"   # the front end's file in a checkpoint: client_state, scheduler, param_groups


class CheckpointMixin:
    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, exclude_frozen_parameters=False):
        """Collective. The library writes the tag directory; client_state, the client scheduler's state_dict
        and the param_groups' values go into it as one file written before it is published (atomic with it)."""
        if self._micro_backward:
            raise RuntimeError("zeroshard: save_checkpoint between engine.backward() and engine.step()")
        torch = self._torch
        extra = {"client_state": client_state or {}, "param_groups": self.optimizer.state_dict()["param_groups"],
                 "skipped_steps": self.skipped_steps,
                 "lr_scheduler": self.lr_scheduler.state_dict() if self._client_scheduler and self.lr_scheduler else None}
        buf = io.BytesIO()
        torch.save(extra, buf)
        data = buf.getvalue()
        if not hasattr(self.lib, "zs_checkpoint_save_opts"):
            return self._save_plain(save_dir, tag, save_latest, data)
        opts = L.CkptOpts(tag=str(tag).encode() if tag is not None else None, no_latest=int(not save_latest),
                          extra_name=EXTRA.encode(), extra_data=ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p),
                          extra_bytes=len(data))
        L.check(self.lib.zs_checkpoint_save_opts(self.ctx, os.fspath(save_dir).encode(), ctypes.byref(opts)),
                f"checkpoint save to '{save_dir}'")
        step = self.stats().global_step
        if save_latest:   # the one a resume without a tag takes
            _elastic.saved(save_dir, str(tag) if tag is not None else f"global_step{step}", step)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        """Collective, at any step boundary. (None, None) when no tag is given and load_dir has no `latest`;
        else (path, client_state). The parameters are loaded strictly whatever load_module_strict says (the
        library checks every name and size). A DeepSpeed ZeRO checkpoint (stages 1-3, any world size) is
        recognised by its files and resumed through zeroshard._ds_resume."""
        if self._micro_backward:
            raise RuntimeError("zeroshard: load_checkpoint between engine.backward() and engine.step()")
        ds_tag = _deepspeed_tag(load_dir, tag)
        if ds_tag is not None:   # DeepSpeed's own files: read and written in (zeroshard._ds_resume)
            from ._ds_resume import load_into_engine
            path, client = load_into_engine(self, load_dir, ds_tag, load_module_strict, load_optimizer_states,
                                            load_lr_scheduler_states, load_module_only)
            return path, client
        if not hasattr(self.lib, "zs_checkpoint_load_opts"):
            return self._load_plain(load_dir, tag, load_optimizer_states, load_lr_scheduler_states, load_module_only)
        opts = L.CkptOpts(tag=str(tag).encode() if tag is not None else None, module_only=int(bool(load_module_only)),
                          no_optimizer=int(not load_optimizer_states), no_scheduler=int(not load_lr_scheduler_states))
        loaded = ctypes.c_int(0)
        d = os.fspath(load_dir)
        L.check(self.lib.zs_checkpoint_load_opts(self.ctx, d.encode(), ctypes.byref(opts), ctypes.byref(loaded)),
                f"checkpoint load from '{d}'")
        if not loaded.value:
            return None, None
        self._refresh_all()
        used = self.lib.zs_checkpoint_tag(self.ctx).decode()
        extra = self._read_extra(d, used)
        if not load_module_only:
            self._restore_extra(extra, load_optimizer_states, load_lr_scheduler_states)
        _elastic.loaded(d, used, self.stats().global_step)
        return os.path.join(d, used), extra.get("client_state", {})

    def _save_plain(self, save_dir, tag, save_latest, data):
        """A library without checkpoint options: global_step<N> tags only, the extra file written after."""
        step = self.stats().global_step
        if (tag is not None and str(tag) != f"global_step{step}") or not save_latest:
            raise L.ZsError("zeroshard: save_checkpoint with a tag or save_latest=False needs "
                            "zs_checkpoint_save_opts, which this libzeroshard lacks")
        L.check(self.lib.zs_checkpoint_save(self.ctx, os.fspath(save_dir).encode()), f"checkpoint save to '{save_dir}'")
        if self.global_rank == 0:
            with open(os.path.join(save_dir, f"global_step{step}", EXTRA), "wb") as f:
                f.write(data)
        return True

    def _load_plain(self, load_dir, tag, optimizer, scheduler, module_only):
        if not optimizer or not scheduler or module_only:
            raise L.ZsError("zeroshard: load_checkpoint's load flags need zs_checkpoint_load_opts, which this "
                            "libzeroshard lacks")
        path = os.path.join(load_dir, tag) if tag is not None else os.fspath(load_dir)
        if not os.path.exists(path if tag is not None else os.path.join(path, "latest")):
            return None, None
        L.check(self.lib.zs_checkpoint_load(self.ctx, path.encode()), f"checkpoint load from '{path}'")
        self._refresh_all()
        used = tag or f"global_step{self.stats().global_step}"
        cs = os.path.join(load_dir, used, EXTRA)
        extra = self._torch.load(cs, weights_only=False) if os.path.exists(cs) else {}
        self._restore_extra(extra, True, True)
        return os.path.join(load_dir, used), extra.get("client_state", {})

    def _read_extra(self, d, tag):
        n = ctypes.c_size_t(0)
        L.check(self.lib.zs_checkpoint_extra(self.ctx, d.encode(), tag.encode(), EXTRA.encode(), None,
                                             ctypes.byref(n)), f"checkpoint '{d}/{tag}'")
        if not n.value:
            return {}
        buf = ctypes.create_string_buffer(n.value)
        L.check(self.lib.zs_checkpoint_extra(self.ctx, d.encode(), tag.encode(), EXTRA.encode(), buf,
                                             ctypes.byref(n)), f"checkpoint '{d}/{tag}'")
        return self._torch.load(io.BytesIO(buf.raw[:n.value]), weights_only=False)

    def _restore_extra(self, extra, groups, scheduler):
        if groups and extra.get("param_groups"):
            self.optimizer.load_state_dict({"param_groups": extra["param_groups"]})
            self.skipped_steps = extra.get("skipped_steps", 0)
        if scheduler and self._client_scheduler and self.lr_scheduler and extra.get("lr_scheduler"):
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        # the library's groups came from the checkpoint; the param_groups' values are handed again at the next
        # boundary, so the two agree whatever was restored. Without a config schedule the param_groups are the
        # truth, whoever writes them: a client scheduler, or one the framework steps itself (Accelerate does,
        # its scheduler state restored beside), whose lr for the next step is what the param_groups held at the
        # save (the library reports the lr the last step used). A config schedule's lr is the library's own.
        truth = self._client_scheduler or "scheduler" not in self.config
        self._bridge.reset(self.lib, self.ctx, self.optimizer.param_groups, truth)

    # ------------------------------------------------------------------ the full model
    def _refuse_released(self, module, prefix, keep_vars):
        """The model's own state_dict() at stage 3 (a framework's wrapper may call it) would hand out released
        parameters' stand-ins, zeros of the right shape that load without complaint: refused, naming one."""
        if self._gathering:
            return
        for n, p in module.named_parameters():
            u = self._pinfo.get(p)
            if u is not None and u.ptr is None:
                raise RuntimeError(f"zeroshard: the model's state_dict() at stage 3: '{prefix}{n}' is partitioned "
                                   "(released between forwards); engine.state_dict() or engine.module_state_dict() "
                                   "gather the full values (collective: every rank calls it), or take it inside "
                                   "zeroshard.zero.GatheredParameters")

    def _gathered_state_dict(self, owner, prefix, destination=None, keep_vars=False):
        """owner's state_dict with every parameter a copy of its full value, gathered one unit at a time (at
        stage 3 the parameters are empty between forwards; a view would dangle after the unit's release)."""
        torch = self._torch
        self._gathering = True   # the model's own stand-ins are replaced below
        try:
            sd = torch.nn.Module.state_dict(owner, destination=destination, prefix=prefix, keep_vars=keep_vars)
        finally:
            self._gathering = False
        keys = {}
        for n, p in owner.named_parameters(prefix=prefix.rstrip("."), remove_duplicate=False):
            keys.setdefault(id(p), []).append(n)
        for u in self.units:
            self._acquire(u)
            try:
                for p, *_ in u.params:
                    t = p.detach().clone()
                    for k in keys.get(id(p), ()):
                        sd[k] = t
            finally:
                self._release(u)
        return sd

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """nn.Module's (keys "module.<name>"), with full parameter values at every stage. Collective at 3."""
        return self._gathered_state_dict(self, prefix, destination, keep_vars)

    def module_state_dict(self, destination=None, prefix="", keep_vars=False, exclude_frozen_parameters=False):
        """The model's state_dict (its own names), full values; without the frozen parameters when asked.
        Collective at stage 3."""
        sd = self._gathered_state_dict(self.module, prefix, destination, keep_vars)
        if exclude_frozen_parameters:
            for n, p in self.module.named_parameters(prefix=prefix.rstrip("."), remove_duplicate=False):
                if not p.requires_grad:
                    sd.pop(n, None)
        return sd

    def zero_gather_16bit_weights_on_model_save(self):
        """The config's zero_optimization.stage3_gather_16bit_weights_on_model_save (or its alias): whether a
        stage-3 model may be saved as one full state_dict (Accelerate and the Trainer ask before saving)."""
        z = self.config.get("zero_optimization", {})
        for k in ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                  "stage3_gather_fp16_weights_on_model_save"):
            if k in z:
                return bool(z[k])
        return False

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """DeepSpeed's: the model's full state_dict (training dtype, on the CPU) on rank 0, None elsewhere.
        Collective: every rank gathers one unit at a time."""
        sd = self._gathered_state_dict(self.module, "", None, False)
        if exclude_frozen_parameters:
            for n, p in self.module.named_parameters(remove_duplicate=False):
                if not p.requires_grad:
                    sd.pop(n, None)
        return sd if self.global_rank == 0 else None

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Keys as state_dict() gives them ("module.<name>") or as the model's own. Collective: every rank
        passes the same values; rank 0's become the parameters (zs_param_write: fp32 masters and working
        copies), buffers are copied in. At a step boundary."""
        torch = self._torch
        if self._micro_backward:
            raise RuntimeError("zeroshard: load_state_dict between engine.backward() and engine.step()")
        if state_dict and all(k.startswith("module.") for k in state_dict):
            state_dict = {k[len("module."):]: v for k, v in state_dict.items()}
        owner = self.module
        pkeys = {}
        for n, p in owner.named_parameters(remove_duplicate=False):
            pkeys.setdefault(id(p), []).append(n)
        bufs = dict(owner.named_buffers())
        persistent = {n for n in bufs if n.rsplit(".", 1)[-1] not in
                      owner.get_submodule(n.rsplit(".", 1)[0] if "." in n else "")._non_persistent_buffers_set}
        want = {k for ks in pkeys.values() for k in ks} | persistent
        missing = sorted(k for k in want if k not in state_dict)
        unexpected = sorted(k for k in state_dict if k not in want)
        if strict and (missing or unexpected):
            raise RuntimeError(f"zeroshard: load_state_dict: missing keys {missing[:5]}, unexpected keys "
                               f"{unexpected[:5]}")
        if not hasattr(self.lib, "zs_param_write"):
            raise L.ZsError("zeroshard: load_state_dict needs zs_param_write, which this libzeroshard lacks")
        for u in self.units:   # one order on every rank: each write is collective
            for p, *_ in u.params:
                k = next((k for k in pkeys[id(p)] if k in state_dict), None)
                if k is None:
                    continue
                v = state_dict[k].detach().to("cpu", torch.float32).contiguous().reshape(-1)
                if v.numel() != self._poff[p][1]:
                    raise RuntimeError(f"zeroshard: load_state_dict: '{k}' has {v.numel()} elements, the "
                                       f"parameter {self._poff[p][1]}")
                L.check(self.lib.zs_param_write(self.ctx, self._pid[p], L.STATE_PARAM,
                                                ctypes.c_void_p(v.data_ptr()), 0), f"parameter '{k}'")
        with torch.no_grad():
            for n, b in bufs.items():
                if n in state_dict and b is not None:
                    b.copy_(state_dict[n])
        self._refresh_all()
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ export
    def save_16bit_model(self, save_dir, save_filename="model.safetensors", exclude_frozen_parameters=False):
        """DeepSpeed's name: the full parameters in the training dtype, each under its first name (a tied
        one once), as safetensors written by rank 0. Collective: at stage 3 every rank gathers one unit at a
        time, so no rank ever holds more than one gathered unit beyond its shards. A write that fails on rank 0
        (full disk, unwritable directory) is agreed by every rank, which all raise naming the file."""
        torch = self._torch
        if not str(save_filename).endswith(".safetensors"):
            raise NotImplementedError(f"zeroshard: save_16bit_model '{save_filename}': only .safetensors is "
                                      "written (zs-ckpt export converts checkpoints too)")
        if self._micro_backward:
            raise RuntimeError("zeroshard: save_16bit_model between engine.backward() and engine.step()")
        path = os.path.join(save_dir, save_filename)
        f, err = None, None
        if self.global_rank == 0:
            try:
                os.makedirs(save_dir, exist_ok=True)
                f = open(path + ".tmp", "wb")
                f.write(self._safetensors_header())
            except OSError as e:
                f, err = _close(f), e
        for u in self.units:   # every rank takes part in every gather, whatever rank 0's file did
            self._acquire(u)
            try:
                if f:
                    for p, off, n, _ in u.params:
                        f.write(memoryview(u.flat[off:off + n].view(torch.uint8).numpy()))
            except OSError as e:
                f, err = _close(f), e
            finally:
                self._release(u)
        if f:
            try:
                f.flush()
                os.fsync(f.fileno())
                f.close()
                os.replace(path + ".tmp", path)
            except OSError as e:
                err = e
            f = _close(f)
        flag = (ctypes.c_double * 1)(1.0 if err else 0.0)
        L.check(self.lib.zs_allreduce_sum(self.ctx, flag, 1), "save_16bit_model")
        if flag[0]:
            raise OSError(f"zeroshard: save_16bit_model: rank 0 could not write '{path}'" + (f": {err}" if err else ""))
        return True

    def _safetensors_header(self):
        tag = {self._torch.float32: "F32", self._torch.bfloat16: "BF16", self._torch.float16: "F16"}[self.dtype]
        header, pos = {}, 0
        for u in self.units:
            for p, _, n, shape in u.params:
                header[self._names[id(p)]] = {"dtype": tag, "shape": list(shape),
                                              "data_offsets": [pos, pos + n * self._esize]}
                pos += n * self._esize
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)   # the data starts 8-byte aligned
        return len(text).to_bytes(8, "little") + text

    def load_safetensors(self, path):
        """Sets the parameters from a safetensors file (before training), names as in the module."""
        L.check(self.lib.zs_import_safetensors(self.ctx, os.fspath(path).encode()), f"import of '{path}'")
        self._refresh_all()


def _deepspeed_tag(load_dir, tag):
    """The tag when load_dir/<tag> (load_dir/latest's without one) is a DeepSpeed checkpoint, else None."""
    from ._ds_ckpt import is_deepspeed_checkpoint
    d = os.fspath(load_dir)
    if tag is None:
        latest = os.path.join(d, "latest")
        if not os.path.isfile(latest):
            return None
        with open(latest) as f:
            tag = f.read().strip()
    return str(tag) if is_deepspeed_checkpoint(os.path.join(d, str(tag))) else None


def _close(f):
    if f is not None:
        try:
            f.close()
        except OSError:
            pass
    return None
