#!/usr/bin/python3
# bench/scale_xl.py — the scale run of issue 7: two steps of GPT-2 XL (1.56 B parameters, 28 GB
# of training state) under a 6 GiB host and 2 GiB device budget, against the I/O floor and
# the compute-only time, and against `strata plan`'s prediction.
#
# What it does, in order:
#   1. `strata tune` on the drive that will hold the store (its measured_MBps are the
#      bandwidths of the I/O floor and of the prediction);
#   2. a copy of configs/gpt2-xl-offload.yaml with that tune file as nvme.io_file;
#   3. `strata plan` on it (the prediction, and the compute-only time: each kernel timed
#      alone at the run's shape);
#   4. a fresh store, then `strata train --steps 2 --metrics` (initializing the store is not
#      part of a step and is reported apart).
# Then, per step: seconds, bytes per tier pair, the I/O floor (NVMe bytes ÷ tuned bandwidth),
# step ÷ floor, step ÷ max(floor, compute-only); peak RSS against the budgets plus the
# documented fixed overhead; predicted against measured.
#
# Needs ~45 GB free on the drive of --dir (two versions of the 22 GB store) and ~9 GB of RAM.
# About 10 minutes on a 2-core box. Not part of the test suite.
#
# Usage: bench/scale_xl.py [--strata build/strata] [--dir strata-data/scale-xl] [--skip-tune FILE]
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXED_OVERHEAD_BYTES = 64 << 20  # docs/train.md: peak RSS ≤ host + device budgets + this

parser = argparse.ArgumentParser()
parser.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
parser.add_argument("--dir", default=os.path.join(ROOT, "strata-data", "scale-xl"),
                    help="folder on the drive to measure; the store goes here")
parser.add_argument("--config", default=os.path.join(ROOT, "configs", "gpt2-xl-offload.yaml"))
parser.add_argument("--tune-file", default=None, help="reuse this `strata tune` output instead of tuning")
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

strata = os.path.abspath(args.strata)
work = os.path.abspath(args.dir)
os.makedirs(work, exist_ok=True)


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


# 1. tune
tune_file = os.path.abspath(args.tune_file) if args.tune_file else os.path.join(work, "strata-io.yaml")
if not args.tune_file:
    run([strata, "tune", "--dir", os.path.join(work, "tune"), "--out", tune_file], stdout=sys.stderr)
tuned = open(tune_file).read()
read_MBps = float(re.search(r"read:(?:.|\n)*?measured_MBps:\s*([0-9.]+)", tuned).group(1))
write_MBps = float(re.search(r"write:(?:.|\n)*?measured_MBps:\s*([0-9.]+)", tuned).group(1))

# 2. the config, with absolute paths and the tuned io settings
store_root = os.path.join(work, "nvme")
shutil.rmtree(store_root, ignore_errors=True)
os.makedirs(store_root)
config_text = open(args.config).read()
config_text, count = re.subn(r"(?m)^nvme:.*$", f"nvme: {{paths: [{store_root}], io_file: {tune_file}}}", config_text)
assert count == 1, "the config's nvme: line was not found"
config = os.path.join(work, "gpt2-xl.yaml")
with open(config, "w") as f:
    f.write(config_text)

# 3. the plan
plan = json.loads(run([strata, "plan", config, "--json"], stdout=subprocess.PIPE).stdout)

# 4. the run
metrics_path = os.path.join(work, "metrics.json")
start = time.monotonic()
train = run([strata, "train", config, "--steps", str(args.steps), "--metrics", metrics_path, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
wall_s = time.monotonic() - start
sys.stderr.write(train.stderr)
metrics = json.load(open(metrics_path))
summary = metrics["summary"]
init_s = wall_s - summary["seconds"]

budgets = plan["host_budget_bytes"] + plan["device_budget_bytes"]  # the config's, as the plan read them
GiB = float(1 << 30)
print(f"\n## GPT-2 XL scale run — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
      f"{os.cpu_count()} cores\n")
print(f"tuned: read {read_MBps:.0f} MB/s, write {write_MBps:.0f} MB/s ({tune_file}); "
      f"compute-only step (each kernel alone, `strata plan`): {plan['compute_s']:.1f} s")
print(f"store initialization (not a step): {init_s:.0f} s for {summary['state_bytes'] / GiB:.1f} GiB of state\n")
print("| step | seconds | NVMe read GiB | NVMe write GiB | h2d GiB | d2h GiB | I/O floor s | step ÷ floor | "
      "step ÷ max(floor, compute) | stall % |")
print("|---|---|---|---|---|---|---|---|---|---|")
worst = 0.0
for s in metrics["steps"]:
    floor = s["nvme_read_bytes"] / (read_MBps * 1e6) + s["nvme_write_bytes"] / (write_MBps * 1e6)
    bound = max(floor, plan["compute_s"])
    worst = max(worst, s["seconds"] / bound)
    print(f"| {s['step']} | {s['seconds']:.1f} | {s['nvme_read_bytes'] / GiB:.2f} | {s['nvme_write_bytes'] / GiB:.2f} | "
          f"{s['host_to_device_bytes'] / GiB:.2f} | {s['device_to_host_bytes'] / GiB:.2f} | {floor:.1f} | "
          f"{s['seconds'] / floor:.1f} | {s['seconds'] / bound:.2f} | {100 * s['stall_seconds'] / s['seconds']:.1f} |")
print()
print(f"predicted traffic per step: NVMe read {plan['nvme_read_bytes'] / GiB:.2f} GiB, write "
      f"{plan['nvme_write_bytes'] / GiB:.2f} GiB, h2d {plan['host_to_device_bytes'] / GiB:.2f} GiB, d2h "
      f"{plan['device_to_host_bytes'] / GiB:.2f} GiB")
measured = summary["median_step_seconds"]
print(f"step time: predicted {plan['predicted_step_s']:.1f} s ({plan['bound']}-bound), measured {measured:.1f} s "
      f"(median); measured ÷ predicted {measured / plan['predicted_step_s']:.2f} (target within ±25%)")
print(f"in-run kernel time {summary['compute_seconds'] / len(metrics['steps']):.1f} s per step "
      f"vs {plan['compute_s']:.1f} s alone")
print(f"worst step ÷ max(I/O floor, compute-only): {worst:.2f} (target ≤ 1.3)")
rss = summary["peak_rss_bytes"]
print(f"peak RSS {rss / GiB:.2f} GiB; budgets {budgets / GiB:.2f} GiB + documented overhead "
      f"{FIXED_OVERHEAD_BYTES >> 20} MiB = {(budgets + FIXED_OVERHEAD_BYTES) / GiB:.2f} GiB "
      f"({'within' if rss <= budgets + FIXED_OVERHEAD_BYTES else 'OVER'})")
print(f"loss {summary['first_loss']:.4f} → {summary['last_loss']:.4f}")
