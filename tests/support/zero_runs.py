# tests/support/zero_runs.py — what the ZeRO tests (tests/zero/test_zero.py, test_reslice.py)
# share: how they start strata under mpirun on a 2-core box as root, and how they compare the
# weights two runs exported.
import json
import os
import struct
import subprocess
import sys

from safetensors_file import read_entries

# --oversubscribe: more ranks than cores; shared memory and self only (no network needed).
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader"]
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MPI_ENV.pop("STRATA_TEST_RESLICE_KILL", None)  # only the run that asks for a kill gets one


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def run_strata(strata, ranks, *args, expect_ok=True, timeout=600, env=None):
    """ranks 0: a plain `strata` process (no MPI at all); else `mpirun -np ranks strata`."""
    command = ([strata] if ranks == 0 else MPIRUN + ["-np", str(ranks), strata]) + list(args)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env or MPI_ENV)
    if expect_ok and result.returncode != 0:
        fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def summary_of(result, what="run"):
    """Rank 0's JSON summary: exactly one line of the job's stdout."""
    summaries = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if len(summaries) != 1:
        fail(f"{what}: expected one JSON summary (rank 0's), got {len(summaries)}")
    return summaries[0]


def weights(path):
    return {name: struct.unpack(f"<{len(raw) // 4}f", raw) for name, (_, raw) in read_entries(path)[0].items()}


def relative_difference(a, b):
    """‖a − b‖₂ / ‖a‖₂ over every weight of two fp32 exports, and the largest |a − b|. The L2
    figure is the criterion: an element-wise one cannot hold under AdamW, whose update is
    ±lr·sign(g) for the attention key bias, whose gradient is zero in exact arithmetic (softmax
    ignores a shift per query) and fp32 noise of either sign in practice — a reduction order
    flips it."""
    wa, wb = weights(a), weights(b)
    if wa.keys() != wb.keys():
        fail("the exports name different tensors")
    num = den = worst = 0.0
    for name in wa:
        for x, y in zip(wa[name], wb[name]):
            num += (x - y) ** 2
            den += x * x
            worst = max(worst, abs(x - y))
    return (num / den) ** 0.5, worst


def same_bytes(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()
