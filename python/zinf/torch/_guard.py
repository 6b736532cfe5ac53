"""The guard that keeps zinf's placeholders unreadable.

An offloaded parameter stays the module's own nn.Parameter object (references held elsewhere, an
optimizer's param groups, tied weights, keep working), but its class becomes ZinfParameter and
its data a placeholder of the right shape with no memory (one element, expanded). ZinfParameter's
__torch_function__ lets through what reads no data (shape, dtype, device, requires_grad, size(),
numel(), ...) and, while zinf holds a lease on the parameter (around its wrap unit's forward, and
in backward), everything; any other use raises ZinfParameterError naming the parameter, its
module and the wrap units that lease it. So a placeholder is never read in silence.

Two contexts of the offloaded module turn such uses into zinf's own: `gathering` (state_dict:
detach() of an unleased parameter returns a CPU copy of its value read from the tiers) and
`loading` (load_state_dict: copy_() into it writes the tiers).

After backward, a trainable parameter's .grad is a GradPlaceholder: its value lives in zinf's
tiers, so any use raises (torch.nn.utils.clip_grad_norm_, a torch optimizer) with the offloaded
module's own calls to use instead; setting .grad to None drops zinf's gradient (zero_grad).

Thread-safety: the flags are per offloaded module and read on the thread running the model;
one model is used by one thread at a time, as PyTorch modules are.
"""
import torch
from torch._C import DisableTorchFunction


class ZinfParameterError(RuntimeError):
    """A use of an offloaded parameter (or its gradient) zinf cannot serve correctly."""


def _getset(*names):
    out = set()
    for n in names:
        d = getattr(torch.Tensor, n, None)
        if d is not None and hasattr(d, "__get__"):
            out.add(d.__get__)
    return out


def _methods(*names):
    return {getattr(torch.Tensor, n) for n in names if hasattr(torch.Tensor, n)}


# What reads no element of the tensor: allowed on a placeholder.
_METADATA = _getset("shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "ndim",
                    "is_cuda", "is_cpu", "layout", "names", "is_sparse", "is_quantized",
                    "is_meta", "is_mkldnn", "is_nested", "output_nr", "_version", "name",
                    "is_xpu", "is_mps", "_backward_hooks", "grad", "_grad", "_grad_fn",
                    "is_sparse_csr", "itemsize", "nbytes", "is_ort") | _methods(
    "size", "dim", "numel", "nelement", "stride", "element_size", "is_floating_point",
    "is_complex", "is_contiguous", "data_ptr", "register_hook", "get_device", "__len__",
    "has_names", "is_pinned", "is_shared", "_is_view", "is_inference", "__hash__")
_DATA_GET = torch.Tensor.data.__get__  # compare with ==: each access is a new wrapper
_DATA_SET = torch.Tensor.data.__set__
_GRAD_SET = torch.Tensor.grad.__set__
_RG_SET = torch.Tensor.requires_grad.__set__
_RG_ = torch.Tensor.requires_grad_
_DETACH = torch.Tensor.detach
_COPY_ = torch.Tensor.copy_


def _name(func):
    self = getattr(func, "__self__", None)
    n = getattr(func, "__name__", str(func))
    if n in ("__get__", "__set__") and self is not None:
        return f"Tensor.{getattr(self, '__name__', '?')} ({'read' if n == '__get__' else 'set'})"
    mod = getattr(func, "__module__", None) or ""
    return f"{mod}.{n}" if mod and not mod.startswith("torch._C") else n


def _plain(func, args, kwargs):
    with DisableTorchFunction():
        return func(*args, **kwargs)


def _params_in(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, ZinfParameter):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, ZinfParameter):
                    yield b


class ZinfParameter(torch.nn.Parameter):
    """An nn.Parameter whose value lives in zinf's tiers (see the module docstring). Its record
    is `_zinf`: the offloaded module's per-parameter state."""

    def __repr__(self):
        rec = self.__dict__.get("_zinf")
        with DisableTorchFunction():
            shape, dtype = tuple(self.shape), self.dtype
        name = rec.name if rec is not None else "?"
        return f"ZinfParameter({name}, shape={shape}, dtype={dtype}, offloaded by zinf)"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            return _plain(func, args, kwargs)
        for p in _params_in(args, kwargs):
            rec = p.__dict__.get("_zinf")
            if rec is None:
                continue
            out = rec.owner.intercept(rec, func, args, kwargs)
            if out is not NotImplemented:
                return out
        with DisableTorchFunction():
            return func(*args, **kwargs)


_ZERO = {torch.Tensor.zero_, getattr(torch, "_foreach_zero_", None)} - {None}
_NOOP = {torch.Tensor.requires_grad_, torch.Tensor.detach_}


class GradPlaceholder(torch.Tensor):
    """What .grad holds after backward: the gradient itself is in zinf's tiers. zero_()
    (nn.Module.zero_grad(set_to_none=False), torch 2's _foreach_zero_) drops it there."""

    def __repr__(self):
        rec = self.__dict__.get("_zinf_rec")
        return f"GradPlaceholder({rec.name if rec else '?'}: in zinf's tiers)"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            return _plain(func, args, kwargs)
        flat = [a for a in args if isinstance(a, GradPlaceholder)] + [
            b for a in args if isinstance(a, (list, tuple)) for b in a
            if isinstance(b, GradPlaceholder)]
        if func in _ZERO and all(isinstance(a, GradPlaceholder) for a in
                                 (args[0] if isinstance(args[0], (list, tuple)) else args[:1])):
            for g in flat:
                rec = g.__dict__["_zinf_rec"]
                rec.owner._drop_grad(rec)
            return args[0]
        if func in _NOOP and args and isinstance(args[0], GradPlaceholder):
            return args[0]
        rec = flat[0].__dict__.get("_zinf_rec") if flat else None
        raise ZinfParameterError(
            f"zinf: the gradient of {rec.name if rec else 'a parameter'} lives in zinf's tiers, "
            f"not in .grad ({_name(func)} cannot read it). Use the offloaded model's own calls: "
            "model.clip_grad_norm_(max_norm) (or the config's gradient_clipping), "
            "model.grad_norm(), model.gathered_grad(name), model.optimizer.step() / "
            "model.step(), model.zero_grad()")


def placeholder(shape, dtype, device):
    """A tensor of `shape` with no memory of its own: one element, expanded. One per parameter,
    so data_ptr() tells parameters apart as their real storage would."""
    with DisableTorchFunction():
        return torch.empty(1, dtype=dtype, device=device).expand(shape)


def grad_placeholder(rec, shape, dtype, device):
    with DisableTorchFunction():
        t = torch.empty(1, dtype=dtype, device=device).expand(shape).as_subclass(GradPlaceholder)
    t._zinf_rec = rec
    return t


def refuse(rec, func, why):
    units = ", ".join(repr(u) for u in rec.units) or "the root"
    raise ZinfParameterError(
        f"zinf: parameter {rec.name!r} (in module {rec.module_name!r}, a "
        f"{rec.module_class}) was used by {_name(func)} {why}. zinf leases it only during the "
        f"forward and backward of its wrap unit(s) {units}. Call the model through the "
        "offloaded wrapper; if this code reads the parameter outside that unit's forward, "
        "choose a wrap policy whose unit contains that code (auto_wrap_policy); for its value "
        "use model.state_dict() or model.gathered_param(name)")
