#!/usr/bin/python3
"""Checks kernels/optim against PyTorch in-process: loads the test C ABI (optim_capi.cpp) with
ctypes and compares with torch tensor for tensor, so nothing large ever touches the disk.

  torch_reference.py LIB casts16          all 65536 bf16 and fp16 patterns -> fp32, bit for bit
  torch_reference.py LIB casts32 [--sampled]
                                          fp32 -> bf16 and fp32 -> fp16 over all 2^32 patterns
                                          (or, sampled: every sign and exponent with all low-16
                                          mantissa bits and varied high bits), bit for bit
  torch_reference.py LIB adamw            10 AdamW steps vs torch.optim.AdamW on several shapes
  torch_reference.py LIB norm             sum of squares vs torch in float64; clip coefficient
                                          vs torch.nn.utils.clip_grad_norm_'s

Every mode runs each ISA this CPU has (scalar always, avx2 where detected). Exit status: 0 all
equal, 1 a mismatch (printed), 77 torch is not importable (Meson's skip code).
"""
import ctypes
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as error:  # the skip must say why
    print(f"SKIP: PyTorch/numpy not importable by {sys.executable}: {error}")
    sys.exit(77)

ISA_SCALAR, ISA_AVX2 = 1, 2
u16p = ctypes.POINTER(ctypes.c_uint16)
f32p = ctypes.POINTER(ctypes.c_float)


def load(path):
    lib = ctypes.CDLL(path)
    for name, src, dst in (("strata_cast_fp32_to_bf16", f32p, u16p),
                           ("strata_cast_fp32_to_fp16", f32p, u16p),
                           ("strata_cast_bf16_to_fp32", u16p, f32p),
                           ("strata_cast_fp16_to_fp32", u16p, f32p)):
        fn = getattr(lib, name)
        fn.argtypes = [src, dst, ctypes.c_size_t, ctypes.c_int]
        fn.restype = None
    lib.strata_adamw_step.argtypes = [ctypes.c_double] * 5 + [
        ctypes.c_int64, ctypes.c_float, f32p, ctypes.c_void_p, ctypes.c_int, f32p, f32p,
        ctypes.c_int, u16p, ctypes.c_size_t, ctypes.c_int]
    lib.strata_adamw_step.restype = None
    lib.strata_optim_detected_isa.restype = ctypes.c_int
    lib.strata_sum_squares.argtypes = [f32p, ctypes.c_size_t, ctypes.c_int]
    lib.strata_sum_squares.restype = ctypes.c_double
    lib.strata_clip_coefficient.argtypes = [ctypes.c_double, ctypes.c_double]
    lib.strata_clip_coefficient.restype = ctypes.c_float
    return lib


def ptr(array, kind):
    return array.ctypes.data_as(kind)


def isas(lib):
    return [ISA_SCALAR] + ([ISA_AVX2] if lib.strata_optim_detected_isa() == ISA_AVX2 else [])


def isa_name(isa):
    return {ISA_SCALAR: "scalar", ISA_AVX2: "avx2"}[isa]


def report_mismatch(what, inputs, ours, theirs):
    bad = np.nonzero(ours != theirs)[0]
    for index in bad[:8]:
        print(f"  {what}: input 0x{int(inputs[index]):08x} -> ours 0x{int(ours[index]):x}, "
              f"torch 0x{int(theirs[index]):x}")
    print(f"FAIL {what}: {bad.size} of {inputs.size} differ")


def check_casts16(lib):
    ok = True
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for dtype, fn in ((torch.bfloat16, lib.strata_cast_bf16_to_fp32),
                      (torch.float16, lib.strata_cast_fp16_to_fp32)):
        theirs = torch.from_numpy(patterns.view(np.int16)).view(dtype).float().numpy().view(np.uint32)
        for isa in isas(lib):
            # Offset 3 too, so the scalar tails and unaligned vector loads run over every value.
            for offset in (0, 3):
                src = np.ascontiguousarray(patterns[offset:])
                out = np.empty(src.size, dtype=np.float32)
                fn(ptr(src, u16p), ptr(out, f32p), src.size, isa)
                ours = out.view(np.uint32)
                if not np.array_equal(ours, theirs[offset:]):
                    report_mismatch(f"{dtype} -> fp32 [{isa_name(isa)}]", src, ours, theirs[offset:])
                    ok = False
    print(f"casts16: all 65536 bf16 and fp16 patterns -> fp32 checked, {'equal' if ok else 'MISMATCH'}")
    return ok


def fp32_chunks(sampled):
    """Yields uint32 arrays of fp32 patterns: every 2^32 value in chunks, or the sampled set."""
    chunk = 1 << 24
    if not sampled:
        for start in range(0, 1 << 32, chunk):
            yield np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32)
        return
    rng = np.random.default_rng(5)
    low = np.arange(1 << 16, dtype=np.uint32)
    for sign in (0, 1):
        for exponent in range(256):
            # The rounding of both casts depends on the low 16 (bf16) or 13 (fp16) bits and the
            # bit above them: all low-16 values with the 7 high mantissa bits at their extremes
            # and at random values cover every tie, carry and overflow edge of this exponent.
            highs = np.concatenate([[0, 0x7F], rng.integers(1, 0x7F, size=6)]).astype(np.uint32)
            head = np.uint32((sign << 31) | (exponent << 23))
            yield (head | (highs[:, None] << np.uint32(16)) | low[None, :]).ravel()


def check_casts32(lib, sampled):
    ok = True
    checked = 0
    started = time.monotonic()
    isa_list = isas(lib)
    for patterns in fp32_chunks(sampled):
        values = torch.from_numpy(patterns.view(np.float32))
        for dtype, fn in ((torch.bfloat16, lib.strata_cast_fp32_to_bf16),
                          (torch.float16, lib.strata_cast_fp32_to_fp16)):
            theirs = values.to(dtype).view(torch.int16).numpy().view(np.uint16)
            out = np.empty(patterns.size, dtype=np.uint16)
            for isa in isa_list:
                fn(ptr(patterns.view(np.float32), f32p), ptr(out, u16p), patterns.size, isa)
                if not np.array_equal(out, theirs):
                    report_mismatch(f"fp32 -> {dtype} [{isa_name(isa)}]", patterns, out, theirs)
                    ok = False
        checked += patterns.size
        if not ok:
            break
    what = "sampled" if sampled else "all"
    print(f"casts32: {what} {checked} fp32 patterns -> bf16 and fp16 on "
          f"{'+'.join(isa_name(i) for i in isa_list)} in {time.monotonic() - started:.1f} s, "
          f"{'equal' if ok else 'MISMATCH'}")
    return ok


def relative_error(ours, theirs):
    ours = ours.astype(np.float64)
    theirs = theirs.astype(np.float64)
    return float(np.max(np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-30), initial=0.0))


def check_adamw(lib):
    ok = True
    torch.manual_seed(1)
    worst = 0.0
    identical = 0
    cases = 0
    for count in (1, 7, 8, 9, 1000, 4099, 65537, 300001):
        for weight_decay in (0.0, 0.1):
            for grads_bf16, copy_dtype, grad_scale in ((False, 1, 1.0), (False, 2, 0.5),
                                                       (True, 1, 0.25)):
                for foreach in (False, True):
                    for isa in isas(lib):
                        config = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=weight_decay)
                        init = torch.randn(count)
                        ref = init.clone().requires_grad_(True)
                        opt = torch.optim.AdamW([ref], foreach=foreach, **config)
                        params = init.numpy().copy()
                        exp_avg = np.zeros(count, np.float32)
                        exp_avg_sq = np.zeros(count, np.float32)
                        copy = np.empty(count, np.uint16)
                        for step in range(1, 11):
                            grad = torch.randn(count) * (10.0 ** -(step % 4))
                            if grads_bf16:
                                grad_raw = grad.to(torch.bfloat16)
                                grad_ours = grad_raw.view(torch.int16).numpy().view(np.uint16).copy()
                                grad_used = grad_raw.float()
                            else:
                                grad_ours = grad.numpy().copy()
                                grad_used = grad
                            # torch sees the gradient after the same fp32 multiply by the scale.
                            ref.grad = grad_used * grad_scale
                            opt.step()
                            lib.strata_adamw_step(config["lr"], 0.9, 0.95, 1e-8, weight_decay, step,
                                                  grad_scale, ptr(params, f32p),
                                                  grad_ours.ctypes.data_as(ctypes.c_void_p),
                                                  1 if grads_bf16 else 0, ptr(exp_avg, f32p),
                                                  ptr(exp_avg_sq, f32p), copy_dtype, ptr(copy, u16p),
                                                  count, isa)
                        state = opt.state[ref]
                        theirs = [ref.detach().numpy(), state["exp_avg"].numpy(),
                                  state["exp_avg_sq"].numpy()]
                        errors = [relative_error(o, t) for o, t in zip((params, exp_avg, exp_avg_sq), theirs)]
                        exact = all(np.array_equal(o.view(np.uint32), t.view(np.uint32))
                                    for o, t in zip((params, exp_avg, exp_avg_sq), theirs))
                        copy_dtype_torch = torch.bfloat16 if copy_dtype == 1 else torch.float16
                        copy_theirs = ref.detach().to(copy_dtype_torch).view(torch.int16).numpy().view(np.uint16)
                        label = (f"n={count} wd={weight_decay} grads={'bf16' if grads_bf16 else 'fp32'} "
                                 f"scale={grad_scale} copy={copy_dtype_torch} foreach={foreach} "
                                 f"[{isa_name(isa)}]")
                        if max(errors) > 1e-6:
                            print(f"FAIL {label}: max relative error p/m/v = {errors}")
                            ok = False
                        if not np.array_equal(copy, copy_theirs):
                            print(f"FAIL {label}: compute copy differs from torch's p.to({copy_dtype_torch}) "
                                  f"at {np.count_nonzero(copy != copy_theirs)} of {count}")
                            ok = False
                        worst = max(worst, *errors)
                        identical += exact
                        cases += 1
    print(f"adamw: {cases} cases x 10 steps vs torch.optim.AdamW (foreach False and True): "
          f"max relative error {worst:.3g}, bit-identical p/m/v in {identical}/{cases} cases, "
          f"compute copies bit-identical: {'yes' if ok else 'NO'}")
    return ok


def check_norm(lib):
    ok = True
    torch.manual_seed(2)
    for count in (1, 9, 16384, 16385, 1_000_003):
        values = torch.randn(count) * 3.0
        expected = float(torch.linalg.vector_norm(values.double()) ** 2)
        for isa in isas(lib):
            ours = lib.strata_sum_squares(ptr(values.numpy(), f32p), count, isa)
            if abs(ours - expected) > 1e-12 * expected:
                print(f"FAIL sum_squares n={count} [{isa_name(isa)}]: {ours!r} vs float64 torch {expected!r}")
                ok = False
    for max_norm in (0.5, 1.0, 7.0):
        for scale in (1e-3, 0.1, 1.0, 10.0):
            grads = [torch.randn(1000) * scale, torch.randn(37) * scale]
            params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            total = torch.nn.utils.clip_grad_norm_(params, max_norm)  # fp32 norm, grads scaled
            coefficient = lib.strata_clip_coefficient(float(total), max_norm)
            # torch multiplied each grad by its fp32 coefficient; ours must give the same grads.
            for p, g in zip(params, grads):
                mine = g * torch.tensor(coefficient, dtype=torch.float32)
                if not torch.equal(mine, p.grad):
                    print(f"FAIL clip_coefficient max_norm={max_norm} scale={scale}: "
                          f"ours {coefficient!r}, grads differ")
                    ok = False
    print(f"norm: sum of squares vs float64 torch and clip coefficient vs clip_grad_norm_, "
          f"{'equal' if ok else 'MISMATCH'}")
    return ok


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    lib = load(sys.argv[1])
    mode = sys.argv[2]
    torch.set_num_threads(1)  # the machine is shared; the checks are about bits, not speed
    if mode == "casts16":
        ok = check_casts16(lib)
    elif mode == "casts32":
        ok = check_casts32(lib, sampled="--sampled" in sys.argv[3:])
    elif mode == "adamw":
        ok = check_adamw(lib)
    elif mode == "norm":
        ok = check_norm(lib)
    else:
        print(__doc__)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
