"""zinf.torch.offload: train an nn.Module whose parameters and Adam state live in zinf's tiers
(NVMe or pinned memory), ZeRO-3 style, as FSDP users wrap theirs.

    model = zinf.torch.offload(net, {"zinf": {"swap_dir": "/nvme/run",
                                             "budgets": {"device_bytes": "2G"}}}, lr=1e-3)
    for batch in data:
        loss = loss_fn(model(batch))
        loss.backward()
        model.step()          # zinf's CPU Adam over the state on NVMe, then the step's end

How it works:
- Units: every submodule that owns parameters directly (a Linear, a LayerNorm, an Embedding).
  Each parameter becomes a zinf tensor (role param, home `param_home`), its two Adam moments
  two more (home `state_home`), and its gradient one (home `grad_home`). The module keeps
  placeholders of the right shape and no memory.
- Forward: a forward pre-hook leases the unit's parameters in the device tier and points
  param.data at zinf's copy; the post-hook releases them. Tensors autograd saves for backward
  that are (views of) such a copy are saved as a reference (torch.autograd.graph's
  saved_tensors_hooks) and leased again when backward unpacks them, so no saved tensor ever
  points into memory zinf has reused.
- Gradients: a hook on each parameter's AccumulateGrad node (torch 1.13's way to see a final
  gradient) adds it into the parameter's zinf gradient (pinned or NVMe) and frees param.grad,
  then releases the backward lease. Micro-batches accumulate there until step().
- step(): zinf_engine_adam_step for each parameter in order (the moments read ahead by the
  engine's trace prefetch, written back behind), then the step's end for the prefetcher.
The prefetcher learns the order from the first step (forward, backward, optimizer) and fetches
ahead in the following ones; eviction keeps what is needed soonest.

CPU tensors use the host-emulated device tier (device="host"); with device="cuda" the leases are
device memory and the parameters CUDA tensors (__cuda_array_interface__). zinf does not see the
caller's CUDA stream, so a device lease is not handed back while kernels queued on it may still
read the copy: its release waits behind a CUDA event recorded on the current stream (released as
soon as the event has passed, or at once when the leases run short). Losses match plain PyTorch with torch.optim.AdamW up to the float32 noise of a
different (SIMD, fused) Adam arithmetic: tests/python/test_zinf.py states the tolerance.
"""
import ctypes

import torch

from zinf import _lib
from zinf.engine import Engine

_EMPTY = torch.empty(1)
_EMPTY_CUDA = None


def _placeholder(shape, device):
    """A tensor of `shape` with no memory of its own (one element, expanded), on the device
    the parameter's copies live on (autograd checks a gradient's device against it)."""
    global _EMPTY_CUDA
    if device == "cuda":
        if _EMPTY_CUDA is None:
            _EMPTY_CUDA = torch.empty(1, device="cuda")
        return _EMPTY_CUDA.expand(shape)
    return _EMPTY.expand(shape)


def _view(ptr, shape, dtype, device):
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty(0, dtype=dtype).element_size()
    if device == "cuda":
        class _Cai:
            __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                        "data": (ptr, False), "version": 2}
        raw = torch.as_tensor(_Cai(), device="cuda")
    else:
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
    return raw.view(dtype).view(shape)


class _Param:
    __slots__ = ("name", "p", "shape", "nbytes", "tid", "m", "v", "g", "lease", "ptr",
                 "bwd_lease", "grad_started", "step", "hook")

    def __init__(self, name, p):
        self.name, self.p, self.shape = name, p, tuple(p.shape)
        self.nbytes = p.numel() * p.element_size()
        self.lease = self.ptr = self.bwd_lease = None
        self.grad_started = False
        self.step = 0


class OffloadedModule(torch.nn.Module):
    """The wrapped module: call it as the original; step() runs the optimizer."""

    def __init__(self, module, config=None, *, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, adamw_mode=True, bias_correction=True, param_home="nvme",
                 state_home="nvme", grad_home="host", device="auto", leases=8,
                 adam_threads=0):
        super().__init__()
        self.module = module
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
        self._device = device
        self._lr = lr
        self._leases = leases
        self._held = 0        # device leases acquired and not yet handed back to zinf
        self._deferred = []   # (CUDA event, lease): released once the event has passed
        params = [(n, p) for n, p in module.named_parameters()]
        for n, p in params:
            if p.dtype != torch.float32:
                raise ValueError(f"zinf.torch.offload: parameter {n} is {p.dtype}; expected "
                                 "torch.float32 (the fp32 weights are Adam's master copy)")
        self._engine = Engine(config, device_leases={"param": leases, "grad": 0},
                              host_leases={"param": 1, "exp_avg": 1, "exp_avg_sq": 1,
                                           "grad": 1, "master": 0},
                              device=device)
        e = self._engine
        self._params = {}
        self._units = []
        by_id = {}
        for unit, (mname, m) in enumerate(
                (mn, m) for mn, m in module.named_modules()
                if any(True for _ in m.parameters(recurse=False))):
            owned = []
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in by_id:  # shared (tied): leased with its first owner's unit too
                    owned.append(by_id[id(p)])
                    continue
                full = f"{mname}.{pname}" if mname else pname
                rec = _Param(full, p)
                rec.tid = e.register(full, rec.nbytes, "param", param_home, unit)
                rec.m = e.register(full + ".exp_avg", rec.nbytes, "exp_avg", state_home, unit)
                rec.v = e.register(full + ".exp_avg_sq", rec.nbytes, "exp_avg_sq", state_home,
                                   unit)
                rec.g = e.register(full + ".grad", rec.nbytes, "grad", grad_home, unit)
                by_id[id(p)] = rec
                self._params[full] = rec
                owned.append(rec)
            self._units.append((m, owned))
        zeros = torch.zeros(max([r.nbytes for r in self._params.values()] + [4]) // 4)
        for rec in self._params.values():
            e.write(rec.tid, rec.p.detach().to("cpu").contiguous())
            e.write(rec.m, zeros)
            e.write(rec.v, zeros)
            rec.p.data = _placeholder(rec.shape, device)  # no memory of its own from here
            acc = rec.p.expand_as(rec.p).grad_fn.next_functions[0][0]
            acc.register_hook(self._grad_hook(rec))
            rec.hook = acc  # keep the node (and its hook) alive
        for m, owned in self._units:
            m.register_forward_pre_hook(self._pre_forward(owned))
            m.register_forward_hook(self._post_forward(owned))
        adam = _lib.AdamParams(ctypes.sizeof(_lib.AdamParams), lr, betas[0], betas[1], eps,
                               weight_decay, 1 if adamw_mode else 0,
                               1 if bias_correction else 0, adam_threads)
        h = ctypes.c_void_p()
        _lib.check(_lib.lib.zinf_adam_create(ctypes.byref(adam), ctypes.byref(h)))
        self._adam = h
        self._by_ptr = {}  # address of a leased copy -> its _Param (forward and backward)

    # -- forward ---------------------------------------------------------------------------
    def _lease(self, rec, backward):
        self._drain(need_slot=True)
        lease = self._engine.acquire(rec.tid, "device")
        self._held += 1
        ptr = self._engine.wait(lease)
        rec.p.data = _view(ptr, rec.shape, torch.float32, self._device)
        if backward:
            rec.bwd_lease = lease
        else:
            rec.lease = lease
        rec.ptr = ptr
        self._by_ptr[ptr] = rec
        return rec.p.data

    def _unlease(self, rec, backward):
        lease = rec.bwd_lease if backward else rec.lease
        if lease is None:
            return
        if backward:
            rec.bwd_lease = None
        else:
            rec.lease = None
        if rec.lease is None and rec.bwd_lease is None:
            self._by_ptr.pop(rec.ptr, None)
            rec.p.data = _placeholder(rec.shape, self._device)
        if self._device == "cuda":
            # Kernels queued on the current stream may still read the copy: zinf gets the
            # lease back once they have run.
            ev = torch.cuda.Event()
            ev.record()
            self._deferred.append((ev, lease))
            self._drain(need_slot=False)
        else:
            self._give_back(lease)

    def _give_back(self, lease):
        self._held -= 1
        self._engine.release(lease, dirty=False)

    def _drain(self, need_slot, everything=False):
        """Hands back the deferred device leases whose kernels have run; with need_slot, waits
        for the oldest ones until a lease is free; with everything, for all of them."""
        while self._deferred:
            ev, lease = self._deferred[0]
            if not ev.query():
                if not (everything or (need_slot and self._held >= self._leases)):
                    break
                ev.synchronize()
            self._deferred.pop(0)
            self._give_back(lease)

    def _pre_forward(self, owned):
        def hook(module, inputs):
            for rec in owned:
                if rec.lease is None:
                    self._lease(rec, backward=False)
        return hook

    def _post_forward(self, owned):
        def hook(module, inputs, output):
            for rec in owned:
                self._unlease(rec, backward=False)
        return hook

    # -- saved tensors: references to zinf's copies, leased again when unpacked ---------------
    def _pack(self, t):
        if t.device.type != ("cuda" if self._device == "cuda" else "cpu"):
            return t
        try:
            base = (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()
        except (RuntimeError, NotImplementedError):
            return t
        rec = self._by_ptr.get(base)
        if rec is None:
            return t
        return (rec, t.storage_offset(), tuple(t.shape), t.stride())

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        rec, offset, shape, stride = packed
        if rec.lease is None and rec.bwd_lease is None:
            self._lease(rec, backward=True)
        return rec.p.data.as_strided(shape, stride, offset)

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self.module(*args, **kwargs)

    # -- gradients --------------------------------------------------------------------------
    def _grad_hook(self, rec):
        def hook(*_):
            g = rec.p.grad
            if g is None:
                return
            e = self._engine
            lease = e.acquire(rec.g, "host", "read" if rec.grad_started else "overwrite")
            try:
                dst = _view(e.wait(lease), rec.shape, torch.float32, "cpu")
                if rec.grad_started:
                    dst.add_(g.to("cpu"))
                else:
                    dst.copy_(g)
            finally:
                e.release(lease, dirty=True)
            rec.grad_started = True
            rec.p.grad = None
            self._unlease(rec, backward=True)
        return hook

    # -- optimizer --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, lr=None):
        """Adam over every parameter with a gradient, then the end of the step."""
        e = self._engine
        self._drain(need_slot=False, everything=True)
        for rec in self._params.values():
            if not rec.grad_started:
                continue
            rec.step += 1
            lease = e.acquire(rec.g, "host")
            try:
                gptr = e.wait(lease)
                e.adam_step(self._adam, rec.step, self._lr if lr is None else lr, rec.tid, gptr,
                            _lib.DTYPE_F32, rec.m, rec.v)
            finally:
                e.release(lease, dirty=False)
            e.discard(rec.g)
            rec.grad_started = False
        e.end_step()

    def zero_grad(self, set_to_none=True):
        """Drops the gradients accumulated since the last step."""
        for rec in self._params.values():
            if rec.grad_started:
                self._engine.discard(rec.g)
                rec.grad_started = False

    def stats(self):
        return self._engine.stats()

    def state_tensor(self, name, which="param"):
        """A CPU copy of a parameter ("param") or its Adam moment ("exp_avg", "exp_avg_sq")."""
        rec = self._params[name]
        out = torch.empty(rec.shape, dtype=torch.float32)
        tid = {"param": rec.tid, "exp_avg": rec.m, "exp_avg_sq": rec.v}[which]
        self._engine.read(tid, out)
        return out

    def close(self):
        self._drain(need_slot=False, everything=True)
        if getattr(self, "_adam", None):
            _lib.lib.zinf_adam_destroy(self._adam)
            self._adam = None
        self._engine.close()


def offload(module, config=None, **kwargs):
    """Wraps `module` (see this module's docstring); keyword arguments: lr, betas, eps,
    weight_decay, adamw_mode, bias_correction (DeepSpeedCPUAdam's), param_home / state_home /
    grad_home ("nvme" or "host"), device ("auto": "cuda" when the module's parameters are CUDA
    tensors, else "host"; "host"; "cuda"), leases (device leases of parameters
    held at once), adam_threads."""
    return OffloadedModule(module, config, **kwargs)
