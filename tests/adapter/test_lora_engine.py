#!/usr/bin/python3
# tests/adapter/test_lora_engine.py — LoRA adapters (`adapter:`) across the engine's features,
# through the real binary; each case compares runs that must agree, so a feature that breaks
# adapters shows as a difference. Models: a tiny Llama (GQA, q/k/v biases) and a tiny GPT-2.
#  (placements) dropout 0.1, several targets, bf16 (bf16 base) and fp32 (fp32 base): cpu
#    resident, cpu with everything on NVMe under budgets that force streaming (interleaved
#    clipped updates on and off), and the emulated discrete device (device-site and host-site
#    AdamW) export bit-identical PEFT adapter folders.
#  (frozen_base) over 4 commits (a resume each), every params.<base unit> tensor of the store keeps
#    its extents and checksums from the first commit while every adapter tensor gets new ones, and
#    every NVMe write (--trace, by tensor) is an adapter tensor's, adding up to the metrics' bytes.
#  (resume) 3 steps then --resume to 6 exports the adapters of an uninterrupted 6-step run, bit for
#    bit; resuming with another rank, alpha, dropout or targets, or without the adapter: block, is
#    refused in one line naming the key.
#  (finetune) chat data with loss masks, packing, warmup + cosine, K=2 accumulation, eval split
#    with keep_best: it trains and evaluates, `strata eval` on the adapter store equals the run's
#    last evaluation bit for bit, best/ holds the lowest eval loss's adapters, and K=2 of batch b
#    equals one step of batch 2b (dropout 0 and 0.1) within test_train_loss.py's 1e-5 relative L2.
#  (zero) stages 1 and 2 on 2 MPI ranks export the one-process adapters within test_zero.py's
#    1e-6 relative L2 (dropout 0 and 0.1); the run's ZeRO formula and `strata plan --ranks 2`
#    count the adapters as Ψ (the base is neither reduced nor gathered); stage 3 is refused in one line.
#  (plan) `strata plan --json` on an adapter config: P bytes = base elements × base dtype +
#    adapter elements × precision, gradients = adapter elements × 4, optimizer = adapter
#    elements × 12 (fp32 master, m, v) — nothing for the base —, interleaved clipped updates,
#    and a positive step prediction.
#
# Usage: test_lora_engine.py STRATA_BINARY CASE
import json
import math
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2"))
import test_train as tt  # noqa: E402  (config, strata, safetensors helpers; reads sys.argv[1])
import test_lora_train as lt  # noqa: E402  (the tiny models, base shapes, linear dims)

TOKENIZER = os.path.join(HERE, "..", "data", "bytes-tokenizer")
# Several targets each: attention and MLP, GPT-2's c_proj adapting two linears.
TARGETS = {"llama": ["q_proj", "v_proj", "o_proj", "down_proj"], "gpt2": ["c_attn", "c_proj", "c_fc"]}
# Large enough that tiny budgets cannot hold the base: every step streams it from NVMe.
LLAMA = {**lt.LLAMA, "n_layer": 4, "n_embd": 128, "n_head": 8, "n_kv_head": 4, "head_dim": 16,
         "intermediate_size": 384}
GPT2 = {**lt.GPT2, "n_layer": 4, "n_embd": 128}
MODELS = {"llama": LLAMA, "gpt2": GPT2}


def adapter(arch, precision="bf16", **overrides):
    return {"kind": "lora", "rank": 4, "alpha": 8.0, "dropout": 0.1, "targets": TARGETS[arch],
            "base_dtype": "bf16" if precision == "bf16" else "fp32", **overrides}


def linears_of(arch, targets):
    """The block linears a target list adapts (GPT-2's c_proj is attn's and mlp's)."""
    names = lt.GPT2_LINEARS if arch == "gpt2" else lt.LLAMA_LINEARS
    return [name for name in names if name.split(".")[-1] in targets]


def adapter_elements(model, targets):
    shapes = lt.base_shapes(model)
    total = 0
    for layer in range(model["n_layer"]):
        for linear in linears_of(model["arch"], targets):
            fan_in, fan_out = lt.linear_dims(model, shapes, layer, linear)
            total += 4 * (fan_in + fan_out)  # rank 4: A [4, in], B [out, 4]
    return total


def read(path):
    with open(path, "rb") as f:
        return f.read()


def train(run_dir, *args, **overrides):
    """`strata train` on tt.config(run_dir, **overrides) with args; returns (cfg_path, cfg, summary)."""
    os.makedirs(run_dir, exist_ok=True)
    cfg_path, cfg = tt.config(run_dir, **overrides)
    result = tt.strata("--log-level", "warn", "train", cfg_path, "--json", *args)
    return cfg_path, cfg, json.loads(result.stdout)


def tensors_of(folder):
    """The exported PEFT adapter tensors as fp32 tuples."""
    raw, _ = tt.read_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    return {name: struct.unpack(f"<{len(b) // 4}f", b) for name, b in raw.items()}


def relative_l2(a, b):
    if a.keys() != b.keys():
        tt.fail(f"the exports name different tensors: {sorted(set(a) ^ set(b))[:4]}")
    num = sum((x - y) ** 2 for name in a for x, y in zip(a[name], b[name]))
    den = sum(y * y for name in b for y in b[name])
    return math.sqrt(num / den)


def one_line_refusal(result, needle, what):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    print(f"{what}: exit {result.returncode}: {lines[-1] if lines else ''}")
    if result.returncode != 2 or len(lines) != 1 or needle not in lines[0]:
        tt.fail(f"{what}: expected exit 2 and one line naming {needle!r}, got exit {result.returncode}:\n"
                f"{result.stderr}")


def case_placements(folder):
    tiny = {"device": {"memory": "2MiB"}, "host": {"memory": "1MiB"}}
    nvme = {"params": "nvme", "grads": "nvme", "optimizer": "nvme"}
    variants = [
        ("resident", {"device": {"memory": "256MiB"}, "host": {"memory": "256MiB"},
                      "placement": {"params": "device", "grads": "host", "optimizer": "host"}}),
        ("offloaded", {**tiny, "placement": nvme, "optimizer": {"interleave": True, "chunk_elements": 4096}}),
        ("offloaded-bunched", {**tiny, "placement": nvme, "optimizer": {"interleave": False, "chunk_elements": 4096}}),
        ("emulated", {"device": {"kind": "emulated", "memory": "8MiB"},
                      "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"}}),
        ("emulated-hostopt", {"device": {"kind": "emulated", "memory": "8MiB"},
                              "placement": {"params": "device", "grads": "host", "optimizer": "host"}}),
    ]
    for arch, model in MODELS.items():
        for precision in ("bf16", "fp32"):
            exports = []
            for name, overrides in variants:
                run_dir = os.path.join(folder, f"{arch}-{precision}-{name}")
                overrides = {k: dict(v) for k, v in overrides.items()}
                # grad_clip 0.05 bites every step: the interleaved updates really are deferred.
                optimizer = {"grad_clip": 0.05, **overrides.pop("optimizer", {})}
                out = os.path.join(run_dir, "peft")
                metrics = os.path.join(run_dir, "m.json")
                _, cfg, summary = train(run_dir, "--export", out, "--metrics", metrics, model=model, batch_size=3,
                                        steps=4, precision=precision, checkpoint_every=3, optimizer=optimizer,
                                        adapter=adapter(arch, precision), **overrides)
                with open(metrics) as f:
                    reads = [s["nvme_read_bytes"] for s in json.load(f)["steps"]]
                print(f"{arch} {precision} {name}: loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
                      f"NVMe read per step {reads} B, host→device {summary['host_to_device_bytes']} B")
                # Streaming: every step after the first reads the base again (it does not fit).
                if name.startswith("offloaded") and not all(r > 0 for r in reads[1:]):
                    tt.fail(f"{arch} {precision} {name}: a step read nothing from NVMe: the budgets did not force "
                            "streaming")
                if name.startswith("emulated") and summary["host_to_device_bytes"] == 0:
                    tt.fail(f"{arch} {precision} {name}: nothing crossed host→device: not a discrete device")
                exports.append(read(os.path.join(out, "adapter_model.safetensors")))
            # B starts at zero (PEFT's init): nonzero everywhere means every adapter was trained.
            untrained = [n for n, v in tensors_of(os.path.join(folder, f"{arch}-{precision}-resident", "peft")).items()
                         if n.endswith("lora_B.weight") and not any(v)]
            if untrained:
                tt.fail(f"{arch} {precision}: adapters still zero after 4 steps: {untrained}")
            for (name, _), export in zip(variants[1:], exports[1:]):
                if export != exports[0]:
                    tt.fail(f"{arch} {precision}: the resident and {name} runs exported different adapters")
            print(f"{arch} {precision}: {', '.join(n for n, _ in variants)}: adapters bit-identical "
                  f"({len(exports[0])} bytes)")


def manifest_tensors(store):
    with open(os.path.join(store, "manifest.json")) as f:
        manifest = json.load(f)
    return manifest, manifest["tensors"]


def io_writes(trace_path):
    """{tensor name: bytes} of every NVMe write in a --trace file (its "io write" track)."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    written = {}
    for e in events:
        if e.get("ph") == "X" and tracks.get(e.get("tid")) == "io write":
            written[e["name"]] = written.get(e["name"], 0) + e["args"]["bytes"]
    return written


def case_frozen_base(folder):
    arch, model = "gpt2", GPT2
    run_dir = os.path.join(folder, "run")
    store = os.path.join(run_dir, "nvme", "store")
    snapshots, writes, traced = [], [], {}
    for stop in (1, 2, 3, 4):
        metrics = os.path.join(run_dir, f"m{stop}.json")
        trace = os.path.join(run_dir, f"t{stop}.json")
        args = ["--steps", str(stop), "--metrics", metrics, "--trace", trace] + (["--resume"] if stop > 1 else [])
        train(run_dir, *args, model=model, batch_size=3, steps=4, precision="bf16", checkpoint_every=1,
              device={"memory": "2MiB"}, host={"memory": "2MiB"}, adapter=adapter(arch),
              placement={"params": "nvme", "grads": "host", "optimizer": "nvme"})
        with open(metrics) as f:
            step_writes = [s["nvme_write_bytes"] for s in json.load(f)["steps"]]
        writes += step_writes
        for name, size in io_writes(trace).items():
            traced[name] = traced.get(name, 0) + size
        snapshots.append(manifest_tensors(store))
    first = snapshots[0][1]
    base = [name for name in first if name.startswith("params.") and not name.startswith("params.lora.")]
    adapters = [name for name in first if name.startswith(("params.lora.", "optim.lora."))]
    if not base or not adapters or len(base) + len(adapters) != len(first):
        tt.fail(f"the manifest holds other tensors than the base's P and the adapters' P and state: {sorted(first)}")
    for commit, (manifest, tensors) in enumerate(snapshots[1:], 2):
        if manifest["step"] != commit:
            tt.fail(f"commit {commit}: the manifest says step {manifest['step']}")
        for name in base:
            if tensors[name]["extents"] != first[name]["extents"]:
                tt.fail(f"commit {commit}: the frozen {name} was rewritten: {first[name]['extents']} -> "
                        f"{tensors[name]['extents']}")
        for name in adapters:
            if tensors[name]["extents"] == snapshots[commit - 2][1][name]["extents"]:
                tt.fail(f"commit {commit}: adapter tensor {name} kept its extents: the check would not see a "
                        "rewrite")
    adapter_bytes = sum(first[name]["size_bytes"] for name in adapters)
    base_bytes = sum(first[name]["size_bytes"] for name in base)
    print(f"{len(base)} base tensors ({base_bytes} B) kept their extents and checksums over 4 commits; "
          f"{len(adapters)} adapter tensors ({adapter_bytes} B) rewritten each")
    # Every NVMe write of the 4 steps, by tensor: adapters alone, each once a step at least, and
    # the traced writes are the bytes the metrics count.
    print(f"NVMe written per step {writes}; by tensor over 4 steps {traced}")
    if sorted(traced) != sorted(adapters):
        tt.fail(f"NVMe writes went to {sorted(traced)}, not exactly the adapters' tensors {sorted(adapters)}")
    for name in adapters:
        if traced[name] < 4 * first[name]["size_bytes"] or traced[name] % first[name]["size_bytes"]:
            tt.fail(f"{name} ({first[name]['size_bytes']} B) had {traced[name]} B written over 4 steps: not whole "
                    "writes at least once a step")
    if sum(traced.values()) != sum(writes):
        tt.fail(f"the trace's NVMe writes ({sum(traced.values())} B) are not the metrics' ({sum(writes)} B)")


def case_resume(folder):
    arch, model = "llama", LLAMA
    common = dict(model=model, batch_size=3, steps=6, precision="bf16", checkpoint_every=2,
                  device={"memory": "2MiB"}, host={"memory": "2MiB"},
                  placement={"params": "nvme", "grads": "nvme", "optimizer": "nvme"})
    exports = {}
    for name, stops in (("straight", [6]), ("resumed", [3, 6])):
        run_dir = os.path.join(folder, name)
        out = os.path.join(run_dir, "peft")
        for index, stop in enumerate(stops):
            args = ["--steps", str(stop)] + (["--resume"] if index else []) + (["--export", out] if stop == 6 else [])
            train(run_dir, *args, adapter=adapter(arch), **common)
        exports[name] = read(os.path.join(out, "adapter_model.safetensors"))
    if exports["straight"] != exports["resumed"]:
        tt.fail("3 steps then --resume to 6 exported other adapters than 6 uninterrupted steps")
    print(f"3 steps + resume to 6 = 6 steps, bit for bit ({len(exports['straight'])} bytes of adapters)")
    run_dir = os.path.join(folder, "resumed")
    for key, changed in (("rank", {"rank": 8}), ("alpha", {"alpha": 16.0}), ("dropout", {"dropout": 0.2}),
                         ("targets", {"targets": ["q_proj", "k_proj"]})):
        cfg_path, _ = tt.config(run_dir, adapter=adapter(arch, **changed), **common)
        result = tt.strata("--log-level", "warn", "train", cfg_path, "--resume", "--steps", "7", expect_ok=False)
        one_line_refusal(result, f"'adapter.{key}'", f"resume with another adapter {key}")
    cfg_path, _ = tt.config(run_dir, **common)
    result = tt.strata("--log-level", "warn", "train", cfg_path, "--resume", "--steps", "7", expect_ok=False)
    one_line_refusal(result, "'adapter.kind'", "resume without the adapter: block")


CHAT_TURNS = [("Name a cab color.", "Yellow, about."), ("hi", "ab"), ("2+2?", "4"), ("Say abab.", "abab!"),
              ("Sky color?", "Blue, by day."), ("Count to 3.", "1, 2, 3."), ("A fruit?", "A banana."),
              ("Opposite of up?", "Down."), ("Spell cab.", "c-a-b"), ("Best dab?", "a dab of ab"),
              ("Hello?", "Hello back."), ("Last one.", "Bye.")]


def write_chats(path):
    with open(path, "w") as f:
        for k, (user, assistant) in enumerate(CHAT_TURNS):
            record = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}
            if k % 3 == 0:
                record["system"] = "Be brief."
            f.write(json.dumps(record) + "\n")


def case_finetune(folder):
    chats = os.path.join(folder, "chats.jsonl")
    write_chats(chats)
    model = {**GPT2, "vocab_size": 320, "seq_len": 128, "n_layer": 2}
    data = {"path": chats, "format": "chat", "tokenizer": TOKENIZER, "packing": True}
    schedule = {"warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.1}
    common = dict(model=model, data=data, schedule=schedule, steps=6, precision="fp32", checkpoint_every=1,
                  optimizer={"lr": 3.0e-3, "grad_clip": 1.0})
    # Train with evaluation and keep_best, dropout on.
    run_dir = os.path.join(folder, "eval")
    metrics = os.path.join(run_dir, "m.json")
    cfg_path, _, summary = train(run_dir, "--metrics", metrics, "--export", os.path.join(run_dir, "peft"),
                                 batch_size=2, gradient_accumulation_steps=2, adapter=adapter("gpt2", "fp32"),
                                 eval={"split": 0.25, "every": 1}, checkpoint={"keep_best": True}, **common)
    with open(metrics) as f:
        m = json.load(f)
    steps = m["steps"]
    losses = [s["loss"] for s in steps]
    evals = [s.get("eval_loss") for s in steps]
    lrs = [s["learning_rate"] for s in steps]
    print(f"chat + packing + warmup/cosine + K=2 + eval: losses {[round(x, 4) for x in losses]}, "
          f"eval {evals}, lr {lrs}")
    if len(steps) != 6 or any(e is None for e in evals):
        tt.fail(f"expected 6 steps each with an eval loss: {steps}")
    if not losses[-1] < losses[0] or not evals[-1] < evals[0]:
        tt.fail(f"the adapters did not learn: losses {losses}, eval losses {evals}")
    if lrs[0] != 0.0 or not lrs[1] < lrs[2] or any(a < b for a, b in zip(lrs[2:], lrs[3:])) or not lrs[-1] > 0:
        tt.fail(f"the lrs {lrs} are not a warmup then a cosine decay to min_lr_ratio")
    got = json.loads(tt.strata("--log-level", "warn", "eval", cfg_path, "--json").stdout)
    if got["eval_loss"] != evals[-1] or got["step"] != 6:
        tt.fail(f"strata eval on the adapter store: {got}; the run's last evaluation was {evals[-1]} at step 6")
    best_dir = os.path.join(run_dir, "nvme", "store", "best")
    with open(os.path.join(best_dir, "best.json")) as f:
        best = json.load(f)
    lowest = min(range(len(evals)), key=lambda i: evals[i])
    if best["step"] != lowest + 1 or best["eval_loss"] != evals[lowest]:
        tt.fail(f"best.json {best}: the lowest eval loss was {evals[lowest]} at step {lowest + 1}")
    print(f"strata eval = the last evaluation ({got['eval_loss']}); best {best['step']}: {sorted(os.listdir(best_dir))}")
    # K=2 micro-batches of b rows = one batch of 2b rows, with dropout too: the mask's rows are
    # the update's batch rows, not the micro-batch's (kernels/lora/lora.h, Spec::mask_first_row).
    for dropout in (0.0, 0.1):
        exports = {}
        for name, batch, micro in (("k2", 2, 2), ("one", 4, 1)):
            run_dir = os.path.join(folder, f"{name}-d{dropout}")
            out = os.path.join(run_dir, "peft")
            train(run_dir, "--export", out, batch_size=batch, gradient_accumulation_steps=micro,
                  adapter=adapter("gpt2", "fp32", dropout=dropout), **common)
            exports[name] = tensors_of(out)
        untrained = [n for n, v in exports["one"].items() if n.endswith("lora_B.weight") and not any(v)]
        if untrained:
            tt.fail(f"adapters still zero after 6 steps: {untrained}")
        error = relative_l2(exports["k2"], exports["one"])
        print(f"dropout {dropout}: K=2 × b=2 vs one batch of 4: adapters relative L2 {error:.2e}")
        if error > 1e-5:
            tt.fail(f"dropout {dropout}: K=2 micro-batches of 2 rows trained to adapters {error:.2e} (relative L2) "
                    "from one batch of 4")


def case_zero(folder):
    from zero_runs import run_strata, summary_of
    model = {**GPT2, "n_layer": 2, "n_embd": 64}

    def zero_config(name, stage, dropout, ranks):
        nvme = os.path.join(folder, name, "rank{rank}")
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        cfg = {"model": model, "data": {"path": tt.CORPUS}, "batch_size": 6, "steps": 5,
               "optimizer": {"lr": 1.0e-3, "weight_decay": 0.1, "grad_clip": 1.0, "chunk_elements": 20000},
               "precision": "fp32", "device": {"kind": "cpu", "memory": "64MiB"}, "host": {"memory": "64MiB"},
               "nvme": {"paths": [nvme]}, "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"},
               "checkpoint_every": 2, "adapter": adapter("gpt2", "fp32", dropout=dropout)}
        if ranks:
            cfg["parallel"] = {"zero_stage": stage, "timeout_s": 60}
        path = os.path.join(folder, name + ".yaml")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    for dropout in (0.0, 0.1):
        reference = os.path.join(folder, f"one-d{dropout}-peft")
        summary = summary_of(run_strata(tt.STRATA, 0, "--log-level", "warn", "train",
                                        zero_config(f"one-d{dropout}", 1, dropout, 0), "--json", "--export", reference))
        for stage in (1, 2):
            name = f"s{stage}-d{dropout}"
            out = os.path.join(folder, name + "-peft")
            got = summary_of(run_strata(tt.STRATA, 2, "--log-level", "warn", "train",
                                        zero_config(name, stage, dropout, 2), "--json", "--export", out))
            error = relative_l2(tensors_of(out), tensors_of(reference))
            loss = abs(got["last_loss"] - summary["last_loss"]) / abs(summary["last_loss"])
            print(f"dropout {dropout} stage {stage} on 2 ranks: adapters relative L2 {error:.2e} from one process, "
                  f"last loss rel {loss:.1e}")
            if got["ranks"] != 2:
                tt.fail(f"the summary says {got['ranks']} ranks")
            # ZeRO's formula over what trains (Ψ = the adapters; fp32 compute copies, N = 2):
            # gradients 2·(N−1)/N·4Ψ at stage 1, (N−1)/N·4Ψ at 2, plus the (N−1)/N·4Ψ gathered.
            psi = adapter_elements(model, TARGETS["gpt2"])
            formula = (4 * psi if stage == 1 else 2 * psi) + 2 * psi
            sent = got["comm_sent_bytes"] / (got["last_step"] - got["first_step"])
            print(f"  formula {got['comm_formula_bytes_per_step']} B/step (Ψ = {psi}), rank 0 sent {sent:.0f} B/step")
            if got["comm_formula_bytes_per_step"] != formula:
                tt.fail(f"stage {stage}: the ZeRO formula says {got['comm_formula_bytes_per_step']} B/step, over the "
                        f"adapters' {psi} elements it is {formula}")
            plan = json.loads(tt.strata("--log-level", "warn", "plan", zero_config(name, stage, dropout, 2), "--json",
                                        "--ranks", "2").stdout)["zero"]
            base = sum(math.prod(shape) for shape in lt.base_shapes(model).values())
            if plan["sent_bytes_per_step"] != formula or any(r["params_bytes"] != 4 * (base + psi)
                                                             for r in plan["per_rank"]):
                tt.fail(f"stage {stage}: strata plan --ranks 2 says {plan}; expected {formula} B/step and "
                        f"{4 * (base + psi)} B of compute copy a rank")
            if not error <= 1e-6 or not loss <= 1e-6:
                tt.fail(f"dropout {dropout}: stage {stage} on 2 ranks is not the one-process run within 1e-6")
    refused = run_strata(tt.STRATA, 0, "train", zero_config("s3", 3, 0.0, 2), expect_ok=False)
    one_line_refusal(refused, "zero_stage 3", "adapters with ZeRO stage 3")


def case_plan(folder):
    for arch, model in MODELS.items():
        for precision in ("bf16", "fp32"):
            run_dir = os.path.join(folder, f"{arch}-{precision}")
            os.makedirs(run_dir)
            cfg_path, cfg = tt.config(run_dir, model=model, batch_size=3, steps=4, precision=precision,
                                      device={"memory": "2MiB"}, host={"memory": "2MiB"},
                                      placement={"params": "nvme", "grads": "host", "optimizer": "nvme"},
                                      adapter=adapter(arch, precision))
            plan = json.loads(tt.strata("--log-level", "warn", "plan", cfg_path, "--json").stdout)
            if os.listdir(os.path.join(run_dir, "nvme")):
                tt.fail("strata plan wrote to the NVMe path")
            base_elements = sum(math.prod(shape) for shape in lt.base_shapes(model).values())
            lora_elements = adapter_elements(model, TARGETS[arch])
            size = 2 if precision == "bf16" else 4
            want = {"parameters (compute copy)": base_elements * size + lora_elements * size,
                    "gradients": lora_elements * 4, "optimizer (master, m, v)": lora_elements * 12}
            got = {kind: plan["placement"][kind]["bytes"] for kind in want}
            print(f"{arch} {precision}: base {base_elements} + adapters {lora_elements} elements; plan {got}, "
                  f"predicted step {plan['predicted_step_s']:.4f} s ({plan['bound']}-bound)")
            if got != want:
                tt.fail(f"{arch} {precision}: the plan's bytes {got}, expected {want} (the base is P only)")
            if plan["parameters"] != base_elements + lora_elements:
                tt.fail(f"{arch} {precision}: the plan counts {plan['parameters']} parameters, "
                        f"expected {base_elements} + {lora_elements}")
            # The placements case's interleave on/off comparison means something only if the
            # adapters' clipped updates really are deferred to the next step.
            if not plan["interleaved_updates"]:
                tt.fail(f"{arch} {precision}: clipped adapter updates are not interleaved: {plan}")
            if not plan["predicted_step_s"] > 0 or not plan["compute_s"] > 0:
                tt.fail(f"{arch} {precision}: no step prediction: {plan}")
            text = tt.strata("--log-level", "warn", "plan", cfg_path).stdout
            if "predicted step time" not in text:
                tt.fail(f"the plan's report lacks its prediction:\n{text}")


CASES = {"placements": case_placements, "frozen_base": case_frozen_base, "resume": case_resume,
         "finetune": case_finetune, "zero": case_zero, "plan": case_plan}

if __name__ == "__main__":
    import tempfile
    if os.environ.get("STRATA_TEST_TMPDIR"):
        os.makedirs(os.environ["STRATA_TEST_TMPDIR"], exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR")) as tmp:
        CASES[sys.argv[2]](tmp)
    print("ok")
