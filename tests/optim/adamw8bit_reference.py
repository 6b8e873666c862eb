#!/usr/bin/python3
"""Checks the 8-bit block-wise AdamW (kernels/optim/adamw8bit.h) against an independent PyTorch
implementation written here from the algorithm's description, in-process through the test C ABI
(optim_capi.cpp, loaded with ctypes).

  adamw8bit_reference.py LIB maps    bitsandbytes' two dynamic maps (create_dynamic_map with
                                     signed True/False, 7 exponent bits, 8 bits), built here
                                     with torch as the published construction does, equal
                                     strata's 256 values bit for bit
  adamw8bit_reference.py LIB steps   20 steps on random tensors (NaN/inf gradients, tiny tails,
                                     blocks of 32..4096, fp32 and bf16 gradients, a gradient
                                     scale, the bf16 copy): codes identical, absmax and params
                                     within 1 ulp (what we find: 0), on every ISA this CPU has
  adamw8bit_reference.py LIB loss    300 steps of a least-squares regression: the 8-bit loss
                                     curve stays within 1% of torch.optim.AdamW's fp32 one on
                                     average, at every step from 100 on, and at the end

The reference quantiser is a different formulation from strata's: torch.searchsorted for the
bracketing codes, the fp32 midpoint decides, an exact tie goes to the even index — the rule
bitsandbytes' 7-step search implies (see docs/optim.md). Exit 0 pass, 1 fail, 77 no torch.
"""
import ctypes
import math
import sys

try:
    import numpy as np
    import torch
except ImportError as error:  # the skip must say why
    print(f"SKIP: PyTorch/numpy not importable by {sys.executable}: {error}")
    sys.exit(77)

ISA_SCALAR, ISA_AVX2, ISA_AVX512 = 1, 2, 3
f32p = ctypes.POINTER(ctypes.c_float)
u8p = ctypes.POINTER(ctypes.c_uint8)
u16p = ctypes.POINTER(ctypes.c_uint16)


def load(path):
    lib = ctypes.CDLL(path)
    lib.strata_optim_detected_isa.restype = ctypes.c_int
    lib.strata_optim_has_avx512.restype = ctypes.c_int
    lib.strata_dynamic_code.argtypes = [ctypes.c_int, f32p]
    lib.strata_dynamic_code.restype = None
    lib.strata_adamw8bit_step.argtypes = [ctypes.c_double] * 5 + [
        ctypes.c_int64, ctypes.c_float, f32p, ctypes.c_void_p, ctypes.c_int, u8p, u8p, f32p, f32p,
        ctypes.c_size_t, ctypes.c_int, u16p, ctypes.c_size_t, ctypes.c_int]
    lib.strata_adamw8bit_step.restype = None
    return lib


def isas(lib):
    return ([ISA_SCALAR] + ([ISA_AVX2] if lib.strata_optim_detected_isa() == ISA_AVX2 else []) +
            ([ISA_AVX512] if lib.strata_optim_has_avx512() else []))


# --- the dynamic map, transcribed from the published construction --------------------------------

def dynamic_map(signed, max_exponent_bits=7, total_bits=8):
    """Dettmers' dynamic data type as bitsandbytes builds it: for exponent i, the midpoints of a
    linear split of [0.1, 1] into 2^i (signed) or 2^(i+1) (unsigned) intervals, scaled by
    10^(i - (max_exponent_bits - 1)); negatives too when signed; then 0 and 1; sorted."""
    values = []
    non_sign_bits = total_bits - 1
    extra = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        intervals = 2 ** (i + non_sign_bits - max_exponent_bits + (0 if signed else 1))
        edges = torch.linspace(0.1, 1, intervals + 1)
        centres = (edges[:-1] + edges[1:]) / 2.0
        scale = 10 ** (i - (max_exponent_bits - 1))
        values += (scale * centres).tolist()
        if signed:
            values += (-scale * centres).tolist()
    assert extra == 0, "only the 7-exponent-bit, 8-bit map is transcribed"
    values += [0, 1.0]
    assert len(values) == 2 ** total_bits
    return torch.tensor(sorted(values), dtype=torch.float32)


def check_maps(lib):
    ok = True
    for signed in (True, False):
        ours = np.zeros(256, dtype=np.float32)
        lib.strata_dynamic_code(1 if signed else 0, ours.ctypes.data_as(f32p))
        theirs = dynamic_map(signed).numpy()
        bad = np.nonzero(ours.view(np.uint32) != theirs.view(np.uint32))[0]
        name = "signed" if signed else "unsigned"
        if bad.size:
            ok = False
            for k in bad[:8]:
                print(f"  {name}[{k}]: ours {ours[k]!r} torch {theirs[k]!r}")
            print(f"FAIL dynamic map {name}: {bad.size} of 256 differ")
        # The layout the kernels rely on: sorted, 1.0 last, +0 at 127 (signed) or 0 (unsigned).
        zero = 127 if signed else 0
        if not (np.all(np.diff(ours) > 0) and ours[255] == 1.0 and ours[zero] == 0.0
                and not np.signbit(ours[zero]) and (not signed or np.all(ours[:127] < 0))):
            ok = False
            print(f"FAIL dynamic map {name}: layout")
        print(f"dynamic map {name}: min {ours[0]!r} max {ours[255]!r} smallest positive "
              f"{ours[zero + 1]!r}{'' if bad.size else ' — equal to torch bit for bit'}")
    return ok


# --- the reference 8-bit AdamW in torch ----------------------------------------------------------

class Tables:
    def __init__(self):
        self.m = dynamic_map(True)
        self.v = dynamic_map(False)


def quantize(values, absmax_per_element, code, signed):
    divisor = torch.where(absmax_per_element == 0, torch.ones_like(absmax_per_element), absmax_per_element)
    x = values * torch.reciprocal(divisor)  # 1/absmax rounded once, then a multiply
    hi = torch.searchsorted(code, x).clamp(max=255)  # first code >= x
    lo = (hi - 1).clamp(min=0)
    mid = (code[lo] + code[hi]) * 0.5
    even = torch.where(lo % 2 == 0, lo, hi)
    result = torch.where(x > mid, hi, torch.where(x < mid, lo, even))
    result = torch.where(hi == 0, torch.zeros_like(result), result)
    if signed:
        differ = torch.signbit(values) != (result < 127)
        result = torch.where(differ, result + torch.where(values > 0, 1, -1), result)
    return result.to(torch.uint8)


def block_absmax(values, block):
    n = values.numel()
    blocks = (n + block - 1) // block
    padded = torch.zeros(blocks * block, dtype=torch.float32)
    padded[:n] = values.abs()
    return padded.view(blocks, block).amax(dim=1)


def reference_step(t, state, grad, step, hp, block, grad_scale):
    """One step as adamw8bit.h describes it, in torch.optim.AdamW's fp32 operation order."""
    lr, beta1, beta2, eps, wd = hp
    n = state["p"].numel()
    am = state["am"].repeat_interleave(block)[:n]
    av = state["av"].repeat_interleave(block)[:n]
    m0 = t.m[state["cm"].long()] * am
    v0 = t.v[state["cv"].long()] * av
    g = grad.float() * grad_scale
    finite = torch.isfinite(g)
    p = state["p"].clone()
    p.mul_(1 - lr * wd)
    m = m0.clone().mul_(beta1).add_(g, alpha=1 - beta1)
    v = v0.clone().mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1 ** step)
    denom = (v.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)
    p = torch.where(finite, p, state["p"])
    m = torch.where(finite, m, m0)
    v = torch.where(finite, v, v0)
    state["am"] = block_absmax(m, block)
    state["av"] = block_absmax(v, block)
    state["cm"] = quantize(m, state["am"].repeat_interleave(block)[:n], t.m, True)
    state["cv"] = quantize(v, state["av"].repeat_interleave(block)[:n], t.v, False)
    state["p"] = p


def ulps(a, b):
    ai = a.view(np.int32).astype(np.int64)
    bi = b.view(np.int32).astype(np.int64)
    ai = np.where(ai < 0, -(ai & 0x7FFFFFFF), ai)
    bi = np.where(bi < 0, -(bi & 0x7FFFFFFF), bi)
    return int(np.abs(ai - bi).max()) if a.size else 0


def make_grads(gen, n, block, step, kind):
    # Per-block magnitudes over 12 decades, so blocks span the code's range (and beyond).
    blocks = (n + block - 1) // block
    scale = torch.pow(10.0, torch.randint(-9, 3, (blocks,), generator=gen).float()).repeat_interleave(block)[:n]
    g = torch.randn(n, generator=gen) * scale
    if kind == "nonfinite" and n > 0:
        picks = torch.randint(0, n, (max(1, n // 50),), generator=gen)
        g[picks] = torch.tensor([float("nan"), float("inf"), -float("inf")])[torch.arange(picks.numel()) % 3]
        if step == 3:
            g[: min(n, block)] = float("nan")  # a whole block skipped
    if kind == "zeros" and step <= 2:
        g[: min(n, 2 * block)] = 0.0  # blocks whose absmax stays 0
    return g


def check_steps(lib):
    ok = True
    t = Tables()
    hp = (1e-3, 0.9, 0.999, 1e-8, 1e-2)
    cases = []
    for block in (256, 32, 96, 2048, 4096):
        for n in (1, 7, 255, 256, 257, 4096, 5003, 40000):
            cases.append((block, n))
    worst_param, worst_absmax, checked = 0, 0, 0
    for case_index, (block, n) in enumerate(cases):
        kind = ("nonfinite", "plain", "zeros")[case_index % 3]
        grads_bf16 = case_index % 4 == 1
        grad_scale = 0.5 if case_index % 5 == 2 else 1.0
        copy = case_index % 2  # 0 none, 1 bf16
        for isa in isas(lib):
            gen = torch.Generator().manual_seed(1000 + case_index)
            p0 = torch.randn(n, generator=gen)
            ref = {"p": p0.clone(), "cm": torch.full((n,), 127, dtype=torch.uint8),
                   "cv": torch.zeros(n, dtype=torch.uint8),
                   "am": torch.zeros((n + block - 1) // block), "av": torch.zeros((n + block - 1) // block)}
            ours = {k: v.clone().numpy() for k, v in ref.items()}
            copy_bits = np.zeros(n, dtype=np.uint16)
            for step in range(1, 21):
                g = make_grads(gen, n, block, step, kind)
                if grads_bf16:
                    g = g.bfloat16()
                    g_bits = g.view(torch.int16).numpy().view(np.uint16).copy()
                    g_ptr, g_dtype = g_bits.ctypes.data_as(ctypes.c_void_p), 1
                else:
                    g_np = g.numpy().copy()
                    g_ptr, g_dtype = g_np.ctypes.data_as(ctypes.c_void_p), 0
                lib.strata_adamw8bit_step(*hp, step, grad_scale, ours["p"].ctypes.data_as(f32p), g_ptr, g_dtype,
                                          ours["cm"].ctypes.data_as(u8p), ours["cv"].ctypes.data_as(u8p),
                                          ours["am"].ctypes.data_as(f32p), ours["av"].ctypes.data_as(f32p),
                                          block, copy, copy_bits.ctypes.data_as(u16p) if copy else None, n, isa)
                reference_step(t, ref, g, step, hp, block, grad_scale)
                where = f"block {block} n {n} {kind} {'bf16' if grads_bf16 else 'fp32'} grads scale {grad_scale} " \
                        f"isa {isa} step {step}"
                for name in ("cm", "cv"):
                    bad = np.nonzero(ours[name] != ref[name].numpy())[0]
                    if bad.size:
                        ok = False
                        print(f"FAIL {where}: {name} codes differ at {bad.size} elements, first {bad[:5]}: "
                              f"ours {ours[name][bad[:5]]} torch {ref[name].numpy()[bad[:5]]}")
                worst_param = max(worst_param, ulps(ours["p"], ref["p"].numpy()))
                worst_absmax = max(worst_absmax, ulps(ours["am"], ref["am"].numpy()),
                                   ulps(ours["av"], ref["av"].numpy()))
                if copy:
                    theirs = ref["p"].bfloat16().view(torch.int16).numpy().view(np.uint16)
                    if ulps(ours["p"], ref["p"].numpy()) == 0 and not np.array_equal(copy_bits, theirs):
                        ok = False
                        print(f"FAIL {where}: bf16 copy differs from the rounded params")
                if not ok:
                    return False
                checked += 1
    # Codes are compared exactly; params and absmax may differ by 1 ulp (an fp32 operation that
    # torch and we might round differently would show as 1 ulp, not more) — and must not drift.
    if worst_param > 1 or worst_absmax > 1:
        ok = False
        print(f"FAIL params differ by up to {worst_param} ulp, absmax by {worst_absmax} ulp")
    print(f"adamw8bit: {checked} chunk-steps over {len(cases)} shapes: codes identical, params within "
          f"{worst_param} ulp, absmax within {worst_absmax} ulp of the torch reference")
    return ok


def check_loss(lib):
    """Least squares y = X w + noise with W of 64 x 128 = 8192 elements (8-bit, >= 4096): 300 steps
    of the 8-bit step (gradients from torch autograd) against torch.optim.AdamW in fp32."""
    gen = torch.Generator().manual_seed(7)
    rows, fan_in, fan_out = 512, 128, 64
    x = torch.randn(rows, fan_in, generator=gen)
    w_true = torch.randn(fan_in, fan_out, generator=gen) / math.sqrt(fan_in)
    y = x @ w_true + 0.1 * torch.randn(rows, fan_out, generator=gen)
    w0 = torch.zeros(fan_out, fan_in)
    lr, betas, eps, wd = 1e-2, (0.9, 0.999), 1e-8, 1e-2
    hp = (lr, betas[0], betas[1], eps, wd)

    w32 = torch.nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([w32], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    w8 = w0.clone().reshape(-1).numpy().copy()
    n = w8.size
    block = 256
    cm = np.full(n, 127, dtype=np.uint8)
    cv = np.zeros(n, dtype=np.uint8)
    am = np.zeros(n // block, dtype=np.float32)
    av = np.zeros(n // block, dtype=np.float32)
    curve32, curve8 = [], []
    for step in range(1, 301):
        opt.zero_grad()
        loss32 = ((x @ w32.t() - y) ** 2).mean()
        loss32.backward()
        opt.step()
        w = torch.from_numpy(w8).view(fan_out, fan_in).clone().requires_grad_(True)
        loss8 = ((x @ w.t() - y) ** 2).mean()
        loss8.backward()
        g = w.grad.reshape(-1).numpy().copy()
        lib.strata_adamw8bit_step(*hp, step, 1.0, w8.ctypes.data_as(f32p), g.ctypes.data_as(ctypes.c_void_p), 0,
                                  cm.ctypes.data_as(u8p), cv.ctypes.data_as(u8p), am.ctypes.data_as(f32p),
                                  av.ctypes.data_as(f32p), block, 0, None, n, 0)
        curve32.append(loss32.item())
        curve8.append(loss8.item())
    curve32, curve8 = np.array(curve32), np.array(curve8)
    rel = np.abs(curve8 - curve32) / curve32
    for step in (1, 10, 20, 30, 50, 100, 200, 300):
        print(f"  step {step:3d}: fp32 AdamW loss {curve32[step - 1]:.6f}  8-bit {curve8[step - 1]:.6f}  "
              f"rel {rel[step - 1]:.2e}")
    k = int(rel.argmax())
    fall = (curve32[k - 1] - curve32[k]) / curve32[k] if k > 0 else 0.0
    print(f"loss curve: mean relative difference {rel.mean():.2e}; worst {rel[k]:.2e} at step {k + 1}, where the "
          f"fp32 loss falls {fall:.1%} per step (a lag of {rel[k] / fall if fall > 0 else 0:.2f} step); "
          f"worst from step 100 on {rel[99:].max():.2e}; final {rel[-1]:.2e}")
    # Within 1% on average over the 300 steps, at every step once the fast descent is over, and
    # at the end. The descent itself (steps ~15-60, the loss falling by 5-15% a step) is not held
    # to 1% per step: there any two optimisers a fraction of a step apart differ by more.
    return rel.mean() <= 1e-2 and rel[99:].max() <= 1e-2 and rel[-1] <= 1e-2


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    lib = load(sys.argv[1])
    torch.set_num_threads(1)
    mode = sys.argv[2]
    checks = {"maps": check_maps, "steps": check_steps, "loss": check_loss}
    if mode not in checks:
        print(f"unknown mode {mode!r}")
        return 2
    return 0 if checks[mode](lib) else 1


if __name__ == "__main__":
    sys.exit(main())
