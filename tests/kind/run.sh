#!/usr/bin/env bash
# End to end on a kind cluster: Helm install, push the Python and Node
# sample packages, bind them in a restricted namespace, run a SkillJob of
# each and wait for Succeeded. Gated: runs only when KUBECONFIG points at a
# reachable cluster; otherwise it prints SKIPPED and checks nothing.
#
# Needs (besides KUBECONFIG):
#   SKILL_OPERATOR_IMAGE   this binary's image, loaded into the cluster (kind load docker-image ...)
#   REGISTRY               host:port/repo of a registry both this machine and the cluster reach over plain HTTP
#   PYTHON_IMAGE, NODE_IMAGE  run images (digest-pinned), default python:3.12-slim / node:22-bookworm-slim
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${SKILL_OPERATOR_BIN:-$ROOT/target/release/skill-operator}"
KUBECTL="${KUBECTL:-$ROOT/target/test-deps/bin/kubectl}"
HELM="${HELM:-$ROOT/target/test-deps/bin/helm}"

if [[ -z "${KUBECONFIG:-}" ]] || ! "$KUBECTL" version --request-timeout=5s >/dev/null 2>&1; then
  echo "kind: SKIPPED (KUBECONFIG does not point at a reachable cluster; the kind suite did not run)"
  exit 0
fi
: "${SKILL_OPERATOR_IMAGE:?set SKILL_OPERATOR_IMAGE to this binary's image loaded into the cluster}"
: "${REGISTRY:?set REGISTRY to host:port/repo of a plain-HTTP registry the cluster can pull from}"
PYTHON_IMAGE="${PYTHON_IMAGE:-python:3.12-slim}"
NODE_IMAGE="${NODE_IMAGE:-node:22-bookworm-slim}"
NS=skills-e2e

"$HELM" upgrade --install skill-operator "$ROOT/charts/skill-operator" -n skill-system --create-namespace --wait \
  --set image.repository="${SKILL_OPERATOR_IMAGE%:*}" --set image.tag="${SKILL_OPERATOR_IMAGE##*:}" \
  --set artifacts.registry="$REGISTRY" --set artifacts.insecureRegistry=true

push() { "$BIN" package push "$ROOT/config/samples/skills/$1" --registry "$REGISTRY" --tag e2e --plain-http | grep -v '^#' ; }
"$KUBECTL" apply -f - <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $NS
  labels: { pod-security.kubernetes.io/enforce: restricted }
YAML
for spec in "csv-stats python $PYTHON_IMAGE /usr/local/bin/python3 scripts/stats.py assets/example.csv" \
            "json-pretty node $NODE_IMAGE /usr/local/bin/node scripts/pretty.js --help"; do
  read -r skill interpreter image path script arg <<<"$spec"
  push "$skill" | "$KUBECTL" apply -f - -o name >/dev/null
  pkg="$("$KUBECTL" get skillpackages -o name | grep "/$skill-" | head -n1 | cut -d/ -f2)"
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p "{\"spec\":{\"runtime\":{\"interpreter\":\"$interpreter\",\"image\":\"$image\",\"interpreterPath\":\"$path\",\"allowedScripts\":[\"$script\"]}}}"
  "$KUBECTL" wait --for=condition=Ready "skillpackage/$pkg" --timeout=120s
  "$KUBECTL" -n "$NS" apply -f - <<YAML
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: $skill }
spec: { package: $pkg }
---
apiVersion: skill-operator.dev/v1alpha1
kind: SkillJob
metadata: { name: $skill-run }
spec: { binding: $skill, script: $script, args: ["$arg"] }
YAML
done
for skill in csv-stats json-pretty; do
  "$KUBECTL" -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded "skilljob/$skill-run" --timeout=300s
  "$KUBECTL" -n "$NS" get skilljob "$skill-run"
done
echo "kind: 2 passed, 0 failed"
