"""strata — the offload engine from Python, on libstrata's C API (ctypes).

    import strata
    opt = strata.AdamW(model.parameters(), lr=1e-3, offload="nvme", path="/nvme/opt")
    strata.offload(model, path="/nvme/params", host_memory=256 << 20)

See docs/embedding.md. The library is found as _capi.py describes (STRATA_LIBRARY for a build
tree, the install prefix after `meson install`).
"""
from ._capi import StrataError, version as _version
from .store import Store
from .optim import AdamW
from .offload import offload, Offload

__version__ = _version()
__all__ = ["AdamW", "Offload", "Store", "StrataError", "offload", "__version__"]
