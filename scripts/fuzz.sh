#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) with clang in build-fuzz/ and runs each for a bounded
# time (FUZZ_SECONDS, default 45) from its seed corpus; scripts/test.sh calls this. A crash
# fails the run and names the input in build-fuzz/fuzz-artifacts/NAME/: copy it into
# fuzz/regressions/NAME/, where the fuzz_replay_NAME test of every build replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-45}
if [ ! -f build-fuzz/build.ninja ]; then
  # ASan + UBSan as well: a fuzzer finds memory errors only when they are made to crash.
  CC=clang CXX=clang++ meson setup build-fuzz -Dcuda=disabled -Dfuzz=true -Db_lundef=false \
    -Db_sanitize=address,undefined -Dcpp_args=-fno-sanitize-recover=all -Dfuzz_seconds="$seconds" >/dev/null
else
  meson configure build-fuzz -Dfuzz_seconds="$seconds"
fi
# Only the harnesses and what they link, not the whole project a second time.
targets=()
for harness in fuzz/fuzz_*.cpp; do
  name=$(basename "$harness" .cpp)
  targets+=("fuzz/$name")
done
ninja -C build-fuzz "${targets[@]}"
rm -f build-fuzz/meson-logs/testlog*.json
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
meson test -C build-fuzz --no-rebuild --print-errorlogs --num-processes 2 --suite fuzz-run
