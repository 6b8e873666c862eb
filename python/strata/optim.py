"""strata.AdamW — a torch.optim.Optimizer whose moments live in strata (host memory, or the
NVMe store streamed in chunks) and whose update is strata's CPU AdamW kernel: fp32 results are
bit-identical to torch.optim.AdamW (torch 1.13, amsgrad=False, maximize=False).

state_bits=8 keeps the moments 8-bit block-wise as bitsandbytes' AdamW8bit does (codes into its
dynamic maps, one fp32 absmax per `block_size` elements; parameters under `min_8bit_size`
elements keep fp32 moments): about 2 bytes of state an element instead of 8. state_dict() then
holds the dequantised fp32 exp_avg / exp_avg_sq, as torch.optim.AdamW's would, and
load_state_dict() requantises them (docs/embedding.md says what a round trip keeps).

Params must be fp32 CPU tensors; their .data is the master copy, updated in place. Params
managed by strata.offload are fetched from their store for the update and written back.
"""
import ctypes

import torch

from . import _capi
from ._capi import check, lib


def _ptr(tensor):
    return ctypes.c_void_p(tensor.data_ptr())


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 offload="host", path=None, resume=False, chunk_elements=1 << 22,
                 capacity_bytes=None, state_bits=32, block_size=256, min_8bit_size=4096):
        if state_bits not in (32, 8) or isinstance(state_bits, bool):
            raise ValueError(f"state_bits must be 32 or 8, not {state_bits!r}")
        if (not isinstance(block_size, int) or isinstance(block_size, bool) or not 64 <= block_size <= 4096
                or block_size & (block_size - 1)):
            raise ValueError(f"block_size must be a power of two in [64, 4096] (bitsandbytes uses 256), "
                             f"not {block_size!r}")
        if not isinstance(min_8bit_size, int) or isinstance(min_8bit_size, bool) or min_8bit_size < 0:
            raise ValueError(f"min_8bit_size must be a whole number >= 0, not {min_8bit_size!r}")
        if offload not in ("host", "nvme"):
            raise ValueError(f"offload must be 'host' or 'nvme', not {offload!r}")
        if offload == "nvme" and path is None:
            raise ValueError("offload='nvme' needs path= (the store directory)")
        if not 0.0 <= lr or not 0.0 <= eps or not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"invalid AdamW hyper-parameters lr={lr} betas={betas} eps={eps}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self._h = None
        total = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32 or p.device.type != "cpu":
                    raise ValueError("strata.AdamW steps fp32 CPU parameters")
                total += _numel(p)
        config = _capi.AdamWConfig()
        lib.strata_adamw_config_init(ctypes.byref(config))
        config.offload = _capi.OFFLOAD_NVME if offload == "nvme" else _capi.OFFLOAD_HOST
        self._path = None if path is None else str(path)
        config.store_dir = None if path is None else self._path.encode()
        # Two versions of each moment (committed + staged), 8 bytes each, plus slack for
        # per-extent alignment (8-bit state is smaller: the same bound holds).
        config.store_capacity_bytes = int(capacity_bytes or (16 * total + (64 << 20)))
        config.chunk_elements = int(chunk_elements)
        config.resume = int(bool(resume))
        config.state_bits = state_bits
        config.block_size = block_size
        config.min_8bit_size = min_8bit_size
        handle = ctypes.c_void_p()
        check(lib.strata_adamw_create(ctypes.byref(config), ctypes.byref(handle)))
        self._h = handle
        self._ids = {}
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                pid = ctypes.c_uint32()
                check(lib.strata_adamw_add_param(self._h, f"g{gi}.p{pi}".encode(), _numel(p),
                                                 ctypes.byref(pid)))
                self._ids[p] = pid.value

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            lib.strata_adamw_destroy(self._h)
            self._h = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        hp = _capi.AdamWHparams()
        lib.strata_adamw_hparams_init(ctypes.byref(hp))
        for group in self.param_groups:
            hp.lr, (hp.beta1, hp.beta2) = group["lr"], group["betas"]
            hp.eps, hp.weight_decay = group["eps"], group["weight_decay"]
            offloaded = {}  # Offload -> its params of this group, updated as one pipeline
            for p in group["params"]:
                if p.grad is None:
                    continue
                owner = getattr(p, "_strata_offload", None)
                if owner is not None:
                    offloaded.setdefault(owner, []).append(p)
                else:
                    self._update(p, p.data, hp)
            for owner, params in offloaded.items():
                owner._update(params, lambda p, data: self._update(p, data, hp))
        return loss

    def _update(self, p, data, hp):
        if p.grad.is_sparse:
            raise RuntimeError("strata.AdamW does not support sparse gradients")
        grad = p.grad.contiguous()
        if grad.dtype != torch.float32 or grad.numel() != data.numel():
            raise ValueError(f"gradient of a {tuple(data.shape)} parameter has dtype "
                             f"{grad.dtype} and {grad.numel()} elements")
        check(lib.strata_adamw_step(self._h, self._ids[p], ctypes.byref(hp), _ptr(data), _ptr(grad)))

    def commit(self):
        """Makes the optimizer state durable in its store (offload='nvme'); a new
        AdamW(..., path=P, resume=True) over the same params continues from here."""
        check(lib.strata_adamw_commit(self._h))

    # --- torch conventions: state_dict / load_state_dict --------------------------------------
    def _pull_state(self):
        for p, pid in self._ids.items():
            step = ctypes.c_int64()
            n = _numel(p)
            m = torch.empty(n, dtype=torch.float32)
            v = torch.empty(n, dtype=torch.float32)
            check(lib.strata_adamw_get_state(self._h, pid, ctypes.byref(step), _ptr(m), _ptr(v)))
            if step.value > 0:
                shape = _shape(p)
                self.state[p] = {"step": torch.tensor(float(step.value)),
                                 "exp_avg": m.view(shape), "exp_avg_sq": v.view(shape)}

    def state_dict(self):
        self._pull_state()
        try:
            return super().state_dict()
        finally:
            self.state.clear()

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        try:
            for p, pid in self._ids.items():
                s = self.state.get(p)
                if not s:
                    continue
                m = s["exp_avg"].detach().to(torch.float32).contiguous()
                v = s["exp_avg_sq"].detach().to(torch.float32).contiguous()
                step = int(s["step"].item() if torch.is_tensor(s["step"]) else s["step"])
                check(lib.strata_adamw_set_state(self._h, pid, step, _ptr(m), _ptr(v)))
        finally:
            self.state.clear()


def _numel(p):
    owner = getattr(p, "_strata_offload", None)
    return owner._numel(p) if owner is not None else p.numel()


def _shape(p):
    owner = getattr(p, "_strata_offload", None)
    return owner._shape(p) if owner is not None else p.shape
