#!/usr/bin/python3
# tests/adapter/test_lora_train.py — `strata train` with LoRA adapters (`adapter:`), end to end
# through the binary, against an independent PyTorch LoRA.
#
# (reference) A test-written fp32 base and a test-written PEFT adapter folder (random A and
# B, so every gradient is live from step 1) — Llama with every linear targeted, GQA and q/k/v
# biases; GPT-2 with c_attn, both c_projs and c_fc (Conv1D) — train 5 steps with and without
# clipping. The reference is PEFT's formula in float64 torch: each adapted linear computes
# x·(W + s·B·A)ᵀ (GPT-2's Conv1D: x·(W + s·(B·A)ᵀ)), which for dropout 0 is exactly
# W·x + s·B·A·x; only A and B take gradients; torch.optim.AdamW decays them (2-D) and
# clip_grad_norm_ clips over them alone. Every loss and every exported adapter tensor (PEFT's
# adapter_model.safetensors) agree within 1e-5 relative, and the base comes out of the store
# bit for bit as it went in (never rewritten).
#
# Usage: test_lora_train.py STRATA_BINARY CASE
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
import test_train as tt  # noqa: E402  (config, strata, safetensors helpers; reads sys.argv[1])

sys.path.insert(0, os.path.join(HERE, "..", "llama"))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2"))

LLAMA = {"arch": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "head_dim": 16, "n_embd": 48,
         "intermediate_size": 80, "vocab_size": 256, "seq_len": 16, "rope_theta": 10000.0, "norm_eps": 1.0e-5,
         "tie_word_embeddings": False, "qkv_bias": True, "init": "random", "seed": 7}
GPT2 = {"arch": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 48, "vocab_size": 256, "seq_len": 16, "init": "random",
        "seed": 7}
LLAMA_LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj"]
GPT2_LINEARS = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
RANK, ALPHA = 4, 8.0


def import_torch():
    try:
        import torch
        return torch
    except ImportError as error:
        print(f"SKIP: PyTorch is not importable by {sys.executable} ({error})", file=sys.stderr)
        sys.exit(77)


def base_shapes(model):
    """HF names (GPT-2 without `transformer.`) and shapes of the base."""
    c, v = model["n_embd"], model["vocab_size"]
    if model["arch"] == "gpt2":
        shapes = {"wte.weight": (v, c), "wpe.weight": (model["seq_len"], c), "ln_f.weight": (c,), "ln_f.bias": (c,)}
        for i in range(model["n_layer"]):
            p = f"h.{i}."
            shapes.update({p + "ln_1.weight": (c,), p + "ln_1.bias": (c,), p + "attn.c_attn.weight": (c, 3 * c),
                           p + "attn.c_attn.bias": (3 * c,), p + "attn.c_proj.weight": (c, c),
                           p + "attn.c_proj.bias": (c,), p + "ln_2.weight": (c,), p + "ln_2.bias": (c,),
                           p + "mlp.c_fc.weight": (c, 4 * c), p + "mlp.c_fc.bias": (4 * c,),
                           p + "mlp.c_proj.weight": (4 * c, c), p + "mlp.c_proj.bias": (c,)})
        return shapes
    import test_llama_train as lt
    return lt.shapes_of(model)


def linear_dims(model, shapes, layer, linear):
    """(in, out) of a block linear from its base weight's shape."""
    prefix = f"h.{layer}." if model["arch"] == "gpt2" else f"model.layers.{layer}."
    shape = shapes[prefix + linear + ".weight"]
    return (shape[0], shape[1]) if model["arch"] == "gpt2" else (shape[1], shape[0])


def peft_prefix(model):
    return "base_model.model.transformer." if model["arch"] == "gpt2" else "base_model.model."


def write_peft_folder(torch, folder, model, shapes, targets, linears):
    """A PEFT LoRA folder as PEFT writes one: random A and B (B nonzero, unlike PEFT's init, so
    A's gradient is live from the first step). Returns {strata adapter name: tensor}."""
    os.makedirs(folder)
    adapters, blobs = {}, {}
    for layer in range(model["n_layer"]):
        for linear in linears:
            fan_in, fan_out = linear_dims(model, shapes, layer, linear)
            stem = (f"h.{layer}." if model["arch"] == "gpt2" else f"model.layers.{layer}.") + linear
            a = (torch.rand(RANK, fan_in) * 2 - 1) / fan_in ** 0.5
            b = 0.05 * torch.randn(fan_out, RANK)
            for suffix, value in ((".lora_A.weight", a), (".lora_B.weight", b)):
                adapters[stem + suffix] = value.float()
                name = peft_prefix(model) + (stem if model["arch"] == "gpt2" else stem) + suffix
                blobs[name] = (tuple(value.shape), value.float().numpy().tobytes())
    tt.write_safetensors(os.path.join(folder, "adapter_model.safetensors"), blobs)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0,
                   "target_modules": targets, "use_rslora": False, "bias": "none",
                   "fan_in_fan_out": model["arch"] == "gpt2", "init_lora_weights": True, "inference_mode": True,
                   "base_model_name_or_path": None, "modules_to_save": None, "use_dora": False,
                   "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None, "layers_pattern": None,
                   "revision": None, "megatron_config": None, "megatron_core": "megatron.core",
                   "loftq_config": {}}, f, indent=2)
    return adapters


def reference_training(torch, model, base, adapters, cfg):
    """PEFT's LoRA in float64: merged-weight forward, AdamW and clipping over the adapters only."""
    import gpt2_reference as gref
    import llama_reference as lref
    import test_llama_train as lt
    scale = ALPHA / RANK
    base = {name: t.double() for name, t in base.items()}
    trained = {name: t.double().clone().requires_grad_(True) for name, t in adapters.items()}
    o = cfg["optimizer"]
    optimizer = torch.optim.AdamW(list(trained.values()), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                  weight_decay=o["weight_decay"])
    seq, batch = model["seq_len"], cfg["batch_size"]
    with open(tt.CORPUS, "rb") as f:
        tokens_all = torch.tensor(list(f.read()), dtype=torch.long)
    window_count = tokens_all.numel() - seq - 1
    gpt2 = model["arch"] == "gpt2"
    if not gpt2:
        rcfg = lt.reference_config(model)
        inv_freq = lref.inverse_frequencies(rcfg)
        freqs = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
    losses = []
    for step in range(cfg["steps"]):
        rows = [tokens_all[((step * batch + b) * seq) % window_count:][:seq + 1] for b in range(batch)]
        window = torch.stack(rows)
        inputs, targets = window[:, :-1], window[:, 1:]
        params = dict(base)
        for name in adapters:
            if not name.endswith(".lora_A.weight"):
                continue
            stem = name[:-len(".lora_A.weight")]
            delta = scale * trained[stem + ".lora_B.weight"] @ trained[name]  # [out, in]
            params[stem + ".weight"] = base[stem + ".weight"] + (delta.t() if gpt2 else delta)
        if gpt2:
            x = params["wte.weight"][inputs] + params["wpe.weight"][torch.arange(seq)]
            for layer in range(model["n_layer"]):
                x = gref.block(params, layer, x, model["n_head"])
            x = torch.nn.functional.layer_norm(x, (model["n_embd"],), params["ln_f.weight"], params["ln_f.bias"], 1e-5)
            logits = x @ params["wte.weight"].t()
        else:
            x = params["model.embed_tokens.weight"][inputs]
            for layer in range(model["n_layer"]):
                x = lref.block(params, layer, x, rcfg, cos, sin)
            x = lref.rms_norm(x, params["model.norm.weight"], model["norm_eps"])
            head = params["model.embed_tokens.weight"] if model.get("tie_word_embeddings", True) else params["lm_head.weight"]
            logits = torch.nn.functional.linear(x, head)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, model["vocab_size"]), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(trained.values()), o["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
    return losses, trained


def quantized_base(torch, base, model, kind, double_quant):
    """What strata computes on for a quantised base (models/model_layout.h): each block's 2-D
    weights through the NF4 / int8 round trip of tests/quant's independent reference (with the
    double-quantised absmax when asked), the embedding and final units through bf16, norms and
    biases as they are."""
    sys.path.insert(0, os.path.join(HERE, "..", "quant"))
    import numpy as np
    import quant_reference as qr
    out = {}
    for name, value in base.items():
        x = value.numpy().reshape(-1).astype(np.float32)
        in_block = name.startswith("h.") or name.startswith("model.layers.")
        if in_block and value.dim() == 2:
            absmax = qr.block_absmax(x)
            read_absmax = absmax
            if double_quant:
                codes, absmax2, mean = qr.double_quantize(absmax)
                read_absmax = qr.double_dequantize(codes, absmax2, mean)
            if kind == "nf4":
                y = qr.dequantize_nf4(qr.quantize_nf4(x, absmax), read_absmax, x.size)
            else:
                y = qr.dequantize_int8(qr.quantize_int8(x, absmax), read_absmax, x.size)
            out[name] = torch.from_numpy(np.ascontiguousarray(y)).view(value.shape)
        elif in_block:
            out[name] = value
        else:  # bf16, round to nearest even
            out[name] = value.to(torch.bfloat16).float()
    return out


def run_case(torch, folder, label, model, targets, linears, clip, base_dtype="fp32", double_quant=False,
             adapter_tolerance=1e-5):
    run_dir = os.path.join(folder, label)
    os.makedirs(run_dir)
    torch.manual_seed(11)
    shapes = base_shapes(model)
    base, blobs = {}, {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight") or name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                name == "ln_f.weight":
            value = 1.0 + 0.1 * torch.randn(shape)
        else:
            value = 0.08 * torch.randn(shape)
        base[name] = value.float()
        blobs[("transformer." if model["arch"] == "gpt2" else "") + name] = (shape, base[name].numpy().tobytes())
    init_path = os.path.join(run_dir, "base.safetensors")
    tt.write_safetensors(init_path, blobs)
    adapters = write_peft_folder(torch, os.path.join(run_dir, "adapter_in"), model, shapes, targets, linears)
    cfg_path, cfg = tt.config(run_dir, model={**model, "init": init_path},
                              optimizer={"eps": 1.0e-6, "grad_clip": clip, "weight_decay": 0.1, "lr": 2.0e-3},
                              adapter={"kind": "lora", "rank": RANK, "alpha": ALPHA, "targets": targets,
                                       "base_dtype": base_dtype, "init": os.path.join(run_dir, "adapter_in"),
                                       **({"double_quant": True} if double_quant else {})},
                              placement={"params": "nvme", "grads": "host", "optimizer": "nvme"})
    metrics = os.path.join(run_dir, "metrics.json")
    out = os.path.join(run_dir, "adapter_out")
    merged = os.path.join(run_dir, "merged")
    tt.strata("train", cfg_path, "--metrics", metrics, "--export", out)
    computed_base = base if base_dtype == "fp32" else quantized_base(torch, base, model, base_dtype, double_quant)
    ref_losses, ref_adapters = reference_training(torch, model, computed_base, adapters, cfg)
    with open(metrics) as f:
        our_losses = [s["loss"] for s in json.load(f)["steps"]]
    if len(our_losses) != len(ref_losses):
        tt.fail(f"{label}: {len(our_losses)} strata steps vs {len(ref_losses)} reference steps")
    for step, (ours, theirs) in enumerate(zip(our_losses, ref_losses), 1):
        rel = abs(ours - theirs) / abs(theirs)
        print(f"{label} step {step}: loss strata {ours:.8f} torch {theirs:.8f} rel {rel:.2e}")
        if rel > 1e-5:
            tt.fail(f"{label} step {step}: loss differs by {rel:.2e} relative")
    exported, _ = tt.read_safetensors(os.path.join(out, "adapter_model.safetensors"))
    prefix = peft_prefix(model)
    names = {prefix + name for name in adapters}
    if set(exported) != names:
        tt.fail(f"{label}: exported adapter tensors differ: {sorted(set(exported) ^ names)[:4]}")
    worst = 0.0
    for name in adapters:
        a = torch.frombuffer(bytearray(exported[prefix + name]), dtype=torch.float32).double()
        b = ref_adapters[name].detach().reshape(-1)
        moved = (b - adapters[name].double().reshape(-1)).abs().max().item()
        if moved == 0.0:
            tt.fail(f"{label}: the reference never moved {name}: the test would not see a wrong gradient")
        rel = ((a - b).abs().max() / b.abs().max()).item()
        worst = max(worst, rel)
        if rel > adapter_tolerance:
            tt.fail(f"{label}: adapter {name} differs from torch's LoRA by {rel:.2e} relative")
    print(f"{label}: all {len(adapters)} adapter tensors within {worst:.2e} relative of torch's LoRA")
    # The frozen base, exported merged, is W + s·B·A of the trained adapters (fp32 math).
    tt.strata("train", cfg_path, "--resume", "--export-merged", merged)
    merged_tensors = {}
    for file in sorted(os.listdir(merged)):
        if file.endswith(".safetensors"):
            merged_tensors.update(tt.read_safetensors(os.path.join(merged, file))[0])
    scale = ALPHA / RANK
    for name, value in computed_base.items():
        key = ("transformer." if model["arch"] == "gpt2" and ("transformer." + name) in merged_tensors else "") + name
        got = torch.frombuffer(bytearray(merged_tensors[key]), dtype=torch.float32).view(value.shape)
        stem = name[:-len(".weight")]
        want = value.clone()
        if stem + ".lora_A.weight" in adapters:
            trained_a = torch.frombuffer(bytearray(exported[prefix + stem + ".lora_A.weight"]), dtype=torch.float32)
            trained_b = torch.frombuffer(bytearray(exported[prefix + stem + ".lora_B.weight"]), dtype=torch.float32)
            fan_out, fan_in = (value.shape[1], value.shape[0]) if model["arch"] == "gpt2" else value.shape
            delta = scale * (trained_b.view(fan_out, RANK) @ trained_a.view(RANK, fan_in))
            want = value + (delta.t() if model["arch"] == "gpt2" else delta)
        rel = ((got - want).abs().max() / want.abs().max()).item()
        if rel > 1e-6:
            tt.fail(f"{label}: merged {name} differs from W + s·B·A by {rel:.2e} relative")
    print(f"{label}: the merged export is W + s·B·A for all {len(base)} base tensors")


def case_reference(folder):
    torch = import_torch()
    all_llama = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for clip in (1.0, 0.0):
        run_case(torch, folder, f"llama-clip{clip:g}", LLAMA, all_llama, LLAMA_LINEARS, clip)
        run_case(torch, folder, f"gpt2-clip{clip:g}", GPT2, ["c_attn", "c_proj", "c_fc"], GPT2_LINEARS, clip)


def case_quantized(folder):
    """A quantised frozen base (QLoRA): strata trains on the dequantised weights that tests/quant's
    independent reference gives, so the same PyTorch LoRA on those weights is the reference. The
    losses hold the fp32 cases' 1e-5; the adapters are held to 1e-4, the bound of the full-training
    references (tests/llama) — measured 1.2e-5 to 2.6e-5: fp32 against float64 over 5 AdamW steps,
    not the base (the losses agree to 3e-8)."""
    torch = import_torch()
    all_llama = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    run_case(torch, folder, "llama-nf4-dq", LLAMA, all_llama, LLAMA_LINEARS, 1.0, "nf4", True, 1e-4)
    run_case(torch, folder, "gpt2-nf4", GPT2, ["c_attn", "c_proj", "c_fc"], GPT2_LINEARS, 1.0, "nf4", False, 1e-4)
    run_case(torch, folder, "llama-int8", LLAMA, all_llama, LLAMA_LINEARS, 0.0, "int8", False, 1e-4)


CASES = {"reference": case_reference, "quantized": case_quantized}

if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR")) as tmp:
        CASES[sys.argv[2]](tmp)
    print("ok")
