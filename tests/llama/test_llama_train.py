#!/usr/bin/python3
# tests/llama/test_llama_train.py — `strata train` on Llama configs, end to end through the
# binary: (reference) 5 fp32 steps from torch-written weights match an independent PyTorch
# float64 training loop (llama_reference.py's model, torch.optim.AdamW with decay on 2-D tensors,
# clip_grad_norm_ as the trainer clips) to 1e-4 in every loss and exported weight, tied and
# untied, and with attention biases (Qwen 2's q/k/v biases, theta 1e6, tied; Llama's
# attention_bias, q/k/v and o_proj, untied); (offload) resident and fully offloaded runs (tiny
# budgets, chunked optimizer state) export bit-identical weights, without and with q/k/v biases;
# (resume) a store resumed with another shape (k/v heads, rope scaling, biases) is refused naming
# the key, and the same shape resumes; (plan) `strata plan` sizes a Llama config with biases.
#
# Usage: test_llama_train.py STRATA_BINARY CASE
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
import test_train as tt  # noqa: E402  (config, strata, safetensors helpers; reads sys.argv[1])

LLAMA = {"arch": "llama", "n_layer": 2, "n_head": 6, "n_kv_head": 3, "head_dim": 16, "n_embd": 80,
         "intermediate_size": 112, "vocab_size": 256, "seq_len": 16, "rope_theta": 10000.0,
         "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8},
         "norm_eps": 1.0e-5, "init": "random", "seed": 7}

# Qwen 2 / 2.5 on LLAMA's odd shape: q/k/v biases, rope_theta 1e6, rms_norm_eps 1e-6, no rope scaling.
QWEN2 = {**{k: v for k, v in LLAMA.items() if k != "rope_scaling"}, "qkv_bias": True, "rope_theta": 1.0e6,
         "norm_eps": 1.0e-6}


def initial_value(torch, name, shape, std=0.08):
    """A test checkpoint's value: RMSNorm weights 1 + N(0, 0.1), biases N(0, 0.1) (nonzero, so a
    bias that is dropped shows), matrices N(0, std)."""
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape)
    if name.endswith(".bias"):
        return 0.1 * torch.randn(shape)
    return std * torch.randn(shape)


def reference_config(model):
    """llama_reference.py's config keys for `model` (no rope_scaling: factor 0)."""
    rs = model.get("rope_scaling") or {"factor": 0.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}
    return {"n_layer": model["n_layer"], "n_head": model["n_head"], "n_kv_head": model["n_kv_head"],
            "head_dim": model["head_dim"], "rope_theta": model["rope_theta"], "rope_factor": rs["factor"],
            "rope_low": rs["low_freq_factor"], "rope_high": rs["high_freq_factor"],
            "rope_original": rs["original_max_position_embeddings"], "norm_eps": model["norm_eps"],
            "tied": 1.0 if model.get("tie_word_embeddings", True) else 0.0}


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
        if model.get("qkv_bias"):
            shapes.update({p + "self_attn.q_proj.bias": (qw,), p + "self_attn.k_proj.bias": (kvw,),
                           p + "self_attn.v_proj.bias": (kvw,)})
        if model.get("o_proj_bias"):
            shapes[p + "self_attn.o_proj.bias"] = (c,)
    if not model.get("tie_word_embeddings", True):
        shapes["lm_head.weight"] = (v, c)
    return shapes


def torch_training(torch, model, init, cfg):
    """The trainer's recipe in float64: same batches, AdamW, clipping."""
    import llama_reference as ref
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
    inv_freq = ref.inverse_frequencies(rcfg)
    freqs = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    tied = model.get("tie_word_embeddings", True)
    losses = []
    for step in range(cfg["steps"]):
        rows = [tokens_all[((step * batch + b) * seq) % window_count:][:seq + 1] for b in range(batch)]
        window = torch.stack(rows)
        inputs, targets = window[:, :-1], window[:, 1:]
        x = params["model.embed_tokens.weight"][inputs]
        for layer in range(model["n_layer"]):
            x = ref.block(params, layer, x, rcfg, cos, sin)
        x = ref.rms_norm(x, params["model.norm.weight"], model["norm_eps"])
        head = params["model.embed_tokens.weight"] if tied else params["lm_head.weight"]
        logits = torch.nn.functional.linear(x, head)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, model["vocab_size"]), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), o["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
    return losses, params


def compare_with_torch(torch, ours, ref_params, names, label):
    """Exported fp32 bytes per tensor vs torch's trained float64 weights: the same names, each
    within 1e-4 of the tensor's largest magnitude. Returns the worst relative difference."""
    if set(ours) != names:
        tt.fail(f"{label}: exported tensors {sorted(set(ours) ^ names)} differ from the model's")
    worst = 0.0
    for name in sorted(names):
        a = torch.frombuffer(bytearray(ours[name]), dtype=torch.float32).double()
        b = ref_params[name].detach().reshape(-1)
        rel = ((a - b).abs().max() / b.abs().max()).item()
        worst = max(worst, rel)
        if rel > 1e-4:
            tt.fail(f"{label}: weight {name} differs from torch's training by {rel:.2e} relative")
    return worst


def case_reference(folder):
    torch = import_torch()
    sys.path.insert(0, HERE)
    variants = [("tied0", {**LLAMA, "tie_word_embeddings": False}), ("tied1", {**LLAMA, "tie_word_embeddings": True}),
                ("qwen2-tied1", {**QWEN2, "tie_word_embeddings": True}),
                ("attention-bias-tied0", {**LLAMA, "tie_word_embeddings": False, "qkv_bias": True,
                                          "o_proj_bias": True})]
    for label, model in variants:
        run_dir = os.path.join(folder, label)
        os.makedirs(run_dir)
        torch.manual_seed(5)
        init, blobs = {}, {}
        for name, shape in shapes_of(model).items():
            init[name] = initial_value(torch, name, shape).float()
            blobs[name] = (shape, init[name].numpy().tobytes())
        init_path = os.path.join(run_dir, "init.safetensors")
        tt.write_safetensors(init_path, blobs)
        cfg_path, cfg = tt.config(run_dir, model={**model, "init": init_path}, optimizer={"eps": 1.0e-6},
                                  placement={"params": "nvme", "grads": "nvme", "optimizer": "nvme"})
        metrics = os.path.join(run_dir, "metrics.json")
        final = os.path.join(run_dir, "final.safetensors")
        tt.strata("train", cfg_path, "--metrics", metrics, "--export", final)
        ref_losses, ref_params = torch_training(torch, model, init, cfg)
        with open(metrics) as f:
            our_losses = [s["loss"] for s in json.load(f)["steps"]]
        if len(our_losses) != len(ref_losses):
            tt.fail(f"{len(our_losses)} strata steps vs {len(ref_losses)} reference steps")
        for step, (ours, theirs) in enumerate(zip(our_losses, ref_losses), 1):
            rel = abs(ours - theirs) / abs(theirs)
            print(f"{label} step {step}: loss strata {ours:.7f} torch {theirs:.7f} rel {rel:.2e}")
            if rel > 1e-4:
                tt.fail(f"{label} step {step}: loss differs by {rel:.2e} relative")
        ours, header = tt.read_safetensors(final)
        worst = compare_with_torch(torch, ours, ref_params, set(init), label)
        print(f"{label}: all {len(init)} exported weights within {worst:.2e} relative of torch")


def case_offload(folder):
    tiny = {"device": {"memory": "6MiB"}, "host": {"memory": "6MiB"}}
    # Untied without biases; tied with Qwen 2's q/k/v biases.
    for tied in (False, True):
        base = QWEN2 if tied else LLAMA
        exports = []
        variants = [
            ("resident", {"device": {"memory": "256MiB"}, "host": {"memory": "256MiB"},
                          "placement": {"params": "device", "grads": "host", "optimizer": "host"}}),
            ("offloaded", {**tiny, "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
                           "optimizer": {"chunk_elements": 4096}}),
        ]
        for name, overrides in variants:
            run_dir = os.path.join(folder, f"{name}-tied{int(tied)}")
            os.makedirs(run_dir)
            overrides = dict(overrides)
            optimizer = {"grad_clip": 1.0, **overrides.pop("optimizer", {})}
            cfg_path, _ = tt.config(run_dir, model={**base, "n_layer": 3, "seq_len": 32, "tie_word_embeddings": tied},
                                    batch_size=4, steps=12, precision="bf16", checkpoint_every=5,
                                    optimizer=optimizer, **overrides)
            out = os.path.join(run_dir, "weights.safetensors")
            summary = json.loads(tt.strata("train", cfg_path, "--export", out, "--json").stdout)
            print(f"tied {tied} {name}: loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
                  f"NVMe read {summary['nvme_read_bytes']} bytes")
            if name != "resident" and summary["nvme_read_bytes"] == 0:
                tt.fail(f"the {name} run read nothing from NVMe: it did not offload")
            if not summary["last_loss"] < summary["first_loss"]:
                tt.fail(f"{name}: the loss did not fall")
            with open(out, "rb") as f:
                exports.append(f.read())
        if exports[1] != exports[0]:
            tt.fail(f"tied {tied}: the resident and offloaded runs exported different weights")
        print(f"tied {tied}: resident and offloaded exports are bit-identical ({len(exports[0])} bytes)")


def case_resume(folder):
    cfg_path, _ = tt.config(folder, model=LLAMA, steps=2)
    tt.strata("train", cfg_path)
    # Another k/v head count: refused, naming the key, and the store is untouched.
    other_path, _ = tt.config(folder, model={**LLAMA, "n_kv_head": 2}, steps=4)
    result = tt.strata("train", other_path, "--resume", expect_ok=False)
    if result.returncode == 0 or "model.n_kv_head" not in result.stderr:
        tt.fail(f"a resume with another n_kv_head was not refused naming the key:\n{result.stderr}")
    print("refused: " + result.stderr.strip().splitlines()[-1])
    # Other rope scaling: refused too.
    other_path, _ = tt.config(folder, model={**LLAMA, "rope_scaling": {**LLAMA["rope_scaling"], "factor": 4.0}},
                              steps=4)
    result = tt.strata("train", other_path, "--resume", expect_ok=False)
    if result.returncode == 0 or "model.rope_scaling.factor" not in result.stderr:
        tt.fail(f"a resume with another rope_scaling.factor was not refused naming the key:\n{result.stderr}")
    # Q/k/v biases: another model (three more tensors per block), refused naming the key.
    other_path, _ = tt.config(folder, model={**LLAMA, "qkv_bias": True}, steps=4)
    result = tt.strata("train", other_path, "--resume", expect_ok=False)
    if result.returncode == 0 or "model.qkv_bias" not in result.stderr:
        tt.fail(f"a resume with q/k/v biases was not refused naming the key:\n{result.stderr}")
    cfg_path, _ = tt.config(folder, model=LLAMA, steps=4)
    summary = json.loads(tt.strata("train", cfg_path, "--resume", "--json").stdout)
    if summary["first_step"] != 2 or summary["last_step"] != 4:
        tt.fail(f"the same shape did not resume from step 2: {summary}")
    print("the same shape resumed from step 2 to 4")


def case_plan(folder):
    cfg_path, _ = tt.config(folder, model=LLAMA)
    result = tt.strata("plan", cfg_path, "--json")
    plan = json.loads(result.stdout)
    # With Qwen 2's biases the plan counts them (H·D + 2·KV·D per block) and says so.
    biased_path, _ = tt.config(folder, model={**LLAMA, "qkv_bias": True})
    biased = json.loads(tt.strata("plan", biased_path, "--json").stdout)
    per_block = LLAMA["n_head"] * LLAMA["head_dim"] + 2 * LLAMA["n_kv_head"] * LLAMA["head_dim"]
    if biased["parameters"] - plan["parameters"] != LLAMA["n_layer"] * per_block:
        tt.fail(f"the plan counts {biased['parameters']} parameters with q/k/v biases, {plan['parameters']} "
                f"without: not {LLAMA['n_layer']} × {per_block} more")
    text = tt.strata("plan", biased_path).stdout
    if "q/k/v biases" not in text:
        tt.fail(f"strata plan does not name the q/k/v biases:\n{text[:400]}")
    if not os.listdir(os.path.join(folder, "nvme")) == []:
        tt.fail("strata plan wrote into the NVMe path")
    print("plan: " + json.dumps(plan)[:300])


CASES = {"reference": case_reference, "offload": case_offload, "resume": case_resume, "plan": case_plan}

if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR")) as tmp:
        CASES[sys.argv[2]](tmp)
    print("PASS")
