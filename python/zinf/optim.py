"""zinf.optim.CPUAdam: DeepSpeedCPUAdam's constructor and step over zinf's SIMD CPU Adam (one
call per parameter group, zinf_adam_step_many: every tensor of the group in one dispatch over
zinf's threads, fused over memory; the GIL is released during it).

A group's tensors are stepped at once, so no two parameters may share memory (PyTorch's tied
weights are one Parameter and appear once, which is fine).
Parameters are fp32 CPU tensors; gradients fp32, bf16 or fp16; the moments fp32
(fp32_optimizer_states=False and amsgrad are refused, as DeepSpeed refuses amsgrad).
"""
import ctypes

import torch

from zinf import _lib

_GRAD_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.bfloat16: _lib.DTYPE_BF16,
                torch.float16: _lib.DTYPE_F16}


class CPUAdam(torch.optim.Optimizer):
    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if amsgrad:
            raise ValueError("zinf.optim.CPUAdam: amsgrad is not supported (nor by DeepSpeed's)")
        if not fp32_optimizer_states:
            raise ValueError("zinf.optim.CPUAdam: fp32_optimizer_states=False is not supported "
                             "yet; the moments are fp32")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction)
        super().__init__(model_params, defaults)
        self.adamw_mode = adamw_mode
        self._handles = {}  # (betas, eps, weight_decay, bias_correction) -> zinf_adam*

    def _handle(self, group):
        key = (tuple(group["betas"]), group["eps"], group["weight_decay"],
               bool(group["bias_correction"]))
        h = self._handles.get(key)
        if h is None:
            b1, b2 = group["betas"]
            params = _lib.AdamParams(ctypes.sizeof(_lib.AdamParams), group["lr"], b1, b2,
                                     group["eps"], group["weight_decay"],
                                     1 if self.adamw_mode else 0,
                                     1 if group["bias_correction"] else 0, 0)
            h = ctypes.c_void_p()
            _lib.check(_lib.lib.zinf_adam_create(ctypes.byref(params), ctypes.byref(h)))
            self._handles[key] = h
        return h

    def __del__(self):
        for h in getattr(self, "_handles", {}).values():
            _lib.lib.zinf_adam_destroy(h)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            h = self._handle(group)
            batch = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous():
                    raise ValueError(f"zinf.optim.CPUAdam: parameters must be contiguous fp32 "
                                     f"CPU tensors; got {p.dtype} on {p.device}")
                g = p.grad
                if g.dtype not in _GRAD_DTYPES:
                    raise ValueError(f"zinf.optim.CPUAdam: gradient dtype {g.dtype}; expected "
                                     f"float32, bfloat16 or float16")
                g = g.contiguous()
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.contiguous_format)
                batch.append((p, g, state))
            if not batch:
                continue
            tensors = (_lib.AdamTensor * len(batch))()
            for t, (p, g, state) in zip(tensors, batch):
                t.size = ctypes.sizeof(_lib.AdamTensor)
                t.step = state["step"] + 1
                t.param = p.data_ptr()
                t.grad = g.data_ptr()
                t.exp_avg = state["exp_avg"].data_ptr()
                t.exp_avg_sq = state["exp_avg_sq"].data_ptr()
                t.n = p.numel()
                t.grad_dtype = _GRAD_DTYPES[g.dtype]
            # `batch` keeps the contiguous gradient copies alive through the call.
            _lib.check(_lib.lib.zinf_adam_step_many(h, float(group["lr"]), tensors, len(batch)))
            for _, _, state in batch:
                state["step"] += 1
        return loss
