"""zinf for Python: ctypes over zinf's C ABI (libzinf.so), so it works with any torch version.

    import zinf
    h = zinf.AioHandle(block_size=1 << 20, queue_depth=32)   # DeepSpeed's aio_handle
    from zinf.optim import CPUAdam                             # DeepSpeedCPUAdam's signature

Failures raise zinf.ZinfError (its .status is the ZINF_E_* code; the message names what failed).
"""
from zinf._lib import ZinfError, version  # noqa: F401
from zinf.aio import AioHandle  # noqa: F401
from zinf.engine import Engine  # noqa: F401

__version__ = version()
