#!/usr/bin/env bash
# The gateway's RBAC and the agent sample on a real API server (any cluster
# KUBECONFIG points at; a few seconds). It
#   - server-side dry-runs every object the chart renders (CRDs aside: they are
#     cluster-wide and already installed or not) in a namespace of its own
#     that enforces Pod Security "restricted": accepted, and no Deployment's
#     pod template draws a PodSecurity warning,
#   - applies the gateway's ServiceAccount, ClusterRole, Role and bindings
#     (with one named pull secret) for real and asks the API server
#     (SubjectAccessReview via `auth can-i`) what that account may do:
#     everything it needs, draft records only in its own namespace, that one
#     Secret by name and no other, no pods, no updates of SkillJobs,
#   - applies the artifact endpoint's ServiceAccount, ClusterRole and binding
#     and asks the same: create tokenreviews (run pods' tokens) and get
#     skilljobs, nothing else (no SubjectAccessReviews, Secrets, pods, tokens),
#     and reviews a minted token as that account,
#   - applies config/samples/k8s/agent-rbac.yaml into a namespace of its own,
#     mints the agent a token (TokenRequest), and does what the gateway does
#     as the gateway's account: a TokenReview of that token, then
#     SubjectAccessReviews for the agent in its namespace (allowed) and in
#     another (denied).
# Without a reachable cluster it prints SKIPPED and exits 0. Last line:
# `chart-rbac: N passed, M failed`; exit status 1 when M > 0.
# Env: CHART_RBAC_PREFIX (default chart-rbac): prefix of the release, the
# namespaces and the cluster-scoped names it creates (and deletes afterwards).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DEPS="$ROOT/target/test-deps"
HELM="${HELM:-$DEPS/bin/helm}"
KUBECTL="${KUBECTL:-$DEPS/bin/kubectl}"
CHART=charts/skill-operator
PREFIX="${CHART_RBAC_PREFIX:-chart-rbac}"
RELEASE="$PREFIX"
OPNS="$PREFIX-system"
AGENTNS="$PREFIX-agents"
OTHERNS="$PREFIX-other"
OUT="$ROOT/target/chart-rbac"

if [[ -z "${KUBECONFIG:-}" ]]; then echo "SKIPPED: KUBECONFIG is not set"; exit 0; fi
# Before the reachability probe, which would read a missing kubectl as "no cluster".
for tool in "$HELM" "$KUBECTL"; do
  [[ -x "$tool" ]] || { echo "chart-rbac: missing: $tool (run: bash scripts/install-test-deps.sh)"; exit 1; }
done
if ! "$KUBECTL" version --request-timeout=5s >/dev/null 2>&1; then
  echo "SKIPPED: KUBECONFIG does not point at a reachable cluster"
  exit 0
fi

passed=0
failed=0
pass() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$1"; [[ -n "${2:-}" ]] && printf '%s\n' "$2" | sed 's/^/     | /' | head -n 20; }
check() {
  local name="$1" out
  shift
  if out="$("$@" 2>&1)"; then pass "$name"; else fail "$name" "$out"; fi
}

GATEWAY_SA="$RELEASE-skill-operator-gateway"
GATEWAY="system:serviceaccount:$OPNS:$GATEWAY_SA"
ARTIFACTS_SA="$RELEASE-skill-operator-artifacts"
ARTIFACTS="system:serviceaccount:$OPNS:$ARTIFACTS_SA"
AGENT="system:serviceaccount:$AGENTNS:skills-agent"
cleanup() {
  "$KUBECTL" delete clusterrolebinding,clusterrole "$GATEWAY_SA" "$ARTIFACTS_SA" --ignore-not-found --wait=false >/dev/null 2>&1
  "$KUBECTL" delete namespace "$OPNS" "$AGENTNS" "$OTHERNS" --ignore-not-found --wait=false >/dev/null 2>&1
}
trap cleanup EXIT
rm -rf "$OUT"
mkdir -p "$OUT"
for ns in "$OPNS" "$AGENTNS" "$OTHERNS"; do
  # An earlier run's namespace may still be terminating.
  "$KUBECTL" wait --for=delete "namespace/$ns" --timeout=120s >/dev/null 2>&1
  "$KUBECTL" create namespace "$ns" >/dev/null 2>&1 || "$KUBECTL" get namespace "$ns" >/dev/null
done

"$HELM" template "$RELEASE" "$CHART" --namespace "$OPNS" --set crds.install=false \
  --set artifacts.registry=registry.example.com/skill-operator/artifacts >"$OUT/all.yaml"
"$KUBECTL" label namespace "$OPNS" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/warn=restricted --overwrite >/dev/null
dry_run() {
  local out
  out="$("$KUBECTL" apply --dry-run=server -f "$OUT/all.yaml" 2>&1)" || { echo "$out"; return 1; }
  if grep -i "podsecurity\|warning" <<<"$out"; then return 1; fi
  grep -q "deployment.apps/$RELEASE-skill-operator-gateway created (server dry run)" <<<"$out" \
    || { echo "the gateway Deployment was not dry-run: $out"; return 1; }
}
check "the API server accepts every rendered object, no PodSecurity warning (server-side dry run)" dry_run
# The defaults (no values): the built-in store on its claim, the samples'
# ConfigMap and the artifacts RBAC that applies them.
"$HELM" template "$RELEASE" "$CHART" --namespace "$OPNS" --set crds.install=false >"$OUT/defaults.yaml"
dry_run_defaults() {
  local out
  out="$("$KUBECTL" apply --dry-run=server -f "$OUT/defaults.yaml" 2>&1)" || { echo "$out"; return 1; }
  if grep -i "podsecurity\|warning" <<<"$out"; then return 1; fi
  grep -q "persistentvolumeclaim/$RELEASE-skill-operator-artifacts-store created (server dry run)" <<<"$out" \
    && grep -q "configmap/$RELEASE-skill-operator-samples created (server dry run)" <<<"$out" \
    || { echo "the store's claim or the samples' ConfigMap was not dry-run: $out"; return 1; }
}
check "with no values (built-in store, samples) the API server accepts every object, no PodSecurity warning" dry_run_defaults

"$HELM" template "$RELEASE" "$CHART" --namespace "$OPNS" --set crds.install=false \
  --set artifacts.registry=registry.example.com/skill-operator/artifacts \
  --set 'gateway.rbac.pullSecrets={registry-creds}' \
  --show-only templates/gateway-rbac.yaml --show-only templates/serviceaccounts.yaml >"$OUT/gateway-rbac.yaml"
check "the gateway's ServiceAccount, ClusterRole and binding apply" "$KUBECTL" apply -f "$OUT/gateway-rbac.yaml"

# can AS VERB RESOURCE [ARGS...]: the API server answers yes (stdout only:
# kubectl warns on stderr about cluster-scoped resources).
answer() { "$KUBECTL" auth can-i "$@" 2>/dev/null; }
can() { local as="$1"; shift; [[ "$(answer --as "$as" "$@")" == yes ]] || { echo "$as cannot $*"; return 1; }; }
cannot() { local as="$1"; shift; [[ "$(answer --as "$as" "$@")" == no ]] || { echo "$as can $*"; return 1; }; }
for v in "create tokenreviews.authentication.k8s.io" "create subjectaccessreviews.authorization.k8s.io" \
  "list skillbindings.skill-operator.dev -A" "watch skillbindings.skill-operator.dev -A" \
  "get skillpackages.skill-operator.dev" "watch skillpackages.skill-operator.dev" \
  "create skilljobs.skill-operator.dev -n $OTHERNS" "watch skilljobs.skill-operator.dev -A" \
  "delete skilljobs.skill-operator.dev -n $AGENTNS" "patch skilljobs.skill-operator.dev -n $AGENTNS" \
  "create configmaps -n $OPNS" "update configmaps -n $OPNS" "list configmaps -n $OPNS" "delete configmaps -n $OPNS" \
  "get secrets/registry-creds -n $OPNS" "list namespaces" "watch namespaces"; do
  # shellcheck disable=SC2086
  check "gateway may $v" can "$GATEWAY" $v
done
for v in "get secrets -A" "list secrets -n $OPNS" "create pods -n $AGENTNS" "update skilljobs.skill-operator.dev -n $AGENTNS" \
  "create skillbindings.skill-operator.dev -n $AGENTNS" "update skilljobs.skill-operator.dev/status -n $AGENTNS" \
  "create serviceaccounts/token -n $AGENTNS" "impersonate users" "create jobs.batch -n $AGENTNS" \
  "create configmaps -n $AGENTNS" "get configmaps -n $OTHERNS" "get secrets/other -n $OPNS" "get secrets/registry-creds -n $AGENTNS" \
  "watch secrets -n $OPNS" "patch namespaces" "update namespaces"; do
  # shellcheck disable=SC2086
  check "gateway may not $v" cannot "$GATEWAY" $v
done

# The artifact endpoint's account alone (its documents out of rbac.yaml and
# serviceaccounts.yaml; no samples, so no SkillPackage rules).
"$HELM" template "$RELEASE" "$CHART" --namespace "$OPNS" --set crds.install=false --set samples.enabled=false \
  --set artifacts.registry=registry.example.com/skill-operator/artifacts \
  --show-only templates/rbac.yaml --show-only templates/serviceaccounts.yaml \
  | awk -v name="$ARTIFACTS_SA" 'BEGIN { RS = "\n---\n" } index($0, "\n  name: " name "\n") { print "---"; print }' >"$OUT/artifacts-rbac.yaml"
check "the artifact endpoint's ServiceAccount, ClusterRole and binding apply" "$KUBECTL" apply -f "$OUT/artifacts-rbac.yaml"
# subjectaccessreviews: with metrics.auth=kubernetes (the default), whether a
# scraper's token may get /metrics.
for v in "create tokenreviews.authentication.k8s.io" "get skilljobs.skill-operator.dev -n $AGENTNS" \
  "create subjectaccessreviews.authorization.k8s.io"; do
  # shellcheck disable=SC2086
  check "artifacts may $v" can "$ARTIFACTS" $v
done
for v in "get secrets -n $OPNS" "get secrets -A" "get pods -n $AGENTNS" \
  "create serviceaccounts/token -n $AGENTNS" "list skilljobs.skill-operator.dev -A" "create skillpackages.skill-operator.dev" \
  "impersonate users"; do
  # shellcheck disable=SC2086
  check "artifacts may not $v" cannot "$ARTIFACTS" $v
done

sed "s/namespace: skills-demo/namespace: $AGENTNS/" config/samples/k8s/agent-rbac.yaml >"$OUT/agent-rbac.yaml"
check "config/samples/k8s/agent-rbac.yaml applies" "$KUBECTL" apply -f "$OUT/agent-rbac.yaml"
for v in "get skillbindings.skill-operator.dev" "create skilljobs.skill-operator.dev" "get skilljobs.skill-operator.dev" "delete skilljobs.skill-operator.dev"; do
  # shellcheck disable=SC2086
  check "agent may $v in its namespace" can "$AGENT" $v -n "$AGENTNS"
done
for v in "create skilljobs.skill-operator.dev -n $OTHERNS" "get skillbindings.skill-operator.dev -n $OTHERNS" \
  "get secrets -n $AGENTNS" "update skilljobs.skill-operator.dev -n $AGENTNS" "create pods -n $AGENTNS"; do
  # shellcheck disable=SC2086
  check "agent may not $v" cannot "$AGENT" $v
done

# What the gateway and the artifact endpoint do with a token, as their accounts.
token_review() { # account reviewing the agent's minted token
  local token user
  token="$("$KUBECTL" -n "$AGENTNS" create token skills-agent --duration 10m)" || return 1
  user="$("$KUBECTL" create --validate=false --as "$1" -o jsonpath='{.status.authenticated} {.status.user.username}' -f - <<YAML
apiVersion: authentication.k8s.io/v1
kind: TokenReview
spec:
  token: $token
YAML
)" || return 1
  [[ "$user" == "true $AGENT" ]] || { echo "TokenReview said: $user"; return 1; }
}
check "the gateway's account reviews the agent's minted token: authenticated as $AGENT" token_review "$GATEWAY"
check "the artifact endpoint's account may review a token (TokenReview)" token_review "$ARTIFACTS"
sar() { # namespace, verb, resource -> prints allowed
  "$KUBECTL" create --validate=false --as "$GATEWAY" -o jsonpath='{.status.allowed}' -f - <<YAML
apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec:
  user: $AGENT
  groups: ["system:serviceaccounts", "system:serviceaccounts:$AGENTNS", "system:authenticated"]
  resourceAttributes: {namespace: $1, verb: $2, group: skill-operator.dev, resource: $3}
YAML
}
allowed() { [[ "$(sar "$@")" == true ]] || { echo "not allowed: $*"; return 1; }; }
denied() { local got; got="$(sar "$@")" || return 1; [[ "$got" != true ]] || { echo "allowed: $*"; return 1; }; }
check "SubjectAccessReview by the gateway: agent may create skilljobs in $AGENTNS" allowed "$AGENTNS" create skilljobs
check "SubjectAccessReview by the gateway: agent may get skillbindings in $AGENTNS" allowed "$AGENTNS" get skillbindings
check "SubjectAccessReview by the gateway: agent may not create skilljobs in $OTHERNS" denied "$OTHERNS" create skilljobs
check "SubjectAccessReview by the gateway: agent may not get skillbindings in $OTHERNS" denied "$OTHERNS" get skillbindings

echo "chart-rbac: $passed passed, $failed failed"
((failed == 0))
