#!/usr/bin/env bash
# Builds strata twice more, instrumented, and runs the suites that can show a bug under each
# (scripts/test.sh calls this; README "Sanitizers" says why these suites):
#   build-asan/  clang, AddressSanitizer + UndefinedBehaviorSanitizer, any finding fatal:
#                every C++ suite except the CPU-kernel numerics (gpt2, optim), plus the
#                fuzz replays and `strata train` refusing bad input through the sanitized binary.
#                The same folder is the fuzz build (scripts/fuzz.sh): its code also carries
#                libFuzzer's coverage hooks, so the harnesses link against what is already
#                built instead of a fourth full compile of the engine (README "CI time");
#   build-tsan/  gcc, ThreadSanitizer: the threaded suites — io, scheduler (device, scheduler),
#                memory (the store) — and `strata train` end to end (offloaded GPT-2 and Llama
#                runs, and a run serving /metrics while it trains), with STRATA_THREADS=1.
# Usage: scripts/sanitize.sh [asan|tsan]...   (default: both). Exit status: any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ci_time.sh
kinds=("$@")
[ ${#kinds[@]} -eq 0 ] && kinds=(asan tsan)

# Fatal on the first report, with a stack; LeakSanitizer on (ASan's default on Linux).
export ASAN_OPTIONS="abort_on_error=1:halt_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# No suppressions: what TSan cannot see into (Debian's uninstrumented libtbb) is kept out of the
# run instead — see STRATA_THREADS below.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"

# build-asan/ is configured in one place for this script and fuzz.sh, so the two never differ.
source scripts/asan_fuzz.sh

status=0
for kind in "${kinds[@]}"; do
  case "$kind" in
    asan)
      dir=build-asan
      # train_mutated: the CLI's mutated inputs through the instrumented binary (it found a
      # key with a newline that printed two lines; fixed in report_error).
      suites=(--suite common --suite io --suite memory --suite scheduler --suite fuzz)
      named=(engine_safetensors engine_slot_worker train_bad_input train_mutated) ;;
    tsan)
      dir=build-tsan
      # -g1: line tables, all a TSan report's stacks need (scripts/asan_fuzz.sh says why).
      options=(-Db_sanitize=thread -Dcpp_args=-g1 -Dc_args=-g1)
      # STRATA_THREADS=1 (kernels/compute_threads.h): TBB starts no worker thread, so each
      # kernel runs on the thread that calls it. Debian's libtbb is not instrumented, and the
      # hand-off of a task to a worker happens inside it: with workers, every kernel buffer read
      # on one is reported as a race TSan cannot see ordered. Without them, every thread left is
      # strata's own (caller, scheduler pump, I/O thread, CPU device streams, monitor server) and
      # is checked with no suppression. Not here: train_resume (242 s under TSan on two cores)
      # and train_budgets (asserts peak RSS, which TSan's shadow memory inflates).
      export STRATA_THREADS=1
      suites=(--suite io --suite memory --suite scheduler)
      # engine_slot_worker and train_emulated_placements: the discrete device's threads — copy
      # streams, the host AdamW's worker fed from a stream callback — on every placement.
      named=(engine_safetensors engine_slot_worker train_offload llama_train_offload monitor_metrics
             train_emulated_placements) ;;
    *) echo "sanitize.sh: unknown kind '$kind' (asan or tsan)" >&2; exit 2 ;;
  esac
  if [ "$kind" = asan ]; then
    setup_asan_fuzz_build
  elif [ ! -f "$dir/build.ninja" ]; then
    # -Db_lundef=false and -Dmpi=disabled as for build-asan/ (scripts/asan_fuzz.sh says why).
    meson setup "$dir" -Dcuda=disabled -Dmpi=disabled -Db_lundef=false "${options[@]}" >/dev/null
  fi
  # Only what the selected tests run (their executables and the binaries they are given), not
  # the numerics suites and benchmarks: an instrumented build of everything costs CI minutes.
  meson introspect "$dir" --targets >"$dir/targets.json"
  mapfile -t targets < <(meson introspect "$dir" --tests | /usr/bin/python3 -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
# A test argument may look like a path in the build folder (a case name such as bad_input):
# only what some target builds is a target.
with open(os.path.join(build, "targets.json")) as f:
    outputs = {os.path.realpath(o) for t in json.load(f) for o in t["filename"]}
wanted_suites = {s for s in sys.argv[2].split()}
wanted_names = set(sys.argv[3].split())
out = set()
for test in json.load(sys.stdin):
    suites = {s.split(":")[-1] for s in test["suite"]}
    if test["name"] in wanted_names or suites & wanted_suites:
        for part in test["cmd"]:
            real = os.path.realpath(os.path.join(build, part))
            if real in outputs:
                out.add(os.path.relpath(real, build))
print("\n".join(sorted(out)))' "$dir" "$(printf '%s\n' "${suites[@]}" | grep -v -- --suite | tr '\n' ' ')" "${named[*]}")
  timed "$kind build" ninja -C "$dir" "${targets[@]}"
  rm -f "$dir"/meson-logs/testlog-suites.json "$dir"/meson-logs/testlog-named.json
  # Two runs (meson selects by suite or by name, not both); each leaves its own log, which
  # scripts/test.sh counts in its closing line.
  timed "$kind tests" meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 --logbase testlog-suites "${suites[@]}" || status=1
  timed "$kind named tests" meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 --logbase testlog-named "${named[@]}" || status=1
done
exit $status
