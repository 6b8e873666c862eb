"""ctypes declarations of libstrata's C API (include/strata/strata.h) — the only way this
package reaches strata; there is no second binding of the internals.

Where the library is found, first hit wins:
  1. the environment variable STRATA_LIBRARY (a path to libstrata.so) — how the build tree
     is used: STRATA_LIBRARY=build/api/libstrata.so PYTHONPATH=python python3 ...;
  2. the library directory recorded at install time (_install_paths.py, written by Meson);
  3. the dynamic loader's own search (ctypes.util.find_library("strata")).
"""
import ctypes
import ctypes.util
import os

c_size_t = ctypes.c_size_t
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_i64 = ctypes.c_int64
c_int = ctypes.c_int
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
c_double = ctypes.c_double
c_float = ctypes.c_float

F32, BF16, F16 = 0, 1, 2
OFFLOAD_HOST, OFFLOAD_NVME = 0, 1


class StrataError(RuntimeError):
    """A strata call failed; the message is the C API's last-error text (op, path, offset,
    tensor, errno). `status` is the strata_status name ("io", "not_found", ...)."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status


def _find_library():
    path = os.environ.get("STRATA_LIBRARY")
    if path:
        return path
    try:
        from . import _install_paths  # written by `meson install`
        candidate = os.path.join(_install_paths.libdir, "libstrata.so." + _install_paths.soversion)
        if os.path.exists(candidate):
            return candidate
    except ImportError:
        pass
    found = ctypes.util.find_library("strata")
    if found:
        return found
    raise ImportError("libstrata not found: set STRATA_LIBRARY to build/api/libstrata.so "
                      "(build tree) or install strata (meson install)")


lib = ctypes.CDLL(_find_library())


class IoConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("backend", c_char_p), ("queue_depth", c_u32),
                ("block_size_bytes", c_u64), ("max_requests", c_u32),
                ("settings_path", c_char_p), ("use_write_settings", c_int)]


class SchedConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("host_budget_bytes", c_u64),
                ("device_budget_bytes", c_u64), ("io_queue_tensors", c_u32)]


class SchedStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("steps_acquired", c_u64), ("stall_ns", c_u64),
                ("max_step_stall_ns", c_u64), ("nvme_read_bytes", c_u64),
                ("nvme_write_bytes", c_u64), ("host_high_water_bytes", c_u64),
                ("device_high_water_bytes", c_u64)]


class AdamWHparams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("lr", c_double), ("beta1", c_double),
                ("beta2", c_double), ("eps", c_double), ("weight_decay", c_double),
                ("grad_scale", c_float)]


class AdamWConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("offload", c_int), ("store_dir", c_char_p),
                ("store_capacity_bytes", c_u64), ("chunk_elements", c_u64), ("resume", c_int),
                ("state_bits", c_u32), ("block_size", c_u32), ("min_8bit_size", c_u64)]


P = ctypes.POINTER
_signatures = {
    "strata_version": (c_char_p, []),
    "strata_last_error": (c_char_p, []),
    "strata_status_name": (c_char_p, [c_int]),
    "strata_store_create": (c_int, [c_char_p, c_u64, P(c_void_p)]),
    "strata_store_open": (c_int, [c_char_p, c_int, P(c_void_p)]),
    "strata_store_set_verify_once": (c_int, [c_void_p, c_int]),
    "strata_store_close": (None, [c_void_p]),
    "strata_store_put": (c_int, [c_void_p, c_char_p, c_int, P(c_i64), c_size_t, c_void_p, c_u64]),
    "strata_store_get": (c_int, [c_void_p, c_char_p, c_void_p, c_u64]),
    "strata_store_put_async": (c_int, [c_void_p, c_char_p, c_int, P(c_i64), c_size_t, c_void_p,
                                       c_u64, P(c_u64)]),
    "strata_store_get_async": (c_int, [c_void_p, c_char_p, c_void_p, c_u64, P(c_u64)]),
    "strata_store_wait": (c_int, [c_void_p, c_u64]),
    "strata_store_info": (c_int, [c_void_p, c_char_p, P(c_int), P(c_size_t), P(c_i64), c_size_t,
                                  P(c_u64)]),
    "strata_store_commit": (c_int, [c_void_p, c_u64, P(c_char_p), P(c_char_p), c_size_t]),
    "strata_store_verify": (c_int, [c_void_p, P(c_u64)]),
    "strata_store_count": (c_int, [c_void_p, P(c_size_t)]),
    "strata_store_name": (c_int, [c_void_p, c_size_t, P(c_char_p)]),
    "strata_adamw_hparams_init": (None, [P(AdamWHparams)]),
    "strata_adamw_config_init": (None, [P(AdamWConfig)]),
    "strata_adamw_create": (c_int, [P(AdamWConfig), P(c_void_p)]),
    "strata_adamw_destroy": (None, [c_void_p]),
    "strata_adamw_add_param": (c_int, [c_void_p, c_char_p, c_size_t, P(c_u32)]),
    "strata_adamw_step": (c_int, [c_void_p, c_u32, P(AdamWHparams), c_void_p, c_void_p]),
    "strata_adamw_get_state": (c_int, [c_void_p, c_u32, P(c_i64), c_void_p, c_void_p]),
    "strata_adamw_set_state": (c_int, [c_void_p, c_u32, c_i64, c_void_p, c_void_p]),
    "strata_adamw_commit": (c_int, [c_void_p]),
}
for _name, (_res, _args) in _signatures.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args


def check(status):
    """Raises StrataError with the C API's message when `status` is not 0."""
    if status != 0:
        name = lib.strata_status_name(status).decode()
        raise StrataError(name, lib.strata_last_error().decode(errors="replace"))


def version():
    return lib.strata_version().decode()
