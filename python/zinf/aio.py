"""zinf.AioHandle: DeepSpeed's aio_handle (csrc/aio/py_lib) on zinf's I/O engine, for torch
tensors, zero-copy through data_ptr().

Methods keep DeepSpeed's names, arguments and return values: async_pread/async_pwrite(buffer,
filename, file_offset=0) queue and return 0; wait() returns the number of transfers completed;
sync_pread/sync_pwrite return 1; new_cpu_locked_tensor(num_elem, example_tensor) gives a
page-aligned tensor locked in RAM. Unlike DeepSpeed, a failed or short transfer raises ZinfError
(naming the file and offset) instead of returning a count to compare. Transfers use O_DIRECT
(DeepSpeed's default) unless use_direct=False: buffers, offsets and sizes must then be aligned
(new_cpu_locked_tensor's are page-aligned).
"""
import ctypes

from zinf import _lib

_TORCH_DTYPES_TO_BYTES = None


def _nbytes(t):
    if not t.is_contiguous():
        raise ValueError("zinf.AioHandle: the buffer must be a contiguous tensor")
    if t.device.type != "cpu":
        raise ValueError(f"zinf.AioHandle: the buffer is on {t.device}; expected a CPU tensor")
    return t.numel() * t.element_size()


class AioHandle:
    def __init__(self, block_size=1048576, queue_depth=128, single_submit=False,
                 overlap_events=False, intra_op_parallelism=1, use_direct=True, engine="auto"):
        self._block_size = block_size
        self._queue_depth = queue_depth
        self._single_submit = single_submit
        self._overlap_events = overlap_events
        self._intra_op_parallelism = intra_op_parallelism
        params = _lib.IoParams(ctypes.sizeof(_lib.IoParams), block_size, queue_depth,
                               1 if use_direct else 0, engine.encode())
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.zinf_io_open(ctypes.byref(params), ctypes.byref(handle)))
        self._h = handle
        self._pending = []  # the tensors queued: kept alive until the wait
        self._locked = {}   # data_ptr -> the zinf pointer of new_cpu_locked_tensor's memory

    def close(self):
        if self._h:
            _lib.lib.zinf_io_close(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def engine(self):
        return _lib.lib.zinf_io_engine(self._h).decode()

    # DeepSpeed's getters.
    def get_block_size(self):
        return self._block_size

    def get_queue_depth(self):
        return self._queue_depth

    def get_single_submit(self):
        return self._single_submit

    def get_overlap_events(self):
        return self._overlap_events

    def get_intra_op_parallelism(self):
        return self._intra_op_parallelism

    def _queue(self, fn, buffer, filename, file_offset):
        _lib.check(fn(self._h, ctypes.c_void_p(buffer.data_ptr()), _nbytes(buffer),
                      str(filename).encode(), file_offset))
        self._pending.append(buffer)
        return 0

    def async_pread(self, buffer, filename, file_offset=0):
        return self._queue(_lib.lib.zinf_io_pread, buffer, filename, file_offset)

    def async_pwrite(self, buffer, filename, file_offset=0):
        return self._queue(_lib.lib.zinf_io_pwrite, buffer, filename, file_offset)

    def wait(self):
        done = ctypes.c_uint64()
        try:
            _lib.check(_lib.lib.zinf_io_wait(self._h, ctypes.byref(done)))
        finally:
            self._pending.clear()
        return done.value

    def sync_pread(self, buffer, filename, file_offset=0):
        self.async_pread(buffer, filename, file_offset)
        return self.wait()

    def sync_pwrite(self, buffer, filename, file_offset=0):
        self.async_pwrite(buffer, filename, file_offset)
        return self.wait()

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        import torch
        nbytes = max(1, num_elem * example_tensor.element_size())
        ptr = ctypes.c_void_p()
        _lib.check(_lib.lib.zinf_pinned_alloc(nbytes, ctypes.byref(ptr)))
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
        t = torch.frombuffer(raw, dtype=example_tensor.dtype, count=num_elem)
        self._locked[t.data_ptr()] = ptr.value
        return t

    def free_cpu_locked_tensor(self, tensor):
        ptr = self._locked.pop(tensor.data_ptr(), None)
        if ptr is None:
            raise ValueError("zinf.AioHandle.free_cpu_locked_tensor: not a tensor of "
                             "new_cpu_locked_tensor (or freed already)")
        _lib.check(_lib.lib.zinf_pinned_free(ctypes.c_void_p(ptr)))
