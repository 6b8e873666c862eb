#!/usr/bin/env bash
# Sets up, builds and runs every test suite (the README's test command, and what CI runs).
# Suites that need a GPU, or a Debian package that is missing, skip with exit code 77.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
status=0
rm -f build-asan/meson-logs/testlog*.json build-tsan/meson-logs/testlog*.json build-fuzz/meson-logs/testlog*.json
meson test -C build --print-errorlogs --num-processes 2 "$@" || status=$?
# The same code under the sanitizers, and bounded fuzzing (README "Sanitizers and fuzzing").
# Only for the full run: arguments select tests of ./build. STRATA_SANITIZE=0 / STRATA_FUZZ=0
# leave a part out (for a quick local run).
if [ $# -eq 0 ]; then
  if [ "${STRATA_SANITIZE:-1}" != 0 ]; then scripts/sanitize.sh || status=1; fi
  if [ "${STRATA_FUZZ:-1}" != 0 ]; then scripts/fuzz.sh || status=1; fi
fi
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
