"""The state of an offloaded module in and out (a mixin of OffloadedModule): state_dict and
load_state_dict over the tiers (each shard read or staged once per call), the optimizer's
moments one parameter at a time, checkpoints (_checkpoint.py) and the bytes registered.

Thread-safety: the model's thread, between steps.
"""
import torch
from torch._C import DisableTorchFunction

from zinf.torch import _checkpoint


class StateMixin:
    def _value(self, rec):
        """rec's value read from the tiers (a CPU tensor of its original dtype); each shard is
        read once per state_dict call."""
        flat = self._cache.get(id(rec.shard))
        if flat is None:
            flat = self._cache[id(rec.shard)] = self._store.read_flat(rec.shard)
        with DisableTorchFunction():
            return rec.region(flat).to(rec.orig_dtype).clone()

    def _staged(self, shard):
        flat = self._cache.get(id(shard))
        if flat is None:
            flat = self._cache[id(shard)] = self._store.read_flat(shard).float()
        return flat

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """The module's state dict (the keys of the module given to offload(), not this
        wrapper's), every parameter a CPU tensor of its value read from the tiers."""
        if args:
            raise TypeError("zinf: state_dict takes keyword arguments only")
        if keep_vars:
            raise ValueError("zinf: state_dict(keep_vars=True) would hand out placeholders; the "
                             "values are read from the tiers")
        self._store.release_all()
        self._gathering = True
        try:
            return type(self.module).state_dict(self.module, destination=destination,
                                                 prefix=prefix, keep_vars=False)
        finally:
            self._gathering = False
            self._cache = {}

    def load_state_dict(self, state_dict, strict=True):
        """Writes a state dict (the module's keys) into the tiers."""
        self._store.release_all()
        self._loading = True
        try:
            result = type(self.module).load_state_dict(self.module, state_dict, strict=strict)
            for s in self._store.shards:
                flat = self._cache.get(id(s))
                if flat is not None:
                    self._store.write_value(s, flat)
            return result
        finally:
            self._loading = False
            self._cache = {}

    def save_checkpoint(self, root, client_state=None, keep=None):
        """A crash-consistent checkpoint in zinf's format under `root` (step-<n>/): the
        weights, the Adam state, the step state and `client_state` (JSON data); `keep`: the
        latest checkpoints kept (older ones deleted). Returns its directory. _checkpoint.py."""
        return _checkpoint.save(self, root, client_state, keep)

    def load_checkpoint(self, path):
        """Loads a checkpoint directory, or the latest under a root, written for this module
        and wrap; returns its client_state."""
        return _checkpoint.load(self, path)

    def read_state(self, rec, which):
        self._store.release_all()
        return rec.region(self._store.read_flat(rec.shard, which)).clone()

    def write_state(self, rec, which, value):
        with DisableTorchFunction():
            v = value.detach().to("cpu", torch.float32)
        if tuple(v.shape) != rec.shape:
            raise ValueError(f"zinf: {which} of {rec.name}: shape {tuple(v.shape)}; expected "
                             f"{rec.shape}")
        flat = self._store.read_flat(rec.shard, which)
        rec.region(flat).copy_(v)
        self._store.write_state(rec.shard, which, flat)

    def state_bytes(self):
        """Bytes registered in the tiers per role: param (the working copies), master,
        exp_avg, exp_avg_sq, grad."""
        el = torch.empty(0, dtype=self._wdtype).element_size()
        out = {"param": 0, "master": 0, "exp_avg": 0, "exp_avg_sq": 0, "grad": 0}
        for s in self._store.shards:
            out["param"] += s.numel * el
            if s.trainable:
                out["master"] += s.numel * 4 if s.master is not None else 0
                for k in ("exp_avg", "exp_avg_sq", "grad"):
                    out[k] += s.numel * 4
        return out

