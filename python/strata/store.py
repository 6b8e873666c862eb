"""strata.Store — the checksummed NVMe store (layer 2 of the C API) for torch tensors."""
import ctypes

import torch

from . import _capi
from ._capi import check, lib

_DTYPES = {torch.float32: _capi.F32, torch.bfloat16: _capi.BF16, torch.float16: _capi.F16}
_TORCH = {v: k for k, v in _DTYPES.items()}


def empty_aligned(shape, dtype=torch.float32, alignment=4096):
    """An uninitialised CPU tensor whose data starts on `alignment` bytes: direct I/O moves it
    without a bounce copy (torch's own allocations are only 64-byte aligned)."""
    numel = 1
    for d in shape:
        numel *= int(d)
    size = numel * torch.empty(0, dtype=dtype).element_size()
    raw = torch.empty(size + alignment, dtype=torch.uint8)
    offset = (-raw.data_ptr()) % alignment
    return raw[offset:offset + size].view(dtype).view(tuple(shape))


def _verify_once(verify_reads):
    """strata_store_set_verify_once's argument for a verify_reads name."""
    if verify_reads not in ("always", "once"):
        raise ValueError(f"verify_reads: {verify_reads!r}; use 'always' or 'once'")
    return int(verify_reads == "once")


class Store:
    """A store directory. One thread at a time. `Store.create(dir, capacity_bytes)` refuses an
    existing store; `Store(dir)` opens one at its last commit. Close with close() or `with`.
    `verify_reads`: "always" (every read checks its checksums) or "once" (an extent only until
    this handle has seen it intact — docs/memory.md, "Read checksums")."""

    def __init__(self, path, *, _handle=None, read_only=False, verify_reads="always"):
        self._h = None
        self.path = str(path)
        once = _verify_once(verify_reads)  # refused before anything is opened
        handle = ctypes.c_void_p()
        if _handle is None:
            check(lib.strata_store_open(self.path.encode(), int(read_only), ctypes.byref(handle)))
            _handle = handle
        self._h = _handle
        check(lib.strata_store_set_verify_once(self._h, once))

    @classmethod
    def create(cls, path, capacity_bytes, *, verify_reads="always"):
        _verify_once(verify_reads)  # refused before a store is created
        handle = ctypes.c_void_p()
        check(lib.strata_store_create(str(path).encode(), int(capacity_bytes), ctypes.byref(handle)))
        return cls(path, _handle=handle, verify_reads=verify_reads)

    def close(self):
        if self._h is not None:
            lib.strata_store_close(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def put_async(self, name, tensor):
        """Starts writing `tensor` (kept alive by the caller until wait)."""
        if tensor.dtype not in _DTYPES or tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"tensor {name}: strata stores contiguous CPU fp32/bf16/fp16 tensors")
        shape = (ctypes.c_int64 * max(1, tensor.dim()))(*tensor.shape)
        ticket = ctypes.c_uint64()
        check(lib.strata_store_put_async(self._h, name.encode(), _DTYPES[tensor.dtype], shape,
                                         tensor.dim(), ctypes.c_void_p(tensor.data_ptr()),
                                         tensor.numel() * tensor.element_size(), ctypes.byref(ticket)))
        return ticket.value

    def put(self, name, tensor):
        self.wait(self.put_async(name, tensor))

    def get_async(self, name, out):
        """Starts reading `name` into `out` (contiguous CPU tensor of its size)."""
        ticket = ctypes.c_uint64()
        check(lib.strata_store_get_async(self._h, name.encode(), ctypes.c_void_p(out.data_ptr()),
                                         out.numel() * out.element_size(), ctypes.byref(ticket)))
        return ticket.value

    def wait(self, ticket):
        check(lib.strata_store_wait(self._h, ticket))

    def info(self, name):
        """(torch dtype, shape) of a tensor; StrataError(not_found) when absent."""
        dtype, ndim, size = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_uint64()
        shape = (ctypes.c_int64 * 16)()
        check(lib.strata_store_info(self._h, name.encode(), ctypes.byref(dtype), ctypes.byref(ndim),
                                    shape, 16, ctypes.byref(size)))
        return _TORCH[dtype.value], tuple(shape[i] for i in range(ndim.value))

    def get(self, name):
        dtype, shape = self.info(name)
        out = empty_aligned(shape, dtype)
        self.wait(self.get_async(name, out))
        return out

    def commit(self, step=0, metadata=None):
        metadata = metadata or {}
        keys = (ctypes.c_char_p * max(1, len(metadata)))(*[k.encode() for k in metadata])
        values = (ctypes.c_char_p * max(1, len(metadata)))(*[str(v).encode() for v in metadata.values()])
        check(lib.strata_store_commit(self._h, int(step), keys, values, len(metadata)))

    def verify(self):
        damaged = ctypes.c_uint64()
        check(lib.strata_store_verify(self._h, ctypes.byref(damaged)))

    def names(self):
        count = ctypes.c_size_t()
        check(lib.strata_store_count(self._h, ctypes.byref(count)))
        out = []
        for i in range(count.value):
            name = ctypes.c_char_p()
            check(lib.strata_store_name(self._h, i, ctypes.byref(name)))
            out.append(name.value.decode())
        return out
