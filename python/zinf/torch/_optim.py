"""The optimizer of an offloaded module as PyTorch sees it, DeepSpeed's schedules and fp16 loss
scaling.

OffloadOptimizer is a torch.optim.Optimizer (so torch.optim.lr_scheduler schedulers and
Hugging Face's group building work on it) whose param_groups hold the module's own Parameter
objects with per-group lr, betas, eps, weight_decay, bias_correction; step() runs zinf's CPU
Adam over the state in the tiers (OffloadedModule.optimizer_step). Its state_dict() has
torch.optim.AdamW's layout (per-parameter step, exp_avg, exp_avg_sq, read from the tiers) plus
a "zinf" entry (the step counts, the fp16 loss scaler, the config's schedule, overlap_adam's
clip coefficient); load_state_dict() writes them back (a torch AdamW's own state dict loads
too).

LossScaler mirrors src/train/loss_scaler.cc (DeepSpeed's DynamicLossScaler): static or dynamic,
hysteresis, window, floor; update(overflow) says whether to skip the step.

DeepSpeedLR applies a schedule of zinf.torch._config.lr_schedule to every group, stepped by the
module after each applied optimizer step, as DeepSpeed's engine steps its lr_scheduler.

Thread-safety: as PyTorch optimizers, used by one thread.
"""
import math

import torch


class LossScaler:
    def __init__(self, enabled, loss_scale=0.0, initial_scale_power=16, loss_scale_window=1000,
                 hysteresis=2, consecutive_hysteresis=False, min_loss_scale=1.0):
        self.dynamic = enabled and loss_scale == 0.0
        self.scale = (loss_scale if loss_scale > 0 else 1.0) if not self.dynamic else \
            math.ldexp(1.0, initial_scale_power)
        self.window, self.hysteresis = loss_scale_window, hysteresis
        self.consecutive = consecutive_hysteresis
        self.min_scale = min_loss_scale
        self.iteration, self.last_overflow, self.hysteresis_left = 0, -1, hysteresis
        self.skipped = 0

    def update(self, overflow):
        """Records one step's overflow check; True: skip the step."""
        if not self.dynamic:
            self.skipped += bool(overflow)
            self.iteration += 1
            return bool(overflow)
        if overflow:
            if self.hysteresis == 1 or self.hysteresis_left == 1:
                if self.scale == self.min_scale:
                    raise FloatingPointError(
                        f"zinf: fp16 gradients overflowed at iteration {self.iteration} with the "
                        f"loss scale already at fp16.min_loss_scale {self.min_scale}: it cannot "
                        "decrease further (DeepSpeed stops the run here)")
                self.scale = max(self.scale / 2.0, self.min_scale)
            else:
                self.hysteresis_left -= 1
            self.last_overflow = self.iteration
            self.skipped += 1
        else:
            if self.consecutive:
                self.hysteresis_left = self.hysteresis
            if (self.iteration - self.last_overflow) % self.window == 0:
                if not self.consecutive:
                    self.hysteresis_left = self.hysteresis
                self.scale *= 2.0
        self.iteration += 1
        return bool(overflow)

    def state_dict(self):
        return {k: getattr(self, k) for k in ("scale", "iteration", "last_overflow",
                                              "hysteresis_left", "skipped")}

    def load_state_dict(self, d):
        for k, v in d.items():
            setattr(self, k, v)


class DeepSpeedLR:
    """DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR over an optimizer's groups."""

    def __init__(self, optimizer, lr_of, last_batch_iteration=-1):
        self.optimizer, self.lr_of = optimizer, lr_of
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_batch_iteration = int(last_batch_iteration)
        self.step()

    def step(self):
        self.last_batch_iteration += 1
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = self.lr_of(self.last_batch_iteration, base)

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration, "base_lrs": self.base_lrs}

    def load_state_dict(self, d):
        self.base_lrs = list(d["base_lrs"])
        self.last_batch_iteration = d["last_batch_iteration"] - 1
        self.step()


class OffloadOptimizer(torch.optim.Optimizer):
    """model.optimizer (see the module docstring). Built by the offloaded module."""

    def __init__(self, owner, groups, defaults):
        self._owner = owner
        super().__init__(groups, defaults)

    def add_param_group(self, param_group):
        if getattr(self, "_sealed", False):
            raise ValueError("zinf: the offloaded optimizer's groups are fixed at offload(); "
                             "give every group then (param_groups=...)")
        for p in ([param_group["params"]] if isinstance(param_group["params"], torch.Tensor)
                  else param_group["params"]):
            if id(p) not in self._owner._param_ids:
                raise ValueError("zinf: a param group holds a tensor that is not a parameter "
                                 "of the offloaded module")
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._owner.optimizer_step()
        return loss

    def zero_grad(self, set_to_none=True):
        self._owner.zero_grad()

    def state_dict(self):
        groups, state, index = [], {}, {}
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                if id(p) not in index:
                    index[id(p)] = len(index)
                ids.append(index[id(p)])
                rec = p.__dict__["_zinf"]
                if rec.trainable and rec.step > 0:
                    state[index[id(p)]] = {"step": torch.tensor(float(rec.step)),
                                           "exp_avg": self._owner.read_state(rec, "exp_avg"),
                                           "exp_avg_sq": self._owner.read_state(rec,
                                                                                "exp_avg_sq")}
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        return {"state": state, "param_groups": groups, "zinf": self._owner.step_state()}

    def load_state_dict(self, state_dict):
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError("zinf: optimizer state_dict: its param groups do not match the "
                             "offloaded optimizer's (count or sizes)")
        for saved in groups:
            for k in ("amsgrad", "maximize", "capturable", "differentiable"):
                if saved.get(k):
                    raise ValueError(f"zinf: optimizer state_dict: a group has {k}=True, which "
                                     "zinf's Adam does not implement")
        for saved, g in zip(groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    g[k] = v
            for i, p in zip(saved["params"], g["params"]):
                rec = p.__dict__["_zinf"]
                if not rec.trainable:
                    continue
                s = state_dict["state"].get(i, state_dict["state"].get(str(i)))
                if s is None:  # no state there: a parameter not stepped yet, as in torch
                    zeros = torch.zeros(rec.shape)
                    self._owner.write_state(rec, "exp_avg", zeros)
                    self._owner.write_state(rec, "exp_avg_sq", zeros)
                    rec.step = 0
                    continue
                self._owner.write_state(rec, "exp_avg", s["exp_avg"])
                self._owner.write_state(rec, "exp_avg_sq", s["exp_avg_sq"])
                rec.step = int(float(s["step"]))
        if "zinf" in state_dict:  # the step counts, the loss scaler, the config's schedule
            self._owner.load_step_state(state_dict["zinf"])
