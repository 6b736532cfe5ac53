"""Checkpoints of an offloaded module in zinf's format (src/ckpt/manifest.h), so `zinf ckpt
verify | inspect | export` read them.

A checkpoint is `<root>/step-<step, 10 digits>/` holding `state.bin` and `manifest.json`
(format "zinf-checkpoint", version 1). state.bin holds, per shard, its value (role "master",
fp32, for a trainable shard: the master weights, or the fp32 working copy; role "param" for a
frozen shard, in the working dtype) and for a trainable shard its two moments ("exp_avg",
"exp_avg_sq", fp32), each at a 4096-byte boundary; the manifest records each one's file range
and xxHash64, the module ("model": kind "torch", every parameter's name, shape, dtype, unit,
shard and offset), the optimizer's groups and the step state (step counts, each parameter's Adam
step, the fp16 loss scaler, the config's schedule, the caller's client_state). Crash-consistent
as `zinf train`'s: the data is written and fsynced first, then the manifest atomically (a
temporary file, fsync, rename, directory fsync): a directory holds a checkpoint exactly when its
manifest.json exists. Unlike `zinf train`, NVMe-homed state is copied into state.bin.

load reads a checkpoint directory, or a root's latest committed checkpoint, checks the module
against the recorded one (refusing any difference, named), every shard's hash as it reads it,
and writes the state into the tiers: the run then continues bit for bit.

Thread-safety: called by the model's thread between steps.
"""
import json
import os
import re

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
                       "shard": index[id(r.shard)], "offset": r.offset})
    return {"kind": "torch", "module": type(model.module).__name__,
            "precision": model._precision, "units": model.units,
            "shards": [{"unit": s.unit, "trainable": s.trainable, "numel": s.numel}
                       for s in shards],
            "params": params}


def committed(root):
    """The committed checkpoints under root, (step, directory), by step."""
    out = []
    if os.path.isdir(root):
        for name in os.listdir(root):
            m = _STEP_DIR.match(name)
            if m and os.path.exists(os.path.join(root, name, "manifest.json")):
                out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def save(model, root, client_state=None, keep=None):
    store, stepper = model._store, model._stepper
    store.release_all()
    step = stepper.global_steps
    d = os.path.join(root, f"step-{step:010d}")
    if os.path.exists(os.path.join(d, "manifest.json")):
        raise FileExistsError(f"zinf: save_checkpoint: {d} already holds the checkpoint of step "
                              f"{step}")
    os.makedirs(d, exist_ok=True)
    entries, offset = [], 0
    data = os.path.join(d, "state.bin")
    with open(data, "wb") as f:
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
    try:
        json.dumps(client_state)
    except TypeError as e:
        raise TypeError(f"zinf: save_checkpoint: client_state must be JSON data: {e}") from e
    groups = [{k: v for k, v in g.items() if k in ("lr", "betas", "eps", "weight_decay",
                                                   "bias_correction")}
              for g in model.optimizer.param_groups]
    manifest = {"format": "zinf-checkpoint", "format_version": 1, "step": step,
                "model": _model_record(model),
                "training": {"adamw": model._adamw, "groups": groups,
                             "param16": model._precision},
                "data": {},
                "state": {"steps": stepper.state(),
                          "param_steps": {r.name: r.step for r in model._order if r.trainable},
                          "client": client_state},
                "world": {"size": 1, "partition": "none"},
                "files": [{"name": "state.bin", "kind": "data", "bytes": offset}],
                "shards": entries}
    tmp = os.path.join(d, f".manifest.json.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(d, "manifest.json"))
    _fsync_dir(d)
    _fsync_dir(root)
    if keep is not None:
        for _, old in committed(root)[:-keep]:
            os.remove(os.path.join(old, "manifest.json"))  # no longer a checkpoint, then
            for name in os.listdir(old):                   # its files
                os.remove(os.path.join(old, name))
            os.rmdir(old)
    return d


def resolve(path):
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    found = committed(path)
    if not found:
        raise FileNotFoundError(f"zinf: load_checkpoint: {path} holds no committed checkpoint "
                                "(no manifest.json in it or in a step-<n> directory under it)")
    return found[-1][1]


def load(model, path):
    d = resolve(path)
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    where = os.path.join(d, "manifest.json")
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
    for key in ("precision", "units", "shards"):
        if want.get(key) != got[key]:
            diffs.append(f"{key}: {want.get(key)} there, {got[key]} here")
    wp = {p["name"]: p for p in want.get("params", [])}
    gp = {p["name"]: p for p in got["params"]}
    for name in sorted(set(wp) | set(gp)):
        if wp.get(name) != gp.get(name):
            diffs.append(f"{name}: {wp.get(name)} there, {gp.get(name)} here")
    if diffs:
        raise ValueError(f"zinf: load_checkpoint: {where} was written for another module or "
                         "wrap: " + "; ".join(diffs[:8]) + (" ..." if len(diffs) > 8 else ""))
    store, stepper = model._store, model._stepper
    store.release_all()
    stepper.drop_all()
    by_key = {}
    for e in m["shards"]:
        by_key[(e["role"], e["unit"])] = e
    dtypes = {v: k for k, v in _DTYPE_NAMES.items()}
    with open(os.path.join(d, "state.bin"), "rb") as f:
        def read(role, s):
            e = by_key.get((role, s.unit))
            if e is None:
                raise ValueError(f"zinf: load_checkpoint: {where} has no {role} shard of unit "
                                 f"{s.unit}")
            f.seek(e["offset"])
            raw = f.read(e["length"])
            if len(raw) != e["length"]:
                raise ValueError(f"zinf: load_checkpoint: {d}/state.bin is short: the {role} "
                                 f"shard of unit {s.unit} needs bytes {e['offset']}.."
                                 f"{e['offset'] + e['length']}")
            t = torch.frombuffer(bytearray(raw), dtype=dtypes[e["dtype"]])
            if f"{_xxh64(t):016x}" != e["xxh64"]:
                raise ValueError(f"zinf: load_checkpoint: {d}/state.bin at offset {e['offset']}: "
                                 f"the {role} shard of unit {s.unit} does not match its "
                                 "recorded xxHash64 (a corrupt checkpoint)")
            return t
        for s in store.shards:
            store.write_value(s, read("master" if s.trainable else "param", s))
            if s.trainable:
                store.write_state(s, "exp_avg", read("exp_avg", s))
                store.write_state(s, "exp_avg_sq", read("exp_avg_sq", s))
    state = m["state"]
    stepper.load_state(state["steps"])
    for r in model._order:
        if r.trainable:
            r.step = state["param_steps"][r.name]
    for g, saved in zip(model.optimizer.param_groups, m["training"]["groups"]):
        g.update({k: tuple(v) if k == "betas" else v for k, v in saved.items()})
    return state.get("client")
