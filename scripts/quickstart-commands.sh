#!/usr/bin/env bash
# Prints the README's cluster quickstart commands, one per line: the first
# ```sh block between `<!-- BEGIN quickstart -->` and `<!-- END quickstart -->`
# in README.md (or, with --block archive, between `<!-- BEGIN
# quickstart-archive -->` and its END: the path without the release
# registry). The real-cluster quickstart test runs what this prints, so the
# README shows exactly what is tested (tests/docs.rs checks both sides).
#
#   scripts/quickstart-commands.sh [--block archive] [README]   (default: README.md of this checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME=quickstart
if [[ "${1:-}" == --block ]]; then NAME="quickstart-${2:?--block needs a name (archive)}"; shift 2; fi
README="${1:-$ROOT/README.md}"
[[ -f "$README" ]] || { echo "quickstart-commands: $README not found" >&2; exit 1; }
out="$(awk -v begin="<!-- BEGIN $NAME -->" -v end="<!-- END $NAME -->" '
  $0 == begin                  { inside = 1; next }
  $0 == end                    { inside = 0; next }
  inside && !done && /^```sh$/ { code = 1; next }
  inside && code && /^```$/    { code = 0; done = 1; next }
  inside && code               { print }
' "$README")"
[[ -n "$out" ]] || { echo "quickstart-commands: $README has no sh block between <!-- BEGIN $NAME --> and <!-- END $NAME -->" >&2; exit 1; }
printf '%s\n' "$out"
