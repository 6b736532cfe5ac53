"""OffloadedModule: an nn.Module whose parameters, gradients and Adam state live in zinf's tiers.

How it works (the contract; zinf/torch/__init__.py has the user's view):
- Units (_wrap.py) and shards (_shards.py): each wrap unit's parameters (and the root's) are
  flattened into a trainable and a frozen shard, each a few zinf tensors. A frozen parameter
  (requires_grad=False) has its working copy only: no gradient, moments or optimizer step.
- Guard (_guard.py): each parameter keeps its identity but becomes a ZinfParameter over a
  placeholder; any use of its value outside a lease raises, naming it.
- Forward: a unit's forward pre-hook holds the shards of every parameter it leases (its own,
  and a tied weight's shard) and points param.data at views of them; the post-hook releases
  them. The root's shards are held for the whole forward.
- Saved tensors: autograd's saved references into a held shard are stored as (shard, offset,
  shape, stride) (saved_tensors_hooks around the forward) and the shard is held again when
  backward unpacks them. That backward hold ends when every trainable parameter of the shard
  has its gradient (their AccumulateGrad hooks), when backward leaves the unit (a hook on the
  unit's inputs: frozen shards), or at the end of backward (a final callback).
- A unit forward that runs while the wrapper's forward does not, with grad enabled (a
  reentrant torch.utils.checkpoint recomputation, or the module called directly) pushes the
  same hooks for itself. Inside a non-reentrant checkpoint's recomputation, whose own hooks
  keep what it saves (pointing into the copies), the shards are held for backward instead and
  pinned: never handed back early (ShardStore).
- Gradients: the AccumulateGrad hook adds each gradient into its shard's fp32 gradient in the
  tiers (pinned memory or NVMe) and leaves a GradPlaceholder in .grad; micro-batches accumulate
  there until the optimizer step (_step.py).
- In-place changes to a held fp32 parameter are written home (dirty release); with 16-bit
  weights they are refused (the fp32 master would not see them).
- The optimizer side is _step.Stepper's; state in and out (state_dict, checkpoints) is
  _state.StateMixin's; construction helpers are _setup's.

Thread-safety: one thread drives a model (PyTorch's own rule for a module). With device="cuda",
autograd's device thread runs the backward hooks while the caller waits in backward.
"""

import os
import sys

import torch
from torch._C import DisableTorchFunction

from zinf import _lib
from zinf.torch import _config, _guard, _setup, _step, _wrap
from zinf.torch._optim import DeepSpeedLR, OffloadOptimizer
from zinf.torch._shards import ShardStore, storage_ptr, view_of
from zinf.torch._state import StateMixin

_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


_CHECKPOINT_PY = os.path.join("torch", "utils", "checkpoint.py")


def _in_checkpoint_unpack():
    """Whether this forward runs inside torch.utils.checkpoint's unpack hook: the non-reentrant
    recomputation (torch 1.13's and 2's), whose own hooks store what it saves. The reentrant
    one runs from CheckpointFunction.backward instead."""
    f = sys._getframe(2)
    for _ in range(64):
        if f is None:
            return False
        code = f.f_code
        if "unpack" in code.co_name and code.co_filename.endswith(_CHECKPOINT_PY):
            return True
        f = f.f_back
    return False


def _check_device(module, device):
    """The device zinf's device tier is on ("host" or "cuda") and torch's name for it, checked
    against where the module's parameters are."""
    on = {p.device.type for p in module.parameters()}
    if device == "auto":
        device = "cuda" if on == {"cuda"} else "host"
    if device not in ("host", "cuda"):
        raise ValueError(f"zinf.torch.offload: device {device!r}; expected 'auto', 'host' "
                         "or 'cuda'")
    want = "cuda" if device == "cuda" else "cpu"
    if on - {want}:
        raise ValueError(f"zinf.torch.offload: the module's parameters are on "
                         f"{sorted(on)}; device={device!r} needs them on {want} (move the "
                         f"module with .to('{want}') first)")
    if any(isinstance(p, _guard.ZinfParameter) for p in module.parameters()):
        raise ValueError("zinf.torch.offload: the module is already offloaded")
    if device == "cuda":
        where = {p.device for p in module.parameters()}
        here = torch.device("cuda", torch.cuda.current_device())
        if where - {here}:
            raise ValueError(f"zinf.torch.offload: the module's parameters are on "
                             f"{sorted(map(str, where))}; zinf's device tier is on the current "
                             f"device {here} (torch.cuda.set_device first)")
    return device


def _homes(cfg, param_home, state_home, grad_home):
    homes = {}
    for what, given, cfg_home in (("param_home", param_home, cfg.param_home),
                                  ("state_home", state_home, cfg.state_home)):
        if given is not None and cfg_home is not None and given != cfg_home:
            raise ValueError(f"zinf.torch.offload: {what}={given!r} but the config's "
                             f"offload device says {cfg_home!r}; give one")
        homes[what] = given or cfg_home or "nvme"
    for what, h in list(homes.items()) + [("grad_home", grad_home)]:
        if h not in ("nvme", "host"):
            raise ValueError(f"zinf.torch.offload: {what} {h!r}; expected 'nvme' or 'host'")
    return homes


class OffloadedModule(StateMixin, torch.nn.Module):
    """The wrapped module: call it as the original. See zinf.torch.offload for the arguments."""

    def __init__(self, module, config=None, *, auto_wrap_policy=None, param_groups=None,
                 optimizer=None, lr=None, betas=None, eps=None, weight_decay=None,
                 adamw_mode=None, bias_correction=None, param_home=None, state_home=None,
                 grad_home="host", device="auto", leases="auto", adam_threads=None):
        super().__init__()
        doc = _config.load(config)
        source = config if isinstance(config, str) else "config"
        self.module = module
        device = _check_device(module, device)
        self._device = device
        cfg = _config.TorchConfig(doc, source)
        self._cfg = cfg
        self._precision = _setup.pick_precision(module, cfg)
        self._wdtype = _PRECISIONS[self._precision]
        homes = _homes(cfg, param_home, state_home, grad_home)
        if adam_threads is not None and cfg.adam_threads is not None:
            raise ValueError("zinf.torch.offload: adam_threads given and zinf.adam_threads in the "
                             "config; give one")
        self._adam_threads = adam_threads if adam_threads is not None else (cfg.adam_threads or 0)

        # Parameters, units, shards.
        self._params, self._names, by_id = _setup.records(self, module)
        self._order = list(self._params.values())
        units = _wrap.find_units(module, auto_wrap_policy)
        self._unit_names = [n for n, _ in units] + ["<root>"]
        shards, self._unit_shards, peak = _setup.layout(
            module, units, self._unit_names, _wrap.lease_sets(module, units), by_id)
        self._root = len(self._unit_names) - 1
        self._frozen_shards = [[s for s in ss if not s.trainable and s.unit == i]
                               for i, ss in enumerate(self._unit_shards)]
        # One more than a forward holds: backward unpacks a unit's shard while the shard of the
        # node before may still be in use (ShardStore.make_room hands back any other).
        if leases == "auto":
            leases = peak + 1
        elif leases < peak + 1:
            raise ValueError(f"zinf.torch.offload: leases={leases}, but a unit's forward holds "
                             f"{peak} shard(s) at once and backward one more; expected at least "
                             f"{peak + 1} (or 'auto')")
        self._leases = leases

        groups, defaults, self._adamw = _setup.build_groups(module, cfg, param_groups, optimizer,
                                                            dict(lr=lr, betas=betas, eps=eps,
                                                                 weight_decay=weight_decay,
                                                                 bias_correction=bias_correction),
                                                            adamw_mode)
        # Everything that can refuse runs before the module is touched: the optimizer's groups,
        # the schedule, the engine's memory plan. (optimizer=: its own group dicts are shared,
        # so a scheduler attached to it drives this one, and its state is taken below.)
        self._param_ids = {id(r.p) for r in self._order}
        self.optimizer = OffloadOptimizer(self, groups, defaults)
        self.optimizer._sealed = True
        index = {id(p): gi for gi, g in enumerate(self.optimizer.param_groups)
                 for p in g["params"]}
        for rec in self._order:
            rec.group = index.get(id(rec.p))
        schedule = (_config.lr_schedule(cfg.scheduler, None) if cfg.scheduler is not None
                    else None)
        taken_state = optimizer.state_dict() if optimizer is not None and optimizer.state else None
        self._store = ShardStore(doc, device, self._wdtype, shards, homes, grad_home, leases)
        with DisableTorchFunction():
            for s in shards:
                flat = torch.cat([r.p.detach().to("cpu", torch.float32).reshape(-1)
                                  for r in s.params])
                self._store.write_value(s, flat)
                if s.trainable:
                    zeros = torch.zeros(s.numel)
                    self._store.write_state(s, "exp_avg", zeros)
                    self._store.write_state(s, "exp_avg_sq", zeros)

        # From here on the module is changed.
        self._install(module, units, cfg, device)
        if schedule is not None:
            start = (cfg.scheduler.get("params") or {}).get("last_batch_iteration", -1)
            self._stepper.lr_scheduler = DeepSpeedLR(self.optimizer, schedule, start)
        if taken_state is not None:
            self.optimizer.load_state_dict(taken_state)

    def _install(self, module, units, cfg, device):
        """Turns the module's parameters into placeholders with their hooks, and its units'
        forwards into leases (what offload() does once everything was checked)."""
        # Buffers follow the working dtype, as DeepSpeed's module.half()/bfloat16() does.
        if self._wdtype != torch.float32:
            for b in module.buffers():
                if b.is_floating_point():
                    b.data = b.data.to(self._wdtype)
        self._torch_device = (torch.device("cuda", torch.cuda.current_device())
                              if device == "cuda" else torch.device("cpu"))
        self._fwd_depth = 0
        self._unit_modes = [[] for _ in self._unit_names]
        self._unit_ctx = []  # saved-tensor hooks pushed for units run outside the wrapper
        self._gathering = self._loading = False
        self._cache = {}
        self._stepper = _step.Stepper(self._store, cfg, self._precision, self._adamw,
                                      self._adam_threads)
        self._stepper.optimizer = self.optimizer
        with DisableTorchFunction():
            for rec in self._order:
                rec.p.__class__ = _guard.ZinfParameter
                rec.p._zinf = rec
                rec.p.data = _guard.placeholder(rec.shape, self._wdtype, self._torch_device)
                if rec.trainable:
                    acc = rec.p.expand_as(rec.p).grad_fn.next_functions[0][0]
                    acc.register_hook(self._grad_hook(rec))
                    rec.acc = acc  # keeps the node (and its hook) alive
                    rec.p.register_hook(self._grad_pre_hook(rec))
        self._handles = []
        for i, (name, m) in enumerate(units):
            self._handles.append(m.register_forward_pre_hook(self._pre_forward(i)))
            self._handles.append(m.register_forward_hook(self._post_forward(i)))
        # The caller's own reference to the module reads and writes the tiers too.
        object.__setattr__(module, "state_dict", self.state_dict)
        object.__setattr__(module, "load_state_dict", self.load_state_dict)

    # -- the guard's questions --------------------------------------------------------------
    def intercept(self, rec, func, args, kwargs):
        """Called by ZinfParameter for a use of `rec`'s parameter that may read its value:
        NotImplemented lets it run, anything else is its result."""
        if func == _guard._DATA_SET:
            _guard.refuse(rec, func, "to replace its data (zinf holds its value: use "
                          "model.load_state_dict)")
        if func == _guard._GRAD_SET:
            if args[1] is None:
                self._drop_grad(rec)
                with DisableTorchFunction():
                    rec.p.grad = None
                return None
            _guard.refuse(rec, func, "to assign a gradient (zinf accumulates gradients in its "
                          "tiers from backward)")
        if func is _guard._RG_ or func == _guard._RG_SET:
            want = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
            if bool(want) != rec.trainable:
                _guard.refuse(rec, func, "to change requires_grad after offload() (freeze or "
                              "unfreeze parameters before wrapping: a frozen parameter has no "
                              "gradient or optimizer state in the tiers)")
            return NotImplemented
        if func == _guard._DATA_GET and rec.shard.holds > 0:
            if self._wdtype != torch.float32:
                _guard.refuse(rec, func, f"during its lease with {self._precision} weights (an "
                              "in-place change through the alias .data returns would not reach "
                              "the fp32 master in the tiers; use the parameter itself)")
            rec.shard.data_read = True  # the release writes the copy home: it may have changed
            return NotImplemented
        if self._gathering and func is _guard._DETACH:
            return self._value(rec)
        if self._loading and func is _guard._COPY_ and args and args[0] is rec.p:
            src = args[1]
            with DisableTorchFunction():
                if tuple(src.shape) != rec.shape:
                    raise ValueError(f"zinf: load_state_dict: {rec.name}: shape "
                                     f"{tuple(src.shape)}; expected {rec.shape}")
                flat = self._staged(rec.shard)
                rec.region(flat).copy_(src.detach().to("cpu"))
            return rec.p
        if rec.shard.holds > 0:
            return NotImplemented
        _guard.refuse(rec, func, "outside a lease")

    # -- forward ----------------------------------------------------------------------------
    def _mark_inputs(self, unit, inputs):
        """For a unit with frozen shards: a hook on each input that requires grad, run once the
        gradient with respect to it is complete, i.e. once backward has left the unit."""
        if not self._frozen_shards[unit] or not torch.is_grad_enabled():
            return
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(lambda grad, u=unit: self._unit_backward_done(u))

    def _unit_backward_done(self, unit):
        for s in self._frozen_shards[unit]:
            self._store.bwd_release(s)

    def _pre_forward(self, unit):
        shards = self._unit_shards[unit]

        def hook(module, inputs):
            # A unit forward outside the wrapper's, with grad enabled: a checkpoint's
            # recomputation in backward, or the module called directly.
            mode = "plain"
            if self._fwd_depth == 0 and torch.is_grad_enabled():
                mode = "pinned" if _in_checkpoint_unpack() else "packed"
            self._unit_modes[unit].append(mode)
            if mode == "pinned":
                # torch.utils.checkpoint (non-reentrant) stores what its recomputation saves,
                # pointing into the copies: held, never handed back early, until backward is
                # done with them.
                self._store.bwd_hold(shards, pin=True)
            else:
                self._store.hold(shards)
                if mode == "packed":  # saved as references, leased again in backward
                    ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
                    ctx.__enter__()
                    self._unit_ctx.append(ctx)
            self._mark_inputs(unit, inputs)
        return hook

    def _post_forward(self, unit):
        shards = self._unit_shards[unit]

        def hook(module, inputs, output):
            mode = self._unit_modes[unit].pop() if self._unit_modes[unit] else "pinned"
            if mode == "packed" and self._unit_ctx:
                self._unit_ctx.pop().__exit__(None, None, None)
            if mode != "pinned":
                for s in shards:
                    self._store.unhold(s)
        return hook

    def _pack(self, t):
        s = self._store.by_ptr.get(storage_ptr(t))
        if s is None:
            return t
        with DisableTorchFunction():
            return (s, t.storage_offset(), tuple(t.shape), t.stride())

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        s, offset, shape, stride = packed
        store = self._store
        store.bwd_hold([s])
        store.touched(s)
        with DisableTorchFunction():
            return s.view.as_strided(shape, stride, offset)

    def _unwind_units(self):
        """What unit forwards that raised outside the wrapper left behind: their saved-tensor
        hooks (popped) and their forward holds (released); a recomputation's pinned holds are
        backward's and stay."""
        while self._unit_ctx:
            self._unit_ctx.pop().__exit__(None, None, None)
        for unit, modes in enumerate(self._unit_modes):
            for mode in modes:
                if mode != "pinned":
                    for s in self._unit_shards[unit]:
                        self._store.unhold(s)
        self._unit_modes = [[] for _ in self._unit_names]

    def forward(self, *args, **kwargs):
        if self._fwd_depth == 0:
            self._unwind_units()
            self._store.clear_stale()
        self._fwd_depth += 1
        ok = False
        root = self._unit_shards[self._root]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                self._store.hold(root)
                try:
                    self._mark_inputs(self._root, args)
                    out = self.module(*args, **kwargs)
                finally:
                    for s in root:
                        self._store.unhold(s)
            ok = True
            return out
        finally:
            self._fwd_depth -= 1
            if not ok and self._fwd_depth == 0:  # an exception: hand the forward's leases back
                for s in self._store.shards:
                    while s.holds > (1 if s.bwd_held else 0):
                        self._store.unhold(s)
                self._unit_modes = [[] for _ in self._unit_names]

    # -- gradients --------------------------------------------------------------------------
    def _grad_pre_hook(self, rec):
        def hook(grad):
            with DisableTorchFunction():
                if rec.p.grad is not None:
                    rec.p.grad = None  # the GradPlaceholder: AccumulateGrad stores a fresh one
        return hook

    def _grad_hook(self, rec):
        stepper = self._stepper

        def hook(*_):
            with DisableTorchFunction():
                g = rec.p.grad
            if g is None or isinstance(g, _guard.GradPlaceholder):
                return
            stepper.check_backward_api()
            stepper.grad_arrived(rec)
            s, e = rec.shard, self._store.engine
            lease = e.acquire(s.g, "host")
            try:
                with DisableTorchFunction():
                    dst = rec.region(view_of(e.wait(lease), s.numel, torch.float32, "host"))
                    g = g.to("cpu")
                    if rec.grad_started:
                        dst.add_(g)
                    else:
                        dst.copy_(g)
            finally:
                e.release(lease, dirty=True)
            rec.grad_started = True
            with DisableTorchFunction():
                rec.p.grad = _guard.grad_placeholder(rec, rec.shape, self._wdtype,
                                                     self._torch_device)
            if not rec.fired:
                rec.fired = True
                s.fired += 1
                if s.fired == len(s.params):
                    self._store.bwd_release(s)
                    stepper.shard_complete(s)
        return hook

    def _drop_grad(self, rec):
        if rec.grad_started:
            rec.grad_started = False
            s = rec.shard
            if not any(r.grad_started for r in s.params):
                self._store.engine.discard(s.g)
            else:  # zero its region (other parameters of the shard keep theirs)
                e = self._store.engine
                lease = e.acquire(s.g, "host")
                try:
                    rec.region(view_of(e.wait(lease), s.numel, torch.float32, "host")).zero_()
                finally:
                    e.release(lease, dirty=True)

    def backward(self, loss, retain_graph=False):
        """DeepSpeed's engine.backward: the loss divided by the config's
        gradient_accumulation_steps and multiplied by the fp16 loss scale, then backward."""
        self._stepper.backward(loss, retain_graph)

    def zero_grad(self, set_to_none=True):
        """Drops the gradients accumulated since the last step."""
        self._unwind_units()
        self._store.release_all()  # after a backward that failed, its leases too
        self._stepper.drop_all()
        for rec in self._order:
            with DisableTorchFunction():
                rec.p.grad = None

    # -- the optimizer step (_step.Stepper) ---------------------------------------------------
    def grad_norm(self):
        """The global 2-norm of the gradients accumulated so far (without the fp16 loss
        scale), as a 0-dim fp32 tensor."""
        self._store.release_all()
        return self._stepper.grad_norm([r for r in self._order if r.grad_started])

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """FSDP's clip_grad_norm_ (torch.nn.utils.clip_grad_norm_'s arithmetic) over zinf's
        gradients, which it scales in the tiers: returns the total norm before clipping."""
        if float(norm_type) != 2.0:
            raise ValueError(f"zinf: clip_grad_norm_ norm_type {norm_type}; only 2.0 is "
                             "implemented")
        return self._stepper.clip_grad_norm_(max_norm,
                                             [r for r in self._order if r.grad_started])

    def gathered_grad(self, name):
        """A CPU fp32 copy of parameter `name`'s accumulated gradient (None when it has none)."""
        rec = self._rec(name)
        if not rec.grad_started:
            return None
        self._store.release_all()
        return self._stepper.unscale(rec.region(self._store.read_flat(rec.shard,
                                                                      "grad")).clone())

    def gathered_param(self, name):
        """A CPU copy of parameter `name`'s value (its original dtype; from the fp32 master
        when there is one)."""
        rec = self._rec(name)
        try:
            return self._value(rec)
        finally:
            self._cache = {}

    def optimizer_step(self):
        """One optimizer step over every parameter with a gradient (model.optimizer.step()).
        Returns False when fp16 overflow skipped it."""
        self._unwind_units()
        applied = self._stepper.optimizer_step(self._order)
        for rec in self._order:
            with DisableTorchFunction():
                rec.p.grad = None
        return applied

    def step(self, lr=None):
        """DeepSpeed's engine.step: the optimizer step at the end of each accumulation window
        (every call when gradient_accumulation_steps is 1). lr: this step's lr for every group
        (zinf.torch's first API; a scheduler is the usual way). Returns whether an optimizer
        step was applied."""
        return self._stepper.step(lr)

    def step_state(self):
        return self._stepper.state()

    def load_step_state(self, d):
        self._stepper.load_state(d)

    @property
    def loss_scale(self):
        return self._stepper.scaler.scale if self._precision == "fp16" else 1.0

    @property
    def skipped_steps(self):
        return self._stepper.skipped

    @property
    def global_steps(self):
        return self._stepper.global_steps

    @property
    def lr_scheduler(self):
        return self._stepper.lr_scheduler

    def stats(self):
        return self._store.engine.stats()

    def state_tensor(self, name, which="param"):
        """A CPU copy of a parameter ("param": its value) or its Adam moment ("exp_avg",
        "exp_avg_sq")."""
        if which == "param":
            return self.gathered_param(name)
        return self.read_state(self._rec(name), which)

    def _rec(self, name):
        rec = self._names.get(name)
        if rec is None:
            raise KeyError(f"zinf: {name!r} is not a parameter of the offloaded module")
        return rec

    @property
    def units(self):
        """The wrap units' names, the root last."""
        return list(self._unit_names)

    def close(self):
        for h in self._stepper.handles.values():
            _lib.lib.zinf_adam_destroy(h)
        self._stepper.handles = {}
        self._store.close()
