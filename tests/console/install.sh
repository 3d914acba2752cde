#!/usr/bin/env bash
# Installs what the console's real-browser suite (tests/console/run.sh) needs:
# playwright-core, pinned by package-lock.json, into tests/console/node_modules
# (no browser download: the suite drives Debian's chromium), and chromium
# itself from apt when the machine has none and we are root. Safe to re-run.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v npm >/dev/null 2>&1; then
  echo "console: npm is missing (apt-get install nodejs npm)" >&2
  exit 1
fi
if [[ ! -d "$HERE/node_modules/playwright-core" ]]; then
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix "$HERE" --no-audit --no-fund >/dev/null
fi
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [[ ! -x "$CHROMIUM" ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null
  else
    echo "console: $CHROMIUM is missing (apt-get install chromium)" >&2
    exit 1
  fi
fi
echo "console: playwright-core $(node -p "require('$HERE/node_modules/playwright-core/package.json').version"), $("$CHROMIUM" --version 2>/dev/null)"
