#!/usr/bin/env bash
# The quick start on a real cluster, as a newcomer runs it: no registry, no
# values, no push. It
#   - pushes this binary as the operator image (`skill-operator image self`,
#     as tests/kind/run.sh does),
#   - runs the three quick-start lines with only cluster-specific extras
#     (QS_SET: the image, pinned ClusterIPs for a cluster without DNS, run
#     images the node can pull, a StorageClass for the store's claim):
#       helm install skills charts/skill-operator -n skill-operator --create-namespace --wait
#       kubectl apply -f config/samples/k8s/quickstart.yaml
#       kubectl -n skill-operator port-forward svc/skills-skill-operator-gateway 8090:8090 & TOKEN=$(kubectl -n skills-demo create token skills-agent)
#   - drives the gateway with the real Python `mcp` client to a csv-stats
#     skill_run (tests/kind/quickstart_client.py) and times the lines to that
#     first result,
#   - restarts the artifact endpoint (what an upgrade does) and finds the
#     first run's files still in the store (read over its /v2 API with the
#     operator credential derived from the chart's token key; a job token
#     is refused there),
#   - `helm uninstall`, then checks the CRDs, the store's claim and the sample
#     SkillPackages are kept, and cleans up.
# The last line is "quickstart: N passed, M failed" (exit 1 when M > 0).
# Without KUBECONFIG or a reachable cluster it prints SKIPPED (a failure with
# SKILL_OPERATOR_REQUIRE_GATED=1).
#
# Settings (environment):
#   SKILL_OPERATOR_BIN   the binary (default target/release, else target/debug)
#   IMAGE_REGISTRY       host:port the node pulls from, plain HTTP (default 127.0.0.1:5000)
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

cleanup() {
  [[ -n "$PF_PID" ]] && kill "$PF_PID" 2>/dev/null
  if [[ "${KEEP:-}" != 1 ]]; then
    "$KUBECTL" delete namespace "$DEMO" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
    "$HELM" uninstall "$RELEASE" -n "$OPNS" >/dev/null 2>&1
    # What uninstall keeps, removed by hand (the controller that clears the
    # packages' finalizers is gone with the release).
    for p in $("$KUBECTL" get skillpackages -l "app.kubernetes.io/instance=$RELEASE,skill-operator.dev/sample" -o name 2>/dev/null); do
      "$KUBECTL" patch "$p" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
      "$KUBECTL" delete "$p" --wait=false >/dev/null 2>&1
    done
    "$KUBECTL" -n "$OPNS" delete pvc "$RELEASE-skill-operator-artifacts-store" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1
    "$KUBECTL" delete namespace "$OPNS" --ignore-not-found --wait=false >/dev/null 2>&1
    # CRDs this run brought are kept by uninstall (as checked) but owned by
    # its release, which would stop the next install of another release:
    # they go when nothing of anyone else's uses them.
    if [[ "${CRDS_MADE:-}" == 1 && -z "$("$KUBECTL" get skillpackages,skillbindings,skilljobs -A -o name 2>/dev/null)" ]]; then
      "$KUBECTL" delete crd skillpackages.skill-operator.dev skillbindings.skill-operator.dev skilljobs.skill-operator.dev \
        --ignore-not-found >/dev/null 2>&1
    fi
    if [[ $LOCAL == 1 && -z "${QS_SET:-}" ]]; then
      "$KUBECTL" delete pv "$PV" --ignore-not-found >/dev/null 2>&1
      "$KUBECTL" delete storageclass "$SC" --ignore-not-found >/dev/null 2>&1
      [[ -n "${STORE_DIR_MADE:-}" ]] && rm -rf "$STORE_DIR_MADE"
    fi
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if "$HELM" status "$RELEASE" -n "$OPNS" >/dev/null 2>&1; then
  echo "quickstart: release $RELEASE already exists in $OPNS (another run?): set QS_RELEASE/QS_NS/QS_DEMO_NS" >&2
  trap - EXIT
  rm -rf "$WORK"
  exit 1
fi

# ------------------------------------------------------------ operator image
ref="$("$BIN" image self --registry "$IMAGE_REGISTRY/skill-operator" --plain-http 2>"$WORK/image.log" | tail -n 1)"
digest="${ref##*@}"
if [[ "$digest" == sha256:* ]]; then ok "image self pushed $ref"; else bad "image self: $(tail -n 3 "$WORK/image.log")"; finish; fi

# ------------------------------------------------- the cluster-specific extras
extras=(--set "image.repository=$IMAGE_REGISTRY/skill-operator" --set "image.digest=$digest")
if [[ -n "${QS_SET:-}" ]]; then
  for kv in $QS_SET; do extras+=(--set "$kv"); done
elif [[ $LOCAL == 1 ]]; then
  # No cluster DNS: pinned ClusterIPs (free ones, apart from tests/kind/run.sh's
  # .50-.52); run images from the local registry (Debian paths); no default
  # StorageClass: a class of our own with one hostPath volume for the claim.
  extras+=(--set artifacts.service.clusterIP=10.0.0.70 --set egressProxy.service.clusterIP=10.0.0.71
    --set gateway.service.clusterIP=10.0.0.72 --set "gateway.replicas=1" --set gateway.resources.cpu=100m
    --set "samples.images.python=$IMAGE_REGISTRY/runtime:trixie" --set samples.interpreterPaths.python=/usr/bin/python3
    --set "samples.images.node=$IMAGE_REGISTRY/runtime:trixie" --set samples.interpreterPaths.node=/usr/bin/node
    --set "samples.images.bash=$IMAGE_REGISTRY/runtime:trixie" --set samples.resources.cpu=250m
    --set cluster.networkPolicy=not-enforced --set "artifacts.persistence.storageClassName=$SC")
  STORE_DIR="${QS_STORAGE_DIR:-}"
  if [[ -z "$STORE_DIR" ]]; then STORE_DIR="$(mktemp -d /tmp/quickstart-store.XXXXXX)"; STORE_DIR_MADE="$STORE_DIR"; fi
  # hostPath volumes get no fsGroup: the store's uid must own it.
  chown 65532:65532 "$STORE_DIR" && chmod 0700 "$STORE_DIR"
  "$KUBECTL" apply -f - >/dev/null <<YAML || { bad "the test StorageClass and PersistentVolume"; finish; }
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: { name: $SC }
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
fi
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
# prints them; tests/docs.rs holds the two together): only this cluster's
# extras are added to the install, and other names replace the defaults when
# QS_RELEASE, QS_NS, QS_DEMO_NS or QS_PORT ask for them.
mapfile -t LINES < <(bash scripts/quickstart-commands.sh)
if [[ ${#LINES[@]} != 3 ]]; then bad "the README quickstart has ${#LINES[@]} commands, not 3"; finish; fi
localize() {
  local l="$1"
  l="${l//skills-skill-operator-gateway/$RELEASE-skill-operator-gateway}"
  l="${l//helm install skills /helm install $RELEASE }"
  l="${l//-n skill-operator /-n $OPNS }"
  l="${l//-n skills-demo /-n $DEMO }"
  l="${l//8090:8090/$PORT:8090}"
  printf '%s' "$l"
}
mkdir -p "$WORK/bin"
ln -sf "$(command -v "$HELM")" "$WORK/bin/helm"
ln -sf "$(command -v "$KUBECTL")" "$WORK/bin/kubectl"
PATH="$WORK/bin:$PATH"
T0=$(now_ms)
check "${LINES[0]}" eval "$(localize "${LINES[0]}") --timeout 300s $(printf '%q ' "${extras[@]}")"
T1=$(now_ms)
if [[ $FAIL != 0 ]]; then
  "$KUBECTL" -n "$OPNS" get pods,pvc -o wide
  "$KUBECTL" -n "$OPNS" logs deploy/"$RELEASE"-skill-operator-artifacts --tail=20
  finish
fi
# The artifact endpoint is not ready until it has applied the sample
# SkillPackages, so --wait returns with them in place (untimed: a newcomer
# runs the next line at once).
samples_exist() {
  local s
  for s in csv-stats json-pretty word-count release-notes weather-brief; do
    "$KUBECTL" get skillpackage "$RELEASE-$s" >/dev/null 2>&1 || { echo "skillpackage/$RELEASE-$s is not there yet"; return 1; }
  done
}
check "helm install --wait returned with the sample SkillPackages in place" samples_exist
T1B=$(now_ms)
quickstart_yaml() {
  # The file as it is, with the names this run uses when they are not the defaults.
  sed -e "s/skills-demo/$DEMO/g" -e "s/package: skills-csv-stats/package: $RELEASE-csv-stats/" config/samples/k8s/quickstart.yaml
}
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
  ok "the README's agent (config/samples/agent/quickstart_agent.py): $(head -c 200 "$WORK/agent.out" | tr '\n' ' ')"
else
  bad "the README's agent: $(tail -n 5 "$WORK/agent.out" | tr '\n' ' ')"
  "$KUBECTL" get skillpackages -o wide; "$KUBECTL" -n "$DEMO" get skillbindings,skilljobs,pods -o wide
  "$KUBECTL" -n "$OPNS" logs deploy/"$RELEASE"-skill-operator-controller --tail=30
fi
T4=$(now_ms)
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
