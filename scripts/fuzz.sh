#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) in build-asan/ — the clang ASan + UBSan build that
# scripts/sanitize.sh also uses, configured with libFuzzer's coverage hooks (scripts/asan_fuzz.sh)
# — and runs each for a bounded time (FUZZ_SECONDS, default 45) from its seed corpus, two at a
# time (one per core); scripts/test.sh calls this. A crash fails the run and names the input in
# build-asan/fuzz-artifacts/NAME/: copy it into fuzz/regressions/NAME/, where the
# fuzz_replay_NAME test of every build replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ci_time.sh
source scripts/asan_fuzz.sh
setup_asan_fuzz_build
# Only the harnesses: what they link is already built when sanitize.sh ran first.
targets=()
for harness in fuzz/fuzz_*.cpp; do
  name=$(basename "$harness" .cpp)
  targets+=("fuzz/$name")
done
timed "fuzz build" ninja -C build-asan "${targets[@]}"
rm -f build-asan/meson-logs/testlog-fuzz.json
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
timed "fuzz runs" meson test -C build-asan --no-rebuild --print-errorlogs --num-processes 2 --logbase testlog-fuzz --suite fuzz-run
