#!/usr/bin/python3
# `strata bench overlap` end to end on a small model (8 layers of 4 MiB, a pool of 5 of them):
#   - the three runs complete and every pass's sum of squares matches the layers as written
#     (`data_verified`): the scheduled runs read the layers back from the store, and the
#     compute-only run sums the 8 resident layers, one buffer each — a resident copy filled
#     with the wrong layer, or one buffer standing for all, changes the sums and the bench
#     exits with `corrupt`;
#   - the pool keeps part of the model and streams the rest: the JSON's figures are positive
#     and the efficiency is max(compute, io) / both;
#   - `--verify-reads once` runs the same bench with the store trusting what it has verified
#     (the sums still checked) and says so in the JSON; the default says `always`;
#   - `--compute-only` runs alone and reports its time, touching no store (its --dir lies under a
#     regular file, where no store could be made); without `--compute-ms` it is refused with one
#     line and exit 2, before any NVMe work;
#   - a --dir that holds anything but a scratch store's files is refused with one line and exit 2,
#     its files left as they were (the bench removes its scratch folder; it must never remove a
#     user's); one holding only a store's files (a killed run's) is taken over.
# Usage: test_bench_overlap.py STRATA
import json
import os
import subprocess
import sys
import tempfile

STRATA = os.path.abspath(sys.argv[1])


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def bench(folder, *extra, expect_ok=True, store=None):
    cmd = [STRATA, "--log-level", "warn", "bench", "overlap", "--json", "--layers", "8", "--layer-size", "4MiB",
           "--device-budget", "8MiB", "--host-budget", "12MiB", "--repeats", "2", "--dir",
           store or os.path.join(folder, "store"), *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if expect_ok and result.returncode != 0:
        fail(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stderr}")
    return result


with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as folder:
    out = json.loads(bench(folder).stdout)
    if out.get("data_verified") is not True:
        fail(f"the sums were not verified: {out}")
    for key in ("compute_seconds", "io_seconds", "step_seconds", "io_gb_per_s", "compute_passes_per_layer"):
        if not out.get(key, 0) > 0:
            fail(f"{key} is not positive: {out}")
    expected = max(out["compute_seconds"], out["io_seconds"]) / out["step_seconds"]
    if abs(out["overlap_efficiency"] - expected) > 1e-9:
        fail(f"overlap_efficiency {out['overlap_efficiency']} is not max(compute, io) / both = {expected}")
    if os.path.exists(os.path.join(folder, "store")):
        fail("the scratch store was left behind")
    print(f"overlap: compute {out['compute_seconds']:.3f} s, I/O {out['io_seconds']:.3f} s, "
          f"both {out['step_seconds']:.3f} s, efficiency {out['overlap_efficiency']:.3f}, verified")

    if out.get("verify_reads") != "always":
        fail(f"the default does not verify every read: {out}")
    once = json.loads(bench(folder, "--verify-reads", "once").stdout)
    if once.get("verify_reads") != "once" or once.get("data_verified") is not True:
        fail(f"--verify-reads once: {once}")
    print(f"--verify-reads once: efficiency {once['overlap_efficiency']:.3f}, verified")

    not_a_folder = os.path.join(folder, "a-file")
    with open(not_a_folder, "w") as f:
        f.write("x")
    only = json.loads(bench(folder, "--compute-only", "--compute-ms", "2",
                            store=os.path.join(not_a_folder, "store")).stdout)
    if only.get("data_verified") is not True or not only.get("compute_seconds", 0) > 0:
        fail(f"--compute-only: {only}")
    if "io_seconds" in only:
        fail(f"--compute-only ran the I/O side too: {only}")

    refused = bench(folder, "--compute-only", expect_ok=False)
    lines = refused.stderr.strip().splitlines()
    if refused.returncode != 2 or len(lines) != 1 or "--compute-ms" not in lines[0]:
        fail(f"--compute-only without --compute-ms: exit {refused.returncode}, stderr {refused.stderr!r}")
    if os.path.exists(os.path.join(folder, "store")):
        fail("a refused run wrote a store")

    mine = os.path.join(folder, "mine")
    os.makedirs(mine)
    with open(os.path.join(mine, "notes.txt"), "w") as f:
        f.write("keep me")
    refused = bench(folder, store=mine, expect_ok=False)
    lines = refused.stderr.strip().splitlines()
    if refused.returncode != 2 or len(lines) != 1 or "notes.txt" not in lines[0]:
        fail(f"a --dir holding a user's file: exit {refused.returncode}, stderr {refused.stderr!r}")
    if sorted(os.listdir(mine)) != ["notes.txt"] or open(os.path.join(mine, "notes.txt")).read() != "keep me":
        fail(f"a refused --dir was changed: {os.listdir(mine)}")
    print(f"--dir holding a user's file: refused, untouched ({lines[0]})")

    # What a killed run leaves (a store's files and nothing else) is taken over and removed.
    leftover = os.path.join(folder, "leftover")
    os.makedirs(leftover)
    for name in ("manifest.json", "data.strata"):
        with open(os.path.join(leftover, name), "w") as f:
            f.write("{}")
    if json.loads(bench(folder, store=leftover).stdout).get("data_verified") is not True:
        fail("a run over a killed run's scratch store did not verify")
    if os.path.exists(leftover):
        fail("the taken-over scratch store was left behind")
    print("a killed run's scratch store: taken over and removed")
print("ok")
