#!/usr/bin/env bash
# The test command (README.md, docs/testing.md; CI runs it through .ci/run): installs what the
# tests need (idempotent), builds, then runs every suite with real peers:
# cargo tests (unit, runner, integration), the Python `mcp` client end to
# end over stdio and HTTP, and the MCP conformance suite on Node 22.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-test-deps.sh
# A clean clone builds once: incremental caches only cost disk here.
export CARGO_INCREMENTAL=0
# Habits the tree keeps: formatted, and clippy-clean with warnings as errors.
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo build --release --locked
cargo test --locked --all-targets
# The sandbox and fence suites once more against the built-in sandbox (the
# run above took bubblewrap): every fence rule holds on both.
SKILL_OPERATOR_TEST_SANDBOX=builtin cargo test --locked \
  --test runner_sandbox --test runner_fence --test fence_isolation --test fence_limits \
  --test fence_egress --test fence_outputs --test fence_parity
# Every shell script of the tree parses (a suite that does not parse once reported a skip).
for f in scripts/*.sh tests/*/*.sh; do bash -n "$f"; done
SKILL_OPERATOR_BIN=target/release/skill-operator target/test-deps/venv/bin/pytest tests/e2e -q
bash tests/chart/test_chart.sh
# The gated suites: for real where a cluster is on this machine, SKIPPED otherwise.
bash scripts/gated.sh
tests/conformance/run.sh
