#!/usr/bin/python3
# bench/serve_overhead.py — what `strata train --serve` costs a run: the demo's config (a 6-layer,
# 192-wide GPT-2 streaming its state from NVMe under 16/24 MiB budgets) trained alternately
# without serving and with --serve while a scraper fetches /metrics and the whole
# /api/history every second (more than Prometheus and a dashboard would). Each run's figure is
# its median step time from --metrics (the first step, which warms the caches, left out);
# reports the median over the repeats of each side and the ratio served/plain.
#
# Usage: bench/serve_overhead.py [--strata build/strata] [--repeats 5] [--steps 40] [--dir DIR]
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--strata", default="build/strata")
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--dir", default=None, help="scratch folder (default: strata-data/bench-serve)")
args = parser.parse_args()

root = os.path.abspath(args.dir or os.path.join("strata-data", "bench-serve"))
config = {
    "model": {"n_layer": 6, "n_head": 6, "n_embd": 192, "vocab_size": 256, "seq_len": 64, "seed": 1},
    "data": {"path": "/usr/share/common-licenses/GPL-3", "format": "text-bytes"},
    "batch_size": 8, "steps": args.steps, "precision": "bf16", "checkpoint_every": 10,
    "optimizer": {"lr": 1.0e-3, "grad_clip": 1.0},
    "device": {"kind": "cpu", "memory": "16MiB"}, "host": {"memory": "24MiB"},
    "nvme": {"paths": [os.path.join(root, "nvme")]},
    "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"},
}


def scrape(url, stop, counts):
    while not stop.is_set():
        for path in ("metrics", "api/history"):
            try:
                with urllib.request.urlopen(url + path, timeout=5) as response:
                    response.read()
                counts[path] = counts.get(path, 0) + 1
            except OSError:
                pass
        stop.wait(1.0)


def one_run(served):
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(config["nvme"]["paths"][0])
    config_path = os.path.join(root, "config.yaml")
    with open(config_path, "w") as out:
        json.dump(config, out)
    metrics = os.path.join(root, "run.json")
    command = [args.strata, "train", config_path, "--metrics", metrics]
    if served:
        command += ["--serve", "127.0.0.1:0"]
    log_path = os.path.join(root, "train.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        stop, counts, scraper = threading.Event(), {}, None
        if served:
            while scraper is None and process.poll() is None:
                match = re.search(r"serving metrics at (http://\S+/)metrics", open(log_path).read())
                if match:
                    scraper = threading.Thread(target=scrape, args=(match.group(1), stop, counts))
                    scraper.start()
                time.sleep(0.05)
        process.wait()
        stop.set()
        if scraper:
            scraper.join()
    if process.returncode != 0:
        raise SystemExit(f"train failed:\n{open(log_path).read()[-2000:]}")
    with open(metrics) as f:
        steps = json.load(f)["steps"]
    return statistics.median(s["seconds"] for s in steps[1:]), counts


plain, served, scrapes = [], [], []
for repeat in range(args.repeats):
    for side in ((False, True) if repeat % 2 == 0 else (True, False)):
        seconds, counts = one_run(side)
        (served if side else plain).append(seconds)
        if side:
            scrapes.append(counts.get("metrics", 0))
        print(f"repeat {repeat + 1}: {'served' if side else 'plain '} median step {seconds * 1000:.2f} ms"
              + (f" ({counts.get('metrics', 0)} scrapes)" if side else ""), flush=True)
shutil.rmtree(root, ignore_errors=True)
p, s = statistics.median(plain), statistics.median(served)
print(f"plain  median step: {p * 1000:.2f} ms (runs: {', '.join(f'{x * 1000:.2f}' for x in plain)})")
print(f"served median step: {s * 1000:.2f} ms (runs: {', '.join(f'{x * 1000:.2f}' for x in served)})")
print(f"served/plain step time: {s / p:.3f}; scrapes per served run: {statistics.median(scrapes)}")
