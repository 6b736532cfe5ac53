"""Checkpoints of an offloaded module in zinf's format (src/ckpt/manifest.h), so `zinf ckpt
verify | inspect | export` read them.

A checkpoint is `<root>/step-<step, 10 digits>/` holding `state.bin`, `buffers.bin` and
`manifest.json` (format "zinf-checkpoint", version 1). state.bin holds, per shard, its value
(role "master", fp32, for a trainable shard: the master weights, or the fp32 working copy; role
"param" for a frozen shard, in the working dtype) and for a trainable shard its two moments
("exp_avg", "exp_avg_sq", fp32), each at a 4096-byte boundary; buffers.bin the module's buffers
(BatchNorm's running statistics...). The manifest records each shard's file range and
xxHash64, the module ("model": kind "torch", every parameter's name, shape, dtype, unit, shard,
offset and optimizer group; every buffer's name, dtype, shape, range and hash), the optimizer's
groups and the step state (step counts, each parameter's Adam step, the fp16 loss scaler, the
config's schedule, the caller's client_state).

Crash-consistent as `zinf train`'s: the data is written and fsynced (and the directory) first,
then the manifest atomically (a temporary file, fsync, rename, directory fsync): a directory
holds a checkpoint exactly when its manifest.json exists. A save happens at the end of an
accumulation window (no gradient pending); it refuses a root holding checkpoints newer than its
step (another run's, or the run's future after loading an older one); `keep` deletes only
older checkpoints, after the new one is committed, and a save removes older directories left
without a manifest (a crashed save or prune). Unlike `zinf train`, NVMe-homed state is copied
into state.bin.

load reads a checkpoint directory, or a root's latest committed checkpoint, checks the module
against the recorded one (parameters, wrap, groups, buffers; refusing any difference, named),
then verifies every hash in a first pass over the files, and only then writes the state into
the tiers: a refused load changes nothing. The run then continues bit for bit.

Thread-safety: called by the model's thread between steps.
"""
import json
import os
import re
import shutil

import torch
from torch._C import DisableTorchFunction

from zinf import _lib

_ALIGN = 4096
_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_STEP_DIR = re.compile(r"^step-(\d{10})$")


def _xxh64(t):
    with DisableTorchFunction():
        t = t.contiguous()
        return _lib.lib.zinf_xxh64(t.data_ptr(), t.numel() * t.element_size())


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _model_record(model):
    store = model._store
    shards = store.shards
    index = {id(s): i for i, s in enumerate(shards)}
    params = []
    for r in model._order:
        params.append({"name": r.name, "shape": list(r.shape),
                       "dtype": str(r.orig_dtype).replace("torch.", ""),
                       "trainable": r.trainable, "unit": r.unit,
                       "shard": index[id(r.shard)], "offset": r.offset, "group": r.group})
    buffers = [{"name": n, "shape": list(b.shape), "dtype": str(b.dtype).replace("torch.", "")}
               for n, b in model.module.named_buffers()]
    return {"kind": "torch", "module": type(model.module).__name__,
            "precision": model._precision, "units": model.units,
            "shards": [{"unit": s.unit, "trainable": s.trainable, "numel": s.numel}
                       for s in shards],
            "groups": len(model.optimizer.param_groups), "adamw": model._adamw,
            "params": params, "buffers": buffers}


def _dump(obj, f=None, what="the manifest"):
    """JSON that zinf's C++ reader takes: no NaN or Infinity (refused, naming what)."""
    try:
        return json.dump(obj, f, indent=1, allow_nan=False) if f else json.dumps(
            obj, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"zinf: save_checkpoint: {what} is not JSON data (no NaN or Infinity "
                         f"either): {e}") from e


def _steps(root):
    """The step directories under root: (step, directory, committed)."""
    out = []
    if os.path.isdir(root):
        for name in os.listdir(root):
            m = _STEP_DIR.match(name)
            if m and os.path.isdir(os.path.join(root, name)):
                d = os.path.join(root, name)
                out.append((int(m.group(1)), d, os.path.exists(os.path.join(d, "manifest.json"))))
    return sorted(out)


def committed(root):
    """The committed checkpoints under root, (step, directory), by step."""
    return [(step, d) for step, d, done in _steps(root) if done]


def _remove(d):
    manifest = os.path.join(d, "manifest.json")
    if os.path.exists(manifest):
        os.remove(manifest)  # no longer a checkpoint, then its files
    shutil.rmtree(d)


def save(model, root, client_state=None, keep=None):
    store, stepper = model._store, model._stepper
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"zinf: save_checkpoint: keep={keep!r}; expected an integer >= 1 "
                         "(the latest checkpoints kept) or None (all)")
    pending = [r.name for r in model._order if r.grad_started]
    if pending or any(s.stepped for s in store.shards) or \
            stepper.micro_steps % stepper.cfg.gradient_accumulation_steps:
        raise RuntimeError(
            "zinf: save_checkpoint inside an accumulation window (gradients pending"
            + (f": {pending[:3]}" if pending else "") + "): save after model.step() ends a "
            "window (the gradients are not part of a checkpoint)")
    step = stepper.global_steps
    newer = [d for s_, d in committed(root) if s_ > step]
    if newer:
        raise FileExistsError(
            f"zinf: save_checkpoint: {root} holds checkpoints newer than this run's step {step} "
            f"({os.path.basename(newer[-1])}): another run's, or this run's future after "
            "loading an older one; save to another root, or delete them")
    d = os.path.join(root, f"step-{step:010d}")
    if os.path.exists(os.path.join(d, "manifest.json")):
        raise FileExistsError(f"zinf: save_checkpoint: {d} already holds the checkpoint of step "
                              f"{step}")
    groups = [{k: v for k, v in g.items() if k in ("lr", "betas", "eps", "weight_decay",
                                                   "bias_correction")}
              for g in model.optimizer.param_groups]
    _dump(client_state, what="client_state")
    _dump(groups, what="the optimizer's groups")
    _dump(stepper.state(), what="the step state")
    store.release_all()
    made = not os.path.isdir(root)
    os.makedirs(d, exist_ok=True)
    entries, offset = [], 0
    with open(os.path.join(d, "state.bin"), "wb") as f:
        for s in store.shards:
            kinds = [("master" if s.trainable else "param", "value")]
            if s.trainable:
                kinds += [("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")]
            for role, which in kinds:
                t = store.read_flat(s, which)
                with DisableTorchFunction():
                    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
                pad = (-offset) % _ALIGN
                f.write(b"\0" * pad)
                offset += pad
                f.write(raw)
                entries.append({"role": role, "unit": s.unit, "dtype": _DTYPE_NAMES[t.dtype],
                                "shape": [s.numel], "file": "state.bin", "offset": offset,
                                "length": len(raw), "xxh64": f"{_xxh64(t):016x}"})
                offset += len(raw)
        f.flush()
        os.fsync(f.fileno())
    record = _model_record(model)
    boffset = 0
    with open(os.path.join(d, "buffers.bin"), "wb") as f:
        for rec, (_, b) in zip(record["buffers"], model.module.named_buffers()):
            with DisableTorchFunction():
                t = b.detach().to("cpu").contiguous()
                raw = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            f.write(raw)
            rec.update({"offset": boffset, "length": len(raw), "xxh64": f"{_xxh64(t):016x}"})
            boffset += len(raw)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(d)  # the data files' entries, before the manifest names them
    _fsync_dir(root)
    if made:
        _fsync_dir(os.path.dirname(os.path.abspath(root)))
    manifest = {"format": "zinf-checkpoint", "format_version": 1, "step": step,
                "model": record,
                "training": {"adamw": model._adamw, "groups": groups,
                             "param16": model._precision},
                "data": {},
                "state": {"steps": stepper.state(),
                          "param_steps": {r.name: r.step for r in model._order if r.trainable},
                          "client": client_state},
                "world": {"size": 1, "partition": "none"},
                "files": [{"name": "state.bin", "kind": "data", "bytes": offset},
                          {"name": "buffers.bin", "kind": "data", "bytes": boffset}],
                "shards": entries}
    tmp = os.path.join(d, f".manifest.json.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        _dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(d, "manifest.json"))
    _fsync_dir(d)
    # Older leftovers: directories without a manifest (a crashed save, an interrupted prune),
    # and with keep, the older checkpoints beyond it.
    for s_, old, done in _steps(root):
        if s_ < step and not done:
            shutil.rmtree(old)
    if keep is not None:
        older = [x for x in committed(root) if x[0] < step]
        for _, old in older[:max(0, len(older) - (keep - 1))]:
            _remove(old)
    return d


def resolve(path):
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    found = committed(path)
    if not found:
        raise FileNotFoundError(f"zinf: load_checkpoint: {path} holds no committed checkpoint "
                                "(no manifest.json in it or in a step-<n> directory under it)")
    return found[-1][1]


def _read_checked(f, e, what, where, dtype):
    f.seek(e["offset"])
    raw = f.read(e["length"])
    if len(raw) != e["length"]:
        raise ValueError(f"zinf: load_checkpoint: {where} is short: {what} needs bytes "
                         f"{e['offset']}..{e['offset'] + e['length']}")
    t = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    if f"{_xxh64(t):016x}" != e["xxh64"]:
        raise ValueError(f"zinf: load_checkpoint: {where} at offset {e['offset']}: {what} does "
                         "not match its recorded xxHash64 (a corrupt checkpoint)")
    return t


def load(model, path):
    d = resolve(path)
    where = os.path.join(d, "manifest.json")
    with open(where) as f:
        m = json.load(f)
    if m.get("format") != "zinf-checkpoint" or m.get("format_version") != 1:
        raise ValueError(f"zinf: load_checkpoint: {where} is not a zinf checkpoint of version 1")
    if m.get("world", {}).get("size", 1) != 1:
        raise ValueError(f"zinf: load_checkpoint: {where} holds {m['world']['size']} ranks' "
                         "state; this model runs on one")
    want, got = m.get("model", {}), _model_record(model)
    if want.get("kind") != "torch":
        raise ValueError(f"zinf: load_checkpoint: {where} is a checkpoint of `zinf train`'s "
                         f"model ({want.get('kind', 'gpt2')}), not of a PyTorch module")
    diffs = []
    for key in ("precision", "units", "shards", "groups", "adamw"):
        if want.get(key) != got[key]:
            diffs.append(f"{key}: {want.get(key)} there, {got[key]} here")
    for key in ("params", "buffers"):
        strip = ("offset", "length", "xxh64") if key == "buffers" else ()
        wp = {p["name"]: {k: v for k, v in p.items() if k not in strip}
              for p in want.get(key, [])}
        gp = {p["name"]: p for p in got[key]}
        for name in sorted(set(wp) | set(gp)):
            if wp.get(name) != gp.get(name):
                diffs.append(f"{name}: {wp.get(name)} there, {gp.get(name)} here")
    sched = m["state"]["steps"].get("lr_scheduler")
    if (sched is None) != (model._stepper.lr_scheduler is None):
        diffs.append("scheduler: " + ("one there, none in this config" if sched is not None
                                      else "none there, one in this config"))
    if diffs:
        raise ValueError(f"zinf: load_checkpoint: {where} was written for another module, wrap "
                         "or optimizer: " + "; ".join(diffs[:8]) +
                         (" ..." if len(diffs) > 8 else ""))
    store, stepper = model._store, model._stepper
    by_key = {(e["role"], e["unit"]): e for e in m["shards"]}
    dtypes = {v: k for k, v in _DTYPE_NAMES.items()}
    state_bin, buffers_bin = os.path.join(d, "state.bin"), os.path.join(d, "buffers.bin")

    def each_shard(f, fn):
        for s in store.shards:
            roles = ["master" if s.trainable else "param"]
            if s.trainable:
                roles += ["exp_avg", "exp_avg_sq"]
            for role in roles:
                e = by_key.get((role, s.unit))
                if e is None:
                    raise ValueError(f"zinf: load_checkpoint: {where} has no {role} shard of "
                                     f"unit {s.unit}")
                fn(s, role, _read_checked(f, e, f"the {role} shard of unit {s.unit}", state_bin,
                                          dtypes[e["dtype"]]))

    def each_buffer(f, fn):
        for rec, (name, b) in zip(want["buffers"], model.module.named_buffers()):
            t = _read_checked(f, rec, f"buffer {name}", buffers_bin, b.dtype)
            fn(b, t.reshape(b.shape))
    # First every hash (nothing changes if one is wrong), then the state.
    with open(state_bin, "rb") as f:
        each_shard(f, lambda s, role, t: None)
    with open(buffers_bin, "rb") as f:
        each_buffer(f, lambda b, t: None)
    store.release_all()
    stepper.drop_all()
    with open(state_bin, "rb") as f:
        def put(s, role, t):
            if role in ("master", "param"):
                store.write_value(s, t)
            else:
                store.write_state(s, role, t)
        each_shard(f, put)

    def put_buffer(b, t):
        with torch.no_grad(), DisableTorchFunction():
            b.copy_(t)
    with open(buffers_bin, "rb") as f:
        each_buffer(f, put_buffer)
    state = m["state"]
    stepper.load_state(state["steps"])
    for r in model._order:
        if r.trainable:
            r.step = state["param_steps"][r.name]
    for g, saved in zip(model.optimizer.param_groups, m["training"]["groups"]):
        g.update({k: tuple(v) if k == "betas" else v for k, v in saved.items()})
    return state.get("client")
