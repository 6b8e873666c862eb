# Issue 15: ZeRO data parallelism through the real binary under `mpirun --oversubscribe`.
# Proves, on a tiny GPT-2 (5 steps, global batch 6): for stages 1 and 2, 2 and 3 ranks end with
# the fp32 master weights of a 1-rank run of the same global batch within fp32 reduction-order
# tolerance (‖Δw‖₂/‖w‖₂ and the loss ≤ 1e-6 relative, printed), and `strata store export` over
# the rank stores writes what --export wrote; a plain run and `mpirun -np 1` are bit-identical;
# a rerun with the same N is bit-identical; bad launches (no {rank}, a batch N does not divide,
# stage 4, another N on --resume) exit non-zero with a line naming the key; a SIGKILLed rank
# takes the job down with a non-zero exit and a line naming the rank, and --resume then
# finishes with the weights of a run that never stopped.
# Stage 3 (parameters partitioned and gathered per unit): `stage3` — 2 and 3 ranks equal the
# 1-rank run within the same tolerance and the stage-2 run of the same N bit for bit (the
# gathered copies are the broadcast ones), each rank's store holds only its share of the compute
# copies (the params tensors of the rank stores add up to the model once, disjoint; a replicated
# store fails), `strata store export` over them writes what --export wrote, and `strata
# generate` on a rank's store refuses in one line saying to export first; `stage3_resume` — a
# 3-rank rerun is bit-identical, and a 2-rank run stopped after step 3 then resumed ends with
# the bits of one that never stopped; `kill3` — `kill` at stage 3 (a SIGKILLed rank, --resume = a
# run that never stopped, bit for bit).
# `emulated` — stages 1-3 on 2 emulated ranks (device.kind: emulated: the discrete device-tensor
# path on the CPU) equal the same run on 2 cpu ranks bit for bit.
# `accumulate` — gradient_accumulation_steps: 2 at stages 1, 2 and 3 on 2 and 3 ranks equals one
# process training the K·B-row batch (relative L2 ≤ 1e-5); stage 3 equals stage 2 of the same N
# bit for bit, 2 emulated ranks equal 2 cpu ranks bit for bit, a stage-3 run stopped after step 3
# and resumed ends with the bits of one that never stopped, and grads: device trains grads:
# host's bits at stages 2 and 3 (K = 2, grad_clip 0).
# `examples` — masked completion examples on 2 ranks (stages 1, 2, 3, emulated at stages 2 and 3,
# K = 2 at stages 1 and 3) equal one process training the whole batch: the global trained-token
# count, summed ranks; their evaluations (at stage 3 gathering each step's weights from the
# ranks' shares) equal the one process's within 1e-5; `strata eval` on the rank stores refuses
# in one line.
# Usage: test_zero.py STRATA CASE (equal | rerun | bad | kill | stage3 | stage3_resume | kill3 | emulated |
# accumulate | examples).
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from zero_runs import MPIRUN, MPI_ENV, fail, relative_difference, run_strata, same_bytes, summary_of, weights  # noqa: E402

STRATA = os.path.abspath(sys.argv[1])
CASE = sys.argv[2]
CORPUS = "/usr/share/common-licenses/GPL-3"
TOLERANCE = 1e-6


def config(folder, name, stage=1, batch=6, per_rank=True, steps=5, **overrides):
    nvme = os.path.join(folder, name, "rank{rank}" if per_rank else "nvme")
    os.makedirs(os.path.dirname(nvme) if per_rank else nvme, exist_ok=True)
    cfg = {
        "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 16, "seed": 7},
        "data": {"path": CORPUS},
        "batch_size": batch,
        "steps": steps,
        "optimizer": {"lr": 1.0e-3, "weight_decay": 0.1, "grad_clip": 1.0, "chunk_elements": 20000},
        "precision": "fp32",
        "device": {"kind": "cpu", "memory": "64MiB"},
        "host": {"memory": "64MiB"},
        "nvme": {"paths": [nvme]},
        "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"},
        "parallel": {"zero_stage": stage, "timeout_s": 60},
        "checkpoint_every": 2,
    }
    cfg.update(overrides)
    path = os.path.join(folder, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(ranks, *args, expect_ok=True, timeout=600):
    return run_strata(STRATA, ranks, *args, expect_ok=expect_ok, timeout=timeout)


def train(folder, name, ranks, stage=1, extra=(), steps=5):
    cfg = config(folder, name, stage=stage, steps=steps)
    out = os.path.join(folder, name + ".safetensors")
    result = run(ranks, "train", cfg, "--json", "--export", out, *extra)
    return out, summary_of(result, name)


if os.environ.get("STRATA_TEST_TMPDIR"):
    os.makedirs(os.environ["STRATA_TEST_TMPDIR"], exist_ok=True)
with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR")) as tmp:
    if CASE == "equal":
        reference, ref_summary = train(tmp, "one", 0)
        single, _ = train(tmp, "np1", 1)
        if not same_bytes(reference, single):
            fail("mpirun -np 1 differs from a plain run")
        for stage in (1, 2):
            for ranks in (2, 3):
                out, summary = train(tmp, f"s{stage}n{ranks}", ranks, stage)
                diff, worst = relative_difference(reference, out)
                loss_diff = abs(summary["last_loss"] - ref_summary["last_loss"]) / abs(ref_summary["last_loss"])
                per_step = summary["comm_sent_bytes"] / (summary["last_step"] - summary["first_step"])
                print(f"stage {stage}, {ranks} ranks: relative L2 weight difference {diff:.2e} (largest element "
                      f"{worst:.1e}), last loss "
                      f"{summary['last_loss']:.7f} vs {ref_summary['last_loss']:.7f} (rel {loss_diff:.1e}); rank 0 "
                      f"sent {per_step:.0f} B/step, ZeRO formula {summary['comm_formula_bytes_per_step']} B/step, "
                      f"{summary['comm_seconds']:.3f} s in collectives")
                if summary["ranks"] != ranks:
                    fail(f"summary says {summary['ranks']} ranks")
                if not diff <= TOLERANCE or not loss_diff <= TOLERANCE:
                    fail(f"stage {stage} on {ranks} ranks is not the 1-rank run within {TOLERANCE}")
                if summary["comm_sent_bytes"] == 0:
                    fail("no bytes counted between ranks")
                # `strata store export` over the set of stores writes what --export wrote.
                again = os.path.join(tmp, f"s{stage}n{ranks}.again.safetensors")
                stores = [os.path.join(tmp, f"s{stage}n{ranks}", f"rank{r}", "store") for r in range(ranks)]
                run(0, "store", "export", *stores, again)
                if not same_bytes(out, again):
                    fail("strata store export of the rank stores differs from the run's --export")
    elif CASE == "accumulate":
        # K = 2 micro-batches of the global batch 6 on 2 and 3 ranks (stages 1 and 2: each rank
        # sums its rows' gradients, the reduction runs once per update) = one process training
        # one batch of 12 rows.
        cfg = config(tmp, "one12", batch=12)
        reference = os.path.join(tmp, "one12.safetensors")
        ref_summary = summary_of(run(0, "train", cfg, "--json", "--export", reference), "one12")
        # Stage 3 (parameters gathered per unit, every pass of the update gathering again) is held
        # to the same 1e-5, and to stage 2's bits on the same N: the gathered copies are the
        # broadcast ones, so the arithmetic is the same.
        for stage in (1, 2, 3):
            for ranks in (2, 3):
                name = f"k2s{stage}n{ranks}"
                cfg = config(tmp, name, stage=stage, gradient_accumulation_steps=2)
                out = os.path.join(tmp, name + ".safetensors")
                summary = summary_of(run(ranks, "train", cfg, "--json", "--export", out), name)
                diff, worst = relative_difference(reference, out)
                loss_diff = abs(summary["last_loss"] - ref_summary["last_loss"]) / abs(ref_summary["last_loss"])
                print(f"K=2, stage {stage}, {ranks} ranks: relative L2 weight difference {diff:.2e} from one batch "
                      f"of 12 rows, last loss rel {loss_diff:.1e}")
                if not diff <= 1e-5 or not loss_diff <= 1e-5:
                    fail(f"K=2 at stage {stage} on {ranks} ranks is not one batch of 12 rows within 1e-5")
                if stage == 3:
                    # ZeRO's formula per update: gradients reduced once, each unit gathered twice in
                    # each of the 2 passes; rank 0's measured bytes printed beside it.
                    params = sum(len(v) for v in weights(reference).values())
                    expected = 4 * params * (ranks - 1) // ranks + 2 * 2 * (4 * params * (ranks - 1) // ranks)
                    per_step = summary["comm_sent_bytes"] / (summary["last_step"] - summary["first_step"])
                    print(f"K=2, stage 3, {ranks} ranks: rank 0 sent {per_step:.0f} B/step, ZeRO formula "
                          f"{summary['comm_formula_bytes_per_step']} B/step")
                    if summary["comm_formula_bytes_per_step"] != expected:
                        fail(f"K=2 stage 3 formula {summary['comm_formula_bytes_per_step']} B, expected {expected} B")
                    if not same_bytes(out, os.path.join(tmp, f"k2s2n{ranks}.safetensors")):
                        fail(f"K=2 at stage 3 on {ranks} ranks differs from K=2 at stage 2 on {ranks} ranks")
                    print(f"K=2, stage 3, {ranks} ranks = K=2, stage 2, {ranks} ranks, bit for bit")
        # grads: device under ZeRO with K=2: each rank's gradients of every unit stay on its device
        # for the update (run/train_plan.h device_grads_offsets) and are reduced from there once;
        # at stages 2 and 3 that trains grads: host's bits (grads: device needs grad_clip 0).
        device_grads = {}
        for stage in (2, 3):
            for grads in ("host", "device"):
                name = f"k2s{stage}g{grads}"
                cfg = config(tmp, name, stage=stage, gradient_accumulation_steps=2,
                             optimizer={"lr": 1.0e-3, "weight_decay": 0.1, "grad_clip": 0.0, "chunk_elements": 20000},
                             placement={"params": "host", "grads": grads, "optimizer": "nvme"})
                out = os.path.join(tmp, name + ".safetensors")
                run(2, "train", cfg, "--export", out)
                device_grads[(stage, grads)] = out
        for stage in (2, 3):
            if not same_bytes(device_grads[(stage, "device")], device_grads[(stage, "host")]):
                fail(f"K=2 at stage {stage} on 2 ranks: grads: device trained other weights than grads: host")
        if not same_bytes(device_grads[(3, "device")], device_grads[(2, "host")]):
            fail("K=2, grads: device at stage 3 differs from grads: host at stage 2")
        print("K=2, 2 ranks, grad_clip 0: grads device = grads host at stages 2 and 3, bit for bit")
        # Stage 3 with K=2 stopped after step 3 (a commit: checkpoint_every 2 and --steps 3) and
        # resumed ends with the bits of the run that never stopped.
        cfg = config(tmp, "k2s3stopped", stage=3, gradient_accumulation_steps=2)
        run(2, "train", cfg, "--steps", "3")
        out = os.path.join(tmp, "k2s3stopped.safetensors")
        run(2, "train", cfg, "--resume", "--export", out)
        if not same_bytes(os.path.join(tmp, "k2s3n2.safetensors"), out):
            fail("K=2 at stage 3: a run stopped after step 3 and resumed differs from one that never stopped")
        print("K=2, stage 3, 2 ranks: stopped after step 3 and resumed = never stopped, bit for bit")
        # Emulated ranks: the device-tensor path (gradients left as sums, device_grad_scale).
        cfg = config(tmp, "k2emulated", stage=2, gradient_accumulation_steps=2,
                     device={"kind": "emulated", "memory": "64MiB"})
        out = os.path.join(tmp, "k2emulated.safetensors")
        run(2, "train", cfg, "--export", out)
        diff, _ = relative_difference(reference, out)
        print(f"K=2, stage 2, 2 emulated ranks: relative L2 weight difference {diff:.2e}")
        if not diff <= 1e-5:
            fail("K=2 on 2 emulated ranks is not one batch of 12 rows within 1e-5")
        # Stage 3 on emulated ranks: the gathers into device buffers, K passes each; the kernels
        # are the CPU's, so it equals the cpu ranks' K=2 stage-3 run bit for bit.
        cfg = config(tmp, "k2s3emulated", stage=3, gradient_accumulation_steps=2,
                     device={"kind": "emulated", "memory": "64MiB"})
        out = os.path.join(tmp, "k2s3emulated.safetensors")
        run(2, "train", cfg, "--export", out)
        if not same_bytes(out, os.path.join(tmp, "k2s3n2.safetensors")):
            diff, worst = relative_difference(os.path.join(tmp, "k2s3n2.safetensors"), out)
            fail(f"K=2, stage 3: 2 emulated ranks differ from 2 cpu ranks (relative L2 {diff:.2e}, largest {worst:.1e})")
        print("K=2, stage 3, 2 emulated ranks = 2 cpu ranks, bit for bit")
    elif CASE == "examples":
        # Masked completion examples (different trained-token counts per rank): the ranks divide by
        # the global count and sum (ZeroStep::set_sum_over_ranks), so 2 ranks at stages 1 and 2, 2
        # emulated ranks (the device-tensor path) and K = 2 on 2 ranks all train what one process
        # training the whole batch does.
        data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
        examples = {"data": {"path": os.path.join(data_dir, "completions.jsonl"), "format": "completion",
                             "tokenizer": os.path.join(data_dir, "bytes-tokenizer")},
                    "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 260, "seq_len": 32,
                              "seed": 7},
                    # Evaluation on the ranks: each evaluates its rows of every held-out batch and
                    # the loss sums and token counts are summed over the ranks.
                    "eval": {"split": 0.25, "every": 2}}
        cfg = config(tmp, "ex-one", batch=4, **examples)
        reference = os.path.join(tmp, "ex-one.safetensors")
        ref_summary = summary_of(run(0, "train", cfg, "--json", "--export", reference), "ex-one")
        # Stage 3: each rank holds a share of the weights; the evaluation's forward gathers them
        # step by step as training's does, and is held to the same 1e-5.
        cases = [("ex-s1n2", 2, {"stage": 1}), ("ex-s2n2", 2, {"stage": 2}), ("ex-s3n2", 2, {"stage": 3}),
                 ("ex-emulated", 2, {"stage": 2, "device": {"kind": "emulated", "memory": "64MiB"}}),
                 ("ex-s3-emulated", 2, {"stage": 3, "device": {"kind": "emulated", "memory": "64MiB"}})]
        for name, ranks, extra in cases:
            cfg = config(tmp, name, batch=4, **examples, **extra)
            out = os.path.join(tmp, name + ".safetensors")
            summary = summary_of(run(ranks, "train", cfg, "--json", "--export", out), name)
            diff, worst = relative_difference(reference, out)
            loss_diff = abs(summary["last_loss"] - ref_summary["last_loss"]) / abs(ref_summary["last_loss"])
            print(f"examples, {name}: relative L2 weight difference {diff:.2e}, last loss "
                  f"{summary['last_loss']:.7f} vs {ref_summary['last_loss']:.7f} (rel {loss_diff:.1e})")
            if not diff <= 1e-5 or not loss_diff <= 1e-5:
                fail(f"examples on {name} are not the 1-process run within 1e-5")
            ours = [(e["step"], e["tokens"], e["eval_loss"]) for e in summary["evaluations"]]
            ref = [(e["step"], e["tokens"], e["eval_loss"]) for e in ref_summary["evaluations"]]
            print(f"examples, {name}: evaluations {ours} vs one process {ref}")
            if [o[:2] for o in ours] != [r[:2] for r in ref] or any(
                    abs(o[2] - r[2]) > 1e-5 * abs(r[2]) for o, r in zip(ours, ref)):
                fail(f"the evaluations on {name} are not the 1-process run's within 1e-5")
        # `strata eval` is one process: on the rank stores of a ZeRO job it refuses in one line
        # naming the key (exit 2) instead of failing to open a store.
        result = run(0, "eval", os.path.join(tmp, "ex-s3n2.yaml"), expect_ok=False)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        if result.returncode != 2 or len(lines) != 1 or "nvme.paths" not in lines[0]:
            fail(f"strata eval on stage-3 rank stores: exit {result.returncode}, expected 2 and one line naming "
                 f"nvme.paths:\n{result.stderr}")
        print("strata eval on rank stores: " + lines[0])
        # K = 2 micro-batches of 4 rows on 2 ranks = one process training batches of 8 rows.
        cfg = config(tmp, "ex-one8", batch=8, **examples)
        reference8 = os.path.join(tmp, "ex-one8.safetensors")
        run(0, "train", cfg, "--export", reference8)
        # And at stage 3: K passes of gathers per update, evaluations between them.
        for stage in (1, 3):
            name = f"ex-k2s{stage}n2"
            cfg = config(tmp, name, batch=4, stage=stage, gradient_accumulation_steps=2, **examples)
            out = os.path.join(tmp, name + ".safetensors")
            run(2, "train", cfg, "--export", out)
            diff, _ = relative_difference(reference8, out)
            print(f"examples, K=2 at stage {stage} on 2 ranks: relative L2 weight difference {diff:.2e} from one "
                  "batch of 8 rows")
            if not diff <= 1e-5:
                fail(f"examples with K=2 at stage {stage} on 2 ranks are not one batch of 8 rows within 1e-5")
    elif CASE == "rerun":
        for stage in (1, 2):
            a, _ = train(tmp, f"a{stage}", 3, stage)
            b, _ = train(tmp, f"b{stage}", 3, stage)
            if not same_bytes(a, b):
                fail(f"stage {stage}: two 3-rank runs differ")
            print(f"stage {stage}: two 3-rank runs are bit-identical")
    elif CASE == "bad":
        def one_line(result, what):
            lines = [l for l in result.stderr.splitlines() if l.strip()]
            if result.returncode == 0 or not any(what in l for l in lines):
                fail(f"expected an error naming {what!r}, got exit {result.returncode}:\n{result.stderr[-2000:]}")
        one_line(run(2, "train", config(tmp, "shared", per_rank=False), expect_ok=False), "nvme.paths")
        one_line(run(2, "train", config(tmp, "odd", batch=5), expect_ok=False), "batch_size")
        cfg = config(tmp, "stage4", stage=4)
        one_line(run(0, "train", cfg, expect_ok=False), "zero_stage")
        # A config error every rank meets is said once, by rank 0.
        result = run(2, "train", config(tmp, "typo", stage=4), expect_ok=False)
        said = [l for l in result.stderr.splitlines() if "zero_stage" in l]
        if result.returncode == 0 or len(said) != 1:
            fail(f"a config error under 2 ranks: expected one line naming zero_stage, got exit {result.returncode}:\n"
                 + result.stderr[-2000:])
        # A store trained at stage 2 is not resumed at stage 3 (its compute copies are whole).
        run(2, "train", config(tmp, "restage", stage=2, steps=2))
        one_line(run(2, "train", config(tmp, "restage", stage=3, steps=3), "--resume", expect_ok=False), "zero_stage")
        # Another N on --resume is no longer refused: it re-slices (tests/zero/test_reslice.py).
        # A per-rank path relative to a config named by its bare file name: the folder is ".".
        cfg = config(tmp, "relative", steps=1, nvme={"paths": ["relative-rank{rank}"]})
        env = MPI_ENV
        result = subprocess.run(MPIRUN + ["-np", "2", STRATA, "train", os.path.basename(cfg)], cwd=tmp,
                                capture_output=True, text=True, timeout=600, env=env)
        if result.returncode != 0 or not all(os.path.isdir(os.path.join(tmp, f"relative-rank{r}", "store"))
                                             for r in (0, 1)):
            fail(f"relative rank{{rank}} paths: exit {result.returncode}:\n{result.stderr[-2000:]}")
        print("bad launches: one line each, non-zero exit")
    elif CASE == "stage3":
        reference, ref_summary = train(tmp, "one", 0)
        # One rank at stage 3 is the single-rank trainer: nothing to partition.
        alone, _ = train(tmp, "s3n1", 0, 3)
        if not same_bytes(reference, alone):
            fail("a plain stage-3 run differs from a plain stage-1 run")
        param_count = sum(len(v) for v in weights(reference).values())
        for ranks in (2, 3):
            out, summary = train(tmp, f"s3n{ranks}", ranks, 3)
            diff, worst = relative_difference(reference, out)
            loss_diff = abs(summary["last_loss"] - ref_summary["last_loss"]) / abs(ref_summary["last_loss"])
            per_step = summary["comm_sent_bytes"] / (summary["last_step"] - summary["first_step"])
            print(f"stage 3, {ranks} ranks: relative L2 weight difference {diff:.2e} (largest element {worst:.1e}), "
                  f"last loss {summary['last_loss']:.7f} vs {ref_summary['last_loss']:.7f} (rel {loss_diff:.1e}); "
                  f"rank 0 sent {per_step:.0f} B/step, ZeRO formula {summary['comm_formula_bytes_per_step']} B/step, "
                  f"{summary['comm_seconds']:.3f} s in collectives")
            if not diff <= TOLERANCE or not loss_diff <= TOLERANCE:
                fail(f"stage 3 on {ranks} ranks is not the 1-rank run within {TOLERANCE}")
            expected = 4 * param_count * 2 * (ranks - 1) // ranks + 4 * param_count * (ranks - 1) // ranks
            if summary["comm_formula_bytes_per_step"] != expected:
                fail(f"stage 3 formula {summary['comm_formula_bytes_per_step']} B, expected {expected} B")
            stage2, _ = train(tmp, f"s2n{ranks}", ranks, 2)
            if not same_bytes(out, stage2):
                fail(f"stage 3 on {ranks} ranks differs from stage 2 on {ranks} ranks")
            stores = [os.path.join(tmp, f"s3n{ranks}", f"rank{r}", "store") for r in range(ranks)]
            again = os.path.join(tmp, f"s3n{ranks}.again.safetensors")
            run(0, "store", "export", *stores, again)
            if not same_bytes(out, again):
                fail("strata store export of the stage-3 rank stores differs from the run's --export")
            # Each rank's store holds its share of the compute copies, not the whole model.
            names, total = set(), 0
            for r, store in enumerate(stores):
                listing = json.loads(run(0, "store", "inspect", store, "--json").stdout)
                params = [t for t in listing["tensors"] if t["name"].startswith("params.")]
                held = sum(t["size_bytes"] for t in params)
                print(f"  rank {r}: {len(params)} params tensors, {held} B of the model's {4 * param_count} B")
                if held >= 4 * param_count:
                    fail(f"rank {r}'s store holds the whole compute copy ({held} B): parameters are replicated")
                if names & {t["name"] for t in params}:
                    fail(f"rank {r}'s store repeats a params tensor another rank holds")
                names |= {t["name"] for t in params}
                total += held
            if total != 4 * param_count:
                fail(f"the rank stores hold {total} B of params, the model is {4 * param_count} B")
        cfg = os.path.join(tmp, "s3n2.yaml")
        result = run(0, "generate", cfg, "--tokens", "2", expect_ok=False)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        if result.returncode == 0 or not any("export" in l for l in lines):
            fail(f"generate on a stage-3 store: expected one line saying to export, got exit {result.returncode}:\n"
                 + result.stderr[-2000:])
        print("generate on a stage-3 rank store: " + lines[-1])
    elif CASE == "stage3_resume":
        a, _ = train(tmp, "a", 3, 3)
        b, _ = train(tmp, "b", 3, 3)
        if not same_bytes(a, b):
            fail("stage 3: two 3-rank runs differ")
        print("stage 3: two 3-rank runs are bit-identical")
        whole, _ = train(tmp, "whole", 2, 3)
        cfg = config(tmp, "stopped", stage=3)
        run(2, "train", cfg, "--steps", "3")
        out = os.path.join(tmp, "stopped.safetensors")
        run(2, "train", cfg, "--resume", "--export", out)
        if not same_bytes(whole, out):
            fail("stage 3: a run stopped after step 3 and resumed differs from one that never stopped")
        print("stage 3: stopped after step 3 and resumed = never stopped, bit for bit")
    elif CASE in ("kill", "kill3"):
        stage = 3 if CASE == "kill3" else 1  # kill3: killed with parameter gathers in flight
        steps = 30  # long enough that rank 1 is still mid-run when it is killed
        reference, _ = train(tmp, "whole", 2, stage, steps=steps)
        cfg = config(tmp, "killed", stage=stage, steps=steps)
        env = MPI_ENV
        job = subprocess.Popen(MPIRUN + ["-np", "2", STRATA, "train", cfg], stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)

        def find_rank_1():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env_text = f.read().split(b"\0")
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                except OSError:
                    continue
                if b"OMPI_COMM_WORLD_RANK=1" in env_text and cfg.encode() in cmd:
                    return int(pid)
            return None

        # Wait for the first global commit (step 2), then SIGKILL rank 1 mid-run.
        lines = []
        while True:
            line = job.stderr.readline()
            if not line:
                fail("the job ended before its first commit:\n" + "".join(lines))
            lines.append(line)
            if "committed" in line:
                break
        victim = find_rank_1()
        if victim is None:
            fail("rank 1's process was not found")
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        try:
            rest = job.communicate(timeout=90)[1]
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            fail("the surviving rank hung after rank 1 was killed")
        took = time.monotonic() - start
        text = "".join(lines) + rest
        if job.returncode == 0:
            fail("the job exited 0 after a rank was killed")
        named = [l for l in text.splitlines() if "rank 1" in l]
        if not named:
            fail("no line names the lost rank:\n" + text[-3000:])
        print(f"rank 1 killed: the job exited {job.returncode} after {took:.1f} s; {named[0].strip()}")
        out = os.path.join(tmp, "resumed.safetensors")
        run(2, "train", cfg, "--resume", "--export", out)
        if not same_bytes(out, reference):
            fail("the resumed run's weights differ from a run that never stopped")
        print("resumed from the last global commit: bit-identical to a run that never stopped")
    elif CASE == "emulated":
        # device.kind: emulated ranks keep gradients and compute copies in device memory and
        # move them by the device-tensor path (train/zero/zero.h) with MPI in NCCL's place; the
        # kernels are the CPU's, so each stage equals the cpu ranks' run bit for bit.
        for stage in (1, 2, 3):
            outs = {}
            for kind in ("cpu", "emulated"):
                name = f"{kind}-s{stage}"
                cfg = config(tmp, name, stage=stage, steps=3, device={"kind": kind, "memory": "16MiB"},
                             # grad_clip 0.05 bites: the clip factor from the global norm (the
                             # device path sums squares on the stream) must agree too.
                             optimizer={"lr": 1.0e-3, "weight_decay": 0.1, "grad_clip": 0.05,
                                        "chunk_elements": 20000})
                outs[kind] = os.path.join(tmp, name + ".safetensors")
                summary = summary_of(run(2, "train", cfg, "--json", "--export", outs[kind]), name)
                if kind == "emulated" and summary["host_to_device_bytes"] == 0:
                    fail(f"stage {stage}: the emulated ranks copied nothing host→device")
            if not same_bytes(outs["cpu"], outs["emulated"]):
                diff, worst = relative_difference(outs["cpu"], outs["emulated"])
                fail(f"stage {stage}: emulated ranks differ from cpu ranks (relative L2 {diff:.2e}, largest {worst:.1e})")
            print(f"stage {stage}, 2 ranks: emulated = cpu, bit for bit")
    else:
        fail("unknown case " + CASE)
