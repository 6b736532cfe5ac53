"""Building an offloaded module: the precision, the optimizer's groups, the parameter records,
and the shards of each wrap unit (zinf.torch._module uses these once, at offload()).

Thread-safety: pure functions over the caller's module.
"""
import torch

from zinf.torch._shards import Param, Shard

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def pick_precision(module, cfg):
    dtypes = {p.dtype for p in module.parameters()}
    if len(dtypes) > 1:
        raise ValueError(f"zinf.torch.offload: the module's parameters mix "
                         f"{sorted(map(str, dtypes))}; expected one dtype")
    own = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(next(iter(dtypes), None),
                                                              "fp32")
    if cfg.precision is not None:
        if own != "fp32" and own != cfg.precision:
            raise ValueError(f"zinf.torch.offload: the module is {own} but the config "
                             f"enables {cfg.precision}")
        return cfg.precision
    if own == "fp16":
        raise ValueError("zinf.torch.offload: the module is float16 and the config does not "
                         "enable fp16: fp16 training needs loss scaling; set "
                         "\"fp16\": {\"enabled\": true}")
    return own

def build_groups(module, cfg, param_groups, optimizer, kwargs, adamw_mode):
    given = {k: v for k, v in kwargs.items() if v is not None}
    if adamw_mode is not None:
        given["adamw_mode"] = adamw_mode
    if cfg.optimizer is not None and (given or optimizer is not None):
        raise ValueError("zinf.torch.offload: the config has an optimizer block and the "
                         f"call gives {'an optimizer' if optimizer is not None else sorted(given)}"
                         "; give the optimizer one way (DeepSpeed refuses both too)")
    if optimizer is not None and (given or param_groups is not None):
        raise ValueError("zinf.torch.offload: optimizer= carries its groups and "
                         "hyper-parameters; do not give param_groups or lr/betas/... too")
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
              bias_correction=True, adamw_mode=True)
    if cfg.optimizer is not None:
        hp.update(cfg.optimizer)
    hp.update(given)
    groups = None
    if optimizer is not None:
        groups, hp = adopt(optimizer)
    elif param_groups is not None:
        named = dict(module.named_parameters())
        groups = []
        for g in param_groups:
            if not isinstance(g, dict) or "params" not in g:
                raise ValueError("zinf.torch.offload: param_groups must be a list of dicts "
                                 "with 'params' (as torch.optim takes them)")
            ps = g["params"]
            ps = [ps] if isinstance(ps, (torch.Tensor, str)) else list(ps)
            resolved = []
            for p in ps:
                if isinstance(p, str):
                    if p not in named:
                        raise ValueError(f"zinf.torch.offload: param group names {p!r}, "
                                         "not a parameter of the module")
                    p = named[p]
                resolved.append(p)
            unknown = {k for k in g if k not in ("params", "lr", "betas", "eps",
                                                 "weight_decay", "bias_correction")}
            if unknown:
                raise ValueError(f"zinf.torch.offload: param group keys {sorted(unknown)}; "
                                 "expected lr, betas, eps, weight_decay, bias_correction")
            groups.append({**g, "params": resolved})
    if groups is None:
        groups = [{"params": [p for p in module.parameters()]}]
    ids = {id(p) for p in module.parameters()}
    in_groups = set()
    for g in groups:
        for p in g["params"]:
            if id(p) not in ids:
                raise ValueError("zinf.torch.offload: a param group holds a tensor that is "
                                 "not a parameter of the module")
            in_groups.add(id(p))
    left = [n for n, p in module.named_parameters() if p.requires_grad and
            id(p) not in in_groups]
    if left:
        raise ValueError(f"zinf.torch.offload: {left[:5]}{'...' if len(left) > 5 else ''} "
                         "require grad but are in no param group, so no optimizer would "
                         "step them; add them to a group, or set requires_grad=False to "
                         "freeze them (then they get no gradient and no optimizer state)")
    adamw = hp.pop("adamw_mode")
    defaults = dict(hp)
    return groups, defaults, adamw

def adopt(opt):
    """An existing torch.optim.Adam/AdamW or zinf.optim.CPUAdam's groups (shared, not copied)
    and defaults; the caller takes its state after."""
    from zinf.optim import CPUAdam
    if isinstance(opt, CPUAdam):
        adamw = opt.adamw_mode
    elif type(opt) is torch.optim.AdamW:
        adamw = True
    elif type(opt) is torch.optim.Adam:
        adamw = False
    else:
        raise ValueError(f"zinf.torch.offload: optimizer {type(opt).__name__}: zinf steps "
                         "its state with its CPU Adam; expected torch.optim.Adam, "
                         "torch.optim.AdamW or zinf.optim.CPUAdam")
    for g in opt.param_groups:
        for k in ("amsgrad", "maximize", "capturable", "differentiable"):
            if g.get(k):
                raise ValueError(f"zinf.torch.offload: the optimizer's {k}=True is not "
                                 "implemented by zinf's Adam")
    # Its group dicts themselves: a scheduler attached to `opt` keeps driving the lr.
    groups = opt.param_groups
    d = opt.defaults
    hp = dict(lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
              bias_correction=d.get("bias_correction", True), adamw_mode=adamw)
    return groups, hp


def records(owner, module):
    """A Param per parameter (tied weights once, under their first name), in
    named_parameters() order; and every name each has."""
    owners = {}
    for mname, m in module.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            owners.setdefault(id(p), (f"{mname}.{pname}" if mname else pname,
                                      mname or "<root>", type(m).__name__))
    params, by_id = {}, {}
    for name, p in module.named_parameters():
        if p.dtype not in DTYPES:
            raise ValueError(f"zinf.torch.offload: parameter {name} is {p.dtype}; expected "
                             "float32, bfloat16 or float16")
        full, mname, mcls = owners[id(p)]
        rec = Param(owner, full, p, mname, mcls)
        by_id[id(p)] = rec
        params[full] = rec
    names = {}
    for mname, m in module.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            names[f"{mname}.{pname}" if mname else pname] = by_id[id(p)]
    return params, names, by_id


def ancestors(root, units):
    """For each unit, the indices of the units whose subtree contains it."""
    index = {id(m): i for i, (_, m) in enumerate(units)}
    out = [[] for _ in units]

    def visit(m, above):
        i = index.get(id(m))
        if i is not None:
            out[i] = list(above)
            above = above + [i]
        for c in m.children():
            visit(c, above)
    visit(root, [])
    return out


def layout(module, units, unit_names, sets, by_id):
    """The shards (each unit's own trainable and frozen parameters), the shards each unit's
    forward holds, and the most shards a forward holds at once (a unit, the units around it
    and the root)."""
    shards, unit_shards = [], []
    for i, params in enumerate(sets):
        recs = [by_id[id(p)] for p in params]
        for r in recs:
            r.units.append(unit_names[i])
            if r.unit is None:
                r.unit = i
        for trainable in (True, False):
            own = [r for r in recs if r.unit == i and r.trainable == trainable]
            if own:
                kind = "" if trainable else ".frozen"
                shards.append(Shard(f"{unit_names[i]}{kind}", i, own, trainable))
    for params in sets:
        unit_shards.append(list(dict.fromkeys(by_id[id(p)].shard for p in params)))
    root = len(unit_names) - 1
    above = ancestors(module, units)
    peak = len(unit_shards[root])
    for i in range(len(units)):
        held = set(unit_shards[i]) | set(unit_shards[root])
        for a in above[i]:
            held |= set(unit_shards[a])
        peak = max(peak, len(held))
    return shards, unit_shards, peak
