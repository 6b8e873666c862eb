#!/usr/bin/python3
# bench/generate.py — `strata generate` on a model larger than its budgets against the bound
# set by reading its weights once per token at the drive's read bandwidth (issue 14's target:
# tokens/s ≥ 0.9× that bound).
#
# The model: a GPT-2 (or, --arch llama, a Llama: GQA, SwiGLU, untied head) of the given shape
# with random weights, written as a Hugging Face folder (fp32), staged once by `strata generate
# --model` into a store of --precision. The reference, in the same
# run and alternated with it: `strata io-bench` reading a file of the staged weights' size with
# the engine, block size and queue depth `strata tune` chose (its MB/s is the bandwidth in the
# bound), and each generate run is given that tuned io: file so its own floor uses it too.
# Reports the median tokens/s, the median bound (read MB/s × 1e6 / weight bytes) and the ratio;
# and, alternated too, the same generation resident (a host budget holding every weight: the
# compute-only rate), which says whether the kernels or the drive set the pace.
#
# Usage: bench/generate.py [--strata build/strata] [--dir DIR] [--arch gpt2|llama] [--layers 12]
#        [--embd 768] [--vocab 50257] [--kv-heads 4] [--intermediate 2048] [--budget 128MiB]
#        [--precision fp32] [--tokens 24] [--repeats 3] [--verify-reads always|once]
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--strata", default="build/strata")
parser.add_argument("--dir", default=os.path.join("strata-data", "bench-generate"))
parser.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"])
parser.add_argument("--layers", type=int, default=12)
parser.add_argument("--embd", type=int, default=768)
parser.add_argument("--vocab", type=int, default=50257)
parser.add_argument("--positions", type=int, default=256)
parser.add_argument("--kv-heads", type=int, default=4, help="llama: k/v heads (query heads: embd / 64)")
parser.add_argument("--intermediate", type=int, default=2048, help="llama: the SwiGLU width")
parser.add_argument("--budget", default="128MiB", help="host and device budget each")
parser.add_argument("--precision", default="fp32",
                    help="the staged compute copy; bf16 halves the bytes but needs an fp32 copy of the largest "
                         "unit (GPT-2's embedding) as scratch")
parser.add_argument("--tokens", type=int, default=24)
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--verify-reads", default="always", choices=["always", "once"],
                    help="the store's read checksums (memory/store.h): every read, or until seen intact")
args = parser.parse_args()
strata = os.path.abspath(args.strata)
os.makedirs(args.dir, exist_ok=True)


def run(*cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stderr}")
    return result


def llama_shapes():
    c, heads = args.embd, args.embd // 64
    qw, kvw, inter = heads * 64, args.kv_heads * 64, args.intermediate
    shapes = {"model.embed_tokens.weight": (args.vocab, c)}
    for i in range(args.layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (c,), p + "self_attn.q_proj.weight": (qw, c),
                       p + "self_attn.k_proj.weight": (kvw, c), p + "self_attn.v_proj.weight": (kvw, c),
                       p + "self_attn.o_proj.weight": (c, qw), p + "post_attention_layernorm.weight": (c,),
                       p + "mlp.gate_proj.weight": (inter, c), p + "mlp.up_proj.weight": (inter, c),
                       p + "mlp.down_proj.weight": (c, inter)})
    shapes.update({"model.norm.weight": (c,), "lm_head.weight": (args.vocab, c)})
    config = {"model_type": "llama", "hidden_size": c, "intermediate_size": inter, "num_hidden_layers": args.layers,
              "num_attention_heads": heads, "num_key_value_heads": args.kv_heads, "head_dim": 64,
              "vocab_size": args.vocab, "max_position_embeddings": args.positions, "rope_theta": 500000.0,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    return shapes, config


def write_model(folder):
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    os.makedirs(folder, exist_ok=True)
    c, rng = args.embd, np.random.default_rng(1)
    if args.arch == "llama":
        shapes, config = llama_shapes()
        write_weights(folder, shapes, rng, lambda name: name.endswith("norm.weight"))
        json.dump(config, open(os.path.join(folder, "config.json"), "w"))
        return
    shapes = {"wte.weight": (args.vocab, c), "wpe.weight": (args.positions, c)}
    for i in range(args.layers):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (c,), p + "ln_1.bias": (c,), p + "attn.c_attn.weight": (c, 3 * c),
                       p + "attn.c_attn.bias": (3 * c,), p + "attn.c_proj.weight": (c, c), p + "attn.c_proj.bias": (c,),
                       p + "ln_2.weight": (c,), p + "ln_2.bias": (c,), p + "mlp.c_fc.weight": (c, 4 * c),
                       p + "mlp.c_fc.bias": (4 * c,), p + "mlp.c_proj.weight": (4 * c, c), p + "mlp.c_proj.bias": (c,)})
    shapes.update({"ln_f.weight": (c,), "ln_f.bias": (c,)})
    write_weights(folder, shapes, rng,
                  lambda name: name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight")
    json.dump({"model_type": "gpt2", "n_layer": args.layers, "n_head": 12 if c % 12 == 0 else 8, "n_embd": c,
               "vocab_size": args.vocab, "n_positions": args.positions, "layer_norm_epsilon": 1e-5},
              open(os.path.join(folder, "config.json"), "w"))


def write_weights(folder, shapes, rng, is_ones):
    """model.safetensors in fp32: `is_ones(name)` tensors (norm gains) 1, the rest N(0, 0.02)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes.items():
            value = (np.ones(shape, np.float32) if is_ones(name)
                     else (0.02 * rng.standard_normal(shape)).astype(np.float32))
            f.write(value.tobytes())


model = os.path.join(args.dir, "model" if args.arch == "gpt2" else "model-llama")
nvme = os.path.join(args.dir, ("nvme-" if args.arch == "gpt2" else "nvme-llama-") + args.precision)
write_model(model)
tuned = os.path.join(args.dir, "tuned.yaml")
if not os.path.exists(tuned):
    run(strata, "tune", "--dir", args.dir, "--size", "1GiB", "--out", tuned)
generate = [strata, "--log-level", "warn", "generate", "--model", model, "--nvme", nvme, "--io-file", tuned,
            "--host-memory", args.budget, "--device-memory", args.budget, "--precision", args.precision,
            "--prompt", "The ",
            "--tokens", str(args.tokens), "--verify-reads", args.verify_reads, "--json"]
# The store is staged afresh every run, as the reference's file is written afresh below: on a
# host-cached virtual disk a file written minutes ago reads faster than one written an hour ago,
# so both sides must be equally fresh (bench/RESULTS.md, "huge pages for the store's buffers").
shutil.rmtree(nvme, ignore_errors=True)
first = json.loads(run(*generate).stdout)  # stages the weights (and warms nothing: reads are direct)
weight_bytes = first["weight_bytes"]
io_settings = open(tuned).read()


def tuned_value(key):
    """The read direction's `key` in the io: YAML `strata tune` wrote."""
    section = None
    for line in io_settings.splitlines():
        if line.startswith("  ") and not line.startswith("    "):
            section = line.strip().rstrip(":")
        elif section == "read" and line.strip().startswith(key + ":"):
            return line.split(":", 1)[1].strip().strip("'\"")
    return None


# The reference: the tuned read settings over a file as big as the staged weights.
scratch = os.path.join(args.dir, "read.data")
size = f"{(weight_bytes + (1 << 20) - 1) >> 20}MiB"
io_bench = [strata, "io-bench", "--file", scratch, "--size", size, "--rw", "read", "--json"]
for key, flag in (("engine", "--engine"), ("block_size", "--block-size"), ("queue_depth", "--queue-depth"),
                  ("threads", "--threads")):
    value = tuned_value(key)
    if value:
        io_bench += [flag, value]
run(strata, "io-bench", "--file", scratch, "--size", size, "--rw", "write")

# The compute-only side: the same generation with a host budget that holds every weight, so
# after the prompt's pass nothing is read — what the kernels alone allow on this machine.
resident = list(generate)
resident[resident.index("--host-memory") + 1] = f"{(weight_bytes >> 20) + 512}MiB"

tokens_per_s, bounds, floors, reads, compute_only = [], [], [], [], []
for repeat in range(args.repeats):
    compute_only.append(json.loads(run(*resident).stdout)["tokens_per_s"])
    ref = json.loads(run(*io_bench).stdout)
    read_MBps = ref.get("MBps") or ref.get("mb_per_s") or ref.get("bandwidth_MBps")
    if read_MBps is None:
        sys.exit(f"io-bench --json: no bandwidth field in {ref}")
    out = json.loads(run(*generate).stdout)
    tokens_per_s.append(out["tokens_per_s"])
    bounds.append(read_MBps * 1e6 / weight_bytes)
    floors.append(out["io_floor_tokens_per_s"])
    reads.append(out["nvme_read_bytes"] / max(1, args.tokens) / weight_bytes)
    print(f"run {repeat + 1}: {out['tokens_per_s']:.2f} tokens/s; bound {bounds[-1]:.2f} (io-bench {read_MBps:.0f} "
          f"MB/s); generate's own floor {out['io_floor_tokens_per_s']:.2f}; weights read per token "
          f"{reads[-1]:.2f}×; peak RSS {out['peak_rss_bytes'] >> 20} MiB; resident (compute only) "
          f"{compute_only[-1]:.2f} tokens/s", flush=True)

median_tps, median_bound = statistics.median(tokens_per_s), statistics.median(bounds)
print(json.dumps({"weight_bytes": weight_bytes, "budget_each": args.budget, "tokens": args.tokens,
                  "verify_reads": args.verify_reads,
                  "median_tokens_per_s": median_tps, "median_bound_tokens_per_s": median_bound,
                  "ratio": median_tps / median_bound, "median_weights_read_per_token": statistics.median(reads),
                  "median_compute_only_tokens_per_s": statistics.median(compute_only),
                  "ratio_to_compute_only": median_tps / statistics.median(compute_only)}))
