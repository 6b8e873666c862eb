#!/usr/bin/python3
# bench/train_offload.py — tokens/s of `strata train` with its state offloaded to NVMe against the
# same config fully resident, alternately in one run: resident, offloaded, resident, ... Reports
# the median tokens/s of each, the ratio, and the offloaded run's stall share. Both runs train
# the same model from the same init on the same data; the config is one where compute
# dominates (a 4-layer, 384-wide GPT-2, batch 4 × 128 tokens), which is where strata's
# overlap should hide the NVMe traffic (target, issue 11: offloaded ≥ 0.9× resident).
#
# --io-reference adds a third side to each repeat, the ceiling this machine allows: the resident
# config again while fio (bench/io_reference.py) reads and writes files on the same drive at the
# rates the offloaded run of that repeat measured. resident+fio / resident is what offloading can
# reach at that traffic, and offloaded / (resident+fio) says how close strata gets.
#
# Usage: bench/train_offload.py [--strata build/strata] [--repeats 3] [--steps 4] [--dir DIR] [--verify-reads always|once]
#        [--interleave on|off]   (optimizer.interleave; omit: the trainer default, on)
#        [--io-reference]
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

from io_reference import FioTraffic, require_fio

parser = argparse.ArgumentParser()
parser.add_argument("--strata", default="build/strata")
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--interleave", choices=["on", "off"], default=None,
                    help="set optimizer.interleave (off: every clipped update after the last backward)")
parser.add_argument("--dir", default=None, help="scratch folder on the drive to measure (default: under strata-data/)")
parser.add_argument("--verify-reads", default="always", choices=["always", "once"],
                    help="nvme.verify_reads for every side (memory/store.h)")
parser.add_argument("--io-reference", action="store_true",
                    help="also run the resident config while fio moves the offloaded run's bytes at its rates")
args = parser.parse_args()
if args.io_reference:
    require_fio("--io-reference")

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
if args.io_reference:
    results["resident+fio"] = []
stalls = []
fio_rates = []


def train(name, overrides):
    folder = tempfile.mkdtemp(prefix=name.replace("+", "-") + "-", dir=root)
    nvme = os.path.join(folder, "nvme")
    os.makedirs(nvme)
    cfg = {**base, **overrides, "nvme": {"paths": [os.path.abspath(nvme)], "verify_reads": args.verify_reads}}
    cfg_path = os.path.join(folder, "train.yaml")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    out = subprocess.run([args.strata, "--log-level", "warn", "train", cfg_path, "--json"],
                         capture_output=True, text=True, check=True)
    shutil.rmtree(folder)
    return json.loads(out.stdout)


def train_beside_fio(read_bytes_per_s, write_bytes_per_s):
    """The resident config while fio reads and writes at the given rates; returns (summary,
    the rates fio reached in bytes/s)."""
    with FioTraffic(root, read_bytes_per_s, write_bytes_per_s) as fio:
        summary = train("resident+fio", variants["resident"])
    return summary, fio.reached


for repeat in range(args.repeats):
    for name, overrides in variants.items():
        summary = train(name, overrides)
        results[name].append(summary["tokens_per_s"])
        if name == "offloaded":
            stalls.append(summary["stall_seconds"] / summary["seconds"])
            rates = (summary["nvme_read_bytes"] / summary["seconds"], summary["nvme_write_bytes"] / summary["seconds"])
        print(f"repeat {repeat + 1} {name:9}: {summary['tokens_per_s']:8.0f} tok/s, stall "
              f"{100 * summary['stall_seconds'] / summary['seconds']:5.1f}%, NVMe read "
              f"{summary['nvme_read_bytes'] / 1e6:8.1f} MB written {summary['nvme_write_bytes'] / 1e6:8.1f} MB, "
              f"state {summary['state_bytes'] / 2**20:.0f} MiB, peak RSS {summary['peak_rss_bytes'] / 2**20:.0f} MiB")
    if args.io_reference:
        summary, reached = train_beside_fio(*rates)
        results["resident+fio"].append(summary["tokens_per_s"])
        fio_rates.append(reached)
        print(f"repeat {repeat + 1} resident+fio: {summary['tokens_per_s']:6.0f} tok/s while fio read "
              f"{reached[0] / 1e6:.0f} MB/s and wrote {reached[1] / 1e6:.0f} MB/s (asked {rates[0] / 1e6:.0f} and "
              f"{rates[1] / 1e6:.0f}: the offloaded run's own rates)")
resident = statistics.median(results["resident"])
offloaded = statistics.median(results["offloaded"])
print(f"median tokens/s: resident {resident:.0f}, offloaded {offloaded:.0f}, "
      f"ratio {offloaded / resident:.3f} (target >= 0.9, issue 11); offloaded stall median "
      f"{100 * statistics.median(stalls):.1f}%; GEMMs on OpenBLAS's {summary['blas_core']} kernels")
if args.io_reference:
    ceiling = statistics.median(results["resident+fio"])
    print(f"I/O reference: resident beside fio {ceiling:.0f} tok/s = {ceiling / resident:.3f}x resident (the "
          f"ceiling at this traffic on this machine); offloaded / (resident+fio) = {offloaded / ceiling:.3f}")
