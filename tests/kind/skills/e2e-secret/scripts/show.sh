#!/usr/bin/env bash
set -u
echo "token: ${E2E_TOKEN:-<unset>}"
echo "work: [$(ls -A /work | tr '\n' ' ')]"
echo "tmp: [$(ls -A /tmp | tr '\n' ' ')]"
