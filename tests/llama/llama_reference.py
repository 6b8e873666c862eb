#!/usr/bin/python3
# tests/llama/llama_reference.py — an independent PyTorch float64 Llama with Hugging Face
# LlamaForCausalLM's semantics, for tests/llama/test_llama_torch.cpp: RMSNorm computed as
# x·rsqrt(mean(x²) + eps) times the weight, rotary embeddings in the rotate_half convention
# (cos/sin of cat(freqs, freqs)) with the llama3 rope_scaling form, repeat_kv for grouped-query
# attention, SwiGLU MLP down(silu(gate(x)) * up(x)), nn.Linear weights [out, in], a tied or
# untied lm_head. Attention biases as their tensors are given: q/k/v (Qwen2Attention, and
# LlamaAttention's attention_bias) added by nn.Linear before the rotary embedding, and o_proj's
# (LlamaAttention's attention_bias). Written from the HF semantics, not from strata's kernels.
#
# Usage: llama_reference.py DIR [DIR ...]. Each DIR holds config.txt ("key value" lines),
# tensors.txt ("name dim0 [dim1]"), <name>.f32, tokens.i32, targets.i32 (and for a packed batch
# positions.i32 and segments.i32 [batch, seq]: RoPE at each token's position within its example,
# and an explicit causal same-segment attention mask); writes out/loss.f64,
# out/<name>.grad.f64 and out/logits_last.f64, and with "greedy N" in config.txt out/greedy.f64:
# N greedy tokens after the first sequence, each from a whole forward over all before it.
# Exit 77 when torch cannot be imported.
import math
import os
import sys

try:
    import torch
except ImportError as error:
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({error})", file=sys.stderr)
    sys.exit(77)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt2"))
from gpt2_reference import adapted, read_raw  # noqa: E402  (raw files as the C++ tests write them; LoRA terms)


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def inverse_frequencies(cfg):
    dim = int(cfg["head_dim"])
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    factor = cfg["rope_factor"]
    if factor > 0:
        low, high, old = cfg["rope_low"], cfg["rope_high"], cfg["rope_original"]
        low_wavelen = old / low
        high_wavelen = old / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    b, kv, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


def block(p, i, x, cfg, cos, sin, mask=None, lora=None):
    """`mask`: additive attention mask broadcast against [b, heads, t, t]; None: plain causal.
    `lora`: LoRA terms per linear (gpt2_reference.adapted; names as "self_attn.q_proj"), added to
    each nn.Linear's output (bias included) as PEFT's wrapper does; None: the plain block."""
    pre = f"model.layers.{i}."
    b, t, _ = x.shape
    if mask is None:
        mask = torch.triu(torch.full((t, t), float("-inf"), dtype=x.dtype), diagonal=1)
    nh, nkv, hd = int(cfg["n_head"]), int(cfg["n_kv_head"]), int(cfg["head_dim"])
    bias = lambda name: p.get(pre + f"self_attn.{name}.bias")  # noqa: E731  (None: nn.Linear(bias=False))

    def linear(name, z, linear_bias=None):
        return adapted(lora, name, z, torch.nn.functional.linear(z, p[pre + name + ".weight"], linear_bias))

    h = rms_norm(x, p[pre + "input_layernorm.weight"], cfg["norm_eps"])
    q = linear("self_attn.q_proj", h, bias("q_proj"))
    k = linear("self_attn.k_proj", h, bias("k_proj"))
    v = linear("self_attn.v_proj", h, bias("v_proj"))
    q = q.view(b, t, nh, hd).transpose(1, 2)
    k = k.view(b, t, nkv, hd).transpose(1, 2)
    v = v.view(b, t, nkv, hd).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = repeat_kv(k, nh // nkv)
    v = repeat_kv(v, nh // nkv)
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
    probs = torch.softmax(scores + mask, dim=-1)
    att = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, nh * hd)
    x = x + linear("self_attn.o_proj", att, bias("o_proj"))
    h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], cfg["norm_eps"])
    gate = linear("mlp.gate_proj", h)
    up = linear("mlp.up_proj", h)
    return x + linear("mlp.down_proj", torch.nn.functional.silu(gate) * up)


def forward_logits(params, tokens, cfg, positions=None, segments=None):
    """Logits [batch, t, vocab] of a full forward over `tokens` [batch, t]; packed rows when
    `positions` and `segments` ([batch, t]) are given."""
    batch, t = tokens.shape
    if positions is None:
        positions = torch.arange(t).expand(batch, t)
    inv_freq = inverse_frequencies(cfg)
    freqs = positions.to(torch.float64)[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [batch, 1, t, D] against q [batch, heads, t, D]
    allowed = torch.tril(torch.ones(t, t, dtype=torch.bool)).expand(batch, 1, t, t)
    if segments is not None:
        allowed = allowed & (segments[:, :, None] == segments[:, None, :])[:, None]
    mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    x = params["model.embed_tokens.weight"][tokens]
    for i in range(int(cfg["n_layer"])):
        x = block(params, i, x, cfg, cos, sin, mask)
    x = rms_norm(x, params["model.norm.weight"], cfg["norm_eps"])
    head = params["model.embed_tokens.weight"] if cfg["tied"] else params["lm_head.weight"]
    return torch.nn.functional.linear(x, head)


def greedy(params, tokens, cfg, count):
    """`count` greedy tokens after tokens[0], each by a whole forward over everything so far."""
    sequence = tokens[:1].clone()
    produced = []
    with torch.no_grad():
        for _ in range(count):
            nxt = int(torch.argmax(forward_logits(params, sequence, cfg)[0, -1]))
            produced.append(nxt)
            sequence = torch.cat((sequence, torch.tensor([[nxt]], dtype=sequence.dtype)), dim=1)
    return produced


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
    batch, seq, vocab = int(cfg["batch"]), int(cfg["seq_len"]), int(cfg["vocab_size"])
    tokens = read_raw(os.path.join(folder, "tokens.i32"), torch.int32, batch * seq).long().view(batch, seq)
    targets = read_raw(os.path.join(folder, "targets.i32"), torch.int32, batch * seq).long().view(batch, seq)

    positions = segments = None
    if os.path.exists(os.path.join(folder, "segments.i32")):
        positions = read_raw(os.path.join(folder, "positions.i32"), torch.int32, batch * seq).long().view(batch, seq)
        segments = read_raw(os.path.join(folder, "segments.i32"), torch.int32, batch * seq).view(batch, seq)
    logits = forward_logits(params, tokens, cfg, positions, segments)
    # Loss masks: every negative target is ignored (as -100, torch's one ignore_index), and the
    # sum is divided by N: the caller's ("normalizer"), else the trained count.
    flat_targets = targets.view(-1).clone()
    normalizer = int(cfg.get("normalizer", 0)) or int((flat_targets >= 0).sum())
    flat_targets[flat_targets < 0] = -100
    loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), flat_targets, ignore_index=-100,
                                             reduction="sum") / normalizer
    loss.backward()

    out = os.path.join(folder, "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "loss.f64"), "wb") as f:
        f.write(torch.tensor([loss.item()], dtype=torch.float64).numpy().tobytes())
    with open(os.path.join(out, "logits_last.f64"), "wb") as f:
        f.write(logits[:, -1, :].detach().contiguous().numpy().tobytes())
    for name, tensor in params.items():
        with open(os.path.join(out, name + ".grad.f64"), "wb") as f:
            f.write(tensor.grad.detach().contiguous().numpy().tobytes())
    if cfg.get("greedy", 0) > 0:
        with open(os.path.join(out, "greedy.f64"), "wb") as f:
            produced = greedy(params, tokens, cfg, int(cfg["greedy"]))
            f.write(torch.tensor(produced, dtype=torch.float64).numpy().tobytes())
    print(f"{folder}: reference loss {loss.item():.10f}")


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        run_reference(folder)
