"""zinf.Engine: the C ABI's engine (include/zinf/zinf.h) from Python: tensors registered with a
home (pinned memory or NVMe), leased in the device or host tier under the hard budgets of a
JSON config with zinf train's keys, prefetched by the trace of the caller's loop.

    e = zinf.Engine({"zinf": {"swap_dir": "/nvme/x", "budgets": {"device_bytes": "1G"}}})
    w = e.register("layer0.weight", nbytes, role="param", home="nvme", unit=0)
    e.write(w, tensor)                      # its content, at its home
    lease = e.acquire(w, "device")          # returns at once; the fetch runs behind
    ptr = e.wait(lease)                     # the address while leased
    e.release(lease, dirty=True)
    e.end_step()                            # the first one ends the prefetcher's trace

Every failure raises zinf.ZinfError naming what failed. Calls release the GIL while zinf works.
"""
import ctypes
import json

from zinf import _lib

_ROLES = {"param": _lib.ROLE_PARAM, "master": _lib.ROLE_MASTER, "exp_avg": _lib.ROLE_EXP_AVG,
          "exp_avg_sq": _lib.ROLE_EXP_AVG_SQ, "grad": _lib.ROLE_GRAD}
_TIERS = {"device": _lib.TIER_DEVICE, "host": _lib.TIER_HOST, "nvme": _lib.TIER_NVME}
_MODES = {"read": _lib.ACQUIRE_READ, "overwrite": _lib.ACQUIRE_OVERWRITE,
          "untraced": _lib.ACQUIRE_UNTRACED}


def _pick(table, value, what):
    if value in table:
        return table[value]
    raise ValueError(f"zinf.Engine: {what} {value!r}; expected one of {sorted(table)}")


class Engine:
    """config: a dict (zinf train's keys), a path to a JSON file, or None (the defaults).
    device_leases / host_leases: {role: leases held at once in that tier}, roles missing from
    a dict given keep zinf's defaults (device: param 4, grad 4; host: 4 each); 0 means never
    leased there. device: "auto", "host" or "cuda"."""

    def __init__(self, config=None, device_leases=None, host_leases=None, device="auto"):
        p = _lib.EngineParams()
        p.size = ctypes.sizeof(_lib.EngineParams)
        self._keep = []  # the bytes the params point to, alive through the call
        if isinstance(config, dict):
            text = json.dumps(config).encode()
            self._keep.append(text)
            p.config_json = text
        elif config is not None:
            path = str(config).encode()
            self._keep.append(path)
            p.config_path = path
        for i, n in enumerate((4, 0, 0, 0, 4)):
            p.device_leases[i] = n
        for i in range(_lib.ROLES):
            p.host_leases[i] = 4
        for leases, arr in ((device_leases, p.device_leases), (host_leases, p.host_leases)):
            for role, n in (leases or {}).items():
                arr[_pick(_ROLES, role, "role")] = n
        dev = device.encode()
        p.device = dev
        h = ctypes.c_void_p()
        _lib.check(_lib.lib.zinf_engine_open(ctypes.byref(p), ctypes.byref(h)))
        self._h = h

    def close(self):
        """Drops unflushed changes (flush() first to keep them) and deletes the swap file."""
        if self._h:
            h, self._h = self._h, None
            _lib.check(_lib.lib.zinf_engine_close(h))

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.lib.zinf_engine_close(self._h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _engine(self):
        if not self._h:
            raise ValueError("zinf.Engine: the engine is closed")
        return self._h

    def register(self, name, nbytes, role="param", home="nvme", unit=0):
        spec = _lib.TensorSpec(ctypes.sizeof(_lib.TensorSpec), name.encode(), nbytes,
                               _pick(_ROLES, role, "role"), _pick(_TIERS, home, "home"), unit)
        out = ctypes.c_uint64()
        _lib.check(_lib.lib.zinf_tensor_register(self._engine(), ctypes.byref(spec),
                                                 ctypes.byref(out)))
        return out.value

    def seal(self):
        _lib.check(_lib.lib.zinf_engine_seal(self._engine()))

    def write(self, tensor_id, src):
        """src: a contiguous CPU tensor (or an address) holding the tensor's bytes."""
        _lib.check(_lib.lib.zinf_tensor_write(self._engine(), tensor_id, _address(src)))

    def read(self, tensor_id, dst):
        _lib.check(_lib.lib.zinf_tensor_read(self._engine(), tensor_id, _address(dst)))

    def discard(self, tensor_id):
        _lib.check(_lib.lib.zinf_tensor_discard(self._engine(), tensor_id))

    def acquire(self, tensor_id, tier="device", mode="read"):
        out = ctypes.c_uint64()
        _lib.check(_lib.lib.zinf_acquire(self._engine(), tensor_id, _pick(_TIERS, tier, "tier"),
                                         _pick(_MODES, mode, "mode"), ctypes.byref(out)))
        return out.value

    def wait(self, lease):
        ptr = ctypes.c_void_p()
        _lib.check(_lib.lib.zinf_lease_wait(self._engine(), lease, ctypes.byref(ptr)))
        return ptr.value

    def release(self, lease, dirty=False):
        _lib.check(_lib.lib.zinf_release(self._engine(), lease, 1 if dirty else 0))

    def end_step(self):
        _lib.check(_lib.lib.zinf_engine_end_step(self._engine()))

    def pause_trace(self, paused=True):
        _lib.check(_lib.lib.zinf_engine_pause_trace(self._engine(), 1 if paused else 0))

    def flush(self):
        _lib.check(_lib.lib.zinf_engine_flush(self._engine()))

    def stats(self):
        out = ctypes.c_char_p()
        _lib.check(_lib.lib.zinf_engine_stats(self._engine(), ctypes.byref(out)))
        return json.loads(out.value.decode())

    def adam_step(self, adam, step, lr, param, grad_ptr, grad_dtype, exp_avg, exp_avg_sq,
                  param16=_lib.NO_TENSOR, param16_dtype=_lib.DTYPE_BF16):
        """One Adam step over registered tensors (adam: a zinf_adam handle)."""
        _lib.check(_lib.lib.zinf_engine_adam_step(self._engine(), adam, step, lr, param,
                                                  grad_ptr, grad_dtype, exp_avg, exp_avg_sq,
                                                  param16, param16_dtype))


def _address(t):
    if isinstance(t, int):
        return t
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("zinf.Engine: expected a contiguous CPU tensor")
    return t.data_ptr()
