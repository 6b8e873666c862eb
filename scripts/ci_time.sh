# scripts/ci_time.sh — sourced by test.sh, sanitize.sh and fuzz.sh: `timed PHASE COMMAND...`
# runs COMMAND, prints how long it took ("ci-time: PHASE N s") and appends "PHASE SECONDS" to
# $STRATA_CI_TIMES when it is set, so test.sh can close with where a CI run's minutes went (the
# cold-machine budget in README "CI time" is 45 minutes of CI's 90). Returns COMMAND's status.
timed() {
  local phase=$1
  shift
  local start=$SECONDS rc=0
  "$@" || rc=$?
  local took=$((SECONDS - start))
  echo "ci-time: $phase ${took} s" >&2
  if [ -n "${STRATA_CI_TIMES:-}" ]; then echo "$phase $took" >>"$STRATA_CI_TIMES"; fi
  return $rc
}
