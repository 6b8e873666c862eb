#!/usr/bin/python3
# tests/engine/test_hf_folders.py — Hugging Face folders through the real `strata` binary (issue 14).
#
#   roundtrip  a sharded bf16 GPT-2 folder (with the `transformer.` prefix, more positions than
#              the window) → `model: {init: DIR, seq_len: 16}` → train 0 steps → --export DIR2: every
#              tensor is the widened bf16 bit for bit; DIR2 → train → `store export` as one
#              file and as a folder sharded at 64 KiB: bit-identical to DIR2. Every file is read
#              here with json + numpy (no safetensors package), as Debian's python reads it.
#   refusals   a YAML key that disagrees with config.json, a weight_map escaping the folder, a
#              config.json strata cannot compute, a truncated shard, an export onto an existing
#              folder: exit 2 and one line naming the file and the key; nothing written.
#   generate   `strata generate --model DIR` (staged into a store, streamed through the
#              scheduler, KV cache): its greedy tokens equal a float64 PyTorch GPT-2's greedy
#              tokens from full-sequence forwards, across a window refill (fp32, and bf16 with
#              the embedding widened in pieces); a model 2.5× larger
#              than its budgets streams from NVMe every token and its peak RSS stays within
#              the budgets (plus the process's own baseline, measured on a tiny model).
# Usage: test_hf_folders.py STRATA CASE. Exit 77 where numpy or torch is missing.
import json
import os
import struct
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from safetensors_file import read_entries  # noqa: E402

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not importable", file=sys.stderr)
    sys.exit(77)

STRATA = os.path.abspath(sys.argv[1])
CASE = sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = "/usr/share/common-licenses/GPL-3"


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def strata(*args, expect=0):
    result = subprocess.run([STRATA, *args], capture_output=True, text=True, timeout=600)
    if expect is not None and result.returncode != expect:
        fail(f"strata {' '.join(args)} exited {result.returncode} (want {expect}):\n{result.stderr}")
    return result


def gpt2_shapes(n_layer, n_embd, vocab, positions):
    c = n_embd
    shapes = {"wte.weight": (vocab, c), "wpe.weight": (positions, c)}
    for i in range(n_layer):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (c,), p + "ln_1.bias": (c,), p + "attn.c_attn.weight": (c, 3 * c),
                       p + "attn.c_attn.bias": (3 * c,), p + "attn.c_proj.weight": (c, c), p + "attn.c_proj.bias": (c,),
                       p + "ln_2.weight": (c,), p + "ln_2.bias": (c,), p + "mlp.c_fc.weight": (c, 4 * c),
                       p + "mlp.c_fc.bias": (4 * c,), p + "mlp.c_proj.weight": (4 * c, c), p + "mlp.c_proj.bias": (c,)})
    shapes.update({"ln_f.weight": (c,), "ln_f.bias": (c,)})
    return shapes


def random_gpt2(n_layer, n_embd, vocab, positions, seed, std=0.02):
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in gpt2_shapes(n_layer, n_embd, vocab, positions).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return out


def to_bf16_bits(values):
    return (values.view(np.uint32) >> 16).astype(np.uint16)


def widen_bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """tensors: name → numpy array (float32 → F32, uint16 → BF16 bits)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": "F32" if array.dtype == np.float32 else "BF16", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    """name → float32 array, parsed with json + numpy only."""
    out = {}
    for name, (entry, raw) in read_entries(path)[0].items():
        dtype = {"F32": np.float32, "BF16": np.uint16}[entry["dtype"]]
        array = np.frombuffer(raw, dtype=dtype).reshape(entry["shape"])
        out[name] = widen_bf16(array) if dtype == np.uint16 else array.copy()
    return out


def read_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    weight_map = json.load(open(index))["weight_map"]
    out = {}
    for file in sorted(set(weight_map.values())):
        out.update(read_safetensors(os.path.join(folder, file)))
    if set(out) != set(weight_map):
        fail(f"{folder}: the index and the shards disagree")
    return out


def gpt2_config(n_layer, n_head, n_embd, vocab, positions):
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": n_layer, "n_head": n_head,
            "n_embd": n_embd, "vocab_size": vocab, "n_positions": positions, "n_ctx": positions,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "torch_dtype": "float32"}


def write_folder(folder, config, tensors, shards=1, prefix=""):
    os.makedirs(folder)
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    names = list(tensors)
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), {prefix + n: tensors[n] for n in names})
        return
    weight_map = {}
    per = (len(names) + shards - 1) // shards
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k * per:(k + 1) * per]
        write_safetensors(os.path.join(folder, file), {prefix + n: tensors[n] for n in part})
        weight_map.update({prefix + n: file for n in part})
    json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map},
              open(os.path.join(folder, "model.safetensors.index.json"), "w"))


def train_config(folder, name, model, nvme_name):
    nvme = os.path.join(folder, nvme_name)
    os.makedirs(nvme, exist_ok=True)
    cfg = {"model": model, "data": {"path": CORPUS, "format": "text-bytes"}, "batch_size": 2, "steps": 0,
           "precision": "fp32", "device": {"kind": "cpu", "memory": "64MiB"}, "host": {"memory": "64MiB"},
           "nvme": {"paths": [nvme]}}
    path = os.path.join(folder, name)
    json.dump(cfg, open(path, "w"))
    return path, os.path.join(nvme, "store")


def expect_equal(got, want, what):
    if set(got) != set(want):
        fail(f"{what}: tensors {sorted(set(got) ^ set(want))} differ in presence")
    for name in want:
        if got[name].shape != want[name].shape or got[name].tobytes() != want[name].tobytes():
            fail(f"{what}: tensor {name} differs (shape {got[name].shape} vs {want[name].shape})")


def case_roundtrip(folder):
    n_layer, n_head, n_embd, vocab, positions = 2, 4, 64, 256, 32
    fp32 = random_gpt2(n_layer, n_embd, vocab, positions, seed=1)
    bits = {name: to_bf16_bits(value) for name, value in fp32.items()}
    source = os.path.join(folder, "hf-bf16")
    write_folder(source, gpt2_config(n_layer, n_head, n_embd, vocab, positions), bits, shards=3, prefix="transformer.")
    cfg, _ = train_config(folder, "a.yaml", {"init": source, "seq_len": 16}, "nvme-a")
    exported = os.path.join(folder, "exported")
    strata("--log-level", "warn", "train", cfg, "--steps", "0", "--export", exported)
    want = {name: widen_bf16(value) for name, value in bits.items()}
    want["wpe.weight"] = want["wpe.weight"][:16]  # the window's positions
    expect_equal(read_folder(exported), want, "bf16 folder → store → export")
    config = json.load(open(os.path.join(exported, "config.json")))
    for key, value in {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256,
                       "n_positions": 16, "torch_dtype": "float32"}.items():
        if config.get(key) != value:
            fail(f"exported config.json: {key} is {config.get(key)!r}, want {value!r}")
    if os.path.exists(exported + ".tmp"):
        fail("the export left its temporary folder behind")

    # The exported folder in again (fp32, no prefix), out as one file and as a sharded folder.
    cfg2, store2 = train_config(folder, "b.yaml", {"init": exported}, "nvme-b")
    strata("--log-level", "warn", "train", cfg2, "--steps", "0")
    one = os.path.join(folder, "again.safetensors")
    strata("--log-level", "warn", "store", "export", store2, one)
    expect_equal(read_safetensors(one), want, "folder → store → .safetensors")
    sharded = os.path.join(folder, "sharded")
    strata("--log-level", "warn", "store", "export", store2, sharded, "--shard-size", "64KiB")
    index = json.load(open(os.path.join(sharded, "model.safetensors.index.json")))
    files = sorted(set(index["weight_map"].values()))
    if len(files) < 3 or files[0] != f"model-00001-of-{len(files):05d}.safetensors":
        fail(f"sharded export: files {files}")
    for file in files:
        if os.path.getsize(os.path.join(sharded, file)) > 64 * 1024 + 4096 and len(read_safetensors(os.path.join(sharded, file))) > 1:
            fail(f"sharded export: {file} holds several tensors beyond the 64 KiB limit")
    expect_equal(read_folder(sharded), want, "folder → store → sharded folder")
    print("roundtrip: bit-identical through bf16 shards, one file and 64 KiB shards")


def one_line_exit_2(result, *words):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode != 2 or len(lines) != 1:
        fail(f"want exit 2 and one line, got {result.returncode}:\n{result.stderr}")
    for word in words:
        if word not in lines[0]:
            fail(f"the error line does not name {word!r}: {lines[0]}")


def case_refusals(folder):
    n_layer, n_head, n_embd, vocab, positions = 1, 2, 16, 256, 8
    tensors = random_gpt2(n_layer, n_embd, vocab, positions, seed=2)
    good = os.path.join(folder, "good")
    write_folder(good, gpt2_config(n_layer, n_head, n_embd, vocab, positions), tensors)
    cfg, _ = train_config(folder, "disagree.yaml", {"init": good, "n_layer": 3}, "nvme-1")
    one_line_exit_2(strata("train", cfg, expect=None), "n_layer", "config.json", "3", "1")
    cfg, _ = train_config(folder, "long.yaml", {"init": good, "seq_len": 9}, "nvme-1")
    one_line_exit_2(strata("train", cfg, expect=None), "seq_len", "config.json")

    escape = os.path.join(folder, "escape")
    write_folder(escape, gpt2_config(n_layer, n_head, n_embd, vocab, positions), tensors, shards=2)
    index_path = os.path.join(escape, "model.safetensors.index.json")
    index = json.load(open(index_path))
    index["weight_map"]["wte.weight"] = "../good/model.safetensors"
    json.dump(index, open(index_path, "w"))
    cfg, _ = train_config(folder, "escape.yaml", {"init": escape}, "nvme-2")
    one_line_exit_2(strata("train", cfg, expect=None), "model.safetensors.index.json", "weight_map.wte.weight")

    biased = os.path.join(folder, "biased")
    os.makedirs(biased)
    json.dump({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
               "intermediate_size": 40, "vocab_size": 256, "mlp_bias": True},
              open(os.path.join(biased, "config.json"), "w"))
    cfg, _ = train_config(folder, "biased.yaml", {"init": biased}, "nvme-3")
    one_line_exit_2(strata("train", cfg, expect=None), "config.json", "mlp_bias")

    truncated = os.path.join(folder, "truncated")
    write_folder(truncated, gpt2_config(n_layer, n_head, n_embd, vocab, positions), tensors)
    shard = os.path.join(truncated, "model.safetensors")
    os.truncate(shard, os.path.getsize(shard) - 100)
    cfg, nvme_store = train_config(folder, "truncated.yaml", {"init": truncated}, "nvme-4")
    one_line_exit_2(strata("train", cfg, expect=None), "model.safetensors")
    if os.path.exists(nvme_store):
        fail("a refused init folder still created a store")

    cfg, store = train_config(folder, "ok.yaml", {"init": good}, "nvme-5")
    strata("--log-level", "warn", "train", cfg, "--steps", "0")
    existing = os.path.join(folder, "existing")
    os.makedirs(existing)
    open(os.path.join(existing, "keep"), "w").write("mine")
    one_line_exit_2(strata("store", "export", store, existing, expect=None), "already exists")
    if os.listdir(existing) != ["keep"] or open(os.path.join(existing, "keep")).read() != "mine":
        fail("a refused export touched the existing folder")
    print("refusals: each one line, exit 2, naming file and key")


def torch_greedy(tensors, n_head, prompt, count, n_ctx):
    sys.path.insert(0, os.path.join(HERE, "..", "gpt2"))
    import gpt2_reference as ref  # exits 77 without torch
    import torch
    p = {name: torch.from_numpy(value.astype(np.float64)) for name, value in tensors.items()}
    n_layer = sum(1 for name in tensors if name.endswith("ln_1.weight"))
    c = tensors["wte.weight"].shape[1]
    context, start, out = list(prompt), 0, []
    for _ in range(count):
        window = torch.tensor(context[start:])
        x = (p["wte.weight"][window] + p["wpe.weight"][:len(window)]).unsqueeze(0)
        for i in range(n_layer):
            x = ref.block(p, i, x, n_head)
        x = torch.nn.functional.layer_norm(x, (c,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
        logits = x[0, -1] @ p["wte.weight"].T
        top2 = torch.topk(logits, 2).values
        nxt = int(torch.argmax(logits))
        out.append((nxt, float(top2[0] - top2[1])))
        context.append(nxt)
        if len(context) - start > n_ctx:
            start = len(context) - n_ctx // 2
    return out


def generate(folder, model, nvme, budget, extra=()):
    result = strata("--log-level", "warn", "generate", "--model", model, "--nvme", nvme, "--host-memory", budget,
                    "--device-memory", budget, "--precision", "fp32", "--temperature", "0", "--json", *extra)
    return json.loads(result.stdout)


def case_generate(folder):
    n_layer, n_head, n_embd, vocab, positions = 3, 4, 64, 256, 32
    tensors = random_gpt2(n_layer, n_embd, vocab, positions, seed=3, std=0.3)
    model = os.path.join(folder, "small")
    write_folder(model, gpt2_config(n_layer, n_head, n_embd, vocab, positions), tensors)
    prompt, count = [1, 2, 3, 4, 5], 40  # 45 positions: one refill of the 32-position window
    got = generate(folder, model, os.path.join(folder, "nvme-small"), "1MiB",
                   ["--prompt-ids", ",".join(map(str, prompt)), "--tokens", str(count)])
    want = torch_greedy(tensors, n_head, prompt, count, positions)
    for k, (token, margin) in enumerate(want):
        if got["tokens"][k] != token:
            if margin < 1e-4:  # a near-tie that fp32 may break either way: nothing after it compares
                print(f"generate: stopped comparing at token {k} (a tie within {margin:.1e})")
                break
            fail(f"greedy token {k}: strata {got['tokens'][k]}, torch {token} (margin {margin:.2e})\n{got['tokens']}\n"
                 f"{[t for t, _ in want]}")
    baseline_rss = got["peak_rss_bytes"]

    # bf16 weights (a bf16 folder, staged as bf16): the embedding is widened in pieces — the
    # prompt's rows for the embedding, 4096 vocabulary rows at a time for the head (vocab 5000:
    # two pieces) — and the greedy tokens still equal torch's on the same (widened) weights.
    vocab16 = 5000
    fp32 = random_gpt2(2, n_embd, vocab16, positions, seed=5, std=0.3)
    bits = {name: to_bf16_bits(value) for name, value in fp32.items()}
    model16 = os.path.join(folder, "small-bf16")
    write_folder(model16, gpt2_config(2, n_head, n_embd, vocab16, positions), bits)
    result = strata("--log-level", "warn", "generate", "--model", model16, "--nvme", os.path.join(folder, "nvme-bf16"),
                    "--host-memory", "2MiB", "--device-memory", "2MiB", "--precision", "bf16", "--temperature", "0",
                    "--json", "--prompt-ids", "7,4999,12", "--tokens", "36")
    got16 = json.loads(result.stdout)
    want16 = torch_greedy({name: widen_bf16(value) for name, value in bits.items()}, n_head, [7, 4999, 12], 36, positions)
    for k, (token, margin) in enumerate(want16):
        if got16["tokens"][k] != token:
            if margin < 1e-4:
                print(f"generate bf16: stopped comparing at token {k} (a tie within {margin:.1e})")
                break
            fail(f"bf16 greedy token {k}: strata {got16['tokens'][k]}, torch {token} (margin {margin:.2e})")

    # A model 2.5 times its budgets: every pass reads most of the weights from NVMe.
    n_layer, n_embd = 8, 256
    big = os.path.join(folder, "big")
    write_folder(big, gpt2_config(n_layer, 4, n_embd, vocab, positions),
                 random_gpt2(n_layer, n_embd, vocab, positions, seed=4))
    budget = 4 << 20
    out = generate(folder, big, os.path.join(folder, "nvme-big"), "4MiB", ["--prompt", "The ", "--tokens", "12"])
    weights = out["weight_bytes"]
    if weights < 2.5 * 2 * budget:
        fail(f"the big model ({weights} bytes) is not 2.5× its budgets")
    passes = 12  # the prompt's, and 11 tokens'; the pool keeps about a third of the weights between passes
    if out["nvme_read_bytes"] < 0.5 * passes * weights:
        fail(f"read {out['nvme_read_bytes']} bytes from NVMe for {passes} passes over {weights} bytes of weights")
    if out["host_high_water_bytes"] > out["pool_bytes"]:
        fail(f"the scheduler's pool peaked at {out['host_high_water_bytes']} over its {out['pool_bytes']}")
    over = out["peak_rss_bytes"] - baseline_rss
    if over > 2 * budget + (4 << 20):
        fail(f"peak RSS {out['peak_rss_bytes']} is {over} bytes above the tiny model's {baseline_rss}; the budgets "
             f"are {2 * budget} (the weights are {weights})")
    for key in ("tokens_per_s", "io_floor_tokens_per_s", "read_MBps"):
        if not out[key] > 0:
            fail(f"generate --json: {key} is {out[key]}")
    # Every read verified by default; with --verify-reads once a weight is hashed on its first read
    # after open and trusted after (memory/store.h) — the same tokens come out.
    if out["nvme_read_trusted_bytes"] != 0:
        fail(f"the default trusted {out['nvme_read_trusted_bytes']} bytes of reads")
    once = generate(folder, big, os.path.join(folder, "nvme-big"), "4MiB",
                    ["--prompt", "The ", "--tokens", "12", "--verify-reads", "once"])
    if once["tokens"] != out["tokens"]:
        fail(f"--verify-reads once changed the tokens: {once['tokens']} vs {out['tokens']}")
    if not once["nvme_read_bytes"] - weights <= once["nvme_read_trusted_bytes"] < once["nvme_read_bytes"]:
        fail(f"--verify-reads once trusted {once['nvme_read_trusted_bytes']} of {once['nvme_read_bytes']} bytes read "
             f"(weights {weights}: all but the first read of each should be)")
    print(f"generate: greedy tokens match torch; big model {weights >> 20} MiB in {2 * budget >> 20} MiB of budgets, "
          f"peak RSS {out['peak_rss_bytes'] >> 20} MiB (tiny model {baseline_rss >> 20} MiB), "
          f"{out['tokens_per_s']:.1f} tokens/s, floor {out['io_floor_tokens_per_s']:.1f}")


if __name__ == "__main__":
    base = os.environ.get("STRATA_TEST_TMPDIR", tempfile.gettempdir())
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as work:
        {"roundtrip": case_roundtrip, "refusals": case_refusals, "generate": case_generate}[CASE](work)
