#!/usr/bin/env bash
# The Helm chart's render test (no cluster needed; about 10 s):
#   - the chart's CRD copies (charts/skill-operator/files/crds) equal crds/ (drift)
#   - helm lint --strict: default values, and values-all.yaml (every option on)
#   - helm template: values-min.yaml (defaults + the required registry) and
#     values-all.yaml; without artifacts.registry rendering fails closed
#   - every rendered manifest passes kubernetes-validate --strict for 1.34
#     (CRDs as CustomResourceDefinition objects; the ServiceMonitor, not a
#     built-in kind, is checked by check_rendered.py instead)
#   - check_rendered.py: restricted Pod Security on every container, requests ==
#     limits, probes, SA tokens only where the API is used, release name in every
#     cluster-scoped name, CRDs keep + identical to crds/, NetworkPolicy peer
#     labels, RBAC verbs per option
#   - bad values fail through values.schema.json
#   - config/samples/k8s: custom resources against the CRD schemas (strict,
#     validate_samples.py), built-in kinds with kubernetes-validate --strict;
#     kubectl decodes everything offline (`annotate --local`: `apply
#     --dry-run=client` needs an API server for discovery)
# Needs target/test-deps from scripts/install-test-deps.sh (helm, kubectl, venv).
# Last line: `chart: N passed, M failed`; exit status 1 when M > 0.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DEPS="$ROOT/target/test-deps"
HELM="${HELM:-$DEPS/bin/helm}"
KUBECTL="${KUBECTL:-$DEPS/bin/kubectl}"
PY="$DEPS/venv/bin/python"
KV="$DEPS/venv/bin/kubernetes-validate"
CHART=charts/skill-operator
HERE=tests/chart
KVER=1.34.0
RELEASE=rel-test
NS=skill-system
OUT="$ROOT/target/chart-test"

passed=0
failed=0
pass() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$1"; [[ -n "${2:-}" ]] && printf '%s\n' "$2" | sed 's/^/     | /' | head -n 40; }
finish() { echo "chart: $passed passed, $failed failed"; ((failed == 0)); exit $?; }

# check NAME CMD...: passes when CMD exits 0.
check() {
  local name="$1" out
  shift
  if out="$("$@" 2>&1)"; then pass "$name"; else fail "$name" "$out"; fi
}
# check_fails NAME PATTERN CMD...: passes when CMD fails and its output matches PATTERN.
check_fails() {
  local name="$1" pattern="$2" out
  shift 2
  if out="$("$@" 2>&1)"; then
    fail "$name" "expected failure, got success"
  elif grep -qE -- "$pattern" <<<"$out"; then
    pass "$name"
  else
    fail "$name" "failed without /$pattern/: $out"
  fi
}

for tool in "$HELM" "$KUBECTL" "$PY" "$KV"; do
  if [[ ! -x "$tool" ]]; then
    fail "tools" "$tool not found: run scripts/install-test-deps.sh"
    finish
  fi
done
rm -rf "$OUT"
mkdir -p "$OUT"

# ------------------------------------------------------------------ CRD drift
drift() {
  local a b
  a="$(cd crds && ls *.yaml)"
  b="$(cd "$CHART/files/crds" && ls *.yaml)"
  [[ "$a" == "$b" ]] || { echo "file sets differ: crds/: $a / chart: $b"; return 1; }
  diff -ru crds "$CHART/files/crds" --exclude=README.md \
    || { echo "fix: cp crds/*.yaml $CHART/files/crds/"; return 1; }
}
check "crd drift: $CHART/files/crds == crds/" drift

# ----------------------------------------------------------------------- lint
check "helm lint --strict (default values)" "$HELM" lint --strict "$CHART"
check "helm lint --strict (values-all.yaml)" "$HELM" lint --strict "$CHART" -f "$HERE/values-all.yaml"

# ------------------------------------------------------------------- template
render() { # name, helm args...
  local name="$1"
  shift
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" --kube-version "$KVER" "$@" >"$OUT/$name.yaml"
}
check_fails "helm template without artifacts.registry fails closed" "artifacts.registry is required" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS"
check "helm template (values-min.yaml)" render min -f "$HERE/values-min.yaml"
check "helm template (values-all.yaml)" render all -f "$HERE/values-all.yaml"
check "helm template (gateway on, no API access for artifacts)" render variant -f "$HERE/values-min.yaml" \
  --set gateway.enabled=true --set artifacts.rbac.getSkillJobs=false --set crds.install=false --set egressProxy.enabled=false \
  --set image.tag=1.2.3
# Different releases never share a cluster-scoped name.
check "helm template (a second release)" "$HELM" template other "$CHART" --namespace "$NS" \
  -f "$HERE/values-min.yaml" --output-dir "$OUT/other"

# kubernetes-validate --strict: every object passes; the only schema-less kind
# allowed is the ServiceMonitor.
validate() { # file
  local out
  out="$("$KV" --strict -k "$KVER" "$1" 2>&1)" || { echo "$out"; return 1; }
  if grep -v '^INFO ' <<<"$out" | grep -v "Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1" | grep -q .; then
    echo "$out" | grep -v '^INFO '
    return 1
  fi
  grep -q "passed for resource" <<<"$out" || { echo "nothing validated: $out"; return 1; }
}
for r in min all variant; do
  [[ -s "$OUT/$r.yaml" ]] && check "kubernetes-validate --strict -k $KVER ($r)" validate "$OUT/$r.yaml"
done
# kubectl --dry-run=client still needs a server for discovery; `annotate
# --local` decodes every object the way kubectl apply would, offline.
check "kubectl decodes every rendered object (values-all.yaml)" \
  "$KUBECTL" annotate --local -o name -f "$OUT/all.yaml" check=ok

# ----------------------------------------------------------- rendered checks
rendered() { "$PY" "$HERE/check_rendered.py" "$OUT/$1.yaml" "$RELEASE" crds "${@:2}"; }
D1=sha256:1111111111111111111111111111111111111111111111111111111111111111
check "checks (values-min.yaml)" rendered min \
  --expect kinds=ClusterRole,ClusterRoleBinding,CustomResourceDefinition,Deployment,NetworkPolicy,Secret,Service,ServiceAccount \
  --expect rule=controller:skill-operator.dev:skilljobs:get+list+watch+patch+update \
  --expect rule=egress-proxy:skill-operator.dev:skilljobs:get+list+watch \
  --expect rule=egress-proxy::secrets: \
  --expect "controller-arg=--egress-proxy=$RELEASE-skill-operator-egress-proxy.$NS.svc:3128" \
  --expect controller-arg=--network-policy=unknown \
  --expect controller-arg=--egress-proxy-pod-port=3128 \
  --expect rule=controller:skill-operator.dev:skilljobs/status:get+patch+update \
  --expect rule=controller:skill-operator.dev:skilljobs/finalizers:update \
  --expect rule=controller:batch:jobs:get+list+watch+create+delete \
  --expect rule=controller::pods:get+list+watch \
  --expect rule=controller:networking.k8s.io:networkpolicies:get+list+watch+create+patch+delete \
  --expect rule=controller::serviceaccounts:get+create+patch \
  --expect rule=controller::secrets:create+delete \
  --expect rule=controller::events:create+patch \
  --expect rule=controller:events.k8s.io:events:create+patch \
  --expect rule=controller::namespaces:get+list+watch \
  --expect rule=artifacts:skill-operator.dev:skilljobs:get \
  --expect rule=artifacts::secrets: \
  --expect no-controller-arg=--label-namespaces \
  --expect "controller-arg=--artifact-endpoint=http://$RELEASE-skill-operator-artifacts.$NS.svc:8443" \
  --expect "controller-arg=--operator-namespace=$NS" \
  --expect controller-arg=--token-key-file=/var/run/skill-operator/key/token-key \
  --expect artifacts-arg=--registry=registry.example.com/skill-operator/artifacts \
  --expect token-key-secret=$RELEASE-skill-operator-token-key
check "checks (values-all.yaml)" rendered all \
  --expect kinds=ClusterRole,ClusterRoleBinding,CustomResourceDefinition,Deployment,NetworkPolicy,Service,ServiceAccount,ServiceMonitor \
  --expect controller-arg=--egress-proxy=10.96.100.11:3128 \
  --expect controller-arg=--network-policy=enforced \
  --expect image-digest=$D1 \
  --expect pull-secret=regcred \
  --expect controller-arg=--label-namespaces \
  --expect rule=controller::namespaces:get+list+watch+patch \
  --expect rule=controller::secrets:create+delete+get \
  --expect controller-arg=--artifact-endpoint=http://10.96.100.10:8443 \
  --expect "controller-arg=--operator-image=ghcr.io/example/skill-operator-runner@$D1" \
  --expect artifacts-arg=--insecure-registry \
  --expect token-key-secret=my-token-key
check "checks (gateway on, artifacts without API access)" rendered variant \
  --expect kinds=ClusterRole,ClusterRoleBinding,Deployment,Secret,Service,ServiceAccount \
  --expect rule=artifacts:skill-operator.dev:skilljobs: \
  --expect no-controller-arg=--egress-proxy \
  --expect controller-arg=--operator-image=ghcr.io/example/skill-operator:1.2.3
check "artifacts pod has no SA token without RBAC" \
  grep -qE '^ +automountServiceAccountToken: false' <(sed -n '/^kind: Deployment/,/^---/p' "$OUT/variant.yaml" | sed -n '/name: rel-test-skill-operator-artifacts/,/containers:/p')
no_shared_names() {
  local a b
  a="$(grep -h -A3 -E '^kind: Cluster(Role|RoleBinding)$' "$OUT/min.yaml" | awk '/^  name:/{print $2}' | sort)"
  b="$(cat "$OUT"/other/*/templates/rbac.yaml | grep -A3 -E '^kind: Cluster(Role|RoleBinding)$' | awk '/^  name:/{print $2}' | sort)"
  [[ -n "$a" && -n "$b" ]] || { echo "no cluster-scoped RBAC found"; return 1; }
  if comm -12 <(echo "$a") <(echo "$b") | grep -q .; then echo "shared: $(comm -12 <(echo "$a") <(echo "$b"))"; return 1; fi
}
check "two releases share no ClusterRole/ClusterRoleBinding name" no_shared_names

# ------------------------------------------------------------ schema: bad values
bad() { # name, --set args...
  local name="$1"
  shift
  check_fails "schema refuses $name" "values don't meet the specifications of the schema" \
    "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" -f "$HERE/values-min.yaml" "$@"
}
bad "image.repository: 123" --set image.repository=123
bad 'controller.replicas: "x"' --set-string controller.replicas=x
bad "controller.replicas: 2 (no leader election)" --set controller.replicas=2
bad 'artifacts.replicas: "x"' --set-string artifacts.replicas=x
bad "securityContext.runAsUser: 0" --set securityContext.runAsUser=0
bad "image.digest without sha256:" --set image.digest=latest
bad "resources.cpu: lots" --set controller.resources.cpu=lots
bad "an unknown key (controler.replicas)" --set controler.replicas=1
bad "podLabels overriding a selector label" --set 'artifacts.podLabels.app\.kubernetes\.io/component=x'
bad "gateway.service.type: ExternalName" --set gateway.service.type=ExternalName
bad "cluster.networkPolicy: maybe" --set cluster.networkPolicy=maybe
bad "egressProxy.networkPolicy.ports: [] (nothing to serve)" --set 'egressProxy.networkPolicy.ports=null'
bad "egressProxy.podCIDRs: a host name" --set 'egressProxy.podCIDRs[0]=pods.example' 

# -------------------------------------------------------------------- samples
check "samples: custom resources against the CRD schemas, references" \
  "$PY" "$HERE/validate_samples.py" config/samples/k8s crds "$OUT/samples-builtin.yaml"
[[ -s "$OUT/samples-builtin.yaml" ]] && check "samples: built-in kinds, kubernetes-validate --strict -k $KVER" validate "$OUT/samples-builtin.yaml"
check "samples: kubectl decodes every file (annotate --local)" \
  "$KUBECTL" annotate --local -o name -f config/samples/k8s/ check=ok
# The sample validator itself catches unknown and mistyped fields.
mkdir -p "$OUT/bad-samples"
cp config/samples/k8s/*.yaml "$OUT/bad-samples/"
printf '  unknownField: 1\n' >>"$OUT/bad-samples/skilljob.yaml"
check_fails "samples: the CR validator refuses an unknown field" "unknownField" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
cp config/samples/k8s/skilljob.yaml "$OUT/bad-samples/skilljob.yaml"
sed -i 's/timeoutSeconds: 30/timeoutSeconds: 900/' "$OUT/bad-samples/skilljob.yaml"
check_fails "samples: the CR validator refuses timeoutSeconds 900" "timeoutSeconds" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"

finish
