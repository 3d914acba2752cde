#!/usr/bin/env bash
# The Helm chart's render test (no cluster needed; about 10 s):
#   - the chart's CRD copies (charts/skill-operator/files/crds) equal crds/ (drift)
#   - helm lint --strict: default values, and values-all.yaml (every option on)
#   - helm template: no values at all (the built-in store, samples, gateway),
#     values-min.yaml (empty), an external registry, values-all.yaml; the
#     store's volume (claim kept on uninstall, or emptyDir), one replica only
#   - every rendered manifest passes kubernetes-validate --strict for 1.34
#     (CRDs as CustomResourceDefinition objects; the ServiceMonitor, not a
#     built-in kind, is checked by check_rendered.py instead)
#   - check_rendered.py: restricted Pod Security on every container, requests ==
#     limits, probes, SA tokens only where the API is used, release name in every
#     cluster-scoped name, CRDs keep + identical to crds/, NetworkPolicy peer
#     labels, RBAC verbs per option; the gateway (gateway_checks.py): its
#     ClusterRole is exactly the issue's list, PDB iff replicas > 1, its
#     NetworkPolicy, args, probes, Service; its Role in the release namespace
#     reads the catalog ConfigMap by name only (get/list/watch, resourceNames);
#     altered renderings prove those checks fail (a Secrets rule, a wildcard,
#     an extra verb, a PDB missing or superfluous, the catalog rule unnamed,
#     without watch or elsewhere)
#   - NOTES.txt (helm install --dry-run=client): the gateway URL and the RBAC an
#     agent needs; the anonymous warning only with gateway.auth.allowAnonymous
#   - the values tests/kind/run.sh installs with on the local cluster render and lint
#   - bad values fail through values.schema.json
#   - config/samples/k8s: custom resources against the CRD schemas (strict,
#     validate_samples.py), built-in kinds with kubernetes-validate --strict;
#     kubectl decodes everything offline (`annotate --local`: `apply
#     --dry-run=client` needs an API server for discovery)
# Needs target/test-deps from scripts/install-test-deps.sh (helm, kubectl, venv).
# The gateway RBAC and agent sample on a real API server: tests/chart/cluster_rbac.sh.
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
check "helm template with no values at all" render none
check "helm template (values-min.yaml)" render min -f "$HERE/values-min.yaml"
check "helm template (an external registry)" render registry --set artifacts.registry=registry.example.com/skill-operator/artifacts \
  --set artifacts.replicas=2
check "helm template (built-in store on an emptyDir, no samples)" render emptydir --set artifacts.persistence.enabled=false \
  --set samples.enabled=false
check "helm template (built-in store, a named StorageClass, pinned ClusterIP)" render store-ip \
  --set artifacts.persistence.storageClassName=fast --set artifacts.service.clusterIP=10.96.0.50 \
  --set samples.images.python=registry.example.com/python:3.13 --set samples.interpreterPaths.python=/usr/bin/python3 \
  --set samples.resources.cpu=250m
check_fails "helm template refuses 2 replicas on the built-in store" "not shared between replicas" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" --set artifacts.replicas=2
check "helm template (values-all.yaml)" render all -f "$HERE/values-all.yaml"
check "helm template (gateway on, artifacts without get skilljobs or samples)" render variant -f "$HERE/values-min.yaml" \
  --set gateway.enabled=true --set artifacts.rbac.getSkillJobs=false --set samples.enabled=false --set crds.install=false --set egressProxy.enabled=false \
  --set image.tag=1.2.3
check "helm template (gateway off)" render gw-off -f "$HERE/values-min.yaml" --set gateway.enabled=false
check "helm template (gateway: 1 replica, no NetworkPolicy, no per-namespace limits)" render gw-one -f "$HERE/values-min.yaml" \
  --set gateway.replicas=1 --set gateway.networkPolicy.enabled=false --set gateway.rateLimits.perNamespace=false
# SkillSources: the push repository, and private-repository Secrets the
# controller may read by name only, in the release namespace only.
sources_rbac() {
  render sources -f "$HERE/values-min.yaml" --set controller.sources.repository=registry.example.com/skills \
    --set 'controller.sources.secretNames={repo-token,other-token}' || return 1
  "$PY" - "$OUT/sources.yaml" "$NS" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-controller-sources")]
assert len(roles) == 1, "one Role for the source Secrets"
role = roles[0]
assert role["metadata"]["namespace"] == sys.argv[2], role["metadata"]
assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["repo-token", "other-token"], "verbs": ["get"]}], role["rules"]
bound = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"]]
assert len(bound) == 1 and bound[0]["subjects"][0]["name"].endswith("-controller"), bound
ctrl = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-controller")][0]
args = ctrl["spec"]["template"]["spec"]["containers"][0]["args"]
assert "--source-repository=registry.example.com/skills" in args, args
cr = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-controller")][0]
secrets = [r for r in cr["rules"] if "secrets" in r["resources"]]
assert all("get" not in r["verbs"] for r in secrets), "no cluster-wide get on Secrets for sources"
PY
  # Without names there is no Role at all.
  ! grep -q -- "-controller-sources" "$OUT/min.yaml"
}
check "sources: a Role to get the listed Secrets by name, in the release namespace only; --source-repository" sources_rbac
check_fails "the values schema refuses a Secret name that is not a DNS subdomain" "secretNames" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" -f "$HERE/values-min.yaml" --set 'controller.sources.secretNames={Bad_Name}'
# The values tests/kind/run.sh installs with on the local cluster.
KIND_VALUES=(--set image.repository=127.0.0.1:5000/skill-operator --set "image.digest=sha256:$(printf '%064d' 2)"
  --set artifacts.registry=10.88.0.1:5001/skill-operator/jobs --set artifacts.insecureRegistry=true
  --set artifacts.service.clusterIP=10.0.0.50)
check "helm lint --strict (tests/kind/run.sh's local-cluster values)" "$HELM" lint --strict "$CHART" "${KIND_VALUES[@]}"
check "helm template (tests/kind/run.sh's local-cluster values)" render kind "${KIND_VALUES[@]}"
check_fails "helm template refuses gateway.cache.maxBytes beyond the cache volume" "exceeds the cache volume" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" -f "$HERE/values-min.yaml" \
  --set gateway.cache.sizeMiB=64 --set gateway.cache.maxBytes=67108865
check_fails "the values schema refuses an unknown controller.prepare.imageMode" "imageMode" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" -f "$HERE/values-min.yaml" --set controller.prepare.imageMode=docker
check_fails "the values schema refuses an image repository with a tag" "imageRepository" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" -f "$HERE/values-min.yaml" \
  --set controller.prepare.imageRepository=registry.example.com/skills:latest
# Different releases never share a cluster-scoped name.
check "helm template (a second release)" "$HELM" template other "$CHART" --namespace "$NS" \
  -f "$HERE/values-min.yaml" --output-dir "$OUT/other"

# kubernetes-validate --strict: every object passes; the only schema-less kinds
# allowed are the Prometheus Operator's ServiceMonitor and PrometheusRule.
validate() { # file
  local out
  out="$("$KV" --strict -k "$KVER" "$1" 2>&1)" || { echo "$out"; return 1; }
  if grep -v '^INFO ' <<<"$out" | grep -Ev "Couldn't find schema for kind (ServiceMonitor|PrometheusRule) with api version monitoring.coreos.com/v1" | grep -q .; then
    echo "$out" | grep -v '^INFO '
    return 1
  fi
  grep -q "passed for resource" <<<"$out" || { echo "nothing validated: $out"; return 1; }
}
for r in none min registry emptydir store-ip all variant gw-off gw-one kind; do
  [[ -s "$OUT/$r.yaml" ]] && check "kubernetes-validate --strict -k $KVER ($r)" validate "$OUT/$r.yaml"
done
# kubectl --dry-run=client still needs a server for discovery; `annotate
# --local` decodes every object the way kubectl apply would, offline.
check "kubectl decodes every rendered object (values-all.yaml)" \
  "$KUBECTL" annotate --local -o name -f "$OUT/all.yaml" check=ok

# ----------------------------------------------------------- rendered checks
rendered() { "$PY" "$HERE/check_rendered.py" "$OUT/$1.yaml" "$RELEASE" crds "${@:2}"; }
D1=sha256:1111111111111111111111111111111111111111111111111111111111111111
check "checks (no values at all)" rendered none \
  --expect kinds=ClusterRole,ClusterRoleBinding,ConfigMap,CustomResourceDefinition,Deployment,NetworkPolicy,PersistentVolumeClaim,PodDisruptionBudget,Role,RoleBinding,Secret,Service,ServiceAccount,ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding \
  --expect store=pvc --expect samples=5 --expect gateway-pdb=present --expect gateway-netpol=present \
  --expect artifacts-arg=--sample-packages=/etc/skill-operator/samples/skillpackages.json \
  --expect "controller-arg=--artifact-endpoint=http://$RELEASE-skill-operator-artifacts.$NS.svc:8443" \
  --expect "controller-arg=--operator-image=ghcr.io/skill-operator/skill-operator:$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' "$CHART/Chart.yaml")" \
  --expect controller-arg=--operator-image-pull-policy=IfNotPresent \
  --expect no-gateway-arg=--token-audience --expect no-gateway-arg=--allow-anonymous
check "checks (an external registry)" rendered registry --expect store=absent --expect samples=0 \
  --expect artifacts-arg=--registry=registry.example.com/skill-operator/artifacts
check "checks (built-in store on an emptyDir, no samples)" rendered emptydir --expect store=emptyDir --expect samples=0 \
  --expect artifacts-arg=--no-samples
check "checks (built-in store, a named StorageClass, pinned ClusterIP)" rendered store-ip --expect store=pvc --expect samples=5 \
  --expect controller-arg=--artifact-endpoint=http://10.96.0.50:8443
sample_profile() { # the python sample's profile takes samples.images / interpreterPaths
  grep -qF 'registry.example.com/python:3.13' "$OUT/store-ip.yaml" && grep -qF '/usr/bin/python3' "$OUT/store-ip.yaml" \
    && grep -qF '10.96.0.50:8443/samples/csv-stats:latest' "$OUT/store-ip.yaml" && grep -qF 'storageClassName: fast' "$OUT/store-ip.yaml" \
    && grep -qF '\"resources\":{\"cpu\":\"250m\"}' "$OUT/store-ip.yaml"
}
check "samples: the profile's image, interpreter path and the store by its pinned IP" sample_profile
check "checks (values-min.yaml)" rendered min \
  --expect kinds=ClusterRole,ClusterRoleBinding,ConfigMap,CustomResourceDefinition,Deployment,NetworkPolicy,PersistentVolumeClaim,PodDisruptionBudget,Role,RoleBinding,Secret,Service,ServiceAccount,ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding \
  --expect rule=controller:skill-operator.dev:skilljobs:get+list+watch+patch+update \
  --expect rule=egress-proxy:skill-operator.dev:skilljobs:get+list+watch \
  --expect rule=egress-proxy::secrets: \
  --expect "controller-arg=--egress-proxy=$RELEASE-skill-operator-egress-proxy.$NS.svc:3128" \
  --expect controller-arg=--network-policy=unknown \
  --expect controller-arg=--egress-proxy-pod-port=3128 \
  --expect no-controller-arg=--egress-cilium --expect nsrule=controller-cilium:cilium.io:ciliumnetworkpolicies: \
  --expect proxy-internet=present \
  --expect rule=controller:skill-operator.dev:skilljobs/status:get+patch+update \
  --expect rule=controller:skill-operator.dev:skilljobs/finalizers:update \
  --expect rule=controller:batch:jobs:get+list+watch+create+delete \
  --expect rule=controller::pods:create+delete+get+list+patch+watch \
  --expect rule=controller:networking.k8s.io:networkpolicies:get+list+watch+create+patch+delete \
  --expect rule=controller::serviceaccounts:get+create+patch \
  --expect rule=controller::secrets:create+delete \
  --expect rule=controller::events:create+patch \
  --expect rule=controller:events.k8s.io:events:create+patch \
  --expect rule=controller::namespaces:get+list+watch \
  --expect rule=artifacts:skill-operator.dev:skilljobs:get \
  --expect rule=artifacts::secrets: \
  --expect rule=artifacts:authentication.k8s.io:tokenreviews:create \
  --expect artifacts-grants=authentication.k8s.io/tokenreviews,authorization.k8s.io/subjectaccessreviews,skill-operator.dev/skilljobs,skill-operator.dev/skillpackages \
  --expect artifacts-arg=--pod-tokens \
  --expect no-controller-arg=--label-namespaces \
  --expect no-controller-arg=--image-repository --expect no-controller-arg=--image-registry-config \
  --expect controller-arg=--image-mode=composed --expect controller-arg=--image-volumes=auto \
  --expect "controller-arg=--build-namespace=$NS" --expect controller-arg=--base-image-python=python:3.12-slim \
  --expect no-controller-arg=--plain-http-registry --expect rule=controller::nodes: \
  --expect "controller-arg=--artifact-endpoint=http://$RELEASE-skill-operator-artifacts.$NS.svc:8443" \
  --expect "controller-arg=--operator-namespace=$NS" \
  --expect controller-arg=--token-key-file=/var/run/skill-operator/key/token-key \
  --expect artifacts-arg=--store=/var/lib/skill-operator/store --expect store=pvc --expect samples=5 \
  --expect token-key-secret=$RELEASE-skill-operator-token-key \
  --expect gateway-pdb=present --expect gateway-netpol=present --expect "gateway-catalog=$NS" \
  --expect "gateway-arg=--artifact-endpoint=http://$RELEASE-skill-operator-artifacts.$NS.svc:8443" \
  --expect gateway-arg=--confirm=ask --expect gateway-arg=--on-disconnect=cancel \
  --expect gateway-arg=--cache-max-bytes=805306368 --expect gateway-pull-secrets= \
  --expect gateway-arg=--rate-calls-per-minute=600 --expect gateway-arg=--rate-runs-per-minute=60 \
  --expect gateway-arg=--rate-burst-calls=60 --expect gateway-arg=--rate-burst-runs=10 \
  --expect gateway-arg=--namespace-rate-limits --expect gateway-arg=--rate-limits-unreadable=closed \
  --expect no-gateway-arg=--allow-anonymous --expect no-gateway-arg=--token-audience \
  --expect no-gateway-arg=--max- --expect no-gateway-arg=--auth- --expect no-gateway-arg=--public-url \
  --expect no-gateway-arg=--authorization-server --expect no-gateway-arg=--plain-http-registry \
  --expect no-controller-arg=--no-audit-stdout --expect no-gateway-arg=--no-audit-stdout --expect no-egress-arg=--no-audit-stdout \
  --expect no-env=controller:OTEL_ --expect no-env=gateway:OTEL_
check "checks (values-all.yaml)" rendered all \
  --expect kinds=ClusterRole,ClusterRoleBinding,ConfigMap,CustomResourceDefinition,Deployment,NetworkPolicy,PodDisruptionBudget,PrometheusRule,Role,RoleBinding,Service,ServiceAccount,ServiceMonitor,ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding \
  --expect monitors=controller,egress-proxy,gateway \
  --expect controller-arg=--egress-proxy=10.96.100.11:3128 \
  --expect controller-arg=--network-policy=enforced \
  --expect controller-arg=--egress-cilium-fqdn-policy \
  --expect "controller-arg=--egress-cilium-policy-name=$RELEASE-skills-egress-proxy" \
  --expect controller-arg=--egress-cilium-dns-namespace=kube-system \
  --expect controller-arg=--egress-cilium-dns-pod-label=k8s-app=kube-dns \
  --expect nsrule=controller-cilium:cilium.io:ciliumnetworkpolicies:get+list+watch+create+patch+delete \
  --expect proxy-internet=absent \
  --expect image-digest=$D1 \
  --expect pull-secret=regcred \
  --expect controller-arg=--label-namespaces \
  --expect rule=controller::namespaces:get+list+watch+patch \
  --expect controller-arg=--image-repository=registry.example.com:5000/skills/prepared \
  --expect controller-arg=--image-registry-config=/var/run/skill-operator/registry/config.json \
  --expect controller-arg=--image-mode=image-volume --expect controller-arg=--image-volumes=auto \
  --expect controller-arg=--build-namespace=skill-builds --expect controller-arg=--build-platform=linux/amd64 \
  --expect controller-arg=--pip-index-url=https://pypi.example.com/simple --expect controller-arg=--npm-registry=https://npm.example.com \
  --expect controller-arg=--plain-http-registry=registry.example.com:5000 --expect rule=controller::nodes:list \
  --expect rule=controller::secrets:create+delete+get \
  --expect controller-arg=--artifact-endpoint=http://10.96.100.10:8443 \
  --expect "controller-arg=--operator-image=ghcr.io/example/skill-operator-runner@$D1" \
  --expect artifacts-arg=--insecure-registry \
  --expect token-key-secret=my-token-key \
  --expect gateway-arg=--allow-anonymous --expect gateway-arg=--confirm=auto --expect gateway-arg=--on-disconnect=keep \
  --expect gateway-arg=--artifact-endpoint=http://10.96.100.10:8443 \
  --expect gateway-arg=--allowed-host=mcp.example.com:8443 --expect gateway-arg=--cache-max-bytes=1073741824 \
  --expect gateway-arg=--token-audience=skill-operator-gateway --expect gateway-arg=--token-audience=https://kubernetes.default.svc \
  --expect gateway-arg=--auth-cache-ttl-secs=30 --expect gateway-arg=--auth-negative-ttl-secs=0 \
  --expect gateway-arg=--auth-decision-ttl-secs=5 --expect gateway-arg=--auth-cache-entries=8192 \
  --expect gateway-arg=--authorization-server=https://oidc.example.com --expect gateway-arg=--public-url=https://mcp.example.com \
  --expect gateway-arg=--max-namespaces=500 --expect gateway-arg=--max-sessions=64 \
  --expect gateway-arg=--rate-calls-per-minute=0 --expect gateway-arg=--rate-runs-per-minute=30 \
  --expect gateway-arg=--rate-burst-calls=0 --expect gateway-arg=--rate-burst-runs=3 \
  --expect gateway-arg=--namespace-rate-limits --expect gateway-arg=--rate-limits-unreadable=open \
  --expect gateway-arg=--plain-http-registry=registry.example.com:5000 --expect gateway-arg=--example-flag \
  --expect gateway-pull-secrets=registry-a,registry-b \
  --expect controller-arg=--no-audit-stdout --expect gateway-arg=--no-audit-stdout --expect egress-arg=--no-audit-stdout \
  --expect env=controller:OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector.observability:4318 \
  --expect env=gateway:OTEL_TRACES_SAMPLER_ARG=0.25 --expect env=gateway:OTEL_EXPORTER_OTLP_PROTOCOL=http/json \
  --expect gateway-netpol-port=4318
check "checks (gateway on, artifacts without get skilljobs or samples)" rendered variant \
  --expect kinds=ClusterRole,ClusterRoleBinding,Deployment,NetworkPolicy,PersistentVolumeClaim,PodDisruptionBudget,Role,RoleBinding,Secret,Service,ServiceAccount,ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding \
  --expect rule=artifacts:skill-operator.dev:skilljobs: \
  --expect rule=artifacts:authentication.k8s.io:tokenreviews:create \
  --expect artifacts-grants=authentication.k8s.io/tokenreviews,authorization.k8s.io/subjectaccessreviews --expect artifacts-arg=--pod-tokens \
  --expect no-controller-arg=--egress-proxy --expect no-controller-arg=--egress-cilium \
  --expect nsrule=controller-cilium:cilium.io:ciliumnetworkpolicies: \
  --expect controller-arg=--operator-image=ghcr.io/skill-operator/skill-operator:1.2.3
check "checks (gateway off)" rendered gw-off --expect gateway=absent \
  --expect kinds=ClusterRole,ClusterRoleBinding,ConfigMap,CustomResourceDefinition,Deployment,NetworkPolicy,PersistentVolumeClaim,Role,RoleBinding,Secret,Service,ServiceAccount,ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding
check "checks (gateway: 1 replica, no NetworkPolicy, no per-namespace limits)" rendered gw-one \
  --expect gateway-pdb=absent --expect gateway-netpol=absent \
  --expect no-gateway-arg=--namespace-rate-limits --expect no-gateway-arg=--rate-limits-unreadable
check "checks (tests/kind/run.sh's local-cluster values)" rendered kind \
  --expect gateway-arg=--artifact-endpoint=http://10.0.0.50:8443 --expect gateway-pdb=present

# The gateway checks fail on a rendering that breaks them (each altered copy
# of a rendering must be refused, naming the problem).
altered() { # name, source rendering, python statement on `objs` (and `by`)
  "$PY" - "$OUT/$2.yaml" "$OUT/altered-$1.yaml" "$3" <<'PY'
import sys, yaml
src, dst, stmt = sys.argv[1:4]
objs = [d for d in yaml.safe_load_all(open(src)) if d]
by = lambda kind, suffix: next(o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix))
exec(stmt)
yaml.safe_dump_all(objs, open(dst, "w"), sort_keys=False)
PY
  rendered "altered-$1" "${@:4}"
}
check_fails "the store check sees a claim without resource-policy keep" "FAIL expect store=pvc: the claim lacks" \
  altered no-keep none 'by("PersistentVolumeClaim", "-artifacts-store")["metadata"]["annotations"].pop("helm.sh/resource-policy")' --expect store=pvc
check_fails "the samples check sees a sample naming another registry" "does not name the store" \
  altered other-registry none 'import json; m = by("ConfigMap", "-samples"); ps = json.loads(m["data"]["skillpackages.json"]); ps[0]["spec"]["source"]["oci"]["reference"] = "evil.example/x:1"; m["data"]["skillpackages.json"] = json.dumps(ps)' --expect samples=5
check_fails "the samples check sees get on every SkillPackage" "artifacts skillpackages rules" \
  altered wide-samples none 'by("ClusterRole", "-artifacts")["rules"][-1].pop("resourceNames")' --expect samples=5
check_fails "the alert check refuses an alert without a severity" "FAIL prometheusrule: SkillOperatorRunsFailing: severity" \
  altered no-severity all 'by("PrometheusRule", "")["spec"]["groups"][0]["rules"][0]["labels"].pop("severity")'
check_fails "the dashboard check refuses a panel not filtered by namespace" "FAIL dashboard: .*not filtered by" \
  altered unscoped all 'import json; m = by("ConfigMap", "-dashboard"); d = json.loads(m["data"]["skill-operator.json"]); d["panels"][1]["targets"][0]["expr"] = "sum(skill_operator_jobs_created_total)"; m["data"]["skill-operator.json"] = json.dumps(d)'
check_fails "gateway checks refuse a Namespace grant the gateway does not use" "FAIL gateway-rbac: ClusterRole: grants \\('', 'namespaces', 'list'\\)" \
  altered unused-namespaces gw-one 'by("ClusterRole", "-gateway")["rules"].append({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]})'
check_fails "gateway checks refuse per-namespace limits without the Namespace grant" "FAIL gateway-rbac: ClusterRole: lacks \\('', 'namespaces', 'list'\\)" \
  altered no-namespaces min 'by("ClusterRole", "-gateway")["rules"].pop()'
check_fails "gateway checks refuse the collector's rule on a port the gateway does not export to" "FAIL gateway-netpol: egress to pods .*opentelemetry-collector.* on .9999." \
  altered collector-port all 'next(r for r in by("NetworkPolicy", "-gateway")["spec"]["egress"] if r["ports"][0]["port"] == 4318)["ports"][0]["port"] = 9999'
check_fails "gateway checks refuse a Secrets rule in the gateway ClusterRole" "FAIL gateway-rbac: ClusterRole: get on ''/secrets" \
  altered secrets min 'by("ClusterRole", "-gateway")["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})'
check_fails "gateway checks refuse a wildcard verb" "FAIL gateway-rbac: ClusterRole: wildcard" \
  altered wildcard min 'by("ClusterRole", "-gateway")["rules"][3]["verbs"] = ["*"]'
check_fails "gateway checks refuse an extra verb (update skilljobs)" "FAIL gateway-rbac: ClusterRole: grants .*'update'" \
  altered extra-verb min 'by("ClusterRole", "-gateway")["rules"][3]["verbs"].append("update")'
check_fails "gateway checks refuse a missing verb (create tokenreviews)" "FAIL gateway-rbac: ClusterRole: lacks .*tokenreviews" \
  altered missing-verb min 'by("ClusterRole", "-gateway")["rules"].pop(0)'
check_fails "gateway checks refuse the binding to another subject" "FAIL gateway-rbac: ClusterRoleBinding subjects" \
  altered subject min 'by("ClusterRoleBinding", "-gateway")["subjects"].append({"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"})'
check_fails "gateway checks refuse get on every Secret in the gateway Role" "FAIL gateway-rbac: Role: get on ''/secrets" \
  altered role-secrets min 'by("Role", "-gateway")["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})'
check_fails "gateway checks refuse list on the named pull secrets" "FAIL gateway-rbac: Role: .*resourceNames" \
  altered role-list-secrets all 'by("Role", "-gateway")["rules"][1]["verbs"].append("list")'
check_fails "gateway checks refuse the catalog ConfigMap rule without its name" "FAIL gateway-rbac: Role: .*resourceNames" \
  altered catalog-unnamed min 'next(r for r in by("Role", "-gateway")["rules"] if "watch" in r["verbs"]).pop("resourceNames")'
check_fails "gateway checks refuse the catalog ConfigMap rule without watch" "FAIL gateway-rbac: Role: catalog rules" \
  altered catalog-no-watch min 'next(r for r in by("Role", "-gateway")["rules"] if "watch" in r["verbs"])["verbs"].remove("watch")'
check_fails "gateway checks refuse the catalog ConfigMap rule in another namespace" "FAIL expect gateway-catalog=" \
  altered catalog-elsewhere all 'by("Role", "-gateway")["metadata"]["namespace"] = "elsewhere"' --expect gateway-catalog=skill-system
check_fails "gateway checks refuse configmaps cluster-wide" "FAIL gateway-rbac: ClusterRole: grants .*configmaps" \
  altered cluster-configmaps min 'by("ClusterRole", "-gateway")["rules"].append({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]})'
check "helm template (3 controller replicas)" render ctl-ha -f "$HERE/values-min.yaml" --set controller.replicas=3 \
  --set controller.leaderElection.leaseDuration=30 --set controller.leaderElection.renewDeadline=20 --set controller.leaderElection.retryPeriod=5
check "checks (3 controller replicas: PDB, spread, the Lease Role, the timings)" rendered ctl-ha \
  --expect controller-arg=--leader-elect-lease-duration=30 --expect controller-arg=--leader-elect-renew-deadline=20 \
  --expect controller-arg=--leader-elect-retry-period=5 --expect "controller-arg=--leader-elect-lease-name=$RELEASE-skill-operator-controller"
check_fails "helm template refuses leader timings where a standby may start before the leader stops" "renewDeadline .* < leaseDuration" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" --set controller.leaderElection.renewDeadline=15
check_fails "controller checks refuse 3 replicas without a PDB" "FAIL controller-ha: 0 controller PodDisruptionBudgets" \
  altered ctl-no-pdb ctl-ha 'objs.remove(by("PodDisruptionBudget", "-controller"))'
check_fails "controller checks refuse 3 replicas without spreading" "FAIL controller-ha: 3 controller replicas with no affinity" \
  altered ctl-no-spread ctl-ha 'by("Deployment", "-controller")["spec"]["template"]["spec"].pop("affinity")'
check_fails "controller checks refuse list on the Lease" "FAIL controller-ha: the Lease Role's rules" \
  altered ctl-lease-list min 'by("Role", "-controller-leader")["rules"][1]["verbs"].append("list")'
check_fails "controller checks refuse the Lease rule without its name" "FAIL controller-ha: the Lease Role's rules" \
  altered ctl-lease-any min 'by("Role", "-controller-leader")["rules"][1].pop("resourceNames")'
check_fails "controller checks refuse a controller that does not roll" "FAIL controller-ha: the controller must roll" \
  altered ctl-recreate min 'by("Deployment", "-controller")["spec"]["strategy"] = {"type": "Recreate"}'
check_fails "gateway checks refuse 2 replicas without a PDB" "FAIL gateway-pdb: 0 PodDisruptionBudgets for 2 replicas" \
  altered no-pdb min 'objs.remove(by("PodDisruptionBudget", "-gateway"))'
check_fails "gateway checks refuse a PDB with 1 replica" "FAIL gateway-pdb: a PodDisruptionBudget with 1" \
  altered one-pdb min 'by("Deployment", "-gateway")["spec"]["replicas"] = 1'
check_fails "gateway checks refuse an allow-all egress rule" "FAIL gateway-netpol: an egress rule without peers or ports" \
  altered allow-all min 'by("NetworkPolicy", "-gateway")["spec"]["egress"].append({})'
check_fails "gateway checks refuse ingress on another port" "FAIL gateway-netpol: ingress rule on ports" \
  altered ingress-port min 'by("NetworkPolicy", "-gateway")["spec"]["ingress"][0]["ports"].append({"protocol": "TCP", "port": 9090})'
check_fails "gateway checks refuse a pod without its ServiceAccount token" "FAIL gateway-pod: no ServiceAccount token" \
  altered no-token min 'by("Deployment", "-gateway")["spec"]["template"]["spec"]["automountServiceAccountToken"] = False'
check_fails "gateway checks refuse a writable token key mount" "FAIL gateway-pod: the token key directory" \
  altered rw-key min 'next(m for m in by("Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] == "token-key")["readOnly"] = False'
check_fails "restricted check refuses a gateway container allowing privilege escalation" "FAIL restricted: .*gateway.*allowPrivilegeEscalation" \
  altered escalation min 'by("Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True'
# The egress proxy's CiliumNetworkPolicy (egressProxy.ciliumFqdnPolicy, on in
# values-all.yaml): its RBAC is exactly the Role's, and the checks see a wider one.
check_fails "cilium RBAC check refuses an extra verb (update ciliumnetworkpolicies)" "FAIL expect nsrule=.*verbs" \
  altered cilium-update all 'by("Role", "-controller-cilium")["rules"][0]["verbs"].append("update")' \
  --expect nsrule=controller-cilium:cilium.io:ciliumnetworkpolicies:get+list+watch+create+patch+delete
check_fails "cilium RBAC check refuses ciliumnetworkpolicies in the controller's ClusterRole" "FAIL expect nsrule=.*ClusterRole" \
  altered cilium-cluster all 'by("ClusterRole", "-controller")["rules"].append({"apiGroups": ["cilium.io"], "resources": ["ciliumnetworkpolicies"], "verbs": ["get"]})' \
  --expect nsrule=controller-cilium:cilium.io:ciliumnetworkpolicies:get+list+watch+create+patch+delete
check_fails "proxy-internet check sees an internet rule left beside the CiliumNetworkPolicy" "FAIL expect proxy-internet=absent" \
  altered cilium-internet all 'by("NetworkPolicy", "-egress-proxy")["spec"]["egress"].append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]})' \
  --expect proxy-internet=absent
check_fails "helm template refuses egressProxy.ciliumFqdnPolicy without the proxy" "egressProxy.ciliumFqdnPolicy needs egressProxy.enabled" \
  "$HELM" template "$RELEASE" "$CHART" --namespace "$NS" -f "$HERE/values-min.yaml" \
  --set egressProxy.enabled=false --set egressProxy.ciliumFqdnPolicy=true

# NOTES.txt: what `helm install` prints (--dry-run=client needs no cluster).
notes() { # file, helm args...
  local file="$1"
  shift
  KUBECONFIG=/dev/null "$HELM" install "$RELEASE" "$CHART" --namespace "$NS" --dry-run=client "$@" \
    | sed -n '/^NOTES:/,$p' >"$OUT/$file"
  [[ -s "$OUT/$file" ]] || { echo "no NOTES printed"; return 1; }
}
notes_say() { # file, fixed strings...
  local file="$1" s
  shift
  for s in "$@"; do grep -qF -- "$s" "$OUT/$file" || { echo "NOTES lack: $s"; return 1; }; done
}
notes_lack() { # file, fixed string
  if grep -qF -- "$2" "$OUT/$1"; then echo "NOTES contain: $(grep -F -- "$2" "$OUT/$1")"; return 1; fi
}
check "NOTES.txt renders (values-min.yaml)" notes notes-min.txt -f "$HERE/values-min.yaml"
check "NOTES.txt renders (values-all.yaml)" notes notes-all.txt -f "$HERE/values-all.yaml"
check "NOTES.txt renders (gateway off)" notes notes-off.txt -f "$HERE/values-min.yaml" --set gateway.enabled=false
check "NOTES: the gateway URL and the RBAC an agent needs" notes_say notes-min.txt \
  "http://$RELEASE-skill-operator-gateway.$NS.svc:8090/mcp/<namespace>" \
  "get skillbindings" "create skilljobs" "get skilljobs" "delete skilljobs" "config/samples/k8s/agent-rbac.yaml"
check "NOTES: no anonymous warning by default" notes_lack notes-min.txt "allowAnonymous=true"
check "NOTES: the anonymous warning with gateway.auth.allowAnonymous" notes_say notes-all.txt \
  "WARNING: gateway.auth.allowAnonymous=true" "create token skills-agent --audience skill-operator-gateway"
check "NOTES: no API server rule is said when none could be rendered" notes_say notes-min.txt "no API server rule"
check "NOTES: API server CIDRs given, nothing to say" notes_lack notes-all.txt "no API server rule"
check "NOTES: no gateway lines with the gateway off" notes_lack notes-off.txt "/mcp/"
check "NOTES.txt renders (no values at all)" notes notes-none.txt
check "NOTES: the quick start (apply, port-forward, token, the MCP URL) and what uninstall keeps" notes_say notes-none.txt \
  "kubectl apply -f config/samples/k8s/quickstart.yaml" \
  "kubectl -n $NS port-forward svc/$RELEASE-skill-operator-gateway 8090:8090 &" \
  'TOKEN=$(kubectl -n skills-demo create token skills-agent)' "http://localhost:8090/mcp/skills-demo" \
  "call skill_run on csv-stats" "this release names it $RELEASE-csv-stats" \
  "built-in store on pvc/$RELEASE-skill-operator-artifacts-store" \
  "keeps the CRDs" "the store's claim pvc/$RELEASE-skill-operator-artifacts-store" "the sample SkillPackages"
check "NOTES: no emptyDir warning on a claim" notes_lack notes-none.txt "WARNING: the artifact store is on an emptyDir"
check "NOTES.txt renders (emptyDir store)" notes notes-emptydir.txt --set artifacts.persistence.enabled=false
check "NOTES: the emptyDir warning (data lost, one replica)" notes_say notes-emptydir.txt \
  "WARNING: the artifact store is on an emptyDir" "LOST whenever that pod goes" "one replica only"
check "NOTES.txt renders (an external registry)" notes notes-registry.txt --set artifacts.registry=registry.example.com/x/y
check "NOTES: no quick start or store lines with an external registry" notes_lack notes-registry.txt "quickstart.yaml"
check "NOTES: the release named skills needs no edit of quickstart.yaml" notes_lack \
  "$(KUBECONFIG=/dev/null "$HELM" install skills "$CHART" --namespace skill-operator --dry-run=client | sed -n '/^NOTES:/,$p' >"$OUT/notes-skills.txt"; echo notes-skills.txt)" \
  "edit spec.package"

check "artifacts pod has its SA token for TokenReviews even without get skilljobs" \
  grep -qE '^ +automountServiceAccountToken: true' <(sed -n '/^kind: Deployment/,/^---/p' "$OUT/variant.yaml" | sed -n '/name: rel-test-skill-operator-artifacts/,/containers:/p')
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
bad "tracing.otlpEndpoint: collector:4318 (no scheme)" --set tracing.otlpEndpoint=collector:4318
bad "tracing.protocol: grpc" --set tracing.protocol=grpc
bad "tracing.samplerArg: 2" --set-string tracing.samplerArg=2
bad 'controller.replicas: "x"' --set-string controller.replicas=x
bad "controller.replicas: 4" --set controller.replicas=4
bad "controller.leaderElection.leaseDuration: 1" --set controller.leaderElection.leaseDuration=1
bad "controller.leaderElection: an unknown key" --set controller.leaderElection.lease=5
bad 'artifacts.replicas: "x"' --set-string artifacts.replicas=x
bad "securityContext.runAsUser: 0" --set securityContext.runAsUser=0
bad "image.digest without sha256:" --set image.digest=latest
bad "resources.cpu: lots" --set controller.resources.cpu=lots
bad "an unknown key (controler.replicas)" --set controler.replicas=1
bad "podLabels overriding a selector label" --set 'artifacts.podLabels.app\.kubernetes\.io/component=x'
bad "gateway.service.type: ExternalName" --set gateway.service.type=ExternalName
bad "gateway.confirm: maybe" --set gateway.confirm=maybe
bad "gateway.onDisconnect: drop" --set gateway.onDisconnect=drop
bad "gateway.maxSessions: 0" --set gateway.maxSessions=0
bad "gateway.rateLimits.callsPerMinute: -1" --set gateway.rateLimits.callsPerMinute=-1
bad "gateway.rateLimits: an unknown key" --set gateway.rateLimits.perHour=5
bad "gateway.rateLimits.unreadable: maybe" --set gateway.rateLimits.unreadable=maybe
bad 'gateway.rateLimits.perNamespace: "yes"' --set-string gateway.rateLimits.perNamespace=yes
bad 'gateway.auth.allowAnonymous: "yes"' --set-string gateway.auth.allowAnonymous=yes
bad "gateway.auth.publicUrl without a scheme" --set gateway.auth.publicUrl=mcp.example.com
bad "gateway.networkPolicy.apiServer.cidrs: a host name" --set 'gateway.networkPolicy.apiServer.cidrs[0]=api.example'
bad "gateway.networkPolicy.registries: a rule without ports" --set 'gateway.networkPolicy.registries[0].cidr=10.0.0.1/32'
bad "cluster.networkPolicy: maybe" --set cluster.networkPolicy=maybe
bad "egressProxy.networkPolicy.ports: [] (nothing to serve)" --set 'egressProxy.networkPolicy.ports=null'
bad "egressProxy.podCIDRs: a host name" --set 'egressProxy.podCIDRs[0]=pods.example'
bad "artifacts.persistence.enabled: maybe" --set artifacts.persistence.enabled=maybe
bad "artifacts.persistence.size: big" --set artifacts.persistence.size=big
bad 'samples.images.python: ""' --set samples.images.python=
bad "samples.interpreterPaths.python: relative" --set samples.interpreterPaths.python=bin/python3

# -------------------------------------------------------------------- samples
# quickstart.yaml is its own scenario (it repeats agent-rbac.yaml's objects
# and binds the chart's sample package): checked apart, below.
mkdir -p "$OUT/samples-main"
cp config/samples/k8s/*.yaml "$OUT/samples-main/" && rm "$OUT/samples-main/quickstart.yaml"
check "samples: custom resources against the CRD schemas, references" \
  "$PY" "$HERE/validate_samples.py" "$OUT/samples-main" crds "$OUT/samples-builtin.yaml"
# The quick start with the packages `helm install skills` makes: the binding's
# package exists, the RBAC is exactly agent-rbac.yaml's.
quickstart_dir() {
  mkdir -p "$OUT/quickstart"
  cp config/samples/k8s/quickstart.yaml "$OUT/quickstart/"
  "$HELM" template skills "$CHART" --namespace skill-operator --show-only templates/samples.yaml \
    | "$PY" -c 'import sys, json, yaml; m = yaml.safe_load(sys.stdin); yaml.safe_dump_all(json.loads(m["data"]["skillpackages.json"]), open(sys.argv[1], "w"))' \
      "$OUT/quickstart/chart-samples.yaml"
  "$PY" "$HERE/validate_samples.py" "$OUT/quickstart" crds "$OUT/quickstart-builtin.yaml"
}
check "samples: quickstart.yaml with the chart's sample packages (release skills)" quickstart_dir
same_rbac() {
  "$PY" - config/samples/k8s/quickstart.yaml config/samples/k8s/agent-rbac.yaml <<'PY'
import sys, yaml
def rbac(path):
    return {(d["kind"], d["metadata"]["name"]): {k: v for k, v in d.items() if k in ("rules", "roleRef", "subjects")}
            for d in yaml.safe_load_all(open(path)) if d and d["kind"] in ("ServiceAccount", "Role", "RoleBinding")}
q, a = rbac(sys.argv[1]), rbac(sys.argv[2])
sys.exit(0 if q == a else f"quickstart.yaml RBAC {q} != agent-rbac.yaml {a}")
PY
}
check "samples: quickstart.yaml grants exactly agent-rbac.yaml's RBAC" same_rbac
[[ -s "$OUT/samples-builtin.yaml" ]] && check "samples: built-in kinds, kubernetes-validate --strict -k $KVER" validate "$OUT/samples-builtin.yaml"
check "samples: kubectl decodes every file (annotate --local)" \
  "$KUBECTL" annotate --local -o name -f config/samples/k8s/ check=ok
# The sample validator itself catches unknown and mistyped fields.
mkdir -p "$OUT/bad-samples"
cp "$OUT"/samples-main/*.yaml "$OUT/bad-samples/"
printf '  unknownField: 1\n' >>"$OUT/bad-samples/skilljob.yaml"
check_fails "samples: the CR validator refuses an unknown field" "unknownField" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
cp config/samples/k8s/skilljob.yaml "$OUT/bad-samples/skilljob.yaml"
sed -i 's/timeoutSeconds: 30/timeoutSeconds: 900/' "$OUT/bad-samples/skilljob.yaml"
check_fails "samples: the CR validator refuses timeoutSeconds 900" "timeoutSeconds" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
cp config/samples/k8s/skilljob.yaml "$OUT/bad-samples/skilljob.yaml"
sed -i 's/resources: \["skilljobs"\]/resources: ["skilljob"]/' "$OUT/bad-samples/agent-rbac.yaml"
check_fails "samples: the RBAC check refuses a Role on a resource no CRD defines" "no resource 'skilljob'" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
cp config/samples/k8s/agent-rbac.yaml "$OUT/bad-samples/agent-rbac.yaml"
sed -i 's/verbs: \["create", "get", "delete"\]/verbs: ["create", "get", "delete", "update"]/' "$OUT/bad-samples/agent-rbac.yaml"
check_fails "samples: the RBAC check refuses an agent Role granting more than the gateway checks" "beyond what the gateway checks" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
cp config/samples/k8s/agent-rbac.yaml "$OUT/bad-samples/agent-rbac.yaml"
sed -i -z 's/kind: Role\n  name: skills-agent\n/kind: Role\n  name: another-role\n/' "$OUT/bad-samples/agent-rbac.yaml"
check_fails "samples: the RBAC check refuses a RoleBinding to a Role not among the samples" "roleRef" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
cp config/samples/k8s/agent-rbac.yaml "$OUT/bad-samples/agent-rbac.yaml"
# The warm-run Secret grant is the controller's alone, get only, on named sample Secrets.
sed 's/name: skill-operator-controller/name: skills-agent/; s/namespace: skill-operator$/namespace: skills-demo/' \
  config/samples/k8s/warm-secrets-rbac.yaml >"$OUT/bad-samples/warm-secrets-rbac.yaml"
check_fails "samples: the RBAC check refuses a Role on Secrets bound to an agent" "a rule on Secrets" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
sed 's/verbs: \["get"\]/verbs: ["get", "list"]/' config/samples/k8s/warm-secrets-rbac.yaml >"$OUT/bad-samples/warm-secrets-rbac.yaml"
check_fails "samples: the RBAC check refuses list on Secrets, even for the controller" "a rule on Secrets" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"
sed 's/resourceNames: \["weather-api"\]/resourceNames: ["other"]/' config/samples/k8s/warm-secrets-rbac.yaml >"$OUT/bad-samples/warm-secrets-rbac.yaml"
check_fails "samples: the RBAC check refuses a Secret grant naming no sample Secret" "a rule on Secrets" \
  "$PY" "$HERE/validate_samples.py" "$OUT/bad-samples" crds "$OUT/bad-builtin.yaml"

finish
