#!/usr/bin/env bash
# Prints the README's cluster quickstart commands, one per line: the first
# ```sh block between `<!-- BEGIN quickstart -->` and `<!-- END quickstart -->`
# in README.md. The real-cluster quickstart test runs what this prints, so the
# README shows exactly what is tested (tests/docs.rs checks both sides).
#
#   scripts/quickstart-commands.sh [README]      (default: README.md of this checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
README="${1:-$ROOT/README.md}"
[[ -f "$README" ]] || { echo "quickstart-commands: $README not found" >&2; exit 1; }
out="$(awk '
  /^<!-- BEGIN quickstart -->$/ { inside = 1; next }
  /^<!-- END quickstart -->$/   { inside = 0; next }
  inside && !done && /^```sh$/  { code = 1; next }
  inside && code && /^```$/     { code = 0; done = 1; next }
  inside && code                { print }
' "$README")"
[[ -n "$out" ]] || { echo "quickstart-commands: $README has no sh block between <!-- BEGIN quickstart --> and <!-- END quickstart -->" >&2; exit 1; }
printf '%s\n' "$out"
