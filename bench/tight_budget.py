#!/usr/bin/python3
# bench/tight_budget.py — issue 11's tight-budget case: GPT-2 12 layers × 768 (≈1.5 GB of training
# state) trained fully resident against the same run offloaded with a 256 MiB device and a host
# budget of one eighth of the state (192 MiB), alternated in one run (resident, offloaded,
# resident, ...). Reports the median tokens/s of each side and their ratio (target: offloaded
# ≥ 0.85× resident), the offloaded side's stall share and drive busy share, and `strata plan`'s
# predicted step for the offloaded config against the measured median step (target: within 25 %).
#
# Both sides train the same model from the same init on the same data; tokens/s and the step
# time are the run's own (`strata train --json`: tokens over the timed steps, the median step).
# The drive busy share is the offloaded run's NVMe bytes ÷ (the run's seconds × the read
# bandwidth `strata io-bench` measures on the same folder just before it) — a rough figure.
#
# --io-reference adds a side after each offloaded run, the ceiling this machine allows: the
# resident config while fio (bench/io_reference.py) reads and writes on the same drive at the
# rates that offloaded run measured; offloaded / (resident+fio) says how close strata gets.
#
# Usage: bench/tight_budget.py [--strata build/strata] [--repeats 3] [--steps 4] [--dir DIR] [--verify-reads always|once]
#        [--chunk-elements N]   (omit: the trainer's choice; N: optimizer.chunk_elements: N)
#        [--interleave on|off]   (optimizer.interleave; omit: the trainer default, on)
#        [--sides resident,offloaded] [--io-reference]
#        [--optimizer-kind adamw|adamw8bit]   (optimizer.kind on both sides; default adamw)
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
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
parser.add_argument("--chunk-elements", type=int, default=None,
                    help="set optimizer.chunk_elements (default: leave it to the trainer)")
parser.add_argument("--sides", default="resident,offloaded", help="which sides to run, comma-separated")
parser.add_argument("--optimizer-kind", default="adamw", choices=["adamw", "adamw8bit"],
                    help="optimizer.kind on both sides (docs/optim.md: adamw8bit moves 6 bytes of state an element, not 12)")
parser.add_argument("--io-reference", action="store_true",
                    help="after each offloaded run, the resident config while fio moves that run's bytes at its rates")
args = parser.parse_args()
if args.io_reference:
    require_fio("--io-reference")
strata = os.path.abspath(args.strata)

root = args.dir or os.path.join("strata-data", "bench-tight")
os.makedirs(root, exist_ok=True)
base = {
    "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 256, "seq_len": 128, "seed": 1},
    "data": {"path": "/usr/share/common-licenses/GPL-3", "format": "text-bytes"},
    "batch_size": 4, "steps": args.steps, "precision": "bf16", "checkpoint_every": 1000,
    "optimizer": {"lr": 3.0e-4, "grad_clip": 1.0},
}
if args.interleave is not None:
    base["optimizer"]["interleave"] = args.interleave == "on"
if args.chunk_elements is not None:
    base["optimizer"]["chunk_elements"] = args.chunk_elements
if args.optimizer_kind != "adamw":
    base["optimizer"]["kind"] = args.optimizer_kind
variants = {
    "resident": {"device": {"memory": "4GiB"}, "host": {"memory": "4GiB"},
                 "placement": {"params": "device", "grads": "host", "optimizer": "host"}},
    "offloaded": {"device": {"memory": "256MiB"}, "host": {"memory": "192MiB"},
                  "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"}},
}
sides = [s for s in args.sides.split(",") if s]
if args.io_reference and sides != ["resident", "offloaded"]:
    sys.exit("--io-reference needs both sides (the default --sides)")


def run(*cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}")
    return result


def write_config(folder, name):
    nvme = os.path.join(folder, "nvme")
    os.makedirs(nvme, exist_ok=True)
    cfg = {**base, **variants[name], "nvme": {"paths": [os.path.abspath(nvme)], "verify_reads": args.verify_reads}}
    path = os.path.join(folder, "train.yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def train(name):
    folder = tempfile.mkdtemp(prefix=name + "-", dir=root)
    out = run(strata, "--log-level", "warn", "train", write_config(folder, name), "--json")
    shutil.rmtree(folder)
    return json.loads(out.stdout)


# `strata plan` for the offloaded config, once: its predicted step is what the run is held to.
plan_folder = tempfile.mkdtemp(prefix="plan-", dir=root)
plan = json.loads(run(strata, "--log-level", "warn", "plan", write_config(plan_folder, "offloaded"), "--json").stdout)
shutil.rmtree(plan_folder)
predicted = plan["predicted_step_s"]
print(f"strata plan (offloaded): predicted step {predicted:.3f} s (compute {plan['compute_s']:.3f} s, I/O floor "
      f"{plan['io_floor_s']:.3f} s at {plan['read_MBps']:.0f}/{plan['write_MBps']:.0f} MB/s, bound by "
      f"{plan['bound']}); NVMe {plan['nvme_read_bytes'] / 1e9:.2f} GB read + {plan['nvme_write_bytes'] / 1e9:.2f} GB "
      f"written per step", flush=True)

scratch = os.path.join(root, "read.data")
run(strata, "io-bench", "--file", scratch, "--size", "512MiB", "--rw", "write")

results = {name: [] for name in sides}
steps, stalls, busy, reads, writes = [], [], [], [], []
for repeat in range(args.repeats):
    for name in sides:
        drive = None
        if name == "offloaded":
            ref = json.loads(run(strata, "io-bench", "--file", scratch, "--size", "512MiB", "--rw", "read",
                                 "--json").stdout)
            drive = ref.get("MBps") or ref.get("mb_per_s") or ref.get("bandwidth_MBps")
        s = train(name)
        results[name].append(s["tokens_per_s"])
        line = f"repeat {repeat + 1} {name:9}: {s['tokens_per_s']:7.1f} tok/s, median step {s['median_step_seconds']:.3f} s"
        if name == "offloaded":
            stalls.append(s["stall_seconds"] / s["seconds"])
            steps.append(s["median_step_seconds"])
            moved = s["nvme_read_bytes"] + s["nvme_write_bytes"]
            busy.append(moved / 1e6 / drive / s["seconds"] if drive else float("nan"))
            reads.append(s["nvme_read_bytes"] / args.steps)
            writes.append(s["nvme_write_bytes"] / args.steps)
            line += (f", stall {100 * stalls[-1]:.1f} %, NVMe {reads[-1] / 1e9:.2f} GB read + {writes[-1] / 1e9:.2f} GB "
                     f"written per step, drive busy ~{100 * busy[-1]:.0f} % (io-bench {drive:.0f} MB/s), "
                     f"train's own prediction {s['predicted_step_seconds']:.3f} s, peak RSS "
                     f"{s['peak_rss_bytes'] / 2**20:.0f} MiB")
        print(line, flush=True)
        if name == "offloaded" and args.io_reference:
            with FioTraffic(root, s["nvme_read_bytes"] / s["seconds"], s["nvme_write_bytes"] / s["seconds"]) as fio:
                beside = train("resident")
            results.setdefault("resident+fio", []).append(beside["tokens_per_s"])
            print(f"repeat {repeat + 1} resident+fio: {beside['tokens_per_s']:7.1f} tok/s while fio read "
                  f"{fio.reached[0] / 1e6:.0f} MB/s and wrote {fio.reached[1] / 1e6:.0f} MB/s (the offloaded run's "
                  f"rates: {s['nvme_read_bytes'] / s['seconds'] / 1e6:.0f} and "
                  f"{s['nvme_write_bytes'] / s['seconds'] / 1e6:.0f})", flush=True)

summary = {name: statistics.median(values) for name, values in results.items()}
report = {"median_tokens_per_s": summary, "plan_predicted_step_s": predicted, "blas_core": s["blas_core"]}
if "offloaded" in summary:
    measured = statistics.median(steps)
    report.update({"offloaded_median_step_s": measured, "plan_error": predicted / measured - 1,
                   "offloaded_stall_fraction": statistics.median(stalls), "drive_busy_fraction": statistics.median(busy)})
if "resident" in summary and "offloaded" in summary:
    report["ratio"] = summary["offloaded"] / summary["resident"]
if "resident+fio" in summary:
    report["ceiling_ratio"] = summary["resident+fio"] / summary["resident"]
    report["offloaded_vs_ceiling"] = summary["offloaded"] / summary["resident+fio"]
print(json.dumps(report))
