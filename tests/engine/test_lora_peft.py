#!/usr/bin/python3
# tests/engine/test_lora_peft.py — LoRA adapters in and out of strata as PEFT folders, the merged
# export, and generation on an adapter store (issue 31; docs/lora.md), through the real binary.
# Every run is `--steps 0`: a fresh store initialized (base from model.init, adapters from
# adapter.init) and committed, nothing trained — so these hold without the LoRA training compute.
#  (export) GPT-2 and Llama: a PEFT folder written by this test from PEFT's documented format
#    (random non-zero A and B) is `adapter.init`; `--export` writes adapter_config.json with
#    PEFT's keys and values (fan_in_fan_out true for GPT-2's Conv1D only) and
#    adapter_model.safetensors with PEFT's names (`base_model.model.` + the HF module path, GPT-2's
#    with `transformer.`), fp32, [r, in] and [out, r], equal bit for bit to what went in; a new run
#    from that export exports the same bytes again; BF16 and F16 folders widen exactly. Without
#    adapter.init, B is zero and A lies in Kaiming-uniform's ±1/√in.
#  (merged) `--export-merged` equals W + scale·B·A computed by torch in fp32 from the base folder
#    and the adapter folder (GPT-2: (B·A)ᵀ on its [in, out] weights), to 1e-6 relative; every
#    other tensor equals the base bit for bit. With adapter.base_dtype bf16 the base is the
#    bf16-rounded W. rslora's scale alpha/√r is checked too.
#  (phi3) a Phi-3 folder (fused qkv_proj, gate_up_proj): o_proj/down_proj adapters export under
#    PEFT's names and merge into the fused folder (torch's W + scale·B·A, the fused tensors the
#    base's); q_proj adapters train but their PEFT export is refused in one line (not yet).
#  (generate) `strata generate` on the adapter store (greedy) gives the same tokens and the same
#    top-2 margins as `strata generate --model` on the merged export (staged in the base's dtype;
#    bf16 for an int8 or NF4 base, which generates at bf16), for fp32, bf16, int8 and
#    double-quantised NF4 bases, and not those of the base alone (the adapters act); with the
#    weights in the pool each unit is read once as stored (a quantised base: fewer bytes than
#    bf16's); also with budgets that make every pass read the blocks again (each read dequantised
#    and folded afresh).
#  (refusals) adapter.init folders with use_dora true, another r, a missing, an extra or a
#    wrong-shaped tensor, bias "all", a non-empty rank_pattern, an unknown key, other
#    target_modules: exit 2, one line naming the file and the key or tensor, nothing in the NVMe
#    path; `--export x.safetensors` of an adapter store, `store export --merged` of a store
#    without adapters, `train --export-merged` without adapter: (before any step): exit 2, one
#    line, nothing written.
#
# Usage: test_lora_peft.py STRATA_BINARY CASE
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

STRATA = os.path.abspath(sys.argv[1])
CORPUS = "/usr/share/common-licenses/GPL-3"
SEQ = 32
GPT2 = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": SEQ, "init": "random", "seed": 7}
LLAMA = {"arch": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "intermediate_size": 160,
         "vocab_size": 256, "seq_len": SEQ, "init": "random", "seed": 3, "tie_word_embeddings": False}
# Targets as PEFT names them; GPT-2's c_proj adapts attn.c_proj and mlp.c_proj both.
TARGETS = {"gpt2": ["c_attn", "c_proj"], "llama": ["q_proj", "v_proj", "down_proj"]}
PEFT_CONFIG_KEYS = {"alpha_pattern", "auto_mapping", "base_model_name_or_path", "bias", "fan_in_fan_out",
                    "inference_mode", "init_lora_weights", "layer_replication", "layers_pattern",
                    "layers_to_transform", "loftq_config", "lora_alpha", "lora_dropout", "megatron_config",
                    "megatron_core", "modules_to_save", "peft_type", "r", "rank_pattern", "revision",
                    "target_modules", "task_type", "use_dora", "use_rslora"}


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def strata(*args, expect_ok=True):
    result = subprocess.run([STRATA, *args], capture_output=True, text=True, timeout=600)
    if expect_ok and result.returncode != 0:
        fail(f"strata {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def import_torch():
    try:
        import torch
    except ImportError as error:
        print(f"SKIP: PyTorch is not importable ({error}); install python3-torch", file=sys.stderr)
        sys.exit(77)
    return torch


def config(folder, model, adapter=None, precision="fp32", name="train.yaml"):
    nvme = os.path.join(folder, "nvme-" + name.split(".")[0])
    os.makedirs(nvme, exist_ok=True)
    cfg = {
        "model": dict(model),
        "data": {"path": CORPUS, "format": "text-bytes"},
        "batch_size": 2,
        "steps": 1,
        "optimizer": {"lr": 1.0e-3, "grad_clip": 1.0},
        "precision": precision,
        "device": {"kind": "cpu", "memory": "64MiB"},
        "host": {"memory": "64MiB"},
        "nvme": {"paths": [nvme]},
        "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"},
        "checkpoint_every": 1,
    }
    if adapter is not None:
        cfg["adapter"] = adapter
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path, nvme


def read_safetensors(torch, path):
    """{name: (dtype string, shape, fp32 tensor)} — the bytes read as the header says."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        if entry["dtype"] == "F32":
            values = torch.frombuffer(raw, dtype=torch.float32) if raw else torch.zeros(0)
        elif entry["dtype"] == "BF16":
            values = torch.frombuffer(raw, dtype=torch.bfloat16).float()
        else:
            fail(f"{path}: tensor {name} is {entry['dtype']}")
        out[name] = (entry["dtype"], list(entry["shape"]), values.reshape(entry["shape"]).clone())
    return out


def write_safetensors(torch, path, tensors, dtype="F32"):
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        if dtype == "F32":
            raw = value.contiguous().float().numpy().tobytes()
        else:  # BF16 / F16: the 16-bit patterns, little-endian
            raw = value.contiguous().to(torch.bfloat16 if dtype == "BF16" else torch.float16).view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def linears(arch, model):
    """(module path as PEFT names it, in, out, conv1d) of every adapted linear, in strata's order."""
    c = model["n_embd"]
    out = []
    for i in range(model["n_layer"]):
        if arch == "gpt2":
            for suffix, fin, fout in (("attn.c_attn", c, 3 * c), ("attn.c_proj", c, c), ("mlp.c_proj", 4 * c, c)):
                out.append((f"transformer.h.{i}.{suffix}", fin, fout, True))
        else:
            kv = model["n_kv_head"] * (c // model["n_head"])
            for suffix, fin, fout in (("self_attn.q_proj", c, c), ("self_attn.v_proj", c, kv),
                                      ("mlp.down_proj", model["intermediate_size"], c)):
                out.append((f"model.layers.{i}.{suffix}", fin, fout, False))
    return out


def peft_config(arch, r, alpha, changes=None):
    """adapter_config.json as PEFT 0.x's LoraConfig.save_pretrained writes it."""
    cfg = {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": None, "bias": "none",
           "fan_in_fan_out": arch == "gpt2", "inference_mode": True, "init_lora_weights": True,
           "layer_replication": None, "layers_pattern": None, "layers_to_transform": None, "loftq_config": {},
           "lora_alpha": alpha, "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core",
           "modules_to_save": None, "peft_type": "LORA", "r": r, "rank_pattern": {}, "revision": None,
           "target_modules": TARGETS[arch], "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": False}
    cfg.update(changes or {})
    return cfg


def write_peft_folder(torch, folder, arch, model, r, alpha, seed, std=0.3, config_changes=None, tensors_edit=None,
                      dtype="F32"):
    torch.manual_seed(seed)
    tensors = {}
    for path, fin, fout, _ in linears(arch, model):
        tensors[f"base_model.model.{path}.lora_A.weight"] = torch.randn(r, fin) * std
        tensors[f"base_model.model.{path}.lora_B.weight"] = torch.randn(fout, r) * std
    if tensors_edit:
        tensors_edit(tensors)
    os.makedirs(folder)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(peft_config(arch, r, alpha, config_changes), f, indent=2)
    write_safetensors(torch, os.path.join(folder, "adapter_model.safetensors"), tensors, dtype)
    if dtype != "F32":  # what a reader must get: the 16-bit values widened exactly
        tensors = {name: value.to(torch.bfloat16 if dtype == "BF16" else torch.float16).float()
                   for name, value in tensors.items()}
    return tensors


def base_folder(folder, arch, model, precision="fp32"):
    """A random base exported as an HF folder by a plain strata run."""
    cfg, _ = config(folder, model, precision=precision, name=f"base-{arch}.yaml")
    out = os.path.join(folder, f"base-{arch}")
    strata("train", cfg, "--steps", "0", "--export", out)
    return out


def adapter_block(arch, r, alpha, init=None, **extra):
    block = {"kind": "lora", "rank": r, "alpha": alpha, "targets": TARGETS[arch], **extra}
    if init:
        block["init"] = init
    return block


def check_peft_export(torch, out, arch, model, r, alpha, base, expected=None):
    with open(os.path.join(out, "adapter_config.json")) as f:
        cfg = json.load(f)
    want = peft_config(arch, r, alpha, {"base_model_name_or_path": base})
    if set(cfg) != PEFT_CONFIG_KEYS:
        fail(f"{out}: adapter_config.json keys {sorted(cfg)} are not PEFT's {sorted(PEFT_CONFIG_KEYS)}")
    for key, value in want.items():
        if cfg[key] != value or type(cfg[key]) is not type(value):
            fail(f"{out}: adapter_config.json '{key}' is {cfg[key]!r}, PEFT writes {value!r}")
    got = read_safetensors(torch, os.path.join(out, "adapter_model.safetensors"))
    names = []
    for path, fin, fout, _ in linears(arch, model):
        for kind, shape in (("lora_A", [r, fin]), ("lora_B", [fout, r])):
            name = f"base_model.model.{path}.{kind}.weight"
            names.append(name)
            if name not in got:
                fail(f"{out}: tensor {name} missing (has {sorted(got)[:4]}…)")
            dtype, got_shape, value = got[name]
            if dtype != "F32" or got_shape != shape:
                fail(f"{out}: {name} is {dtype} {got_shape}, PEFT's is F32 {shape}")
            if expected is not None and not torch.equal(value, expected[name]):
                fail(f"{out}: {name} differs from adapter.init's (max {float((value - expected[name]).abs().max())})")
    if sorted(names) != sorted(got):
        fail(f"{out}: tensors {sorted(set(got) - set(names))} are not PEFT's")
    if not os.path.isfile(os.path.join(out, "config.json")) and os.path.exists(os.path.join(out, "model.safetensors")):
        fail(f"{out}: a PEFT folder holds no model weights")
    return got


def case_export(folder):
    torch = import_torch()
    for arch, model in (("gpt2", GPT2), ("llama", LLAMA)):
        base = base_folder(folder, arch, model)
        r, alpha = 4, 8
        peft_in = os.path.join(folder, f"{arch}-peft-in")
        expected = write_peft_folder(torch, peft_in, arch, model, r, alpha, seed=11)
        cfg, nvme = config(folder, {**model, "init": base}, adapter_block(arch, r, alpha, init=peft_in),
                           name=f"{arch}-a.yaml")
        out = os.path.join(folder, f"{arch}-peft-out")
        strata("train", cfg, "--steps", "0", "--export", out)
        check_peft_export(torch, out, arch, model, r, alpha, base, expected)
        # Round trip: a run from the export exports the same bytes.
        cfg2, _ = config(folder, {**model, "init": base}, adapter_block(arch, r, alpha, init=out),
                         name=f"{arch}-b.yaml")
        out2 = os.path.join(folder, f"{arch}-peft-out2")
        strata("train", cfg2, "--steps", "0", "--export", out2)
        for name in ("adapter_model.safetensors", "adapter_config.json"):
            with open(os.path.join(out, name), "rb") as a, open(os.path.join(out2, name), "rb") as b:
                if a.read() != b.read():
                    fail(f"{arch}: {name} of a run started from {out} differs from it")
        # A folder saved from a 16-bit model: BF16 and F16 adapters widen exactly.
        for dtype in ("BF16", "F16"):
            peft16 = os.path.join(folder, f"{arch}-peft-{dtype}")
            expected16 = write_peft_folder(torch, peft16, arch, model, r, alpha, seed=12, dtype=dtype)
            cfg16, _ = config(folder, {**model, "init": base}, adapter_block(arch, r, alpha, init=peft16),
                              name=f"{arch}-{dtype}.yaml")
            out16 = os.path.join(folder, f"{arch}-peft-{dtype}-out")
            strata("train", cfg16, "--steps", "0", "--export", out16)
            check_peft_export(torch, out16, arch, model, r, alpha, base, expected16)
        # No adapter.init: A Kaiming-uniform (a = √5: U(±1/√in)), B zero.
        cfg3, _ = config(folder, model, adapter_block(arch, r, alpha), name=f"{arch}-c.yaml")
        out3 = os.path.join(folder, f"{arch}-peft-fresh")
        strata("train", cfg3, "--steps", "0", "--export", out3)
        got = check_peft_export(torch, out3, arch, model, r, alpha, None)
        for path, fin, _, _ in linears(arch, model):
            a = got[f"base_model.model.{path}.lora_A.weight"][2]
            b = got[f"base_model.model.{path}.lora_B.weight"][2]
            bound = 1.0 / fin ** 0.5
            if float(b.abs().max()) != 0.0 or float(a.abs().max()) > bound or float(a.abs().max()) < 0.5 * bound:
                fail(f"{arch} {path}: fresh A max {float(a.abs().max())} (bound {bound}), B max {float(b.abs().max())}")
        print(f"{arch}: PEFT export keys, names, shapes and values; adapter.init round trip byte-identical")


def merged_reference(torch, arch, model, base, adapter_tensors, scale, bf16_base):
    weights = read_safetensors(torch, os.path.join(base, "model.safetensors"))
    out = {}
    for name, (_, _, value) in weights.items():
        out[name] = value.to(torch.bfloat16).float() if bf16_base else value.clone()
    for path, _, _, conv1d in linears(arch, model):
        a = adapter_tensors[f"base_model.model.{path}.lora_A.weight"]
        b = adapter_tensors[f"base_model.model.{path}.lora_B.weight"]
        delta = (b @ a) * scale
        name = (path[len("transformer."):] if arch == "gpt2" else path) + ".weight"
        out[name] = out[name] + (delta.T if conv1d else delta)
    return out


def case_merged(folder):
    torch = import_torch()
    for arch, model in (("gpt2", GPT2), ("llama", LLAMA)):
        base = base_folder(folder, arch, model)
        for base_dtype, rslora in (("fp32", False), ("bf16", False), ("fp32", True)):
            r, alpha = 4, 6
            scale = alpha / r ** 0.5 if rslora else alpha / r
            tag = f"{arch}-{base_dtype}{'-rslora' if rslora else ''}"
            peft_in = os.path.join(folder, f"{tag}-peft")
            tensors = write_peft_folder(torch, peft_in, arch, model, r, alpha, seed=5,
                                        config_changes={"use_rslora": rslora})
            cfg, _ = config(folder, {**model, "init": base},
                            adapter_block(arch, r, alpha, init=peft_in, base_dtype=base_dtype, rslora=rslora),
                            precision="bf16" if base_dtype == "bf16" else "fp32", name=f"{tag}.yaml")
            merged = os.path.join(folder, f"{tag}-merged")
            strata("train", cfg, "--steps", "0", "--export-merged", merged)
            got = read_safetensors(torch, os.path.join(merged, "model.safetensors"))
            want = merged_reference(torch, arch, model, base, tensors, scale, base_dtype == "bf16")
            if sorted(got) != sorted(want):
                fail(f"{tag}: merged tensors {sorted(got)} are not the base's {sorted(want)}")
            adapted = {(p[len("transformer."):] if arch == "gpt2" else p) + ".weight" for p, *_ in linears(arch, model)}
            worst = 0.0
            for name, (dtype, shape, value) in got.items():
                ref = want[name]
                if dtype != "F32" or shape != list(ref.shape):
                    fail(f"{tag}: {name} is {dtype} {shape}, expected F32 {list(ref.shape)}")
                if name in adapted:
                    rel = float((value - ref).abs().max() / ref.abs().max())
                    worst = max(worst, rel)
                    if rel > 1e-6:
                        fail(f"{tag}: merged {name} differs from torch's W + scale·B·A by {rel:.3g} relative")
                    if torch.equal(value, read_safetensors(torch, os.path.join(base, "model.safetensors"))[name][2]):
                        fail(f"{tag}: merged {name} is the base's: nothing was folded")
                elif not torch.equal(value, ref):
                    fail(f"{tag}: {name} is not adapted but differs from the base")
            with open(os.path.join(merged, "config.json")) as f:
                if json.load(f).get("model_type") not in ("gpt2", "llama"):
                    fail(f"{tag}: merged config.json is not a {arch} model's")
            print(f"{tag}: merged export = torch W + {scale:.4g}·B·A (worst {worst:.2e} relative), the rest bit-equal")


def case_phi3(folder):
    """Phi-3 stores q/k/v fused in qkv_proj and gate/up in gate_up_proj: adapters on o_proj and
    down_proj export as PEFT names them and merge into the fused folder; adapters on q_proj are
    refused for a PEFT folder (PEFT adapts qkv_proj whole), in one line, after the run."""
    torch = import_torch()
    model = dict(LLAMA)
    base_llama = base_folder(folder, "llama", model)
    parts = {name: value for name, (_, _, value) in
             read_safetensors(torch, os.path.join(base_llama, "model.safetensors")).items()}
    fused = dict(parts)
    for i in range(model["n_layer"]):
        p = f"model.layers.{i}."
        fused[p + "self_attn.qkv_proj.weight"] = torch.cat([fused.pop(p + f"self_attn.{x}_proj.weight")
                                                           for x in ("q", "k", "v")], dim=0)
        fused[p + "mlp.gate_up_proj.weight"] = torch.cat([fused.pop(p + f"mlp.{x}_proj.weight")
                                                         for x in ("gate", "up")], dim=0)
    base = os.path.join(folder, "base-phi3")
    os.makedirs(base)
    write_safetensors(torch, os.path.join(base, "model.safetensors"), fused)
    with open(os.path.join(base, "config.json"), "w") as f:
        json.dump({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": model["n_embd"],
                   "intermediate_size": model["intermediate_size"], "num_hidden_layers": model["n_layer"],
                   "num_attention_heads": model["n_head"], "num_key_value_heads": model["n_kv_head"],
                   "vocab_size": model["vocab_size"], "max_position_embeddings": SEQ, "rope_theta": 10000.0,
                   "rope_scaling": None, "rms_norm_eps": 1e-5, "sliding_window": None, "tie_word_embeddings": False,
                   "hidden_act": "silu", "torch_dtype": "float32"}, f)
    shape = {"init": base, "seq_len": SEQ}
    targets = ["o_proj", "down_proj"]
    r, alpha = 4, 8
    torch.manual_seed(21)
    adapters = {}
    c, inter = model["n_embd"], model["intermediate_size"]
    for i in range(model["n_layer"]):
        for path, fin, fout in ((f"model.layers.{i}.self_attn.o_proj", c, c), (f"model.layers.{i}.mlp.down_proj", inter, c)):
            adapters[f"base_model.model.{path}.lora_A.weight"] = torch.randn(r, fin) * 0.3
            adapters[f"base_model.model.{path}.lora_B.weight"] = torch.randn(fout, r) * 0.3
    peft_in = os.path.join(folder, "phi3-peft")
    os.makedirs(peft_in)
    with open(os.path.join(peft_in, "adapter_config.json"), "w") as f:
        json.dump(peft_config("llama", r, alpha, {"target_modules": targets}), f)
    write_safetensors(torch, os.path.join(peft_in, "adapter_model.safetensors"), adapters)
    cfg, _ = config(folder, shape, {"kind": "lora", "rank": r, "alpha": alpha, "targets": targets, "init": peft_in},
                    name="phi3.yaml")
    out, merged = os.path.join(folder, "phi3-peft-out"), os.path.join(folder, "phi3-merged")
    strata("train", cfg, "--steps", "0", "--export", out, "--export-merged", merged)
    got = read_safetensors(torch, os.path.join(out, "adapter_model.safetensors"))
    if sorted(got) != sorted(adapters) or any(not torch.equal(got[n][2], adapters[n]) for n in adapters):
        fail(f"phi3: the PEFT export {sorted(got)[:2]}… is not adapter.init's tensors")
    with open(os.path.join(merged, "config.json")) as f:
        if json.load(f).get("model_type") != "phi3":
            fail("phi3: the merged export is not a phi3 folder")
    got = read_safetensors(torch, os.path.join(merged, "model.safetensors"))
    for name, value in fused.items():
        want = value
        stem = name[:-len(".weight")]
        if f"base_model.model.{stem}.lora_A.weight" in adapters:
            want = value + (alpha / r) * (adapters[f"base_model.model.{stem}.lora_B.weight"]
                                          @ adapters[f"base_model.model.{stem}.lora_A.weight"])
            if float((got[name][2] - want).abs().max() / want.abs().max()) > 1e-6:
                fail(f"phi3: merged {name} differs from torch's W + scale·B·A")
        elif not torch.equal(got[name][2], want):
            fail(f"phi3: merged {name} (not adapted; fused ones included) differs from the base")
    # q_proj adapted: the run is fine, its PEFT export is not (yet).
    cfg, _ = config(folder, shape, {"kind": "lora", "rank": r, "alpha": alpha, "targets": ["q_proj", "o_proj"]},
                    name="phi3-q.yaml")
    out = os.path.join(folder, "phi3-q-out")
    result = strata("train", cfg, "--steps", "0", "--export", out, expect_ok=False)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "[E]" in line]
    if result.returncode == 0 or len(lines) != 1 or "q_proj" not in lines[0] or "not yet" not in lines[0]:
        fail(f"phi3 q_proj: expected one error line naming q_proj and 'not yet', got exit {result.returncode}:\n"
             f"{result.stderr}")
    if os.path.exists(out) or os.path.exists(out + ".tmp"):
        fail("phi3 q_proj: the refused export left a folder")
    print(f"phi3: o_proj/down_proj adapters export under PEFT's names and merge into the fused folder; "
          f"q_proj refused: {lines[0]}")


def generate_json(*args, figures=None):
    result = strata("generate", *args, "--prompt-ids", "10,32,101,7", "--tokens", "40", "--temperature", "0",
                    "--json")
    out = json.loads(result.stdout)
    if figures is not None:
        figures.update(out)
    return out["tokens"], out["top2_margins"]


# The bases generation reads: (tag, adapter block keys, the dtype its merged export is staged in).
GENERATE_BASES = (("fp32", {"base_dtype": "fp32"}, "fp32"), ("bf16", {"base_dtype": "bf16"}, "bf16"),
                  ("int8", {"base_dtype": "int8"}, "bf16"),
                  ("nf4-dq", {"base_dtype": "nf4", "double_quant": True}, "bf16"))


def case_generate(folder):
    torch = import_torch()
    for arch, model in (("gpt2", GPT2), ("llama", LLAMA)):
        base = base_folder(folder, arch, model)
        read_bytes = {}
        for base_tag, base_keys, staged in GENERATE_BASES:
            tag = f"{arch}-{base_tag}"
            r, alpha = 4, 8
            peft_in = os.path.join(folder, f"{tag}-peft")
            write_peft_folder(torch, peft_in, arch, model, r, alpha, seed=9, std=0.4)
            cfg, _ = config(folder, {**model, "init": base}, adapter_block(arch, r, alpha, init=peft_in, **base_keys),
                            precision="fp32" if base_tag == "fp32" else "bf16", name=f"{tag}.yaml")
            merged = os.path.join(folder, f"{tag}-merged")
            strata("train", cfg, "--steps", "0", "--export-merged", merged)
            figures = {}
            on_store = generate_json(cfg, figures=figures)
            on_merged = generate_json("--model", merged, "--nvme", os.path.join(folder, f"{tag}-gen-merged"),
                                      "--precision", staged)
            on_base = generate_json("--model", base, "--nvme", os.path.join(folder, f"{tag}-gen-base"),
                                    "--precision", staged)
            if on_store != on_merged:
                fail(f"{tag}: generate on the adapter store {on_store[0]} differs from the merged export's "
                     f"{on_merged[0]} (margins {on_store[1][:4]} vs {on_merged[1][:4]})")
            if on_store == on_base:
                fail(f"{tag}: generate on the adapter store equals the base alone's: the adapters were not folded")
            # The weights fit the pool: each unit is read once, as the store holds it.
            if figures["nvme_read_bytes"] != figures["weight_bytes"]:
                fail(f"{tag}: read {figures['nvme_read_bytes']} bytes for {figures['weight_bytes']} of weights held "
                     f"in the pool (each unit once)")
            read_bytes[base_tag] = figures["nvme_read_bytes"]
            print(f"{tag}: adapter store and merged export sample the same {len(on_store[0])} tokens and margins; "
                  f"the base alone differs; read {figures['nvme_read_bytes']} bytes")
        # A quantised block is read as stored, not at bf16's size.
        for base_tag in ("int8", "nf4-dq"):
            if read_bytes[base_tag] >= read_bytes["bf16"]:
                fail(f"{arch}-{base_tag}: read {read_bytes[base_tag]} bytes, not fewer than the bf16 base's "
                     f"{read_bytes['bf16']}: the quantised blocks were not read as stored")
    # Streamed: budgets too small for the weights, so every pass reads each block again and the
    # fold (and a quantised block's dequantisation) runs on every read, never on a block already
    # folded.
    model = {**GPT2, "n_embd": 128, "n_layer": 4}
    base = base_folder(folder, "gpt2-wide", model)
    peft_in = os.path.join(folder, "streamed-peft")
    write_peft_folder(torch, peft_in, "gpt2", model, 4, 8, seed=9, std=0.4)
    for base_tag, base_keys, staged in GENERATE_BASES[1:]:
        tag = f"streamed-{base_tag}"
        cfg, _ = config(folder, {**model, "init": base}, adapter_block("gpt2", 4, 8, init=peft_in, **base_keys),
                        precision="bf16", name=f"{tag}.yaml")
        merged = os.path.join(folder, f"{tag}-merged")
        strata("train", cfg, "--steps", "0", "--export-merged", merged)
        with open(cfg) as f:
            small = json.load(f)
        small["device"]["memory"], small["host"]["memory"] = "1MiB", "2MiB"
        with open(cfg, "w") as f:
            json.dump(small, f)
        figures = {}
        on_store = generate_json(cfg, figures=figures)
        on_merged = generate_json("--model", merged, "--nvme", os.path.join(folder, f"{tag}-gen"),
                                  "--precision", staged)
        if figures["nvme_read_bytes"] < 4 * figures["weight_bytes"]:
            fail(f"{tag}: read {figures['nvme_read_bytes']} bytes for {figures['weight_bytes']} of weights: the "
                 f"blocks did not stream, so the fold on every read went untested")
        if on_store != on_merged:
            fail(f"{tag}: generate on the adapter store {on_store[0]} differs from the merged export's "
                 f"{on_merged[0]}")
        print(f"{tag} (read {figures['nvme_read_bytes'] / figures['weight_bytes']:.1f}x the weights of "
              f"{figures['weight_bytes']} bytes): the same {len(on_store[0])} tokens and margins as the merged export")


def case_refusals(folder):
    torch = import_torch()
    arch, model, r, alpha = "gpt2", GPT2, 4, 8
    first_a = "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"

    def drop(tensors):
        del tensors[first_a]

    def extra(tensors):
        tensors["base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight"] = torch.zeros(r, 64)

    def reshape(tensors):
        tensors[first_a] = torch.zeros(r + 1, 64)

    cases = [
        ("use_dora", {"use_dora": True}, None, "use_dora"),
        ("rank", {"r": 8}, None, "'r'"),
        ("alpha", {"lora_alpha": 16}, None, "lora_alpha"),
        ("bias", {"bias": "all"}, None, "bias"),
        ("rank_pattern", {"rank_pattern": {"c_attn": 8}}, None, "rank_pattern"),
        ("modules_to_save", {"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
        ("unknown key", {"lora_magic": 1}, None, "lora_magic"),
        ("peft_type", {"peft_type": "IA3"}, None, "peft_type"),
        ("targets", {"target_modules": ["c_attn"]}, None, "target_modules"),
        ("missing tensor", None, drop, first_a),
        ("extra tensor", None, extra, "h.0.mlp.c_fc.lora_A.weight"),
        ("wrong shape", None, reshape, first_a),
    ]
    for what, changes, edit, needle in cases:
        run = os.path.join(folder, what.replace(" ", "-"))
        os.makedirs(run)
        peft_in = os.path.join(run, "peft")
        write_peft_folder(torch, peft_in, arch, model, r, alpha, seed=1, config_changes=changes, tensors_edit=edit)
        cfg, nvme = config(run, model, adapter_block(arch, r, alpha, init=peft_in))
        result = strata("train", cfg, "--steps", "0", expect_ok=False)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        print(f"{what}: exit {result.returncode}: {lines[-1] if lines else ''}")
        if result.returncode != 2 or len(lines) != 1 or needle not in lines[0] or "peft" not in lines[0]:
            fail(f"{what}: expected exit 2 and one line naming the folder and '{needle}', got exit "
                 f"{result.returncode}:\n{result.stderr}")
        if os.listdir(nvme):
            fail(f"{what}: the refused run left {os.listdir(nvme)} in the NVMe path")
    # Export refusals: an adapter store to one .safetensors file; --merged without adapters.
    run = os.path.join(folder, "exports")
    os.makedirs(run)
    cfg, nvme = config(run, model, adapter_block(arch, r, alpha), name="adapter.yaml")
    strata("train", cfg, "--steps", "0")
    plain, plain_nvme = config(run, model, name="plain.yaml")
    strata("train", plain, "--steps", "0")
    for what, args, needle in (
            ("adapter store to a .safetensors", ["store", "export", os.path.join(nvme, "store"),
                                                 os.path.join(run, "a.safetensors")], "PEFT"),
            ("--merged without adapters", ["store", "export", "--merged", os.path.join(plain_nvme, "store"),
                                           os.path.join(run, "merged")], "no adapters")):
        result = strata(*args, expect_ok=False)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        print(f"{what}: exit {result.returncode}: {lines[-1] if lines else ''}")
        if result.returncode != 2 or len(lines) != 1 or needle not in lines[0]:
            fail(f"{what}: expected exit 2 and one line naming '{needle}', got exit {result.returncode}:\n"
                 f"{result.stderr}")
        if any(name.startswith(("a.safetensors", "merged")) for name in os.listdir(run)):
            fail(f"{what}: the refused export left {os.listdir(run)}")
    # --export-merged of a run without adapters: refused before any work.
    result = strata("train", plain, "--steps", "1", "--export-merged", os.path.join(run, "merged"), expect_ok=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    print(f"train --export-merged without adapters: exit {result.returncode}: {lines[-1] if lines else ''}")
    if result.returncode != 2 or len(lines) != 1 or "--export-merged" not in lines[0]:
        fail(f"train --export-merged without adapters: expected exit 2 and one line, got exit {result.returncode}:\n"
             f"{result.stderr}")


CASES = {"export": case_export, "merged": case_merged, "generate": case_generate, "refusals": case_refusals,
         "phi3": case_phi3}

if __name__ == "__main__":
    case = sys.argv[2]
    with tempfile.TemporaryDirectory(prefix=f"strata-lora-{case}-") as folder:
        CASES[case](folder)
    print(f"lora_peft {case}: ok")
