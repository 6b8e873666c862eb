#!/usr/bin/python3
# bench/seam_ab.py — the same-speed check of a restructuring (issue 29): two builds of strata, the
# one before and the one after, run the same three measurements alternately in one run (before,
# after, after, before, ...) so that the machine's drift falls on both alike:
#   - training tokens/s: bench/train_offload.py's resident and offloaded configs (a 4-layer,
#     384-wide GPT-2; one repeat of that script per side per round);
#   - GPT-2 XL compute-only step time: `strata plan --json configs/gpt2-xl-offload.yaml`'s
#     compute_s (every kernel timed alone at XL's shape: 48 blocks forward and backward, the head,
#     the update);
#   - `strata bench adam --json`'s AdamW params/s.
# Prints each sample, the medians, and after ÷ before for each (target: within 3 %, i.e.
# tokens/s and params/s ratios ≥ 0.97 and the compute-time ratio ≤ 1.03).
#
# Usage: bench/seam_ab.py --before OLD/build/strata --after build/strata [--rounds 3] [--json]
#        [--only tokens|xl|adam ...] [--steps N]
# --only picks measurements (default: all three); --steps is train_offload.py's per run (default 4:
# a second of steps, which this box's run-to-run swing drowns; 40 gives ten seconds per run).
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--before", required=True, help="the strata binary before the change")
parser.add_argument("--after", required=True, help="the strata binary after it")
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--adam-params", type=int, default=50_000_000)
parser.add_argument("--json", action="store_true", help="also print one JSON object at the end")
parser.add_argument("--only", nargs="+", choices=["tokens", "xl", "adam"], default=["tokens", "xl", "adam"])
parser.add_argument("--steps", type=int, default=4, help="train_offload.py's steps per run")
args = parser.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
xl_config = os.path.join(root, "configs", "gpt2-xl-offload.yaml")
os.makedirs(os.path.join(root, "strata-data", "gpt2-xl"), exist_ok=True)  # its nvme.paths


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root).stdout


def train_tokens_per_s(binary):
    out = run([sys.executable, os.path.join(here, "train_offload.py"), "--strata", binary, "--repeats", "1",
               "--steps", str(args.steps)])
    found = re.search(r"median tokens/s: resident (\d+), offloaded (\d+)", out)
    if found is None:
        raise SystemExit(f"train_offload.py printed no medians:\n{out}")
    return float(found.group(1)), float(found.group(2))


def xl_compute_s(binary):
    plan = json.loads(run([binary, "--log-level", "warn", "plan", "--json", xl_config]))
    return plan["compute_s"], plan["fwd_block_s"], plan["bwd_block_s"], plan["head_s"]


def adam_params_per_s(binary):
    out = json.loads(run([binary, "--log-level", "warn", "bench", "adam", "--params", str(args.adam_params),
                          "--repeats", "5", "--json"]))
    return out["adamw"]["params_per_s"]


measured = {"tokens": ("resident", "offloaded"), "xl": ("xl_compute_s",), "adam": ("adam",)}
keys = [key for name in args.only for key in measured[name]]
samples = {side: {key: [] for key in keys} for side in ("before", "after")}
for round_index in range(args.rounds):
    order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
    for side in order:
        binary = getattr(args, side)
        s = samples[side]
        line = []
        if "tokens" in args.only:
            resident, offloaded = train_tokens_per_s(binary)
            s["resident"].append(resident)
            s["offloaded"].append(offloaded)
            line.append(f"train resident {resident:7.0f} tok/s, offloaded {offloaded:7.0f} tok/s")
        if "xl" in args.only:
            compute, fwd, bwd, head = xl_compute_s(binary)
            s["xl_compute_s"].append(compute)
            line.append(f"XL compute-only {compute:6.1f} s (block fwd {fwd:.3f} s, bwd {bwd:.3f} s, head {head:.2f} s)")
        if "adam" in args.only:
            adam = adam_params_per_s(binary)
            s["adam"].append(adam)
            line.append(f"AdamW {adam / 1e9:.3f} G params/s")
        print(f"round {round_index + 1} {side:6}: " + "; ".join(line), flush=True)

medians = {side: {k: statistics.median(v) for k, v in s.items()} for side, s in samples.items()}
ratios = {k: medians["after"][k] / medians["before"][k] for k in medians["before"]}
targets = {"resident": "tok/s, ≥ 0.97", "offloaded": "tok/s, ≥ 0.97", "xl_compute_s": "time, ≤ 1.03",
           "adam": "params/s, ≥ 0.97"}
print(f"medians before: {medians['before']}")
print(f"medians after:  {medians['after']}")
print("after / before: " + "; ".join(f"{k} {ratios[k]:.3f} ({targets[k]})" for k in keys))
if args.json:
    print(json.dumps({"samples": samples, "medians": medians, "ratios": ratios}))
