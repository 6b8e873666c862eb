#!/usr/bin/env bash
# Sets up, builds and runs every test suite (the README's test command, and what CI runs).
# Suites that need a GPU, or a Debian package that is missing, skip with exit code 77.
# Each phase prints "ci-time: PHASE N s" and the run closes with a table of them: a cold run
# (fresh machine, no compiler cache) must stay under 45 of CI's 90 minutes (README "CI time").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ci_time.sh
export STRATA_CI_TIMES
STRATA_CI_TIMES=$(mktemp)
trap 'rm -f "$STRATA_CI_TIMES"' EXIT
run_start=$SECONDS

timed setup scripts/setup.sh
# A compiler cache only helps a machine that built strata before, but then it helps a lot. CI
# builds a fresh clone in a folder of its own: without these two settings every object would
# miss, since ccache hashes the build folder's path into objects with debug info.
if command -v ccache >/dev/null; then
  export CCACHE_NOHASHDIR=1 CCACHE_BASEDIR="$PWD"
  ccache --zero-stats >/dev/null
fi
timed build scripts/build.sh
status=0
rm -f build/meson-logs/testlog*.json build-*/meson-logs/testlog*.json
timed tests meson test -C build --print-errorlogs --num-processes 2 "$@" || status=$?
# The same code under the sanitizers, and bounded fuzzing (README "Sanitizers and fuzzing").
# Only for the full run: arguments select tests of ./build. STRATA_SANITIZE=0 / STRATA_FUZZ=0
# leave a part out (for a quick local run).
if [ $# -eq 0 ]; then
  if [ "${STRATA_SANITIZE:-1}" != 0 ]; then scripts/sanitize.sh || status=1; fi
  if [ "${STRATA_FUZZ:-1}" != 0 ]; then scripts/fuzz.sh || status=1; fi
fi

# Where the minutes went, and how much of the compiling the cache saved (a cold run is the one
# that counts against the 45-minute budget; a warm one reads low).
cache_note="no ccache"
if command -v ccache >/dev/null; then
  cache_note=$(ccache --print-stats | awk -F'\t' '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hits += $2 }
    $1 == "cache_miss" { misses += $2 }
    END {
      printf "ccache: %d of %d compiles from the cache", hits, hits + misses
      # A cold run hits a little too (objects two builds share); past a fifth, the run was warm.
      if (hits * 5 > hits + misses) printf "; warm: a cold run takes longer, scripts/ci-cold.sh measures one"
    }')
fi
total_s=$((SECONDS - run_start))
{
  echo "ci-time: phase                      minutes"
  awk '{ phase = $1; for (i = 2; i < NF; ++i) phase = phase " " $i; printf "ci-time:   %-24s %6.1f\n", phase, $NF / 60 }' "$STRATA_CI_TIMES"
  awk -v s="$total_s" -v note="$cache_note" 'BEGIN { printf "ci-time:   %-24s %6.1f   (%s)\n", "total", s / 60, note }'
  if [ "$total_s" -gt $((45 * 60)) ]; then
    echo "ci-time: WARNING: over the 45-minute budget for a cold run (CI stops at 90): see README \"CI time\""
  fi
} >&2

# One closing line any CI can read, from meson's own logs (every build directory run above).
/usr/bin/python3 - <<'PY'
import glob
import json
counts = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "EXPECTEDFAIL": 0, "UNEXPECTEDPASS": 0, "ERROR": 0}
logs = ["build/meson-logs/testlog.json"] + sorted(glob.glob("build-*/meson-logs/testlog*.json"))
for path in logs:
    with open(path) as log:
        for line in log:
            result = json.loads(line)["result"]
            counts[result] = counts.get(result, 0) + 1
failed = counts["FAIL"] + counts["TIMEOUT"] + counts["ERROR"] + counts["UNEXPECTEDPASS"]
print(f"{counts['OK'] + counts['EXPECTEDFAIL']} passed, {failed} failed, {counts['SKIP']} skipped")
PY
exit $status
