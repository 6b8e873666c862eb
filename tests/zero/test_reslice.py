# Issue 15: `--resume` on another number of ranks re-slices the committed state (train/zero/zero_reslice.h).
# Proves, through the real binary on a tiny GPT-2 (global batch 6, 3 steps on the old N, resumed to 5
# on the new N): 2 → 1, 1 → 2, 2 → 3 and 3 → 2 end with the fp32 master weights and last loss of a
# run that never changed N within the tolerance of docs/parallel.md (relative L2 ≤ 1e-6, printed),
# and `strata store export` of the new stores equals the run's --export (`equal`); a SIGKILL at each
# point of a re-slice (new store half written, new stores committed, journal written, one folder
# switched) leaves a state that the old N resumes bit-identically or the new N resumes correctly
# (`kill`); a missing old rank store, stores at unreconcilable steps, another model and another
# optimizer.chunk_elements are refused in one line naming the folder or key (`bad`). At ZeRO stage 3
# (each store holds only its share of the compute copies, re-cut at chunk boundaries): 2 → 3, 3 → 2,
# 2 → 1 and 1 → 2 equal the run that never changed N within the same tolerance, the new stores' params
# tensors are disjoint (by name and by chunk range) and add up to the model once, and their
# `strata store export` equals --export (`stage3`).
# Usage: test_reslice.py STRATA CASE (equal | kill | bad | stage3).
import json
import os
import re
import shutil
import sys
import tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from zero_runs import MPI_ENV, fail, relative_difference, run_strata, same_bytes, summary_of, weights  # noqa: E402

STRATA = os.path.abspath(sys.argv[1])
CASE = sys.argv[2]
CORPUS = "/usr/share/common-licenses/GPL-3"
TOLERANCE = 1e-6


def config(folder, name, chunk=20000, n_embd=64, stage=2):
    os.makedirs(os.path.join(folder, name), exist_ok=True)
    cfg = {
        "model": {"n_layer": 2, "n_head": 4, "n_embd": n_embd, "vocab_size": 256, "seq_len": 16, "seed": 7},
        "data": {"path": CORPUS},
        "batch_size": 6,
        "steps": 5,
        "optimizer": {"lr": 1.0e-3, "weight_decay": 0.1, "grad_clip": 1.0, "chunk_elements": chunk},
        "precision": "fp32",
        "device": {"kind": "cpu", "memory": "64MiB"},
        "host": {"memory": "64MiB"},
        "nvme": {"paths": [os.path.join(folder, name, "rank{rank}")]},
        "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"},
        "parallel": {"zero_stage": stage, "timeout_s": 60},
        "checkpoint_every": 2,
    }
    path = os.path.join(folder, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(ranks, *args, expect_ok=True, kill_at=None):
    """ranks 0: a plain `strata train` (no MPI at all). kill_at: the re-slice point at which the
    binary kills itself (STRATA_TEST_RESLICE_KILL)."""
    env = dict(MPI_ENV, STRATA_TEST_RESLICE_KILL=kill_at) if kill_at else MPI_ENV
    return run_strata(STRATA, ranks, *args, expect_ok=expect_ok, env=env)


def ranks_of(store):
    with open(os.path.join(store, "manifest.json")) as f:
        manifest = json.load(f)
    return int(manifest["metadata"]["parallel.ranks"]), manifest["step"]


def straight(tmp, name, ranks, stage=2):
    """5 steps on one N: the reference."""
    cfg = config(tmp, name, stage=stage)
    out = os.path.join(tmp, name + ".safetensors")
    return out, summary_of(run(ranks, "train", cfg, "--json", "--export", out))


def within(reference, ref_summary, out, summary, what):
    diff, _ = relative_difference(reference, out)
    loss = abs(summary["last_loss"] - ref_summary["last_loss"]) / abs(ref_summary["last_loss"])
    print(f"{what}: relative L2 weight difference {diff:.2e}, last loss {summary['last_loss']:.7f} vs "
          f"{ref_summary['last_loss']:.7f} (rel {loss:.1e})")
    if not diff <= TOLERANCE or not loss <= TOLERANCE:
        fail(f"{what} is not the run that never changed N within {TOLERANCE}")


def resliced(tmp, name, old, new, reference, ref_summary, stage, what):
    """3 steps on `old` ranks, then resume to step 5 on `new`: the re-slice is reported, the run
    resumes at step 3 on `new` ranks within the tolerance of the straight run, and each new
    store records (new, 5). Returns the export and the new stores."""
    cfg = config(tmp, name, stage=stage)
    run(old, "train", cfg, "--steps", "3")
    out = os.path.join(tmp, name + ".safetensors")
    result = run(new, "train", cfg, "--resume", "--json", "--export", out)
    if "re-sliced step 3" not in result.stderr:
        fail(f"{what}: no re-slice was reported:\n{result.stderr[-2000:]}")
    summary = summary_of(result)
    if summary["first_step"] != 3 or summary["ranks"] != new:
        fail(f"{what}: resumed at step {summary['first_step']} on {summary['ranks']} ranks")
    within(reference, ref_summary, out, summary, f"{what} ranks after step 3")
    stores = [os.path.join(tmp, name, f"rank{r}", "store") for r in range(new)]
    for store in stores:
        if ranks_of(store) != (new, 5):
            fail(f"{store} records (ranks, step) {ranks_of(store)}, not ({new}, 5)")
    return out, stores


def one_line(result, what):
    lines = [l for l in result.stderr.splitlines() if l.startswith("[E]")]  # a plain run: its error lines
    if result.returncode == 0 or len(lines) != 1 or what not in lines[0]:
        fail(f"expected an error naming {what!r}, got exit {result.returncode}:\n{result.stderr[-2000:]}")
    print(f"refused: {next(l for l in lines if what in l).strip()}")


if os.environ.get("STRATA_TEST_TMPDIR"):
    os.makedirs(os.environ["STRATA_TEST_TMPDIR"], exist_ok=True)
with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR")) as tmp:
    if CASE == "equal":
        reference, ref_summary = straight(tmp, "one", 0)
        for old, new in ((2, 1), (1, 2), (2, 3), (3, 2)):
            name = f"n{old}to{new}"
            out, stores = resliced(tmp, name, old, new, reference, ref_summary, 2, f"{old} → {new}")
            for r in range(new, old):  # old ranks beyond the new N: marked, not reusable as a store
                folder = os.path.join(tmp, name, f"rank{r}")
                if os.path.exists(os.path.join(folder, "store")) or \
                        not os.path.isdir(os.path.join(folder, "store.before-reslice")):
                    fail(f"old rank {r}'s store was not set aside as store.before-reslice")
            again = os.path.join(tmp, name + ".again.safetensors")
            run(0, "store", "export", *stores, again)
            if not same_bytes(out, again):
                fail(f"{old} → {new}: strata store export of the new stores differs from --export")
    elif CASE == "stage3":
        reference, ref_summary = straight(tmp, "one", 0, stage=3)
        param_count = sum(len(v) for v in weights(reference).values())
        share = re.compile(r"^params\.(.+?)(?:\.(\d+)-(\d+))?$")
        for old, new in ((2, 3), (3, 2), (2, 1), (1, 2)):
            name = f"s3n{old}to{new}"
            out, stores = resliced(tmp, name, old, new, reference, ref_summary, 3, f"stage 3, {old} → {new}")
            # The new shares: disjoint (by name and by chunk range within a unit), the model once.
            names, chunks, total = set(), {}, 0
            for r, store in enumerate(stores):
                listing = json.loads(run(0, "store", "inspect", store, "--json").stdout)
                params = [t for t in listing["tensors"] if t["name"].startswith("params.")]
                held = sum(t["size_bytes"] for t in params)
                if new > 1 and held >= 4 * param_count:
                    fail(f"{store} holds the whole compute copy ({held} B) on {new} ranks")
                for t in params:
                    if t["name"] in names:
                        fail(f"{t['name']} is in two of the new stores")
                    names.add(t["name"])
                    unit, c0, c1 = share.match(t["name"]).groups()
                    span = set(range(int(c0), int(c1) + 1)) if c0 is not None else {"whole"}
                    mine = chunks.setdefault(unit, set())
                    if mine & span or ("whole" in mine) != ("whole" in span) and mine:
                        fail(f"{t['name']} overlaps another new share of unit {unit}")
                    mine |= span
                total += held
            if total != 4 * param_count:
                fail(f"stage 3, {old} → {new}: the new stores hold {total} B of params, the model is "
                     f"{4 * param_count} B")
            print(f"  {new} new stores: {len(names)} params tensors, disjoint, {total} B = the model once")
            again = os.path.join(tmp, name + ".again.safetensors")
            run(0, "store", "export", *stores, again)
            if not same_bytes(out, again):
                fail(f"stage 3, {old} → {new}: strata store export of the new stores differs from --export")
    elif CASE == "kill":
        reference, ref_summary = straight(tmp, "one", 0)

        def killed(result, point):
            if result.returncode == 0 or "killed at" not in result.stderr:
                fail(f"the kill at '{point}' did not happen (exit {result.returncode}):\n{result.stderr[-2000:]}")
            print(f"killed at '{point}': exit {result.returncode}")

        # 1 → 2 killed while rank 1's new store is half written: the old N resumes bit-identically.
        cfg = config(tmp, "a")
        run(0, "train", cfg, "--steps", "3")
        killed(run(2, "train", cfg, "--resume", expect_ok=False, kill_at="copy:1"), "copy:1")
        out = os.path.join(tmp, "a.safetensors")
        run(0, "train", cfg, "--resume", "--export", out)
        if not same_bytes(out, reference):
            fail("after a kill mid-copy, the old N's resume differs from a run that never stopped")
        if os.path.exists(os.path.join(tmp, "a", "rank0", "store.reslice")):
            fail("the killed attempt's store.reslice was left behind")
        print("kill mid-copy, old N resumes: bit-identical to a run that never stopped")

        # 2 → 1 killed once its new store is committed, then again with the first folder
        # switched: the old N (2) finishes the switch, re-slices back and trains on.
        cfg = config(tmp, "b")
        run(2, "train", cfg, "--steps", "3")
        killed(run(0, "train", cfg, "--resume", expect_ok=False, kill_at="built"), "built")
        if ranks_of(os.path.join(tmp, "b", "rank0", "store")) != (2, 3):
            fail("a kill before the journal changed the old store")
        killed(run(0, "train", cfg, "--resume", expect_ok=False, kill_at="switch"), "switch")
        if not os.path.exists(os.path.join(tmp, "b", "rank0", "reslice.journal")):
            fail("no journal after a kill in the switch")
        out = os.path.join(tmp, "b.safetensors")
        result = run(2, "train", cfg, "--resume", "--json", "--export", out)
        if "finishing the switch" not in result.stderr:
            fail("the interrupted switch was not finished:\n" + result.stderr[-2000:])
        within(reference, ref_summary, out, summary_of(result), "2 → 1 killed in the switch, resumed on 2")

        # 2 → 3 killed right after the journal: the new N finishes the switch and trains on.
        cfg = config(tmp, "c")
        run(2, "train", cfg, "--steps", "3")
        killed(run(3, "train", cfg, "--resume", expect_ok=False, kill_at="journal"), "journal")
        out = os.path.join(tmp, "c.safetensors")
        result = run(3, "train", cfg, "--resume", "--json", "--export", out)
        within(reference, ref_summary, out, summary_of(result), "2 → 3 killed after the journal, resumed on 3")
    elif CASE == "bad":
        cfg = config(tmp, "miss")
        run(2, "train", cfg, "--steps", "2")
        shutil.rmtree(os.path.join(tmp, "miss", "rank1", "store"))
        one_line(run(0, "train", cfg, "--resume", expect_ok=False), os.path.join(tmp, "miss", "rank1", "store"))

        cfg = config(tmp, "shape")
        run(2, "train", cfg, "--steps", "2")
        one_line(run(0, "train", config(tmp, "shape", chunk=10000), "--resume", expect_ok=False),
                 "optimizer.chunk_elements")
        one_line(run(0, "train", config(tmp, "shape", n_embd=32), "--resume", expect_ok=False), "n_embd")
        # Refused before anything was written: the old N still resumes.
        run(2, "train", config(tmp, "shape"), "--resume", "--steps", "3")

        cfg = config(tmp, "steps")
        run(2, "train", cfg, "--steps", "2")
        rank1 = os.path.join(tmp, "steps", "rank1")
        shutil.copytree(rank1, rank1 + ".step2")
        run(2, "train", cfg, "--resume", "--steps", "4")
        shutil.rmtree(rank1)
        os.rename(rank1 + ".step2", rank1)
        one_line(run(0, "train", cfg, "--resume", expect_ok=False), "step")
    else:
        fail("unknown case " + CASE)
