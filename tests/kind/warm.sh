# Warm run pods (sourced by run.sh, after the egress checks: it uses
# check, K, bind, skilljob, finished, artifact and the host egress proxy).
#
# A binding with `spec.warm` keeps pods started ahead of its runs. Checked
# on the real node, as an attacker would try it:
#   - the pool fills to `min`; a run claims a waiting pod (no Job), sees
#     nothing of any run before it (files in /work and /tmp), and its pod
#     goes once the verdict is recorded; the pool fills again;
#   - runs created at once never share a pod (each warm pod names one run);
#   - a waiting pod has no proxy variables and no egress label, and the
#     egress proxy refuses it;
#   - a pod tampered with before its claim (a file planted in /work, a
#     process left running) is refused: the run fails saying so, its
#     script never runs;
#   - a namespace's budget caps its pools; a changed package profile drains
#     the pool's old pods; deleting the binding drains its pool;
#   - a run granted egress gets its grant at the claim, never before: the
#     waiting pod has no egress label and no proxy, the claimed one reaches
#     its allowed host through the proxy (and only it) from the sealed address.
#   - a run granted a variable: the waiting pod holds no Secret value; the
#     run starts cold while the controller may not read the Secret, and
#     claims the waiting pod once a Role lets it, its value sealed to the
#     pod's key in the claim.
#   - the namespace's SkillJob cap (a ResourceQuota) holds with a warm pool.

WARM_BINDING=e2e-warm
# warm_pods STATE: the names of the binding's warm pods in STATE (idle|claimed), Ready ones only for idle.
warm_pods() {
  local uid state="$1"
  uid="$(K get skillbinding "$WARM_BINDING" -o jsonpath='{.metadata.uid}' 2>/dev/null)" || return 1
  if [[ "$state" == idle ]]; then
    K get pods -l "skill-operator.dev/warm-binding=$uid,skill-operator.dev/warm-state=idle" \
      -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name} {.metadata.deletionTimestamp} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' \
      | awk '$2 == "True" {print $1}'
  else
    K get pods -l "skill-operator.dev/warm-binding=$uid,skill-operator.dev/warm-state=$state" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'
  fi
}
# warm_wait N: until at least N pods wait (up to 180 s: image pulls, fetch).
warm_wait() {
  local n="$1" i
  for i in $(seq 1 360); do
    [[ "$(warm_pods idle | grep -c .)" -ge "$n" ]] && return 0
    sleep 0.5
  done
  echo "fewer than $n warm pods waiting after 180 s: $(K get pods -l skill-operator.dev/warm-state -o wide 2>&1 | tail -n 5)"
  return 1
}
warm_spec() { K patch skillbinding "$WARM_BINDING" --type merge -p "{\"spec\":{\"warm\":$1}}" >/dev/null; }

warm_bind() {
  local pkg
  bind "$ROOT/tests/kind/skills/e2e-warm" bash "$BASH_PATH" scripts/look.sh || return 1
  # Small pods: a 2-core node holds three waiting (each also has its two 100m helpers).
  pkg="$(K get skillbinding "$WARM_BINDING" -o jsonpath='{.spec.package}')"
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p '{"spec":{"runtime":{"resources":{"cpu":"200m","memory":"128Mi","ephemeralStorage":"1Gi"}}}}' >/dev/null || return 1
  K wait --for=condition=Ready "skillbinding/$WARM_BINDING" --timeout=60s >/dev/null || return 1
  warm_spec '{"min":2,"max":3,"idleTimeoutSeconds":600}' && warm_wait 2
}
check "bind e2e-warm with a warm pool of 2: two pods wait" warm_bind

# warm_run NAME ARG: run on the pool, print the stdout; fail unless Succeeded on a warm pod.
warm_run() {
  local name="$1" uid phase pod
  uid="$(skilljob "$name" "$WARM_BINDING" scripts/look.sh "" "$2")" || return 1
  phase="$(finished "$name")"
  pod="$(K get skilljob "$name" -o jsonpath='{.status.warmPod}')"
  [[ "$phase" == Succeeded ]] || { echo "phase $phase: $(K get skilljob "$name" -o jsonpath='{.status.message}')"; return 1; }
  [[ -n "$pod" ]] || { echo "ran cold: $(K get skilljob "$name" -o jsonpath='{.status.message}')"; return 1; }
  [[ -z "$(K get jobs -l "skill-operator.dev/skilljob-uid=$uid" -o name)" ]] || { echo "a Job was made for a warm run"; return 1; }
  artifact "$uid/outputs/result/stdout"
}
warm_first() {
  local out
  out="$(warm_run warm-1 one)" || { echo "$out"; return 1; }
  [[ "$out" == *"run: one"* && "$out" == *"work: []"* && "$out" == *"tmp: []"* && "$out" == *"proxy: []"* ]] \
    || { echo "unexpected stdout: $out"; return 1; }
}
check "a run claims a waiting pod (no Job) and sees an empty /work and /tmp, no proxy" warm_first

warm_isolated() {
  local out i
  for i in two three; do
    warm_wait 1 || return 1
    out="$(warm_run "warm-$i" "$i")" || { echo "$out"; return 1; }
    [[ "$out" == *"run: $i"* && "$out" != *mark-* ]] || { echo "run $i saw another run's files: $out"; return 1; }
  done
}
check "later runs on the pool see nothing of earlier ones (files in /work, /tmp)" warm_isolated

warm_claimed_pods_go() {
  local i
  for i in $(seq 1 60); do
    [[ -z "$(warm_pods claimed)" ]] && { warm_wait 2; return; }
    sleep 0.5
  done
  echo "claimed pods still there 30 s after their verdicts: $(warm_pods claimed)"
  return 1
}
check "a claimed pod goes once its verdict is recorded, and the pool fills again" warm_claimed_pods_go

warm_at_once() {
  local i pods phase
  warm_wait 2 || return 1
  for i in 1 2 3 4; do skilljob "warm-par-$i" "$WARM_BINDING" scripts/look.sh "" "p$i" >/dev/null || return 1; done
  for i in 1 2 3 4; do
    phase="$(finished "warm-par-$i")"
    [[ "$phase" == Succeeded ]] || { echo "warm-par-$i: $phase"; return 1; }
  done
  pods="$(for i in 1 2 3 4; do K get skilljob "warm-par-$i" -o jsonpath='{.status.warmPod}'; echo; done | grep .)"
  [[ -n "$pods" ]] || { echo "none of the four runs was warm"; return 1; }
  [[ "$(sort <<<"$pods" | uniq -d)" == "" ]] || { echo "one warm pod served two runs: $pods"; return 1; }
  echo "$(grep -c . <<<"$pods") of 4 warm, each on its own pod"
}
check "four runs at once: every warm pod serves one run, the others start cold, all Succeeded" warm_at_once

warm_unclaimed_has_nothing() {
  local pod env code
  warm_wait 1 || return 1
  pod="$(warm_pods idle | head -n 1)"
  [[ -z "$(K get pod "$pod" -o jsonpath='{.metadata.labels.skill-operator\.dev/egress}')" ]] || { echo "a waiting pod has the egress label"; return 1; }
  env="$(K exec "$pod" -c run -- /usr/bin/env)" || { echo "exec failed"; return 1; }
  grep -qi proxy <<<"$env" && { echo "a waiting pod has proxy variables: $(grep -i proxy <<<"$env")"; return 1; }
  # Through the egress proxy without a run's credential (it has none) and from an address no sealed run has.
  code="$(K exec "$pod" -c run -- python3 -c "
import urllib.request, urllib.error
h = urllib.request.ProxyHandler({'http': 'http://$POD_GW:$EGRESS_PROXY_PORT'})
try:
    urllib.request.build_opener(h).open('http://$POD_GW:$EGRESS_PORT/', timeout=5); print('reached')
except urllib.error.HTTPError as e: print(e.code)
except Exception as e: print('error', e)
")"
  [[ "$code" == 407 || "$code" == 403 ]] || { echo "the proxy answered a waiting pod with: $code"; return 1; }
  echo "proxy said $code"
}
check "a waiting pod has no proxy variables, no egress label, and the egress proxy refuses it" warm_unclaimed_has_nothing

# warm_tampered HOW CMD: leave CMD's traces in the one waiting pod, then run: refused.
warm_tampered() {
  local how="$1" cmd="$2" pod uid phase msg out
  warm_spec '{"min":1,"max":1,"idleTimeoutSeconds":600}' || return 1
  for _ in $(seq 1 120); do [[ "$(warm_pods idle | grep -c .)" == 1 && -z "$(K get pods -l skill-operator.dev/warm-state=idle -o jsonpath='{.items[?(@.metadata.deletionTimestamp)].metadata.name}')" ]] && break; sleep 0.5; done
  warm_wait 1 || return 1
  pod="$(warm_pods idle | head -n 1)"
  K exec "$pod" -c run -- /bin/bash -c "$cmd" || { echo "could not tamper with $pod"; return 1; }
  uid="$(skilljob "warm-tamper-$how" "$WARM_BINDING" scripts/look.sh "" tampered)" || return 1
  phase="$(finished "warm-tamper-$how")"
  msg="$(K get skilljob "warm-tamper-$how" -o jsonpath='{.status.message}')"
  [[ "$(K get skilljob "warm-tamper-$how" -o jsonpath='{.status.warmPod}')" == "$pod" ]] || { echo "the run did not claim the tampered pod $pod ($msg)"; return 1; }
  [[ "$phase" == Failed && "$msg" == *tampered* ]] || { echo "phase $phase: $msg"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout" || true)"
  [[ "$out" != *"run: tampered"* ]] || { echo "the script ran in a tampered pod: $out"; return 1; }
  echo "$msg"
}
check "a pod with a file planted in /work before its claim is refused (the script never runs)" warm_tampered file 'echo planted > /work/planted'
check "a pod with a process left running before its claim is refused" warm_tampered process 'nohup sleep 600 >/dev/null 2>&1 &'
# A fake result has nowhere to go: the run container mounts no result volume
# (the verdict goes over the launcher's channel), and its root is read-only.
warm_no_result_dir() {
  local pod uid phase out
  warm_spec '{"min":1,"max":1,"idleTimeoutSeconds":600}' || return 1
  warm_wait 1 || return 1
  pod="$(warm_pods idle | head -n 1)"
  if K exec "$pod" -c run -- /bin/bash -c 'mkdir -p /result && echo "{\"exitCode\":0}" > /result/result.json' 2>/dev/null; then
    echo "a fake result could be written into $pod"; return 1
  fi
  uid="$(skilljob warm-fake-result "$WARM_BINDING" scripts/look.sh "" faked)" || return 1
  phase="$(finished warm-fake-result)"
  [[ "$(K get skilljob warm-fake-result -o jsonpath='{.status.warmPod}')" == "$pod" ]] || { echo "the run did not claim $pod"; return 1; }
  [[ "$phase" == Succeeded ]] || { echo "phase $phase: $(K get skilljob warm-fake-result -o jsonpath='{.status.message}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || return 1
  [[ "$out" == *"run: faked"* ]] || { echo "not the script's own stdout: ${out:0:200}"; return 1; }
}
check "a waiting pod has nowhere to put a fake result: no result volume in its run container; the run's verdict is its script's" warm_no_result_dir

warm_budget() {
  local n max=0
  K annotate namespace "$NS" skill-operator.dev/warm-pods=1 --overwrite >/dev/null || return 1
  warm_spec '{"min":3,"max":3,"idleTimeoutSeconds":600}' || return 1
  # 20 s of the pool's life (ten of its passes): never more than the budget's one pod.
  for _ in $(seq 1 40); do
    n="$(K get pods -l skill-operator.dev/warm-state=idle -o name | grep -c .)"
    (( n > max )) && max=$n
    sleep 0.5
  done
  K annotate namespace "$NS" skill-operator.dev/warm-pods- >/dev/null
  [[ $max -le 1 ]] || { echo "$max warm pods with a budget of 1"; return 1; }
  warm_wait 1
}
check "a namespace's warm-pod budget (its annotation) caps its pools" warm_budget

warm_drained_on_change() {
  local pkg old new
  warm_spec '{"min":1,"max":1,"idleTimeoutSeconds":600}' && warm_wait 1 || return 1
  old="$(warm_pods idle | head -n 1)"
  pkg="$(K get skillbinding "$WARM_BINDING" -o jsonpath='{.spec.package}')"
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p '{"spec":{"runtime":{"resources":{"cpu":"300m","memory":"128Mi","ephemeralStorage":"1Gi"}}}}' >/dev/null || return 1
  for _ in $(seq 1 120); do
    new="$(warm_pods idle | head -n 1)"
    [[ -n "$new" && "$new" != "$old" && -z "$(K get pod "$old" -o name 2>/dev/null)" ]] && { echo "$old drained, $new waits"; return 0; }
    sleep 1
  done
  echo "the pool kept $old after its package's profile changed"
  return 1
}
check "a pool whose package profile changes is drained and refilled" warm_drained_on_change

warm_binding_deleted() {
  local uid
  uid="$(K get skillbinding "$WARM_BINDING" -o jsonpath='{.metadata.uid}')"
  K delete skillbinding "$WARM_BINDING" --wait=false >/dev/null || return 1
  for _ in $(seq 1 60); do
    [[ -z "$(K get pods -l "skill-operator.dev/warm-binding=$uid" -o name)" ]] && return 0
    sleep 1
  done
  echo "warm pods of the deleted binding remain: $(K get pods -l "skill-operator.dev/warm-binding=$uid" -o name)"
  return 1
}
check "deleting the binding drains its pool" warm_binding_deleted

# A run granted egress on a warm pod: the pod waited with no network (no
# egress label, no proxy variables); the claim labels it for the egress
# policy, seals its address into the run's status before the run is
# handed over, and gives the script its proxy URL. The run then reaches
# its allowed host through the proxy and is refused another, as a cold run.
warm_egress() {
  local WARM_BINDING=e2e-egress pkg pod ip uid phase out refused="http://${NODE_IP:-192.0.2.2}:$EGRESS_PORT/"
  pkg="$(K get skillbinding "$WARM_BINDING" -o jsonpath='{.spec.package}')" || return 1
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p '{"spec":{"runtime":{"resources":{"cpu":"200m","memory":"128Mi","ephemeralStorage":"1Gi"}}}}' >/dev/null || return 1
  warm_spec '{"min":1,"max":1,"idleTimeoutSeconds":600}' && warm_wait 1 || return 1
  pod="$(warm_pods idle | head -n 1)"
  ip="$(K get pod "$pod" -o jsonpath='{.status.podIP}')"
  [[ -z "$(K get pod "$pod" -o jsonpath='{.metadata.labels.skill-operator\.dev/egress}')" ]] || { echo "a waiting pod of an egress binding has the egress label"; return 1; }
  K exec "$pod" -c run -- /usr/bin/env | grep -qi proxy && { echo "a waiting pod of an egress binding has proxy variables"; return 1; }
  uid="$(skilljob warm-egress "$WARM_BINDING" scripts/fetch.py "" "http://$ALLOWED/" "$refused")" || return 1
  phase="$(finished warm-egress)"
  [[ "$phase" == Succeeded ]] || { echo "phase $phase: $(K get skilljob warm-egress -o jsonpath='{.status.message}')"; return 1; }
  [[ "$(K get skilljob warm-egress -o jsonpath='{.status.warmPod}')" == "$pod" ]] || { echo "the run did not claim $pod: $(K get skilljob warm-egress -o jsonpath='{.status.message}')"; return 1; }
  [[ "$(K get skilljob warm-egress -o jsonpath='{.status.egress.podIp}')" == "$ip" ]] || { echo "the sealed address is not the warm pod's $ip: $(K get skilljob warm-egress -o jsonpath='{.status.egress}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || { echo "stdout not stored"; return 1; }
  [[ "$out" == *"proxy: set"* ]] || { echo "no proxy in the claimed run's env: $out"; return 1; }
  [[ "$out" == *"OK http://$ALLOWED/ 200 egress-ok"* ]] || { echo "the allowed host was not reached: $out"; return 1; }
  [[ "$out" == *"REFUSED $refused 403 egress refused ("* ]] || { echo "the other host was not refused by the proxy: $out"; return 1; }
  # The egress label came with the claim (the watch of every pod saw it).
  "$PY" - "$WORK/pods.jsonl" "$pod" "$ROOT/tests/kind" <<'PYEOF' || return 1
import sys
path, name = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
from check_pods import objects
labelled = []
for pod in objects(path):
    if pod["metadata"]["name"] == name:
        labels = pod["metadata"].get("labels") or {}
        labelled.append((labels.get("skill-operator.dev/warm-state"), labels.get("skill-operator.dev/egress")))
assert labelled, f"no event of {name}"
assert all(e is None for s, e in labelled if s == "idle"), f"{name} had the egress label while idle: {labelled}"
assert any(e == "true" for s, e in labelled if s == "claimed"), f"{name} was never labelled for egress once claimed: {labelled}"
PYEOF
  grep -E "^(OK|REFUSED)" <<<"$out" | sed 's/^/     run stdout: /'
  K patch skillbinding "$WARM_BINDING" --type merge -p '{"spec":{"warm":null}}' >/dev/null
}
check "a run granted egress claims a warm pod: labelled, sealed and given its proxy at the claim; allowed host reached, another refused" warm_egress

# A run granted a variable on a warm pod. The waiting pod holds no Secret
# value (none in its spec, none in its environment). Where the controller
# may not read the Secret (the chart grants no get on Secrets) the run
# starts cold and gets its value from the kubelet, as before; once a Role
# lets the controller get that one Secret, the next run claims the waiting
# pod and its value comes sealed to the pod's key in the claim.
warm_env() {
  local WARM_BINDING=e2e-secret pkg pod uid phase out value sa="system:serviceaccount:$OPNS:$RELEASE-skill-operator-controller"
  value="e2e-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  K create secret generic e2e-secret --from-literal=token="$value" >/dev/null || return 1
  bind "$ROOT/tests/kind/skills/e2e-secret" bash "$BASH_PATH" scripts/show.sh || return 1
  pkg="$(K get skillbinding "$WARM_BINDING" -o jsonpath='{.spec.package}')"
  "$KUBECTL" patch skillpackage "$pkg" --type merge -p '{"spec":{"runtime":{"resources":{"cpu":"200m","memory":"128Mi","ephemeralStorage":"1Gi"}}}}' >/dev/null || return 1
  K patch skillbinding "$WARM_BINDING" --type merge -p '{"spec":{"env":[{"name":"E2E_TOKEN","secretKeyRef":{"name":"e2e-secret","key":"token"}}]}}' >/dev/null || return 1
  K wait --for=condition=Ready "skillbinding/$WARM_BINDING" --timeout=60s >/dev/null || return 1
  warm_spec '{"min":1,"max":1,"idleTimeoutSeconds":600}' && warm_wait 1 || return 1
  pod="$(warm_pods idle | head -n 1)"
  K get pod "$pod" -o json | grep -q -e secretKeyRef -e "$value" && { echo "the waiting pod's spec names the Secret or holds its value"; return 1; }
  K exec "$pod" -c run -- /usr/bin/env | grep -q -e E2E_TOKEN -e "$value" && { echo "the waiting pod's environment holds the variable"; return 1; }
  [[ "$("$KUBECTL" auth can-i get secret/e2e-secret -n "$NS" --as="$sa")" == no ]] || { echo "the controller may read Secrets without a grant"; return 1; }

  uid="$(skilljob warm-env-cold "$WARM_BINDING" scripts/show.sh "" x)" || return 1
  phase="$(finished warm-env-cold)"
  [[ "$phase" == Succeeded ]] || { echo "cold: phase $phase: $(K get skilljob warm-env-cold -o jsonpath='{.status.message}')"; return 1; }
  [[ -z "$(K get skilljob warm-env-cold -o jsonpath='{.status.warmPod}')" && -n "$(K get skilljob warm-env-cold -o jsonpath='{.status.jobName}')" ]] \
    || { echo "without a grant to read the Secret the run did not start cold: $(K get skilljob warm-env-cold -o jsonpath='{.status}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || { echo "cold: stdout not stored"; return 1; }
  [[ "$out" == *"token: $value"* ]] || { echo "cold: the run lacks its variable: $out"; return 1; }

  K create role e2e-warm-secret --verb=get --resource=secrets --resource-name=e2e-secret >/dev/null || return 1
  K create rolebinding e2e-warm-secret --role=e2e-warm-secret --serviceaccount="$OPNS:$RELEASE-skill-operator-controller" >/dev/null || return 1
  for _ in $(seq 1 50); do [[ "$("$KUBECTL" auth can-i get secret/e2e-secret -n "$NS" --as="$sa")" == yes ]] && break; sleep 0.2; done
  warm_wait 1 || return 1
  pod="$(warm_pods idle | head -n 1)"
  uid="$(skilljob warm-env "$WARM_BINDING" scripts/show.sh "" x)" || return 1
  phase="$(finished warm-env)"
  [[ "$phase" == Succeeded ]] || { echo "warm: phase $phase: $(K get skilljob warm-env -o jsonpath='{.status.message}')"; return 1; }
  [[ "$(K get skilljob warm-env -o jsonpath='{.status.warmPod}')" == "$pod" ]] || { echo "the run did not claim $pod: $(K get skilljob warm-env -o jsonpath='{.status}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || { echo "warm: stdout not stored"; return 1; }
  [[ "$out" == *"token: $value"* && "$out" == *"work: []"* ]] || { echo "warm: the run lacks its variable: $out"; return 1; }
  # The controller could read that Secret only: another one stays closed to it.
  [[ "$("$KUBECTL" auth can-i get secret/other -n "$NS" --as="$sa")" == no ]] || { echo "the Role opened more than the one Secret"; return 1; }
  echo "     cold without the grant, warm on $pod with it; the value reached both runs"
  K delete rolebinding,role e2e-warm-secret >/dev/null
  K patch skillbinding "$WARM_BINDING" --type merge -p '{"spec":{"warm":null}}' >/dev/null
}
check "a run granted a variable: cold while the controller may not read its Secret, warm once a Role lets it; the value sealed to the pod, never in a waiting one" warm_env

# The namespace's SkillJob cap (a ResourceQuota on count/skilljobs, as
# config/samples/k8s/resourcequota.yaml sets at 100) holds with a warm pool:
# a claim makes no SkillJob, and a SkillJob past the cap is never made, so
# no warm pod runs for it. Checked at an edge of its own: the quota set to
# what the namespace holds plus one.
warm_cap() {
  local WARM_BINDING=e2e-secret
  # Its runs are granted a variable: the controller may read it again, so they can be warm.
  K create role e2e-warm-secret --verb=get --resource=secrets --resource-name=e2e-secret >/dev/null || return 1
  K create rolebinding e2e-warm-secret --role=e2e-warm-secret --serviceaccount="$OPNS:$RELEASE-skill-operator-controller" >/dev/null || return 1
  warm_cap_run || { warm_cap_done; return 1; }
  warm_cap_done
}
warm_cap_done() {
  K delete resourcequota e2e-cap --ignore-not-found >/dev/null
  K delete rolebinding,role e2e-warm-secret --ignore-not-found >/dev/null
  K patch skillbinding e2e-secret --type merge -p '{"spec":{"warm":null}}' >/dev/null
}
warm_cap_run() {
  local WARM_BINDING=e2e-secret held out phase
  warm_spec '{"min":1,"max":1,"idleTimeoutSeconds":600}' && warm_wait 1 || return 1
  held="$(K get skilljobs -o name | grep -c .)"
  K apply -f - >/dev/null <<YAML || return 1
apiVersion: v1
kind: ResourceQuota
metadata: { name: e2e-cap }
spec: { hard: { count/skilljobs.skill-operator.dev: "$((held + 1))" } }
YAML
  for _ in $(seq 1 100); do [[ -n "$(K get resourcequota e2e-cap -o jsonpath='{.status.used}')" ]] && break; sleep 0.2; done
  skilljob warm-cap-1 "$WARM_BINDING" scripts/show.sh "" x >/dev/null || return 1
  out="$(skilljob warm-cap-2 "$WARM_BINDING" scripts/show.sh "" x 2>&1)"
  [[ "$out" == *"exceeded quota"* ]] || { echo "the SkillJob past the cap was not refused: $out"; return 1; }
  K get skilljob warm-cap-2 >/dev/null 2>&1 && { echo "warm-cap-2 exists past the cap"; return 1; }
  phase="$(finished warm-cap-1)"
  [[ "$phase" == Succeeded && -n "$(K get skilljob warm-cap-1 -o jsonpath='{.status.warmPod}')" ]] \
    || { echo "the run under the cap: phase $phase, warm pod $(K get skilljob warm-cap-1 -o jsonpath='{.status.warmPod}')"; return 1; }
}
check "the SkillJob cap (a ResourceQuota at what the namespace holds plus one) holds with a warm pool: the run under it is warm, the one past it is never made" warm_cap
