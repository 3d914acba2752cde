#!/usr/bin/env bash
# Print each argument on its own line, then markup a console must show as text.
for arg in "$@"; do printf '%s\n' "$arg"; done
printf '%s\n' '<img src=x onerror="window.__xss=6"><script>window.__xss=7</script>'
printf '%s\n' '<b>stderr is text too</b>' >&2
