#!/usr/bin/env bash
# The gated suites, run for real whenever their prerequisites are on this
# machine (called by scripts/test.sh):
#   - a built local cluster in LOCAL_CLUSTER_HOME (default /var/lib/local-cluster),
#     whose scripts are in LOCAL_CLUSTER_SCRIPTS (default ../shared/local-cluster
#     beside the checkout): it is started (up.sh) if it is not running, and
#     tests/envtest*.rs, the controller benchmark in a short mode, the
#     prepared-image suite tests/cluster_prepare.rs and the real-cluster
#     suite tests/kind/run.sh and the quick start tests/kind/quickstart.sh
#     run against it (the CRDs of crds/ applied first); a cluster this
#     script started is stopped again (down.sh). With the cluster present,
#     SKILL_OPERATOR_REQUIRE_GATED=1 is set, so a suite that skips fails.
#   - otherwise each suite prints SKIPPED and nothing is counted as passed.
# KUBECONFIG or KUBEBUILDER_ASSETS already set win over the local cluster.
#
# Test dependencies: when the suites are going to run for real (a cluster, or
# KUBECONFIG / KUBEBUILDER_ASSETS set), every tool they use is looked for
# first, before the cluster is started; each missing one is named with the
# command that installs it and nothing runs (exit 1). Without a cluster the
# suites skip and need none of them. `gated.sh --check-deps` runs only that
# check. TEST_DEPS_DIR: where the test tools are (default target/test-deps).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=test-deps-lib.sh
source "$ROOT/scripts/test-deps-lib.sh"
H="${LOCAL_CLUSTER_HOME:-/var/lib/local-cluster}"
SCRIPTS="${LOCAL_CLUSTER_SCRIPTS:-$ROOT/../shared/local-cluster}"
started=0

# The union of what the suites below need; the real-cluster suite checks its
# own list (tests/kind/run.sh --check-deps) and prints it the same way.
check_deps() {
  local kind_ok=0
  deps_need_cmd cargo "install Rust with rustup"
  # tests/chart/cluster_rbac.sh uses the pinned helm and kubectl.
  deps_need_cmd "${HELM:-$TEST_DEPS/bin/helm}" "$DEPS_INSTALL"
  deps_need_cmd "${KUBECTL:-$TEST_DEPS/bin/kubectl}" "$DEPS_INSTALL"
  # The suites and the controller benchmark start real registries.
  deps_need_exec /usr/bin/docker-registry "$DEPS_INSTALL_ROOT"
  # Its report goes to stderr like ours; KUBECONFIG is not needed for it.
  bash "$ROOT/tests/kind/run.sh" --check-deps >/dev/null || kind_ok=1
  deps_report gated || return 1
  return "$kind_ok"
}
if [[ "${1:-}" == --check-deps ]]; then
  check_deps || exit 1
  echo "gated: every test dependency is in place"
  exit 0
fi

if [[ -z "${KUBECONFIG:-}${KUBEBUILDER_ASSETS:-}" ]]; then
  if [[ -x "$H/assets/kube-apiserver" && -f "$H/kubeconfig" && -x "$SCRIPTS/up.sh" ]]; then
    check_deps || exit 1
    if ! KUBECONFIG="$H/kubeconfig" "$H/cache/bin/kubectl" version --request-timeout=5s >/dev/null 2>&1; then
      echo "gated: starting the local cluster in $H"
      mkdir -p "$ROOT/target"
      # A kubelet that misses up.sh's healthz wait once (a CI run saw it on
      # a busy machine) gets one clean second start; what each component
      # said is printed so a second failure explains itself.
      for try in 1 2; do
        if "$SCRIPTS/up.sh" >"$ROOT/target/local-cluster-up.log" 2>&1; then
          started=1
          break
        fi
        tail -n 20 "$ROOT/target/local-cluster-up.log"
        for c in kubelet containerd kube-apiserver; do
          echo "--- last lines of $H/logs/$c.log"
          tail -n 15 "$H/logs/$c.log" 2>/dev/null | cut -c1-400 || true
        done
        "$SCRIPTS/down.sh" >/dev/null 2>&1 || true
        if [[ $try == 2 ]]; then
          echo "gated: the local cluster in $H did not start twice; see its logs above" >&2
          exit 1
        fi
        echo "gated: the local cluster did not start; stopped it, starting it once more"
      done
    fi
    export KUBECONFIG="$H/kubeconfig" KUBEBUILDER_ASSETS="$H/assets" ENVTEST_APISERVER_FLAGS=--feature-gates=WatchList=false
    export PATH="$H/cache/bin:$PATH" SKILL_OPERATOR_REQUIRE_GATED=1
    # The real-cluster suite restarts this cluster's node (its kubelet and containerd).
    export LOCAL_CLUSTER_HOME="$H" LOCAL_CLUSTER_SCRIPTS="$SCRIPTS"
  else
    echo "gated: no local cluster in $H (or its scripts in $SCRIPTS): the gated suites print SKIPPED"
  fi
else
  check_deps || exit 1
fi
stop() { if [[ $started == 1 ]]; then "$SCRIPTS/down.sh" >/dev/null 2>&1 || true; fi; }
trap stop EXIT

# The suites that drive the real cluster (gateway_executor first) need the
# operator's CRDs, which a fresh cluster lacks until a chart install: apply
# the committed ones (tests/kind/run.sh adopts them into its release; the
# quick start and the console install with crds.install=false and leave them).
if [[ -n "${KUBECONFIG:-}" ]]; then
  K="${KUBECTL:-$(command -v kubectl || echo "$TEST_DEPS/bin/kubectl")}"
  "$K" apply --server-side --force-conflicts --field-manager=skill-operator-tests -f "$ROOT/crds/" >/dev/null
  "$K" wait --for condition=established --timeout=60s \
    crd/skillpackages.skill-operator.dev crd/skillbindings.skill-operator.dev crd/skilljobs.skill-operator.dev crd/skillsources.skill-operator.dev >/dev/null
  echo "gated: the CRDs of crds/ are applied to the cluster"
  # A node under disk, memory or PID pressure admits no pod: every
  # real-cluster suite would then wait out its Jobs' deadlines and fail
  # with nothing said about why (a CI run once found the disk 99% full).
  # Wait for the kubelet's first report, then refuse to start with the
  # node's own words and this machine's free space.
  pressure=""
  for _ in $(seq 60); do
    ready=$("$K" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null || true)
    pressure=$("$K" get nodes -o jsonpath='{range .items[*]}{range .status.conditions[?(@.status=="True")]}{.type}: {.message}{"\n"}{end}{end}' 2>/dev/null | grep -E '^(Disk|Memory|PID)Pressure' || true)
    [[ -n "$ready" && "$ready" != *False* && "$ready" != *Unknown* ]] && break
    sleep 1
  done
  # The kubelet may not have said so yet on a node it has just started:
  # the suites' registries, images and spools need a few GiB of their own.
  avail=$(df --output=avail -BG "$H" 2>/dev/null | tail -n 1 | tr -dc 0-9)
  if [[ -n "$avail" && "$avail" -lt "${GATED_MIN_FREE_GIB:-4}" ]]; then
    pressure="only ${avail} GiB free where the node keeps its images and volumes (${GATED_MIN_FREE_GIB:-4} GiB needed)"
  fi
  if [[ -n "$pressure" ]]; then
    echo "gated: the cluster's node admits no pods, so no real-cluster suite can run:" >&2
    echo "$pressure" | sed 's/^/  /' >&2
    df -h "$ROOT" "$H" 2>/dev/null | sed 's/^/  /' >&2
    echo "  free space (or memory) on this machine, then run the tests again" >&2
    exit 1
  fi

  # Pods reach this machine at the pod network's gateway (POD_GW, the
  # bridge's address), where the real-cluster suites listen. The CNI makes
  # that bridge with the node's first pod, so on a cluster that has run none
  # yet (a fresh CI machine) one short pod is run first.
  gw="${POD_GW:-10.88.0.1}"
  if [[ -n "$("$K" get nodes -o name 2>/dev/null)" ]] && ! ip -o addr show 2>/dev/null | grep -q " inet $gw/"; then
    probe=gated-pod-network
    "$K" -n default delete pod "$probe" --ignore-not-found --wait=true >/dev/null 2>&1 || true
    "$K" -n default apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: { name: $probe }
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: { runAsNonRoot: true, runAsUser: 65532, seccompProfile: { type: RuntimeDefault } }
  containers:
    - name: probe
      image: ${IMAGE_REGISTRY:-127.0.0.1:5000}/runtime:trixie
      command: ["/bin/true"]
      securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: [ALL] } }
YAML
    for _ in $(seq 120); do
      [[ -n "$("$K" -n default get pod "$probe" -o jsonpath='{.status.podIP}' 2>/dev/null)" ]] && break
      sleep 1
    done
    "$K" -n default delete pod "$probe" --wait=false >/dev/null 2>&1 || true
    if ! ip -o addr show | grep -q " inet $gw/"; then
      echo "gated: no address $gw (POD_GW) on this machine after a pod ran: the pod network is not up" >&2
      "$K" -n default describe pod "$probe" 2>/dev/null | tail -n 15 | sed 's/^/  /' >&2
      exit 1
    fi
    echo "gated: the pod network is up ($gw)"
  fi
fi

# suite NAME: one run of a gated cargo test; its summary lines here, the
# whole log tail on failure.
suite() {
  if cargo test --locked --test "$1" -- --nocapture >"$ROOT/target/$1.log" 2>&1; then
    grep -E "SKIPPED|$1:|test result" "$ROOT/target/$1.log" || true
  else
    tail -n 60 "$ROOT/target/$1.log"
    exit 1
  fi
}
for s in envtest envtest_leader envtest_pod_tokens envtest_staged controller_failover controller_api_restart controller_lossy_api controller_components_down envtest_egress envtest_cilium envtest_traces envtest_sources envtest_catalog gateway_auth gateway_catalog gateway_executor cluster_prepare; do suite "$s"; done
bash "$ROOT/tests/chart/cluster_rbac.sh"
SKILLJOBS="${GATED_BENCH_SKILLJOBS:-100}" cargo bench --locked --bench controller_throughput 2>&1 | tail -n 20
bash "$ROOT/tests/kind/run.sh"
bash "$ROOT/tests/kind/quickstart.sh"
bash "$ROOT/tests/console/run.sh"
