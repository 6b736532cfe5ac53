"""The config of zinf.torch.offload: DeepSpeed's keys with DeepSpeed's meaning, every key
honored or refused.

The document (a dict or a JSON file's path) is the one `zinf train` and the C engine read: the
engine checks every value (types, ranges, unknown keys with a "did you mean"), then this module
takes what the PyTorch path acts on. KEYS below says, for every key, who honors it:
- "python": this package (the optimizer and its groups, the schedule, precision and loss
  scaling, clipping, accumulation, the homes);
- "engine": the C engine (budgets, the NVMe engine, swap files, prefetch). DeepSpeed's keys
  that have no effect in zinf (its staging-buffer sizes, its collectives' buckets) are the
  engine's too: accepted with one warning naming them unless they hold DeepSpeed's default (or
  what zinf does anyway), refused under zinf.strict;
- "refused": meaningful only to `zinf train` (its model, checkpoints, ranks) or not implemented;
  given with a value other than its default it is refused, naming the key.
docs/torch.md shows the table; tests/python/test_torch_config.py keeps the two equal.

What is absent takes DeepSpeed's default: no optimizer block is AdamW at lr 1e-3 unless the
caller gives keyword arguments; no scheduler block, a constant learning rate; neither fp16 nor
bf16 enabled, fp32 (or the module's own 16-bit dtype); no gradient_clipping, no clipping.
"""
import json
import math

# path: (who, what it does here). A path ending in ".*" covers a block's keys.
KEYS = {
    "optimizer.type": ("python", "Adam or AdamW (zinf's CPU Adam; Adam decays the AdamW way "
                                 "unless adam_w_mode is false, as in DeepSpeed)"),
    "optimizer.params.lr": ("python", "every param group's initial lr"),
    "optimizer.params.betas": ("python", "Adam's betas"),
    "optimizer.params.eps": ("python", "Adam's eps"),
    "optimizer.params.weight_decay": ("python", "weight decay of groups that do not set theirs"),
    "optimizer.params.bias_correction": ("python", "Adam's bias correction"),
    "optimizer.params.adam_w_mode": ("python", "false: L2 decay (torch.optim.Adam's)"),
    "optimizer.params.torch_adam": ("engine", "no effect: zinf's Adam runs either way (warned "
                                              "unless false)"),
    "optimizer.params.amsgrad": ("refused", "AMSGrad is not implemented (true is refused)"),
    "scheduler.*": ("python", "WarmupLR, WarmupDecayLR, WarmupCosineLR stepped after each "
                              "applied optimizer step (model.lr_scheduler)"),
    "fp16.enabled": ("python", "fp16 weights on the device, fp32 master and moments in the "
                               "tiers"),
    "fp16.loss_scale": ("python", "0: dynamic loss scaling; > 0: static"),
    "fp16.initial_scale_power": ("python", "dynamic scale starts at 2^power"),
    "fp16.loss_scale_window": ("python", "steps without overflow before the scale doubles"),
    "fp16.hysteresis": ("python", "overflows tolerated before the scale halves"),
    "fp16.consecutive_hysteresis": ("python", "refill the hysteresis on every good step"),
    "fp16.min_loss_scale": ("python", "the scale's floor"),
    "fp16.auto_cast": ("refused", "autocast of inputs is not implemented"),
    "fp16.fp16_master_weights_and_grads": ("refused", "the master weights are fp32"),
    "fp16.fused_mode": ("engine", "no effect (warned unless true)"),
    "bf16.enabled": ("python", "bf16 weights on the device, fp32 master and moments in the "
                               "tiers"),
    "bf16.immediate_grad_update": ("refused", "not implemented"),
    "bf16.check_grad_overflow": ("refused", "not implemented"),
    "bf16.bf16_master_weights_and_grads": ("refused", "the master weights are fp32"),
    "bf16.bf16_optimizer_states": ("refused", "the moments are fp32"),
    "gradient_clipping": ("python", "global-norm clipping in every optimizer step"),
    "torch_autocast.*": ("refused", "autocast is not implemented (enabled: true is refused)"),
    "amp.*": ("refused", "NVIDIA Apex AMP is not implemented (enabled: true is refused)"),
    "gradient_accumulation_steps": ("python", "model.backward scales by 1/steps and "
                                              "model.step steps every steps-th call"),
    "train_batch_size": ("python", "with train_micro_batch_size_per_gpu: the accumulation "
                                   "steps (train / micro / world)"),
    "train_micro_batch_size_per_gpu": ("python", "the batches you feed; only the accumulation "
                                                 "steps are derived from it"),
    "steps_per_print": ("python", "a progress line (step, skipped, lr) every N steps"),
    "wall_clock_breakdown": ("refused", "not implemented (true is refused)"),
    "zero_optimization.stage": ("python", "any stage: one rank pages like stage 3"),
    "zero_optimization.offload_param.device": ("python", "nvme or cpu: the weights' home "
                                                         "(none is refused)"),
    "zero_optimization.offload_param.nvme_path": ("engine", "the swap directory"),
    "zero_optimization.offload_param.pin_memory": ("engine", "no effect: zinf's host tier is "
                                                             "always pinned"),
    "zero_optimization.offload_param.buffer_count": ("engine", "no effect: DeepSpeed's staging "
                                                               "buffers (warned unless 5)"),
    "zero_optimization.offload_param.buffer_size": ("engine", "no effect: DeepSpeed's staging "
                                                              "buffers (warned unless 1e8)"),
    "zero_optimization.offload_param.max_in_cpu": ("engine", "no effect: DeepSpeed's staging "
                                                             "buffers (warned unless 1e9)"),
    "zero_optimization.offload_optimizer.device": ("python", "nvme or cpu: the master weights' "
                                                             "and moments' home (none is "
                                                             "refused)"),
    "zero_optimization.offload_optimizer.nvme_path": ("engine", "the swap directory"),
    "zero_optimization.offload_optimizer.pin_memory": ("engine", "no effect: zinf's host tier is "
                                                                 "always pinned"),
    "zero_optimization.offload_optimizer.buffer_count": ("engine", "no effect: DeepSpeed's "
                                                                   "staging buffers (warned "
                                                                   "unless 4)"),
    "zero_optimization.offload_optimizer.pipeline_read": ("engine", "no effect: zinf reads ahead "
                                                                    "always"),
    "zero_optimization.offload_optimizer.pipeline_write": ("engine", "no effect: zinf writes "
                                                                     "behind always"),
    "zero_optimization.stage3_prefetch_bucket_size": ("engine", "no effect: zinf prefetches "
                                                                "whole units, "
                                                                "zinf.prefetch_depth (warned "
                                                                "unless 5e7)"),
    "zero_optimization.stage3_max_live_parameters": ("engine", "no effect: "
                                                               "zinf.budgets.device_bytes bounds "
                                                               "the device tier (warned unless "
                                                               "1e9)"),
    "zero_optimization.sub_group_size": ("engine", "no effect: zinf steps a unit at a time "
                                                   "(warned unless 1e9)"),
    "zero_optimization.*": ("engine", "DeepSpeed's other ZeRO keys: warned by the engine, "
                                      "refused under zinf.strict"),
    "aio.*": ("engine", "the NVMe engine"),
    "zinf.budgets.device_bytes": ("engine", "the device tier's hard budget"),
    "zinf.budgets.pinned_bytes": ("engine", "the pinned host tier's hard budget"),
    "zinf.budgets.host_bytes": ("refused", "zinf train's placement only"),
    "zinf.prefetch_depth": ("engine", "units fetched ahead"),
    "zinf.max_inflight_bytes": ("engine", "speculative bytes in flight per link"),
    "zinf.stripe_paths": ("engine", "swap files striped over these directories"),
    "zinf.stripe_bytes": ("engine", "the stripe unit"),
    "zinf.swap_dir": ("engine", "the swap directory"),
    "zinf.write_behind": ("engine", "write dirty host copies home at once"),
    "zinf.eviction_policy": ("engine", "which resident copy goes when a tier is full"),
    "zinf.adam_threads": ("python", "CPU Adam threads"),
    "zinf.strict": ("engine", "refuse the keys without effect instead of warning"),
    "zinf.trace_file": ("refused", "zinf train's trace"),
    "zinf.pipeline_depth": ("refused", "zinf train's optimizer pipeline"),
    "zinf.overlap_adam": ("python", "each shard's Adam in the window's last backward, as soon "
                                    "as its gradients are final (clipping by the previous "
                                    "step's norm; fp16 refused)"),
    "zinf.seed": ("refused", "zinf train's initialisation; seed torch yourself"),
    "zinf.optimizer_state_dtype": ("refused", "the moments are fp32 here"),
    "zinf.optimizer_state_rounding": ("refused", "the moments are fp32 here"),
    "zinf.model.*": ("refused", "zinf train's GPT; here the model is your module"),
    "zinf.checkpoint.*": ("refused", "zinf train's checkpoints"),
    "zinf.comm.*": ("refused", "ranks are zinf train's for now"),
    "zinf.sharding_strategy": ("refused", "ranks are zinf train's for now"),
}

# The values a "refused" key may hold without asking for anything.
_NEUTRAL = {
    "optimizer.params.amsgrad": [False], "fp16.auto_cast": [False],
    "fp16.fp16_master_weights_and_grads": [False], "bf16.immediate_grad_update": [False],
    "bf16.check_grad_overflow": [False], "bf16.bf16_master_weights_and_grads": [False],
    "bf16.bf16_optimizer_states": [False], "wall_clock_breakdown": [False],
    "zinf.budgets.host_bytes": [None], "zinf.trace_file": [""], "zinf.pipeline_depth": [2],
    "zinf.overlap_adam": [False], "zinf.seed": [], "zinf.optimizer_state_dtype": ["fp32"],
    "zinf.optimizer_state_rounding": ["stochastic"], "zinf.sharding_strategy": ["", "FULL_SHARD"],
    "zinf.checkpoint.dir": [""], "zinf.checkpoint.every": [0], "zinf.checkpoint.keep": [1],
    "zinf.checkpoint.resume": [""], "zinf.checkpoint.verify_state_reads": [False],
    "zinf.comm.timeout_seconds": [300], "zinf.comm.check_sequence": [False],
    "zinf.comm.backend": ["gloo"],
    "torch_autocast.enabled": [False], "amp.enabled": [False],
}
_ALIASES = {"bfloat16": "bf16", "thread_count": "intra_op_parallelism",
            "prefetch_bucket_size": "stage3_prefetch_bucket_size",
            "max_live_parameters": "stage3_max_live_parameters"}


def _rule(path):
    if path in KEYS:
        return path
    if path + ".*" in KEYS:
        return path + ".*"
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        block = ".".join(parts[:i]) + ".*"
        if block in KEYS:
            return block
    return None


def _leaves(doc, prefix=""):
    for k, v in doc.items():
        k = _ALIASES.get(k, k)
        path = f"{prefix}{k}"
        if isinstance(v, dict) and path != "scheduler" and _rule(path) != path and v:
            yield from _leaves(v, path + ".")
        else:
            yield path, v


def load(config):
    """The document as a dict (a path is read as JSON)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return config
    with open(config) as f:
        return json.load(f)


def _get(doc, path, default=None):
    cur = doc
    for k in path.split("."):
        if not isinstance(cur, dict):
            return default
        if k in cur:
            cur = cur[k]
        elif k == "bf16" and "bfloat16" in cur:
            cur = cur["bfloat16"]
        else:
            return default
    return default if cur == "auto" else cur


class TorchConfig:
    """What the PyTorch path takes from a document. Raises ValueError naming the key."""

    def __init__(self, doc, source="config", world_size=1):
        self.source = source
        refused = []
        for path, value in _leaves(doc):
            rule = _rule(path)
            if rule is None or KEYS[rule][0] != "refused":
                continue
            neutral = _NEUTRAL.get(path, _NEUTRAL.get(rule, []))
            if value == "auto" or value is None or value in neutral:
                continue
            refused.append((path, value, rule))
        if refused:
            raise ValueError(f"zinf.torch.offload: {source}: " + "; ".join(
                f"{p}={json.dumps(v)} has no effect in the PyTorch path ({KEYS[r][1]}); expected "
                "it removed" for p, v, r in refused))

        # Optimizer.
        self.optimizer = None
        if isinstance(doc.get("optimizer"), dict):
            t = doc["optimizer"].get("type", "AdamW")
            if t.lower() not in ("adam", "adamw"):
                raise ValueError(f"zinf.torch.offload: {source}: optimizer.type {t!r}; expected "
                                 "\"Adam\" or \"AdamW\"")
            betas = _get(doc, "optimizer.params.betas", [0.9, 0.999])
            adam_w_mode = bool(_get(doc, "optimizer.params.adam_w_mode", True))
            self.optimizer = dict(
                lr=float(_get(doc, "optimizer.params.lr", 1e-3)),
                betas=(float(betas[0]), float(betas[1])),
                eps=float(_get(doc, "optimizer.params.eps", 1e-8)),
                weight_decay=float(_get(doc, "optimizer.params.weight_decay", 0.0)),
                bias_correction=bool(_get(doc, "optimizer.params.bias_correction", True)),
                adamw_mode=t.lower() == "adamw" or adam_w_mode)
        self.scheduler = doc.get("scheduler") or None

        # Precision.
        fp16 = bool(_get(doc, "fp16.enabled", False))
        bf16 = bool(_get(doc, "bf16.enabled", False))
        if fp16 and bf16:
            raise ValueError(f"zinf.torch.offload: {source}: fp16.enabled and bf16.enabled are "
                             "both true; expected at most one")
        self.precision = "fp16" if fp16 else "bf16" if bf16 else None
        self.fp16 = dict(
            loss_scale=float(_get(doc, "fp16.loss_scale", 0.0)),
            initial_scale_power=int(_get(doc, "fp16.initial_scale_power", 16)),
            loss_scale_window=int(_get(doc, "fp16.loss_scale_window", 1000)),
            hysteresis=int(_get(doc, "fp16.hysteresis", 2)),
            consecutive_hysteresis=bool(_get(doc, "fp16.consecutive_hysteresis", False)),
            min_loss_scale=float(_get(doc, "fp16.min_loss_scale", 1.0)))

        self.gradient_clipping = float(_get(doc, "gradient_clipping", 0.0))
        self.overlap_adam = bool(_get(doc, "zinf.overlap_adam", False))
        self.steps_per_print = _get(doc, "steps_per_print")
        self.adam_threads = _get(doc, "zinf.adam_threads")
        gas = _get(doc, "gradient_accumulation_steps")
        train = _get(doc, "train_batch_size")
        micro = _get(doc, "train_micro_batch_size_per_gpu")
        if gas is None and train is not None and micro is not None:
            if train % (micro * world_size):
                raise ValueError(f"zinf.torch.offload: {source}: train_batch_size {train} is not "
                                 f"a multiple of train_micro_batch_size_per_gpu {micro} x "
                                 f"{world_size} rank(s)")
            gas = train // (micro * world_size)
        self.gradient_accumulation_steps = int(gas or 1)

        # Homes.
        def home(key):
            d = _get(doc, f"zero_optimization.{key}.device")
            if d is None:
                return None
            if d == "none":
                raise ValueError(
                    f"zinf.torch.offload: {source}: zero_optimization.{key}.device \"none\": the "
                    "PyTorch path keeps this state in zinf's tiers; expected \"cpu\" (pinned "
                    "host memory) or \"nvme\"")
            return {"cpu": "host", "nvme": "nvme"}[d]
        self.param_home = home("offload_param")
        self.state_home = home("offload_optimizer")


def doc_table():
    """The table of KEYS as docs/torch.md shows it."""
    lines = ["| key | honored by | in the PyTorch path |", "| --- | --- | --- |"]
    for path, (who, what) in KEYS.items():
        lines.append(f"| `{path}` | {who} | {what} |")
    return "\n".join(lines) + "\n"


def lr_schedule(cfg, base_lr):
    """DeepSpeed's schedule as a function of the applied step (0, 1, ...) to a factor of each
    group's base lr, or None. The formulas are zinf train's (src/train/lr_schedule.cc)."""
    s = cfg
    if s is None:
        return None
    t = s.get("type")
    p = s.get("params", {}) or {}
    p = {k: v for k, v in p.items() if v != "auto"}
    warmup = max(2, int(p.get("warmup_num_steps", 1000)))
    log_warmup = p.get("warmup_type", "log") == "log"
    inv_log = 1.0 / math.log(warmup)

    def gamma_w(step):
        return inv_log * math.log(step + 1.0) if log_warmup else step / warmup

    if t in ("WarmupDecayLR", "WarmupCosineLR"):
        if "total_num_steps" not in p:
            raise ValueError(f"zinf.torch.offload: scheduler.params.total_num_steps: absent; "
                             f"{t} needs the run's total step count here (zinf train takes its "
                             "own)")
        total = int(p["total_num_steps"])
    if t in ("WarmupLR", "WarmupDecayLR"):
        lo = float(p.get("warmup_min_lr", 0.0))

        def lr_of(step, base):
            hi = float(p.get("warmup_max_lr", base))
            if step < warmup:
                g = gamma_w(step)
            elif t == "WarmupLR":
                g = 1.0
            else:
                g = max(0.0, (total - step) / max(1.0, total - warmup))
            return lo + (hi - lo) * g
        return lr_of
    if t == "WarmupCosineLR":
        wmin = float(p.get("warmup_min_ratio", 0.0))
        cmin = float(p.get("cos_min_ratio", 0.0001))

        def lr_of(step, base):
            if step < warmup:
                r = wmin + gamma_w(step) * (1.0 - wmin)
            else:
                k = step - warmup + 1.0
                n = total - warmup
                c = 0.0 if n == 0 else (1.0 + math.cos(math.pi * k / n)) / 2.0
                r = max(0.0, cmin + (1.0 - cmin) * c)
            return base * r
        return lr_of
    raise ValueError(f"zinf.torch.offload: scheduler.type {t!r}; expected WarmupLR, "
                     "WarmupDecayLR or WarmupCosineLR")
