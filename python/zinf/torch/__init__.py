"""zinf.torch: train a PyTorch nn.Module whose parameters, gradients and Adam state live in
zinf's tiers (NVMe or pinned host memory), paged through a device budget, as DeepSpeed ZeRO-3
with offload and FSDP with CPU offload do it.

    model = zinf.torch.offload(net, "ds_config.json")        # DeepSpeed's keys and meaning
    for batch in data:
        loss = loss_fn(model(batch))
        model.backward(loss)      # or loss.backward() (fp32/bf16 without config accumulation)
        model.step()              # Adam over the state in the tiers, then the schedule

What the wrapped model offers (OffloadedModule):
- model(...) runs the original module; each wrap unit's parameters are leased around its
  forward and backward (auto_wrap_policy, FSDP's; default: each child of the root that owns
  parameters, looking through ModuleList/ModuleDict). A parameter's value is never readable
  outside a lease: such a use raises ZinfParameterError naming it.
- model.optimizer: a torch.optim.Optimizer with param_groups (per-group lr, betas, eps,
  weight_decay), so torch.optim.lr_scheduler and Hugging Face's no-decay groups work;
  model.lr_scheduler: the config's DeepSpeed schedule, if any.
- model.backward(loss), model.step() (DeepSpeed's engine semantics), model.zero_grad(),
  model.clip_grad_norm_(max_norm) (FSDP's), model.grad_norm(), model.gathered_grad(name),
  model.gathered_param(name).
- model.state_dict() / load_state_dict(): real CPU tensors, the module's own keys; the
  module's own state_dict()/load_state_dict() do the same.
- Frozen parameters (requires_grad=False before offload()) have no gradient and no optimizer
  state: an adapter fine-tune pays for its adapters only.
- Mixed precision: the config's bf16 or fp16 block (or a 16-bit module) keeps 16-bit weights
  on the device and the fp32 master and moments in the tiers; fp16 uses DeepSpeed's dynamic
  loss scaling through model.backward(loss), skipping overflowed steps.
Every config key is honored or refused (zinf.torch._config.KEYS; docs/torch.md).
"""
from zinf.torch._guard import GradPlaceholder, ZinfParameter, ZinfParameterError  # noqa: F401
from zinf.torch._module import OffloadedModule  # noqa: F401
from zinf.torch._wrap import (ModuleWrapPolicy, size_based_auto_wrap_policy,  # noqa: F401
                              transformer_auto_wrap_policy)


def offload(module, config=None, **kwargs):
    """Wraps `module` (see this package's docstring).

    config: a DeepSpeed-style JSON config (dict or path) with zinf's keys.
    Keyword arguments:
    - auto_wrap_policy: None, a set of module classes, or an FSDP-style policy callable.
    - optimizer: a torch.optim.Adam / AdamW or zinf.optim.CPUAdam built on the module's
      parameters (its groups and hyper-parameters are taken); or param_groups (torch.optim's
      list of dicts; parameters or their names) with lr, betas, eps, weight_decay,
      adamw_mode, bias_correction as defaults. Not together with the config's optimizer block.
    - param_home / state_home ("nvme" | "host"; or the config's offload_param /
      offload_optimizer device), grad_home ("host" | "nvme").
    - device: "auto" (cuda when the module is on a GPU), "host" or "cuda"; leases: device
      leases held at once ("auto": from the largest unit); adam_threads.
    """
    return OffloadedModule(module, config, **kwargs)


__all__ = ["offload", "OffloadedModule", "ZinfParameter", "ZinfParameterError",
           "GradPlaceholder", "ModuleWrapPolicy", "size_based_auto_wrap_policy",
           "transformer_auto_wrap_policy"]
