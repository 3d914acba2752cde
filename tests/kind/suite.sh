# The bookkeeping every real-cluster suite shares (sourced by tests/kind/run.sh,
# tests/kind/quickstart.sh and tests/console/run.sh). Set before sourcing:
#   SUITE       the name its lines start with ("kind: 24 passed, 0 failed")
#   SUITE_WHAT  what a skip did not run, in words
# skip REASON: SKIPPED (a failure with SKILL_OPERATOR_REQUIRE_GATED=1);
# ok/bad NAME: one counted line; check NAME COMMAND...: one line per check,
# never aborting the suite; finish: the closing line, exit 1 on any failure.
PASS=0 FAIL=0
skip() {
  echo "$SUITE: SKIPPED ($1; $SUITE_WHAT did not run)"
  if [[ "${SKILL_OPERATOR_REQUIRE_GATED:-}" == 1 ]]; then
    echo "$SUITE: SKILL_OPERATOR_REQUIRE_GATED=1 requires it to run" >&2
    exit 1
  fi
  exit 0
}
ok() { PASS=$((PASS + 1)); echo "ok   $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $1"; }
check() {
  local name="$1" out
  shift
  if out="$("$@" 2>&1)"; then ok "$name"; else bad "$name: $(printf '%s' "$out" | tail -n 5 | tr '\n' ' ')"; fi
}
finish() {
  echo "$SUITE: $PASS passed, $FAIL failed"
  [[ $FAIL == 0 ]]
  exit $?
}
