"""ctypes bindings of zinf's C ABI (include/zinf/zinf.h): loading libzinf.so and turning every
failed call into a ZinfError carrying the status code and zinf's message.

The library is found, in order: $ZINF_LIBRARY, libzinf.so next to this package, then the
system's loader path. ctypes releases the GIL around every call into it.
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))

ZINF_OK = 0
ZINF_E_FAILED_PRECONDITION = -6
ZINF_E_OUT_OF_RANGE = -7
DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2


class ZinfError(RuntimeError):
    """A zinf call failed: `status` is its ZINF_E_* code, the message zinf's (naming what)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _load():
    candidates = []
    if os.environ.get("ZINF_LIBRARY"):
        candidates.append(os.environ["ZINF_LIBRARY"])
    candidates.append(os.path.join(_HERE, "libzinf.so"))
    candidates.append("libzinf.so")
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("zinf: cannot load libzinf.so (set ZINF_LIBRARY to its path): " +
                      "; ".join(errors))


lib = _load()

_c = ctypes
lib.zinf_version.restype = _c.c_char_p
lib.zinf_version_number.restype = _c.c_int
lib.zinf_strerror.argtypes = [_c.c_int]
lib.zinf_strerror.restype = _c.c_char_p
lib.zinf_last_error.restype = _c.c_char_p
lib.zinf_xxh64.argtypes = [_c.c_void_p, _c.c_uint64]
lib.zinf_xxh64.restype = _c.c_uint64
lib.zinf_pinned_alloc.argtypes = [_c.c_uint64, _c.POINTER(_c.c_void_p)]
lib.zinf_pinned_free.argtypes = [_c.c_void_p]


class IoParams(_c.Structure):
    _fields_ = [("size", _c.c_uint64), ("block_size", _c.c_uint64),
                ("queue_depth", _c.c_uint32), ("direct", _c.c_uint32),
                ("engine", _c.c_char_p)]


class AdamParams(_c.Structure):
    _fields_ = [("size", _c.c_uint64), ("lr", _c.c_float), ("beta1", _c.c_float),
                ("beta2", _c.c_float), ("eps", _c.c_float), ("weight_decay", _c.c_float),
                ("adamw", _c.c_uint32), ("bias_correction", _c.c_uint32),
                ("threads", _c.c_uint32)]


class AdamTensor(_c.Structure):
    _fields_ = [("size", _c.c_uint64), ("step", _c.c_int64), ("param", _c.c_void_p),
                ("grad", _c.c_void_p), ("exp_avg", _c.c_void_p), ("exp_avg_sq", _c.c_void_p),
                ("param16_out", _c.c_void_p), ("n", _c.c_uint64), ("grad_dtype", _c.c_int32),
                ("param16_dtype", _c.c_int32)]


lib.zinf_io_open.argtypes = [_c.POINTER(IoParams), _c.POINTER(_c.c_void_p)]
lib.zinf_io_close.argtypes = [_c.c_void_p]
for _name in ("zinf_io_pread", "zinf_io_pwrite", "zinf_io_sync_pread", "zinf_io_sync_pwrite"):
    getattr(lib, _name).argtypes = [_c.c_void_p, _c.c_void_p, _c.c_uint64, _c.c_char_p,
                                    _c.c_uint64]
lib.zinf_io_wait.argtypes = [_c.c_void_p, _c.POINTER(_c.c_uint64)]
lib.zinf_io_engine.argtypes = [_c.c_void_p]
lib.zinf_io_engine.restype = _c.c_char_p
lib.zinf_adam_create.argtypes = [_c.POINTER(AdamParams), _c.POINTER(_c.c_void_p)]
lib.zinf_adam_destroy.argtypes = [_c.c_void_p]
lib.zinf_adam_step.argtypes = [_c.c_void_p, _c.c_int64, _c.c_float, _c.c_void_p, _c.c_void_p,
                               _c.c_int, _c.c_void_p, _c.c_void_p, _c.c_uint64, _c.c_void_p,
                               _c.c_int]
lib.zinf_adam_step_many.argtypes = [_c.c_void_p, _c.c_float, _c.POINTER(AdamTensor), _c.c_uint64]

ROLES = 5
TIER_DEVICE, TIER_HOST, TIER_NVME = 0, 1, 2
ROLE_PARAM, ROLE_MASTER, ROLE_EXP_AVG, ROLE_EXP_AVG_SQ, ROLE_GRAD = range(5)
ACQUIRE_READ, ACQUIRE_OVERWRITE, ACQUIRE_UNTRACED = 0, 1, 2
NO_TENSOR = 2**64 - 1


class EngineParams(_c.Structure):
    _fields_ = [("size", _c.c_uint64), ("config_path", _c.c_char_p),
                ("config_json", _c.c_char_p), ("device_leases", _c.c_uint32 * ROLES),
                ("host_leases", _c.c_uint32 * ROLES), ("device", _c.c_char_p)]


class TensorSpec(_c.Structure):
    _fields_ = [("size", _c.c_uint64), ("name", _c.c_char_p), ("bytes", _c.c_uint64),
                ("role", _c.c_int), ("home", _c.c_int), ("unit", _c.c_uint32)]


_E = _c.c_void_p
lib.zinf_engine_open.argtypes = [_c.POINTER(EngineParams), _c.POINTER(_c.c_void_p)]
lib.zinf_engine_close.argtypes = [_E]
lib.zinf_tensor_register.argtypes = [_E, _c.POINTER(TensorSpec), _c.POINTER(_c.c_uint64)]
lib.zinf_engine_seal.argtypes = [_E]
lib.zinf_tensor_write.argtypes = [_E, _c.c_uint64, _c.c_void_p]
lib.zinf_tensor_read.argtypes = [_E, _c.c_uint64, _c.c_void_p]
lib.zinf_tensor_discard.argtypes = [_E, _c.c_uint64]
lib.zinf_acquire.argtypes = [_E, _c.c_uint64, _c.c_int, _c.c_int, _c.POINTER(_c.c_uint64)]
lib.zinf_lease_wait.argtypes = [_E, _c.c_uint64, _c.POINTER(_c.c_void_p)]
lib.zinf_release.argtypes = [_E, _c.c_uint64, _c.c_int]
lib.zinf_engine_end_step.argtypes = [_E]
lib.zinf_engine_pause_trace.argtypes = [_E, _c.c_int]
lib.zinf_engine_flush.argtypes = [_E]
lib.zinf_engine_stats.argtypes = [_E, _c.POINTER(_c.c_char_p)]
lib.zinf_engine_adam_step.argtypes = [_E, _c.c_void_p, _c.c_int64, _c.c_float, _c.c_uint64,
                                      _c.c_void_p, _c.c_int, _c.c_uint64, _c.c_uint64,
                                      _c.c_uint64, _c.c_int]


def check(status):
    """Raises ZinfError for a failed call's status (with the calling thread's message)."""
    if status != ZINF_OK:
        raise ZinfError(status, f"{lib.zinf_strerror(status).decode()}: "
                                f"{lib.zinf_last_error().decode()}")
    return status


def version():
    return lib.zinf_version().decode()
