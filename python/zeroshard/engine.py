"""ZeroShardEngine: a torch.nn.Module trained by libzeroshard, driven the way DeepSpeed's engine is.

How the module maps onto the C API (include/zeroshard.h):
- units (_plan.py): each block of a repeated nn.ModuleList / nn.Sequential (two or more children of one class
  that hold parameters) is one unit; every other parameter goes to one unit, "rest", registered first. A
  block holding frozen and trainable parameters is two units, "<block>" and "<block>.frozen" (zs_param_freeze;
  the library keeps a unit all one or the other), fetched together by the block's hooks.
- parameters are views of the unit's buffer in ZeroShard (torch.frombuffer over the pointer zs_unit_fetch
  returns), in the training dtype. Stages 0-2 keep every unit whole, so the views are made once. At stage 3
  forward pre-/post-hooks fetch and release the units a module uses, and a released unit's parameters are
  zero-stride stand-ins of their shape (no storage of their own): autograd checks a gradient's shape against
  its parameter's, and a first layer on raw features accumulates its weights' gradients with the unit released.
- backward at stage 3: the tensors autograd saves from a parameter's storage (the weight, or a view such as
  weight.t()) are saved as (unit, size, stride, offset) through saved_tensors_hooks and rebuilt from the
  unit, fetched again on first use in backward; without this, autograd would keep the gathered buffer alive
  (or read a freed one). A forward recomputed inside backward (activation checkpointing) takes its units
  until their gradients are handed over.
- gradients: at stages 0-1 each parameter's .grad is its view of the unit's gradient buffer (zs_grad_buffer)
  before backward, so autograd accumulates into it in place. At stages 2-3 (the buffer is a bucket slot,
  placed when the unit is opened) a post-accumulate-grad hook per parameter takes torch's gradient (and drops
  it from .grad), and when the unit's last parameter has its gradient they are added into the buffer.
  Either way zs_grad_ready starts the unit's reduction once its last gradient is in, while backward goes on.
  Units with a parameter that got no gradient are handed over (zeros for it) when loss.backward() returns.
"""
import contextlib
import ctypes
import json
import os
import weakref

from . import _lib as L
from . import optim as O
from ._ckpt import CheckpointMixin
from ._exit import _engines, _finalize, _install_excepthook
from . import _devmem, _elastic, _memory
from ._plan import _Ref, _Unit, _unit_plan, _stage_of, load_config, _device_of

try:
    import torch
except ImportError as e:  # the package imports without torch (e.g. for the library look-up); the engine not
    raise ImportError(f"zeroshard: PyTorch is required for zeroshard.initialize ({e})") from e



def _torch():
    return torch


def _weak(obj, name):
    """A hook calling obj.name through a weak reference, so the model's hooks do not keep a dropped engine
    alive (it is finalised when the script lets go of it)."""
    ref = weakref.ref(obj)

    def call(*args):
        e = ref()
        return getattr(e, name)(*args) if e is not None else None
    return call


class ZeroShardEngine(CheckpointMixin, torch.nn.Module):
    """DeepSpeed's engine over libzeroshard; an nn.Module whose submodule `module` is the model.

    Internal interface for zeroshard.zero and zeroshard.utils: `_pinfo[p]` the _Unit holding parameter p,
    `_pid[p]` its C parameter id, `_punit_offset[p]` (offset, numel) of p in its unit's buffer (elements),
    `_acquire(u)` / `_release(u)` fetch and release a unit (counted), `_refresh_all()` rebinds every
    parameter after the library changed them (a load, a write).
    """

    def __init__(self, model, config, auto_values=None, groups=None, bridge=None):
        super().__init__()
        nn = torch.nn
        self._torch = torch
        self.lib = L.lib()
        self.config = load_config(config) if not isinstance(config, dict) else config
        device, self.config = _device_of(self.config, model)
        text = json.dumps(self.config)
        self.stage = _stage_of(self.config)
        self.module = model
        self.ctx = ctypes.c_void_p()
        L.init_mpi()
        opts = L.init_opts(config_json=text.encode(), quiet=0)
        if auto_values:
            for k, v in auto_values.items():
                setattr(opts.auto_values, k, v)
        L.check(self.lib.zs_init(ctypes.byref(self.ctx), ctypes.byref(opts)), "zs_init")
        _engines.add(self)
        _install_excepthook()
        self.global_rank = self.lib.zs_rank(self.ctx)
        self.world_size = self.lib.zs_world_size(self.ctx)
        self.local_rank = L.world_info()[2]
        self._mem = _devmem.make(torch, self.lib, self.ctx, device)
        self.device = self._mem.device
        # zs_init bound this thread to the rank's share of the node's cores; torch's intra-op threads,
        # started later, inherit that binding, so more of them than the share would only contend.
        share = len(os.sched_getaffinity(0))
        if torch.get_num_threads() > share:
            torch.set_num_threads(share)
        if groups is None:
            groups, bridge = O.default_groups(model, self.config)
        self._bridge = bridge
        trainable = {id(p) for g in groups for p in g["params"]}
        self._hooks = []
        self._fin = None
        self._register(model, nn, trainable, groups)
        self._fin = weakref.finalize(self, _finalize, self.lib, self.ctx, self._hooks,
                                     [p for u in self.units for p, *_ in u.params], self._empty, self._mem)
        self._micro_backward = False
        self._in_backward = False
        self._no_sync = False
        self._direct = self.stage < 2   # autograd accumulates into the gradient buffer itself (_preset_grads)
        self.skipped_steps = 0
        self.lr_scheduler = None
        self._client_scheduler = False
        self._gathering = False
        self._cast_buffers(model)
        if self.stage == 3:
            self._add_forward_hooks(model, nn)
            self._hooks.append(model.register_state_dict_pre_hook(_weak(self, "_refuse_released")))
        for u in self.units:
            for p, *_ in u.params:
                if not u.frozen:
                    self._hooks.append(p.register_post_accumulate_grad_hook(_weak(self, "_grad_hook")))
                elif p.requires_grad:   # left out of the optimizer: its gradient is not kept
                    self._hooks.append(p.register_post_accumulate_grad_hook(_drop_grad))
        bridge.fill(self.lib, self.ctx, groups, self.config)
        self.optimizer = O.make_optimizer_class(torch)(self, groups, bridge.torch_defaults(groups))
        _elastic.trainer_preemption()
        _elastic.batch_rule(self.config, self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps(),
                            self.world_size)

    # ------------------------------------------------------------------ set-up
    def _register(self, model, nn, trainable, groups):
        plan, names, blocks = _unit_plan(model, nn, trainable)
        if not plan:
            raise ValueError("zeroshard.initialize: the model has no parameters")
        self.units, self._pinfo, self._poff, self._pid = [], {}, {}, {}
        self._punit_offset = self._poff
        keep = []   # the fp32 initial values (and init callbacks) must outlive zs_setup, which reads them
        lib, ctx = self.lib, self.ctx
        self._init_errors = []
        for name, params, frozen in plan:
            uid = ctypes.c_int32()
            L.check(lib.zs_unit_add(ctx, name.encode(), ctypes.byref(uid)), f"unit '{name}'")
            unit = _Unit(uid.value, name)
            unit.frozen = frozen
            for p in params:
                pid, shape = self._add_param(unit.idx, p, names[id(p)], keep)
                if frozen:
                    if not hasattr(lib, "zs_param_freeze"):
                        raise L.ZsError(f"zeroshard: parameter '{names[id(p)]}' is frozen, and this libzeroshard "
                                        "lacks zs_param_freeze")
                    L.check(lib.zs_param_freeze(ctx, pid), f"parameter '{names[id(p)]}'")
                else:
                    unit.nreq += 1
                unit.params.append((p, pid, _numel(shape), shape))
                self._pinfo[p] = unit
                self._pid[p] = pid
                if self.stage == 3:   # DeepSpeed's: the full size of a parameter that is empty between forwards
                    p.ds_shape, p.ds_numel = torch.Size(shape), _numel(shape)
            self.units.append(unit)
        self._bridge.register(lib, ctx, groups, lambda p: self._pid[p])
        status = lib.zs_setup(ctx)
        if self._init_errors:
            raise self._init_errors[0]
        L.check(status, "zs_setup")
        self._init_finished(plan)
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
        self._blocks = blocks
        self._live = {}   # buffer address -> unit, for the units fetched now (stage 3's saved tensors)
        self._empty = torch.empty(0, dtype=self.dtype, device=self.device)
        self._stand = torch.zeros(1, dtype=self.dtype, device=self.device)   # a released parameter's stand-in
        for u in self.units:   # torch's own copies go; the parameters become views of ZeroShard's buffers
            for p, *_ in u.params:
                p.data = self._empty
        self._refresh_all()

    def _add_param(self, uid, p, name, keep):
        """Registers p: from zeroshard.zero's fill callback when zero.Init built it straight into shards,
        else from an fp32 copy of its values. Returns (C parameter id, shape)."""
        from . import zero
        source = getattr(zero, "_init_source", None)
        fill = source(p) if source is not None else None
        shape = tuple(getattr(p, "ds_shape", None) or p.shape)
        pid = ctypes.c_int32()
        if fill is not None:
            cb = L.INIT_FN(self._init_callback(fill, name))
            keep.append(cb)
            L.check(self.lib.zs_param_add_init(self.ctx, uid, name.encode(), _numel(shape), cb, None,
                                               ctypes.byref(pid)), f"parameter '{name}'")
        else:
            init = p.detach().to("cpu", torch.float32).contiguous()
            keep.append(init)
            L.check(self.lib.zs_param_add(self.ctx, uid, name.encode(), init.numel(),
                                          ctypes.c_void_p(init.data_ptr()), ctypes.byref(pid)), f"parameter '{name}'")
        dims = (ctypes.c_int64 * max(len(shape), 1))(*(shape or (1,)))
        L.check(self.lib.zs_param_shape(self.ctx, pid, max(len(shape), 1), dims), f"shape of '{name}'")
        return pid.value, shape

    def _init_finished(self, plan):
        """zeroshard.zero's hook: the library holds the values now, so what zero.Init kept for them can go."""
        from . import zero
        done = getattr(zero, "_init_done", None)
        if done is not None:
            for _, params, _ in plan:
                for p in params:
                    done(p)

    def _init_callback(self, fill, name):
        """An exception cannot cross the C call: it is kept and raised once zs_setup returns."""
        def call(_arg, _param, first, count, dst):
            try:
                fill(first, count, dst)
            except BaseException as e:   # noqa: BLE001 (re-raised after zs_setup)
                self._init_errors.append(RuntimeError(f"zeroshard: initialising parameter '{name}': {e!r}"))
        return call

    def _cast_buffers(self, model):
        """As DeepSpeed moves and casts the whole module: every buffer goes to the engine's device, and the
        floating-point ones take the training dtype too, so a buffer meets bf16/fp16 activations in its own
        dtype (integer and bool buffers keep theirs)."""
        for m in model.modules():
            for k, b in m._buffers.items():
                if b is None:
                    continue
                dtype = self.dtype if b.is_floating_point() else b.dtype
                if b.dtype != dtype or b.device != self.device:
                    m._buffers[k] = b.to(self.device, dtype)

    def _refresh_all(self):
        """(Re)binds every parameter: after set-up and after a checkpoint load."""
        for u in self.units:
            u.ptr = None
            self._acquire(u)
            self._release(u)

    def _view(self, ptr, numel, dtype=None):
        return self._mem.view(ptr, numel, dtype or self.dtype, self._esize)

    def _acquire(self, u):
        if u.refs == 0:
            ptr = ctypes.c_void_p()
            self._mem.enter()
            L.check(self.lib.zs_unit_fetch(self.ctx, u.idx, ctypes.byref(ptr)), f"fetch of unit '{u.name}'")
            self._mem.ready(f"fetch of unit '{u.name}'")
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
        self._mem.enter()
        L.check(self.lib.zs_unit_release(self.ctx, u.idx), f"release of unit '{u.name}'")
        if self.stage == 3:   # a released unit holds no storage in torch; the next fetch rebinds
            self._live.pop(u.ptr, None)
            u.ptr, u.flat = None, None
            for p, _, _, shape in u.params:
                p.data = self._stand.expand(shape)

    def _add_forward_hooks(self, model, nn):
        """Stage 3: a block fetches its units (trainable and frozen, and any unit of a parameter it shares)
        around its forward; outside blocks, each module fetches the units of its own parameters."""
        inside = set()
        for b in self._blocks:
            inside.update(id(m) for m in b.modules())
        targets = [(b, {self._pinfo[p] for p in b.parameters()}) for b in self._blocks]
        for m in model.modules():
            if id(m) in inside:
                continue
            own = {self._pinfo[p] for p in m.parameters(recurse=False) if p in self._pinfo}
            if own:
                targets.append((m, own))
        ref = weakref.ref(self)
        for m, units in targets:
            units = sorted(units, key=lambda x: x.idx)
            self._hooks.append(m.register_forward_pre_hook(_pre_hook(ref, units)))
            self._hooks.append(m.register_forward_hook(_post_hook(ref, units)))
        # A forward recomputed in backward may call a block's forward() directly, without its hooks
        # (Hugging Face's gradient checkpointing does): the modules inside blocks fetch their own units then.
        for b in self._blocks:
            for m in b.modules():
                own = {self._pinfo[p] for p in m.parameters(recurse=False) if p in self._pinfo}
                if own:
                    units = sorted(own, key=lambda x: x.idx)
                    self._hooks.append(m.register_forward_pre_hook(_backward_pre_hook(ref, units)))

    def _fetch_for_forward(self, units):
        """A forward run again inside backward (activation checkpointing) takes each unit once for the rest
        of backward, released when its gradients are handed over: the recomputed activations point into the
        gathered buffers, and torch may stop a recomputation early (by raising inside it), so the release
        cannot wait for the module's post-hook."""
        for u in units:
            if not self._in_backward:
                self._acquire(u)
            elif not u.bw_held:
                self._acquire(u)
                u.bw_held = True

    def _release_after_forward(self, units):
        if self._in_backward:
            return
        for u in reversed(units):
            self._release(u)

    # ------------------------------------------------------------------ stage-3 saved tensors
    def _pack(self, t):
        if t.dtype != self.dtype or t.device.type != self.device.type:
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
        self._mem.enter()
        L.check(self.lib.zs_grad_buffer(self.ctx, u.idx, ctypes.byref(ptr)), f"gradient buffer of '{u.name}'")
        self._mem.ready(f"gradient buffer of '{u.name}'")
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
            if u.frozen:
                continue
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
        self._mem.enter()
        L.check(self.lib.zs_grad_ready(self.ctx, u.idx), f"gradients of unit '{u.name}'")
        self._mem.ready(f"gradients of unit '{u.name}'")
        u.handed, u.pending = True, []
        if u.bw_held:
            u.bw_held = False
            self._release(u)

    # ------------------------------------------------------------------ DeepSpeed's engine API
    def forward(self, *args, **kwargs):
        """The module's forward. Stage 3: if it raises, the units it fetched are released (the hooks after
        the failing module never ran), so the next forward starts clean."""
        if self.stage != 3:
            return self.module(*args, **kwargs)
        refs = [u.refs for u in self.units]
        try:
            if torch.is_grad_enabled():
                with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                    return self.module(*args, **kwargs)
            return self.module(*args, **kwargs)
        except BaseException:
            for u, before in zip(self.units, refs):
                while u.refs > before:
                    self._release(u)
            raise

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """DeepSpeed's: with scale_wrt_gas the loss is divided by gradient_accumulation_steps (ZeroShard
        averages the micro-batches' gradients, which is that); with scale_wrt_gas=False the caller divided it
        already (Hugging Face Trainer), so the gradient is the sum of the micro-batches' and is multiplied back
        by the steps here. fp16: the loss is scaled in fp32 (.float() first), as DeepSpeed does."""
        self._close_pending()
        if self._micro_backward:
            raise RuntimeError("zeroshard: engine.backward() called again at an accumulation boundary without "
                               "engine.step(); call engine.step() after the boundary micro-batch's backward")
        factor = self.loss_scale() * (1 if scale_wrt_gas else self.gradient_accumulation_steps())
        if self._direct:
            self._preset_grads()
        scaled = loss.float() if loss.dtype in (torch.float16, torch.bfloat16) else loss
        if factor != 1.0:
            scaled = scaled * factor
        self._in_backward = True
        try:
            scaled.backward(retain_graph=retain_graph)
        finally:
            self._in_backward = False
            self._micro_backward = True
            if self._direct:   # torch's .grad goes, as with the add after backward: the buffer is the library's
                for u in self.units:
                    for p, *_ in u.params:
                        if not u.frozen:
                            p.grad = None
        # Units with a parameter that got no gradient this time: handed over now, in one order on every rank
        for u in reversed(self.units):
            if not u.handed and not u.frozen:
                self._hand(u)
        for u in self.units:   # a saved tensor unpacked after its unit was handed over fetched it again
            if u.bw_held:
                u.bw_held = False
                self._release(u)
        return loss

    def _close_pending(self):
        """A micro-batch whose backward ran and that is not a boundary is closed here when the script goes on
        without engine.step(): DeepSpeed's engine accumulates over backward calls and only the boundary needs
        step(), which is how Accelerate drives it (step() only when it syncs gradients)."""
        if self._micro_backward and not self.is_gradient_accumulation_boundary():
            self._finish_micro()

    def _finish_micro(self):
        self._mem.enter()
        L.check(self.lib.zs_step(self.ctx), "zs_step")
        self._mem.ready("zs_step")
        self._micro_backward = False
        for u in self.units:
            u.handed, u.ngot, u.pending = False, 0, []

    def step(self, lr_kwargs=None):
        """zs_step; at a boundary the param_groups' changed values go to the library first, and after an
        applied step the client scheduler steps (not after one skipped for fp16 overflow), as DeepSpeed."""
        if not self._micro_backward:
            raise RuntimeError("zeroshard: engine.step() called without engine.backward() in this micro-batch")
        boundary = self.is_gradient_accumulation_boundary()
        if boundary and self._no_sync:
            raise RuntimeError("zeroshard: engine.step() at an accumulation boundary inside engine.no_sync(): "
                               "the boundary reduces the gradients; leave no_sync before it")
        if boundary:
            self._bridge.hand(self.lib, self.ctx, self.optimizer.param_groups)
        self._finish_micro()
        s = self.stats()
        if not s.stepped:
            return
        self.optimizer.overflow = bool(s.skipped)
        if s.skipped:
            self.skipped_steps += 1
            return
        _elastic.step_done(s.global_step)
        if not self._client_scheduler:
            self._bridge.sync_scheduled(self.lib, self.ctx, self.optimizer.param_groups)
        elif self.lr_scheduler is not None:
            self.lr_scheduler.optimizer._opt_called = True   # torch warns of a scheduler stepped first otherwise
            self.lr_scheduler.step(**(lr_kwargs or {}))

    def set_gradient_accumulation_boundary(self, is_boundary):
        """Accelerate and the Trainer drive the boundary themselves, before each micro-batch's backward.
        True before the window has run gradient_accumulation_steps micro-batches (an epoch's last batch) ends
        the window at the coming micro-batch (zs_window_end): its backward and step() are a boundary, the
        gradients still divided by gradient_accumulation_steps, as DeepSpeed's. False where the count says the
        window is full is refused (set the config's gradient_accumulation_steps to the caller's). Unlike
        DeepSpeed's flag, the early end lasts until that boundary's step, not until the next call; the callers
        set it before every micro-batch, so the two agree for them. A finished micro-batch that is not a
        boundary is closed first (Accelerate calls step() only at the boundary)."""
        self._close_pending()
        want = self.is_gradient_accumulation_boundary()
        if bool(is_boundary) == want:
            return
        end = getattr(self.lib, "zs_window_end", None)
        if is_boundary and end is not None:   # a backward already run without step() was closed above
            L.check(end(self.ctx), "zs_window_end")
            return
        s = self.stats()
        raise RuntimeError(f"zeroshard: set_gradient_accumulation_boundary({bool(is_boundary)}) at micro-batch "
                           f"{s.micro_step + 1}: with gradient_accumulation_steps "
                           f"{self.gradient_accumulation_steps()} this micro-batch is "
                           f"{'' if want else 'not '}a boundary; the config's gradient_accumulation_steps must "
                           "match the caller's accumulation"
                           + ("" if not is_boundary or end is not None else
                              " (this libzeroshard has no zs_window_end to end a window early: rebuild it)"))

    @contextlib.contextmanager
    def no_sync(self):
        """DeepSpeed's: allowed at stages 0-1, where ZeroShard reduces only at the boundary anyway (so it
        changes nothing); refused at 2-3, whose gradients are partitioned as they come."""
        if self.stage >= 2:
            raise AssertionError(f"zeroshard: no_sync context manager is incompatible with gradient partitioning "
                                 f"logic of ZeRO stage {self.stage}")
        if self._no_sync:
            raise AssertionError("zeroshard: no_sync context manager reentry is unsupported")
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = False

    def memory(self):
        """What this rank holds, in bytes, by category: {"rank", "now": {...}, "peak": {...}} (and "device" on a
        GPU). Each moment: rss = engine_total (by category in "engine") + torch (the C heap beyond the engine's:
        torch's tensors, activations and autograd's gradients among them; Python; MPI) + peers_shared (the peers'
        shared buffers this rank reads in place) + mapped_files (code) + other; peak_rss is the high-water mark.
        "peak" is the moment of the highest RSS the engine sampled (at every engine call). zeroshard/_memory.py."""
        return _memory.engine_memory(self)

    def stats(self):
        s = L.StepStats()
        L.check(self.lib.zs_stats(self.ctx, ctypes.byref(s)), "zs_stats")
        return s

    def loss_scale(self):
        return self.stats().loss_scale if self.dtype == torch.float16 else 1.0

    def get_lr(self):
        """Each param_group's learning rate as the last optimizer step used it (before the first: the
        group's starting rate)."""
        lrs = self._bridge.lrs(self.lib, self.ctx)
        return lrs if lrs is not None else [self.stats().lr]

    def next_lrs(self):
        """Each param_group's learning rate for the next optimizer step (zs_group_next_lr)."""
        return self._bridge.lrs(self.lib, self.ctx, upcoming=True)

    def get_global_grad_norm(self):
        return self.stats().grad_norm

    @property
    def global_steps(self):
        return self.stats().global_step

    @property
    def global_samples(self):
        return self.global_steps * self.train_batch_size()

    def was_step_applied(self):
        return not self.stats().skipped

    def is_gradient_accumulation_boundary(self):
        """DeepSpeed's rule: the early end if set_gradient_accumulation_boundary(True) made one, else the count
        (this window's micro-batches, which restarts at each boundary, also after a short window)."""
        s = self.stats()
        if getattr(self.lib, "zs_window_end", None) is None:   # an older library: no early end, no window count
            return (s.micro_step + 1) % self.gradient_accumulation_steps() == 0
        return bool(s.window_end) or s.window_step + 1 >= self.gradient_accumulation_steps()

    def gradient_accumulation_steps(self):
        return self.lib.zs_grad_accum_steps(self.ctx)

    def train_micro_batch_size_per_gpu(self):
        return self.lib.zs_micro_batch_size(self.ctx)

    def train_batch_size(self):
        return self.train_micro_batch_size_per_gpu() * self.gradient_accumulation_steps() * self.world_size

    def zero_optimization_stage(self):
        return self.stage

    def to(self, *args, **kwargs):
        """The parameters are views of ZeroShard's buffers on zeroshard.device, in the config's training dtype:
        a move to where they are is nothing to do, another is refused naming the key."""
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and not self._same_device(torch.device(device)):
            raise RuntimeError(f"zeroshard: engine.to({device}): the parameters are ZeroShard's buffers on "
                               f"{self.device} (zeroshard.device \"{self._mem.kind.split()[0]}\", set before "
                               "initialize); there is nothing to move")
        if dtype is not None and dtype != self.dtype:
            raise RuntimeError(f"zeroshard: engine.to({dtype}): the training dtype is the config's ({self.dtype}: "
                               "fp16 / bf16 sections)")
        return self

    def _same_device(self, d):
        if self._mem.kind == "cuda (emulated)":   # torch CPU tensors stand for the emulated GPU's
            return d.type in ("cpu", "cuda")
        return d.type == self.device.type and (d.index is None or d.index == self.device.index)

    def cuda(self, device=None):
        return self.to("cuda" if device is None else torch.device("cuda", device) if isinstance(device, int)
                       else device)

    def compile(self, *args, **kwargs):
        """DeepSpeed's engine.compile (Accelerate calls it with torch.compile settings): not implemented; the
        stage-3 hooks and saved-tensor packing are not traced by torch.compile."""
        raise NotImplementedError("zeroshard: engine.compile (DeepSpeedEngine.compile, torch.compile of the engine) "
                                  "is not implemented; leave torch.compile / dynamo off")

    def zero_grad(self, *a, **k):
        """Gradients live in ZeroShard's buffers and are cleared by the step; nothing to do."""

    # ------------------------------------------------------------------ end
    def destroy(self):
        """Collective (zs_finalize): every rank destroys its engine, or drops it (the same finaliser runs
        when the engine is garbage collected, so every rank must let go of it at the same point)."""
        if self._fin is not None:
            self._fin()


def _pre_hook(ref, units):
    def pre(_m, _args):   # returns None: a value would replace the module's inputs
        e = ref()
        if e is not None:
            e._fetch_for_forward(units)
    return pre


def _backward_pre_hook(ref, units):
    def pre(_m, _args):
        e = ref()
        if e is not None and e._in_backward:
            e._fetch_for_forward(units)
    return pre


def _post_hook(ref, units):
    def post(_m, _args, _out):
        e = ref()
        if e is not None:
            e._release_after_forward(units)
    return post


def _drop_grad(p):
    p.grad = None


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n
