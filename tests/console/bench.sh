#!/usr/bin/env bash
# The console's benchmark (called by run.sh with CONSOLE_BENCH=1, its release
# installed): a namespace with 100 bound skills and 100 SkillJobs of the
# benchmark's ServiceAccount, then tests/console/bench.mjs measures the first
# paint of that namespace's page and the gateway's memory with 50 pages open.
# Its figures are printed, never asserted (they are reported against the goals).
# The SkillJobs name a binding that does not exist, so the controller settles
# them as Failed without starting a pod: the page lists 100 finished jobs.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
: "${KUBECTL:?}" "${BIN:?}" "${ARTIFACT_REGISTRY:?}" "${WORK:?}" "${CONSOLE_NS_BENCH:?}" "${CONSOLE_RELEASE:?}" "${CONSOLE_OPNS:?}"
N="${CONSOLE_BENCH_SKILLS:-100}" JOBS="${CONSOLE_BENCH_JOBS:-100}"
NS="$CONSOLE_NS_BENCH"
K() { "$KUBECTL" -n "$NS" "$@"; }

"$KUBECTL" delete namespace "$NS" --ignore-not-found --wait=true --timeout=180s >/dev/null
"$KUBECTL" create namespace "$NS" >/dev/null || exit 1
sed "s/namespace: skills-demo/namespace: $NS/" "$ROOT/config/samples/k8s/agent-rbac.yaml" | "$KUBECTL" apply -f - >/dev/null || exit 1

mkdir -p "$WORK/bench"
: >"$WORK/bench/bindings.yaml"
PKGS=()
for i in $(seq -w 1 "$N"); do
  dir="$WORK/bench/skills/bench-$i"
  mkdir -p "$dir"
  printf -- '---\nname: bench-%s\ndescription: Benchmark skill %s of %s, listed by the console.\n---\n# bench-%s\n\nNothing to run.\n' "$i" "$i" "$N" "$i" >"$dir/SKILL.md"
  "$BIN" package push "$dir" --registry "$ARTIFACT_REGISTRY/skills" --tag "$CONSOLE_RELEASE" --plain-http 2>>"$WORK/bench/push.log" | grep -v '^#' \
    | sed "0,/^  name: /s/^\(  name: .*\)$/\1-$CONSOLE_RELEASE/" >"$WORK/bench/pkg-$i.yaml" || exit 1
  pkg="$(awk '/^  name:/ {print $2; exit}' "$WORK/bench/pkg-$i.yaml")"
  PKGS+=("skillpackage/$pkg")
  printf -- '---\napiVersion: skill-operator.dev/v1alpha1\nkind: SkillBinding\nmetadata: { name: bench-%s }\nspec: { package: %s }\n' "$i" "$pkg" >>"$WORK/bench/bindings.yaml"
done
for f in "$WORK"/bench/pkg-*.yaml; do echo ---; cat "$f"; done | "$KUBECTL" apply -f - >/dev/null || exit 1
"$KUBECTL" wait --for=condition=Ready "${PKGS[@]}" --timeout=180s >/dev/null || { echo "console bench: the packages did not become Ready" >&2; exit 1; }
K apply -f "$WORK/bench/bindings.yaml" >/dev/null || exit 1
K wait --for=condition=Ready skillbinding --all --timeout=180s >/dev/null || { echo "console bench: the bindings did not become Ready" >&2; exit 1; }

# SkillJobs as the gateway writes them for the benchmark's ServiceAccount:
# the owner annotation and the owner label (a hash of the principal, see
# src/gateway/executor/names.rs: SHA-256 over length-prefixed parts).
PRINCIPAL="system:serviceaccount:$NS:skills-agent"
python3 - "$NS" "$PRINCIPAL" "$JOBS" >"$WORK/bench/jobs.json" <<'PY'
import hashlib, json, struct, sys, uuid
ns, principal, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = hashlib.sha256()
for part in (b"skill-operator owner", principal.encode()):
    h.update(struct.pack(">Q", len(part))); h.update(part)
label = h.hexdigest()[:40]
items = [{
    "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
    "metadata": {"name": f"skj-{uuid.uuid4().hex}", "namespace": ns,
                 "labels": {"skill-operator.dev/requested-by-hash": label, "app.kubernetes.io/created-by": "skill-operator-gateway"},
                 "annotations": {"skill-operator.dev/requested-by": principal, "skill-operator.dev/skill": f"bench-{i % 100 + 1:03d}"}},
    "spec": {"binding": "bench-missing", "script": "scripts/none.sh", "args": [str(i)]},
} for i in range(count)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
K apply -f "$WORK/bench/jobs.json" >/dev/null || exit 1
K wait --for=jsonpath='{.status.conditions[?(@.type=="Complete")].status}'=True skilljob --all --timeout=180s >/dev/null ||
  echo "console bench: not every SkillJob settled; the page lists them as running" >&2

GW_PID=""
for pid in $(pgrep -f "skill-operator gateway"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "POD_NAMESPACE=$CONSOLE_OPNS"; then GW_PID="$pid"; fi
done
[[ -n "$GW_PID" ]] || echo "console bench: the gateway's process is not on this machine; memory is not measured" >&2
export CONSOLE_BENCH_TOKEN="$("$KUBECTL" -n "$NS" create token skills-agent --duration=1h)" CONSOLE_GATEWAY_PID="$GW_PID"
node "$HERE/bench.mjs"
