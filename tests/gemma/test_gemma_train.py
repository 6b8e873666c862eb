#!/usr/bin/python3
# tests/gemma/test_gemma_train.py — Gemma through the `strata` binary, end to end:
#   reference  3 fp32 AdamW steps of `strata train` on a tiny Gemma (multi-query attention,
#              head_dim 24 apart from n_embd / n_head) from torch-written weights match an
#              independent float64 PyTorch training loop (gemma_reference.py's model,
#              torch.optim.AdamW with decay on 2-D tensors, clip_grad_norm_ as the trainer clips)
#              to 1e-4 in every loss and every exported weight, tied and untied.
#   hf         a Gemma Hugging Face folder (config.json as GemmaForCausalLM's, model.safetensors)
#              → train 3 steps → --export OUT: config.json says gemma (GemmaForCausalLM, the tanh
#              GELU under both activation keys, head_dim, tied), every tensor within 1e-4 of
#              torch's training; OUT loads back (train 0 steps, export again) bit for bit.
#   offload    resident and fully offloaded runs (6 MiB budgets, chunked optimizer state, bf16)
#              export bit-identical weights, and the offloaded one read from NVMe.
#   lora       LoRA on every linear of a Gemma HF base (PEFT folder from torch as adapter.init, A
#              and B nonzero): 3 steps, the exported PEFT adapters and the losses within 1e-4 of
#              a float64 torch training of PEFT's formula over the frozen Gemma.
#   refusals   one line each, naming the key: a folder whose activation is not the tanh GELU
#              (hidden_act "gelu" alone), a gemma YAML with qkv_bias, a resume with another
#              head_dim or arch.
#   generate   `strata generate --model` on Gemma folders (tied and untied; fp32 and bf16 compute
#              copies): greedy tokens equal the argmax of a float64 PyTorch Gemma
#              (gemma_reference.py, a whole forward per token, the bf16 run's from the weights
#              rounded to bf16) across a window refill, up to a near-tie; and a gemma run's
#              end-of-run sample: prints one.
# Usage: test_gemma_train.py STRATA_BINARY CASE. Exit 77 where torch is missing.
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
sys.path.insert(0, HERE)
import test_train as tt  # noqa: E402  (config, strata, safetensors helpers; reads sys.argv[1])

# Gemma 2B's proportions, tiny: one k/v head, head_dim apart from n_embd / n_head (24 vs 10).
GEMMA = {"arch": "gemma", "n_layer": 2, "n_head": 4, "n_kv_head": 1, "head_dim": 24, "n_embd": 40,
         "intermediate_size": 56, "vocab_size": 256, "seq_len": 16, "rope_theta": 10000.0, "norm_eps": 1.0e-6,
         "init": "random", "seed": 7}


def import_torch():
    try:
        import torch
        return torch
    except ImportError as error:
        print(f"SKIP: PyTorch is not importable by {sys.executable} ({error})", file=sys.stderr)
        sys.exit(77)


def shapes_of(model):
    c, v, i = model["n_embd"], model["vocab_size"], model["intermediate_size"]
    qw, kvw = model["n_head"] * model["head_dim"], model["n_kv_head"] * model["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, c), "model.norm.weight": (c,)}
    for layer in range(model["n_layer"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "input_layernorm.weight": (c,), p + "self_attn.q_proj.weight": (qw, c),
                       p + "self_attn.k_proj.weight": (kvw, c), p + "self_attn.v_proj.weight": (kvw, c),
                       p + "self_attn.o_proj.weight": (c, qw), p + "post_attention_layernorm.weight": (c,),
                       p + "mlp.gate_proj.weight": (i, c), p + "mlp.up_proj.weight": (i, c),
                       p + "mlp.down_proj.weight": (c, i)})
    if not model.get("tie_word_embeddings", True):
        shapes["lm_head.weight"] = (v, c)
    return shapes


def initial_weights(torch, model, seed):
    """RMSNorm weights N(0, 0.1) (Gemma's gain is 1 + w: near 1, never exactly), matrices N(0, 0.08)."""
    torch.manual_seed(seed)
    return {name: (0.1 if name.endswith("norm.weight") else 0.08) * torch.randn(shape)
            for name, shape in shapes_of(model).items()}


def reference_config(model):
    return {"n_layer": model["n_layer"], "n_head": model["n_head"], "n_kv_head": model["n_kv_head"],
            "head_dim": model["head_dim"], "n_embd": model["n_embd"], "rope_theta": model["rope_theta"],
            "norm_eps": model["norm_eps"], "tied": 1.0 if model.get("tie_word_embeddings", True) else 0.0,
            "gemma": 1.0}


def torch_training(torch, model, init, cfg):
    """The trainer's recipe in float64: the same windows of the corpus, AdamW, clipping."""
    import gemma_reference as ref
    params = {name: t.double().clone().requires_grad_(True) for name, t in init.items()}
    o = cfg["optimizer"]
    decay = [p for p in params.values() if p.dim() == 2]
    no_decay = [p for p in params.values() if p.dim() != 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])
    rcfg = reference_config(model)
    seq, batch = model["seq_len"], cfg["batch_size"]
    with open(tt.CORPUS, "rb") as f:
        tokens_all = torch.tensor(list(f.read()), dtype=torch.long)
    window_count = tokens_all.numel() - seq - 1
    losses = []
    for step in range(cfg["steps"]):
        window = torch.stack([tokens_all[((step * batch + b) * seq) % window_count:][:seq + 1] for b in range(batch)])
        loss = ref.loss_of(ref.forward_logits(params, window[:, :-1], rcfg), window[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), o["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
    return losses, params


def compare_weights(torch, ours, ref_params, names, label):
    """Exported fp32 bytes per tensor vs torch's trained float64 weights, each within 1e-4 of
    the tensor's largest magnitude; prints each tensor's figure and returns the worst."""
    if set(ours) != names:
        tt.fail(f"{label}: exported tensors {sorted(set(ours) ^ names)} differ from the model's")
    worst = 0.0
    for name in sorted(names):
        a = torch.frombuffer(bytearray(ours[name]), dtype=torch.float32).double()
        b = ref_params[name].detach().reshape(-1)
        rel = ((a - b).abs().max() / b.abs().max()).item()
        print(f"  {label} {name}: {rel:.2e}")
        worst = max(worst, rel)
        if rel > 1e-4:
            tt.fail(f"{label}: weight {name} differs from torch's training by {rel:.2e} relative")
    return worst


def compare_losses(metrics, ref_losses, label):
    with open(metrics) as f:
        our_losses = [s["loss"] for s in json.load(f)["steps"]]
    if len(our_losses) != len(ref_losses):
        tt.fail(f"{label}: {len(our_losses)} strata steps vs {len(ref_losses)} reference steps")
    for step, (ours, theirs) in enumerate(zip(our_losses, ref_losses), 1):
        rel = abs(ours - theirs) / abs(theirs)
        print(f"{label} step {step}: loss strata {ours:.7f} torch {theirs:.7f} rel {rel:.2e}")
        if rel > 1e-4:
            tt.fail(f"{label} step {step}: loss differs by {rel:.2e} relative")


def train_steps(run_dir, model, steps=3):
    """`strata train` from model["init"]; returns the config, the metrics path and the export."""
    cfg_path, cfg = tt.config(run_dir, model=model, steps=steps, optimizer={"eps": 1.0e-6},
                              placement={"params": "nvme", "grads": "nvme", "optimizer": "nvme"})
    metrics = os.path.join(run_dir, "metrics.json")
    return cfg_path, cfg, metrics


def case_reference(folder):
    torch = import_torch()
    for label, model in [("tied", {**GEMMA, "tie_word_embeddings": True}),
                         ("untied", {**GEMMA, "tie_word_embeddings": False})]:
        run_dir = os.path.join(folder, label)
        os.makedirs(run_dir)
        init = initial_weights(torch, model, seed=5)
        init_path = os.path.join(run_dir, "init.safetensors")
        tt.write_safetensors(init_path, {n: (tuple(t.shape), t.numpy().tobytes()) for n, t in init.items()})
        cfg_path, cfg, metrics = train_steps(run_dir, {**model, "init": init_path})
        final = os.path.join(run_dir, "final.safetensors")
        tt.strata("train", cfg_path, "--metrics", metrics, "--export", final)
        ref_losses, ref_params = torch_training(torch, model, init, cfg)
        compare_losses(metrics, ref_losses, label)
        ours, _ = tt.read_safetensors(final)
        worst = compare_weights(torch, ours, ref_params, set(init), label)
        print(f"{label}: all {len(init)} exported weights within {worst:.2e} relative of torch")


def hf_config(model, **overrides):
    """GemmaForCausalLM's config.json for `model` (Gemma 1's keys; hidden_activation as the
    updated Gemma configs carry it)."""
    cfg = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": model["n_embd"],
           "intermediate_size": model["intermediate_size"], "num_hidden_layers": model["n_layer"],
           "num_attention_heads": model["n_head"], "num_key_value_heads": model["n_kv_head"],
           "head_dim": model["head_dim"], "vocab_size": model["vocab_size"], "max_position_embeddings": 64,
           "rms_norm_eps": model["norm_eps"], "rope_theta": model["rope_theta"], "rope_scaling": None,
           "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
           "attention_dropout": 0.0, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
           "tie_word_embeddings": True, "torch_dtype": "float32"}
    cfg.update(overrides)
    return cfg


def write_folder(torch, folder, model, config):
    os.makedirs(folder)
    init = initial_weights(torch, model, seed=6)
    tt.write_safetensors(os.path.join(folder, "model.safetensors"),
                         {n: (tuple(t.shape), t.numpy().tobytes()) for n, t in init.items()})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return init


def folder_train_config(folder, name, init, steps):
    nvme = os.path.join(folder, name + "-nvme")
    os.makedirs(nvme)
    cfg = {"model": {"init": init, "seq_len": 16}, "data": {"path": tt.CORPUS, "format": "text-bytes"},
           "batch_size": 3, "steps": steps,
           "optimizer": {"lr": 1.0e-3, "betas": [0.9, 0.95], "eps": 1.0e-6, "weight_decay": 0.1, "grad_clip": 1.0},
           "precision": "fp32", "device": {"kind": "cpu", "memory": "64MiB"}, "host": {"memory": "64MiB"},
           "nvme": {"paths": [nvme]}, "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
           "checkpoint_every": 10}
    path = os.path.join(folder, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path, cfg


def case_hf(folder):
    torch = import_torch()
    model = {**GEMMA, "vocab_size": 260, "tie_word_embeddings": True}
    hf_dir = os.path.join(folder, "tiny-gemma")
    init = write_folder(torch, hf_dir, model, hf_config(model))
    cfg_path, cfg = folder_train_config(folder, "train", hf_dir, steps=3)
    out = os.path.join(folder, "out")
    tt.strata("--log-level", "warn", "train", cfg_path, "--export", out)
    exported = json.load(open(os.path.join(out, "config.json")))
    want = {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh", "head_dim": 24, "num_key_value_heads": 1,
            "tie_word_embeddings": True, "attention_bias": False, "rms_norm_eps": 1.0e-6}
    if any(exported.get(key) != value for key, value in want.items()):
        tt.fail(f"{out}/config.json is not GemmaForCausalLM's: {exported}")
    ours, _ = tt.read_safetensors(os.path.join(out, "model.safetensors"))
    _, ref_params = torch_training(torch, model, init, cfg)
    worst = compare_weights(torch, ours, ref_params, set(init), "hf")
    print(f"hf: {len(init)} trained weights within {worst:.2e} of torch; config.json {json.dumps(exported)}")

    # The exported folder loads back bit for bit.
    again_path, _ = folder_train_config(folder, "again", out, steps=0)
    out2 = os.path.join(folder, "out2")
    tt.strata("--log-level", "warn", "train", again_path, "--export", out2)
    again, _ = tt.read_safetensors(os.path.join(out2, "model.safetensors"))
    for name in ours:
        if again[name] != ours[name]:
            tt.fail(f"{name}: {out} → strata → {out2} is not bit-identical")
    print(f"hf: {out} → strata → {out2} bit-identical ({len(ours)} tensors)")


def case_offload(folder):
    tiny = {"device": {"memory": "6MiB"}, "host": {"memory": "6MiB"}}
    variants = [
        ("resident", {"device": {"memory": "256MiB"}, "host": {"memory": "256MiB"},
                      "placement": {"params": "device", "grads": "host", "optimizer": "host"}}),
        ("offloaded", {**tiny, "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
                       "optimizer": {"chunk_elements": 4096}}),
    ]
    exports = []
    for name, overrides in variants:
        run_dir = os.path.join(folder, name)
        os.makedirs(run_dir)
        overrides = dict(overrides)
        optimizer = {"grad_clip": 1.0, **overrides.pop("optimizer", {})}
        cfg_path, _ = tt.config(run_dir, model={**GEMMA, "n_layer": 3, "seq_len": 32}, batch_size=4, steps=12,
                                precision="bf16", checkpoint_every=5, optimizer=optimizer, **overrides)
        out = os.path.join(run_dir, "weights.safetensors")
        summary = json.loads(tt.strata("train", cfg_path, "--export", out, "--json").stdout)
        print(f"{name}: loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
              f"NVMe read {summary['nvme_read_bytes']} bytes")
        if name != "resident" and summary["nvme_read_bytes"] == 0:
            tt.fail(f"the {name} run read nothing from NVMe: it did not offload")
        if not summary["last_loss"] < summary["first_loss"]:
            tt.fail(f"{name}: the loss did not fall")
        with open(out, "rb") as f:
            exports.append(f.read())
    if exports[1] != exports[0]:
        tt.fail("the resident and offloaded runs exported different weights")
    print(f"resident and offloaded exports are bit-identical ({len(exports[0])} bytes)")


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_linears(model):
    """(module path, in, out) of every adapted linear of `model`."""
    c, i = model["n_embd"], model["intermediate_size"]
    qw, kvw = model["n_head"] * model["head_dim"], model["n_kv_head"] * model["head_dim"]
    shapes = {"self_attn.q_proj": (c, qw), "self_attn.k_proj": (c, kvw), "self_attn.v_proj": (c, kvw),
              "self_attn.o_proj": (qw, c), "mlp.gate_proj": (c, i), "mlp.up_proj": (c, i), "mlp.down_proj": (i, c)}
    return [(f"model.layers.{layer}.{suffix}", fin, fout) for layer in range(model["n_layer"])
            for suffix, (fin, fout) in shapes.items()]


def peft_adapter_config(r, alpha):
    """adapter_config.json as PEFT's LoraConfig.save_pretrained writes it."""
    return {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": None, "bias": "none",
            "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layer_replication": None,
            "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": alpha,
            "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
            "peft_type": "LORA", "r": r, "rank_pattern": {}, "revision": None, "target_modules": LORA_TARGETS,
            "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": False}


def case_lora(folder):
    torch = import_torch()
    import gemma_reference as ref
    model = {**GEMMA, "tie_word_embeddings": True}
    rank, alpha = 4, 8.0
    base_dir = os.path.join(folder, "base")
    base = write_folder(torch, base_dir, model, hf_config(model))
    peft_dir = os.path.join(folder, "peft-init")
    os.makedirs(peft_dir)
    torch.manual_seed(11)
    adapters = {}
    for path, fin, fout in lora_linears(model):
        adapters[f"base_model.model.{path}.lora_A.weight"] = 0.2 * torch.randn(rank, fin)
        adapters[f"base_model.model.{path}.lora_B.weight"] = 0.2 * torch.randn(fout, rank)
    with open(os.path.join(peft_dir, "adapter_config.json"), "w") as f:
        json.dump(peft_adapter_config(rank, alpha), f)
    tt.write_safetensors(os.path.join(peft_dir, "adapter_model.safetensors"),
                         {n: (tuple(t.shape), t.numpy().tobytes()) for n, t in adapters.items()})
    cfg_path, cfg = folder_train_config(folder, "lora", base_dir, steps=3)
    cfg["adapter"] = {"kind": "lora", "rank": rank, "alpha": alpha, "targets": LORA_TARGETS, "base_dtype": "fp32",
                      "init": peft_dir}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    metrics = os.path.join(folder, "lora-metrics.json")
    out = os.path.join(folder, "lora-out")
    tt.strata("--log-level", "warn", "train", cfg_path, "--metrics", metrics, "--export", out)

    # torch: PEFT's formula over the frozen base, AdamW (decay: the adapters are 2-D) and
    # clipping over the adapters alone, the trainer's windows.
    frozen = {name: t.double() for name, t in base.items()}
    trained = {name: t.double().clone().requires_grad_(True) for name, t in adapters.items()}
    lora = {path: (trained[f"base_model.model.{path}.lora_A.weight"], trained[f"base_model.model.{path}.lora_B.weight"],
                   alpha / rank) for path, _, _ in lora_linears(model)}
    o = cfg["optimizer"]
    optimizer = torch.optim.AdamW(list(trained.values()), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                  weight_decay=o["weight_decay"])
    rcfg = reference_config(model)
    seq, batch = model["seq_len"], cfg["batch_size"]
    with open(tt.CORPUS, "rb") as f:
        tokens_all = torch.tensor(list(f.read()), dtype=torch.long)
    window_count = tokens_all.numel() - seq - 1
    losses = []
    for step in range(cfg["steps"]):
        window = torch.stack([tokens_all[((step * batch + b) * seq) % window_count:][:seq + 1] for b in range(batch)])
        loss = ref.loss_of(ref.forward_logits(frozen, window[:, :-1], rcfg, lora), window[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(trained.values()), o["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
    compare_losses(metrics, losses, "lora")
    ours, _ = tt.read_safetensors(os.path.join(out, "adapter_model.safetensors"))
    worst = compare_weights(torch, ours, trained, set(trained), "lora")
    print(f"lora: all {len(trained)} exported adapters within {worst:.2e} relative of torch")


def expect_refusal(result, needle, what):
    lines = result.stderr.strip().splitlines()
    if result.returncode == 0 or needle not in result.stderr:
        tt.fail(f"{what} was not refused naming {needle!r} (exit {result.returncode}):\n{result.stderr}")
    print(f"refused ({what}): {lines[-1] if lines else ''}")


def case_refusals(folder):
    torch = import_torch()
    model = {**GEMMA, "vocab_size": 260}
    # Gemma 1.0's original config.json: hidden_act "gelu" and no hidden_activation.
    legacy = os.path.join(folder, "legacy-gemma")
    legacy_config = hf_config(model, hidden_act="gelu")
    del legacy_config["hidden_activation"]
    write_folder(torch, legacy, model, legacy_config)
    path, _ = folder_train_config(folder, "legacy", legacy, steps=1)
    expect_refusal(tt.strata("train", path, expect_ok=False), "hidden_act", "an exact-GELU Gemma folder")

    run_dir = os.path.join(folder, "yaml")
    os.makedirs(run_dir)
    path, _ = tt.config(run_dir, model={**GEMMA, "qkv_bias": True}, steps=1)
    expect_refusal(tt.strata("train", path, expect_ok=False), "qkv_bias", "a gemma YAML with qkv_bias")

    # A store of one shape resumed with another: refused naming the first key that differs.
    path, _ = tt.config(run_dir, model=GEMMA, steps=2)
    tt.strata("train", path)
    for other, key in [({**GEMMA, "head_dim": 16}, "model.head_dim"), ({**GEMMA, "arch": "llama"}, "model.arch")]:
        other_path, _ = tt.config(run_dir, model=other, steps=4)
        expect_refusal(tt.strata("train", other_path, "--resume", expect_ok=False), key, f"a resume with {key}")
    path, _ = tt.config(run_dir, model=GEMMA, steps=3)
    summary = json.loads(tt.strata("train", path, "--resume", "--json").stdout)
    if summary["first_step"] != 2 or summary["last_step"] != 3:
        tt.fail(f"the same gemma shape did not resume from step 2: {summary}")


def torch_greedy(torch, params, model, prompt, count, window):
    """Greedy tokens of the float64 Gemma, a whole forward over the window per token; a full
    window keeps its last half (as strata generate does). With each token, the margin between
    the two best logits (a near-tie may go either way in fp32)."""
    import gemma_reference as ref
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


def compare_greedy(got, want, label):
    """strata's greedy tokens against torch's, up to a near-tie (which may go either way in fp32)."""
    if len(got["tokens"]) != len(want):
        tt.fail(f"{label}: {len(got['tokens'])} tokens, not {len(want)}")
    for k, (token, margin) in enumerate(want):
        if got["tokens"][k] != token:
            if margin < 1e-4:
                print(f"{label}: stopped comparing at token {k} (a tie within {margin:.1e})")
                return
            tt.fail(f"{label}: greedy token {k}: strata {got['tokens'][k]}, torch {token} (margin {margin:.2e})\n"
                    f"{got['tokens']}\n{[t for t, _ in want]}")


def case_generate(folder):
    torch = import_torch()
    prompt_text, count, window = "The ", 24, 16  # 4 tokens + 24: one refill of the 16-position window
    prompt_ids = list(prompt_text.encode())
    # Tied, the scaled embedding dominates the residual and greedy echoes the last token; the
    # untied head is the case whose tokens vary.
    for tied in (True, False):
        model = {**GEMMA, "vocab_size": 260, "tie_word_embeddings": tied}
        hf_dir = os.path.join(folder, "gemma-tied" if tied else "gemma-untied")
        init = write_folder(torch, hf_dir, model, hf_config(model, tie_word_embeddings=tied))
        for precision in ("fp32", "bf16"):
            label = f"generate ({'tied' if tied else 'untied'}, {precision})"
            result = tt.strata("--log-level", "warn", "generate", "--model", hf_dir, "--nvme",
                               os.path.join(folder, f"gen-nvme-{tied}-{precision}"), "--host-memory", "8MiB",
                               "--device-memory", "8MiB", "--precision", precision, "--temperature", "0", "--json",
                               "--prompt", prompt_text, "--tokens", str(count), "--seq-len", str(window))
            got = json.loads(result.stdout)
            if got["prompt_tokens"] != len(prompt_ids):
                tt.fail(f"{label}: the prompt encoded to {got['prompt_tokens']} tokens, not {len(prompt_ids)}")
            # The bf16 compute copy is the weights rounded to bf16: the reference reads the same.
            params = {name: (t.bfloat16() if precision == "bf16" else t).double() for name, t in init.items()}
            compare_greedy(got, torch_greedy(torch, params, model, prompt_ids, count, window), label)
            print(f"{label}: greedy tokens match the float64 Gemma: {got['tokens']}")

    # A gemma run's end-of-run sample goes through the same decode ops.
    run_dir = os.path.join(folder, "sample")
    os.makedirs(run_dir)
    path, _ = tt.config(run_dir, model=GEMMA, steps=1, sample={"tokens": 8})
    # (the sample may hold bytes that are not UTF-8: read stderr leniently)
    trained = subprocess.run([tt.STRATA, "train", path], capture_output=True, text=True, errors="replace",
                             timeout=600)
    if trained.returncode != 0:
        tt.fail(f"strata train exited {trained.returncode}:\n{trained.stderr}")
    if "sample from the trained model" not in trained.stderr:
        tt.fail(f"a gemma run printed no sample:\n{trained.stderr[-600:]}")
    print("sample: a gemma run prints its end-of-run sample")

CASES = {"reference": case_reference, "hf": case_hf, "offload": case_offload, "lora": case_lora,
         "refusals": case_refusals, "generate": case_generate}

if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR")) as tmp:
        CASES[sys.argv[2]](tmp)
    print("PASS")
