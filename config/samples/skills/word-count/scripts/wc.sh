#!/usr/bin/env bash
# Count lines, words and bytes per file; print a tab-separated table.
set -u

if [ "$#" -eq 0 ]; then
  echo "wc.sh: usage: wc.sh FILE..." >&2
  exit 2
fi

status=0
counted=0
total_lines=0 total_words=0 total_bytes=0

printf 'lines\twords\tbytes\tfile\n'
for path in "$@"; do
  if [ -d "$path" ]; then
    echo "wc.sh: $path: is a directory, skipped" >&2
    status=1
    continue
  fi
  if [ ! -r "$path" ]; then
    echo "wc.sh: $path: cannot read, skipped" >&2
    status=1
    continue
  fi
  read -r lines words bytes _ < <(wc -l -w -c < "$path")
  # wc -l counts newlines; a last line without one is still a line.
  if [ "$bytes" -gt 0 ] && [ -n "$(tail -c 1 -- "$path")" ]; then
    lines=$((lines + 1))
  fi
  printf '%d\t%d\t%d\t%s\n' "$lines" "$words" "$bytes" "$path"
  total_lines=$((total_lines + lines))
  total_words=$((total_words + words))
  total_bytes=$((total_bytes + bytes))
  counted=$((counted + 1))
done

if [ "$counted" -gt 1 ]; then
  printf '%d\t%d\t%d\t%s\n' "$total_lines" "$total_words" "$total_bytes" total
fi
exit "$status"
