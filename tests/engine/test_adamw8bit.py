#!/usr/bin/python3
# tests/engine/test_adamw8bit.py — `optimizer.kind: adamw8bit` (issue 32) end to end, through
# the real binary. (offload) a demo-sized GPT-2 and a small Llama, each trained resident, fully
# offloaded, offloaded in 4096-element chunks (8-bit tensors cut on block boundaries, chunks
# mixing 8-bit and fp32 pieces) and on the emulated discrete device with the host-side and the
# device-side optimizer, export the same bytes; embedding_state fp32 and another block size
# change the weights (the rules reach the update), and with every tensor under min_8bit_size
# (fp32-moment pieces only) the weights are adamw's bit for bit. (resume) a run stopped at a commit and
# resumed equals the uninterrupted one bit for bit, `strata store export` of it equals --export,
# and resuming an adamw store as adamw8bit (or with another block_size) is refused in one line
# naming the key. (reference) 3 steps equal an independent PyTorch run whose 8-bit tensors take
# tests/optim/adamw8bit_reference.py's reimplementation of the kernel contract: every weight
# within 1e-5 but the few whose moment sat on a code midpoint (≤ 0.1 % a tensor, each < 2 lr;
# the case explains why). (bad_input) bad optimizer keys are one line naming the key, exit 2.
#
# Usage: test_adamw8bit.py STRATA_BINARY CASE
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import (CORPUS, HERE, config, fail, read_safetensors, strata,  # noqa: E402
                        write_safetensors)

CASE = sys.argv[2]
DEMO = {"n_layer": 6, "n_head": 6, "n_embd": 192, "vocab_size": 256, "seq_len": 64, "init": "random", "seed": 1}
LLAMA = {"arch": "llama", "n_layer": 2, "n_head": 6, "n_kv_head": 3, "head_dim": 16, "n_embd": 80,
         "intermediate_size": 112, "vocab_size": 256, "seq_len": 16, "rope_theta": 10000.0,
         "norm_eps": 1.0e-5, "init": "random", "seed": 7}
EIGHT = {"kind": "adamw8bit", "grad_clip": 1.0}


def train(folder, name, *args, **overrides):
    """Trains; returns (exported bytes, --json summary)."""
    run_dir = os.path.join(folder, name)
    os.makedirs(run_dir)
    cfg_path, _ = config(run_dir, **overrides)
    out = os.path.join(run_dir, "weights.safetensors")
    result = strata("--log-level", "warn", "train", cfg_path, "--export", out, "--json", *args)
    with open(out, "rb") as f:
        return f.read(), json.loads(result.stdout)


def case_offload(folder):
    small = {"device": {"memory": "8MiB"}, "host": {"memory": "8MiB"}}
    for model_name, model, batch, steps in (("gpt2-demo", DEMO, 4, 4), ("llama", LLAMA, 3, 6)):
        variants = [
            ("resident", {"device": {"memory": "256MiB"}, "host": {"memory": "256MiB"},
                          "placement": {"params": "device", "grads": "host", "optimizer": "host"}}),
            ("offloaded", {**small, "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"}}),
            ("chunked", {**small, "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
                         "optimizer": {"chunk_elements": 4096}}),
            ("emulated-device-opt", {"device": {"kind": "emulated", "memory": "16MiB"}, "host": {"memory": "16MiB"},
                                     "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"},
                                     "optimizer": {"chunk_elements": 4096}}),
            ("emulated-host-opt", {"device": {"kind": "emulated", "memory": "64MiB"}, "host": {"memory": "64MiB"},
                                   "placement": {"params": "device", "grads": "host", "optimizer": "host"}}),
        ]
        exports = []
        for name, overrides in variants:
            overrides = dict(overrides)
            optimizer = {**EIGHT, **overrides.pop("optimizer", {})}
            export, summary = train(folder, f"{model_name}-{name}", model=model, batch_size=batch, steps=steps,
                                    precision="bf16", checkpoint_every=3, optimizer=optimizer, **overrides)
            print(f"{model_name} {name}: loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
                  f"NVMe read {summary['nvme_read_bytes']} bytes")
            if not summary["last_loss"] < summary["first_loss"]:
                fail(f"{model_name} {name}: the loss did not fall")
            if name in ("offloaded", "chunked") and summary["nvme_read_bytes"] == 0:
                fail(f"{model_name} {name}: read nothing from NVMe: it did not offload")
            if name.startswith("emulated") and summary["host_to_device_bytes"] == 0:
                fail(f"{model_name} {name}: the emulated run copied nothing host→device")
            exports.append(export)
        for (name, _), export in zip(variants[1:], exports[1:]):
            if export != exports[0]:
                fail(f"{model_name}: the resident and {name} adamw8bit runs exported different weights")
        print(f"{model_name}: {', '.join(n for n, _ in variants)} exports are bit-identical ({len(exports[0])} bytes)")
        # The rules reach the update: each changes the weights, and adamw8bit is not adamw.
        others = {}
        for name, optimizer in (("adamw", {"kind": "adamw"}), ("embedding-fp32", {**EIGHT, "embedding_state": "fp32"}),
                                ("block-64", {**EIGHT, "block_size": 64})):
            others[name], _ = train(folder, f"{model_name}-{name}", model=model, batch_size=batch, steps=steps,
                                    precision="bf16", checkpoint_every=3, optimizer=optimizer, **variants[1][1])
            if others[name] == exports[0]:
                fail(f"{model_name}: optimizer {optimizer} exported the same weights as adamw8bit's defaults")
        print(f"{model_name}: adamw, embedding_state fp32 and block_size 64 each give other weights")
        # With every tensor under min_8bit_size, adamw8bit's chunks hold only fp32 pieces ([m | v]
        # per tensor, not adamw's [m | v] per chunk), cut in 4096-element chunks: adamw's bits.
        fp32_pieces, _ = train(folder, f"{model_name}-all-fp32-pieces", model=model, batch_size=batch, steps=steps,
                               precision="bf16", checkpoint_every=3, optimizer={**EIGHT, "min_8bit_size": 1 << 40,
                                                                                "chunk_elements": 4096},
                               **variants[1][1])
        if fp32_pieces != others["adamw"]:
            fail(f"{model_name}: adamw8bit with every tensor under min_8bit_size differs from adamw")
        print(f"{model_name}: adamw8bit with only fp32-moment pieces = adamw, bit for bit")


def case_resume(folder):
    run = {"model": DEMO, "batch_size": 4, "precision": "bf16", "checkpoint_every": 2,
           "device": {"memory": "8MiB"}, "host": {"memory": "8MiB"},
           "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
           "optimizer": {**EIGHT, "chunk_elements": 8192, "block_size": 128, "embedding_state": "fp32"}}
    straight, _ = train(folder, "straight", steps=6, **run)
    run_dir = os.path.join(folder, "stopped")
    os.makedirs(run_dir)
    cfg_path, _ = config(run_dir, steps=6, **run)
    out = os.path.join(run_dir, "weights.safetensors")
    strata("--log-level", "warn", "train", cfg_path, "--steps", "4")
    strata("--log-level", "warn", "train", cfg_path, "--resume", "--export", out)
    with open(out, "rb") as f:
        resumed = f.read()
    if resumed != straight:
        fail("adamw8bit: a run stopped at step 4 and resumed exported other weights than the uninterrupted one")
    store = os.path.join(run_dir, "nvme", "store")
    strata("store", "verify", store)
    listed = strata("store", "export", store, os.path.join(run_dir, "store-export.safetensors"))
    with open(os.path.join(run_dir, "store-export.safetensors"), "rb") as f:
        if f.read() != straight:
            fail(f"`strata store export` of the adamw8bit store differs from --export: {listed.stdout}")
    print(f"stopped at 4 and resumed = uninterrupted, bit for bit; store export = --export ({len(straight)} bytes)")

    # An adamw store resumed as adamw8bit (and an 8-bit one with other rules, or as adamw): one
    # line naming the key, exit 2, the store untouched.
    refusals = [("adamw", "adamw8bit", {"kind": "adamw"}, {**EIGHT}),
                ("adamw8bit", "adamw", {**EIGHT}, {"kind": "adamw"}),
                ("block 256", "block 512", {**EIGHT}, {**EIGHT, "block_size": 512})]
    for first_name, second_name, first, second in refusals:
        run_dir = os.path.join(folder, f"refuse-{first_name}-{second_name}".replace(" ", ""))
        os.makedirs(run_dir)
        cfg_path, _ = config(run_dir, steps=2, optimizer=first)
        strata("--log-level", "warn", "train", cfg_path)
        manifest = os.path.join(run_dir, "nvme", "store", "manifest.json")
        with open(manifest, "rb") as f:
            before = f.read()
        cfg_path, _ = config(run_dir, steps=4, optimizer=second)
        refused = strata("--log-level", "warn", "train", cfg_path, "--resume", expect_ok=False)
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        print(f"{first_name} resumed as {second_name}: exit {refused.returncode}: {lines[-1] if lines else ''}")
        if refused.returncode != 2 or len(lines) != 1 or "optimizer.kind" not in lines[0]:
            fail(f"{first_name} resumed as {second_name}: expected one line naming 'optimizer.kind' and exit 2, got "
                 f"exit {refused.returncode}:\n{refused.stderr}")
        with open(manifest, "rb") as f:
            if f.read() != before:
                fail(f"{first_name} resumed as {second_name}: the refused resume changed the store")


def case_reference(folder):
    try:
        import torch
    except ImportError as error:
        print(f"SKIP: PyTorch is not importable by {sys.executable} ({error}); install python3-torch", file=sys.stderr)
        sys.exit(77)
    torch.manual_seed(3)
    n_layer, n_embd, vocab, seq = 2, 64, 256, 16
    shapes = {"wte.weight": (vocab, n_embd), "wpe.weight": (seq, n_embd),
              "ln_f.weight": (n_embd,), "ln_f.bias": (n_embd,)}
    for i in range(n_layer):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (n_embd,), p + "ln_1.bias": (n_embd,),
                       p + "attn.c_attn.weight": (n_embd, 3 * n_embd), p + "attn.c_attn.bias": (3 * n_embd,),
                       p + "attn.c_proj.weight": (n_embd, n_embd), p + "attn.c_proj.bias": (n_embd,),
                       p + "ln_2.weight": (n_embd,), p + "ln_2.bias": (n_embd,),
                       p + "mlp.c_fc.weight": (n_embd, 4 * n_embd), p + "mlp.c_fc.bias": (4 * n_embd,),
                       p + "mlp.c_proj.weight": (4 * n_embd, n_embd), p + "mlp.c_proj.bias": (n_embd,)})
    init = {}
    for name, shape in shapes.items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            value = 1.0 + 0.1 * torch.randn(shape)
        else:
            value = 0.05 * torch.randn(shape)
        init["transformer." + name] = (shape, value.float().numpy().tobytes())
    init_path = os.path.join(folder, "init.safetensors")
    write_safetensors(init_path, init)
    worst_overall = 0.0
    # Blocks of 64 with the embedding 8-bit; blocks of 256 with it fp32 (StableEmbedding's advice).
    for block, embedding_state in ((64, "8bit"), (256, "fp32")):
        run_dir = os.path.join(folder, f"block{block}-{embedding_state}")
        os.makedirs(run_dir)
        # eps 1e-6 as test_train.py's reference case (the key bias's gradient is rounding noise).
        cfg_path, cfg = config(run_dir, model={"init": init_path}, steps=3, device={"memory": "64MiB"},
                               host={"memory": "64MiB"},
                               optimizer={"eps": 1.0e-6, "kind": "adamw8bit", "block_size": block,
                                          "embedding_state": embedding_state, "chunk_elements": 4096},
                               placement={"params": "nvme", "grads": "nvme", "optimizer": "nvme"})
        final = os.path.join(run_dir, "final.safetensors")
        strata("train", cfg_path, "--export", final)
        o = cfg["optimizer"]
        reference_dir = os.path.join(run_dir, "reference")
        ref = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "train_reference.py"), init_path, CORPUS,
                              reference_dir, "4", str(cfg["batch_size"]), str(seq), str(cfg["steps"]), str(o["lr"]),
                              str(o["betas"][0]), str(o["betas"][1]), str(o["eps"]), str(o["weight_decay"]),
                              str(o["grad_clip"]), "adamw8bit", str(block), "4096", embedding_state],
                             capture_output=True, text=True, timeout=600)
        if ref.returncode != 0:
            fail("reference failed:\n" + ref.stderr)
        ours, _ = read_safetensors(final)
        worst, flipped, total = 0.0, 0, 0
        for name in shapes:
            a = torch.frombuffer(bytearray(ours[name]), dtype=torch.float32).double()
            with open(os.path.join(reference_dir, name + ".f32"), "rb") as f:
                b = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).double()
            diff = (a - b).abs()
            worst = max(worst, diff.max().item())
            # The forward and backward round differently from torch's (~1e-7 relative in the
            # gradients), and a moment that sits within that of a code midpoint is stored as
            # the neighbouring code on one side: that element's next updates then differ by up
            # to a code step. Measured: 1-5 such elements per tensor of 4-16 Ki, all others
            # within 1e-5 (weights ~0.05, lr 1e-3). A layout or semantics error moves thousands
            # (a reference that kept the 8-bit tensors' gradients between steps moved 10951 of
            # wte's 16384 past 1e-5), so the test holds both: at most 0.1 % of a tensor past
            # 1e-5, and none past 2 lr (a flipped code shifts an element by a fraction of a step).
            far = int((diff > 1e-5).sum())
            flipped += far
            total += a.numel()
            if far > max(1, a.numel() // 1000) or diff.max().item() > 2 * o["lr"]:
                index = int(diff.argmax())
                fail(f"block {block}, embedding {embedding_state}: weight {name}: {far} of {a.numel()} elements "
                     f"differ by more than 1e-5, the largest by {diff.max().item():.2e} at element {index}: "
                     f"{a[index].item():.9g} vs {b[index].item():.9g}")
        print(f"block {block}, embedding {embedding_state}: after 3 steps {total - flipped} of {total} weights "
              f"within 1e-5 of the torch reimplementation, {flipped} further (largest difference {worst:.2e})")
        worst_overall = max(worst_overall, worst)
    print(f"largest difference {worst_overall:.2e}")


def case_bad_input(folder):
    cases = [
        ("unknown kind", {"kind": "adamw4bit"}, "optimizer.kind"),
        ("block size not a power of two", {"kind": "adamw8bit", "block_size": 100}, "block_size"),
        ("block size too large", {"kind": "adamw8bit", "block_size": 8192}, "block_size"),
        ("block size too small", {"kind": "adamw8bit", "block_size": 32}, "block_size"),
        ("block size without adamw8bit", {"block_size": 256}, "block_size"),
        ("embedding_state without adamw8bit", {"embedding_state": "fp32"}, "embedding_state"),
        ("unknown embedding_state", {"kind": "adamw8bit", "embedding_state": "int4"}, "embedding_state"),
        ("negative min_8bit_size", {"kind": "adamw8bit", "min_8bit_size": -1}, "min_8bit_size"),
        ("chunk smaller than a block", {"kind": "adamw8bit", "block_size": 4096, "chunk_elements": 2048},
         "chunk_elements"),
    ]
    for what, optimizer, needle in cases:
        run_dir = os.path.join(folder, what.replace(" ", "-"))
        os.makedirs(run_dir)
        cfg_path, _ = config(run_dir, optimizer=optimizer)
        result = strata("train", cfg_path, expect_ok=False)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        print(f"{what}: exit {result.returncode}: {lines[-1] if lines else ''}")
        if result.returncode != 2 or len(lines) != 1 or needle not in lines[0]:
            fail(f"{what}: expected exit 2 and one line naming '{needle}', got exit {result.returncode}:\n"
                 f"{result.stderr}")
        if os.listdir(os.path.join(run_dir, "nvme")):
            fail(f"{what}: the refused run left files in the NVMe path")


CASES = {"offload": case_offload, "resume": case_resume, "reference": case_reference, "bad_input": case_bad_input}

if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix=f"strata-adamw8bit-{CASE}-") as tmp:
        CASES[CASE](tmp)
