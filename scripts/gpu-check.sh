#!/usr/bin/env bash
# One command, the day a GPU is lent: builds with CUDA, runs every CUDA suite, trains the demo
# and a small fp32 config on `cuda` and on `cpu` and compares the exported weights,
# generates greedily from one trained store on both and compares the tokens, runs
# `strata bench overlap`, and two steps of configs/gpt2-xl-offload.yaml with device.kind: cuda
# against its I/O floor and `strata plan`. Prints ONE JSON summary on stdout (progress goes to
# stderr and to gpu-check/ logs). Exit 0 when every check passed, 1 when one failed, 77 (one
# line) when no GPU is visible. Sized for 10 minutes on a 16-core machine: every stage has its
# own time limit, and a stage that runs out is reported as such, not waited for.
#
# Needs what scripts/setup.sh installs (the lent machine has no network: it is not run here)
# and nvcc under /usr/local/cuda/bin or on PATH.
#
# Tolerance of the cuda-vs-cpu weight comparison: after N steps the two runs differ only by
# fp32 rounding in cuBLAS and in reduction order (AdamW itself is bit-exact across backends);
# Adam amplifies that where a gradient is near zero, so the check is on the whole model:
# ||w_cuda − w_cpu||₂ / ||w_cpu||₂ ≤ 1e-3 (max over tensors; a guess until a GPU run calibrates it) and the final losses within 1e-3
# relative. A wrong kernel, a missed gradient or an unordered copy gives errors of 1e-2 and up.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! ls /dev/nvidia[0-9]* > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-check: no GPU visible (no /dev/nvidia0 or nvidia-smi fails): nothing to check here"
  exit 77
fi

export PATH="$PATH:/usr/local/cuda/bin"
out="$root/gpu-check"
rm -rf "$out"
mkdir -p "$out"
log() { echo "gpu-check: $*" >&2; }
declare -A stage_status
fail=0
# run_stage NAME LIMIT_S COMMAND...: runs with a time limit, output to gpu-check/NAME.log.
run_stage() {
  local name=$1 limit=$2
  shift 2
  log "$name (limit ${limit}s)"
  local start=$SECONDS rc=0
  timeout "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
  stage_status[$name]="$rc $((SECONDS - start))"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    fail=1
    log "$name failed (exit $rc): see $out/$name.log"
    tail -5 "$out/$name.log" >&2
  fi
  return "$rc"
}

# 1. Build with CUDA compiled (its own build folder: a CPU-only build/ stays as it is).
run_stage build 300 bash -c "meson setup build-gpu -Dcuda=enabled --buildtype=release > /dev/null && ninja -C build-gpu"
strata="$root/build-gpu/strata"

# 2. Every CUDA suite, and the seam's CPU test beside them.
run_stage cuda_suites 120 meson test -C build-gpu --print-errorlogs gpt2_cuda optim_cuda cuda_device backend_ops backend_cpu

# 3. The same training on cpu and on cuda, weights compared (hostopt*: the CPU AdamW on cuda).
cfg_dir="$out/configs"
mkdir -p "$cfg_dir"
make_config() {  # make_config NAME KIND SOURCE_YAML SED_EXPR...
  local name=$1 kind=$2 source=$3
  shift 3
  mkdir -p "$out/run-$name-$kind"
  sed -e "s|kind: cpu|kind: $kind|" -e "s|paths: \[[^]]*\]|paths: [$out/run-$name-$kind]|" "$@" "$source" \
    > "$cfg_dir/$name-$kind.yaml"
}
for kind in cpu cuda; do
  make_config demo "$kind" configs/demo.yaml
  # small: fp32, gradients on the device, optimizer state on NVMe, no clipping.
  make_config small "$kind" configs/demo.yaml -e 's/precision: bf16/precision: fp32/' \
    -e 's/placement: {[^}]*}/placement: {params: host, grads: device, optimizer: nvme}/' \
    -e 's/grad_clip: 1.0/grad_clip: 0/' -e 's/memory: 16MiB/memory: 64MiB/' -e 's/memory: 24MiB/memory: 96MiB/'
  # hostopt: optimizer state homed on host — on cuda the CPU AdamW updates it (train_plan.h's
  # OptimizerSite::host), with clipping (updates after the global norm); hostopt_overlap: the
  # same without clipping and with gradients on the device, so each update overlaps the next
  # backward. On cpu both are the ordinary in-place path: the reference.
  make_config hostopt "$kind" configs/demo.yaml \
    -e 's/placement: {[^}]*}/placement: {params: nvme, grads: host, optimizer: host}/' -e 's/memory: 24MiB/memory: 96MiB/'
  make_config hostopt_overlap "$kind" configs/demo.yaml \
    -e 's/placement: {[^}]*}/placement: {params: host, grads: device, optimizer: host}/' \
    -e 's/grad_clip: 1.0/grad_clip: 0/' -e 's/memory: 16MiB/memory: 64MiB/' -e 's/memory: 24MiB/memory: 96MiB/'
done
for name in demo small hostopt hostopt_overlap; do
  for kind in cpu cuda; do
    run_stage "train_${name}_$kind" 120 "$strata" train "$cfg_dir/$name-$kind.yaml" --steps 20 \
      --export "$out/$name-$kind.safetensors" --metrics "$out/$name-$kind.metrics.json"
  done
done

# 3b. Generation: N tokens, greedy, from the SAME trained store (demo: bf16 weights, small:
# fp32) on cpu and on cuda; the tokens must be the same (compared in the summary). The cuda
# config is the cpu one with only device.kind changed, so both read run-NAME-cpu's store.
# `strata generate --json` gives the tokens, not the logits: the first pass's logits are held
# to 1e-5 by backend_ops' DecodeParity (stage 2), not here.
gen_tokens=32
for name in demo small; do
  sed -e "s|kind: cpu|kind: cuda|" "$cfg_dir/$name-cpu.yaml" > "$cfg_dir/gen-$name-cuda.yaml"
  for kind in cpu cuda; do
    gen_cfg="$cfg_dir/$name-cpu.yaml"
    [ "$kind" = cuda ] && gen_cfg="$cfg_dir/gen-$name-cuda.yaml"
    # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
    run_stage "generate_${name}_$kind" 120 bash -c \
      '"$0" generate "$1" --prompt-ids 1,2,3,4,5 --tokens "$2" --temperature 0 --json > "$3"' \
      "$strata" "$gen_cfg" "$gen_tokens" "$out/generate-$name-$kind.json"
  done
done

# 4. The overlap benchmark (NVMe reads overlapping compute through the scheduler).
run_stage bench_overlap 120 "$strata" bench overlap --device cuda --dir "$out/overlap" --json

# 5. GPT-2 XL, two steps on cuda, with the plan's prediction for the same config.
make_config xl cuda configs/gpt2-xl-offload.yaml
run_stage plan_xl 120 "$strata" plan "$cfg_dir/xl-cuda.yaml" --json
run_stage train_xl 300 "$strata" train "$cfg_dir/xl-cuda.yaml" --steps 2 --metrics "$out/xl-cuda.metrics.json"

# One JSON summary.
python3 - "$out" "$fail" <<'PY' "${!stage_status[@]}" -- "${stage_status[@]}"
import json, math, os, struct, sys
from array import array

out, failed = sys.argv[1], int(sys.argv[2])
rest = sys.argv[3:]
split = rest.index("--")
names, values = rest[:split], rest[split + 1:]
stages = {n: {"exit": int(v.split()[0]), "seconds": int(v.split()[1])} for n, v in zip(names, values)}

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    result = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a = array("f")
        a.frombytes(data[e["data_offsets"][0]:e["data_offsets"][1]])
        result[name] = a
    return result

summary = {"stages": stages, "compare": {}}
for name in ("demo", "small", "hostopt", "hostopt_overlap"):
    cpu_path, cuda_path = f"{out}/{name}-cpu.safetensors", f"{out}/{name}-cuda.safetensors"
    if not (os.path.exists(cpu_path) and os.path.exists(cuda_path)):
        summary["compare"][name] = {"ok": False, "why": "a run did not export"}
        failed = 1
        continue
    cpu, cuda = tensors(cpu_path), tensors(cuda_path)
    worst, worst_name = 0.0, ""
    for t, w in cpu.items():
        diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(cuda[t], w)))
        norm = math.sqrt(sum(b * b for b in w)) or 1.0
        if diff / norm > worst:
            worst, worst_name = diff / norm, t
    m_cpu, m_cuda = load(f"{out}/{name}-cpu.metrics.json"), load(f"{out}/{name}-cuda.metrics.json")
    loss_cpu = m_cpu["summary"]["last_loss"] if m_cpu else float("nan")
    loss_cuda = m_cuda["summary"]["last_loss"] if m_cuda else float("nan")
    loss_rel = abs(loss_cuda - loss_cpu) / abs(loss_cpu) if m_cpu and m_cuda else float("inf")
    ok = worst <= 1e-3 and loss_rel <= 1e-3
    failed |= not ok
    summary["compare"][name] = {"ok": ok, "max_tensor_rel_l2": worst, "worst_tensor": worst_name,
                                "loss_cpu": loss_cpu, "loss_cuda": loss_cuda, "loss_rel": loss_rel,
                                "tokens_per_s_cpu": m_cpu["summary"]["tokens_per_s"] if m_cpu else None,
                                "tokens_per_s_cuda": m_cuda["summary"]["tokens_per_s"] if m_cuda else None,
                                "tolerance": {"max_tensor_rel_l2": 1e-3, "loss_rel": 1e-3}}

summary["generate"] = {}
for name in ("demo", "small"):
    g_cpu, g_cuda = load(f"{out}/generate-{name}-cpu.json"), load(f"{out}/generate-{name}-cuda.json")
    if not g_cpu or not g_cuda:
        summary["generate"][name] = {"ok": False, "why": "a generate run gave no JSON"}
        failed = 1
        continue
    first_diff = next((i for i, (a, b) in enumerate(zip(g_cpu["tokens"], g_cuda["tokens"])) if a != b), None)
    ok = g_cpu["tokens"] == g_cuda["tokens"]
    failed |= not ok
    summary["generate"][name] = {"ok": ok, "tokens": len(g_cpu["tokens"]), "first_differing_token": first_diff,
                                 "tokens_cpu": g_cpu["tokens"], "tokens_cuda": g_cuda["tokens"],
                                 "tokens_per_s_cpu": g_cpu.get("tokens_per_s"),
                                 "tokens_per_s_cuda": g_cuda.get("tokens_per_s")}

overlap_log = f"{out}/bench_overlap.log"
if os.path.exists(overlap_log):
    lines = [l for l in open(overlap_log) if l.startswith("{")]
    summary["bench_overlap"] = json.loads(lines[-1]) if lines else None

plan_lines = [l for l in open(f"{out}/plan_xl.log")] if os.path.exists(f"{out}/plan_xl.log") else []
plan = next((json.loads(l) for l in reversed(plan_lines) if l.startswith("{")), None)
xl = load(f"{out}/xl-cuda.metrics.json")
summary["xl"] = {
    "step_seconds": [s["seconds"] for s in xl["steps"]] if xl else None,
    "stall_seconds": [s["stall_seconds"] for s in xl["steps"]] if xl else None,
    "predicted_step_seconds": xl["summary"]["predicted_step_seconds"] if xl else None,
    "predicted_io_floor_seconds": xl["summary"]["predicted_io_seconds"] if xl else None,
    "plan": plan.get("prediction", plan) if isinstance(plan, dict) else None,
}
summary["ok"] = not failed
print(json.dumps(summary, indent=1))
sys.exit(1 if failed else 0)
PY
