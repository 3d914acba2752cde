#!/usr/bin/env bash
set -eu
echo started
sleep "${1:-300}" &
wait
echo "slept ${1:-300}"
