#!/usr/bin/python3
# bench/adamw8bit_demo.py — issue 32's targets on the demo (configs/demo.yaml: GPT-2 6 × 192,
# 300 steps, everything homed on NVMe under 16 MiB device + 24 MiB host): the same config trained
# with `optimizer.kind: adamw` (fp32 moments), `adamw8bit` and `adamw8bit` with
# `embedding_state: fp32`, each from the same init on the same data. Reports per kind the NVMe
# bytes per step (read + write, the median over steps 2..300 and the mean; from --metrics) and
# the loss (the last step's, and the mean of the last 50 steps), and the ratios against adamw.
# Targets: NVMe bytes per step >= 40 % lower than adamw's; the loss within 1 % of adamw's.
#
# Usage: bench/adamw8bit_demo.py [--strata build/strata] [--steps 300] [--dir DIR]
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
parser = argparse.ArgumentParser()
parser.add_argument("--strata", default="build/strata")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
args = parser.parse_args()
KINDS = [("adamw", "kind: adamw"), ("adamw8bit", "kind: adamw8bit"),
         ("adamw8bit, embedding fp32", "kind: adamw8bit, embedding_state: fp32")]


def demo_config(folder, optimizer_keys):
    with open(os.path.join(HERE, "..", "configs", "demo.yaml")) as f:
        text = f.read()
    text = text.replace("nvme: {paths: [../strata-data/demo]}", "nvme: {paths: [nvme]}")
    text, replaced = re.subn(r"grad_clip: 1\.0\}", "grad_clip: 1.0, " + optimizer_keys + "}", text)
    if replaced != 1 or "paths: [nvme]" not in text:
        sys.exit("configs/demo.yaml changed shape: update bench/adamw8bit_demo.py")
    text = re.sub(r"^sample:.*$", "", text, flags=re.M)  # the bench needs no sample text
    os.makedirs(os.path.join(folder, "nvme"), exist_ok=True)
    path = os.path.join(folder, "demo.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run(folder, optimizer_keys):
    cfg = demo_config(folder, optimizer_keys)
    metrics = os.path.join(folder, "metrics.json")
    result = subprocess.run([os.path.abspath(args.strata), "--log-level", "warn", "train", cfg, "--steps",
                             str(args.steps), "--metrics", metrics, "--json"], capture_output=True, text=True,
                            cwd=folder)
    if result.returncode != 0:
        sys.exit(f"strata train failed ({optimizer_keys}):\n{result.stderr}")
    with open(metrics) as f:
        steps = json.load(f)["steps"]
    io = [s["nvme_read_bytes"] + s["nvme_write_bytes"] for s in steps[1:]]  # step 1 warms the store
    losses = [s["loss"] for s in steps]
    summary = json.loads(result.stdout)
    return {"io_median": statistics.median(io), "io_mean": statistics.mean(io),
            "read_median": statistics.median(s["nvme_read_bytes"] for s in steps[1:]),
            "write_median": statistics.median(s["nvme_write_bytes"] for s in steps[1:]),
            "final_loss": losses[-1], "last50_loss": statistics.mean(losses[-50:]),
            "state_bytes": summary["state_bytes"], "tokens_per_s": summary["tokens_per_s"]}


with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
    results = {}
    for name, keys in KINDS:
        results[name] = run(os.path.join(tmp, name.replace(", ", "-").replace(" ", "-")), keys)
        r = results[name]
        print(f"{name}: NVMe {r['io_median'] / 1e6:.2f} MB/step median (read {r['read_median'] / 1e6:.2f}, write "
              f"{r['write_median'] / 1e6:.2f}), {r['io_mean'] / 1e6:.2f} mean; final loss {r['final_loss']:.4f}, "
              f"last-50 mean {r['last50_loss']:.4f}; state {r['state_bytes'] / 1e6:.1f} MB; "
              f"{r['tokens_per_s']:.0f} tok/s", flush=True)
    base = results["adamw"]
    for name, r in results.items():
        if name == "adamw":
            continue
        print(f"{name} vs adamw: NVMe bytes/step {100 * (1 - r['io_median'] / base['io_median']):.1f} % lower "
              f"(median; {100 * (1 - r['io_mean'] / base['io_mean']):.1f} % by mean), target >= 40 %; "
              f"final loss {100 * (r['final_loss'] / base['final_loss'] - 1):+.2f} %, last-50 mean "
              f"{100 * (r['last50_loss'] / base['last50_loss'] - 1):+.2f} %, target within 1 %")
