#!/usr/bin/python3
# bench/plan_vs_measured.py — what `strata plan` predicts for a step (NVMe bytes, step time)
# against what `strata train` then measures, on configs where the policy's details decide the
# traffic: (a) tight budgets, GPT-2 12 × 768 (1.5 GB of state) with 256 MiB device and 192 MiB
# host, everything homed on NVMe; (b) a small in-place config (4 × 384 under 64/48 MiB, the
# offloaded side of bench/train_offload.py). Measured bytes per step are the run's totals over
# its steps (the first step reads cold, the last flushes: both close to a steady step when the
# pool is small); the measured step is the run's median step. `--old BINARY` also asks an
# older build's planner, for a before/after of the prediction (same run, same machine).
#
# Usage: bench/plan_vs_measured.py [--strata build/strata] [--old /tmp/strata-old] [--steps 4]
#        [--only tight|inplace]
import argparse
import json
import os
import shutil
import subprocess
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("--strata", default="build/strata")
parser.add_argument("--old", default=None, help="an older strata binary whose `plan` to compare")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--only", default=None)
parser.add_argument("--dir", default=None, help="scratch folder on the drive (default: under strata-data/)")
args = parser.parse_args()

root = args.dir or os.path.join("strata-data", "bench-plan")
os.makedirs(root, exist_ok=True)
common = {
    "data": {"path": "/usr/share/common-licenses/GPL-3", "format": "text-bytes"},
    "steps": args.steps, "precision": "bf16", "checkpoint_every": 1000,
    "optimizer": {"lr": 3.0e-4, "grad_clip": 1.0},
    "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
}
configs = {
    "tight": {**common, "batch_size": 4,
              "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 256, "seq_len": 128, "seed": 1},
              "device": {"memory": "256MiB"}, "host": {"memory": "192MiB"}},
    "inplace": {**common, "batch_size": 4,
                "model": {"n_layer": 4, "n_head": 6, "n_embd": 384, "vocab_size": 256, "seq_len": 128, "seed": 1},
                "device": {"memory": "64MiB"}, "host": {"memory": "48MiB"}},
}


def plan(binary, cfg_path):
    out = subprocess.run([binary, "--log-level", "warn", "plan", cfg_path, "--json"], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


for name, cfg in configs.items():
    if args.only and name != args.only:
        continue
    folder = tempfile.mkdtemp(prefix=name + "-", dir=root)
    nvme = os.path.join(folder, "nvme")
    os.makedirs(nvme)
    cfg = {**cfg, "nvme": {"paths": [os.path.abspath(nvme)]}}
    cfg_path = os.path.join(folder, "train.yaml")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    new = plan(args.strata, cfg_path)
    old = plan(args.old, cfg_path) if args.old else None
    out = subprocess.run([args.strata, "--log-level", "warn", "train", cfg_path, "--json"], capture_output=True,
                         text=True, check=True)
    s = json.loads(out.stdout)
    steps = max(1, s["last_step"] - s["first_step"])
    read, written = s["nvme_read_bytes"] / steps, s["nvme_write_bytes"] / steps
    measured = s["median_step_seconds"]
    print(f"{name}: {steps} steps, state {s['state_bytes'] / 2**20:.0f} MiB")
    print(f"  measured        read {read / 1e6:8.1f} MB/step  written {written / 1e6:8.1f} MB/step  "
          f"step {measured:6.2f} s (median), stall {100 * s['stall_seconds'] / s['seconds']:.0f} %, "
          f"kernels {s['compute_seconds'] / steps:.2f} s/step")
    for label, p in (("predicted (new)", new), ("predicted (old)", old)):
        if p is None:
            continue
        print(f"  {label} read {p['nvme_read_bytes'] / 1e6:8.1f} MB/step  written {p['nvme_write_bytes'] / 1e6:8.1f} "
              f"MB/step  step {p['predicted_step_s']:6.2f} s (kernels {p['compute_s']:.2f} s)  → measured ÷ predicted: reads "
              f"{read / max(p['nvme_read_bytes'], 1):.2f}, step {measured / p['predicted_step_s']:.2f}")
    shutil.rmtree(folder)
