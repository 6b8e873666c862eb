#!/usr/bin/env bash
# Sets up, builds and runs every test suite (the README's test command, and what CI runs).
# Suites that need a GPU, or a Debian package that is missing, skip with exit code 77.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
status=0
meson test -C build --print-errorlogs --num-processes 2 "$@" || status=$?
# One closing line any CI can read, from meson's own log.
/usr/bin/python3 - <<'PY'
import json
counts = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "EXPECTEDFAIL": 0, "UNEXPECTEDPASS": 0, "ERROR": 0}
with open("build/meson-logs/testlog.json") as log:
    for line in log:
        result = json.loads(line)["result"]
        counts[result] = counts.get(result, 0) + 1
failed = counts["FAIL"] + counts["TIMEOUT"] + counts["ERROR"] + counts["UNEXPECTEDPASS"]
print(f"{counts['OK'] + counts['EXPECTEDFAIL']} passed, {failed} failed, {counts['SKIP']} skipped")
PY
exit $status
