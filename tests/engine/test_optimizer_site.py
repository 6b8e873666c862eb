#!/usr/bin/python3
# tests/engine/test_optimizer_site.py — where each optimizer step runs (run/train_plan.h's
# OptimizerSite), through `strata plan --json`, which plans a cuda config on any machine: only a
# discrete device (`device.kind: cuda` or `emulated`) with `placement.optimizer: host` runs the
# update on the host (CPU AdamW); every CPU config, and a discrete device with the state on the
# device or NVMe, updates on the device — the decision follows what the device is, so emulated
# and cuda plan alike. And the
# decision is real, not a label: on the host site the optimizer state is no longer part of the
# device steps, so the plan's replay (device budget below the state, so it streams) writes back
# fewer device→host bytes per step than cuda with the state on NVMe (which the device updates),
# by at least the optimizer state the device no longer updates. (The CPU device is no yardstick:
# it computes in place and its plan moves no device↔host bytes at all.)
#
# Usage: test_optimizer_site.py STRATA_BINARY
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import config, fail, STRATA  # noqa: E402


def plan(folder, kind, optimizer):
    sub = os.path.join(folder, f"{kind}-{optimizer}")
    os.makedirs(sub, exist_ok=True)
    path, _ = config(sub, device={"kind": kind, "memory": "3MiB"}, host={"memory": "64MiB"},
                     placement={"params": "host", "grads": "host", "optimizer": optimizer})
    result = subprocess.run([STRATA, "plan", path, "--json"], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        fail(f"strata plan ({kind}, optimizer: {optimizer}) exited {result.returncode}:\n{result.stderr}")
    return json.loads(result.stdout)


def main():
    scratch_root = os.environ.get("STRATA_TEST_TMPDIR", tempfile.gettempdir())
    os.makedirs(scratch_root, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="optimizer-site-", dir=scratch_root)
    plans = {}
    for kind in ("cpu", "cuda", "emulated"):
        for optimizer in ("host", "nvme"):
            plans[(kind, optimizer)] = p = plan(folder, kind, optimizer)
            want = "host" if kind != "cpu" and optimizer == "host" else "device"
            if p.get("optimizer_site") != want:
                fail(f"{kind} with optimizer: {optimizer}: optimizer_site is {p.get('optimizer_site')!r}, "
                     f"expected {want!r} ({p.get('optimizer_site_reason')})")
    for kind in ("cuda", "emulated"):
        on_device, host_site = plans[(kind, "nvme")], plans[(kind, "host")]
        optim_bytes = host_site["placement"]["optimizer (master, m, v)"]["bytes"]
        shipped_less = on_device["device_to_host_bytes"] - host_site["device_to_host_bytes"]
        if shipped_less < optim_bytes:
            fail(f"{kind}: the host site should keep the {optim_bytes} bytes of optimizer state off the device, but "
                 f"the plan moves only {shipped_less} fewer bytes device→host "
                 f"({on_device['device_to_host_bytes']} with the state on NVMe, "
                 f"{host_site['device_to_host_bytes']} on the host site)")
    if plans[("cpu", "host")]["device_to_host_bytes"] != 0:
        fail("the CPU device computes in place: its plan should move no device→host bytes")
    print(f"ok: only a discrete device (cuda, emulated) + optimizer: host updates on the host; emulated's moves "
          f"{shipped_less} fewer bytes device→host per step (optimizer state {optim_bytes})")


main()
