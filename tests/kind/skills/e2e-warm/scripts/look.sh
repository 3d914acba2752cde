#!/usr/bin/env bash
set -u
echo "run: ${1:-}"
echo "work: [$(ls -A /work | tr '\n' ' ')]"
echo "tmp: [$(ls -A /tmp | tr '\n' ' ')]"
echo "proxy: [${HTTPS_PROXY:-}${HTTP_PROXY:-}]"
echo "mark" > "/work/mark-${1:-x}"
echo "mark" > "/tmp/mark-${1:-x}"
