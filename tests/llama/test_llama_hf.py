#!/usr/bin/python3
# tests/llama/test_llama_hf.py — a Llama Hugging Face folder end to end through the `strata` binary.
#
#   roundtrip  a tiny Llama folder written here (config.json with llama3 rope_scaling, 6 query
#              heads over 3 k/v heads, head_dim 16, untied head; model.safetensors; a byte-level
#              tokenizer.json) → `strata train` with `model: {init: DIR, seq_len: 16}`, 3 fp32
#              steps (printing the end-of-run sample through the folder's tokenizer) → `--export
#              OUT`: every tensor within 1e-4 of a float64 torch training of the same steps
#              (test_llama_train.py's loop); OUT carries the tokenizer; OUT loads back
#              (train 0 steps from it, export again: bit-identical); `strata generate --model OUT`
#              encodes the prompt with OUT's tokenizer and its greedy tokens equal a float64 torch
#              Llama's (HF semantics, a whole forward per token) from OUT's weights, across a
#              window refill; the text is the tokens' bytes.
#   qwen2      a tiny Qwen 2 folder written here in bf16 (config.json as Qwen2.5's: model_type
#              qwen2, use_sliding_window false with a sliding_window and max_window_layers,
#              rope_theta 1e6, rms_norm_eps 1e-6, tied; 3 k/v heads × 2 groups, head_dim 16;
#              random nonzero q/k/v biases) → train 3 fp32 steps → --export OUT: every tensor,
#              the biases too, within 1e-4 of torch's training (HF's Qwen2 semantics: the biases
#              before RoPE, no decay on them); OUT's config.json says qwen2 and loads back bit for
#              bit; `strata generate --model OUT` greedy tokens equal torch's.
#   phi3       a tiny Phi-3 folder written here (config.json as Phi-3-mini-4k's: model_type phi3,
#              sliding_window, no biases, untied; q/k/v stacked in self_attn.qkv_proj and gate/up
#              in mlp.gate_up_proj): an independent float64 Phi-3 forward over the fused weights
#              (Phi3Attention's slicing, Phi3MLP's chunk) equals the Llama reference on the parts;
#              train 3 fp32 steps → --export OUT: config.json says phi3 with the window, the
#              tensors are fused again and, split, within 1e-4 of torch's training; OUT loads back
#              bit for bit; greedy tokens equal the Phi-3 forward's; a seq_len past the window is
#              refused in one line naming model.seq_len.
#   offload    a Llama folder 2.5× larger than its budgets generates from NVMe each pass, the
#              scheduler's pool within its budget and the peak RSS within the budgets plus the
#              process's baseline (measured on the tiny model).
# Usage: test_llama_hf.py STRATA CASE. Exit 77 where torch or numpy is missing.
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
sys.path.insert(0, HERE)
import test_train as tt  # noqa: E402  (strata runner, safetensors helpers; reads sys.argv[1])
from test_llama_train import (LLAMA, QWEN2, compare_with_torch, import_torch, initial_value,  # noqa: E402
                              reference_config, shapes_of, torch_training)

CASE = sys.argv[2]


def hf_config(model):
    rs = model["rope_scaling"]
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": model["n_embd"],
            "intermediate_size": model["intermediate_size"], "num_hidden_layers": model["n_layer"],
            "num_attention_heads": model["n_head"], "num_key_value_heads": model["n_kv_head"],
            "head_dim": model["head_dim"], "vocab_size": model["vocab_size"], "max_position_embeddings": 64,
            "rope_theta": model["rope_theta"],
            "rope_scaling": {"rope_type": "llama3", "factor": rs["factor"], "low_freq_factor": rs["low_freq_factor"],
                             "high_freq_factor": rs["high_freq_factor"],
                             "original_max_position_embeddings": rs["original_max_position_embeddings"]},
            "rms_norm_eps": model["norm_eps"], "tie_word_embeddings": model.get("tie_word_embeddings", True),
            "hidden_act": "silu", "torch_dtype": "float32"}


def hf_qwen2_config(model):
    """Qwen2.5's config.json shape: the window named but off, no attention_bias key (Qwen2's
    q/k/v biases are implied by the model type). head_dim is given (newer transformers read it
    for Qwen 2) because the test's odd shape has head_dim ≠ hidden_size / heads."""
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": model["n_embd"],
            "intermediate_size": model["intermediate_size"], "num_hidden_layers": model["n_layer"],
            "num_attention_heads": model["n_head"], "num_key_value_heads": model["n_kv_head"],
            "head_dim": model["head_dim"], "vocab_size": model["vocab_size"], "max_position_embeddings": 64,
            "rope_theta": model["rope_theta"], "rope_scaling": None, "rms_norm_eps": model["norm_eps"], "use_sliding_window": False,
            "sliding_window": 64, "max_window_layers": 1, "tie_word_embeddings": model.get("tie_word_embeddings", True),
            "hidden_act": "silu", "attention_dropout": 0.0, "torch_dtype": "bfloat16"}


def write_safetensors_bf16(torch, path, tensors):
    """tensors: name → float tensor, written as BF16 (rounded to nearest even by torch)."""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        raw = value.bfloat16().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def byte_tokenizer_json():
    """A byte-level BPE whose first 256 tokens are the bytes (GPT-2's byte alphabet) — the
    text-bytes ids the model trains on — plus one merge, "Th" = 256, so a prompt encoded by the
    tokenizer differs from its bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    codes, extra = {}, 0
    for b in range(256):
        if b in printable:
            codes[b] = b
        else:
            codes[b] = 256 + extra
            extra += 1
    vocab = {chr(codes[b]): b for b in range(256)}
    vocab["Th"] = 256
    return {"version": "1.0", "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": ["T h"]}}


def detokenize(ids):
    return b"".join(b"Th" if i == 256 else bytes([i]) for i in ids)


def write_llama_folder(torch, folder, model, seed, std=0.08, bf16=False, config=None):
    """The folder's weights (fp32, or bf16 with `bf16`), config.json (hf_config unless given) and
    tokenizer; returns the initial weights as fp32 tensors (bf16 ones widened exactly)."""
    os.makedirs(folder)
    torch.manual_seed(seed)
    init = {name: initial_value(torch, name, shape, std).float() for name, shape in shapes_of(model).items()}
    if bf16:
        init = {name: value.bfloat16().float() for name, value in init.items()}
        write_safetensors_bf16(torch, os.path.join(folder, "model.safetensors"), init)
    else:
        tt.write_safetensors(os.path.join(folder, "model.safetensors"),
                             {name: (tuple(value.shape), value.numpy().tobytes()) for name, value in init.items()})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config or hf_config(model), f)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(byte_tokenizer_json(), f)
    return init


def train_config(folder, name, init, steps, sample=None):
    nvme = os.path.join(folder, name + "-nvme")
    os.makedirs(nvme)
    cfg = {"model": {"init": init, "seq_len": 16}, "data": {"path": tt.CORPUS, "format": "text-bytes"},
           "batch_size": 3, "steps": steps,
           "optimizer": {"lr": 1.0e-3, "betas": [0.9, 0.95], "eps": 1.0e-6, "weight_decay": 0.1, "grad_clip": 1.0},
           "precision": "fp32", "device": {"kind": "cpu", "memory": "64MiB"}, "host": {"memory": "64MiB"},
           "nvme": {"paths": [nvme]}, "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
           "checkpoint_every": 10}
    if sample:
        cfg["sample"] = sample
    path = os.path.join(folder, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path, cfg


def read_folder_tensors(torch, folder):
    tensors, _ = tt.read_safetensors(os.path.join(folder, "model.safetensors"))
    return tensors


def torch_greedy(torch, params, model, prompt, count, window):
    """Greedy tokens of a float64 HF-semantics Llama, a whole forward over the window per token;
    a full window keeps its last half (as strata generate does). With each token, the margin
    between the two best logits (a near-tie may go either way in fp32)."""
    import llama_reference as ref
    cfg = reference_config(model)
    context, start, out = list(prompt), 0, []
    with torch.no_grad():
        for _ in range(count):
            logits = ref.forward_logits(params, torch.tensor([context[start:]]), cfg)[0, -1]
            top2 = torch.topk(logits, 2).values
            nxt = int(torch.argmax(logits))
            out.append((nxt, float(top2[0] - top2[1])))
            context.append(nxt)
            if len(context) - start > window:
                start = len(context) - window // 2
    return out


def generate(model_dir, nvme, budget, *extra, temperature="0"):
    result = tt.strata("--log-level", "warn", "generate", "--model", model_dir, "--nvme", nvme, "--host-memory",
                       budget, "--device-memory", budget, "--precision", "fp32", "--temperature", temperature, "--json",
                       *extra)
    return json.loads(result.stdout)


def case_roundtrip(folder):
    torch = import_torch()
    model = {**LLAMA, "vocab_size": 260, "tie_word_embeddings": False}
    hf_dir = os.path.join(folder, "tiny-llama")
    init = write_llama_folder(torch, hf_dir, model, seed=5)

    # Folder → train 3 steps → export a folder; against torch's training of the same steps.
    cfg_path, cfg = train_config(folder, "train", hf_dir, steps=3, sample={"tokens": 8, "prompt": "The"})
    out = os.path.join(folder, "out")
    # (the sample may hold bytes that are not UTF-8: read stderr leniently)
    trained = subprocess.run([tt.STRATA, "train", cfg_path, "--export", out], capture_output=True, text=True,
                             errors="replace", timeout=600)
    if trained.returncode != 0:
        tt.fail(f"strata train exited {trained.returncode}:\n{trained.stderr}")
    # The end-of-run sample: the Llama store through generation, the folder's tokenizer.
    if "sample from the trained model" not in trained.stderr:
        tt.fail(f"strata train printed no sample:\n{trained.stderr[-600:]}")
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        tt.fail(f"{out} holds no tokenizer.json: {sorted(os.listdir(out))}")
    ours = read_folder_tensors(torch, out)
    _, ref_params = torch_training(torch, model, init, cfg)
    worst = compare_with_torch(torch, ours, ref_params, set(init), "roundtrip")
    print(f"roundtrip: {len(init)} trained weights within {worst:.2e} of torch")

    # The exported folder loads back bit for bit.
    again_path, _ = train_config(folder, "again", out, steps=0)
    out2 = os.path.join(folder, "out2")
    tt.strata("train", again_path, "--export", out2)
    again = read_folder_tensors(torch, out2)
    for name in ours:
        if again[name] != ours[name]:
            tt.fail(f"{name}: {out} → strata → {out2} is not bit-identical")

    # Generation from the exported folder with its tokenizer, against torch's greedy tokens.
    prompt_text, count = "Thé ", 24  # 4 tokens + 24: one refill of the 16-position window
    prompt_ids = [256] + list("é ".encode())
    got = generate(out, os.path.join(folder, "gen-nvme"), "8MiB", "--prompt", prompt_text, "--tokens", str(count),
                   "--seq-len", "16")
    params = {name: torch.frombuffer(bytearray(raw), dtype=torch.float32).double().view(init[name].shape)
              for name, raw in ours.items()}
    compare_greedy(got, torch_greedy(torch, params, model, prompt_ids, count, 16))
    raw = detokenize(got["tokens"])
    try:
        expected_text = raw.decode("utf-8")
    except UnicodeDecodeError:
        expected_text = None
    if expected_text is not None and got["text"] != expected_text:
        tt.fail(f"the text {got['text']!r} is not the tokens' bytes {raw!r}")
    if got["prompt_tokens"] != len(prompt_ids):
        tt.fail(f"the prompt encoded to {got['prompt_tokens']} tokens, not the tokenizer's {len(prompt_ids)}")
    # Sampled (temperature 1): the text is the tokens' bytes, joined then decoded.
    sampled = generate(out, os.path.join(folder, "gen-nvme"), "8MiB", "--prompt", prompt_text, "--tokens", "40",
                       "--seq-len", "16", "--seed", "9", temperature="1")
    raw = detokenize(sampled["tokens"])
    if sampled["text"] != raw.decode("utf-8", errors="replace") and raw.decode("utf-8", errors="ignore") != \
            sampled["text"].replace("\ufffd", ""):
        tt.fail(f"sampled text {sampled['text']!r} is not the tokens' bytes {raw!r}")
    print(f"roundtrip: generate --model {os.path.basename(out)}: prompt {prompt_ids}, greedy tokens match torch; "
          f"sampled {sampled['text']!r}")


def compare_greedy(got, want):
    """strata's greedy tokens against torch's, up to a near-tie (which may go either way in fp32)."""
    for k, (token, margin) in enumerate(want):
        if got["tokens"][k] != token:
            if margin < 1e-4:
                print(f"generate: stopped comparing at token {k} (a tie within {margin:.1e})")
                return
            tt.fail(f"greedy token {k}: strata {got['tokens'][k]}, torch {token} (margin {margin:.2e})\n"
                    f"{got['tokens']}\n{[t for t, _ in want]}")


def case_qwen2(folder):
    torch = import_torch()
    model = {**QWEN2, "vocab_size": 260, "tie_word_embeddings": True}
    hf_dir = os.path.join(folder, "tiny-qwen2")
    init = write_llama_folder(torch, hf_dir, model, seed=6, bf16=True, config=hf_qwen2_config(model))
    biases = [name for name in init if name.endswith(".bias")]
    if len(biases) != 3 * model["n_layer"] or any(float(init[name].abs().min()) == 0.0 for name in biases):
        tt.fail(f"the test folder's biases are not all there and nonzero: {biases}")

    # Folder → train 3 steps → export; against torch's training of the same steps.
    cfg_path, cfg = train_config(folder, "train", hf_dir, steps=3)
    out = os.path.join(folder, "out")
    tt.strata("--log-level", "warn", "train", cfg_path, "--export", out)
    exported = json.load(open(os.path.join(out, "config.json")))
    want = {"model_type": "qwen2", "tie_word_embeddings": True, "rope_theta": 1.0e6, "rms_norm_eps": 1.0e-6,
            "num_key_value_heads": 3, "use_sliding_window": False}
    if any(exported.get(key) != value for key, value in want.items()):
        tt.fail(f"{out}/config.json is not Qwen 2's: {exported}")
    ours = read_folder_tensors(torch, out)
    _, ref_params = torch_training(torch, model, init, cfg)
    worst = compare_with_torch(torch, ours, ref_params, set(init), "qwen2")
    moved = max(float((torch.frombuffer(bytearray(ours[name]), dtype=torch.float32) - init[name].reshape(-1))
                      .abs().max()) for name in biases)
    if moved == 0.0:
        tt.fail("training left every q/k/v bias where it started")
    print(f"qwen2: {len(init)} trained weights ({len(biases)} biases) within {worst:.2e} of torch")

    # The exported folder loads back (as qwen2) bit for bit.
    again_path, _ = train_config(folder, "again", out, steps=0)
    out2 = os.path.join(folder, "out2")
    tt.strata("--log-level", "warn", "train", again_path, "--export", out2)
    again = read_folder_tensors(torch, out2)
    for name in ours:
        if again[name] != ours[name]:
            tt.fail(f"{name}: {out} → strata → {out2} is not bit-identical")

    # Generation from the exported folder, the biases in the KV cache, against torch.
    prompt_ids = [256] + list("é ".encode())
    got = generate(out, os.path.join(folder, "gen-nvme"), "8MiB", "--prompt", "Thé ", "--tokens", "20",
                   "--seq-len", "16")
    params = {name: torch.frombuffer(bytearray(raw), dtype=torch.float32).double().view(init[name].shape)
              for name, raw in ours.items()}
    compare_greedy(got, torch_greedy(torch, params, model, prompt_ids, 20, 16))
    print(f"qwen2: generate --model {os.path.basename(out)}: greedy tokens match torch")


PHI3 = {**{k: v for k, v in LLAMA.items() if k != "rope_scaling"}, "vocab_size": 260, "tie_word_embeddings": False}


def hf_phi3_config(model, window):
    """Phi-3-mini-4k's config.json shape: its window, no rope scaling, dropout keys at 0."""
    return {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": model["n_embd"],
            "intermediate_size": model["intermediate_size"], "num_hidden_layers": model["n_layer"],
            "num_attention_heads": model["n_head"], "num_key_value_heads": model["n_kv_head"],
            "head_dim": model["head_dim"], "vocab_size": model["vocab_size"], "max_position_embeddings": 64,
            "original_max_position_embeddings": 64, "rope_theta": model["rope_theta"], "rope_scaling": None,
            "rms_norm_eps": model["norm_eps"], "sliding_window": window, "tie_word_embeddings": False,
            "hidden_act": "silu", "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
            "torch_dtype": "float32"}


def fuse_phi3(torch, parts, n_layer):
    """Phi-3's checkpoint names: q/k/v rows stacked in qkv_proj, gate/up in gate_up_proj."""
    fused = dict(parts)
    for layer in range(n_layer):
        p = f"model.layers.{layer}."
        fused[p + "self_attn.qkv_proj.weight"] = torch.cat(
            [fused.pop(p + f"self_attn.{x}_proj.weight") for x in ("q", "k", "v")], dim=0)
        fused[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [fused.pop(p + f"mlp.{x}_proj.weight") for x in ("gate", "up")], dim=0)
    return fused


def phi3_forward_logits(torch, fused, model, tokens):
    """A float64 Phi-3 forward written from transformers' Phi3 modules, over the FUSED weights:
    Phi3Attention slices qkv_proj's output as [q | k | v], Phi3MLP chunks gate_up_proj's as
    [gate | up] and computes down(up · silu(gate)); RMSNorm, RoPE (rotate_half), GQA."""
    h, kv, d = model["n_head"], model["n_kv_head"], model["head_dim"]
    eps = model["norm_eps"]
    t = tokens.shape[1]
    inv_freq = 1.0 / (model["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rotate(x):
        return torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)

    x = fused["model.embed_tokens.weight"][tokens]
    mask = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)
    for layer in range(model["n_layer"]):
        p = f"model.layers.{layer}."
        a = norm(x, fused[p + "input_layernorm.weight"])
        qkv = a @ fused[p + "self_attn.qkv_proj.weight"].T
        q = qkv[..., :h * d].view(1, t, h, d).transpose(1, 2)
        k = qkv[..., h * d:(h + kv) * d].view(1, t, kv, d).transpose(1, 2)
        v = qkv[..., (h + kv) * d:].view(1, t, kv, d).transpose(1, 2)
        q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
        k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5 + mask, dim=-1) @ v
        x = x + att.transpose(1, 2).reshape(1, t, h * d) @ fused[p + "self_attn.o_proj.weight"].T
        m = norm(x, fused[p + "post_attention_layernorm.weight"])
        gate, up = (m @ fused[p + "mlp.gate_up_proj.weight"].T).chunk(2, dim=-1)
        x = x + (up * torch.nn.functional.silu(gate)) @ fused[p + "mlp.down_proj.weight"].T
    return norm(x, fused["model.norm.weight"]) @ fused["lm_head.weight"].T


def case_phi3(folder):
    import llama_reference as ref
    torch = import_torch()
    model = PHI3
    hf_dir = os.path.join(folder, "tiny-phi3")
    os.makedirs(hf_dir)
    torch.manual_seed(8)
    init = {name: initial_value(torch, name, shape).float() for name, shape in shapes_of(model).items()}
    fused = fuse_phi3(torch, init, model["n_layer"])
    tt.write_safetensors(os.path.join(hf_dir, "model.safetensors"),
                         {name: (tuple(value.shape), value.numpy().tobytes()) for name, value in fused.items()})
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf_phi3_config(model, window=32), f)
    with open(os.path.join(hf_dir, "tokenizer.json"), "w") as f:
        json.dump(byte_tokenizer_json(), f)

    # The independent Phi-3 forward over the fused weights is the Llama reference on the parts.
    tokens = torch.tensor([[3, 141, 59, 26, 53, 58, 97, 93, 23, 84]])
    with torch.no_grad():
        phi = phi3_forward_logits(torch, {n: v.double() for n, v in fused.items()}, model, tokens)
        llama = ref.forward_logits({n: v.double() for n, v in init.items()}, tokens,
                                   reference_config(model))
    if float((phi - llama).abs().max()) > 1e-9:
        tt.fail(f"the Phi-3 forward and the Llama reference differ by {float((phi - llama).abs().max()):.2e}")

    # A seq_len past the window is one line naming the key.
    bad_path, _ = train_config(folder, "too-long", hf_dir, steps=1)
    with open(bad_path) as f:
        bad = json.load(f)
    bad["model"]["seq_len"] = 40
    with open(bad_path, "w") as f:
        json.dump(bad, f)
    refused = tt.strata("train", bad_path, expect_ok=False)
    if refused.returncode != 2 or "model.seq_len" not in refused.stderr or "sliding window of 32" not in refused.stderr:
        tt.fail(f"a seq_len past the window: {refused.stderr}")

    # Folder → train 3 steps → export; fused again, and split within 1e-4 of torch's training.
    cfg_path, cfg = train_config(folder, "train", hf_dir, steps=3)
    out = os.path.join(folder, "out")
    tt.strata("--log-level", "warn", "train", cfg_path, "--export", out)
    exported = json.load(open(os.path.join(out, "config.json")))
    want = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "sliding_window": 32,
            "tie_word_embeddings": False, "num_key_value_heads": model["n_kv_head"]}
    if any(exported.get(key) != value for key, value in want.items()):
        tt.fail(f"{out}/config.json is not Phi-3's: {exported}")
    ours_fused = read_folder_tensors(torch, out)
    if set(ours_fused) != set(fused):
        tt.fail(f"exported tensors {sorted(set(ours_fused) ^ set(fused))} differ from Phi-3's names")
    as_tensors = {name: torch.frombuffer(bytearray(raw), dtype=torch.float32).view(fused[name].shape)
                  for name, raw in ours_fused.items()}
    ours = {}
    for name, value in as_tensors.items():
        if name.endswith("qkv_proj.weight"):
            stem = name[:-len("qkv_proj.weight")]
            q_rows, kv_rows = model["n_head"] * model["head_dim"], model["n_kv_head"] * model["head_dim"]
            for part, (a, b) in zip("qkv", ((0, q_rows), (q_rows, q_rows + kv_rows),
                                           (q_rows + kv_rows, q_rows + 2 * kv_rows))):
                ours[stem + f"{part}_proj.weight"] = value[a:b].contiguous().numpy().tobytes()
        elif name.endswith("gate_up_proj.weight"):
            stem = name[:-len("gate_up_proj.weight")]
            gate, up = value.chunk(2, dim=0)
            ours[stem + "gate_proj.weight"] = gate.contiguous().numpy().tobytes()
            ours[stem + "up_proj.weight"] = up.contiguous().numpy().tobytes()
        else:
            ours[name] = value.numpy().tobytes()
    _, ref_params = torch_training(torch, model, init, cfg)
    worst = compare_with_torch(torch, ours, ref_params, set(init), "phi3")
    print(f"phi3: {len(fused)} fused tensors, split, within {worst:.2e} of torch's training")

    # The exported folder loads back (as phi3) bit for bit.
    again_path, _ = train_config(folder, "again", out, steps=0)
    out2 = os.path.join(folder, "out2")
    tt.strata("--log-level", "warn", "train", again_path, "--export", out2)
    if read_folder_tensors(torch, out2) != ours_fused:
        tt.fail(f"{out} → strata → {out2} is not bit-identical")

    # Greedy tokens against the Phi-3 forward (fused weights, float64), within the window.
    prompt_ids = [256] + list("é ".encode())
    got = generate(out, os.path.join(folder, "gen-nvme"), "8MiB", "--prompt", "Thé ", "--tokens", "12",
                   "--seq-len", "16")
    trained = {name: value.double() for name, value in as_tensors.items()}
    context, want_tokens = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(12):
            logits = phi3_forward_logits(torch, trained, model, torch.tensor([context]))[0, -1]
            top2 = torch.topk(logits, 2).values
            nxt = int(torch.argmax(logits))
            want_tokens.append((nxt, float(top2[0] - top2[1])))
            context.append(nxt)
    compare_greedy(got, want_tokens)
    print(f"phi3: generate --model {os.path.basename(out)}: greedy tokens match the Phi-3 forward")


def case_offload(folder):
    torch = import_torch()
    tiny = os.path.join(folder, "tiny")
    write_llama_folder(torch, tiny, {**LLAMA, "vocab_size": 260, "tie_word_embeddings": True}, seed=3)
    # (an empty prompt starts from the tokenizer's newline: this one has no BOS)
    tiny_out = generate(tiny, os.path.join(folder, "nvme-tiny"), "1MiB", "--tokens", "4", "--prompt", "")
    if tiny_out["prompt_tokens"] != 1 or len(tiny_out["tokens"]) != 4:
        tt.fail(f"an empty prompt: {tiny_out}")
    baseline_rss = tiny_out["peak_rss_bytes"]
    big_model = {**LLAMA, "vocab_size": 260, "n_layer": 10, "n_embd": 256, "n_head": 4, "n_kv_head": 2, "head_dim": 64,
                 "intermediate_size": 512, "tie_word_embeddings": False}
    big = os.path.join(folder, "big")
    write_llama_folder(torch, big, big_model, seed=4, std=0.05)
    budget = 4 << 20
    out = generate(big, os.path.join(folder, "nvme-big"), "4MiB", "--prompt", "The ", "--tokens", "12",
                   "--seq-len", "32")
    weights = out["weight_bytes"]
    if weights < 2.5 * 2 * budget:
        tt.fail(f"the big model ({weights} bytes) is not 2.5× its budgets")
    passes = 12
    if out["nvme_read_bytes"] < 0.5 * passes * weights:
        tt.fail(f"read {out['nvme_read_bytes']} bytes from NVMe for {passes} passes over {weights} bytes of weights")
    if out["host_high_water_bytes"] > out["pool_bytes"]:
        tt.fail(f"the scheduler's pool peaked at {out['host_high_water_bytes']} over its {out['pool_bytes']}")
    over = out["peak_rss_bytes"] - baseline_rss
    if over > 2 * budget + (4 << 20):
        tt.fail(f"peak RSS {out['peak_rss_bytes']} is {over} bytes above the tiny model's {baseline_rss}; the "
                f"budgets are {2 * budget} (the weights are {weights})")
    if len(out["tokens"]) != 12 or not out["tokens_per_s"] > 0:
        tt.fail(f"generate --json: {out['tokens']} at {out['tokens_per_s']} tokens/s")
    print(f"offload: Llama {weights >> 20} MiB in {2 * budget >> 20} MiB of budgets, peak RSS "
          f"{out['peak_rss_bytes'] >> 20} MiB (tiny model {baseline_rss >> 20} MiB), {out['tokens_per_s']:.1f} "
          f"tokens/s, floor {out['io_floor_tokens_per_s']:.1f}")


if __name__ == "__main__":
    base = os.environ.get("STRATA_TEST_TMPDIR", tempfile.gettempdir())
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as work:
        {"roundtrip": case_roundtrip, "qwen2": case_qwen2, "phi3": case_phi3, "offload": case_offload}[CASE](work)
