# Sourced by the test suites (never run): checks a suite's test dependencies
# before the suite starts, so a machine where scripts/install-test-deps.sh has
# not run is told what is missing and which command installs it, instead of a
# `No such file or directory` from deep inside a check.
#
#   source "$ROOT/scripts/test-deps-lib.sh"     # needs ROOT (the checkout)
#   deps_need_exec "$TEST_DEPS/venv/bin/python" "$DEPS_INSTALL"
#   deps_need_cmd curl "apt-get install curl"
#   deps_need_python_module "$TEST_DEPS/venv/bin/python" mcp "$DEPS_INSTALL"
#   deps_report kind || exit 1                 # one line per missing piece
#
# TEST_DEPS_DIR moves the directory the pieces are looked for in (default
# target/test-deps; the tests of these checks point it at an empty one).

TEST_DEPS="${TEST_DEPS_DIR:-$ROOT/target/test-deps}"
[[ "$TEST_DEPS" == /* ]] || TEST_DEPS="$ROOT/$TEST_DEPS"
DEPS_INSTALL="bash scripts/install-test-deps.sh"
DEPS_INSTALL_ROOT="bash scripts/install-test-deps.sh (as root: it apt-installs)"
DEPS_BUILD_RELEASE="cargo build --release"
DEPS_MISSING=()

# A path inside the checkout is shown relative to it: it is what the
# install command creates, and what a reader finds in the tree.
deps_show() {
  local p="$1"
  if [[ "$p" == "$ROOT/"* ]]; then printf '%s' "${p#"$ROOT/"}"; else printf '%s' "$p"; fi
}

# deps_need_exec PATH HOW: PATH must be an executable file.
deps_need_exec() {
  [[ -f "$1" && -x "$1" ]] || DEPS_MISSING+=("missing: $(deps_show "$1") (run: $2)")
}

# deps_need_cmd NAME HOW: NAME on PATH, or NAME itself when it is a path.
deps_need_cmd() {
  if [[ "$1" == */* ]]; then
    deps_need_exec "$1" "$2"
  elif ! command -v "$1" >/dev/null 2>&1; then
    DEPS_MISSING+=("missing: $1 on PATH (run: $2)")
  fi
}

# deps_need_python_module PYTHON MODULE HOW: MODULE imports in PYTHON (checked
# only when PYTHON itself is there; a missing interpreter is reported alone).
deps_need_python_module() {
  [[ -x "$1" ]] || return 0
  "$1" -c "import $2" >/dev/null 2>&1 || DEPS_MISSING+=("missing: the Python module $2 in $(deps_show "$1") (run: $3)")
}

# deps_report SUITE: prints every missing piece as `SUITE: missing: ...` on
# stderr and returns 1 when there is one.
deps_report() {
  ((${#DEPS_MISSING[@]} == 0)) && return 0
  local line
  for line in "${DEPS_MISSING[@]}"; do printf '%s: %s\n' "$1" "$line" >&2; done
  local n=${#DEPS_MISSING[@]} s=ies
  ((n == 1)) && s=y
  printf "%s: %d test dependenc%s missing; nothing was run\n" "$1" "$n" "$s" >&2
  return 1
}
