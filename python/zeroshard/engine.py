"""ZeroShardEngine: a torch.nn.Module trained by libzeroshard, driven the way DeepSpeed's engine is.

How the module maps onto the C API (include/zeroshard.h):
- units: each block of a repeated nn.ModuleList / nn.Sequential (two or more children of one class that
  hold parameters) is one unit; every other parameter goes to one unit, "rest", registered first.
- parameters are views of the unit's buffer in ZeroShard (torch.frombuffer over the pointer zs_unit_fetch
  returns), in the training dtype. Stages 0-2 keep every unit whole, so the views are made once. At stage 3
  forward pre-/post-hooks fetch and release the units a module uses, and a released unit's parameters are
  empty tensors (no storage).
- backward at stage 3: the tensors autograd saves from a parameter's storage (the weight, or a view such as
  weight.t()) are saved as (unit, size, stride, offset) through saved_tensors_hooks and rebuilt from the
  unit, fetched again on first use in backward; without this, autograd would keep the gathered buffer alive
  (or read a freed one).
- gradients: at stages 0-1 each parameter's .grad is its view of the unit's gradient buffer (zs_grad_buffer)
  before backward, so autograd accumulates into it in place. At stages 2-3 (the buffer is a bucket slot,
  placed when the unit is opened) a post-accumulate-grad hook per parameter takes torch's gradient (and drops
  it from .grad), and when the unit's last parameter has its gradient they are added into the buffer.
  Either way zs_grad_ready starts the unit's reduction once its last gradient is in, while backward goes on.
  Units with a parameter that got no gradient are handed over (zeros for it) when loss.backward() returns.
"""
import atexit
import ctypes
import json
import os
import weakref

from . import _lib as L

_TORCH_DTYPES = None
_engines = weakref.WeakSet()


def _torch():
    try:
        import torch
    except ImportError as e:  # the package itself imports without torch (e.g. for the library look-up)
        raise ImportError(f"zeroshard: PyTorch is required for zeroshard.initialize ({e})") from e
    return torch


class _Ref:
    """A saved tensor that lives in a unit's buffer: rebuilt from the unit when backward needs it."""
    __slots__ = ("unit", "size", "stride", "offset")

    def __init__(self, unit, size, stride, offset):
        self.unit, self.size, self.stride, self.offset = unit, size, stride, offset


class _Unit:
    def __init__(self, idx, name):
        self.idx, self.name = idx, name
        self.params = []        # (param, offset, numel, shape)
        self.numel = 0
        self.nreq = 0           # parameters that take a gradient
        self.refs = 0           # forward fetches outstanding (nested modules, tied parameters)
        self.ptr = None         # the fetched buffer's address while fetched (stage 3) / for good (0-2)
        self.flat = None
        self.pending = []       # (parameter, gradient) of this micro-batch, until the unit's last one
        self.ngot = 0
        self.handed = False
        self.gptr = None        # the gradient buffer's address, its view, and the parameters' views of it
        self.gflat = None
        self.gviews = []
        self.bw_held = False    # fetched by backward (a saved tensor needed it)


def _unit_plan(module, nn):
    """[(unit name, [parameter]), ...] in registration order, and the block modules."""
    blocks = []

    def visit(prefix, m):
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            kids = [(n, c) for n, c in m.named_children() if next(c.parameters(), None) is not None]
            if len(kids) >= 2 and len({type(c) for _, c in kids}) == 1:
                blocks.extend((prefix + n, c) for n, c in kids)
                return
        for n, c in m.named_children():
            visit(prefix + n + ".", c)

    visit("", module)
    owner = {}
    for i, (_, b) in enumerate(blocks):
        for p in b.parameters():
            owner.setdefault(id(p), i + 1)
    units = [("rest", [])] + [(n, []) for n, _ in blocks]
    names = {}
    for name, p in module.named_parameters():   # each parameter once (tied ones under their first name)
        names[id(p)] = name
        units[owner.get(id(p), 0)][1].append(p)
    if not units[0][1]:
        units.pop(0)
        blocks_off = 0
    else:
        blocks_off = 1
    return units, names, blocks, blocks_off


def _stage_of(cfg):
    z = cfg.get("zero_optimization", 0)
    if z is True:
        return 1
    if isinstance(z, dict):
        return int(z.get("stage", 0))
    return 0


class ZeroShardEngine:
    def __init__(self, model, config, auto_values=None):
        torch = _torch()
        nn = torch.nn
        self._torch = torch
        self.lib = L.lib()
        if isinstance(config, (str, os.PathLike)):
            with open(config) as f:
                text = f.read()
        elif isinstance(config, dict):
            text = json.dumps(config)
        else:
            raise TypeError("zeroshard.initialize: config must be a path or a dict, got " + type(config).__name__)
        self.config = json.loads(text)
        self.stage = _stage_of(self.config)
        self.module = model
        self.ctx = ctypes.c_void_p()
        L.init_mpi()
        opts = L.InitOpts(config_json=text.encode(), quiet=0)
        if auto_values:
            for k, v in auto_values.items():
                setattr(opts.auto_values, k, v)
        L.check(self.lib.zs_init(ctypes.byref(self.ctx), ctypes.byref(opts)), "zs_init")
        _engines.add(self)
        self.global_rank = self.lib.zs_rank(self.ctx)
        self.world_size = self.lib.zs_world_size(self.ctx)
        self.local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        self.device = torch.device("cpu")
        # zs_init bound this thread to the rank's share of the node's cores; torch's intra-op threads,
        # started later, inherit that binding, so more of them than the share would only contend.
        share = len(os.sched_getaffinity(0))
        if torch.get_num_threads() > share:
            torch.set_num_threads(share)
        self._register(model, nn)
        self._micro_backward = False
        self._direct = self.stage < 2   # autograd accumulates into the gradient buffer itself (_preset_grads)
        self._hooks = []
        if self.stage == 3:
            self._add_forward_hooks(model, nn)
        for u in self.units:
            for p, *_ in u.params:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook))

    # ------------------------------------------------------------------ set-up
    def _register(self, model, nn):
        torch = self._torch
        plan, names, blocks, first_block = _unit_plan(model, nn)
        if not plan:
            raise ValueError("zeroshard.initialize: the model has no parameters")
        self.units, self._pinfo, self._poff = [], {}, {}
        keep = []   # the fp32 initial values must outlive zs_setup, which reads them
        lib, ctx = self.lib, self.ctx
        for name, params in plan:
            uid = ctypes.c_int32()
            L.check(lib.zs_unit_add(ctx, name.encode(), ctypes.byref(uid)), f"unit '{name}'")
            unit = _Unit(uid.value, name)
            for p in params:
                if not p.requires_grad:
                    raise NotImplementedError(f"zeroshard: parameter '{names[id(p)]}' has requires_grad=False; "
                                              "frozen parameters are not supported yet (the optimizer would "
                                              "decay them)")
                init = p.detach().to("cpu", torch.float32).contiguous()
                keep.append(init)
                pid = ctypes.c_int32()
                L.check(lib.zs_param_add(ctx, uid, names[id(p)].encode(), init.numel(),
                                         ctypes.c_void_p(init.data_ptr()), ctypes.byref(pid)),
                        f"parameter '{names[id(p)]}'")
                dims = (ctypes.c_int64 * max(p.dim(), 1))(*(p.shape or (1,)))
                L.check(lib.zs_param_shape(ctx, pid, max(p.dim(), 1), dims), f"shape of '{names[id(p)]}'")
                unit.params.append((p, pid.value, p.numel(), tuple(p.shape)))
                self._pinfo[p] = unit
                unit.nreq += 1
            self.units.append(unit)
        L.check(lib.zs_setup(ctx), "zs_setup")
        for unit in self.units:   # where each parameter sits in its unit's buffer (the library aligns them)
            for i, (p, pid, n, shape) in enumerate(unit.params):
                off = ctypes.c_int64()
                L.check(lib.zs_param_info(ctx, pid, None, None, None, ctypes.byref(off)), "zs_param_info")
                unit.params[i] = (p, off.value, n, shape)
                self._poff[p] = (off.value, n)
                unit.numel = max(unit.numel, off.value + n)
        del keep
        self.dtype = {0: torch.float32, 1: torch.bfloat16, 2: torch.float16}[lib.zs_param_dtype(ctx)]
        self._esize = torch.empty(0, dtype=self.dtype).element_size()
        self._names = names
        self._blocks = [(b, self.units[i + first_block].idx) for i, (_, b) in enumerate(blocks)]
        self._live = {}   # buffer address -> unit, for the units fetched now (stage 3's saved tensors)
        self._empty = torch.empty(0, dtype=self.dtype)
        for u in self.units:   # torch's own copies go; the parameters become views of ZeroShard's buffers
            for p, *_ in u.params:
                p.data = self._empty
        self._refresh_all()

    def _refresh_all(self):
        """(Re)binds every parameter: after set-up and after a checkpoint load."""
        for u in self.units:
            u.ptr = None
            self._acquire(u)
            self._release(u)

    def _view(self, ptr, numel, dtype=None):
        dtype = dtype or self.dtype
        buf = (ctypes.c_char * (numel * self._esize)).from_address(ptr)
        return self._torch.frombuffer(buf, dtype=dtype, count=numel)

    def _acquire(self, u):
        if u.refs == 0:
            ptr = ctypes.c_void_p()
            L.check(self.lib.zs_unit_fetch(self.ctx, u.idx, ctypes.byref(ptr)), f"fetch of unit '{u.name}'")
            if ptr.value != u.ptr:
                u.ptr, u.flat = ptr.value, self._view(ptr.value, u.numel)
                for p, off, n, shape in u.params:
                    p.data = u.flat[off:off + n].view(shape)
            self._live[u.ptr] = u
        u.refs += 1

    def _release(self, u):
        u.refs -= 1
        if u.refs > 0:
            return
        L.check(self.lib.zs_unit_release(self.ctx, u.idx), f"release of unit '{u.name}'")
        if self.stage == 3:   # a released unit holds no storage in torch; the next fetch rebinds
            self._live.pop(u.ptr, None)
            u.ptr, u.flat = None, None
            for p, *_ in u.params:
                p.data = self._empty

    def _add_forward_hooks(self, model, nn):
        """Stage 3: a block fetches its unit (and any unit of a parameter it shares) around its forward;
        outside blocks, each module fetches the units of its own parameters."""
        inside = set()
        for b, _ in self._blocks:
            inside.update(id(m) for m in b.modules())
        targets = [(b, {self._pinfo[p] for p in b.parameters()}) for b, _ in self._blocks]
        for m in model.modules():
            if id(m) in inside:
                continue
            own = {self._pinfo[p] for p in m.parameters(recurse=False) if p in self._pinfo}
            if own:
                targets.append((m, own))
        for m, units in targets:
            units = sorted(units, key=lambda x: x.idx)
            self._hooks.append(m.register_forward_pre_hook(self._pre_hook(units)))
            self._hooks.append(m.register_forward_hook(self._post_hook(units)))

    def _pre_hook(self, units):
        def pre(_m, _args):   # returns None: a value would replace the module's inputs
            for u in units:
                self._acquire(u)
        return pre

    def _post_hook(self, units):
        def post(_m, _args, _out):
            for u in reversed(units):
                self._release(u)
        return post

    # ------------------------------------------------------------------ stage-3 saved tensors
    def _pack(self, t):
        if t.dtype != self.dtype or t.device.type != "cpu":
            return t
        u = self._live.get(t.untyped_storage().data_ptr())
        if u is None:
            return t
        return _Ref(u, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, x):
        if not isinstance(x, _Ref):
            return x
        u = x.unit
        if not u.bw_held:
            self._acquire(u)
            u.bw_held = True
        return u.flat.as_strided(x.size, x.stride, x.offset)

    # ------------------------------------------------------------------ gradients
    def _grad_hook(self, p):
        u = self._pinfo[p]
        if u.handed:
            raise RuntimeError(f"zeroshard: a gradient for unit '{u.name}' arrived after its gradients were handed "
                               "over in this micro-batch: backward ran twice without engine.step() between")
        if not self._direct:
            u.pending.append((p, p.grad))
            p.grad = None
        u.ngot += 1
        if u.ngot == u.nreq:
            self._hand(u)

    def _grad_view(self, u):
        """The unit's gradient buffer as a tensor; the view is kept while the library gives the same address
        (always at stages 0-1, whose buffer is fixed), so a step makes no tensors here."""
        ptr = ctypes.c_void_p()
        L.check(self.lib.zs_grad_buffer(self.ctx, u.idx, ctypes.byref(ptr)), f"gradient buffer of '{u.name}'")
        if u.gptr != ptr.value:
            u.gptr, u.gflat = ptr.value, self._view(ptr.value, u.numel)
            u.gviews = [u.gflat[off:off + n].view(shape) for _, off, n, shape in u.params]
        return u.gflat

    def _preset_grads(self):
        """Stages 0-1: every unit's gradient buffer is its own for good (no bucket), so each parameter's .grad
        is set to its view of it before backward and autograd's AccumulateGrad adds into it in place
        (0 + g is g, so the bits are those of the add after backward); the hook only counts. Stages 2-3 place
        a unit's buffer in the reduction bucket when the unit is opened, and a slot held open from the start
        of backward would pin the bucket, so there the gradient is added when the unit's last one is in."""
        for u in self.units:
            self._grad_view(u)
            for (p, *_), g in zip(u.params, u.gviews):
                p.grad = g

    def _hand(self, u):
        """The unit's gradients go into its buffer only once all of them are here: at stages 2-3 the buffer is
        a slot of the reduction bucket, which the library reuses once its reductions are launched, so a slot
        must not stay open while other units take theirs (a unit whose last gradient comes late, such as a
        tied embedding or a parameter unused in this step, would otherwise be overwritten)."""
        if not self._direct:
            g = self._grad_view(u)
            for p, grad in u.pending:
                off, n = self._poff[p]
                g[off:off + n].add_(grad.reshape(-1))
        L.check(self.lib.zs_grad_ready(self.ctx, u.idx), f"gradients of unit '{u.name}'")
        u.handed, u.pending = True, []
        if u.bw_held:
            u.bw_held = False
            self._release(u)

    # ------------------------------------------------------------------ DeepSpeed's engine API
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if self.stage == 3 and self._torch.is_grad_enabled():
            with self._torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return self.module(*args, **kwargs)
        return self.module(*args, **kwargs)

    def backward(self, loss, retain_graph=False):
        if self._micro_backward:
            raise RuntimeError("zeroshard: engine.backward() called twice in one micro-batch; call engine.step() "
                               "after each engine.backward() (it steps the optimizer at the accumulation boundary)")
        scale = self.loss_scale()
        if self._direct:
            self._preset_grads()
        try:
            (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)
        finally:
            self._micro_backward = True
            if self._direct:   # torch's .grad goes, as with the add after backward: the buffer is the library's
                for u in self.units:
                    for p, *_ in u.params:
                        p.grad = None
        # Units with a parameter that got no gradient this time: handed over now, in one order on every rank
        for u in reversed(self.units):
            if not u.handed:
                self._hand(u)
        for u in self.units:   # a saved tensor unpacked after its unit was handed over fetched it again
            if u.bw_held:
                u.bw_held = False
                self._release(u)
        return loss

    def step(self):
        if not self._micro_backward:
            raise RuntimeError("zeroshard: engine.step() called without engine.backward() in this micro-batch")
        L.check(self.lib.zs_step(self.ctx), "zs_step")
        self._micro_backward = False
        for u in self.units:
            u.handed, u.ngot, u.pending = False, 0, []

    def stats(self):
        s = L.StepStats()
        L.check(self.lib.zs_stats(self.ctx, ctypes.byref(s)), "zs_stats")
        return s

    def loss_scale(self):
        return self.stats().loss_scale if self.dtype == self._torch.float16 else 1.0

    def get_lr(self):
        return [self.stats().lr]

    def get_global_grad_norm(self):
        return self.stats().grad_norm

    @property
    def global_steps(self):
        return self.stats().global_step

    def was_step_applied(self):
        return not self.stats().skipped

    def is_gradient_accumulation_boundary(self):
        s = self.stats()
        return (s.micro_step + 1) % self.gradient_accumulation_steps() == 0

    def gradient_accumulation_steps(self):
        return self.lib.zs_grad_accum_steps(self.ctx)

    def train_micro_batch_size_per_gpu(self):
        return self.lib.zs_micro_batch_size(self.ctx)

    def train_batch_size(self):
        return self.train_micro_batch_size_per_gpu() * self.gradient_accumulation_steps() * self.world_size

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def parameters(self, recurse=True):
        return self.module.parameters(recurse)

    def named_parameters(self, *a, **k):
        return self.module.named_parameters(*a, **k)

    def zero_grad(self, *a, **k):
        """Gradients live in ZeroShard's buffers and are cleared by the step; nothing to do."""

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, exclude_frozen_parameters=False):
        step = self.stats().global_step
        if tag is not None and str(tag) != f"global_step{step}":
            raise NotImplementedError(f"zeroshard: save_checkpoint tag '{tag}': checkpoints are named "
                                      f"global_step<N> (here global_step{step}); pass tag=None")
        if not save_latest:
            raise NotImplementedError("zeroshard: save_checkpoint save_latest=False: 'latest' is always updated")
        if self._micro_backward:
            raise RuntimeError("zeroshard: save_checkpoint between engine.backward() and engine.step()")
        L.check(self.lib.zs_checkpoint_save(self.ctx, os.fspath(save_dir).encode()), f"checkpoint save to '{save_dir}'")
        if client_state and self.global_rank == 0:
            # written after the checkpoint itself is in place (so not atomic with it); read back on load
            self._torch.save(client_state, os.path.join(save_dir, f"global_step{step}", "client_state.pt"))
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        if not load_optimizer_states or not load_lr_scheduler_states or load_module_only:
            raise NotImplementedError("zeroshard: load_checkpoint loads the whole state; load_optimizer_states, "
                                      "load_lr_scheduler_states and load_module_only must keep their defaults")
        path = os.path.join(load_dir, tag) if tag is not None else os.fspath(load_dir)
        if not os.path.exists(path):
            return None, {}
        L.check(self.lib.zs_checkpoint_load(self.ctx, path.encode()), f"checkpoint load from '{path}'")
        self._refresh_all()
        step = self.stats().global_step
        cs = os.path.join(load_dir, tag or f"global_step{step}", "client_state.pt")
        client = self._torch.load(cs, weights_only=False) if os.path.exists(cs) else {}
        return os.path.join(load_dir, tag or f"global_step{step}"), client

    def save_16bit_model(self, save_dir, save_filename="model.safetensors", exclude_frozen_parameters=False):
        """DeepSpeed's name: the full parameters in the training dtype, each under its first name (a tied
        one once), as safetensors written by rank 0. Collective: at stage 3 every rank gathers one unit at a
        time, so no rank ever holds more than one gathered unit beyond its shards."""
        if not str(save_filename).endswith(".safetensors"):
            raise NotImplementedError(f"zeroshard: save_16bit_model '{save_filename}': only .safetensors is "
                                      "written (zs-ckpt export converts checkpoints too)")
        if self._micro_backward:
            raise RuntimeError("zeroshard: save_16bit_model between engine.backward() and engine.step()")
        tag = {self._torch.float32: "F32", self._torch.bfloat16: "BF16", self._torch.float16: "F16"}[self.dtype]
        header, pos = {}, 0
        for u in self.units:
            for p, _, n, shape in u.params:
                header[self._names[id(p)]] = {"dtype": tag, "shape": list(shape),
                                              "data_offsets": [pos, pos + n * self._esize]}
                pos += n * self._esize
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)   # the data starts 8-byte aligned
        path = os.path.join(save_dir, save_filename)
        f = None
        if self.global_rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            f = open(path + ".tmp", "wb")
            f.write(len(text).to_bytes(8, "little") + text)
        try:
            for u in self.units:
                self._acquire(u)
                try:
                    if f:
                        for p, off, n, _ in u.params:
                            f.write(memoryview(u.flat[off:off + n].view(self._torch.uint8).numpy()))
                finally:
                    self._release(u)
            if f:
                f.flush()
                os.fsync(f.fileno())
                f.close()
                f = None
                os.replace(path + ".tmp", path)
        finally:
            if f:
                f.close()
        return True

    def load_safetensors(self, path):
        """Sets the parameters from a safetensors file (before training), names as in the module."""
        L.check(self.lib.zs_import_safetensors(self.ctx, os.fspath(path).encode()), f"import of '{path}'")
        self._refresh_all()

    # ------------------------------------------------------------------ end
    def destroy(self):
        if not self.ctx:
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for u in self.units:
            for p, *_ in u.params:
                p.data = self._empty
        L.check(self.lib.zs_finalize(self.ctx), "zs_finalize")
        self.ctx = ctypes.c_void_p()


@atexit.register
def _finalize_all():
    for e in list(_engines):
        try:
            e.destroy()
        except Exception:   # exiting anyway; MPI may already be gone
            pass
    L.finalize_mpi()
