#!/usr/bin/python3
# tests/engine/test_train_loss.py — issue 30's loss and update keys, end to end through the real
# binary: (schedule) every step's lr in the metrics equals Hugging Face's schedule formulas
# (written out below from transformers.optimization, stepped by torch's LambdaLR) for each decay,
# warmup and min_lr_ratio, and the lr really drives the update (a warmup's first update, lr 0,
# leaves the weights as optimizer.lr 0 does); a schedule whose λ is 1 throughout exports the
# bytes of a run without one. (resume) a scheduled run stopped at a commit and resumed reports
# the uninterrupted run's lrs and losses and exports its bytes. (accumulation) K micro-batches
# of B rows train to the weights of one batch of K·B rows (relative L2 ≤ 1e-5, exported weights)
# for GPT-2 and Llama, resident and offloaded, clipped and not; gradient_accumulation_steps: 1
# is bit-identical to leaving it out; the emulated discrete device (and its host-site AdamW)
# accumulates bit-identically to the cpu; grads: device with K=2 (every unit's gradients held on
# the device for the update) exports grads: host's bytes on cpu and emulated, and a device too
# small for them is refused in one line naming device.memory; a K=4 trace updates each unit once
# a step and moves the optimizer state at most once a step each way. (bad_input) the combinations
# that are refused are one line naming the key.
#
# Usage: test_train_loss.py STRATA_BINARY CASE
import json
import math
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as tt  # noqa: E402  (config, strata, safetensors helpers; reads sys.argv[1])

LLAMA = {"arch": "llama", "n_layer": 2, "n_head": 6, "n_kv_head": 3, "head_dim": 16, "n_embd": 80,
         "intermediate_size": 112, "vocab_size": 256, "seq_len": 16, "rope_theta": 10000.0,
         "norm_eps": 1.0e-5, "init": "random", "seed": 7}


# --- Hugging Face's lr lambdas (transformers/optimization.py), written out ---------------------
def hf_constant_with_warmup(step, warmup):
    if step < warmup:
        return float(step) / float(max(1.0, warmup))
    return 1.0


def hf_linear_with_warmup(step, warmup, total):
    if step < warmup:
        return float(step) / float(max(1, warmup))
    return max(0.0, float(total - step) / float(max(1, total - warmup)))


def hf_cosine_with_warmup(step, warmup, total, num_cycles=0.5):
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def hf_cosine_with_min_lr(step, warmup, total, min_lr_rate, num_cycles=0.5):
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    factor = factor * (1 - min_lr_rate) + min_lr_rate
    return max(0, factor)


def linear_with_min_lr(step, warmup, total, min_lr_rate):
    """docs/train.md: the linear decay blended toward min_lr_ratio as the cosine one is."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    factor = max(0.0, float(total - step) / float(max(1, total - warmup)))
    return max(0, factor * (1 - min_lr_rate) + min_lr_rate)


def lambda_lr_values(base_lr, lr_lambda, steps):
    """The lr each optimizer.step() sees under torch's LambdaLR, scheduler.step() after each."""
    import torch
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    values = []
    for _ in range(steps):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


def tiny(run_dir, **overrides):
    """A small fp32 GPT-2, resident on the CPU device; overrides replace or merge sections."""
    base = dict(model={"n_layer": 1, "seq_len": 16}, batch_size=2, steps=12, precision="fp32",
                placement={"params": "device", "grads": "host", "optimizer": "host"}, checkpoint_every=100)
    base.update(overrides)
    return tt.config(run_dir, **base)


def metrics_of(path):
    with open(path) as f:
        return json.load(f)["steps"]


def case_schedule(folder):
    lr, total = 1.0e-3, 12
    cases = [
        ("constant", {"warmup_steps": 3, "decay": "constant"}, lambda s: hf_constant_with_warmup(s, 3)),
        ("linear", {"warmup_steps": 4, "decay": "linear"}, lambda s: hf_linear_with_warmup(s, 4, total)),
        ("cosine", {"warmup_steps": 2, "decay": "cosine"}, lambda s: hf_cosine_with_warmup(s, 2, total)),
        ("cosine-min", {"warmup_steps": 3, "decay": "cosine", "min_lr_ratio": 0.1},
         lambda s: hf_cosine_with_min_lr(s, 3, total, 0.1)),
        ("linear-min", {"warmup_steps": 0, "decay": "linear", "min_lr_ratio": 0.25},
         lambda s: linear_with_min_lr(s, 0, total, 0.25)),
        # Warmup longer than the run: HF's max(1, T − W) keeps it finite.
        ("cosine-long-warmup", {"warmup_steps": 20, "decay": "cosine"}, lambda s: hf_cosine_with_warmup(s, 20, total)),
    ]
    for name, schedule, lr_lambda in cases:
        run_dir = os.path.join(folder, name)
        os.makedirs(run_dir)
        cfg_path, _ = tiny(run_dir, steps=total, optimizer={"lr": lr}, schedule=schedule)
        metrics = os.path.join(run_dir, "m.json")
        result = tt.strata("train", cfg_path, "--metrics", metrics)
        got = [step["learning_rate"] for step in metrics_of(metrics)]
        want = lambda_lr_values(lr, lr_lambda, total)
        if got != want:
            tt.fail(f"{name}: strata's lrs {got} are not LambdaLR's {want}")
        if f"lr {want[-1]:.3e}" not in result.stderr:
            tt.fail(f"{name}: the progress line does not show the last step's lr {want[-1]:.3e}:\n{result.stderr}")
        print(f"{name}: {total} lrs equal HF's formulas under LambdaLR bit for bit "
              f"({', '.join(f'{v:.3g}' for v in got[:5])}, …)")

    # The lr drives the update: a warmup's update 0 has lr 0, so it leaves the weights where
    # optimizer.lr 0 does — and a plain lr does not.
    exports = {}
    for name, overrides in (("warmup", {"schedule": {"warmup_steps": 5, "decay": "linear"}}),
                            ("lr0", {"optimizer": {"lr": 0.0}}), ("plain", {})):
        run_dir = os.path.join(folder, "first-" + name)
        os.makedirs(run_dir)
        cfg_path, _ = tiny(run_dir, steps=1, **overrides)
        out = os.path.join(run_dir, "w.safetensors")
        tt.strata("train", cfg_path, "--export", out)
        with open(out, "rb") as f:
            exports[name] = f.read()
    if exports["warmup"] != exports["lr0"]:
        tt.fail("a warmup's first update (lr 0) changed the weights")
    if exports["plain"] == exports["lr0"]:
        tt.fail("an update with lr 1e-3 left the weights as they were: the check above proves nothing")

    # λ = 1 throughout (constant, no warmup): the bytes of a run without a schedule.
    exports = []
    for name, overrides in (("none", {}), ("flat", {"schedule": {"warmup_steps": 0, "decay": "constant"}})):
        run_dir = os.path.join(folder, "flat-" + name)
        os.makedirs(run_dir)
        cfg_path, _ = tiny(run_dir, steps=4, **overrides)
        out = os.path.join(run_dir, "w.safetensors")
        tt.strata("train", cfg_path, "--export", out)
        with open(out, "rb") as f:
            exports.append(f.read())
    if exports[0] != exports[1]:
        tt.fail("a constant schedule without warmup exported different weights from no schedule")
    print("a warmup's lr-0 update leaves the weights; λ ≡ 1 is bit-identical to no schedule")


def case_resume(folder):
    """A cosine schedule stopped at a commit (step 4 of 10) and resumed: the same lrs, losses
    and exported bytes as the uninterrupted run."""
    results = {}
    for name, stops in (("whole", [10]), ("resumed", [4, 10])):
        run_dir = os.path.join(folder, name)
        os.makedirs(run_dir)
        cfg_path, _ = tiny(run_dir, steps=10, checkpoint_every=4,
                           placement={"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
                           schedule={"warmup_steps": 3, "decay": "cosine", "min_lr_ratio": 0.05})
        out = os.path.join(run_dir, "w.safetensors")
        lrs, losses = [], []
        for index, stop in enumerate(stops):
            metrics = os.path.join(run_dir, "m.json")
            args = ["train", cfg_path, "--steps", str(stop), "--metrics", metrics]
            if index > 0:
                args.append("--resume")
            if stop == stops[-1]:
                args += ["--export", out]
            tt.strata(*args)
            steps = metrics_of(metrics)
            lrs += [s["learning_rate"] for s in steps]
            losses += [s["loss"] for s in steps]
        with open(out, "rb") as f:
            results[name] = (lrs, losses, f.read())
    whole, resumed = results["whole"], results["resumed"]
    if len(whole[0]) != 10 or whole[0] != resumed[0]:
        tt.fail(f"the resumed run's lrs {resumed[0]} differ from the uninterrupted run's {whole[0]}")
    want = lambda_lr_values(1.0e-3, lambda s: hf_cosine_with_min_lr(s, 3, 10, 0.05), 10)
    if whole[0] != want:
        tt.fail(f"lrs {whole[0]} are not LambdaLR's {want}")
    if whole[1] != resumed[1] or whole[2] != resumed[2]:
        tt.fail("a scheduled run stopped at step 4 and resumed differs from the uninterrupted run")
    print(f"stopped at 4 and resumed = uninterrupted: 10 lrs, losses and {len(whole[2])} exported bytes")


def weights_of(path):
    tensors, _ = tt.read_safetensors(path)
    return {name: struct.unpack(f"<{len(raw) // 4}f", raw) for name, raw in tensors.items()}


def relative_l2(a, b):
    diff = sum((x - y) ** 2 for name in a for x, y in zip(a[name], b[name]))
    ref = sum(y * y for name in b for y in b[name])
    return math.sqrt(diff / ref)


def case_accumulation(folder):
    """K micro-batches of B rows = one batch of K·B rows (the data order makes them read the
    same windows, data/token_stream.h), within fp32 rounding of the summed gradients."""
    offloaded = {"device": {"memory": "6MiB"}, "host": {"memory": "6MiB"},
                 "placement": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"},
                 "optimizer": {"chunk_elements": 4096}}
    resident = {"placement": {"params": "device", "grads": "host", "optimizer": "host"}}
    models = (("gpt2", {"n_layer": 2, "seq_len": 16}), ("llama", LLAMA))
    worst = 0.0
    for model_name, model in models:
        for placement_name, placement in (("resident", resident), ("offloaded", offloaded)):
            for clip in (1.0, 0.0):
                exports, losses = {}, {}
                for name, batch, micro in (("one-batch", 4, None), ("k1", 4, 1), ("k2", 2, 2), ("k4", 1, 4)):
                    run_dir = os.path.join(folder, f"{model_name}-{placement_name}-clip{clip}-{name}")
                    os.makedirs(run_dir)
                    overrides = {key: dict(value) for key, value in placement.items()}
                    overrides["optimizer"] = {**overrides.get("optimizer", {}), "grad_clip": clip}
                    if micro is not None:
                        overrides["gradient_accumulation_steps"] = micro
                    cfg_path, _ = tt.config(run_dir, model=model, batch_size=batch, steps=4, precision="fp32",
                                            checkpoint_every=3, **overrides)
                    out = os.path.join(run_dir, "w.safetensors")
                    metrics = os.path.join(run_dir, "m.json")
                    tt.strata("train", cfg_path, "--export", out, "--metrics", metrics)
                    with open(out, "rb") as f:
                        exports[name] = f.read()
                    losses[name] = [s["loss"] for s in metrics_of(metrics)]
                    if micro is not None and micro > 1:
                        error = relative_l2(weights_of(out), weights_of(os.path.join(
                            folder, f"{model_name}-{placement_name}-clip{clip}-one-batch", "w.safetensors")))
                        worst = max(worst, error)
                        loss_error = max(abs(a - b) / abs(b) for a, b in zip(losses[name], losses["one-batch"]))
                        print(f"{model_name} {placement_name} clip {clip} K={micro}×B={batch}: weights rel L2 "
                              f"{error:.2e}, losses rel {loss_error:.2e}")
                        if error > 1e-5:
                            tt.fail(f"{model_name} {placement_name} clip {clip}: K={micro} micro-batches of {batch} "
                                    f"rows trained to weights {error:.2e} (relative L2) from one batch of 4")
                        if loss_error > 1e-5:
                            tt.fail(f"{model_name} {placement_name} clip {clip}: K={micro} reported losses "
                                    f"{losses[name]}, one batch {losses['one-batch']}")
                if exports["k1"] != exports["one-batch"] or losses["k1"] != losses["one-batch"]:
                    tt.fail(f"{model_name} {placement_name} clip {clip}: gradient_accumulation_steps: 1 is not "
                            "bit-identical to leaving it out")
    print(f"K×B = one batch of K·B everywhere (worst relative L2 {worst:.2e}); K=1 bit-identical")

    # The discrete-device path (device.kind: emulated: staging, and with optimizer: host the
    # host-site AdamW that CUDA runs) accumulates as the CPU device does, bit for bit.
    for optimizer_home in ("host", "nvme"):
        exports = {}
        for kind in ("cpu", "emulated"):
            run_dir = os.path.join(folder, f"{kind}-{optimizer_home}")
            os.makedirs(run_dir)
            cfg_path, _ = tt.config(run_dir, model={"n_layer": 2, "seq_len": 16}, batch_size=2, steps=4,
                                    precision="bf16", gradient_accumulation_steps=2, checkpoint_every=3,
                                    device={"kind": kind, "memory": "64MiB"},
                                    placement={"params": "nvme", "grads": "host", "optimizer": optimizer_home})
            out = os.path.join(run_dir, "w.safetensors")
            tt.strata("train", cfg_path, "--export", out)
            with open(out, "rb") as f:
                exports[kind] = f.read()
        if exports["cpu"] != exports["emulated"]:
            tt.fail(f"K=2 with optimizer: {optimizer_home}: the emulated device trained other weights than the cpu")
    print("K=2: device.kind emulated (optimizer host and nvme) = cpu, bit for bit")

    # grads: device with K > 1: every unit's gradients stay on the device for the whole update
    # (run/train_plan.h device_grads_offsets) and the K passes sum into them there. Where they
    # live changes no arithmetic: the exports are grads: host's bytes, on the cpu device and on
    # the emulated discrete device (whose gradients then never cross to the host), and both
    # kinds train the same bytes.
    exports = {}
    for kind in ("cpu", "emulated"):
        for grads in ("host", "device"):
            run_dir = os.path.join(folder, f"grads-{grads}-{kind}")
            os.makedirs(run_dir)
            cfg_path, _ = tt.config(run_dir, model={"n_layer": 2, "seq_len": 16}, batch_size=2, steps=4,
                                    precision="bf16", gradient_accumulation_steps=2, checkpoint_every=3,
                                    device={"kind": kind, "memory": "64MiB"},
                                    optimizer={"grad_clip": 0.0, "chunk_elements": 4096},
                                    placement={"params": "host", "grads": grads, "optimizer": "nvme"})
            out = os.path.join(run_dir, "w.safetensors")
            summary = json.loads(tt.strata("train", cfg_path, "--export", out, "--json").stdout)
            with open(out, "rb") as f:
                exports[(kind, grads)] = f.read()
            if kind == "emulated":
                print(f"K=2, grads: {grads}, emulated: {summary['device_to_host_bytes']} bytes device→host")
    for kind in ("cpu", "emulated"):
        if exports[(kind, "device")] != exports[(kind, "host")]:
            tt.fail(f"K=2 on {kind}: grads: device trained other weights than grads: host")
    if exports[("emulated", "device")] != exports[("cpu", "device")]:
        tt.fail("K=2, grads: device: the emulated device trained other weights than the cpu")
    print("K=2: grads device = grads host, bit for bit, on cpu and emulated (and emulated = cpu)")
    # The gradients of the whole model must then fit the device beside one step: a 1 MiB emulated
    # device trains a 4-layer model with K = 1 (one block's gradients at a time) and refuses K = 2
    # before any work, in one line naming the key and the gradients.
    for micro in (1, 2):
        run_dir = os.path.join(folder, f"grads-device-1MiB-k{micro}")
        os.makedirs(run_dir)
        cfg_path, _ = tt.config(run_dir, model={"n_layer": 4, "seq_len": 16}, batch_size=2, steps=2,
                                precision="bf16", gradient_accumulation_steps=micro,
                                device={"kind": "emulated", "memory": "1MiB"},
                                optimizer={"grad_clip": 0.0, "chunk_elements": 4096},
                                placement={"params": "host", "grads": "device", "optimizer": "nvme"})
        result = tt.strata("train", cfg_path, expect_ok=micro == 1)
        if micro == 2:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            if result.returncode != 2 or len(lines) != 1 or "device.memory" not in lines[0] or \
                    "gradients" not in lines[0]:
                tt.fail(f"K=2, grads: device on 1 MiB: expected one line naming device.memory and the gradients, "
                        f"exit 2; got {result.returncode}:\n{result.stderr}")
            print(f"K=2, grads: device on 1 MiB: {lines[0]}")

    # Offloaded optimizer state is read and written once per update, not per micro-batch: in
    # the trace of a K=4 run, each unit's update computes once a step and its state crosses
    # the NVMe tracks at most once each way a step.
    run_dir = os.path.join(folder, "trace")
    os.makedirs(run_dir)
    steps = 5
    cfg_path, _ = tt.config(run_dir, model={"n_layer": 2, "seq_len": 16}, batch_size=1, steps=steps,
                            precision="bf16", checkpoint_every=100, gradient_accumulation_steps=4, **offloaded)
    trace_path = os.path.join(run_dir, "trace.json")
    tt.strata("train", cfg_path, "--trace", trace_path)
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    counts = {}
    for e in events:
        if e.get("ph") == "X":
            key = (tracks.get(e.get("tid")), e.get("name", "").split(".mb")[0])
            counts[key] = counts.get(key, 0) + 1
    updates = {name: n for (track, name), n in counts.items() if track == "compute" and name.startswith("opt.")}
    forwards = counts.get(("compute", "fwd.h.0"), 0)
    if not updates or any(n != steps for n in updates.values()) or forwards != 4 * steps:
        tt.fail(f"expected each update once a step and 4 forwards a step over {steps} steps: updates {updates}, "
                f"fwd.h.0 {forwards}")
    moved = {key: n for key, n in counts.items() if key[0] in ("io", "io write") and key[1].startswith("optim.")}
    if not moved or any(n > steps for n in moved.values()):
        tt.fail(f"optimizer state moved more than once a step each way: {moved}")
    print(f"K=4: {len(updates)} units updated once a step ({forwards} forwards of h.0 in {steps} steps); "
          f"optimizer state I/O per tensor and direction ≤ {steps}: {sorted(set(moved.values()))}")


def case_bad_input(folder):
    cases = [
        ("zero-k", dict(gradient_accumulation_steps=0), "gradient_accumulation_steps"),
        ("min-lr-constant", dict(schedule={"decay": "constant", "min_lr_ratio": 0.1}), "min_lr_ratio"),
        ("bad-decay", dict(schedule={"decay": "exponential"}), "decay"),
        ("ratio-range", dict(schedule={"decay": "cosine", "min_lr_ratio": 1.5}), "min_lr_ratio"),
        ("unknown-key", dict(schedule={"warmup": 3}), "warmup"),
    ]
    for name, overrides, key in cases:
        run_dir = os.path.join(folder, name)
        os.makedirs(run_dir)
        cfg_path, _ = tiny(run_dir, **overrides)
        result = tt.strata("train", cfg_path, expect_ok=False)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        if result.returncode not in (1, 2) or len(lines) != 1 or key not in lines[0]:
            tt.fail(f"{name}: expected one line naming '{key}' and exit 1 or 2, got {result.returncode}:\n"
                    f"{result.stderr}")
        print(f"{name}: {lines[0]}")


CASES = {"schedule": case_schedule, "resume": case_resume, "accumulation": case_accumulation,
         "bad_input": case_bad_input}

if __name__ == "__main__":
    scratch_root = os.environ.get("STRATA_TEST_TMPDIR", tempfile.gettempdir())
    os.makedirs(scratch_root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"train-loss-{sys.argv[2]}-", dir=scratch_root) as tmp:
        CASES[sys.argv[2]](tmp)
    print(f"{sys.argv[2]}: ok")
