#!/usr/bin/env bash
# The console (/ui) in a real browser against the chart's gateway on a real
# cluster (any KUBECONFIG cluster; defaults fit the one-node local cluster of
# ../shared/local-cluster). It
#   - pushes this binary as the operator image (`skill-operator image self`)
#     and helm-installs the chart (controller, artifact endpoint, gateway; no
#     egress proxy) as its own release,
#   - pushes and binds the bash sample word-count and the XSS probe
#     tests/console/skills/console-xss in one namespace, and word-count in a
#     second namespace the test's ServiceAccount has no rights in,
#   - mints tokens for a ServiceAccount allowed in the first namespace (the
#     agent Role of config/samples/k8s/agent-rbac.yaml) and for one allowed
#     nothing (TokenRequest API),
#   - runs tests/console/console.mjs: Playwright's core driving Debian's
#     chromium headless through sign-in, the namespace list, a run of the
#     probe with its output appearing, the 403 page, inert XSS payloads and
#     keyboard navigation, and writes screenshots to docs/console/ when
#     CONSOLE_SCREENSHOTS=1,
#   - with CONSOLE_BENCH=1, then runs tests/console/bench.mjs (100 bindings,
#     100 SkillJobs, first paint and gateway memory over 50 pages).
# The last line is "console: N passed, N failed". Without a reachable cluster,
# playwright-core (tests/console/install.sh) or chromium it prints SKIPPED (and
# fails when SKILL_OPERATOR_REQUIRE_GATED=1).
#
# Settings (environment):
#   IMAGE_REGISTRY        host:port the node pulls images from (default 127.0.0.1:5000)
#   ARTIFACT_REGISTRY     host:port for packages and job artifacts, reached by this
#                         machine and by pods. Default on the local cluster: a
#                         docker-registry this suite starts on POD_GW:$CONSOLE_REGISTRY_PORT
#   CONSOLE_REGISTRY_PORT that registry's port (default 5011)
#   POD_GW                this machine's address on the pod network (default 10.88.0.1)
#   ARTIFACTS_CLUSTER_IP, GATEWAY_CLUSTER_IP  free ClusterIPs (defaults 10.0.0.60 and
#                         10.0.0.62 on the local cluster; clusters without DNS need them)
#   CONSOLE_RELEASE       release name (default console); namespaces are named after it
#   RUN_IMAGE, BASH       the run image and its bash (default IMAGE_REGISTRY/runtime:trixie, /bin/bash)
#   CHROMIUM              the browser (default /usr/bin/chromium)
#   CONSOLE_GATEWAY_CPU   the gateway's CPU limit (default 100m; the chart's default is 200m)
#   KEEP=1                leave the release, the namespaces and the registry in place afterwards
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${SKILL_OPERATOR_BIN:-$ROOT/target/release/skill-operator}"
KUBECTL="${KUBECTL:-$(command -v kubectl || echo "$ROOT/target/test-deps/bin/kubectl")}"
HELM="${HELM:-$(command -v helm || echo "$ROOT/target/test-deps/bin/helm")}"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

SUITE=console SUITE_WHAT="the console's browser suite"
# shellcheck source=tests/kind/suite.sh
source "$ROOT/tests/kind/suite.sh"
[[ -n "${KUBECONFIG:-}" ]] || skip "KUBECONFIG is not set"
"$KUBECTL" version --request-timeout=5s >/dev/null 2>&1 || skip "KUBECONFIG does not point at a reachable cluster"
[[ -d "$HERE/node_modules/playwright-core" ]] || skip "playwright-core is not installed: run tests/console/install.sh"
[[ -x "$CHROMIUM" ]] || skip "$CHROMIUM is missing: run tests/console/install.sh"
[[ -x "$BIN" ]] || { echo "console: $BIN is missing: cargo build --release" >&2; exit 1; }


WORK="$(mktemp -d)"
IMAGE_REGISTRY="${IMAGE_REGISTRY:-127.0.0.1:5000}"
LOCAL=0
if [[ "$(readlink -f "$KUBECONFIG")" == "$(readlink -f "${LOCAL_CLUSTER_HOME:-/var/lib/local-cluster}/kubeconfig" 2>/dev/null)" ]]; then LOCAL=1; fi
POD_GW="${POD_GW:-10.88.0.1}"
if [[ $LOCAL == 1 ]]; then
  ARTIFACTS_CLUSTER_IP="${ARTIFACTS_CLUSTER_IP-10.0.0.60}"
  GATEWAY_CLUSTER_IP="${GATEWAY_CLUSTER_IP-10.0.0.62}"
fi
ARTIFACTS_CLUSTER_IP="${ARTIFACTS_CLUSTER_IP:-}"
GATEWAY_CLUSTER_IP="${GATEWAY_CLUSTER_IP:-}"
RELEASE="${CONSOLE_RELEASE:-console}"
OPNS="$RELEASE-system" NS="$RELEASE-team" NS_DENIED="$RELEASE-denied" NS_BENCH="$RELEASE-bench"
RUN_IMAGE="${RUN_IMAGE:-$IMAGE_REGISTRY/runtime:trixie}"
BASH_PATH="${BASH:-/bin/bash}"
REGISTRY_PID="" FORWARD_PID=""

cleanup() {
  [[ -n "$FORWARD_PID" ]] && kill "$FORWARD_PID" 2>/dev/null
  if [[ "${KEEP:-}" != 1 ]]; then
    # Namespaces first, while the controller and the artifact endpoint can
    # still run their SkillJobs' finalizers.
    "$KUBECTL" delete namespace "$NS" "$NS_DENIED" "$NS_BENCH" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 ||
      echo "console: the test namespaces did not go within 120 s" >&2
    # The packages too while the controller runs: it lifts their in-use finalizer.
    "$KUBECTL" get skillpackages -o name 2>/dev/null | grep -- "-$RELEASE\$" | xargs -r "$KUBECTL" delete --timeout=120s >/dev/null 2>&1 ||
      echo "console: the test's SkillPackages did not go within 120 s" >&2
    "$HELM" uninstall "$RELEASE" -n "$OPNS" >/dev/null 2>&1
    "$KUBECTL" delete namespace "$OPNS" --wait=false >/dev/null 2>&1
    [[ -n "$REGISTRY_PID" ]] && kill "$REGISTRY_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -z "${ARTIFACT_REGISTRY:-}" ]]; then
  [[ $LOCAL == 1 ]] || { echo "console: set ARTIFACT_REGISTRY (host:port reached by this machine and by pods)" >&2; exit 1; }
  PORT="${CONSOLE_REGISTRY_PORT:-5011}"
  ARTIFACT_REGISTRY="$POD_GW:$PORT"
  if ! curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null; then
    # Under target/ (not the scratch dir): with KEEP=1 the registry outlives this run.
    STORE="$ROOT/target/console-registry"
    mkdir -p "$STORE"
    printf 'version: 0.1\nlog: {level: error, accesslog: {disabled: true}}\nstorage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}\nhttp: {addr: "0.0.0.0:%s"}\n' \
      "$STORE" "$PORT" >"$STORE.yml"
    /usr/bin/docker-registry serve "$STORE.yml" >"$STORE.log" 2>&1 &
    REGISTRY_PID=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null && break; sleep 0.1; done
  fi
fi

# ------------------------------------------------------------ install
ref="$("$BIN" image self --registry "$IMAGE_REGISTRY/skill-operator" --plain-http 2>"$WORK/image.log" | tail -n 1)"
digest="${ref##*@}"
if [[ "$digest" == sha256:* ]]; then ok "image self pushed $ref"; else bad "image self: $(tail -n 3 "$WORK/image.log")"; finish; fi
helm_args=(--set "image.repository=$IMAGE_REGISTRY/skill-operator" --set "image.digest=$digest"
  --set "artifacts.registry=$ARTIFACT_REGISTRY/skill-operator/jobs" --set artifacts.insecureRegistry=true
  --set egressProxy.enabled=false --set cluster.networkPolicy=not-enforced
  --set gateway.replicas=1 --set "gateway.resources.cpu=${CONSOLE_GATEWAY_CPU:-100m}")
[[ -n "$ARTIFACTS_CLUSTER_IP" ]] && helm_args+=(--set "artifacts.service.clusterIP=$ARTIFACTS_CLUSTER_IP")
[[ -n "$GATEWAY_CLUSTER_IP" ]] && helm_args+=(--set "gateway.service.clusterIP=$GATEWAY_CLUSTER_IP" --set "gateway.allowedHosts={$GATEWAY_CLUSTER_IP}")
# CRDs another release or suite installed stay theirs; this release leaves them alone.
if [[ -n "$("$KUBECTL" get crd skilljobs.skill-operator.dev -o name 2>/dev/null)" ]]; then
  "$KUBECTL" apply --server-side --force-conflicts -f "$ROOT/crds/" >/dev/null && helm_args+=(--set crds.install=false)
fi
check "helm install ($RELEASE in $OPNS)" "$HELM" upgrade --install "$RELEASE" "$ROOT/charts/skill-operator" -n "$OPNS" --create-namespace \
  --wait --timeout 240s "${helm_args[@]}"
[[ $FAIL == 0 ]] || { "$KUBECTL" -n "$OPNS" get pods -o wide; finish; }

for ns in "$NS" "$NS_DENIED"; do
  "$KUBECTL" delete namespace "$ns" --ignore-not-found --wait=true --timeout=180s >/dev/null
  "$KUBECTL" create namespace "$ns" >/dev/null && "$KUBECTL" label namespace "$ns" pod-security.kubernetes.io/enforce=restricted >/dev/null
done

# bind NS SKILL_DIR SCRIPT: push (once per skill), give it a bash runtime profile, bind it in NS.
bind() {
  local ns="$1" dir="$2" script="$3" skill pkg
  skill="$(basename "$dir")"
  if [[ ! -f "$WORK/$skill.yaml" ]]; then
    "$BIN" package push "$dir" --registry "$ARTIFACT_REGISTRY/skills" --tag "$RELEASE" --plain-http 2>>"$WORK/push.log" | grep -v '^#' \
      | sed "0,/^  name: /s/^\(  name: .*\)$/\1-$RELEASE/" >"$WORK/$skill.yaml" || return 1
  fi
  pkg="$(awk '/^  name:/ {print $2; exit}' "$WORK/$skill.yaml")"
  "$KUBECTL" apply -f "$WORK/$skill.yaml" >/dev/null || return 1
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p "{\"spec\":{\"runtime\":{\"interpreter\":\"bash\",\"image\":\"$RUN_IMAGE\",\"interpreterPath\":\"$BASH_PATH\",\"allowedScripts\":[\"$script\"]}}}" >/dev/null || return 1
  "$KUBECTL" wait --for=condition=Ready "skillpackage/$pkg" --timeout=120s >/dev/null || return 1
  "$KUBECTL" -n "$ns" apply -f - >/dev/null <<YAML || return 1
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: $skill }
spec: { package: $pkg }
YAML
  "$KUBECTL" -n "$ns" wait --for=condition=Ready "skillbinding/$skill" --timeout=60s >/dev/null
}
check "bind word-count in $NS" bind "$NS" "$ROOT/config/samples/skills/word-count" scripts/wc.sh
check "bind console-xss in $NS" bind "$NS" "$HERE/skills/console-xss" scripts/echo.sh
check "bind word-count in $NS_DENIED" bind "$NS_DENIED" "$ROOT/config/samples/skills/word-count" scripts/wc.sh

sed "s/namespace: skills-demo/namespace: $NS/" "$ROOT/config/samples/k8s/agent-rbac.yaml" | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" -n "$NS" create serviceaccount nobody >/dev/null 2>&1
ALLOWED="$("$KUBECTL" -n "$NS" create token skills-agent --duration=1h)"
DENIED="$("$KUBECTL" -n "$NS" create token nobody --duration=1h)"

# The gateway: at its pinned ClusterIP, else through a port-forward on loopback.
if [[ -n "$GATEWAY_CLUSTER_IP" ]]; then
  GW="http://$GATEWAY_CLUSTER_IP:8090"
else
  "$KUBECTL" -n "$OPNS" port-forward "svc/$RELEASE-skill-operator-gateway" 18090:8090 >/dev/null 2>&1 &
  FORWARD_PID=$!
  GW="http://127.0.0.1:18090"
fi
gateway_ready() {
  for _ in $(seq 60); do curl -sf "$GW/readyz" >/dev/null && return 0; sleep 1; done
  echo "the gateway at $GW never became ready"
  return 1
}
check "gateway ready at $GW" gateway_ready
[[ $FAIL == 0 ]] || finish

# ------------------------------------------------------------ the browser
export CONSOLE_URL="$GW/ui/" CONSOLE_TOKEN="$ALLOWED" CONSOLE_DENIED_TOKEN="$DENIED" CONSOLE_NS="$NS" CONSOLE_NS_DENIED="$NS_DENIED" CHROMIUM
[[ "${CONSOLE_SCREENSHOTS:-}" == 1 ]] && export CONSOLE_SCREENSHOT_DIR="$ROOT/docs/console"
node "$HERE/console.mjs" >"$WORK/console.log" 2>&1
status=$?
grep -E '^(ok|FAIL) ' "$WORK/console.log" | while read -r line; do echo "$line"; done
PASS=$((PASS + $(grep -c '^ok ' "$WORK/console.log")))
FAIL=$((FAIL + $(grep -c '^FAIL ' "$WORK/console.log")))
if [[ $status != 0 && $(grep -c '^FAIL ' "$WORK/console.log") == 0 ]]; then
  bad "console.mjs exited $status: $(tail -n 5 "$WORK/console.log" | tr '\n' ' ')"
fi

if [[ "${CONSOLE_BENCH:-}" == 1 ]]; then
  export CONSOLE_NS_BENCH="$NS_BENCH" CONSOLE_RELEASE="$RELEASE" CONSOLE_OPNS="$OPNS" KUBECTL BIN ARTIFACT_REGISTRY WORK
  bash "$HERE/bench.sh" || bad "the console benchmark failed"
fi
finish
