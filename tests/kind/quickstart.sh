#!/usr/bin/env bash
# The quick start on a real cluster, as a newcomer runs it, both ways the
# README gives:
#   1. the archive path (no access to the release registry): the README's
#      archive block (scripts/quickstart-commands.sh --block archive) run as
#      written: `image self --archive` (this build's binary stands for
#      `cargo build --release && target/release/skill-operator`), the
#      README's containerd line `ctr -n k8s.io images import` into the
#      node's containerd (CONTAINERD_ADDRESS), `helm install` of the clone's
#      chart with the flags the first line wrote; csv-stats runs on the
#      loaded image (no pull of it anywhere); an archive for another
#      architecture is refused before anything is created; then all of it
#      is uninstalled;
#   2. the registry path: scripts/release.sh publishes the image and the
#      chart to the local registry, standing for ghcr.io (the README's
#      `oci://ghcr.io/skill-operator/...` becomes that registry and helm gets
#      --plain-http, nothing else), a chart version that does not exist is
#      refused with nothing installed, then the README's three lines run,
#      the README's agent reaches the csv-stats result through the gateway
#      (tests/kind/quickstart_client.py checks an inline CSV too), and the
#      lines to that first result are timed;
#   - then: the artifact endpoint restarted (what an upgrade does) still has
#     the first run's files (read over its /v2 API with the operator
#     credential; a job token is refused there); `helm uninstall` keeps the
#     CRDs, the store's claim and the sample SkillPackages; cleanup.
# What this cluster lacks that a user's has is added to each install and
# printed (`extras:`): no cluster DNS (pinned ClusterIPs), no Docker Hub (the
# samples' run images from the local registry, the README's mirror flags),
# 2 CPUs (one gateway replica), and no default StorageClass (the test makes
# one, as a cluster setting, not a flag).
# The last line is "quickstart: N passed, M failed" (exit 1 when M > 0).
# Without KUBECONFIG or a reachable cluster it prints SKIPPED (a failure with
# SKILL_OPERATOR_REQUIRE_GATED=1).
#
# Settings (environment):
#   SKILL_OPERATOR_BIN   the binary (default target/release, else target/debug)
#   IMAGE_REGISTRY       host:port the node pulls from, plain HTTP (default 127.0.0.1:5000)
#   CONTAINERD_ADDRESS   the node's containerd socket for the archive path
#                        (default: the local cluster's; without one that
#                        path is SKIPPED, counted as a failure under
#                        SKILL_OPERATOR_REQUIRE_GATED=1)
#   QS_RELEASE, QS_NS, QS_DEMO_NS   release and namespaces (default skills,
#                        skill-operator, skills-demo: the quick start's own names)
#   QS_PORT              local port of the port-forward (default 8090)
#   QS_SET               extra `--set k=v` pairs, space-separated, replacing the
#                        local-cluster defaults below (another cluster: its own)
#   QS_STORAGE_DIR       on the local cluster: the host directory of the store's
#                        PersistentVolume (default a fresh temp dir)
#   KEEP=1               leave everything in place
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BIN="${SKILL_OPERATOR_BIN:-}"
if [[ -z "$BIN" ]]; then
  BIN="$ROOT/target/release/skill-operator"
  [[ -x "$BIN" ]] || BIN="$ROOT/target/debug/skill-operator"
fi
KUBECTL="${KUBECTL:-$(command -v kubectl || echo "$ROOT/target/test-deps/bin/kubectl")}"
HELM="${HELM:-$(command -v helm || echo "$ROOT/target/test-deps/bin/helm")}"
VENV_PY="$ROOT/target/test-deps/venv/bin/python"

SUITE=quickstart SUITE_WHAT="the quick start"
# shellcheck source=tests/kind/suite.sh
source "$ROOT/tests/kind/suite.sh"
[[ -n "${KUBECONFIG:-}" ]] || skip "KUBECONFIG is not set"
"$KUBECTL" version --request-timeout=5s >/dev/null 2>&1 || skip "KUBECONFIG does not point at a reachable cluster"
[[ -x "$BIN" ]] || { echo "quickstart: $BIN is missing: cargo build --release" >&2; exit 1; }
[[ -x "$VENV_PY" ]] || { echo "quickstart: $VENV_PY is missing: scripts/install-test-deps.sh" >&2; exit 1; }

now_ms() { date +%s%3N; }

RELEASE="${QS_RELEASE:-skills}" OPNS="${QS_NS:-skill-operator}" DEMO="${QS_DEMO_NS:-skills-demo}" PORT="${QS_PORT:-8090}"
IMAGE_REGISTRY="${IMAGE_REGISTRY:-127.0.0.1:5000}"
WORK="$(mktemp -d)"
LOCAL=0
if [[ "$(readlink -f "$KUBECONFIG")" == "$(readlink -f "${LOCAL_CLUSTER_HOME:-/var/lib/local-cluster}/kubeconfig" 2>/dev/null)" ]]; then LOCAL=1; fi
SC="$RELEASE-quickstart-store"
PV="$RELEASE-quickstart-store"
PF_PID=""

# Everything one install made, and what uninstall keeps of it (the
# controller that clears the packages' finalizers is gone with the release).
teardown() {
  [[ -n "$PF_PID" ]] && kill "$PF_PID" 2>/dev/null
  PF_PID=""
  "$KUBECTL" delete namespace "$DEMO" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
  "$HELM" uninstall "$RELEASE" -n "$OPNS" --wait --timeout 120s >/dev/null 2>&1
  for p in $("$KUBECTL" get skillpackages -l "app.kubernetes.io/instance=$RELEASE,skill-operator.dev/sample" -o name 2>/dev/null); do
    "$KUBECTL" patch "$p" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
    "$KUBECTL" delete "$p" --wait=false >/dev/null 2>&1
  done
  "$KUBECTL" -n "$OPNS" delete pvc "$RELEASE-skill-operator-artifacts-store" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1
  "$KUBECTL" delete namespace "$OPNS" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
  if [[ $LOCAL == 1 && -z "${QS_SET:-}" ]]; then
    "$KUBECTL" delete pv "$PV" --ignore-not-found >/dev/null 2>&1
    "$KUBECTL" delete storageclass "$SC" --ignore-not-found >/dev/null 2>&1
  fi
}

cleanup() {
  if [[ "${KEEP:-}" != 1 ]]; then
    teardown
    # CRDs this run brought are kept by uninstall (as checked) but owned by
    # its release, which would stop the next install of another release:
    # they go when nothing of anyone else's uses them.
    if [[ "${CRDS_MADE:-}" == 1 && -z "$("$KUBECTL" get skillpackages,skillbindings,skilljobs -A -o name 2>/dev/null)" ]]; then
      "$KUBECTL" delete crd skillpackages.skill-operator.dev skillbindings.skill-operator.dev skilljobs.skill-operator.dev \
        --ignore-not-found >/dev/null 2>&1
    fi
    [[ -n "${STORE_DIR_MADE:-}" ]] && rm -rf "$STORE_DIR_MADE"
  fi
  [[ -n "${PF_PID:-}" ]] && kill "$PF_PID" 2>/dev/null
  # The loaded image stays on the node: its tag names its digest, and a later
  # run of the same build imports the same image over it.
  rm -rf "$WORK"
}
trap cleanup EXIT

if "$HELM" status "$RELEASE" -n "$OPNS" >/dev/null 2>&1; then
  echo "quickstart: release $RELEASE already exists in $OPNS (another run?): set QS_RELEASE/QS_NS/QS_DEMO_NS" >&2
  trap - EXIT
  rm -rf "$WORK"
  exit 1
fi

# ------------------------------------------------- the cluster-specific extras
extras=()
if [[ -n "${QS_SET:-}" ]]; then
  for kv in $QS_SET; do extras+=(--set "$kv"); done
elif [[ $LOCAL == 1 ]]; then
  # No cluster DNS: pinned ClusterIPs (free ones, apart from tests/kind/run.sh's
  # .50-.52); run images from the local registry (Debian paths: the README's
  # mirror flags); one gateway replica on 2 CPUs.
  extras+=(--set artifacts.service.clusterIP=10.0.0.70 --set egressProxy.service.clusterIP=10.0.0.71
    --set gateway.service.clusterIP=10.0.0.72 --set "gateway.replicas=1" --set gateway.resources.cpu=100m
    --set "samples.images.python=$IMAGE_REGISTRY/runtime:trixie" --set samples.interpreterPaths.python=/usr/bin/python3
    --set "samples.images.node=$IMAGE_REGISTRY/runtime:trixie" --set samples.interpreterPaths.node=/usr/bin/node
    --set "samples.images.bash=$IMAGE_REGISTRY/runtime:trixie" --set samples.resources.cpu=250m)
  STORE_DIR="${QS_STORAGE_DIR:-}"
  if [[ -z "$STORE_DIR" ]]; then STORE_DIR="$(mktemp -d /tmp/quickstart-store.XXXXXX)"; STORE_DIR_MADE="$STORE_DIR"; fi
fi
# No default StorageClass here: a default class of our own with one hostPath
# volume for the store's claim (a cluster setting, as kind's local-path is).
make_storage() {
  [[ $LOCAL == 1 && -z "${QS_SET:-}" ]] || return 0
  rm -rf "${STORE_DIR:?}"/* 2>/dev/null
  # hostPath volumes get no fsGroup: the store's uid must own it.
  chown 65532:65532 "$STORE_DIR" && chmod 0700 "$STORE_DIR"
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $SC
  annotations: { storageclass.kubernetes.io/is-default-class: "true" }
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
---
apiVersion: v1
kind: PersistentVolume
metadata: { name: $PV }
spec:
  capacity: { storage: 8Gi }
  accessModes: [ReadWriteOnce]
  storageClassName: $SC
  persistentVolumeReclaimPolicy: Retain
  claimRef: { namespace: $OPNS, name: $RELEASE-skill-operator-artifacts-store }
  hostPath: { path: $STORE_DIR, type: Directory }
YAML
}
check "a default StorageClass and a volume for the store (this cluster has none)" make_storage
# CRDs owned by another release on this cluster cannot be adopted: leave them.
CRDS_MADE=1
"$KUBECTL" get crd skilljobs.skill-operator.dev >/dev/null 2>&1 && CRDS_MADE=0
owner="$("$KUBECTL" get crd skilljobs.skill-operator.dev -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}' 2>/dev/null)"
if "$KUBECTL" get crd skilljobs.skill-operator.dev >/dev/null 2>&1 && [[ "$owner" != "$RELEASE" ]]; then
  "$KUBECTL" apply --server-side --force-conflicts -f "$ROOT/crds/" >/dev/null
  extras+=(--set crds.install=false)
  echo "note: the CRDs belong to ${owner:-no release}; installing with crds.install=false"
fi
echo "extras: ${extras[*]}"
mkdir -p "$WORK/bin" "$WORK/cwd"
ln -sf "$(command -v "$HELM")" "$WORK/bin/helm"
ln -sf "$(command -v "$KUBECTL")" "$WORK/bin/kubectl"
PATH="$WORK/bin:$PATH"
localize() {
  local l="$1"
  l="${l//skills-skill-operator-gateway/$RELEASE-skill-operator-gateway}"
  l="${l//helm install skills /helm install $RELEASE }"
  l="${l//-n skill-operator /-n $OPNS }"
  l="${l//-n skills-demo /-n $DEMO }"
  l="${l//8090:8090/$PORT:8090}"
  printf '%s' "$l"
}
quickstart_yaml() {
  # The file as it is, with the names this run uses when they are not the defaults.
  sed -e "s/skills-demo/$DEMO/g" -e "s/package: skills-csv-stats/package: $RELEASE-csv-stats/" config/samples/k8s/quickstart.yaml
}
# The README's second and third lines and its agent, on whatever install is up.
TOKEN=""
agent_run() { # $1: what to call it
  if [[ "$RELEASE/$DEMO" == skills/skills-demo ]]; then
    check "${LINES[1]}" eval "${LINES[1]}"
  else
    check "${LINES[1]} (names: $RELEASE, $DEMO)" "$KUBECTL" apply -f <(quickstart_yaml)
  fi
  T2=$(now_ms)
  TOKEN=""
  eval "$(localize "${LINES[2]}")" >"$WORK/port-forward.log" 2>&1
  PF_PID=$!
  [[ -n "$TOKEN" ]] && ok "${LINES[2]}" || bad "${LINES[2]}: no token"
  for _ in $(seq 100); do grep -q "Forwarding from" "$WORK/port-forward.log" && break; sleep 0.1; done
  T3=$(now_ms)
  # The README's agent, verbatim: preview, confirm, the run's statistics.
  if GATEWAY_URL="http://localhost:$PORT/mcp/$DEMO" TOKEN="$TOKEN" "$VENV_PY" config/samples/agent/quickstart_agent.py >"$WORK/agent.out" 2>&1 \
    && grep -q '"rows"' "$WORK/agent.out"; then
    ok "$1: the README's agent (config/samples/agent/quickstart_agent.py): $(head -c 200 "$WORK/agent.out" | tr '\n' ' ')"
  else
    bad "$1: the README's agent: $(tail -n 5 "$WORK/agent.out" | tr '\n' ' ')"
    "$KUBECTL" get skillpackages -o wide; "$KUBECTL" -n "$DEMO" get skillbindings,skilljobs,pods -o wide
    "$KUBECTL" -n "$OPNS" logs deploy/"$RELEASE"-skill-operator-controller --tail=30
  fi
  T4=$(now_ms)
}
samples_exist() {
  local s
  for s in csv-stats json-pretty word-count release-notes weather-brief; do
    "$KUBECTL" get skillpackage "$RELEASE-$s" >/dev/null 2>&1 || { echo "skillpackage/$RELEASE-$s is not there yet"; return 1; }
  done
}
install_failed() {
  "$KUBECTL" -n "$OPNS" get pods,pvc -o wide
  "$KUBECTL" -n "$OPNS" logs deploy/"$RELEASE"-skill-operator-artifacts --tail=20
  finish
}
mapfile -t LINES < <(bash scripts/quickstart-commands.sh)
if [[ ${#LINES[@]} != 3 ]]; then bad "the README quickstart has ${#LINES[@]} commands, not 3"; finish; fi
mapfile -t ALINES < <(bash scripts/quickstart-commands.sh --block archive)
if [[ ${#ALINES[@]} != 3 ]]; then bad "the README's archive quickstart has ${#ALINES[@]} commands, not 3"; finish; fi

# --------------------------------------------------- 1. the archive path
CTRD="${CONTAINERD_ADDRESS:-}"
if [[ -z "$CTRD" && $LOCAL == 1 ]]; then CTRD="${LOCAL_CLUSTER_HOME:-/var/lib/local-cluster}/run/containerd/containerd.sock"; fi
if [[ -z "$CTRD" || ! -S "$CTRD" ]] || ! command -v ctr >/dev/null; then
  echo "quickstart: the archive path SKIPPED (no node containerd socket to import into: set CONTAINERD_ADDRESS; and ctr on PATH)"
  [[ "${SKILL_OPERATOR_REQUIRE_GATED:-}" == 1 ]] && bad "the archive path could not run (SKILL_OPERATOR_REQUIRE_GATED=1)"
else
  # Line 1: this build's binary stands for `cargo build --release && target/release/skill-operator`.
  build_line="${ALINES[0]/cargo build --release && target\/release\/skill-operator/$(printf '%q' "$BIN")}"
  A0=$(now_ms)
  check "${ALINES[0]}" bash -c "cd '$WORK/cwd' && $build_line"
  flags="$(cat "$WORK/cwd/helm-flags" 2>/dev/null)"
  tag="$(sed -n 's/.*image.tag=\([^ ]*\).*/\1/p' <<<"$flags")"
  echo "printed: $flags"
  # Line 2, for a containerd node (the README's line for it), into the node's containerd.
  check "ctr -n k8s.io images import skill-operator.tar (the README's containerd line)" \
    bash -c "cd '$WORK/cwd' && CONTAINERD_ADDRESS='$CTRD' ctr -n k8s.io images import skill-operator.tar"
  imported() {
    local name="ghcr.io/skill-operator/skill-operator:$tag"
    local listed
    listed="$(CONTAINERD_ADDRESS="$CTRD" ctr -n k8s.io images ls -q "name==$name")"
    grep -qx "$name" <<<"$listed" || { echo "containerd has no $name"; return 1; }
  }
  check "the node's containerd holds the image under the printed tag ($tag)" imported
  wrong_arch() {
    local out
    if out="$(cd "$WORK/cwd" && helm install "$RELEASE-arch" "$ROOT/charts/skill-operator" -n "$OPNS-arch" --create-namespace $(cat helm-flags) --set image.architecture=s390x 2>&1)"; then
      echo "an s390x image was installed on this cluster"; return 1
    fi
    grep -q "image.architecture is s390x" <<<"$out" || { echo "not the architecture refusal: $out"; return 1; }
    ! helm status "$RELEASE-arch" -n "$OPNS-arch" >/dev/null 2>&1 || { echo "a release was left"; return 1; }
    ! kubectl get namespace "$OPNS-arch" >/dev/null 2>&1 || { echo "its namespace was made"; return 1; }
  }
  check "an archive for an architecture no node has is refused before anything is created" wrong_arch
  # Line 3: the clone's chart with the printed flags (the chart path is the clone's).
  install_line="$(localize "${ALINES[2]}")"
  install_line="${install_line/charts\/skill-operator/$ROOT/charts/skill-operator}"
  before=$FAIL
  check "${ALINES[2]}" bash -c "cd '$WORK/cwd' && $install_line --timeout 300s $(printf '%q ' "${extras[@]}")"
  [[ $FAIL == "$before" ]] || install_failed
  check "helm install --wait returned with the sample SkillPackages in place" samples_exist
  agent_run "the archive path"
  echo "timings (archive path): archive, import, install and the agent's first result: $((T4 - A0)) ms"
  never_pulled() {
    local pulled
    pulled="$(kubectl get events -A --field-selector reason=Pulling -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -c "skill-operator/skill-operator:$tag")"
    [[ "$pulled" == 0 ]] || { echo "$pulled pulls of the loaded image"; return 1; }
    local images
    images="$(kubectl -n "$OPNS" get pods -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}')"
    grep -q ":$tag$" <<<"$images" || { echo "no operator pod runs it: $images"; return 1; }
    local policies
    policies="$(kubectl -n "$OPNS" get deploy -o jsonpath='{range .items[*]}{.spec.template.spec.containers[0].imagePullPolicy}{"\n"}{end}' | sort -u)"
    [[ "$policies" == Never ]] || { echo "operator pull policies: $policies"; return 1; }
    local arg
    arg="$(kubectl -n "$OPNS" get deploy "$RELEASE-skill-operator-controller" -o jsonpath='{.spec.template.spec.containers[0].args}')"
    grep -q -- '--operator-image-pull-policy=Never' <<<"$arg" || { echo "run pods are not told Never: $arg"; return 1; }
  }
  check "the operator's pods and the run's containers used the loaded image, never pulling it" never_pulled
  teardown
  check "a default StorageClass and a volume for the store, again" make_storage
fi

# --------------------------------------------------- 2. the registry path
RELEASE_REGISTRY="$IMAGE_REGISTRY/quickstart-$(date +%s)"
release_ok() {
  SKILL_OPERATOR_BIN="$BIN" HELM="$HELM" bash scripts/release.sh --registry "$RELEASE_REGISTRY" --plain-http --out "$WORK/release" || return 1
  python3 - "$WORK/release/release.json" "$RELEASE_REGISTRY" <<'PY'
import json, subprocess, sys
r = json.load(open(sys.argv[1]))
pushed = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{sys.argv[2]}/skill-operator:{r['appVersion']}"],
                        capture_output=True, text=True, check=True).stdout.strip()
assert pushed == r["imageDigest"], f"the registry holds {pushed}, the release notes say {r['imageDigest']}"
assert r["chartDigest"].startswith("sha256:"), r
PY
}
check "scripts/release.sh publishes image and chart to $RELEASE_REGISTRY (digests in its notes equal the registry's)" release_ok
refused_push() {
  local out
  out="$(SKILL_OPERATOR_BIN="$BIN" HELM="$HELM" bash scripts/release.sh --registry 127.0.0.1:9/nowhere --plain-http --out "$WORK/refused" 2>&1)" && { echo "a push to a closed port succeeded"; return 1; }
  grep -q "pushing the image to 127.0.0.1:9/nowhere/skill-operator failed" <<<"$out" && grep -q "nothing else was pushed" <<<"$out" || { echo "$out"; return 1; }
  [[ ! -e "$WORK/refused/release-notes.md" ]] || { echo "notes written for a failed release"; return 1; }
}
check "a registry that refuses the push: release.sh stops, says what to do, writes no notes" refused_push
CHART_VERSION="$(sed -n 's/^version: //p' charts/skill-operator/Chart.yaml)"
registry_line() { # the README's line 1 against the local registry
  local l
  l="$(localize "${LINES[0]}")"
  l="${l//oci:\/\/ghcr.io\/skill-operator/oci://$RELEASE_REGISTRY}"
  printf '%s --plain-http' "$l"
}
no_such_version() {
  local out line
  line="$(registry_line)"
  line="${line/--version $CHART_VERSION/--version 9.9.9}"
  out="$(eval "$line" 2>&1)" && { echo "version 9.9.9 installed"; return 1; }
  grep -qi "not found\|9.9.9" <<<"$out" || { echo "$out"; return 1; }
  ! helm status "$RELEASE" -n "$OPNS" >/dev/null 2>&1 || { echo "a release was left"; return 1; }
}
check "a chart version that does not exist is refused, nothing installed" no_such_version

# ------------------------------------------- 3. an upgrade from N-1 to N
# The previous chart version (the tree's chart at the commit before its
# version last changed), published by the same script to the same registry,
# installed and used; then `helm upgrade` to this version: every object and
# stored file is still there, and the binding runs again. Both charts run
# this build's image (SKILL_OPERATOR_PREVIOUS_BIN gives the previous
# release's binary to the first, when there is one).
previous_chart() {
  local c last=""
  for c in $(git -C "$ROOT" log --format=%H -- charts/skill-operator/Chart.yaml); do
    if [[ "$(git -C "$ROOT" show "$c:charts/skill-operator/Chart.yaml" | sed -n 's/^version: //p')" != "$CHART_VERSION" ]]; then
      [[ -n "$last" ]] && { echo "$last^"; return 0; }
      echo "$c"; return 0
    fi
    last="$c"
  done
  return 1
}
PREV_COMMIT="$(previous_chart 2>/dev/null)"
if [[ -z "$PREV_COMMIT" ]] || ! git -C "$ROOT" archive "$PREV_COMMIT" charts/skill-operator | tar -x -C "$WORK" --transform 's,^charts/skill-operator,prev-chart,' 2>/dev/null; then
  echo "quickstart: the upgrade SKIPPED (no previous chart version in this clone's history)"
  [[ "${SKILL_OPERATOR_REQUIRE_GATED:-}" == 1 ]] && bad "the upgrade could not run: no previous chart version in the git history (a shallow clone?)"
else
  PREV_VERSION="$(sed -n 's/^version: //p' "$WORK/prev-chart/Chart.yaml")"
  check "release.sh publishes the previous chart $PREV_VERSION ($PREV_COMMIT)" env SKILL_OPERATOR_BIN="${SKILL_OPERATOR_PREVIOUS_BIN:-$BIN}" HELM="$HELM" \
    bash scripts/release.sh --registry "$RELEASE_REGISTRY" --plain-http --out "$WORK/release-prev" --chart "$WORK/prev-chart"
  prev_line="$(registry_line)"
  prev_line="${prev_line/--version $CHART_VERSION/--version $PREV_VERSION}"
  before=$FAIL
  check "helm install of $PREV_VERSION from the registry" eval "$prev_line --timeout 300s $(printf '%q ' "${extras[@]}")"
  [[ $FAIL == "$before" ]] || install_failed
  check "$PREV_VERSION: the sample SkillPackages in place" samples_exist
  agent_run "$PREV_VERSION"
  kill "$PF_PID" 2>/dev/null; PF_PID=""
  warm_on() { kubectl -n "$DEMO" patch skillbinding csv-stats --type merge -p '{"spec":{"warm":{"min":1,"max":1}}}' >/dev/null || return 1
    for _ in $(seq 90); do [[ -n "$(kubectl -n "$DEMO" get pods -l skill-operator.dev/warm-binding -o name 2>/dev/null)" ]] && return 0; sleep 1; done
    echo "no warm pod"; return 1; }
  check "$PREV_VERSION: a warm pool of one for the binding" warm_on
  state() { # what must survive: objects by UID, the run's verdict, the store's job files
    { kubectl get skillpackages -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.status.digest}{"\n"}{end}'
      kubectl -n "$DEMO" get skillbindings,skilljobs -o jsonpath='{range .items[*]}{.kind} {.metadata.name} {.metadata.uid} {.status.phase}{"\n"}{end}'
      kubectl -n "$OPNS" get pvc -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}'
      kubectl -n "$OPNS" get secret "$RELEASE-skill-operator-token-key" -o jsonpath='{.metadata.uid}{"\n"}'
    } | sort
  }
  state >"$WORK/before-upgrade"
  store_tags() {
    local ip key tok
    ip="$(kubectl -n "$OPNS" get svc "$RELEASE-skill-operator-artifacts" -o jsonpath='{.spec.clusterIP}')"
    key="$(kubectl -n "$OPNS" get secret "$RELEASE-skill-operator-token-key" -o jsonpath='{.data.token-key}')"
    tok="$(python3 -c 'import base64,hashlib,hmac,sys; print(hmac.new(base64.b64decode(sys.argv[1]), b"/operator", hashlib.sha256).hexdigest())' "$key")"
    curl -sf -u "operator:$tok" "http://$ip:8443/v2/jobs/tags/list" | python3 -c 'import json,sys; print("\n".join(sorted(json.load(sys.stdin)["tags"])))'
  }
  store_tags >"$WORK/tags-before-upgrade" 2>/dev/null
  up_line="$(registry_line)"
  up_line="${up_line/helm install /helm upgrade }"
  up_line="${up_line/ --create-namespace/}"
  check "helm upgrade $PREV_VERSION -> $CHART_VERSION" eval "$up_line --timeout 300s $(printf '%q ' "${extras[@]}")"
  kept() {
    state >"$WORK/after-upgrade"
    diff "$WORK/before-upgrade" "$WORK/after-upgrade" || { echo "objects changed across the upgrade"; return 1; }
    [[ -s "$WORK/before-upgrade" ]] || { echo "nothing recorded"; return 1; }
    for _ in $(seq 60); do store_tags >"$WORK/tags-after-upgrade" 2>/dev/null && break; sleep 1; done
    grep -q "_outputs$" "$WORK/tags-before-upgrade" || { echo "the first run stored nothing"; return 1; }
    # Every file stored before is still there (new warm pods add their claim keys).
    local lost
    lost="$(LC_ALL=C comm -23 "$WORK/tags-before-upgrade" "$WORK/tags-after-upgrade")"
    [[ -z "$lost" ]] || { echo "the upgrade lost stored files: $lost"; return 1; }
    for _ in $(seq 90); do [[ -n "$(kubectl -n "$DEMO" get pods -l skill-operator.dev/warm-binding -o name 2>/dev/null)" ]] && return 0; sleep 1; done
    echo "the warm pool is gone"; return 1
  }
  check "the upgrade kept every SkillPackage, SkillBinding and SkillJob (same UIDs and phases), the store's claim, key and files, and the warm pool" kept
  agent_run "after the upgrade to $CHART_VERSION"
  teardown
  check "a default StorageClass and a volume for the store, again" make_storage
fi

# persistence.enabled=auto asks the cluster (helm's lookup; --dry-run=server looks up):
# a claim with a default StorageClass, else an emptyDir and the NOTES warning.
auto_volume() {
  local has_default out
  has_default="$("$KUBECTL" get storageclass -o jsonpath='{range .items[*]}{.metadata.annotations.storageclass\.kubernetes\.io/is-default-class}{"\n"}{end}' | grep -cx true)"
  out="$("$HELM" install "$RELEASE-probe" charts/skill-operator -n "$OPNS-probe" --dry-run=server --set crds.install=false 2>&1)" || { echo "$out" | tail -n 3; return 1; }
  if [[ "$has_default" -gt 0 ]]; then
    grep -q "claimName: $RELEASE-probe-skill-operator-artifacts-store" <<<"$out" || { echo "a default StorageClass, but no claim"; return 1; }
  else
    grep -q "WARNING: the artifact store is on an emptyDir" <<<"$out" || { echo "no default StorageClass, but no emptyDir warning"; return 1; }
    grep -q "kind: PersistentVolumeClaim" <<<"$out" && { echo "no default StorageClass, but a claim"; return 1; }
  fi
  return 0
}
check "persistence auto follows the cluster's default StorageClass (dry-run=server)" auto_volume

# ------------------------------------------------------ the three lines, timed
# The README's lines as a newcomer copies them (scripts/quickstart-commands.sh
# prints them; tests/docs.rs holds the two together): the registry stands
# for ghcr.io, only this cluster's extras are added to the install, and other
# names replace the defaults when QS_RELEASE, QS_NS, QS_DEMO_NS or QS_PORT ask.
before=$FAIL
T0=$(now_ms)
check "${LINES[0]}" eval "$(registry_line) --timeout 300s $(printf '%q ' "${extras[@]}")"
T1=$(now_ms)
[[ $FAIL == "$before" ]] || install_failed
# The artifact endpoint is not ready until it has applied the sample
# SkillPackages, so --wait returns with them in place (untimed: a newcomer
# runs the next line at once).
check "helm install --wait returned with the sample SkillPackages in place" samples_exist
T1B=$(now_ms)
pinned_release() {
  local want
  want="$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["image"] + "@" + r["imageDigest"])' "$WORK/release/release.json")"
  [[ "$(kubectl -n "$OPNS" get deploy "$RELEASE-skill-operator-controller" -o jsonpath='{.spec.template.spec.containers[0].image}')" == "$want" ]] \
    || { echo "the controller does not run $want"; return 1; }
}
check "the installed chart runs exactly the released image digest" pinned_release
second_release() {
  local out
  if out="$(helm install "$RELEASE-second" charts/skill-operator -n "$OPNS-second" --create-namespace --set crds.install=false 2>&1)"; then
    echo "a second release installed beside $OPNS/$RELEASE"; return 1
  fi
  grep -q "another skill-operator release, $OPNS/$RELEASE (namespace/release), already runs its controller" <<<"$out" || { echo "$out"; return 1; }
  ! kubectl get namespace "$OPNS-second" >/dev/null 2>&1 || { echo "its namespace was made"; return 1; }
  helm upgrade "$RELEASE" "$(registry_line | sed -n 's/.* \(oci:[^ ]*\) .*/\1/p')" -n "$OPNS" --version "$CHART_VERSION" --plain-http --reuse-values --dry-run=server >/dev/null \
    || { echo "an upgrade of the release itself is refused too"; return 1; }
}
check "a second release on the same cluster is refused, naming the first; the first's own upgrade is not" second_release
agent_run "the registry path"
# A second client checks the statistics of an inline CSV (and times nothing).
if "$VENV_PY" tests/kind/quickstart_client.py "http://localhost:$PORT/mcp/$DEMO" "$TOKEN" >"$WORK/client.out" 2>&1; then
  ok "csv-stats on an inline CSV through the gateway: $(cat "$WORK/client.out")"
else
  bad "csv-stats on an inline CSV: $(tail -n 5 "$WORK/client.out" | tr '\n' ' ')"
fi
echo "timings: helm install --wait $((T1 - T0)) ms; apply $((T2 - T1B)) ms; port-forward + token $((T3 - T2)) ms; the README's agent to its result $((T4 - T3)) ms; total $((T4 - T0 - (T1B - T1))) ms"

# ---------------------------------------- what the chart made, on this cluster
check "the sample SkillPackages are Ready, pinned to the store's digests" bash -c "
  for s in csv-stats json-pretty word-count release-notes; do
    '$KUBECTL' wait --for=condition=Ready skillpackage/$RELEASE-\$s --timeout=60s >/dev/null || exit 1
    '$KUBECTL' get skillpackage $RELEASE-\$s -o jsonpath='{.status.digest}' | grep -q '^sha256:' || exit 1
  done"
csv_digest="$("$KUBECTL" get skillpackage "$RELEASE-csv-stats" -o jsonpath='{.status.digest}')"
# What `package push` of the repository's directory gives (to the node's registry).
local_digest="$("$BIN" package push config/samples/skills/csv-stats --registry "$IMAGE_REGISTRY/quickstart-check" --plain-http 2>/dev/null \
  | sed -n 's/^# digest: //p')"
HAS_PVC=0
"$KUBECTL" -n "$OPNS" get pvc "$RELEASE-skill-operator-artifacts-store" >/dev/null 2>&1 && HAS_PVC=1
pvc_state() { [[ "$("$KUBECTL" -n "$OPNS" get pvc "$RELEASE-skill-operator-artifacts-store" -o jsonpath='{.status.phase}')" == Bound ]]; }
if [[ $HAS_PVC == 1 ]]; then check "the store is on its claim, Bound" pvc_state; else echo "note: the store is on an emptyDir here (no default StorageClass)"; fi

# The store over its registry API: the operator credential works, a job token does not.
ART_IP="$("$KUBECTL" -n "$OPNS" get svc "$RELEASE-skill-operator-artifacts" -o jsonpath='{.spec.clusterIP}')"
KEY_B64="$("$KUBECTL" -n "$OPNS" get secret "$RELEASE-skill-operator-token-key" -o jsonpath='{.data.token-key}')"
tokens() { # prints: operator-token job-token-for-(demo, some uid)
  python3 - "$KEY_B64" "$DEMO" <<'PY'
import base64, hashlib, hmac, sys
key = base64.b64decode(sys.argv[1])
mac = lambda msg: hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()
print(mac("/operator"), mac(f"{sys.argv[2]}/00000000-0000-4000-8000-000000000000"))
PY
}
read -r OP_TOKEN JOB_TOKEN < <(tokens)
job_tags() { curl -sf -u "operator:$OP_TOKEN" "http://$ART_IP:8443/v2/jobs/tags/list" | python3 -c 'import json,sys; print("\n".join(sorted(json.load(sys.stdin)["tags"])))'; }
job_tags >"$WORK/tags-before" 2>/dev/null
check "the store holds the run's package, inputs and outputs (read with the operator credential)" \
  grep -q "_outputs$" "$WORK/tags-before"
job_refused() {
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer job:$DEMO:00000000-0000-4000-8000-000000000000:$JOB_TOKEN" "http://$ART_IP:8443/v2/jobs/tags/list")"
  [[ "$code" == 403 ]] || { echo "a job token on /v2 got $code"; return 1; }
}
check "a job token is refused on the store's registry API (403)" job_refused
restart_keeps() {
  "$KUBECTL" -n "$OPNS" rollout restart "deploy/$RELEASE-skill-operator-artifacts" >/dev/null || return 1
  "$KUBECTL" -n "$OPNS" rollout status "deploy/$RELEASE-skill-operator-artifacts" --timeout=180s >/dev/null || return 1
  for _ in $(seq 60); do job_tags >"$WORK/tags-after" 2>/dev/null && break; sleep 1; done
  diff "$WORK/tags-before" "$WORK/tags-after" || { echo "the store changed across a restart"; return 1; }
}
if [[ $HAS_PVC == 1 ]]; then check "a restarted artifact endpoint (an upgrade's new pod) still has every job's files" restart_keeps; fi
[[ -n "$local_digest" && "$csv_digest" == "$local_digest" ]] && ok "csv-stats is pinned to the digest package push gives the repository's directory ($csv_digest)" \
  || bad "csv-stats pinned to $csv_digest, package push of the directory gives ${local_digest:-nothing}"

# -------------------------------------------------------------- helm uninstall
kill "$PF_PID" 2>/dev/null; PF_PID=""
"$KUBECTL" delete namespace "$DEMO" --wait=true --timeout=120s >/dev/null 2>&1
check "helm uninstall $RELEASE" "$HELM" uninstall "$RELEASE" -n "$OPNS" --wait --timeout 120s
check "uninstall keeps the CRDs" "$KUBECTL" get crd skillpackages.skill-operator.dev skillbindings.skill-operator.dev skilljobs.skill-operator.dev
if [[ $HAS_PVC == 1 ]]; then
  check "uninstall keeps the store's claim" "$KUBECTL" -n "$OPNS" get pvc "$RELEASE-skill-operator-artifacts-store"
fi
check "uninstall keeps the sample SkillPackages" "$KUBECTL" get skillpackage "$RELEASE-csv-stats"
finish
