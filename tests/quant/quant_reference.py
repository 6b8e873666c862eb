#!/usr/bin/python3
"""tests/quant/quant_reference.py — proves kernels/quant (NF4, int8, double-quantised absmax)
against an independent numpy/torch implementation written from QLoRA's and bitsandbytes'
descriptions (not from the C++): the quantised buffer must equal ours byte for byte (codes,
absmax, the double-quant trio, raw copies, zero padding, every piece on a 64-byte boundary)
and the dequantised values bit for bit, on random tensors with the edges (a block of zeros, a
size not a multiple of 64, one element, huge and tiny magnitudes, exact midpoints between NF4
levels); and the round trip stays within the format's error bound. Also checks that the NF4
table is the normal-quantile construction it claims to be.

Usage: quant_reference.py LIBSTRATA_QUANT_CAPI.so   (exit 77 when numpy or torch is missing)
"""
import ctypes
import sys

try:
    import numpy as np
    import torch
except ImportError as error:  # Meson's skip code: the reference cannot run here
    print(f"skip: {error}")
    sys.exit(77)

ALIGN = 64
BLOCK = 64
ABSMAX_BLOCK = 256
F32 = np.float32

# bitsandbytes' NF4 table (functional.py get_4bit_type("nf4")).
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=F32)
# dQuantizeNF4's decision tree compares x > t against the midpoints of adjacent levels.
NF4_THRESHOLDS = ((NF4[:-1] + NF4[1:]) * F32(0.5)).astype(F32)

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message)


def normal_map_levels():
    """create_normal_map(offset=0.9677083, use_extra_value=True) with torch's normal quantile."""
    offset = 0.9677083
    positive = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double())
    negative = -torch.special.ndtri(torch.linspace(offset, 0.5, 8)[:-1].double())
    values = torch.cat([positive, torch.zeros(1, dtype=torch.float64), negative]).float()
    values = values.sort().values
    return (values / values.max()).numpy()


def dynamic_map_signed():
    """bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)."""
    data = []
    for i in range(7):
        boundaries = torch.linspace(0.1, 1, 2 ** i + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0, 1.0]
    assert len(data) == 256
    data.sort()
    return np.array(data, dtype=F32)


DYNAMIC = dynamic_map_signed()


def dquantize_search(x):
    """bitsandbytes' dQuantize<0> (csrc/kernels.cu), vectorised: the binary search over the
    sorted map from index 127, then the fp32 midpoint with the neighbour on x's side."""
    x = x.astype(F32)
    pivot = np.full(x.shape, 127, dtype=np.int64)
    lower_pivot = np.zeros(x.shape, dtype=np.int64)
    upper_pivot = np.full(x.shape, 255, dtype=np.int64)
    lower = np.full(x.shape, -1.0, dtype=F32)
    upper = np.full(x.shape, 1.0, dtype=F32)
    val = DYNAMIC[pivot]
    step = 64
    while step > 0:
        above = x > val
        lower_pivot = np.where(above, pivot, lower_pivot)
        lower = np.where(above, val, lower)
        upper_pivot = np.where(above, upper_pivot, pivot)
        upper = np.where(above, upper, val)
        pivot = np.where(above, pivot + step, pivot - step)
        val = DYNAMIC[pivot]
        step //= 2
    upper = np.where(upper_pivot == 255, DYNAMIC[255], upper)
    lower = np.where(lower_pivot == 0, DYNAMIC[0], lower)
    above = x > val
    mid_up = ((upper + val) * F32(0.5)).astype(F32)
    mid_down = ((lower + val) * F32(0.5)).astype(F32)
    return np.where(above, np.where(x > mid_up, upper_pivot, pivot),
                    np.where(x < mid_down, lower_pivot, pivot)).astype(np.uint8)


def block_absmax(x):
    n = x.size
    blocks = -(-n // BLOCK)
    padded = np.zeros(blocks * BLOCK, dtype=F32)
    padded[:n] = np.abs(x)
    return padded.reshape(blocks, BLOCK).max(axis=1).astype(F32)


def per_element(values_per_block, n):
    return np.repeat(values_per_block, BLOCK)[:n]


def quantize_nf4(x, absmax):
    # x * (1/absmax) with the reciprocal in fp32; a zero block is scaled by 1 (all codes 7); a
    # block whose reciprocal overflows (subnormal absmax) divides instead
    safe = np.where(absmax == 0, F32(1.0), absmax)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        inverse = (F32(1.0) / safe).astype(F32)
        per_inverse = per_element(inverse, x.size)
        scaled = np.where(np.isinf(per_inverse), x / per_element(safe, x.size), x * per_inverse).astype(F32)
    codes = np.searchsorted(NF4_THRESHOLDS, scaled, side="left").astype(np.uint8)  # count of t < x
    if codes.size % 2:
        codes = np.concatenate([codes, np.zeros(1, dtype=np.uint8)])
    return (codes[0::2] << 4 | codes[1::2]).astype(np.uint8)


def dequantize_nf4(packed, absmax, n):
    codes = np.empty(packed.size * 2, dtype=np.uint8)
    codes[0::2] = packed >> 4
    codes[1::2] = packed & 0xF
    return (NF4[codes[:n]] * per_element(absmax, n)).astype(F32)


def quantize_int8(x, absmax):
    scale = torch.from_numpy(absmax) / 127.0
    xs = torch.from_numpy(x)
    per = torch.from_numpy(per_element(scale.numpy(), x.size))
    safe = torch.where(per == 0, torch.ones_like(per), per)
    q = torch.round(xs / safe).clamp(-127, 127)
    q = torch.where(per == 0, torch.zeros_like(q), q)
    return q.to(torch.int8).numpy()


def dequantize_int8(codes, absmax, n):
    scale = (absmax / F32(127.0)).astype(F32)
    return (codes.astype(F32) * per_element(scale, n)).astype(F32)


def double_quantize(absmax):
    """QLoRA's double quantisation as bitsandbytes does it: centre on the mean, 256-blocks,
    8-bit dynamic map. The mean: sequential double sum, first block first, rounded to fp32."""
    mean = F32(np.cumsum(absmax.astype(np.float64))[-1] / absmax.size)
    centred = (absmax - mean).astype(F32)
    groups = -(-centred.size // ABSMAX_BLOCK)
    padded = np.zeros(groups * ABSMAX_BLOCK, dtype=F32)
    padded[:centred.size] = np.abs(centred)
    absmax2 = padded.reshape(groups, ABSMAX_BLOCK).max(axis=1).astype(F32)
    inverse = (F32(1.0) / np.where(absmax2 == 0, F32(1.0), absmax2)).astype(F32)
    scaled = (centred * np.repeat(inverse, ABSMAX_BLOCK)[:centred.size]).astype(F32)
    return dquantize_search(scaled), absmax2, mean


def double_dequantize(codes, absmax2, mean):
    product = (DYNAMIC[codes] * np.repeat(absmax2, ABSMAX_BLOCK)[:codes.size]).astype(F32)
    return (product + mean).astype(F32)


def align(n):
    return -(-n // ALIGN) * ALIGN


def reference_unit(kind, double_quant, tensors, plans):
    """The whole quantised buffer as docs/quant.md describes it, and the dequantised unit."""
    buffer = bytearray()
    offsets = []
    out = []

    def put(raw):
        at = len(buffer)
        buffer.extend(raw)
        buffer.extend(bytes(align(len(buffer)) - len(buffer)))
        return at

    for x, quantize in zip(tensors, plans):
        n = x.size
        if not quantize:
            offsets.append([put(x.tobytes()), -1, -1, -1, -1])
            out.append(x.copy())
            continue
        absmax = block_absmax(x)
        codes = quantize_nf4(x, absmax) if kind == "nf4" else quantize_int8(x, absmax)
        piece = [-1, put(codes.tobytes())]
        if double_quant:
            qcodes, absmax2, mean = double_quantize(absmax)
            piece += [put(qcodes.tobytes()), put(absmax2.tobytes()), put(np.array([mean], F32).tobytes())]
            read_absmax = double_dequantize(qcodes, absmax2, mean)
        else:
            piece += [put(absmax.tobytes()), -1, -1]
            read_absmax = absmax
        offsets.append(piece)
        out.append(dequantize_nf4(codes, read_absmax, n) if kind == "nf4" else dequantize_int8(codes, read_absmax, n))
    return bytes(buffer), offsets, np.concatenate(out) if out else np.zeros(0, F32)


class Capi:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.strata_quant_layout.restype = ctypes.c_uint64

    def _args(self, kind, double_quant, tensors, plans):
        counts = np.array([t.size for t in tensors], dtype=np.uint64)
        quantize = np.array([1 if p else 0 for p in plans], dtype=np.uint8)
        return (ctypes.c_int(0 if kind == "nf4" else 1), ctypes.c_int(1 if double_quant else 0),
                counts.ctypes.data_as(ctypes.c_void_p), quantize.ctypes.data_as(ctypes.c_void_p),
                ctypes.c_size_t(len(tensors))), (counts, quantize)

    @staticmethod
    def aligned(size_bytes):
        raw = np.zeros(size_bytes + ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        return raw[start:start + size_bytes]

    def run(self, kind, double_quant, tensors, plans):
        args, keep = self._args(kind, double_quant, tensors, plans)
        offsets = np.zeros(5 * len(tensors), dtype=np.int64)
        size = self.lib.strata_quant_layout(*args, offsets.ctypes.data_as(ctypes.c_void_p))
        unit = np.concatenate(tensors).astype(F32) if tensors else np.zeros(0, F32)
        buffer = self.aligned(size)
        buffer[:] = 0xA5  # quantize_unit must write every byte, padding included
        self.lib.strata_quant_quantize(*args, unit.ctypes.data_as(ctypes.c_void_p), buffer.ctypes.data_as(ctypes.c_void_p))
        outs = []
        for isa in (0, 1):  # the vector loop where the CPU has it, then the scalar reference loop
            out = np.full(unit.size, np.nan, dtype=F32)
            self.lib.strata_quant_dequantize(*args, buffer.ctypes.data_as(ctypes.c_void_p),
                                             out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(isa))
            outs.append(out)
        del keep
        return buffer.tobytes(), offsets.reshape(-1, 5).tolist(), outs


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(capi, name, kind, double_quant, tensors, plans):
    want_buffer, want_offsets, want_out = reference_unit(kind, double_quant, tensors, plans)
    got_buffer, got_offsets, got_outs = capi.run(kind, double_quant, tensors, plans)
    label = f"{name} [{kind}{' +dq' if double_quant else ''}]"
    check(got_offsets == want_offsets, f"{label}: piece offsets {got_offsets} != {want_offsets}")
    check(all(o % ALIGN == 0 for row in got_offsets for o in row if o >= 0), f"{label}: a piece is not 64-byte aligned")
    if got_buffer != want_buffer:
        i = first_difference(got_buffer, want_buffer)
        check(False, f"{label}: quantised buffer differs at byte {i} of {len(want_buffer)} "
                     f"(got {got_buffer[i:i+8].hex()} want {want_buffer[i:i+8].hex()})")
    for isa, got_out in zip(("best", "scalar"), got_outs):
        same = got_out.view(np.uint32) == want_out.view(np.uint32)
        if not same.all():
            i = int(np.argmin(same))
            check(False, f"{label} ({isa} loop): dequantised element {i} is {got_out[i]!r}, reference {want_out[i]!r}")
    return got_outs[0]


def round_trip_bounds(name, kind, x, out):
    """NF4 (exact absmax): |x - x̂| <= half the widest level gap · absmax — the nearest level is at
    most half its interval away; int8: <= scale / 2. Slack: the fp32 roundings of the scaling."""
    absmax = per_element(block_absmax(x), x.size).astype(np.float64)
    err = np.abs(x.astype(np.float64) - out.astype(np.float64))
    if kind == "nf4":
        bound = 0.5 * float(np.max(np.diff(NF4.astype(np.float64)))) * absmax
    else:
        bound = 0.5 * absmax / 127.0
    slack = 4 * np.finfo(np.float32).eps * absmax + np.finfo(np.float32).tiny
    worst = float(np.max(err - (bound + slack))) if x.size else -1.0
    check(worst <= 0, f"{name} [{kind}]: round-trip error exceeds its bound by {worst}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    capi = Capi(sys.argv[1])
    rng = np.random.default_rng(31)

    # The NF4 table is the normal-quantile construction (to fp32 rounding of a different ppf).
    levels = normal_map_levels()
    check(np.max(np.abs(levels - NF4)) < 2e-7, f"NF4 table differs from create_normal_map by {np.max(np.abs(levels - NF4))}")
    check(NF4[7] == 0.0 and NF4[0] == -1.0 and NF4[15] == 1.0, "NF4 table ends and zero")

    def normal(n, scale=1.0):
        return (rng.standard_normal(n) * scale).astype(F32)

    zeros_inside = normal(64 * 5)
    zeros_inside[128:192] = 0.0  # one whole block of zeros
    ties = np.concatenate([[1.0], NF4_THRESHOLDS, np.nextafter(NF4_THRESHOLDS, F32(2)), -np.ones(1)]).astype(F32)
    ties = np.concatenate([ties, np.zeros(64 - ties.size % 64, dtype=F32)]) if ties.size % 64 else ties
    int8_ties = (np.array([127.0] + [k + 0.5 for k in range(-20, 20)], dtype=np.float64) / 127.0).astype(F32)
    mixed = normal(64 * 7 + 13)
    mixed[:64] *= F32(1e30)
    mixed[64:128] *= F32(1e-30)
    mixed[128:192] = (rng.standard_normal(64) * 1e-40).astype(F32)  # subnormals
    mixed[192:256] = np.float32(3.0e38) * np.sign(rng.standard_normal(64)).astype(F32)

    cases = {
        "one block": ([normal(64)], [True]),
        "not a multiple of 64": ([normal(1000)], [True]),
        "one element": ([normal(1)], [True]),
        "odd count": ([normal(65), normal(63)], [True, True]),
        "a block of zeros": ([zeros_inside], [True]),
        "all zeros": ([np.zeros(200, F32)], [True]),
        "exact NF4 midpoints": ([ties], [True]),
        "exact int8 halves": ([int8_ties], [True]),
        "huge and tiny": ([mixed], [True]),
        # A unit like a transformer block: norms raw, linears quantised, several absmax groups.
        "unit": ([normal(96) + 1, normal(64 * 700 + 5, 0.02), normal(96), normal(64 * 257, 0.05), normal(33)],
                 [False, True, False, True, False]),
        "many absmax groups": ([normal(64 * 256 * 3 + 64 * 17 + 9, 0.03)], [True]),
    }
    for kind in ("nf4", "int8"):
        for double_quant in (False, True):
            for name, (tensors, plans) in cases.items():
                out = compare(capi, name, kind, double_quant, tensors, plans)
                if not double_quant:
                    offset = 0
                    for x, quantize in zip(tensors, plans):
                        if quantize:
                            round_trip_bounds(name, kind, x, out[offset:offset + x.size])
                        else:
                            check(np.array_equal(out[offset:offset + x.size].view(np.uint32), x.view(np.uint32)),
                                  f"{name}: raw tensor not copied as it is")
                        offset += x.size
    # Double quant costs little accuracy: the absmax it reads back is within 1% of the exact one
    # for weights of one scale (QLoRA's argument for it).
    x = normal(64 * 4096, 0.02)
    absmax = block_absmax(x)
    codes, absmax2, mean = double_quantize(absmax)
    rel = np.max(np.abs(double_dequantize(codes, absmax2, mean) - absmax) / absmax)
    check(rel < 0.01, f"double-quantised absmax off by {rel:.4f} relative")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"ok: {len(cases) * 4} units, buffers and values bit for bit; bounds hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
