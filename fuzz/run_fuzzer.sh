#!/usr/bin/env bash
# One bounded libFuzzer run (the meson test fuzz_run_NAME): FUZZER NAME CORPUS WORK ARTIFACTS SECONDS.
# Starts from a copy of the seed corpus and the regressions, fuzzes for SECONDS, fails on any crash,
# leak, timeout (an input taking over 10 s: a hang) or out-of-memory input, naming the file.
set -euo pipefail
fuzzer=$1 name=$2 corpus=$3 work=$4 artifacts=$5 seconds=$6
regressions="$(dirname "$(dirname "$corpus")")/regressions/$name"
rm -rf "$work"
mkdir -p "$work" "$artifacts"
cp "$corpus"/* "$work"/
find "$regressions" -type f ! -name README.md -exec cp {} "$work"/ \;
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$work" 2>&1 | tail -n 30 || status=$?
if [ "$status" -ne 0 ]; then
  echo "fuzz_run_$name: the fuzzer found a crashing input (status $status): see $artifacts/;"
  echo "copy it into fuzz/regressions/$name/ (the replay test keeps it) and fix the parser"
  ls -l "$artifacts"
  # libFuzzer's own status (77 on a deadly signal under -fsanitize=fuzzer) would read as "skipped"
  # to meson; a finding is a failure.
  exit 1
fi
