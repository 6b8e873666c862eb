# Issue 15: time in collectives per step for ZeRO stages 1, 2 and 3 on 2 and 3 ranks, against the
# same global batch on 1 rank, in one run, alternated (1, s1n2, s2n2, s3n2, s1n3, s2n3, s3n3, then again),
# medians over the repeats. On a 2-core box the ranks share the cores: this records what the
# collectives cost and what a rank moves; it is not a speed claim for more ranks.
# Usage: /usr/bin/python3 bench/zero_comm.py [build/strata] [repeats]
import json
import os
import statistics
import subprocess
import sys
import tempfile

STRATA = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/strata")
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader"]
CASES = [(0, 1), (2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3)]  # (ranks, stage); 0: a plain run


def run(tmp, ranks, stage, repeat):
    name = f"n{ranks}s{stage}r{repeat}"
    cfg = {
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256, "seq_len": 64, "seed": 7},
        "data": {"path": "/usr/share/common-licenses/GPL-3"},
        "batch_size": 6, "steps": 8, "checkpoint_every": 100,
        "optimizer": {"lr": 1.0e-3, "chunk_elements": 65536},
        "precision": "fp32",
        "device": {"kind": "cpu", "memory": "128MiB"}, "host": {"memory": "128MiB"},
        "nvme": {"paths": [os.path.join(tmp, name, "rank{rank}")]},
        "parallel": {"zero_stage": stage},
    }
    os.makedirs(os.path.join(tmp, name), exist_ok=True)
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    command = ([] if ranks == 0 else MPIRUN + ["-np", str(ranks)]) + [STRATA, "train", path, "--json"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads([l for l in out.splitlines() if l.startswith("{")][0])


with tempfile.TemporaryDirectory() as tmp:
    results = {case: [] for case in CASES}
    for repeat in range(REPEATS):
        for ranks, stage in CASES:
            results[(ranks, stage)].append(run(tmp, ranks, stage, repeat))
    print("| ranks | stage | median step s | comm s/step | sent B/step (rank 0) | formula B/step | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for (ranks, stage), runs in results.items():
        steps = [r["last_step"] - r["first_step"] for r in runs]
        print(f"| {max(ranks, 1)}{' (plain)' if ranks == 0 else ''} | {stage if ranks > 1 else '-'} "
              f"| {statistics.median(r['median_step_seconds'] for r in runs):.3f} "
              f"| {statistics.median(r['comm_seconds'] / s for r, s in zip(runs, steps)):.3f} "
              f"| {statistics.median(r['comm_sent_bytes'] / s for r, s in zip(runs, steps)):.0f} "
              f"| {runs[0]['comm_formula_bytes_per_step']} "
              f"| {statistics.median(r['tokens_per_s'] for r in runs):.0f} |")
