#!/usr/bin/python3
# bench/train_offload.py — tokens/s of `strata train` with its state offloaded to NVMe against the
# same config fully resident, alternately in one run: resident, offloaded, resident, ... Reports
# the median tokens/s of each, the ratio, and the offloaded run's stall share. Both runs train
# the same model from the same init on the same data; the config is one where compute
# dominates (a 4-layer, 384-wide GPT-2, batch 4 × 128 tokens), which is where strata's
# overlap should hide the NVMe traffic (target, issue 11: offloaded ≥ 0.9× resident).
#
# Usage: bench/train_offload.py [--strata build/strata] [--repeats 3] [--steps 4] [--dir DIR]
#        [--interleave on|off]   (optimizer.interleave; omit: the trainer default, on)
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("--strata", default="build/strata")
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--interleave", choices=["on", "off"], default=None,
                    help="set optimizer.interleave (off: every clipped update after the last backward)")
parser.add_argument("--dir", default=None, help="scratch folder on the drive to measure (default: under strata-data/)")
args = parser.parse_args()

root = args.dir or os.path.join("strata-data", "bench-train")
os.makedirs(root, exist_ok=True)
base = {
    "model": {"n_layer": 4, "n_head": 6, "n_embd": 384, "vocab_size": 256, "seq_len": 128, "seed": 1},
    "data": {"path": "/usr/share/common-licenses/GPL-3", "format": "text-bytes"},
    "batch_size": 4, "steps": args.steps, "precision": "bf16", "checkpoint_every": 1000,
    "optimizer": {"lr": 3.0e-4, "grad_clip": 1.0},
}
if args.interleave is not None:
    base["optimizer"]["interleave"] = args.interleave == "on"
variants = {
    "resident": {"device": {"memory": "1GiB"}, "host": {"memory": "1GiB"},
                 "placement": {"params": "device", "grads": "host", "optimizer": "host"}},
    "offloaded": {"device": {"memory": "64MiB"}, "host": {"memory": "48MiB"},
                  "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"}},
}
results = {name: [] for name in variants}
stalls = []
for repeat in range(args.repeats):
    for name, overrides in variants.items():
        folder = tempfile.mkdtemp(prefix=name + "-", dir=root)
        nvme = os.path.join(folder, "nvme")
        os.makedirs(nvme)
        cfg = {**base, **overrides, "nvme": {"paths": [os.path.abspath(nvme)]}}
        cfg_path = os.path.join(folder, "train.yaml")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        out = subprocess.run([args.strata, "--log-level", "warn", "train", cfg_path, "--json"],
                             capture_output=True, text=True, check=True)
        summary = json.loads(out.stdout)
        results[name].append(summary["tokens_per_s"])
        if name == "offloaded":
            stalls.append(summary["stall_seconds"] / summary["seconds"])
        print(f"repeat {repeat + 1} {name:9}: {summary['tokens_per_s']:8.0f} tok/s, stall "
              f"{100 * summary['stall_seconds'] / summary['seconds']:5.1f}%, NVMe read "
              f"{summary['nvme_read_bytes'] / 1e6:8.1f} MB written {summary['nvme_write_bytes'] / 1e6:8.1f} MB, "
              f"state {summary['state_bytes'] / 2**20:.0f} MiB, peak RSS {summary['peak_rss_bytes'] / 2**20:.0f} MiB")
        shutil.rmtree(folder)
resident = statistics.median(results["resident"])
offloaded = statistics.median(results["offloaded"])
print(f"median tokens/s: resident {resident:.0f}, offloaded {offloaded:.0f}, "
      f"ratio {offloaded / resident:.3f} (target >= 0.9, issue 11); offloaded stall median "
      f"{100 * statistics.median(stalls):.1f}%")
