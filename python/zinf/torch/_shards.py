"""Shards: each wrap unit's parameters flattened into contiguous zinf tensors, and their leases.

A unit's parameters of one kind (trainable, frozen) form one shard: one working copy on the
device (role param, the working dtype), and for a trainable shard its fp32 master (role master,
only with 16-bit weights: in fp32 the working copy is the master), two Adam moments and an fp32
gradient, each one zinf tensor. So the disk and the link see one request per unit and role, a
unit's forward takes one or two leases, and the device budget needs room for a few units, not
for the parameters of the largest role class (FSDP's FlatParameter; zinf's units and shards).

ShardStore owns the engine and the leases:
- hold(shards) acquires every shard not yet held, then waits for all (the fetches run
  together); a shard is held by a count (units in forward, plus one for backward); unhold at
  zero points the parameters back at placeholders and releases the lease (dirty when a param's
  version moved: an in-place change, written home; refused with 16-bit weights).
- bwd_hold(shards) holds for backward once; bwd_release ends it. When a backward hold would
  exceed the declared leases, the oldest backward-held shards not among the two most recently
  unpacked are handed back first (they are leased again if unpacked again), so a sealed plan
  never fails in the middle of a backward. Pinned holds (bwd_hold(pin=True): a recomputation's,
  whose saved tensors point straight into the copy) are never handed back early; when only
  they hold the leases, the acquire fails naming the cause instead.
- With device="cuda" a release waits behind a CUDA event recorded on the current stream.

Thread-safety: one thread at a time (the model's thread, or autograd's device thread while the
caller waits in backward).
"""
import ctypes

import torch
from torch._C import DisableTorchFunction

from zinf import _lib
from zinf._lib import ZinfError
from zinf.engine import Engine
from zinf.torch import _guard


def view_of(ptr, numel, dtype, device):
    """A 1-D tensor of `numel` elements of `dtype` at address `ptr` (no copy)."""
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    with DisableTorchFunction():
        if device == "cuda":
            class _Cai:
                __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                            "data": (ptr, False), "version": 2}
            raw = torch.as_tensor(_Cai(), device="cuda")
        else:
            raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr),
                                   dtype=torch.uint8)
        return raw.view(dtype)


def storage_ptr(t):
    with DisableTorchFunction():
        try:
            s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
            return s.data_ptr()
        except (RuntimeError, NotImplementedError, TypeError):
            return None


class Param:
    """One parameter: its place in its shard and its gradient state."""
    __slots__ = ("owner", "name", "p", "shape", "numel", "orig_dtype", "module_name",
                 "module_class", "units", "unit", "trainable", "shard", "offset", "version",
                 "grad_started", "fired", "step", "group", "acc")

    def __init__(self, owner, name, p, module_name, module_class):
        self.owner, self.name, self.p = owner, name, p
        with DisableTorchFunction():
            self.shape, self.numel, self.orig_dtype = tuple(p.shape), p.numel(), p.dtype
            self.trainable = bool(p.requires_grad)
        self.module_name, self.module_class = module_name, module_class
        self.units = []
        self.shard = self.unit = self.group = self.acc = None
        self.offset = self.version = self.step = 0
        self.grad_started = self.fired = False

    def region(self, flat):
        return flat[self.offset:self.offset + self.numel].view(self.shape)


class Shard:
    __slots__ = ("name", "unit", "params", "numel", "trainable", "tid", "master", "m", "v",
                 "g", "holds", "lease", "view", "bwd_held", "ptr", "fired", "stepped",
                 "data_read")

    def __init__(self, name, unit, params, trainable):
        self.name, self.unit, self.params, self.trainable = name, unit, params, trainable
        self.numel = 0
        for p in params:
            p.shard, p.offset = self, self.numel
            self.numel += p.numel
        self.tid = self.master = self.m = self.v = self.g = None
        self.holds, self.lease, self.view, self.bwd_held, self.ptr = 0, None, None, False, None
        self.fired = 0  # trainable parameters whose gradient arrived in this backward
        self.stepped = False  # zinf.overlap_adam: stepped during this window's backward
        self.data_read = False  # a param's .data was handed out during the lease


class ShardStore:
    def __init__(self, doc, device, wdtype, shards, homes, grad_home, leases, protect=2):
        self.device, self.wdtype = device, wdtype
        self.torch_device = torch.device("cuda" if device == "cuda" else "cpu")
        self.mixed = wdtype != torch.float32
        self.shards, self.leases, self.protect = shards, leases, protect
        self.engine = Engine(doc or None, device_leases={"param": leases, "grad": 0},
                             host_leases={"param": 1, "exp_avg": 1, "exp_avg_sq": 1,
                                          "grad": 1, "master": 1 if self.mixed else 0},
                             device=device)
        e = self.engine
        el = torch.empty(0, dtype=wdtype).element_size()
        for s in shards:
            s.tid = e.register(s.name, s.numel * el, "param", homes["param_home"], s.unit)
            if s.trainable:
                if self.mixed:
                    s.master = e.register(s.name + ".master", s.numel * 4, "master",
                                          homes["state_home"], s.unit)
                s.m = e.register(s.name + ".exp_avg", s.numel * 4, "exp_avg",
                                 homes["state_home"], s.unit)
                s.v = e.register(s.name + ".exp_avg_sq", s.numel * 4, "exp_avg_sq",
                                 homes["state_home"], s.unit)
                s.g = e.register(s.name + ".grad", s.numel * 4, "grad", grad_home, s.unit)
        e.seal()  # the memory plan: refused here, with the numbers, or never short later
        self.held = 0
        self.deferred = []
        self.by_ptr = {}
        self.bwd = []       # backward-held shards, oldest first
        self.pinned = set()  # of those, a recomputation's: never handed back early
        self.recent = []    # the shards most recently unpacked
        self.final_queued = False

    # -- values -----------------------------------------------------------------------------
    def read_flat(self, shard, which="value"):
        """A CPU copy of a shard's tensor: "value" (the master, else the working copy),
        "working", "exp_avg", "exp_avg_sq", "grad"."""
        tid, dtype = {"value": (shard.master if shard.master is not None else shard.tid,
                                torch.float32 if shard.master is not None else self.wdtype),
                      "working": (shard.tid, self.wdtype), "exp_avg": (shard.m, torch.float32),
                      "exp_avg_sq": (shard.v, torch.float32),
                      "grad": (shard.g, torch.float32)}[which]
        out = torch.empty(shard.numel, dtype=dtype)
        self.engine.read(tid, out)
        return out

    def write_value(self, shard, flat):
        """Sets a shard's value (a CPU flat tensor of any float dtype): its master and its
        working copy."""
        with DisableTorchFunction():
            flat = flat.detach().to("cpu")
            self.engine.write(shard.tid, flat.to(self.wdtype).contiguous())
            if shard.master is not None:
                self.engine.write(shard.master, flat.to(torch.float32).contiguous())

    def write_state(self, shard, which, flat):
        self.engine.write({"exp_avg": shard.m, "exp_avg_sq": shard.v}[which],
                          flat.to(torch.float32).contiguous())

    # -- leases -----------------------------------------------------------------------------
    def hold(self, shards):
        shards = list(dict.fromkeys(shards))
        need = [s for s in shards if s.holds == 0]
        if need:
            self.make_room(len(need), keep=shards)
            e, got = self.engine, []
            try:
                for s in need:
                    got.append((s, self._acquire(s)))
                    self.held += 1
                for s, lease in got:
                    ptr = e.wait(lease)
                    s.lease, s.ptr = lease, ptr
                    s.view = view_of(ptr, s.numel, self.wdtype, self.device)
                    with DisableTorchFunction():
                        for r in s.params:
                            r.p.data = r.region(s.view)
                            r.version = r.p._version
                    s.data_read = False
                    self.by_ptr[ptr] = s
            except BaseException:
                for s, lease in got:  # none of these counts as held yet: hand them all back
                    if s.lease is not None:
                        self.by_ptr.pop(s.ptr, None)
                        with DisableTorchFunction():
                            for r in s.params:
                                r.p.data = _guard.placeholder(r.shape, self.wdtype,
                                                              self.torch_device)
                        s.lease = s.view = s.ptr = None
                    self.held -= 1
                    e.release(lease, dirty=False)
                raise
        for s in shards:
            s.holds += 1

    def _acquire(self, s):
        try:
            return self.engine.acquire(s.tid, "device")
        except ZinfError as err:
            if err.status != _lib.ZINF_E_FAILED_PRECONDITION or not self.pinned:
                raise
            raise RuntimeError(
                f"zinf: {len(self.pinned)} shard(s) ({', '.join(x.name for x in self.pinned)}) "
                "are held for backward by a non-reentrant torch.utils.checkpoint recomputation "
                "over several wrap units (its saved tensors point into them), and the plan's "
                f"{self.leases} device leases are all in use: checkpoint one unit per region, "
                "or pass use_reentrant=True (any region size works), or give offload() more "
                "leases (and the device budget for them)") from err

    def unhold(self, s):
        s.holds -= 1
        if s.holds > 0:
            return
        lease, s.lease = s.lease, None
        changed = []
        with DisableTorchFunction():
            for r in s.params:
                if r.p._version != r.version or s.data_read:
                    changed.append(r.name)  # .data hands out an alias: assume it was written
                r.p.data = _guard.placeholder(r.shape, self.wdtype, self.torch_device)
        self.by_ptr.pop(s.ptr, None)
        s.view = s.ptr = None
        if changed and self.mixed:
            self._give_back(lease, False)
            raise _guard.ZinfParameterError(
                f"zinf: parameter(s) {changed} were modified in place during their lease; with "
                "16-bit weights the fp32 master in zinf's tiers would not see the change, so "
                "it is refused (set values with model.load_state_dict)")
        if self.device == "cuda":
            ev = torch.cuda.Event()
            ev.record()
            self.deferred.append((ev, lease, bool(changed)))
            self.drain(0)
        else:
            self._give_back(lease, bool(changed))

    def _give_back(self, lease, dirty):
        self.held -= 1
        self.engine.release(lease, dirty=dirty)

    def drain(self, need, everything=False):
        """Hands back the deferred device leases whose kernels have run; with need, waits for
        the oldest until that many leases are free; with everything, for all of them."""
        while self.deferred:
            ev, lease, dirty = self.deferred[0]
            if not ev.query():
                if not (everything or (need and self.held + need > self.leases)):
                    break
                ev.synchronize()
            self.deferred.pop(0)
            self._give_back(lease, dirty)

    def make_room(self, need, keep=()):
        """Frees leases for `need` more: deferred CUDA releases first, then the oldest
        backward holds not among `keep`, not pinned, not the most recently unpacked."""
        self.drain(need)
        # First the holds no recent unpack uses; then all but the very last one (the node
        # being unpacked now may use it).
        for protected in (self.recent, self.recent[-1:]):
            for s in list(self.bwd):
                if self.held + need <= self.leases:
                    return
                if s in keep or s in protected or s in self.pinned or s.holds != 1:
                    continue
                self.bwd_release(s)
                self.drain(need)

    def bwd_hold(self, shards, pin=False):
        new = [s for s in shards if not s.bwd_held]
        if new:
            self.hold(new)
            for s in new:
                s.bwd_held = True
                self.bwd.append(s)
        if pin:
            self.pinned.update(shards)
        self.queue_final()

    def bwd_release(self, s):
        if s.bwd_held:
            s.bwd_held = False
            self.bwd.remove(s)
            self.pinned.discard(s)
            self.unhold(s)

    def touched(self, s):
        """Records `s` as just unpacked (protected from make_room)."""
        if s in self.recent:
            self.recent.remove(s)
        self.recent.append(s)
        del self.recent[:-self.protect]

    def queue_final(self):
        if self.final_queued:
            return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self.backward_end)
            self.final_queued = True
        except RuntimeError:  # not inside a backward: the next step releases them
            pass

    def backward_end(self):
        self.final_queued = False
        for s in list(self.bwd):
            self.bwd_release(s)
        self._new_backward()

    def _new_backward(self):
        self.final_queued = False  # a failed backward never runs its callback
        self.recent = []
        for s in self.shards:
            s.fired = 0
            for r in s.params:
                r.fired = False

    def clear_stale(self):
        """Before a forward of the wrapper: what a backward that failed left behind (its
        unpinned holds, its callback flag, its gradient counts). A recomputation's pinned holds
        stay: the backward they serve has not run yet."""
        for s in list(self.bwd):
            if s not in self.pinned:
                self.bwd_release(s)
        self._new_backward()

    def release_all(self):
        """Every lease back (before a step, after an error in forward)."""
        for s in list(self.bwd):
            self.bwd_release(s)
        for s in self.shards:
            while s.holds > 0:
                self.unhold(s)
        self.drain(0, everything=True)
        self._new_backward()

    def close(self):
        self.drain(0, everything=True)
        self.engine.close()
