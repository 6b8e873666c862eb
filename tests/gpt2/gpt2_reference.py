#!/usr/bin/python3
# tests/gpt2/gpt2_reference.py — the PyTorch reference for tests/gpt2/test_gpt2_torch.cpp.
# A plain-torch GPT-2 with Hugging Face GPT2LMHeadModel's semantics (no dropout, Conv1D weights
# [in, out], gelu_new, LayerNorm eps 1e-5, tied head), evaluated in float64 on the weights and
# tokens the C++ test wrote, so the C++ fp32 result is checked against a reference whose own
# rounding error is negligible. Writes the loss, every gradient and the last-position logits
# back as float64 files.
#
# Usage: gpt2_reference.py DIR [DIR ...] (one torch start-up for several models). Each DIR holds
# config.txt ("n_layer n_head n_embd vocab n_ctx
# batch seq_len"), tensors.txt ("name rows cols" per line, cols 1 for 1-D), <name>.f32 (raw
# little-endian float32), tokens.i32 and targets.i32 (raw little-endian int32 [batch, seq]), and
# for a packed batch (several examples per row) positions.i32 and segments.i32 ([batch, seq]):
# wpe is looked up at each token's position within its example, and attention gets an explicit
# mask — causal and same-segment — written from the definition, not from the kernels' run starts.
# Exit 77 (Meson's skip code) when torch cannot be imported.
import math
import os
import sys

try:
    import torch
except ImportError as error:
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({error}); "
          "install Debian's python3-torch", file=sys.stderr)
    sys.exit(77)


def read_raw(path, dtype, count):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    tensor = torch.frombuffer(data, dtype=dtype)
    assert tensor.numel() == count, (path, tensor.numel(), count)
    return tensor.clone()


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, weight, bias):
    # HF Conv1D: addmm(bias, x.view(-1, nx), weight), weight stored [in, out].
    shape = x.shape[:-1] + (weight.shape[1],)
    return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight).view(shape)


def adapted(lora, name, x, y):
    """y, plus the LoRA term of the linear `name` on its input x when `lora` (a function of
    (name, x) giving the term, or None for an untargeted linear) has one (tests/lora)."""
    if lora is None:
        return y
    term = lora(name, x)
    return y if term is None else y + term


def attention(p, prefix, x, n_head, allowed=None, lora=None):
    """`allowed` [b, 1, t, t] (query, key) pairs that may attend; None: plain causal."""
    b, t, c = x.shape
    if allowed is None:
        allowed = torch.tril(torch.ones(t, t, dtype=torch.bool))
    hd = c // n_head
    qkv = adapted(lora, "attn.c_attn", x, conv1d(x, p[prefix + "attn.c_attn.weight"], p[prefix + "attn.c_attn.bias"]))
    q, k, v = qkv.split(c, dim=2)

    def heads(z):
        return z.view(b, t, n_head, hd).permute(0, 2, 1, 3)

    q, k, v = heads(q), heads(k), heads(v)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    scores = torch.where(allowed, scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, t, c)
    return adapted(lora, "attn.c_proj", out, conv1d(out, p[prefix + "attn.c_proj.weight"], p[prefix + "attn.c_proj.bias"]))


def block(p, i, x, n_head, allowed=None, lora=None):
    """`lora`: LoRA terms per linear (see `adapted`); None: the plain block."""
    prefix = f"h.{i}."
    c = x.shape[-1]
    h = torch.nn.functional.layer_norm(x, (c,), p[prefix + "ln_1.weight"], p[prefix + "ln_1.bias"], eps=1e-5)
    x = x + attention(p, prefix, h, n_head, allowed, lora)
    h = torch.nn.functional.layer_norm(x, (c,), p[prefix + "ln_2.weight"], p[prefix + "ln_2.bias"], eps=1e-5)
    h = gelu_new(adapted(lora, "mlp.c_fc", h, conv1d(h, p[prefix + "mlp.c_fc.weight"], p[prefix + "mlp.c_fc.bias"])))
    return x + adapted(lora, "mlp.c_proj", h, conv1d(h, p[prefix + "mlp.c_proj.weight"], p[prefix + "mlp.c_proj.bias"]))


def run_reference(folder):
    with open(os.path.join(folder, "config.txt")) as f:
        n_layer, n_head, n_embd, vocab, n_ctx, batch, seq = (int(v) for v in f.read().split())
    params = {}
    with open(os.path.join(folder, "tensors.txt")) as f:
        for line in f:
            name, rows, cols = line.split()
            rows, cols = int(rows), int(cols)
            raw = read_raw(os.path.join(folder, name + ".f32"), torch.float32, rows * cols)
            shape = (rows,) if cols == 1 else (rows, cols)
            params[name] = raw.view(shape).double().requires_grad_(True)
    tokens = read_raw(os.path.join(folder, "tokens.i32"), torch.int32, batch * seq).long().view(batch, seq)
    targets = read_raw(os.path.join(folder, "targets.i32"), torch.int32, batch * seq).long().view(batch, seq)
    assert params["wte.weight"].shape == (vocab, n_embd) and params["wpe.weight"].shape == (n_ctx, n_embd)

    # allowed[b, 1, q, k]: query q may attend to key k.
    allowed = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).expand(batch, 1, seq, seq)
    positions = torch.arange(seq).expand(batch, seq)
    if os.path.exists(os.path.join(folder, "segments.i32")):
        positions = read_raw(os.path.join(folder, "positions.i32"), torch.int32, batch * seq).long().view(batch, seq)
        segments = read_raw(os.path.join(folder, "segments.i32"), torch.int32, batch * seq).view(batch, seq)
        same = segments[:, :, None] == segments[:, None, :]
        allowed = allowed & same[:, None, :, :]
    x = params["wte.weight"][tokens] + params["wpe.weight"][positions]
    for i in range(n_layer):
        x = block(params, i, x, n_head, allowed)
    x = torch.nn.functional.layer_norm(x, (n_embd,), params["ln_f.weight"], params["ln_f.bias"], eps=1e-5)
    logits = torch.matmul(x, params["wte.weight"].t())
    # Loss masks: every negative target is ignored (torch's ignore_index takes one value, so
    # they all become -100); the sum is divided by N, the caller's or the trained count.
    normalizer = 0
    normalizer_path = os.path.join(folder, "normalizer.txt")
    if os.path.exists(normalizer_path):
        with open(normalizer_path) as f:
            normalizer = int(f.read())
    flat_targets = targets.view(-1).clone()
    if normalizer == 0:
        normalizer = int((flat_targets >= 0).sum())
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
    print(f"{folder}: reference loss {loss.item():.10f}")


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        run_reference(folder)
