#!/usr/bin/python3
# tests/lora/lora_reference.py — the float64 PyTorch reference for tests/lora/test_lora.cpp: one
# GPT-2 or Llama block (gpt2_reference.block / llama_reference.block, Hugging Face semantics) with
# PEFT's LoRA on its targeted linears, written from PEFT's definition, not from strata's kernels:
#     result = base(x) + lora_B(lora_A(dropout(x))) * scaling
# lora_A.weight [r, in], lora_B.weight [out, r] (nn.Linear layout, for GPT-2's Conv1D targets
# too), dropout on the adapter's input only. The dropout mask is strata's documented hash
# (kernels/lora/lora.h), rebuilt here with Python integers: SplitMix64 steps chained over
# (mask_key, target, row, col) — splitmix64(splitmix64(splitmix64(splitmix64(key) + target) + row) + col)
# — an element kept when the top 24 bits of its hash are at least
# ceil(p · 2^24), kept values times 1/(1 − p) rounded to fp32.
#
# Usage: lora_reference.py DIR [DIR ...]. Each DIR holds config.txt ("key value" lines: model,
# n_head, n_kv_head, head_dim, n_embd, batch, seq_len, rope_theta, norm_eps, rank, scale, dropout,
# mask_key), tensors.txt ("name dim0 [dim1]", the block's HF names for layer 0) with <name>.f32,
# lora.txt ("index name in out" per target) with lora.<index>.A.f32 / .B.f32, x_in.f32 and
# d_out.f32 ([batch·seq, C]). Writes out/x_out.f64, out/d_in.f64 and out/lora.<index>.dA.f64 /
# .dB.f64: the block's output and the gradients of sum(x_out · d_out). Exit 77 without torch.
import math
import os
import struct
import sys

try:
    import torch
except ImportError as error:
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({error})", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2"))
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
import gpt2_reference  # noqa: E402
import llama_reference  # noqa: E402
from gpt2_reference import read_raw  # noqa: E402

MASK64 = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def as_fp32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def dropout_mask(mask_key, target, rows, cols, p):
    """[rows, cols] float64 multiplier: 1/(1 − p) (fp32-rounded) where kept, 0 where dropped."""
    threshold = math.ceil(as_fp32(p) * 16777216.0)
    factor = float(torch.tensor(1.0, dtype=torch.float32) / (1.0 - torch.tensor(as_fp32(p), dtype=torch.float32)))
    mask = torch.zeros(rows, cols, dtype=torch.float64)
    for r in range(rows):
        row_hash = splitmix64((splitmix64((splitmix64(mask_key) + target) & MASK64) + r) & MASK64)
        for c in range(cols):
            if (splitmix64((row_hash + c) & MASK64) >> 40) >= threshold:
                mask[r, c] = factor
    return mask


def run_reference(folder):
    cfg = {}
    with open(os.path.join(folder, "config.txt")) as f:
        for line in f:
            key, value = line.split()
            cfg[key] = value
    model = cfg["model"]
    batch, seq = int(cfg["batch"]), int(cfg["seq_len"])
    rank, scale, p = int(cfg["rank"]), float(cfg["scale"]), float(cfg["dropout"])
    mask_key = int(cfg["mask_key"])
    params = {}
    with open(os.path.join(folder, "tensors.txt")) as f:
        for line in f:
            name, *dims = line.split()
            shape = tuple(int(d) for d in dims)
            params[name] = read_raw(os.path.join(folder, name + ".f32"), torch.float32, math.prod(shape)).view(shape).double()
    adapters = {}  # linear name → (index, A, B)
    with open(os.path.join(folder, "lora.txt")) as f:
        for line in f:
            index, name, n_in, n_out = line.split()
            index, n_in, n_out = int(index), int(n_in), int(n_out)
            a = read_raw(os.path.join(folder, f"lora.{index}.A.f32"), torch.float32, rank * n_in).view(rank, n_in)
            b = read_raw(os.path.join(folder, f"lora.{index}.B.f32"), torch.float32, n_out * rank).view(n_out, rank)
            adapters[name] = (index, a.double().requires_grad_(True), b.double().requires_grad_(True))
    c = int(cfg["n_embd"])
    x_in = read_raw(os.path.join(folder, "x_in.f32"), torch.float32, batch * seq * c).double()
    x_in = x_in.view(batch, seq, c).requires_grad_(True)
    d_out = read_raw(os.path.join(folder, "d_out.f32"), torch.float32, batch * seq * c).double().view(batch, seq, c)

    def lora(name, x):
        if name not in adapters:
            return None
        index, a, b = adapters[name]
        dropped = x
        if p > 0:
            dropped = x * dropout_mask(mask_key, index, batch * seq, x.shape[-1], p).view(x.shape)
        return torch.nn.functional.linear(torch.nn.functional.linear(dropped, a), b) * scale

    if model == "gpt2":
        x_out = gpt2_reference.block(params, 0, x_in, int(cfg["n_head"]), lora=lora)
    else:
        lcfg = {key: float(cfg[key]) for key in ("n_head", "n_kv_head", "head_dim", "rope_theta", "norm_eps")}
        lcfg["rope_factor"] = 0.0
        inv_freq = llama_reference.inverse_frequencies(lcfg)
        freqs = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        x_out = llama_reference.block(params, 0, x_in, lcfg, emb.cos(), emb.sin(), lora=lora)
    (x_out * d_out).sum().backward()

    out = os.path.join(folder, "out")
    os.makedirs(out, exist_ok=True)

    def write(name, tensor):
        with open(os.path.join(out, name), "wb") as f:
            f.write(tensor.detach().contiguous().numpy().tobytes())

    write("x_out.f64", x_out)
    write("d_in.f64", x_in.grad)
    for index, a, b in adapters.values():
        write(f"lora.{index}.dA.f64", a.grad)
        write(f"lora.{index}.dB.f64", b.grad)
    print(f"{folder}: reference block with {len(adapters)} adapters, dropout {p}")


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        run_reference(folder)
