#!/usr/bin/env bash
# Real-cluster suite: runs on any cluster KUBECONFIG points at (kind, or the
# one-node local cluster of ../shared/local-cluster). It
#   - pushes this binary as the operator image (`skill-operator image self`),
#   - helm-installs the chart,
#   - pushes the Python, Node and Bash samples (and a sleeping test skill),
#     binds them in a namespace that enforces Pod Security "restricted",
#   - runs each sample to Succeeded and checks its stdout, runs one with a
#     staged input, one that times out (TimedOut) and one deleted while it
#     runs (gone within 5 s of the delete, its script stopped),
#   - checks every run pod the API server admitted (restricted + hardening),
#   - checks that a finished run leaves no Job, pod, Secret or NetworkPolicy
#     (the namespace's two run policies stay),
#   - egress: a run allowed one host (a test HTTP server on this machine at the
#     pod gateway) reaches it through the chart's egress proxy, and a host it is
#     not allowed (the node's address) is refused by the proxy with its 403
#     reason in the run's stdout; the namespace's run policies (artifact
#     endpoint for every run, the proxy for runs granted egress, no DNS) and
#     the proxy's own were admitted (this cluster's CNI does not
#     enforce them, so they are checked as objects), the pod's address was
#     recorded, and a run without egress gets no proxy and no proxy rule,
#   - the gateway (through the real Python MCP client): runs, auth, isolation,
#     list_changed, a namespace's own rate limits from its annotation (429, a
#     typo failing closed with 503, the next namespace untouched),
#   - traces (local cluster): the chart's gateway and controller export to an
#     OTLP collector of the suite on this machine, and one run is one trace
#     across both processes,
#   - the attacks (attacks.sh): a forged verdict, forged ownership, a replayed
#     token, another's session, Secrets through a binding, refusals in the
#     trail, /metrics behind tokens, the NetworkPolicy probe,
#   - warm run pods (warm.sh): a pool per binding, claims, isolation between
#     runs, tampered pods refused, budgets, drains,
#   - faults: the artifact endpoint scaled to 0 while runs end (a short outage
#     is waited out, one past the upload's patience is Failed naming it), and
#     (local cluster) the node's kubelet and containerd stopped and started
#     during runs (every run Succeeded with its stdout).
# The last line is "kind: N passed, N failed"; the exit status is 1 when any
# check failed. Without a reachable cluster it prints SKIPPED (and fails
# when SKILL_OPERATOR_REQUIRE_GATED=1).
#
# Test dependencies: once KUBECONFIG is set, and before anything else, every
# tool the checks use is looked for; each missing one is named with the
# command that installs it, and the suite exits 1 without running a check.
# Without KUBECONFIG the suite is SKIPPED before that: it would use none of
# them. `run.sh --check-deps` runs only that check.
#
# Settings (environment):
#   IMAGE_REGISTRY       host:port the node pulls images from, plain HTTP (default 127.0.0.1:5000)
#   ARTIFACT_REGISTRY    host:port for packages and job artifacts, reached by this
#                        machine and by pods, plain HTTP. Default: on the local cluster
#                        the suite starts a docker-registry on the pod gateway
#                        (POD_GW:5001); elsewhere it must be given.
#   POD_GW               this machine's address on the pod network (default: lc0's)
#   ARTIFACTS_CLUSTER_IP a free ClusterIP for the artifact endpoint (clusters without
#                        DNS need it; default 10.0.0.50 on the local cluster, empty elsewhere)
#   GATEWAY_CLUSTER_IP   a free ClusterIP for the gateway, which this machine reaches
#                        (default 10.0.0.52 on the local cluster; empty: gateway checks not run)
#   EGRESS_CLUSTER_IP    likewise for the egress proxy (default 10.0.0.51 on the local cluster)
#   EGRESS_PORT          the port of the egress test server on this machine (default 18080)
#   E2E_RELEASE, E2E_OPERATOR_NS, E2E_NS  release and namespaces (default e2e,
#                        skill-e2e-system, skills-e2e): two suites on one cluster
#   RUN_IMAGE            the run image (default IMAGE_REGISTRY/runtime:trixie) and
#   PYTHON, NODE, BASH   its interpreter paths (default /usr/bin/python3, /usr/bin/node, /bin/bash)
#   KEEP=1               leave the namespaces and release in place afterwards
#   BENCH_RUNS=N         after the checks, the benchmarks with N runs each:
#                        the real-node latency (benches/cluster_runs.rs) and
#                        skill_run through the gateway, cold and warm
#   BENCH_WHICH          which of them (default "node gateway")
#   TEST_DEPS_DIR        where scripts/install-test-deps.sh put the test tools
#                        (default target/test-deps)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../../scripts/test-deps-lib.sh
source "$ROOT/scripts/test-deps-lib.sh"
BIN="${SKILL_OPERATOR_BIN:-$ROOT/target/release/skill-operator}"
[[ "$BIN" == /* ]] || BIN="$ROOT/$BIN"
KUBECTL="${KUBECTL:-$(command -v kubectl || echo "$TEST_DEPS/bin/kubectl")}"
HELM="${HELM:-$(command -v helm || echo "$TEST_DEPS/bin/helm")}"
PY="${PYTHON_FOR_TESTS:-python3}"
VENV_PY="$TEST_DEPS/venv/bin/python"

# Every tool a check below runs, so none of them fails as `No such file`.
check_deps() {
  deps_need_exec "$BIN" "$DEPS_BUILD_RELEASE"
  deps_need_cmd "$KUBECTL" "$DEPS_INSTALL"
  deps_need_cmd "$HELM" "$DEPS_INSTALL"
  # The gateway checks drive the real Python `mcp` client from the test venv.
  deps_need_exec "$VENV_PY" "$DEPS_INSTALL"
  deps_need_python_module "$VENV_PY" mcp "$DEPS_INSTALL"
  # The egress test server and the pod checks run on the machine's python3.
  deps_need_cmd "$PY" "apt-get install python3"
  deps_need_cmd curl "apt-get install curl"
  # Without ARTIFACT_REGISTRY the suite starts its own registry.
  [[ -n "${ARTIFACT_REGISTRY:-}" ]] || deps_need_exec /usr/bin/docker-registry "$DEPS_INSTALL_ROOT"
  if [[ "${BENCH_RUNS:-0}" -gt 0 ]]; then deps_need_cmd cargo "install Rust with rustup"; fi
  deps_report kind
}
if [[ "${1:-}" == --check-deps ]]; then
  check_deps || exit 1
  echo "kind: every test dependency is in place"
  exit 0
fi

SUITE=kind SUITE_WHAT="the real-cluster suite"
# shellcheck source=tests/kind/suite.sh
source "$ROOT/tests/kind/suite.sh"
[[ -n "${KUBECONFIG:-}" ]] || skip "KUBECONFIG is not set"
check_deps || exit 1
"$KUBECTL" version --request-timeout=5s >/dev/null 2>&1 || skip "KUBECONFIG does not point at a reachable cluster"


WORK="$(mktemp -d)"
IMAGE_REGISTRY="${IMAGE_REGISTRY:-127.0.0.1:5000}"
# The local cluster: its kubeconfig is the one in use. Its pods reach this
# machine at the pod bridge's gateway (which exists once a pod does).
LOCAL=0
if [[ "$(readlink -f "$KUBECONFIG")" == "$(readlink -f "${LOCAL_CLUSTER_HOME:-/var/lib/local-cluster}/kubeconfig" 2>/dev/null)" ]]; then LOCAL=1; fi
POD_GW="${POD_GW:-10.88.0.1}"
REGISTRY_PID=""
cleanup() {
  [[ -n "${WATCH_PID:-}" ]] && kill "$WATCH_PID" 2>/dev/null
  if [[ "${KEEP:-}" != 1 ]]; then
    # The namespaces go first, while the controller, the artifact endpoint
    # and the registry behind it are still up: their SkillJobs' finalizers
    # delete each job's artifacts there, or the namespaces hang in
    # Terminating for the next run.
    "$KUBECTL" delete namespace "$NS" "$NS-empty" "$NS-off" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 ||
      echo "kind: the test namespaces did not go within 120 s (SkillJob finalizers?)" >&2
  fi
  if [[ -n "$REGISTRY_PID" && "${KEEP:-}" == 1 ]]; then
    # The kept installation's packages and job files live in this registry:
    # it stays up with its storage, and says how to stop it.
    echo "kind: KEEP=1: the artifact registry (pid $REGISTRY_PID) keeps serving $ARTIFACT_REGISTRY from $WORK/registry; stop it with: kill $REGISTRY_PID; rm -rf $WORK" >&2
  elif [[ -n "$REGISTRY_PID" ]]; then
    kill "$REGISTRY_PID" 2>/dev/null
  fi
  [[ -n "${EGRESS_SERVER_PID:-}" ]] && kill "$EGRESS_SERVER_PID" 2>/dev/null
  [[ -n "${EGRESS_PROXY_PID:-}" ]] && kill "$EGRESS_PROXY_PID" 2>/dev/null
  [[ -n "${POLICY_WATCH_PID:-}" ]] && kill "$POLICY_WATCH_PID" 2>/dev/null
  [[ -n "${OTLP_PID:-}" ]] && kill "$OTLP_PID" 2>/dev/null
  [[ -n "${GIT_DAEMON_PID:-}" ]] && kill "$GIT_DAEMON_PID" 2>/dev/null
  if [[ "${KEEP:-}" != 1 ]]; then
    "$HELM" uninstall "$RELEASE" -n "$OPNS" >/dev/null 2>&1
    "$KUBECTL" delete namespace "$OPNS" --wait=false >/dev/null 2>&1
  fi
  if [[ "${KEEP:-}" == 1 && -n "$REGISTRY_PID" ]]; then
    rm -rf "$WORK"/*.log
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

if [[ -z "${ARTIFACT_REGISTRY:-}" ]]; then
  [[ $LOCAL == 1 && -n "$POD_GW" ]] || { echo "kind: set ARTIFACT_REGISTRY (host:port reached by this machine and by pods)" >&2; exit 1; }
  ARTIFACT_REGISTRY="$POD_GW:5001"
fi
if [[ "$ARTIFACT_REGISTRY" == "$POD_GW:5001" ]] && curl -sf "http://127.0.0.1:5001/v2/" >/dev/null 2>&1; then
  # A registry a KEEP=1 run left serving: this run uses it (and leaves it).
  echo "kind: reusing the artifact registry already serving 127.0.0.1:5001 (left by a KEEP=1 run)"
elif [[ "$ARTIFACT_REGISTRY" == "$POD_GW:5001" ]]; then
  mkdir -p "$WORK/registry"
  # Bound on every address: the pod gateway appears only with the first pod.
  # Only pods (at the gateway) and this machine (on loopback) talk to it.
  printf 'version: 0.1\nlog: {level: error, accesslog: {disabled: true}}\nstorage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}\nhttp: {addr: "0.0.0.0:5001"}\n' \
    "$WORK/registry" >"$WORK/registry.yml"
  /usr/bin/docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
  REGISTRY_PID=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:5001/v2/" >/dev/null && break; sleep 0.1; done
fi
if [[ $LOCAL == 1 ]]; then
  ARTIFACTS_CLUSTER_IP="${ARTIFACTS_CLUSTER_IP-10.0.0.50}"
  EGRESS_CLUSTER_IP="${EGRESS_CLUSTER_IP-10.0.0.51}"
fi
ARTIFACTS_CLUSTER_IP="${ARTIFACTS_CLUSTER_IP:-}"
if [[ $LOCAL == 1 ]]; then GATEWAY_CLUSTER_IP="${GATEWAY_CLUSTER_IP-10.0.0.52}"; fi
GATEWAY_CLUSTER_IP="${GATEWAY_CLUSTER_IP:-}"
EGRESS_CLUSTER_IP="${EGRESS_CLUSTER_IP:-}"
EGRESS_PORT="${EGRESS_PORT:-18080}"
RUN_IMAGE="${RUN_IMAGE:-$IMAGE_REGISTRY/runtime:trixie}"
PYTHON="${PYTHON:-/usr/bin/python3}" NODE="${NODE:-/usr/bin/node}" BASH_PATH="${BASH:-/bin/bash}"
RELEASE="${E2E_RELEASE:-e2e}" OPNS="${E2E_OPERATOR_NS:-skill-e2e-system}" NS="${E2E_NS:-skills-e2e}"
# SkillPackages are cluster-scoped and named by digest: a second suite (another
# registry, so another source) needs its own names.
PKG_SUFFIX=""
[[ "$RELEASE" != e2e ]] && PKG_SUFFIX="-$RELEASE"
K() { "$KUBECTL" -n "$NS" "$@"; }

# ------------------------------------------------------------ operator image
ref="$("$BIN" image self --registry "$IMAGE_REGISTRY/skill-operator" --plain-http 2>"$WORK/image.log" | tail -n 1)"
digest="${ref##*@}"
if [[ "$digest" == sha256:* ]]; then ok "image self pushed $ref"; else bad "image self: $(tail -n 3 "$WORK/image.log")"; finish; fi

# ------------------------------------------------------------ trace collector
# An OTLP/HTTP JSON collector on this machine (bound on every address like the
# registry: the pod gateway appears only with the first pod), which the
# chart's controller and gateway export to: one run must be one trace.
OTLP_PORT="${OTLP_PORT:-14318}" OTLP_PID=""
if [[ $LOCAL == 1 ]]; then
  "$PY" "$ROOT/tests/kind/otlp.py" serve "$OTLP_PORT" "$WORK/spans.jsonl" >"$WORK/otlp.log" 2>&1 &
  OTLP_PID=$!
fi

# --------------------------------------------------------------- helm install
helm_args=(--set "image.repository=$IMAGE_REGISTRY/skill-operator" --set "image.digest=$digest"
  --set "artifacts.registry=$ARTIFACT_REGISTRY/skill-operator/jobs" --set artifacts.insecureRegistry=true)
[[ -n "$ARTIFACTS_CLUSTER_IP" ]] && helm_args+=(--set "artifacts.service.clusterIP=$ARTIFACTS_CLUSTER_IP")
[[ -n "$OTLP_PID" ]] && helm_args+=(--set "tracing.otlpEndpoint=http://$POD_GW:$OTLP_PORT" --set tracing.protocol=http/json)
[[ -n "$GATEWAY_CLUSTER_IP" ]] && helm_args+=(--set gateway.enabled=true --set "gateway.service.clusterIP=$GATEWAY_CLUSTER_IP" --set "gateway.allowedHosts={$GATEWAY_CLUSTER_IP}"
  --set gateway.replicas=1 --set gateway.resources.cpu=100m)  # a 2-core node also runs 1-CPU run pods
# Two controllers electing a leader (the failover check below kills it).
helm_args+=(--set controller.replicas=2 --set controller.resources.cpu=100m)
[[ -z "$GATEWAY_CLUSTER_IP" ]] && helm_args+=(--set gateway.enabled=false)
# CRDs another suite applied on this cluster (envtest-style tests apply them
# directly) are adopted by the release instead of failing the install.
for crd in skillpackages skillbindings skilljobs skillsources; do
  if "$KUBECTL" get crd "$crd.skill-operator.dev" >/dev/null 2>&1; then
    "$KUBECTL" label crd "$crd.skill-operator.dev" app.kubernetes.io/managed-by=Helm --overwrite >/dev/null
    "$KUBECTL" annotate crd "$crd.skill-operator.dev" meta.helm.sh/release-name="$RELEASE" meta.helm.sh/release-namespace="$OPNS" --overwrite >/dev/null
  fi
done
[[ -n "$EGRESS_CLUSTER_IP" ]] && helm_args+=(--set "egressProxy.service.clusterIP=$EGRESS_CLUSTER_IP")
# Runs reach the egress proxy as a process on this machine (at the pod gateway):
# this cluster masquerades a pod reaching a Service on its own bridge, which
# would hide the pod's address the proxy checks credentials against. The
# chart's proxy is installed as well (its pod, RBAC and policy are checked).
# The egress test server is on this machine too, a private address the proxy
# may dial on purpose. The cluster's CNI does not enforce NetworkPolicy (said so).
EGRESS_PROXY_PORT="${EGRESS_PROXY_PORT:-13128}"
helm_args+=(--set "egressProxy.allowCIDRs[0]=$POD_GW/32" --set cluster.networkPolicy=not-enforced
  --set "egressProxy.addressOverride=$POD_GW:$EGRESS_PROXY_PORT")
# CRDs installed by something else (kubectl apply) cannot be adopted by Helm:
# bring them to this version's schema and let the release leave them alone.
if "$KUBECTL" get crd skilljobs.skill-operator.dev -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}' 2>/dev/null | grep -qvx "$RELEASE" \
  || [[ -n "$("$KUBECTL" get crd skilljobs.skill-operator.dev -o name 2>/dev/null)" && -z "$("$KUBECTL" get crd skilljobs.skill-operator.dev -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}')" ]]; then
  "$KUBECTL" apply --server-side --force-conflicts -f "$ROOT/crds/" >/dev/null && helm_args+=(--set crds.install=false)
fi
# A fixed ClusterIP is free only once the last holder's Service (and its
# IPAddress record) is gone: an earlier run's release can still be going.
ips_free() {
  local ip
  for ip in $ARTIFACTS_CLUSTER_IP $GATEWAY_CLUSTER_IP $EGRESS_CLUSTER_IP; do
    "$KUBECTL" get svc -A -o jsonpath='{range .items[*]}{.spec.clusterIP}{"\n"}{end}' | grep -qx "$ip" && return 1
    "$KUBECTL" get ipaddress "$ip" >/dev/null 2>&1 && return 1
  done
  return 0
}
if ! "$HELM" status "$RELEASE" -n "$OPNS" >/dev/null 2>&1; then
  for _ in $(seq 120); do ips_free && break; sleep 1; done
fi
check "helm install" "$HELM" upgrade --install "$RELEASE" "$ROOT/charts/skill-operator" -n "$OPNS" --create-namespace --force-conflicts \
  --wait --timeout 240s "${helm_args[@]}"
[[ $FAIL == 0 ]] || { "$KUBECTL" -n "$OPNS" get pods -o wide; "$KUBECTL" -n "$OPNS" logs deploy/"$RELEASE"-skill-operator-controller --tail=20; finish; }

# A namespace left by an earlier run goes first (its SkillJobs' finalizers
# need the controller, which is up now).
"$KUBECTL" delete namespace "$NS" --ignore-not-found --wait=true --timeout=180s >/dev/null
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $NS
  labels: { pod-security.kubernetes.io/enforce: restricted }
YAML
# Every pod version the API server stores in the namespace, for the admission checks.
"$KUBECTL" -n "$NS" get pods --watch --output-watch-events -o json >"$WORK/pods.jsonl" 2>/dev/null &
WATCH_PID=$!
# Every NetworkPolicy version too: a run's policy is gone once its result is in.
"$KUBECTL" -n "$NS" get networkpolicies --watch --output-watch-events -o json >"$WORK/policies.jsonl" 2>/dev/null &
POLICY_WATCH_PID=$!

# ----------------------------------------------------------- packages, bindings
# bind SKILL_DIR INTERPRETER PATH SCRIPT: push, give it a runtime profile, bind it.
bind() {
  local dir="$1" interpreter="$2" path="$3" script="$4" skill pkg
  skill="$(basename "$dir")"
  "$BIN" package push "$dir" --registry "$ARTIFACT_REGISTRY/skills" --tag e2e --plain-http 2>>"$WORK/push.log" | grep -v '^#' \
    | sed "0,/^  name: /s/^\(  name: .*\)$/\1$PKG_SUFFIX/" >"$WORK/$skill.yaml" || return 1
  pkg="$(awk '/^  name:/ {print $2; exit}' "$WORK/$skill.yaml")"
  "$KUBECTL" apply -f "$WORK/$skill.yaml" >/dev/null || return 1
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p "{\"spec\":{\"runtime\":{\"interpreter\":\"$interpreter\",\"image\":\"$RUN_IMAGE\",\"interpreterPath\":\"$path\",\"allowedScripts\":[\"$script\"]}}}" >/dev/null || return 1
  "$KUBECTL" wait --for=condition=Ready "skillpackage/$pkg" --timeout=120s >/dev/null || return 1
  K apply -f - >/dev/null <<YAML || return 1
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: $skill }
spec: { package: $pkg }
YAML
  K wait --for=condition=Ready "skillbinding/$skill" --timeout=60s >/dev/null
}
check "bind csv-stats (python)" bind "$ROOT/config/samples/skills/csv-stats" python "$PYTHON" scripts/stats.py
check "bind json-pretty (node)" bind "$ROOT/config/samples/skills/json-pretty" node "$NODE" scripts/pretty.js
check "bind word-count (bash)" bind "$ROOT/config/samples/skills/word-count" bash "$BASH_PATH" scripts/wc.sh
check "bind e2e-sleep (bash)" bind "$ROOT/tests/kind/skills/e2e-sleep" bash "$BASH_PATH" scripts/sleep.sh

# A SkillSource on the real cluster: the chart's controller fetches a git
# repository served by `git daemon` at the pod gateway, pushes one package
# per skill to the artifact registry and makes them Ready SkillPackages.
source_repo() {
  local repo="$WORK/git/samples" port="$GIT_PORT"
  mkdir -p "$repo/skills" && cp -r "$ROOT/config/samples/skills/csv-stats" "$ROOT/config/samples/skills/word-count" "$repo/skills/" || return 1
  git -C "$repo" init -q -b main && git -C "$repo" add . \
    && git -C "$repo" -c user.name=t -c user.email=t@example.invalid commit -q -m samples || return 1
  "$KUBECTL" apply -f - >/dev/null <<YAML || return 1
apiVersion: skill-operator.dev/v1alpha1
kind: SkillSource
metadata: { name: e2e-samples$PKG_SUFFIX }
spec:
  git: { url: "git://$POD_GW:$port/samples", ref: main }
YAML
  "$KUBECTL" wait --for=condition=Ready "skillsource/e2e-samples$PKG_SUFFIX" --timeout=120s >/dev/null || {
    "$KUBECTL" get skillsource "e2e-samples$PKG_SUFFIX" -o yaml | sed -n '/^status:/,$p'; return 1; }
  local commit want
  commit="$("$KUBECTL" get skillsource "e2e-samples$PKG_SUFFIX" -o jsonpath='{.status.commit}')"
  want="$(git -C "$repo" rev-parse main)"
  [[ "$commit" == "$want" ]] || { echo "status.commit $commit, git rev-parse $want"; return 1; }
  [[ "$("$KUBECTL" get skillsource "e2e-samples$PKG_SUFFIX" -o jsonpath='{.status.skillCount}')" == 2 ]] || return 1
  "$KUBECTL" wait --for=condition=Ready skillpackage -l "skill-operator.dev/source=e2e-samples$PKG_SUFFIX" --timeout=120s >/dev/null || return 1
  [[ "$("$KUBECTL" get skillpackage -l "skill-operator.dev/source=e2e-samples$PKG_SUFFIX" -o jsonpath='{.items[*].status.skillName}')" == "csv-stats word-count" ]]
}
# The daemon runs from here, not inside `check` (a subshell), so cleanup
# knows its pid; the program itself, since `git daemon` forks it.
GIT_PORT="${GIT_PORT:-19418}"
mkdir -p "$WORK/git"
"$(git --exec-path)/git-daemon" --export-all --reuseaddr --listen="$POD_GW" --port="$GIT_PORT" --base-path="$WORK/git" "$WORK/git" >/dev/null 2>&1 &
GIT_DAEMON_PID=$!
for _ in $(seq 50); do (exec 3<>"/dev/tcp/$POD_GW/$GIT_PORT") 2>/dev/null && break; sleep 0.1; done
check "a SkillSource (git daemon at the pod gateway) becomes one Ready SkillPackage per skill, pinned to the commit" source_repo
"$KUBECTL" delete skillsource "e2e-samples$PKG_SUFFIX" --ignore-not-found --wait=false >/dev/null 2>&1

# ------------------------------------------------------------ artifact reads
KEY="$("$KUBECTL" -n "$OPNS" get secret "$RELEASE-skill-operator-token-key" -o jsonpath='{.data.token-key}' | base64 -d)"
OPERATOR="operator:$(printf '/operator' | openssl dgst -sha256 -mac HMAC -macopt "key:$KEY" -r | cut -d' ' -f1)"
if [[ -n "$ARTIFACTS_CLUSTER_IP" ]]; then
  ENDPOINT="http://$ARTIFACTS_CLUSTER_IP:8443/v1"
else
  "$KUBECTL" -n "$OPNS" port-forward "svc/$RELEASE-skill-operator-artifacts" 18443:8443 >/dev/null 2>&1 &
  ENDPOINT="http://127.0.0.1:18443/v1"
  sleep 2
fi
artifact() { curl -sf -H "Authorization: Bearer $OPERATOR" "$ENDPOINT/jobs/$NS/$1"; }

# ------------------------------------------------------------------- runs
# skilljob NAME BINDING SCRIPT [TIMEOUT] -- ARGS...: create it, print its uid.
skilljob() {
  local name="$1" binding="$2" script="$3" timeout="${4:-}" args="" extra=""
  shift 4
  for a in "$@"; do args="$args\"$a\","; done
  [[ -n "$timeout" ]] && extra="timeoutSeconds: $timeout"
  K apply -f - >/dev/null <<YAML
apiVersion: skill-operator.dev/v1alpha1
kind: SkillJob
metadata: { name: $name }
spec:
  binding: $binding
  script: $script
  args: [${args%,}]
  ${INPUTS:-}
  $extra
YAML
  K get skilljob "$name" -o jsonpath='{.metadata.uid}'
}
# finished NAME: wait until the run is over (Complete=True), print the phase.
finished() {
  K wait --for=jsonpath='{.status.conditions[?(@.type=="Complete")].status}'=True "skilljob/$1" --timeout=240s >/dev/null
  K get skilljob "$1" -o jsonpath='{.status.phase}'
}
# run_expect NAME BINDING SCRIPT PHASE NEEDLE ARGS...: run, check phase and stdout.
run_expect() {
  local name="$1" binding="$2" script="$3" want="$4" needle="$5" uid phase out
  shift 5
  uid="$(skilljob "$name" "$binding" "$script" "" "$@")" || return 1
  phase="$(finished "$name")"
  [[ "$phase" == "$want" ]] || { echo "phase $phase, want $want: $(K get skilljob "$name" -o jsonpath='{.status.message}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || { echo "stdout not stored"; return 1; }
  [[ "$out" == *"$needle"* ]] || { echo "stdout lacks $needle: ${out:0:300}"; return 1; }
}
check "python sample runs to Succeeded with its stdout" run_expect py csv-stats scripts/stats.py Succeeded '"rows": 6' /package/assets/example.csv
check "bash sample runs to Succeeded with its stdout" run_expect sh word-count scripts/wc.sh Succeeded 'SKILL.md' /package/SKILL.md

# A staged input: named by digest in the spec, staged through the endpoint,
# then the annotation wakes the controller.
staged_input() {
  local data='{"b":1,"a":[1,2]}' digest size uid out INPUTS
  digest="sha256:$(printf '%s' "$data" | sha256sum | cut -d' ' -f1)"
  size="${#data}"
  INPUTS="inputs: [{path: data.json, digest: \"$digest\", size: $size}]"
  uid="$(skilljob node json-pretty scripts/pretty.js "" --sort-keys data.json)" || return 1
  curl -sf -X PUT -H "Authorization: Bearer $OPERATOR" -H "Content-Type: application/octet-stream" \
    --data-binary "$data" "$ENDPOINT/jobs/$NS/$uid/inputs/data.json" >/dev/null || { echo "staging failed"; return 1; }
  K annotate skilljob node skill-operator.dev/inputs-staged="$digest" --overwrite >/dev/null
  [[ "$(finished node)" == Succeeded ]] || { echo "$(K get skilljob node -o jsonpath='{.status.phase}: {.status.message}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || return 1
  [[ "$out" == *'"a": ['* && "$out" == *'"b": 1'* ]] || { echo "stdout: $out"; return 1; }
  # The unchanged input is not listed as an output.
  [[ "$(K get skilljob node -o jsonpath='{.status.outputs}')" != *data.json* ]] || { echo "the input is listed as an output"; return 1; }
}
check "node sample with a staged input runs to Succeeded" staged_input

timed_out() {
  skilljob slow e2e-sleep scripts/sleep.sh 3 60 >/dev/null || return 1
  local phase
  phase="$(finished slow)"
  [[ "$phase" == TimedOut ]] || { echo "phase $phase: $(K get skilljob slow -o jsonpath='{.status.exitCode} {.status.message}')"; return 1; }
}
check "a run past its timeout is TimedOut (not Failed, exit 124)" timed_out

# run_started UID: the run's container runs (so its files were fetched, and
# the launcher is starting the script). The script's own output goes to the
# run's stdout file, not the container log.
run_started() { pod_state "$1" '{.items[0].status.containerStatuses[?(@.name=="run")].state.running.startedAt}' "the run container's start"; }
# pod_state UID JSONPATH WHAT: wait (up to 120 s) until the run pod shows JSONPATH.
pod_state() {
  for _ in $(seq 1200); do
    [[ -n "$(K get pods -l "skill-operator.dev/skilljob-uid=$1" -o jsonpath="$2" 2>/dev/null)" ]] && return 0
    sleep 0.1
  done
  echo "$3 never came (run $1)"; return 1
}
# Deleted while it runs: the script must stop at once (the launcher kills its
# process group on the kubelet's SIGTERM), not at its timeout or the 30 s grace.
deleted_while_running() {
  local uid start took_ms
  uid="$(skilljob cancel e2e-sleep scripts/sleep.sh "" 300)" || return 1
  K wait --for=jsonpath='{.status.phase}'=Running skilljob/cancel --timeout=120s >/dev/null || return 1
  run_started "$uid" || return 1
  start=$(date +%s%3N)
  K delete skilljob cancel --wait=true --timeout=60s >/dev/null || return 1
  took_ms=$(($(date +%s%3N) - start))
  echo "$took_ms ms from delete to gone" >>"$WORK/timings"
  ((took_ms < 5000)) || { echo "the SkillJob took ${took_ms} ms to go"; return 1; }
  # The finalizer went once no pod of the run was alive: a pod left at this
  # instant must have stopped (the kubelet deletes its object a moment later).
  local left
  left="$(K get pods -l "skill-operator.dev/skilljob-uid=$uid" -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase}{"\n"}{end}')"
  if grep -v -E ' (Succeeded|Failed)$' <<<"$left" | grep -q .; then echo "its pod still runs: $left"; return 1; fi
  K wait --for=delete pods -l "skill-operator.dev/skilljob-uid=$uid" --timeout=30s >/dev/null 2>&1
  [[ -z "$(K get pods -l "skill-operator.dev/skilljob-uid=$uid" -o name)" ]] || { echo "its stopped pod was not deleted within 30 s: $left"; return 1; }
}
check "a SkillJob deleted while running is gone within 5 s" deleted_while_running

# Two controller replicas, one leader on the chart's Lease. The leader is
# SIGKILLed (no release: on the local cluster its process is on this
# machine, found by its POD_NAME; elsewhere the pod is force-deleted) just
# after a run is created: the standby takes the lease once it has stayed
# unchanged for its duration, the run ends Succeeded with its stdout, and it
# had exactly one pod.
LEASE="$RELEASE-skill-operator-controller"
holder() { "$KUBECTL" -n "$OPNS" get lease "$LEASE" -o jsonpath='{.spec.holderIdentity}'; }
controller_failover() {
  local old pod pid uid start took_ms new pods
  old="$(holder)" || { echo "no Lease $LEASE"; return 1; }
  pod="${old%_*}"
  [[ -n "$pod" ]] && "$KUBECTL" -n "$OPNS" get pod "$pod" >/dev/null || { echo "the holder $old is not a controller pod"; return 1; }
  [[ "$("$KUBECTL" -n "$OPNS" get pods -l app.kubernetes.io/component=controller --field-selector=status.phase=Running -o name | wc -l)" == 2 ]] \
    || { echo "not two controller pods running"; return 1; }
  uid="$(skilljob failover csv-stats scripts/stats.py "" /package/assets/example.csv)" || return 1
  start=$(date +%s%3N)
  pid=""
  for p in $(pgrep -f "skill-operator controller" || true); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "POD_NAME=$pod" && pid=$p
  done
  if [[ -n "$pid" ]]; then kill -KILL "$pid"; else "$KUBECTL" -n "$OPNS" delete pod "$pod" --grace-period=0 --force >/dev/null 2>&1; fi
  for _ in $(seq 600); do
    new="$(holder)"
    [[ -n "$new" && "$new" != "$old" ]] && break
    sleep 0.1
  done
  [[ -n "$new" && "$new" != "$old" ]] || { echo "the lease stayed with $old after the kill"; return 1; }
  took_ms=$(($(date +%s%3N) - start))
  echo "controller failover: ${took_ms} ms from the kill to a new Lease holder ($([[ -n "$pid" ]] && echo SIGKILL || echo force-deleted))" >>"$WORK/timings"
  [[ "$(finished failover)" == Succeeded ]] || { echo "$(K get skilljob failover -o jsonpath='{.status.phase}: {.status.message}')"; return 1; }
  [[ "$(artifact "$uid/outputs/result/stdout")" == *'"rows": 6'* ]] || { echo "stdout not stored or wrong"; return 1; }
  pods="$("$PY" -c '
import sys
sys.path.insert(0, sys.argv[3])
from check_pods import objects
uid = sys.argv[2]
print(len({p["metadata"]["name"] for p in objects(sys.argv[1])
           if (p.get("metadata", {}).get("labels") or {}).get("skill-operator.dev/skilljob-uid") == uid}))' "$WORK/pods.jsonl" "$uid" "$ROOT/tests/kind")"
  [[ "$pods" == 1 ]] || { echo "$pods pods for one SkillJob across the failover"; return 1; }
}
check "controller HA: the leader SIGKILLed mid-run, a standby takes over, the run Succeeded with one pod" controller_failover

# ---------------------------------------------------------------- the gateway
# The in-cluster MCP endpoint (the chart's gateway Deployment), driven by the
# real Python client with ServiceAccount tokens from the TokenRequest API: an
# agent allowed in $NS and $NS2 (config/samples/k8s/agent-rbac.yaml's Role),
# and one with no rights.
NS2="$NS-empty"
GW="http://$GATEWAY_CLUSTER_IP:8090"
gateway_setup() {
  "$KUBECTL" delete namespace "$NS2" --ignore-not-found --wait=true --timeout=120s >/dev/null
  "$KUBECTL" create namespace "$NS2" >/dev/null || return 1
  "$KUBECTL" label namespace "$NS2" pod-security.kubernetes.io/enforce=restricted >/dev/null || return 1
  local ns
  for ns in "$NS" "$NS2"; do
    sed "s/namespace: skills-demo/namespace: $ns/" "$ROOT/config/samples/k8s/agent-rbac.yaml" | "$KUBECTL" apply -f - >/dev/null || return 1
  done
  # The agent of $NS may use the gateway in $NS2 too (the sample's Role, bound to it there).
  "$KUBECTL" -n "$NS2" create rolebinding skills-agent-of-ns --role=skills-agent --serviceaccount="$NS:skills-agent" >/dev/null || return 1
  "$KUBECTL" -n "$NS" create serviceaccount nobody >/dev/null || return 1
  for _ in $(seq 60); do curl -sf "$GW/readyz" >/dev/null && return 0; sleep 1; done
  echo "the gateway at $GW never became ready"; return 1
}
gw() { "$VENV_PY" "$ROOT/tests/kind/gateway_client.py" "$1" "$GW" "$NS" "$NS2" "$ALLOWED" "$DENIED" "${@:2}"; }
# A namespace's own rate limits (its annotation, read by the chart's gateway
# through a Namespace watch): a strict figure, a typo (fail closed), none.
gateway_limits() {
  local key=skill-operator.dev/rate-limits
  "$KUBECTL" annotate namespace "$NS2" --overwrite "$key=calls-per-minute=1,burst-calls=1" >/dev/null || return 1
  gw limits strict || return 1
  "$KUBECTL" annotate namespace "$NS2" --overwrite "$key=calls-per-minute=sixty" >/dev/null || return 1
  gw limits typo || return 1
  "$KUBECTL" annotate namespace "$NS2" "$key-" >/dev/null || return 1
  gw limits none
}
gateway_bind() {
  local out="$WORK/gw-bind.out"
  gw bind >"$out" 2>&1 &
  local client=$!
  for _ in $(seq 120); do grep -q READY "$out" && break; kill -0 "$client" 2>/dev/null || break; sleep 0.5; done
  "$KUBECTL" -n "$NS2" apply -f - >/dev/null <<YAML
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: word-count }
spec: { package: $("$KUBECTL" -n "$NS" get skillbinding word-count -o jsonpath='{.spec.package}') }
YAML
  wait "$client"; local rc=$?
  grep -v READY "$out"
  return $rc
}
# A second gateway replica for this check only (the suite runs one: the
# node's two cores also hold 1-CPU run pods). Each replica is reached on its
# pod address; the first one's process is SIGKILLed while the run it started
# is Running, and the caller retries the same confirmed call on the other.
gateway_failover() {
  local deploy rows a b rc
  deploy="$("$KUBECTL" -n "$OPNS" get deployment -l app.kubernetes.io/component=gateway -o name)" || return 1
  "$KUBECTL" -n "$OPNS" scale "$deploy" --replicas=2 >/dev/null || return 1
  "$KUBECTL" -n "$OPNS" rollout status "$deploy" --timeout=120s >/dev/null || { echo "the second gateway replica never became ready"; return 1; }
  rows="$("$KUBECTL" -n "$OPNS" get pods -l app.kubernetes.io/component=gateway --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}{.metadata.uid} {.status.podIP}{"\n"}{end}')"
  a=($(sed -n 1p <<<"$rows")) b=($(sed -n 2p <<<"$rows"))
  [[ ${#a[@]} == 2 && ${#b[@]} == 2 ]] || { echo "not two gateway pods with addresses: $rows"; return 1; }
  for ip in "${a[1]}" "${b[1]}"; do
    for _ in $(seq 60); do curl -sf "http://$ip:8090/readyz" >/dev/null && break; sleep 1; done
  done
  gw failover "http://${a[1]}:8090" "${a[0]}" "http://${b[1]}:8090" 2>>"$WORK/timings"; rc=$?
  "$KUBECTL" -n "$OPNS" scale "$deploy" --replicas=1 >/dev/null
  "$KUBECTL" -n "$OPNS" rollout status "$deploy" --timeout=120s >/dev/null
  return $rc
}
if [[ -n "$GATEWAY_CLUSTER_IP" ]] && check "gateway: agents, namespaces, ready" gateway_setup; then
  # Minted here, not inside a check (each check runs in a subshell).
  ALLOWED="$("$KUBECTL" -n "$NS" create token skills-agent --duration=1h)"
  DENIED="$("$KUBECTL" -n "$NS" create token nobody --duration=1h)"
  check "gateway: skill_list and skill_run as a SkillJob on the node (both MCP eras)" gw run
  [[ -n "$OTLP_PID" ]] && check "traces: a run is one trace, the gateway's call and run span the parents of the controller's reconciles and the run's phases" \
    "$PY" "$ROOT/tests/kind/otlp.py" check "$WORK/spans.jsonl"
  check "gateway: 401 without or with a bad token, 403 naming the verb, RFC 9728 metadata" gw auth
  check "gateway: a new binding brings the tools with list_changed" gateway_bind
  check "gateway: no other namespace, session or job reachable" gw isolation
  check "gateway: a namespace's annotation sets its rate limits (429), a typo closes it (503), other namespaces untouched" gateway_limits
  check "gateway HA: a replica SIGKILLed during a confirmed skill_run, the call retried on the other replica returns the same SkillJob's result" gateway_failover
  # shellcheck source=attacks.sh
  source "$ROOT/tests/kind/attacks.sh"
fi
# ------------------------------------------------------------------- egress
# A test server on this machine (the pod gateway); the run's only way there is
# the chart's egress proxy, which allows it by an IP entry (pods have no DNS).
printf '%s' "$KEY" >"$WORK/token-key"
SKILL_OPERATOR_LOG=info "$BIN" egress-proxy --listen "$POD_GW:$EGRESS_PROXY_PORT" --token-key-file "$WORK/token-key" --watch-skilljobs \
  --allow-cidr "$POD_GW/32" >"$WORK/egress-proxy.log" 2>&1 &
EGRESS_PROXY_PID=$!
for _ in $(seq 100); do grep -q "SkillJobs listed" "$WORK/egress-proxy.log" && break; sleep 0.1; done
check "the egress proxy (host process) watches SkillJobs" grep -q "SkillJobs listed" "$WORK/egress-proxy.log"
mkdir -p "$WORK/www"
echo egress-ok >"$WORK/www/index.html"
"$PY" -m http.server "$EGRESS_PORT" --bind 0.0.0.0 --directory "$WORK/www" >"$WORK/egress-server.log" 2>&1 &
EGRESS_SERVER_PID=$!
# Its own page, on its own process: another listener on the port (the bind
# then fails) answered the readiness probe once, and the egress checks below
# failed for a reason they do not name.
egress_server_up() { kill -0 "$EGRESS_SERVER_PID" 2>/dev/null && [ "$(curl -sf "http://127.0.0.1:$EGRESS_PORT/")" = egress-ok ]; }
for _ in $(seq 50); do egress_server_up && break; sleep 0.1; done
check "the egress test server serves on port $EGRESS_PORT (EGRESS_PORT= to move it)" egress_server_up
ALLOWED="$POD_GW:$EGRESS_PORT"
seen_by_server() { grep -v '^127\.0\.0\.1 ' "$WORK/egress-server.log" | grep -c '"GET / HTTP'; }
bind_egress() {
  local dir="$ROOT/tests/kind/skills/e2e-egress" pkg
  "$BIN" package push "$dir" --registry "$ARTIFACT_REGISTRY/skills" --tag e2e --plain-http 2>>"$WORK/push.log" | grep -v '^#' \
    | sed "0,/^  name: /s/^\(  name: .*\)$/\1$PKG_SUFFIX/" >"$WORK/e2e-egress.yaml" || return 1
  pkg="$(awk '/^  name:/ {print $2; exit}' "$WORK/e2e-egress.yaml")"
  "$KUBECTL" apply -f "$WORK/e2e-egress.yaml" >/dev/null || return 1
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p "{\"spec\":{\"runtime\":{\"interpreter\":\"python\",\"image\":\"$RUN_IMAGE\",\"interpreterPath\":\"$PYTHON\",\"allowedScripts\":[\"scripts/fetch.py\"],\"allowedEgress\":[\"$ALLOWED\"]}}}" >/dev/null || return 1
  "$KUBECTL" wait --for=condition=Ready "skillpackage/$pkg" --timeout=120s >/dev/null || return 1
  K apply -f - >/dev/null <<YAML || return 1
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: e2e-egress }
spec: { package: $pkg, egress: true }
YAML
  # The same package bound without egress (another namespace: one skill name per namespace).
  "$KUBECTL" -n "$NS-off" apply -f - >/dev/null <<YAML || return 1
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: e2e-egress-off }
spec: { package: $pkg }
YAML
  K wait --for=condition=Ready skillbinding/e2e-egress --timeout=60s >/dev/null || return 1
  [[ "$(K get skillbinding e2e-egress -o jsonpath='{.status.effectiveEgress}')" == *"$ALLOWED"* ]] || { echo "binding status: $(K get skillbinding e2e-egress -o jsonpath='{.status}')"; return 1; }
}
"$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $NS-off
  labels: { pod-security.kubernetes.io/enforce: restricted }
YAML
check "bind e2e-egress (python, allowed $ALLOWED)" bind_egress

egress_run() {
  local uid phase out refused="http://${NODE_IP:-192.0.2.2}:$EGRESS_PORT/"
  uid="$(skilljob egress e2e-egress scripts/fetch.py "" "http://$ALLOWED/" "$refused")" || return 1
  # The pod's address is recorded (sealed) for the proxy while the run is on.
  phase="$(finished egress)"
  [[ "$phase" == Succeeded ]] || { echo "phase $phase: $(K get skilljob egress -o jsonpath='{.status.message}')"; return 1; }
  [[ -n "$(K get skilljob egress -o jsonpath='{.status.egress.podIp}')" ]] || { echo "no pod address recorded: $(K get skilljob egress -o jsonpath='{.status.egress}')"; return 1; }
  [[ "$(K get skilljob egress -o jsonpath='{.status.egress.allowed}')" == *"$ALLOWED"* ]] || return 1
  out="$(artifact "$uid/outputs/result/stdout")" || { echo "stdout not stored"; return 1; }
  echo "$out" >"$WORK/egress-stdout"
  [[ "$out" == *"proxy: set"* ]] || { echo "no proxy in the run's env: $out"; return 1; }
  [[ "$out" == *"OK http://$ALLOWED/ 200 egress-ok"* ]] || { echo "the allowed host was not reached: $out"; return 1; }
  [[ "$out" == *"REFUSED $refused 403 egress refused ("* ]] || { echo "the other host was not refused by the proxy with its reason: $out"; return 1; }
  grep -E "^(OK|REFUSED)" <<<"$out" | sed 's/^/     run stdout: /'
  [[ "$(seen_by_server)" == 1 ]] || { echo "the test server saw $(seen_by_server) requests, want 1 (through the proxy)"; return 1; }
  echo "$uid" >"$WORK/egress-uid"
}
check "a run reaches its allowed host through the proxy; another host gets the proxy's 403 and reason" egress_run

egress_off() {
  local uid out
  KOFF() { "$KUBECTL" -n "$NS-off" "$@"; }
  KOFF apply -f - >/dev/null <<YAML || return 1
apiVersion: skill-operator.dev/v1alpha1
kind: SkillJob
metadata: { name: egress-off }
spec: { binding: e2e-egress-off, script: scripts/fetch.py, args: [] }
YAML
  uid="$(KOFF get skilljob egress-off -o jsonpath='{.metadata.uid}')" || return 1
  KOFF wait --for=jsonpath='{.status.conditions[?(@.type=="Complete")].status}'=True skilljob/egress-off --timeout=240s >/dev/null || return 1
  out="$(curl -sf -H "Authorization: Bearer $OPERATOR" "$ENDPOINT/jobs/$NS-off/$uid/outputs/result/stdout")" || { echo "stdout not stored"; return 1; }
  [[ "$out" == *"proxy: none"* ]] || { echo "a run without egress got a proxy: $out"; return 1; }
  local allowed
  allowed="$(KOFF get skilljob egress-off -o jsonpath='{.status.egress.allowed}')"
  [[ -z "$allowed" || "$allowed" == "[]" ]] || { echo "an allowlist without egress: $allowed"; return 1; }
}
check "a run whose binding does not allow egress gets no proxy (and no allowlist)" egress_off

# The policies as the API server admitted them (the CNI does not enforce them).
policies_admitted() {
  "$PY" - "$WORK/policies.jsonl" "$(cat "$WORK/egress-uid")" <<'PYEOF' || return 1
import json, sys
path, uid = sys.argv[1], sys.argv[2]
dec, text, seen = json.JSONDecoder(), open(path).read(), None
i = 0
while i < len(text):
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    ev, i = dec.raw_decode(text, i)
    obj = ev.get("object", ev)
    if ev.get("type") != "DELETED":
        seen = seen or {}
        seen[obj["metadata"]["name"]] = obj
names = sorted(seen or {})
# One policy per namespace and class, none per run.
assert names == ["skill-operator-runs", "skill-operator-runs-egress"], f"want the namespace's two run policies, got {names}"
for name, policy in seen.items():
    spec = policy["spec"]
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"] and not spec.get("ingress"), spec
    rules = spec.get("egress") or []
    assert len(rules) == 1, f"{name}: want one rule, got {rules}"
    assert all(p.get("port") != 53 and p.get("protocol") == "TCP" for r in rules for p in r["ports"]), "a DNS rule"
    assert all(r.get("to") for r in rules), "an allow-all rule"
    sel = spec["podSelector"]
    assert {"key": "skill-operator.dev/skilljob-uid", "operator": "Exists"} in sel["matchExpressions"], sel
    assert sel["matchLabels"]["app.kubernetes.io/managed-by"] == "skill-operator", sel
seal, proxy = seen["skill-operator-runs"], seen["skill-operator-runs-egress"]
assert seal["spec"]["egress"][0]["to"][0]["podSelector"]["matchLabels"] != proxy["spec"]["egress"][0]["to"][0]["podSelector"]["matchLabels"]
assert "skill-operator.dev/egress" not in seal["spec"]["podSelector"]["matchLabels"], "the seal must select every run"
assert proxy["spec"]["podSelector"]["matchLabels"]["skill-operator.dev/egress"] == "true", "the proxy for runs granted egress only"
rule = proxy["spec"]["egress"][0]
assert rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "egress-proxy", rule
assert [p["port"] for p in rule["ports"]] == [3128], rule
PYEOF
  "$KUBECTL" -n "$OPNS" get networkpolicy "$RELEASE-skill-operator-egress-proxy" -o jsonpath='{.spec.policyTypes}' | grep -q Egress \
    || { echo "the proxy's own NetworkPolicy is missing"; return 1; }
}
check "the namespace's two run policies (every run sealed to the artifact endpoint; the proxy for runs granted egress; no DNS) and the proxy's own were admitted" policies_admitted

# ------------------------------------------------------------ warm run pods
# shellcheck source=warm.sh
source "$ROOT/tests/kind/warm.sh"

# ------------------------------------------------ the artifact endpoint down
# The endpoint's Deployment scaled to 0 while runs end, then back: a short
# outage is waited out by the upload sidecar (the outputs are stored, the run
# Succeeded); one that outlasts the sidecar's patience (20 s) leaves the run
# without a verdict while the endpoint is down (its message names it), then
# Failed with OutputsNotStored saying why, never Succeeded.
ART_DEPLOY="$("$KUBECTL" -n "$OPNS" get deployment -l app.kubernetes.io/component=artifacts -o name)"
ART_REPLICAS="$("$KUBECTL" -n "$OPNS" get "$ART_DEPLOY" -o jsonpath='{.spec.replicas}')"
artifacts_down() {
  "$KUBECTL" -n "$OPNS" scale "$ART_DEPLOY" --replicas=0 >/dev/null || return 1
  for _ in $(seq 1200); do
    [[ -z "$("$KUBECTL" -n "$OPNS" get pods -l app.kubernetes.io/component=artifacts -o name)" ]] && return 0
    sleep 0.1
  done
  echo "the artifact endpoint's pods did not go"; return 1
}
artifacts_up() {
  "$KUBECTL" -n "$OPNS" scale "$ART_DEPLOY" --replicas="$ART_REPLICAS" >/dev/null &&
    "$KUBECTL" -n "$OPNS" rollout status "$ART_DEPLOY" --timeout=180s >/dev/null
}
# container_ended UID CONTAINER: wait until the run pod's container has exited.
container_ended() {
  local statuses=containerStatuses
  [[ $2 == upload ]] && statuses=initContainerStatuses  # a native sidecar
  pod_state "$1" "{.items[0].status.$statuses[?(@.name==\"$2\")].state.terminated.exitCode}" "the end of the $2 container"
}
upload_outage_short() {
  local uid phase out
  uid="$(skilljob upl-short e2e-sleep scripts/sleep.sh "" 10)" || return 1
  K wait --for=jsonpath='{.status.phase}'=Running skilljob/upl-short --timeout=120s >/dev/null || return 1
  run_started "$uid" || return 1
  artifacts_down || { artifacts_up; return 1; }
  container_ended "$uid" run || { artifacts_up; return 1; }
  # The outage met the upload: the sidecar said so, and tries again.
  for _ in $(seq 300); do K logs -l "skill-operator.dev/skilljob-uid=$uid" -c upload 2>/dev/null | grep -q "retrying" && break; sleep 0.1; done
  K logs -l "skill-operator.dev/skilljob-uid=$uid" -c upload 2>/dev/null | grep -q "retrying" || { artifacts_up; echo "the upload never met the outage (the endpoint went after the run?)"; return 1; }
  artifacts_up || { echo "the artifact endpoint did not come back"; return 1; }
  phase="$(finished upl-short)"
  [[ "$phase" == Succeeded ]] || { echo "phase $phase: $(K get skilljob upl-short -o jsonpath='{.status.message}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || { echo "stdout not stored"; return 1; }
  [[ "$out" == *"slept 10"* ]] || { echo "stdout: $out"; return 1; }
}
check "the artifact endpoint down while a run ends: the upload waits it out, the run Succeeded with its stdout" upload_outage_short
upload_outage_long() {
  local uid phase msg reason
  uid="$(skilljob upl-long e2e-sleep scripts/sleep.sh "" 8)" || return 1
  K wait --for=jsonpath='{.status.phase}'=Running skilljob/upl-long --timeout=120s >/dev/null || return 1
  run_started "$uid" || return 1
  artifacts_down || { artifacts_up; return 1; }
  container_ended "$uid" run || { artifacts_up; return 1; }
  # The sidecar gives up after its patience and ends; the run has no verdict
  # while its outputs cannot be read, and says what it waits for.
  container_ended "$uid" upload || { artifacts_up; return 1; }
  for _ in $(seq 600); do
    msg="$(K get skilljob upl-long -o jsonpath='{.status.message}')"
    [[ "$msg" == *"artifact endpoint cannot be reached"* ]] && break
    sleep 0.1
  done
  phase="$(K get skilljob upl-long -o jsonpath='{.status.phase}')"
  [[ "$phase" == Running && "$msg" == *"artifact endpoint cannot be reached"* ]] || { artifacts_up; echo "while the endpoint is down: phase $phase, message: $msg"; return 1; }
  artifacts_up || { echo "the artifact endpoint did not come back"; return 1; }
  phase="$(finished upl-long)"
  msg="$(K get skilljob upl-long -o jsonpath='{.status.message}')"
  reason="$(K get skilljob upl-long -o jsonpath='{.status.conditions[?(@.type=="Complete")].reason}')"
  [[ "$phase" == Failed && "$reason" == OutputsNotStored && "$msg" == *"cannot reach the artifact endpoint"* ]] || { echo "phase $phase ($reason): $msg"; return 1; }
  echo "     upl-long: $msg" | cut -c1-240
}
check "the artifact endpoint down past the upload's patience: no verdict while it is down, then Failed naming it (never Succeeded)" upload_outage_long

# ---------------------------------------------------------- the node restarted
# The local cluster's kubelet and containerd stopped (SIGTERM, as a node
# restart or an upgrade does; the containers live on in their shims) while
# three runs are on, two more created while the node is down, then both
# started again by the cluster's up.sh, which starts only what is not
# running. Every run must end truthfully: Succeeded with its stdout.
LC_HOME_DIR="${LOCAL_CLUSTER_HOME:-/var/lib/local-cluster}"
LC_SCRIPTS="${LOCAL_CLUSTER_SCRIPTS:-$ROOT/../shared/local-cluster}"
# up.sh waits 120 s for the kubelet's health; a busy machine (CI) has seen
# a kubelet take longer to start. A node that is slow to come back is given
# three more minutes, and a kubelet that exited at its start is started once
# more, as a node's service manager would (up.sh starts only what is not
# running). A kubelet that never becomes healthy is the failure it is.
node_back() {
  local pid
  pid="$(cat "$LC_HOME_DIR/run/kubelet.pid" 2>/dev/null)"
  if [[ -z "$pid" ]] || ! kill -0 "$pid" 2>/dev/null; then
    echo "     the kubelet exited at its start; starting it once more: $(grep -E '^[EF][0-9]{4}' "$LC_HOME_DIR/logs/kubelet.log" | tail -n 1 | cut -c1-200)"
    "$LC_SCRIPTS/up.sh" >>"$WORK/node-up.log" 2>&1
    return
  fi
  for _ in $(seq 180); do
    curl -sf http://127.0.0.1:10248/healthz >/dev/null && break
    sleep 1
  done
  "$KUBECTL" wait --for=condition=Ready "node/$("$KUBECTL" get nodes -o jsonpath='{.items[0].metadata.name}')" --timeout=120s >/dev/null || return 1
  # The rest of up.sh (the Service forwarder) once the node is back.
  "$LC_SCRIPTS/up.sh" >>"$WORK/node-up.log" 2>&1
}
node_restart() {
  local i n pid uid phase out down_at up_at
  declare -A uids
  for i in 1 2 3; do uids[$i]="$(skilljob "node-$i" e2e-sleep scripts/sleep.sh "" 6)" || return 1; done
  for i in 1 2 3; do
    K wait --for=jsonpath='{.status.phase}'=Running "skilljob/node-$i" --timeout=120s >/dev/null || return 1
    run_started "${uids[$i]}" || return 1
  done
  for n in kubelet containerd; do
    pid="$(cat "$LC_HOME_DIR/run/$n.pid")" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$LC_HOME_DIR" || { echo "pid $pid is not this cluster's $n"; return 1; }
    kill -TERM "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { echo "$n (pid $pid) did not stop"; return 1; }
  done
  down_at=$(date +%s%3N)
  for i in 4 5; do uids[$i]="$(skilljob "node-$i" e2e-sleep scripts/sleep.sh "" 1)" || return 1; done
  # The fault's length: the first runs' scripts (6 s) end while the node is down.
  sleep 12
  if ! "$LC_SCRIPTS/up.sh" >"$WORK/node-up.log" 2>&1 && ! node_back; then
    tail -n 3 "$WORK/node-up.log"
    echo "kubelet log (its last errors):"
    grep -E '^[EF][0-9]{4}' "$LC_HOME_DIR/logs/kubelet.log" | tail -n 8 | cut -c1-300
    echo "containerd log (its last errors):"
    grep -E 'level=(error|fatal)' "$LC_HOME_DIR/logs/containerd.log" | tail -n 4 | cut -c1-300
    return 1
  fi
  up_at=$(date +%s%3N)
  echo "node restart: kubelet and containerd down for $((up_at - down_at)) ms" >>"$WORK/timings"
  for i in 1 2 3 4 5; do
    phase="$(finished "node-$i")"
    [[ "$phase" == Succeeded ]] || { echo "node-$i: phase $phase: $(K get skilljob "node-$i" -o jsonpath='{.status.message}')"; return 1; }
    # Read through the Service forwarder, which up.sh starts again with the
    # node: a read may fail until it has caught up (a stored output stays
    # stored; a missing one still fails after the wait).
    for _ in $(seq 30); do out="$(artifact "${uids[$i]}/outputs/result/stdout")" && break; sleep 1; done
    [[ -n "$out" ]] || { echo "node-$i: stdout not stored"; return 1; }
    [[ "$out" == *"slept "* ]] || { echo "node-$i: stdout: $out"; return 1; }
  done
  echo "node restart: the five runs Succeeded $(($(date +%s%3N) - up_at)) ms after the node was back" >>"$WORK/timings"
}
if [[ $LOCAL == 1 && -x "$LC_SCRIPTS/up.sh" && -f "$LC_HOME_DIR/run/kubelet.pid" ]]; then
  check "the node restarted (kubelet and containerd) during runs: every run Succeeded with its stdout" node_restart
elif [[ "${SKILL_OPERATOR_REQUIRE_GATED:-}" == 1 ]]; then
  bad "the node restart check needs the local cluster's scripts (LOCAL_CLUSTER_SCRIPTS) and its kubelet's pid file"
else
  echo "SKIPPED the node restart check (it restarts the local cluster's kubelet and containerd; this is not that cluster)"
fi

# The finished runs left nothing behind but the SkillJobs.
no_leftovers() {
  local left finished
  finished="$(K get skilljobs -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c -E 'Succeeded|TimedOut')"
  ((finished >= 4)) || { echo "only $finished finished runs to look at"; return 1; }
  # The namespace's two run policies stay (shared by every run there); nothing per run does.
  left="$(K get jobs,networkpolicies,secrets -l app.kubernetes.io/managed-by=skill-operator -o name 2>/dev/null | grep -v -E '^networkpolicy[^/]*/skill-operator-runs(-egress)?$')
$(K get secrets -o name | grep -- '-token$')"
  [[ -z "$(echo "$left" | tr -d '[:space:]')" ]] || { echo "left behind: $left"; return 1; }
  # A finished run's Job goes with its verdict; its pod follows through the
  # garbage collector and the kubelet (the node was just restarted above).
  K wait --for=delete pods --all --timeout=60s >/dev/null 2>&1
  [[ -z "$(K get pods -o name)" ]] || { echo "pods left: $(K get pods -o name)"; return 1; }
}
check "finished runs leave no Job, pod, Secret or NetworkPolicy of their own" no_leftovers

kill "$WATCH_PID" 2>/dev/null
WATCH_PID=""
check "every run pod was admitted restricted and hardened" "$PY" "$ROOT/tests/kind/check_pods.py" "$WORK/pods.jsonl" 5
echo "kind: delete to gone: $(cat "$WORK/timings" 2>/dev/null)"

# The real-node latency benchmark (benches/cluster_runs.rs), when asked for.
if [[ "${BENCH_RUNS:-0}" -gt 0 ]]; then
  BENCH_WHICH="${BENCH_WHICH:-node gateway}"
  if [[ " $BENCH_WHICH " == *" node "* ]]; then
  check "bind e2e-noop-py (python)" bind "$ROOT/tests/kind/skills/e2e-noop-py" python "$PYTHON" scripts/noop.py
  check "bind e2e-noop-js (node)" bind "$ROOT/tests/kind/skills/e2e-noop-js" node "$NODE" scripts/noop.js
  check "bind e2e-noop-sh (bash)" bind "$ROOT/tests/kind/skills/e2e-noop-sh" bash "$BASH_PATH" scripts/noop.sh
  # warm.sh left e2e-secret bound with its variable: the Role lets the
  # controller read it, so its warm runs take pods ("bash + a variable").
  if K get skillbinding e2e-secret >/dev/null 2>&1; then
    K create role e2e-warm-secret --verb=get --resource=secrets --resource-name=e2e-secret >/dev/null 2>&1
    K create rolebinding e2e-warm-secret --role=e2e-warm-secret --serviceaccount="$OPNS:$RELEASE-skill-operator-controller" >/dev/null 2>&1
  fi
  # The benchmark only watches the cluster: its own build profile changes
  # nothing it measures, so BENCH_DEBUG=1 spares a release build.
  bench=(cargo bench)
  [[ "${BENCH_DEBUG:-0}" == 1 ]] && bench=(cargo test --profile dev)
  if BENCH_NS="$NS" BENCH_RUNS="$BENCH_RUNS" BENCH_ONLY="${BENCH_ONLY:-}" "${bench[@]}" --locked --manifest-path "$ROOT/Cargo.toml" --bench cluster_runs 2>"$WORK/bench.log"; then
    ok "real-node latency benchmark ($BENCH_RUNS runs per interpreter)"
  else
    bad "real-node latency benchmark: $(grep -m1 -A2 panicked "$WORK/bench.log" || tail -n 5 "$WORK/bench.log")"
  fi
  fi
  # skill_run through the chart's gateway, cold and on warm pods, in one run
  # (the real Python MCP client; tests/kind/gateway_client.py check_bench).
  gateway_bench_bind() {
    local pkg
    # warm.sh deleted the binding; it goes once its SkillJobs do.
    K get skilljobs -o jsonpath='{range .items[?(@.spec.binding=="e2e-warm")]}{.metadata.name}{"\n"}{end}' | xargs -r "$KUBECTL" -n "$NS" delete skilljob --wait=false >/dev/null
    K wait --for=delete skillbinding/e2e-warm --timeout=120s >/dev/null 2>&1
    bind "$ROOT/tests/kind/skills/e2e-warm" bash "$BASH_PATH" scripts/look.sh || return 1
    pkg="$(K get skillbinding e2e-warm -o jsonpath='{.spec.package}')"
    "$KUBECTL" patch skillpackage "$pkg" --type merge -p '{"spec":{"runtime":{"resources":{"cpu":"200m","memory":"128Mi","ephemeralStorage":"1Gi"}}}}' >/dev/null || return 1
    K wait --for=condition=Ready skillbinding/e2e-warm --timeout=60s >/dev/null
  }
  gateway_bench() {
    local token
    # A token of its own: the gateway checks' one is an hour old by now (and
    # ALLOWED names the egress host since the egress checks).
    token="$("$KUBECTL" -n "$NS" create token skills-agent --duration=1h)" || return 1
    ALLOWED="$token" gw bench "$BENCH_RUNS" e2e-warm scripts/look.sh >"$WORK/gw-bench.out" 2>&1 || { cat "$WORK/gw-bench.out"; return 1; }
  }
  if [[ " $BENCH_WHICH " == *" gateway "* && -n "$GATEWAY_CLUSTER_IP" ]]; then
    check "bind e2e-warm (bash, 200m) for the gateway benchmark" gateway_bench_bind
    check "gateway skill_run benchmark, cold and warm ($BENCH_RUNS runs each)" gateway_bench
    sed 's/^/     /' "$WORK/gw-bench.out"
  fi
fi
finish
