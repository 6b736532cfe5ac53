"""zinf for Python: ctypes over zinf's C ABI (libzinf.so), so it works with any torch version.

    import zinf
    h = zinf.AioHandle(block_size=1 << 20, queue_depth=32)   # DeepSpeed's aio_handle
    opt = zinf.optim.CPUAdam(params, lr=1e-3)                  # DeepSpeedCPUAdam's signature
    model = zinf.torch.offload(net, "ds_config.json")         # a module trained from the tiers

zinf.optim and zinf.torch import torch when first used. Failures raise zinf.ZinfError (its
.status is the ZINF_E_* code; the message names what failed).
"""
import importlib

from zinf._lib import ZinfError, version  # noqa: F401
from zinf.aio import AioHandle  # noqa: F401
from zinf.engine import Engine  # noqa: F401

__version__ = version()
_LAZY = ("optim", "torch")


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"zinf.{name}")
    raise AttributeError(f"module 'zinf' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
