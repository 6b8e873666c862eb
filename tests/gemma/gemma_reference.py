#!/usr/bin/python3
# tests/gemma/gemma_reference.py — an independent PyTorch float64 Gemma with Hugging Face
# GemmaForCausalLM's semantics (Gemma 1), written from HF's modelling, not from strata's code:
# - embeddings times the normalizer √hidden rounded to the hidden dtype (fp32 here), as
#   GemmaModel's torch.tensor(hidden ** 0.5, dtype=hidden dtype);
# - GemmaRMSNorm: x·rsqrt(mean(x²) + eps)·(1 + w) — the gain is 1 + w, so a zero weight is
#   the identity;
# - rotary embeddings as Llama's (rotate_half, cos/sin of cat(freqs, freqs)), no scaling;
# - causal attention over n_head query heads and n_kv_head k/v heads (repeat_kv; Gemma 2B is
#   multi-query), head_dim apart from hidden / heads, scores scaled by head_dim^−½; no biases;
# - GeGLU: down(gelu_tanh(gate(x)) · up(x)), gelu_tanh = torch's gelu(approximate="tanh"),
#   transformers' gelu_pytorch_tanh;
# - a tied (Gemma's) or untied head;
# - optionally PEFT's LoRA on any linear: scale·(x·Aᵀ)·Bᵀ added to its output (forward_logits'
#   `lora`, for test_gemma_train.py's adapter training).
# With "gemma 0" in config.txt the same file computes Llama (RMSNorm gain w, SiLU gate, no
# embedding scale): the control that the harness feeding it is right.
#
# Usage: gemma_reference.py DIR [DIR ...]. Each DIR holds config.txt ("key value" lines: n_layer,
# n_head, n_kv_head, head_dim, n_embd, vocab_size, batch, seq_len, rope_theta, norm_eps, tied,
# gemma, normalizer), tensors.txt ("name dim0 [dim1]"), <name>.f32, tokens.i32 and targets.i32;
# writes out/loss.f64 and out/<name>.grad.f64. Exit 77 when torch cannot be imported.
import math
import os
import sys

try:
    import torch
except ImportError as error:
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({error})", file=sys.stderr)
    sys.exit(77)


def read_raw(path, dtype, count):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    values = torch.frombuffer(data, dtype=dtype)
    if values.numel() != count:
        raise ValueError(f"{path}: {values.numel()} values, expected {count}")
    return values


def embedding_scale(cfg):
    """GemmaModel's normalizer: √hidden as a tensor of the hidden dtype (fp32 for strata's fp32
    weights), so the product is with the rounded value; Llama has none."""
    if not cfg["gemma"]:
        return 1.0
    return torch.tensor(cfg["n_embd"] ** 0.5, dtype=torch.float32).item()


def rms_norm(x, weight, cfg):
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["norm_eps"])
    gain = 1.0 + weight if cfg["gemma"] else weight
    return normed * gain


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_tables(cfg, t):
    dim = int(cfg["head_dim"])
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def expand_kv(x, groups):
    b, kv, t, d = x.shape
    return x[:, :, None].expand(b, kv, groups, t, d).reshape(b, kv * groups, t, d)


def mlp_gate(cfg, gate):
    if cfg["gemma"]:
        return torch.nn.functional.gelu(gate, approximate="tanh")
    return torch.nn.functional.silu(gate)


def block(p, i, x, cfg, cos, sin, lora=None):
    """`lora`: PEFT's LoRA terms, {module path: (A [r, in], B [out, r], scale)}, each added to its
    linear's output as scale·(x·Aᵀ)·Bᵀ (no dropout); None: the plain block."""
    pre = f"model.layers.{i}."
    b, t, _ = x.shape
    nh, nkv, hd = int(cfg["n_head"]), int(cfg["n_kv_head"]), int(cfg["head_dim"])

    def linear(name, z):
        y = torch.nn.functional.linear(z, p[pre + name + ".weight"])
        if lora is not None and pre + name in lora:
            a, b_up, scale = lora[pre + name]
            y = y + scale * torch.nn.functional.linear(torch.nn.functional.linear(z, a), b_up)
        return y

    h = rms_norm(x, p[pre + "input_layernorm.weight"], cfg)
    q = linear("self_attn.q_proj", h).view(b, t, nh, hd).transpose(1, 2)
    k = linear("self_attn.k_proj", h).view(b, t, nkv, hd).transpose(1, 2)
    v = linear("self_attn.v_proj", h).view(b, t, nkv, hd).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k, v = expand_kv(k, nh // nkv), expand_kv(v, nh // nkv)
    causal = torch.triu(torch.full((t, t), float("-inf"), dtype=x.dtype), diagonal=1)
    probs = torch.softmax(q @ k.transpose(2, 3) * hd ** -0.5 + causal, dim=-1)
    att = (probs @ v).transpose(1, 2).reshape(b, t, nh * hd)
    x = x + linear("self_attn.o_proj", att)
    h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], cfg)
    return x + linear("mlp.down_proj", mlp_gate(cfg, linear("mlp.gate_proj", h)) * linear("mlp.up_proj", h))


def forward_logits(params, tokens, cfg, lora=None):
    """Logits [batch, t, vocab] of a full forward over `tokens` [batch, t] (`lora`: block's)."""
    cos, sin = rotary_tables(cfg, tokens.shape[1])
    x = params["model.embed_tokens.weight"][tokens] * embedding_scale(cfg)
    for i in range(int(cfg["n_layer"])):
        x = block(params, i, x, cfg, cos, sin, lora)
    x = rms_norm(x, params["model.norm.weight"], cfg)
    head = params["model.embed_tokens.weight"] if cfg["tied"] else params["lm_head.weight"]
    return torch.nn.functional.linear(x, head)


def loss_of(logits, targets, normalizer=0):
    """Cross-entropy summed over trained targets (negative ones masked) over N: `normalizer`, or
    the trained count."""
    flat = targets.reshape(-1).clone()
    n = normalizer or int((flat >= 0).sum())
    flat[flat < 0] = -100
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat, ignore_index=-100,
                                             reduction="sum") / n


def run_reference(folder):
    cfg = {}
    with open(os.path.join(folder, "config.txt")) as f:
        for line in f:
            key, value = line.split()
            cfg[key] = float(value)
    params = {}
    with open(os.path.join(folder, "tensors.txt")) as f:
        for line in f:
            name, *dims = line.split()
            shape = tuple(int(d) for d in dims)
            raw = read_raw(os.path.join(folder, name + ".f32"), torch.float32, math.prod(shape))
            params[name] = raw.view(shape).double().requires_grad_(True)
    batch, seq = int(cfg["batch"]), int(cfg["seq_len"])
    tokens = read_raw(os.path.join(folder, "tokens.i32"), torch.int32, batch * seq).long().view(batch, seq)
    targets = read_raw(os.path.join(folder, "targets.i32"), torch.int32, batch * seq).long().view(batch, seq)
    loss = loss_of(forward_logits(params, tokens, cfg), targets, int(cfg.get("normalizer", 0)))
    loss.backward()
    out = os.path.join(folder, "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "loss.f64"), "wb") as f:
        f.write(torch.tensor([loss.item()], dtype=torch.float64).numpy().tobytes())
    for name, tensor in params.items():
        with open(os.path.join(out, name + ".grad.f64"), "wb") as f:
            f.write(tensor.grad.detach().contiguous().numpy().tobytes())
    print(f"{folder}: reference loss {loss.item():.10f}")


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        run_reference(folder)
