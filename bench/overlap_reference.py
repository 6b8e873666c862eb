#!/usr/bin/python3
# bench/overlap_reference.py — `strata bench overlap` (16 × 64 MiB, compute ≈ I/O; issue 11's
# target: overlap_efficiency ≥ 0.9) beside the ceiling this machine allows, alternated in one
# run. Each repeat:
#   1. `strata bench overlap --json` as is: compute only, I/O only, both; its efficiency is
#      max(compute, io) / both.
#   2. the same command (the compute time per layer fixed to what step 1 calibrated) while fio
#      (bench/io_reference.py) reads on the same drive at the rate step 1's "both" run read: its
#      compute-only time is what the compute takes when those bytes move beside it, whoever moves
#      them;
#   3. the other direction: fio reading as fast as it can for 3 s, alone, and then inside a
#      window of `strata bench overlap --compute-only` (the same compute, nothing else): the
#      ratio of its rates is how much the compute slows reads, whoever reads.
# ceiling = max(compute, io) / max(compute beside fio, io × fio alone / fio beside compute) —
# what perfect overlap reaches on this machine at that traffic, in both directions.
# Reports the medians and strata's efficiency / ceiling.
#
# `--verify-reads once` runs strata's side with the store trusting what it has seen intact
# (memory/store.h); the default, like strata's, verifies every read.
#
# Usage: bench/overlap_reference.py [--strata build/strata] [--repeats 3] [--dir DIR] [--verify-reads once]
import argparse
import json
import os
import statistics
import subprocess
import sys

from io_reference import UNLIMITED, FioTraffic, require_fio

parser = argparse.ArgumentParser()
parser.add_argument("--strata", default="build/strata")
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--dir", default=None, help="scratch folder on the drive to measure (default: under strata-data/)")
parser.add_argument("--verify-reads", default="always", choices=["always", "once"])
args = parser.parse_args()
require_fio("bench/overlap_reference.py")
root = os.path.abspath(args.dir or os.path.join("strata-data", "bench-overlap-ref"))
os.makedirs(root, exist_ok=True)


def overlap(*extra, repeats=1):
    cmd = [os.path.abspath(args.strata), "--log-level", "warn", "bench", "overlap", "--json", "--repeats", str(repeats),
           "--dir", os.path.join(root, "store"), "--verify-reads", args.verify_reads, *extra]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout)


efficiencies, ceilings, ratios = [], [], []
for repeat in range(args.repeats):
    plain = overlap()
    # The bytes a pass reads (the pool keeps part of the model) over the "both" run's seconds.
    read_rate = plain["io_gb_per_s"] * 1e9 * plain["io_seconds"] / plain["step_seconds"]
    with FioTraffic(root, read_rate, 0) as fio:
        beside = overlap("--compute-ms", str(plain["compute_ms_per_layer"]))
    compute, io = plain["compute_seconds"], plain["io_seconds"]
    with FioTraffic(root, UNLIMITED, 0, window_s=(0, 3)) as alone:
        pass
    # The compute-only load runs ~3 s of setup (the layers filled, the reference sums, the
    # calibration; it writes no store), then `repeats` passes; fio's 3 s window opens 4 s in and
    # closes well before the passes end.
    passes = max(10, int(8 / max(plain["compute_seconds"], 0.05)))
    with FioTraffic(root, UNLIMITED, 0, window_s=(4, 3)) as under_load:
        overlap("--compute-only", "--compute-ms", str(plain["compute_ms_per_layer"]), repeats=passes)
    io_slowdown = max(1.0, alone.reached[0] / under_load.reached[0])
    ceiling = max(compute, io) / max(beside["compute_seconds"], io * io_slowdown)
    efficiencies.append(plain["overlap_efficiency"])
    ceilings.append(ceiling)
    ratios.append(plain["overlap_efficiency"] / ceiling)
    print(f"repeat {repeat + 1}: compute {compute:.3f} s, I/O {io:.3f} s ({plain['io_gb_per_s']:.2f} GB/s), both "
          f"{plain['step_seconds']:.3f} s (stall {100 * plain['stall_fraction']:.1f} %): efficiency "
          f"{plain['overlap_efficiency']:.3f}; compute beside fio reading {fio.reached[0] / 1e9:.2f} GB/s (asked "
          f"{read_rate / 1e9:.2f}, the 'both' run's rate) {beside['compute_seconds']:.3f} s; fio flat out "
          f"{alone.reached[0] / 1e9:.2f} GB/s alone, {under_load.reached[0] / 1e9:.2f} beside the compute: ceiling "
          f"{ceiling:.3f}, strata / ceiling {ratios[-1]:.3f}",
          flush=True)
report = {"overlap_efficiency": statistics.median(efficiencies), "ceiling": statistics.median(ceilings),
          "efficiency_vs_ceiling": statistics.median(ratios), "repeats": args.repeats,
          "verify_reads": args.verify_reads}
print(f"reads verified {args.verify_reads}: median overlap_efficiency {report['overlap_efficiency']:.3f} (target >= 0.9, issue 11); ceiling at this "
      f"traffic on this machine {report['ceiling']:.3f}; efficiency / ceiling {report['efficiency_vs_ceiling']:.3f}")
print(json.dumps(report))
