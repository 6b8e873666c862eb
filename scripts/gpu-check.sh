#!/usr/bin/env bash
# The GPU check, run from the unpacked bundle (scripts/gpu-bundle.sh) on a bare lent machine:
# it needs the bundle, the NVIDIA driver, and cuBLAS / NCCL / PyTorch from the machine — no
# build, no meson, no network. It proves, in order of value, each stage with its own time limit
# and all of them inside a 380 s budget (≤ 7 minutes with the comparisons, on 16 cores, one GPU):
#   a. the CUDA suites (GPT-2 and Llama kernels, the optimizer, the CUDA device, op parity of
#      every op against the CPU backend, a real NCCL all-reduce on one GPU);
#   b. the same training on cpu and on cuda (GPT-2 demo, fp32, chat fine-tuning, QLoRA adapters
#      over an NF4 base), exported weights compared per tensor, and greedy
#      generation from one trained store on both, tokens compared with a near-tie rule;
#   c. ZeRO-Offload's placements (optimizer state on the host, updated by the CPU AdamW), cpu
#      against cuda the same way;
#   d. `strata bench overlap --device cuda` (NVMe reads overlapping device compute);
#   e. Llama 1B (configs/llama-1b-offload.yaml), two steps on cuda, against `strata plan`'s
#      prediction and its I/O floor;
#   f. pinned host↔device copies: a plain cudaMemcpy loop (PyTorch), beside what strata's copies
#      moved per second over the Llama run's last step (an average: a floor, not the peak);
#   g. GEMM: strata's measured block compute at Llama 1B's shape against cuBLAS's own SGEMM at the
#      same shapes (torch.matmul, TF32 off as strata's pedantic math).
# Each finished stage appends one JSON line to OUT_DIR/stages.jsonl at once (a kill still leaves
# every finished stage); the summary (OUT_DIR/summary.json) is printed last on stdout. Progress
# goes to stderr, each stage's output to OUT_DIR/logs/. Large files (stores, exports) go to
# $GPU_CHECK_WORK (default /tmp/strata-gpu-check), never to OUT_DIR.
#
#   strata-gpu/gpu-check.sh [OUT_DIR]        (default OUT_DIR: ./gpu-check)
#
# Exit 0 when every stage passed, 1 when one failed, 77 (one line, in a few seconds) when no GPU
# is visible: no /dev/nvidia*, nvidia-smi missing or failing, or a CUDA device count of 0
# (`strata devices`). Any other CUDA or NCCL error is a failure, never a skip.
#
# Tolerances of the cpu-vs-cuda weight comparison (per tensor: ||w_cuda − w_cpu||₂ / ||w_cpu||₂,
# any NaN or Inf a failure). The two runs differ only by fp32 rounding in cuBLAS (pedantic, no
# TF32) and in reduction order — AdamW's element-wise update is the same code on both. fp32
# weights: the roundoff (~1e-6 relative per GEMM) is amplified by Adam only where a gradient is
# near zero, so after 20 steps a tensor stays within 1e-3. bf16 compute copies: a one-ulp
# difference in a rounded copy is 2^-8 ≈ 4e-3 of that element, and it feeds the next step, so
# 2e-2. A wrong kernel, a missed gradient or an unordered copy gives 1e-1 and more. The final
# losses must agree within the same figure. These are reasoned, not yet calibrated on a GPU: the
# JSON carries the measured worst so the first run can tighten them.
# Near-tie rule for greedy generation: the token streams must be equal up to their first
# difference, and that difference is accepted only where the cpu run's best two logits were
# within a margin (`strata generate --json` gives top2_margins): 0.05 for bf16 weights (their
# rounding moves a logit of magnitude ~10 by ~0.04), 0.01 for fp32. After it the prefixes differ
# and nothing more is compared.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# The bundle's layout (strata-gpu/{bin,configs,data}), or a source tree whose build-gpu-bundle/
# scripts/gpu-bundle.sh has built.
if [ -x "$here/bin/strata" ]; then
  bin="$here/bin"
  configs="$here/configs"
  text="$here/data/GPL-3"
else
  root=$(cd "$here/.." && pwd)
  bin="$root/build-gpu-bundle"
  configs="$root/configs"
  text=/usr/share/common-licenses/GPL-3
fi
strata=$(ls "$bin/strata" 2> /dev/null)
program() {  # program NAME: a test program, in bin/ (bundle) or in its build folder
  if [ -x "$bin/$1" ]; then echo "$bin/$1"; else find "$bin/tests" -name "$1" -type f 2> /dev/null | head -1; fi
}

# --- no GPU: one line, exit 77, in seconds ------------------------------------------------
if ! ls /dev/nvidia[0-9]* > /dev/null 2>&1; then
  echo "gpu-check: no GPU visible (no /dev/nvidia0): nothing to check here"
  exit 77
fi
if ! timeout 8 nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-check: no GPU visible (nvidia-smi missing or failing): nothing to check here"
  exit 77
fi
if [ -z "$strata" ]; then
  echo "gpu-check: no strata binary in $bin (unpack the bundle, or run scripts/gpu-bundle.sh)" >&2
  exit 1
fi

out=$(realpath -m "${1:-gpu-check}")
work=${GPU_CHECK_WORK:-/tmp/strata-gpu-check}
rm -rf "$out" "$work"
mkdir -p "$out/logs" "$work/configs"
stages="$out/stages.jsonl"
: > "$stages"
log() { echo "gpu-check: $*" >&2; }
budget_s=${GPU_CHECK_BUDGET_S:-380}
start_s=$SECONDS

# json_line KEY VALUE...: one JSON object from string/number pairs (values that parse as numbers
# stay numbers), appended to stages.jsonl in one write.
json_line() {
  local line="{" sep=""
  while [ $# -ge 2 ]; do
    if [[ $2 =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; then line+="$sep\"$1\": $2"; else line+="$sep\"$1\": \"${2//\"/\'}\""; fi
    sep=", "
    shift 2
  done
  echo "$line}" >> "$stages"
}

# run_stage NAME LIMIT_S COMMAND...: runs with min(LIMIT_S, what the budget has left), output to
# logs/NAME.log, one JSON line. A stage that would start with under 10 s left is recorded as
# out_of_time and not started.
run_stage() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget_s - (SECONDS - start_s)))
  if [ "$left" -lt 10 ]; then
    json_line stage "$name" status out_of_time limit_s 0
    log "$name: not started (the ${budget_s}s budget is spent)"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "$name (limit ${limit}s)"
  local began=$SECONDS rc=0
  timeout -k 5 "$limit" "$@" > "$out/logs/$name.log" 2>&1 || rc=$?
  # Every stage runs after `strata devices` found a GPU: a program that skips (77) here skipped
  # something that should have run, so it fails.
  local status=pass
  case $rc in
    0) status=pass ;;
    124|137) status=timeout ;;
    *) status=fail ;;
  esac
  json_line stage "$name" status "$status" exit "$rc" seconds "$((SECONDS - began))" limit_s "$limit"
  if [ "$status" != pass ]; then
    log "$name: $status (exit $rc): see $out/logs/$name.log"
    tail -3 "$out/logs/$name.log" >&2
  fi
  return "$rc"
}

# analyse NAME PYTHON_ARGS...: one of the comparisons in the Python below, as a stage of its own.
analyse() {
  local name=$1
  shift
  local began=$SECONDS line
  line=$(python3 - "$name" "$@" 2> "$out/logs/$name.log" <<'PY'
import json, math, os, struct, sys

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def last_json_line(path):
    try:
        lines = [l for l in open(path) if l.lstrip().startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None

def tensors(path):
    """name -> list of floats from a safetensors file (F32, BF16 or F16)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    result = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        raw = data[e["data_offsets"][0]:e["data_offsets"][1]]
        if e["dtype"] == "F32":
            values = struct.unpack(f"<{len(raw) // 4}f", raw)
        elif e["dtype"] == "BF16":
            halves = struct.unpack(f"<{len(raw) // 2}H", raw)
            values = struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves)))
        elif e["dtype"] == "F16":
            values = struct.unpack(f"<{len(raw) // 2}e", raw)
        else:
            raise ValueError(f"{name}: dtype {e['dtype']} not compared")
        result[name] = values
    return result

def find(obj, key):
    """The first value under `key` anywhere in a JSON document (a plan's figures are nested)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = find(v, key)
            if found is not None:
                return found
    return None


def rel_l2(a, b):
    """||a - b|| / ||b||; NaN when either holds a NaN or an Inf."""
    if not all(math.isfinite(x) for x in a) or not all(math.isfinite(x) for x in b):
        return float("nan")
    diff = math.sqrt(math.fsum((x - y) ** 2 for x, y in zip(a, b)))
    return diff / (math.sqrt(math.fsum(y * y for y in b)) or 1.0)

name, kind = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
r = {"stage": name}
if kind == "weights":
    # weights WORK NAME TOLERANCE: NAME-cpu / NAME-cuda exports and metrics.
    work, run, tol = args[0], args[1], float(args[2])
    cpu_path, cuda_path = f"{work}/{run}-cpu.safetensors", f"{work}/{run}-cuda.safetensors"
    if not os.path.exists(cpu_path):  # an adapter run's export: a PEFT folder
        cpu_path, cuda_path = f"{work}/{run}-cpu/adapter_model.safetensors", f"{work}/{run}-cuda/adapter_model.safetensors"
    if not (os.path.exists(cpu_path) and os.path.exists(cuda_path)):
        r.update(status="fail", why="a run did not export its weights")
    else:
        cpu, cuda = tensors(cpu_path), tensors(cuda_path)
        errors = {t: rel_l2(cuda.get(t, ()), w) if len(cuda.get(t, ())) == len(w) else float("nan") for t, w in cpu.items()}
        worst = max(errors, key=lambda t: (math.isnan(errors[t]), errors[t]))
        m_cpu, m_cuda = load(f"{work}/{run}-cpu.metrics.json"), load(f"{work}/{run}-cuda.metrics.json")
        loss_cpu = m_cpu["summary"]["last_loss"] if m_cpu else float("nan")
        loss_cuda = m_cuda["summary"]["last_loss"] if m_cuda else float("nan")
        loss_rel = abs(loss_cuda - loss_cpu) / abs(loss_cpu) if m_cpu and m_cuda else float("nan")
        ok = all(e <= tol for e in errors.values()) and loss_rel <= tol  # a NaN compares false
        # Evaluation (eval: in the config, issue 30): the held-out losses on both devices.
        evals_cpu = [e["eval_loss"] for e in (m_cpu or {}).get("summary", {}).get("evaluations", [])]
        evals_cuda = [e["eval_loss"] for e in (m_cuda or {}).get("summary", {}).get("evaluations", [])]
        if evals_cpu or evals_cuda:
            eval_rel = max((abs(b - a) / abs(a) for a, b in zip(evals_cpu, evals_cuda)), default=float("nan"))
            ok = ok and len(evals_cpu) == len(evals_cuda) and eval_rel <= tol
            r.update(eval_loss_cpu=evals_cpu, eval_loss_cuda=evals_cuda, eval_loss_rel=eval_rel)
        r.update(status="pass" if ok else "fail", tolerance=tol, tensors=len(errors),
                 max_tensor_rel_l2=errors[worst], worst_tensor=worst,
                 over_tolerance=sorted(t for t, e in errors.items() if not e <= tol)[:10],
                 loss_cpu=loss_cpu, loss_cuda=loss_cuda, loss_rel=loss_rel,
                 tokens_per_s_cpu=m_cpu["summary"]["tokens_per_s"] if m_cpu else None,
                 tokens_per_s_cuda=m_cuda["summary"]["tokens_per_s"] if m_cuda else None)
elif kind == "tokens":
    # tokens CPU_JSON CUDA_JSON MARGIN: greedy streams, equal up to a near tie.
    g_cpu, g_cuda, margin = load(args[0]), load(args[1]), float(args[2])
    if not g_cpu or not g_cuda:
        r.update(status="fail", why="a generate run gave no JSON")
    else:
        a, b = g_cpu["tokens"], g_cuda["tokens"]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        margins = g_cpu.get("top2_margins") or []
        at = margins[first] if first is not None and first < len(margins) else None
        near_tie = at is not None and at <= margin
        ok = len(a) == len(b) and (first is None or near_tie)
        r.update(status="pass" if ok else "fail", tokens=len(a), first_differing_token=first,
                 cpu_margin_there=at, near_tie_margin=margin, tokens_cpu=a, tokens_cuda=b,
                 tokens_per_s_cpu=g_cpu.get("tokens_per_s"), tokens_per_s_cuda=g_cuda.get("tokens_per_s"))
elif kind == "overlap":
    result = last_json_line(args[0])
    r.update(status="pass" if result else "fail", result=result)
elif kind == "llama":
    # llama PLAN_LOG METRICS: two steps on cuda against the plan and its I/O floor.
    plan, m = last_json_line(args[0]), load(args[1])
    if not m:
        r.update(status="fail", why="no metrics from the training run")
    else:
        steps = m["steps"]
        r.update(status="pass", step_seconds=[s["seconds"] for s in steps], stall_seconds=[s["stall_seconds"] for s in steps],
                 compute_seconds=[s["compute_seconds"] for s in steps],
                 predicted_step_seconds=m["summary"]["predicted_step_seconds"],
                 predicted_io_floor_seconds=m["summary"]["predicted_io_seconds"],
                 plan_step_seconds=find(plan, "predicted_step_s"), plan_io_floor_seconds=find(plan, "io_floor_s"),
                 plan_bound=find(plan, "bound"), device_high_water_bytes=m["summary"]["device_high_water_bytes"],
                 tokens_per_s=m["summary"]["tokens_per_s"])
        last = steps[-1]["seconds"]
        floor = m["summary"]["predicted_io_seconds"]
        r["last_step_over_io_floor"] = last / floor if floor else None
elif kind == "gemm":
    # gemm PLAN_LOG TORCH_LOG CONFIG_JSON: strata's block compute rate against cuBLAS's SGEMM.
    plan, ref, shape = last_json_line(args[0]), last_json_line(args[1]), json.loads(args[2])
    fwd = find(plan, "fwd_block_s")
    d, h, kv, hd, ff, t = (shape[k] for k in ("n_embd", "n_head", "n_kv_head", "head_dim", "intermediate_size", "tokens"))
    block_params = d * h * hd * 2 + d * kv * hd * 2 + 3 * d * ff
    flops = 2.0 * t * block_params  # the block's GEMMs; attention's own products are small at this T
    strata_tflops = flops / fwd / 1e12 if fwd else None
    r.update(status="pass" if ref and strata_tflops else "fail", strata_block_forward_tflops=strata_tflops,
             strata_fwd_block_s=fwd, cublas=ref,
             strata_over_cublas_fp32=strata_tflops / ref["fp32_tflops"] if ref and strata_tflops else None)
elif kind == "bandwidth":
    # bandwidth TORCH_LOG LLAMA_METRICS: the plain loop's GB/s, and beside it what strata's copies
    # moved per second of the Llama run's last step (an average over the step, so a floor on the
    # copy engine's rate, not its peak).
    ref, m = last_json_line(args[0]), load(args[1])
    strata_rates = None
    if m and m.get("steps"):
        last = m["steps"][-1]
        strata_rates = {"h2d_GBps_over_last_step": last["host_to_device_bytes"] / last["seconds"] / 1e9,
                        "d2h_GBps_over_last_step": last["device_to_host_bytes"] / last["seconds"] / 1e9}
    r.update(status="pass" if ref else "fail", reference=ref, strata_llama=strata_rates)
def strict(value):
    """NaN and Inf as text: strict JSON readers (jq) refuse the bare tokens."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict(v) for v in value]
    return value
print(json.dumps(strict(r)))
PY
  ) || line="{\"stage\": \"$name\", \"status\": \"fail\", \"why\": \"the comparison itself failed: logs/$name.log\"}"
  echo "$line" >> "$stages"
  case $line in *'"status": "pass"'*) ;; *) log "$name: failed: ${line:0:300}" ;; esac
  return 0
}

# --- 0. the devices, cuBLAS and NCCL this machine gives strata ------------------------------
devices_rc=0
timeout 20 "$strata" devices --json > "$out/devices.json" 2> "$out/logs/devices.log" || devices_rc=$?
devices=$(cat "$out/devices.json" 2> /dev/null)
[ -n "$devices" ] || devices=null
# nvidia-smi saw a GPU: CUDA finding none is still a skip (CUDA_VISIBLE_DEVICES hides them all),
# but a driver too old for this CUDA runtime is a fault of the machine worth failing on.
if [ "$devices_rc" -eq 77 ] && ! grep -qi "insufficient" <<< "$devices"; then
  echo "gpu-check: no GPU visible to CUDA ($devices): nothing to check here"
  exit 77
fi
echo "{\"stage\": \"devices\", \"status\": \"$([ "$devices_rc" -eq 0 ] && echo pass || echo fail)\", \"exit\": $devices_rc, \"result\": $devices}" >> "$stages"
[ "$devices_rc" -eq 0 ] || log "strata devices failed (exit $devices_rc): $devices $(tail -2 "$out/logs/devices.log")"
log "devices: $devices"

# --- a. CUDA suites and op parity, side by side (16 cores, one GPU) --------------------------
run_stage suite_gpt2_cuda 100 "$(program test_gpt2_cuda)" &
run_stage suite_optim_cuda 100 "$(program test_optim_cuda)" &
run_stage suite_cuda_device 100 "$(program test_cuda_device)" &
run_stage suite_backend_ops 100 "$(program test_backend_ops)" &
# LoRA on CUDA (lora_cuda.h, the frozen block and head paths) against the CPU kernels; the
# PyTorch cases need torch, which a bare machine lacks, so only the CUDA ones run here.
run_stage suite_lora_cuda 100 "$(program test_lora)" --gtest_filter='*Cuda*:*Backends*' &
run_stage suite_nccl_allreduce 60 "$(program test_comm_collectives)" nccl &
wait

# --- b, c. the same training on cpu and on cuda ----------------------------------------------
make_config() {  # make_config NAME KIND SOURCE_YAML SED_EXPR...: a config under $work/configs
  local name=$1 kind=$2 source=$3
  shift 3
  mkdir -p "$work/run-$name-$kind"
  sed -e "s|kind: cpu|kind: $kind|" -e "s|paths: \[[^]]*\]|paths: [$work/run-$name-$kind]|" \
    -e "s|path: /usr/share/common-licenses/GPL-3|path: $text|" "$@" "$source" > "$work/configs/$name-$kind.yaml"
}
for kind in cpu cuda; do
  make_config demo "$kind" "$configs/demo.yaml"
  # small: fp32, gradients on the device, optimizer state on NVMe, no clipping.
  make_config small "$kind" "$configs/demo.yaml" -e 's/precision: bf16/precision: fp32/' \
    -e 's/placement: {[^}]*}/placement: {params: host, grads: device, optimizer: nvme}/' \
    -e 's/grad_clip: 1.0/grad_clip: 0/' -e 's/memory: 16MiB/memory: 64MiB/' -e 's/memory: 24MiB/memory: 96MiB/'
  # hostopt: ZeRO-Offload's placement, optimizer state homed on the host — on cuda the CPU AdamW
  # updates it, with clipping (updates after the global norm); hostopt_overlap: the same without
  # clipping and with gradients on the device, so each update overlaps the next backward. On
  # cpu both are the ordinary in-place path: the reference.
  make_config hostopt "$kind" "$configs/demo.yaml" \
    -e 's/placement: {[^}]*}/placement: {params: nvme, grads: host, optimizer: host}/' -e 's/memory: 24MiB/memory: 96MiB/'
  make_config hostopt_overlap "$kind" "$configs/demo.yaml" \
    -e 's/placement: {[^}]*}/placement: {params: host, grads: device, optimizer: host}/' \
    -e 's/grad_clip: 1.0/grad_clip: 0/' -e 's/memory: 16MiB/memory: 64MiB/' -e 's/memory: 24MiB/memory: 96MiB/'
  # chat: fine-tuning (issue 30) — Llama-shaped, chat JSONL through the folder's template, masks
  # on the answers, packed rows (positions and segments), warmup + cosine, K = 2, a held-out
  # evaluation after the last step (the head's loss without gradients); fp32.
  make_config chat "$kind" "$configs/chat-finetune.yaml" -e "s|path: chat/arithmetic.jsonl|path: $configs/chat/arithmetic.jsonl|" \
    -e "s|tokenizer: chat,|tokenizer: $configs/chat,|" -e 's/precision: bf16/precision: fp32/' \
    -e 's/\(device: {kind: [a-z]*, memory: \)32MiB/\1128MiB/'
  # lora: QLoRA (issue 31) — the chat run over a frozen NF4 base (double-quantised, dequantised
  # by each backend before a block's GEMMs) with rank-8 adapters on every linear and dropout
  # 0.05 (its mask is the same integer hash on both backends); the PEFT folders compared.
  make_config lora "$kind" "$configs/chat-finetune.yaml" -e "s|path: chat/arithmetic.jsonl|path: $configs/chat/arithmetic.jsonl|" \
    -e "s|tokenizer: chat,|tokenizer: $configs/chat,|" -e 's/precision: bf16/precision: fp32/' \
    -e 's/\(device: {kind: [a-z]*, memory: \)32MiB/\1128MiB/' \
    -e '$a adapter: {kind: lora, rank: 8, alpha: 16, dropout: 0.05, base_dtype: nf4, double_quant: true, targets: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}'
done
train_pair() {  # train_pair NAME LIMIT [EXPORT_SUFFIX]: cpu and cuda side by side (the cpu run takes 8 cores)
  local name=$1 limit=$2 suffix=${3:-.safetensors} kind
  for kind in cpu cuda; do
    STRATA_THREADS=8 run_stage "train_${name}_$kind" "$limit" "$strata" train "$work/configs/$name-$kind.yaml" \
      --steps 20 --export "$work/$name-$kind$suffix" --metrics "$work/$name-$kind.metrics.json" &
  done
  wait
}
train_pair demo 75
analyse compare_demo weights "$work" demo 2e-2
train_pair small 75
analyse compare_small weights "$work" small 1e-3
train_pair chat 75
analyse compare_chat weights "$work" chat 1e-3
train_pair lora 75 ""  # an adapter store exports a PEFT folder
analyse compare_lora weights "$work" lora 1e-3

# Greedy generation from the SAME trained store (demo: bf16, small: fp32) on cpu and on cuda:
# the cuda config is the cpu one with only device.kind changed, so both read run-NAME-cpu.
for name in demo small; do
  sed -e "s|kind: cpu|kind: cuda|" "$work/configs/$name-cpu.yaml" > "$work/configs/gen-$name-cuda.yaml"
  for kind in cpu cuda; do
    gen_cfg="$work/configs/$name-cpu.yaml"
    [ "$kind" = cuda ] && gen_cfg="$work/configs/gen-$name-cuda.yaml"
    # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
    run_stage "generate_${name}_$kind" 40 bash -c \
      '"$0" generate "$1" --prompt-ids 1,2,3,4,5 --tokens 32 --temperature 0 --json > "$2"' \
      "$strata" "$gen_cfg" "$work/generate-$name-$kind.json"
  done
done
analyse tokens_demo tokens "$work/generate-demo-cpu.json" "$work/generate-demo-cuda.json" 0.05
analyse tokens_small tokens "$work/generate-small-cpu.json" "$work/generate-small-cuda.json" 0.01

# --- c. ZeRO-Offload's placements ------------------------------------------------------------
train_pair hostopt 75
analyse compare_hostopt weights "$work" hostopt 2e-2
train_pair hostopt_overlap 75
analyse compare_hostopt_overlap weights "$work" hostopt_overlap 2e-2

# --- d. NVMe reads overlapping device compute --------------------------------------------------
run_stage bench_overlap 45 "$strata" bench overlap --device cuda --dir "$work/overlap" --json
analyse overlap overlap "$out/logs/bench_overlap.log"

# --- e. one model that means something: Llama 1B, two steps, against the plan ------------------
# 16 GiB of device memory: 2 GiB (the CPU box's figure) cannot hold the kernels' scratch.
make_config llama cuda "$configs/llama-1b-offload.yaml" -e 's/memory: 2GiB/memory: 16GiB/'
run_stage plan_llama 40 "$strata" plan "$work/configs/llama-cuda.yaml" --json
run_stage train_llama 150 "$strata" train "$work/configs/llama-cuda.yaml" --steps 2 --metrics "$work/llama-cuda.metrics.json"
analyse llama llama "$out/logs/plan_llama.log" "$work/llama-cuda.metrics.json"

# --- f, g. the references strata's copies and GEMMs are read against (PyTorch = cudaMemcpy, cuBLAS)
run_stage reference_copies 30 python3 -c '
import json, time, torch
size = 256 << 20
host = torch.empty(size, dtype=torch.uint8).pin_memory()
device = torch.empty(size, dtype=torch.uint8, device="cuda")
result = {}
for name, dst, src in (("h2d", device, host), ("d2h", host, device)):
    dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    rates = []
    for _ in range(5):
        t = time.perf_counter(); dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
        rates.append(size / (time.perf_counter() - t) / 1e9)
    result[name + "_pinned_GBps_median"] = sorted(rates)[2]
print(json.dumps(result))'
analyse copies bandwidth "$out/logs/reference_copies.log" "$work/llama-cuda.metrics.json"

run_stage reference_gemm 40 python3 -c '
import json, time, torch
torch.backends.cuda.matmul.allow_tf32 = False  # strata runs cuBLAS pedantic: plain fp32
t, d, ff = 128, 2048, 8192  # Llama 1B: one 128-token sequence through the MLP up-projection
def rate(m, k, n, dtype):
    a = torch.randn(m, k, device="cuda", dtype=dtype); b = torch.randn(k, n, device="cuda", dtype=dtype)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); start = time.perf_counter(); reps = 20
    for _ in range(reps): a @ b
    torch.cuda.synchronize()
    return 2 * m * k * n * reps / (time.perf_counter() - start) / 1e12
print(json.dumps({"fp32_tflops": rate(t, d, ff, torch.float32), "fp32_square_8192_tflops": rate(8192, 8192, 8192, torch.float32),
                  "bf16_square_8192_tflops": rate(8192, 8192, 8192, torch.bfloat16), "shape": [t, d, ff]}))'
analyse gemm gemm "$out/logs/plan_llama.log" "$out/logs/reference_gemm.log" \
  '{"n_embd": 2048, "n_head": 32, "n_kv_head": 8, "head_dim": 64, "intermediate_size": 8192, "tokens": 128}'

# --- the summary: every stage line, and whether all passed -------------------------------------
python3 - "$stages" "$out/summary.json" "$((SECONDS - start_s))" <<'PY'
import json, sys
stages = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
failed = [s["stage"] for s in stages if s.get("status") not in ("pass", "out_of_time")]
not_run = [s["stage"] for s in stages if s.get("status") == "out_of_time"]
summary = {"ok": not failed, "failed": failed, "out_of_time": not_run, "seconds": int(sys.argv[3]), "stages": stages}
with open(sys.argv[2], "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps(summary, indent=1))
sys.exit(1 if failed else 0)
PY
