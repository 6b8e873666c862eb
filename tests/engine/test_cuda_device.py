#!/usr/bin/python3
# tests/engine/test_cuda_device.py — `device.kind: cuda` on a machine with no GPU (this build may
# or may not have CUDA compiled): `strata train` refuses in ONE line that says "no CUDA device",
# exits 2, and leaves no store behind; `strata plan` still plans, timing the kernels on the CPU
# backend, and says that its compute figures are assumed from there; `strata generate` of a store
# trained on cpu, asked for device.kind: cuda, refuses the same way (one line, exit 2). Where a GPU
# is visible the test skips (77): scripts/gpu-check.sh trains and generates on it instead.
#
# Usage: test_cuda_device.py STRATA_BINARY
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import config, fail, STRATA  # noqa: E402


def main():
    if glob.glob("/dev/nvidia[0-9]*"):
        print("a GPU is visible: scripts/gpu-check.sh covers device.kind: cuda here")
        sys.exit(77)
    scratch_root = os.environ.get("STRATA_TEST_TMPDIR", tempfile.gettempdir())
    os.makedirs(scratch_root, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="train-cuda-", dir=scratch_root)
    path, cfg = config(folder, device={"kind": "cuda", "memory": "64MiB"})

    train = subprocess.run([STRATA, "train", path, "--steps", "1"], capture_output=True, text=True, timeout=120)
    lines = [line for line in train.stderr.splitlines() if line.strip()]
    if train.returncode != 2:
        fail(f"train with device.kind: cuda and no GPU exited {train.returncode}, not 2:\n{train.stderr}")
    if len(lines) != 1 or "no CUDA device" not in lines[0] or "device.kind" not in lines[0]:
        fail(f"expected one line naming device.kind and 'no CUDA device', got:\n{train.stderr}")
    if os.path.exists(os.path.join(cfg["nvme"]["paths"][0], "store")):
        fail("a refused cuda run left a store behind")

    plan = subprocess.run([STRATA, "plan", path], capture_output=True, text=True, timeout=300)
    if plan.returncode != 0:
        fail(f"plan of a cuda config exited {plan.returncode}:\n{plan.stderr}")
    if "timed on the cpu backend" not in plan.stdout or "assumed" not in plan.stdout:
        fail(f"plan of a cuda config does not say its compute figures are assumed from the CPU:\n{plan.stdout}")

    # A store trained on cpu, then generation from it with the config switched to cuda.
    gen_folder = tempfile.mkdtemp(prefix="generate-cuda-", dir=scratch_root)
    cpu_path, gen_cfg = config(gen_folder, steps=1, checkpoint_every=1)
    trained = subprocess.run([STRATA, "train", cpu_path], capture_output=True, text=True, timeout=300)
    if trained.returncode != 0:
        fail(f"train on cpu (for the generate check) exited {trained.returncode}:\n{trained.stderr}")
    gen_cfg["device"] = {"kind": "cuda", "memory": "64MiB"}
    with open(cpu_path, "w") as f:
        json.dump(gen_cfg, f, indent=1)
    generate = subprocess.run([STRATA, "generate", cpu_path, "--prompt", "a", "--tokens", "2"], capture_output=True,
                              text=True, timeout=120)
    lines = [line for line in generate.stderr.splitlines() if line.strip()]
    if generate.returncode != 2:
        fail(f"generate with device.kind: cuda and no GPU exited {generate.returncode}, not 2:\n{generate.stderr}")
    if len(lines) != 1 or "no CUDA device" not in lines[0] or "device.kind" not in lines[0]:
        fail(f"generate: expected one line naming device.kind and 'no CUDA device', got:\n{generate.stderr}")
    print("ok: cuda without a GPU is refused in one line (exit 2) by train and generate; plan says what it assumed")


main()
