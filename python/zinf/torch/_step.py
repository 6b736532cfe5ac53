"""The optimizer side of an offloaded module (Stepper, below) and the step over shards: gradient norms (torch.nn.utils.clip_grad_norm_'s
arithmetic), fp16's overflow check with DeepSpeed's combined unscale-and-clip factor, and zinf's
CPU Adam over each trainable shard's parameters with their group's hyper-parameters.

Each shard's master (or fp32 working copy), moments and gradient are leased in the host tier
(NVMe homes read ahead by the engine's trace, written back behind), the 16-bit working copy
rewritten in the same pass (zinf_adam_step_many writes it), the gradient then dropped.

Thread-safety: called by the model's thread between backward passes.
"""
import ctypes

import torch
from torch._C import DisableTorchFunction

from zinf import _lib
from zinf.torch._optim import LossScaler
from zinf.torch._shards import view_of

_P16 = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}


def each_grad(store, params, fn, dirty):
    """fn(param, its gradient's view) for each of `params`, a shard's gradient leased in the
    host tier at a time (released dirty when fn writes)."""
    e = store.engine
    by_shard = {}
    for r in params:
        by_shard.setdefault(r.shard, []).append(r)
    for s, rs in by_shard.items():
        lease = e.acquire(s.g, "host")
        try:
            with DisableTorchFunction():
                flat = view_of(e.wait(lease), s.numel, torch.float32, "host")
                for r in rs:
                    fn(r, r.region(flat))
        finally:
            e.release(lease, dirty=dirty)


def grad_norms(store, params):
    """One fp32 norm per parameter's gradient (torch.norm(g, 2.0)), in the order given."""
    norms = {}
    each_grad(store, params, lambda r, g: norms.__setitem__(id(r), torch.norm(g, 2.0)), False)
    return [norms[id(r)] for r in params]


def scale_grads(store, params, coef):
    """Multiplies the gradients of `params` in the tiers by `coef` (a 0-dim tensor)."""
    each_grad(store, params, lambda r, g: g.mul_(coef), True)


def total_norm(store, params):
    return torch.norm(torch.stack(grad_norms(store, params)), 2.0)


def step_shard(store, s, groups, handle_of, coef):
    """Adam over the parameters of trainable shard `s` that have a gradient. groups: the
    optimizer's param_groups; handle_of(group) -> zinf_adam handle; coef: None or a factor
    (float or 0-dim tensor) applied to the gradients first."""
    e = store.engine
    stepped = [r for r in s.params if r.grad_started]
    if not stepped:
        return
    master = s.master if store.mixed else s.tid
    whole = len(stepped) == len(s.params)
    want = [(master, "read"), (s.m, "read"), (s.v, "read"), (s.g, "read")]
    if store.mixed:
        want.append((s.tid, "overwrite" if whole else "read"))
    leases = [e.acquire(t, "host", mode) for t, mode in want]
    ok = False
    try:
        ptrs = [e.wait(lease) for lease in leases]
        pm, pa, pv, pg = ptrs[:4]
        p16 = ptrs[4] if store.mixed else None
        if coef is not None:
            with DisableTorchFunction():
                g = view_of(pg, s.numel, torch.float32, "host")
                for r in stepped:
                    r.region(g).mul_(coef)
        el16 = 2
        by_group = {}
        for r in stepped:
            r.step += 1
            by_group.setdefault(r.group, []).append(r)
        for gi, rs in by_group.items():
            group = groups[gi]
            arr = (_lib.AdamTensor * len(rs))()
            for t, r in zip(arr, rs):
                off4 = r.offset * 4
                t.size = ctypes.sizeof(_lib.AdamTensor)
                t.step = r.step
                t.param, t.grad = pm + off4, pg + off4
                t.exp_avg, t.exp_avg_sq = pa + off4, pv + off4
                t.param16_out = (p16 + r.offset * el16) if p16 is not None else None
                t.n = r.numel
                t.grad_dtype = _lib.DTYPE_F32
                t.param16_dtype = _P16.get(store.wdtype, _lib.DTYPE_BF16)
            _lib.check(_lib.lib.zinf_adam_step_many(handle_of(group), float(group["lr"]), arr,
                                                    len(rs)))
        ok = True
    finally:
        for (t, _), lease in zip(want, leases):
            e.release(lease, dirty=ok and t != s.g)
    for r in stepped:
        r.grad_started = False
    e.discard(s.g)


class Stepper:
    """The optimizer side of an offloaded module: the loss scaler, clipping, accumulation
    windows (DeepSpeed's engine.backward / engine.step), the step itself, and with
    zinf.overlap_adam each shard's step as soon as its gradients are final in the window's last
    backward.

    overlap_adam (opt-in, as in `zinf train`): a trainable shard is stepped inside the last
    backward of each accumulation window, as soon as all its parameters' gradients have
    arrived, so its state's NVMe reads and Adam overlap the rest of the backward. Its lr is the
    group's when that backward runs; clipping uses the previous step's global norm (the first
    step is unclipped); fp16 is refused (an overflow seen later could not undo steps taken), as
    are clip_grad_norm_ and a second backward in the same window (accumulation needs
    gradient_accumulation_steps in the config, so that the last backward is known)."""

    def __init__(self, store, cfg, precision, adamw, adam_threads):
        self.store, self.cfg, self.precision = store, cfg, precision
        self.adamw, self.adam_threads = adamw, adam_threads
        self.scaler = LossScaler(precision == "fp16", **cfg.fp16)
        self.clip = cfg.gradient_clipping
        self.overlap = cfg.overlap_adam
        if self.overlap and precision == "fp16":
            raise ValueError("zinf.torch.offload: zinf.overlap_adam with fp16: an overflow found "
                             "after some shards were stepped could not undo them; use bf16 or "
                             "turn overlap_adam off")
        self.next_coef = None  # overlap_adam: the previous step's clip coefficient
        self.sumsq = 0.0       # overlap_adam: squared norms of the shards stepped in backward
        self.handles = {}
        self.micro_steps = self.global_steps = self.skipped = 0
        self.applied = False
        self.in_backward_api = False
        self.require_backward_api = precision == "fp16" or cfg.gradient_accumulation_steps > 1
        self.optimizer = self.lr_scheduler = None

    # -- loss and windows -------------------------------------------------------------------
    def backward(self, loss, retain_graph=False):
        gas = self.cfg.gradient_accumulation_steps
        if gas > 1:
            loss = loss / gas
        if self.precision == "fp16":
            loss = loss.float() * self.scaler.scale
        self.in_backward_api = True
        try:
            loss.backward(retain_graph=retain_graph)
        finally:
            self.in_backward_api = False

    def check_backward_api(self):
        if self.require_backward_api and not self.in_backward_api:
            why = ("fp16 loss scaling" if self.precision == "fp16"
                   else "gradient_accumulation_steps > 1")
            self.store.release_all()  # this backward ends here
            raise RuntimeError(
                f"zinf: a gradient arrived outside model.backward(loss): with {why} from the "
                "config, call model.backward(loss) (DeepSpeed's engine.backward) instead of "
                "loss.backward()")

    def at_boundary(self):
        return (self.micro_steps + 1) % self.cfg.gradient_accumulation_steps == 0

    # -- overlap ----------------------------------------------------------------------------
    def grad_arrived(self, rec):
        if rec.shard.stepped:
            self.store.release_all()
            raise RuntimeError(
                f"zinf: a second gradient for {rec.name!r} arrived after zinf.overlap_adam "
                "stepped it in this window's backward: with overlap_adam, accumulate through "
                "the config's gradient_accumulation_steps (model.backward / model.step), call "
                "model.step() after each window's last backward, and do not checkpoint "
                "(reentrant) a region that shares parameters with code outside it")

    def shard_complete(self, s):
        """Every parameter of trainable shard `s` has its gradient for this backward."""
        if not self.overlap or not self.at_boundary():
            return
        self.store.drain(0, everything=True)
        if self.clip > 0:
            self.sumsq += float(total_norm(self.store, s.params)) ** 2
        step_shard(self.store, s, self.optimizer.param_groups, self.adam, self.next_coef)
        s.stepped = True

    # -- gradients --------------------------------------------------------------------------
    def adam(self, group):
        key = (tuple(group["betas"]), group["eps"], group["weight_decay"],
               bool(group.get("bias_correction", True)))
        h = self.handles.get(key)
        if h is None:
            params = _lib.AdamParams(ctypes.sizeof(_lib.AdamParams), group["lr"],
                                     group["betas"][0], group["betas"][1], group["eps"],
                                     group["weight_decay"], 1 if self.adamw else 0,
                                     1 if key[3] else 0, self.adam_threads)
            h = ctypes.c_void_p()
            _lib.check(_lib.lib.zinf_adam_create(ctypes.byref(params), ctypes.byref(h)))
            self.handles[key] = h
        return h

    def grad_norm(self, recs):
        """The global 2-norm of `recs`' gradients, without the fp16 loss scale."""
        if not recs:
            return torch.tensor(0.0)
        total = total_norm(self.store, recs)
        if self.precision == "fp16":
            total = total / self.scaler.scale
        return total

    def clip_grad_norm_(self, max_norm, order):
        """torch.nn.utils.clip_grad_norm_ over the gradients in the tiers: the total norm, and
        the gradients scaled now (later micro-batches add unclipped, as in PyTorch)."""
        if self.overlap:
            raise RuntimeError("zinf: clip_grad_norm_ with zinf.overlap_adam: the shards were "
                               "stepped during backward; use the config's gradient_clipping "
                               "(applied with the previous step's norm)")
        self.store.release_all()
        total = self.grad_norm(order)
        c = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        scale_grads(self.store, [r for r in order if r.grad_started], c)
        return total

    def unscale(self, out):
        """A gathered gradient without the fp16 loss scale."""
        if self.precision == "fp16":
            out /= self.scaler.scale
        return out

    def drop_all(self):
        for s in self.store.shards:
            if s.trainable and any(r.grad_started for r in s.params):
                for r in s.params:
                    r.grad_started = False
                self.store.engine.discard(s.g)

    # -- the step ---------------------------------------------------------------------------
    @torch.no_grad()
    def optimizer_step(self, order):
        """One optimizer step over every parameter with a gradient (`order`: the parameters in
        the module's order, for the norms). Returns False when fp16 overflow skipped it."""
        store = self.store
        store.release_all()
        recs = [r for r in order if r.grad_started]
        coef = None
        skip = False
        if self.overlap:
            coef = self.next_coef
            if self.clip > 0 and recs:
                self.sumsq += float(total_norm(store, recs)) ** 2
        elif self.precision == "fp16":
            used = self.scaler.scale  # what this step's losses were multiplied by
            total = total_norm(store, recs) if recs else None
            skip = self.scaler.update(total is not None and not bool(torch.isfinite(total)))
            if not skip and recs:
                # DeepSpeed's unscale_and_clip_grads: one combined factor.
                combined = used
                if self.clip > 0:
                    clip = ((float(total) / used) + 1e-6) / self.clip
                    if clip > 1:
                        combined = clip * used
                coef = 1.0 / combined
        elif self.clip > 0 and recs:
            total = total_norm(store, recs)
            coef = torch.clamp(self.clip / (total + 1e-6), max=1.0)
        if skip:
            self.drop_all()
            self.skipped += 1
        else:
            for s in store.shards:
                if s.trainable:
                    step_shard(store, s, self.optimizer.param_groups, self.adam, coef)
        if self.overlap:
            if self.clip > 0:
                total = torch.tensor(self.sumsq).sqrt()
                self.next_coef = torch.clamp(self.clip / (total + 1e-6), max=1.0)
            self.sumsq = 0.0
        for s in store.shards:
            s.stepped = False
        store.engine.end_step()
        self.applied = not skip
        self.global_steps += 1
        if not skip and self.lr_scheduler is not None:
            self.lr_scheduler.step()
        n = self.cfg.steps_per_print
        if n and self.global_steps % n == 0:
            print(f"zinf.torch: step={self.global_steps}, skipped={self.skipped}, "
                  f"lr={[g['lr'] for g in self.optimizer.param_groups]}"
                  + (f", loss_scale={self.scaler.scale}" if self.precision == "fp16" else ""),
                  flush=True)
        return not skip

    def state(self):
        return {"global_steps": self.global_steps, "micro_steps": self.micro_steps,
                "skipped": self.skipped, "scaler": self.scaler.state_dict(),
                "next_coef": None if self.next_coef is None else float(self.next_coef),
                "lr_scheduler": (self.lr_scheduler.state_dict()
                                 if self.lr_scheduler is not None else None)}

    def load_state(self, d):
        self.global_steps, self.micro_steps = d["global_steps"], d["micro_steps"]
        self.skipped = d["skipped"]
        self.scaler.load_state_dict(d["scaler"])
        self.next_coef = None if d["next_coef"] is None else torch.tensor(d["next_coef"])
        if d["lr_scheduler"] is not None:
            if self.lr_scheduler is None:
                raise ValueError("zinf: the optimizer state has a config schedule's state and "
                                 "this model's config has no scheduler block")
            self.lr_scheduler.load_state_dict(d["lr_scheduler"])

    def step(self, lr):
        if lr is not None and self.overlap:
            raise ValueError("zinf: step(lr=...) with zinf.overlap_adam: most shards were "
                             "stepped during backward with the groups' lr; set the lr (or a "
                             "scheduler) before backward")
        self.micro_steps += 1
        if self.micro_steps % self.cfg.gradient_accumulation_steps:
            return False
        if lr is not None:
            for g in self.optimizer.param_groups:
                g["lr"] = lr
        self.optimizer.step()  # through the optimizer: torch's schedulers count its steps
        return self.applied
