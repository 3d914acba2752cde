# The attacks on a real installation (sourced by tests/kind/run.sh after the
# gateway checks, with its helpers and variables): each break an independent
# attack found, tried again as the attacker would, each a check that fails
# without its rule.
#   - a script that forges its own verdict (cold and warm);
#   - attribution: a SkillJob naming another principal, written by an agent
#     (refused at admission) and by the gateway's own account without a seal
#     (listed as nobody's); a confirmed token replayed after skill_job_delete;
#     another principal's MCP session;
#   - a SkillBinding granting a Secret its author may not read;
#   - the console and the file route inside the caller's rate limit (in
#     gateway_limits, tests/kind/gateway_client.py);
#   - refusals before a tool and a fence refusal in the audit trail;
#   - /metrics of every component behind a token the API server vouches for;
#   - the NetworkPolicy probe's finding on a cluster that does not enforce.

# ------------------------------------------------------------ forged verdict
check "bind e2e-forge (bash, hostile)" bind "$ROOT/tests/kind/skills/e2e-forge" bash "$BASH_PATH" scripts/forge.sh
# forged NAME: the hostile script ran out its 5 s timeout; its verdict is the
# launcher's (TimedOut), its stdout what it printed, not the forgery.
forged_verdict() {
  local name="$1" uid phase out
  uid="$(skilljob "$name" e2e-forge scripts/forge.sh 5 60)" || return 1
  phase="$(finished "$name")"
  [[ "$phase" == TimedOut ]] || { echo "phase $phase (want TimedOut): $(K get skilljob "$name" -o jsonpath='{.status.exitCode} {.status.message}')"; return 1; }
  out="$(artifact "$uid/outputs/result/stdout")" || { echo "stdout not stored"; return 1; }
  [[ "$out" != FORGED* ]] || { echo "the forged stdout was taken: ${out:0:200}"; return 1; }
  local line
  for line in "result-dir failed" "channel failed" "environ failed" "fds failed" "sleeping 60"; do
    grep -qx "$line" <<<"$out" || { echo "stdout lacks '$line': ${out:0:400}"; return 1; }
  done
  # The launcher's own word on the script's SIGTERM: ignored, and counted.
  [[ "$(K get skilljob "$name" -o jsonpath='{.status.message}')" != *cancel* ]] || { echo "the script's SIGTERM became a cancel"; return 1; }
}
check "a script that forges its verdict (files, the channel, SIGTERM to PID 1, /proc/1) gets the launcher's: TimedOut, its real stdout" forged_verdict forge-cold
forged_verdict_warm() {
  K patch skillbinding e2e-forge --type merge -p '{"spec":{"warm":{"min":1,"max":1}}}' >/dev/null || return 1
  for _ in $(seq 240); do
    [[ -n "$(K get pods -l skill-operator.dev/warm-state=idle -o jsonpath='{.items[?(@.status.phase=="Running")].metadata.name}' 2>/dev/null)" ]] && break
    sleep 0.5
  done
  forged_verdict forge-warm || return 1
  [[ -n "$(K get skilljob forge-warm -o jsonpath='{.status.warmPod}')" ]] || { echo "the run did not claim a warm pod"; return 1; }
  K patch skillbinding e2e-forge --type merge -p '{"spec":{"warm":null}}' >/dev/null
}
check "the same on a warm pod: TimedOut, its real stdout" forged_verdict_warm

# Every controller replica's log, as text (read whole: `set -o pipefail` would
# count a grep -q that stops early as kubectl's failure).
controller_logs() { "$KUBECTL" -n "$OPNS" logs -l app.kubernetes.io/component=controller --tail=-1 --prefix=false 2>/dev/null; }

# ------------------------------------------------------------ attribution
AGENT="system:serviceaccount:$NS:skills-agent"
GATEWAY_SA="system:serviceaccount:$OPNS:$RELEASE-skill-operator-gateway"
planted_skilljob() {
  cat <<YAML
apiVersion: skill-operator.dev/v1alpha1
kind: SkillJob
metadata:
  name: $1
  annotations: { skill-operator.dev/requested-by: "$AGENT" }
  labels: { app.kubernetes.io/created-by: skill-operator-gateway }
spec: { binding: word-count, script: scripts/wc.sh, args: [/package/SKILL.md] }
YAML
}
owner_forged_by_an_agent() {
  local out
  "$KUBECTL" -n "$NS" create serviceaccount mallory >/dev/null 2>&1
  "$KUBECTL" -n "$NS" create rolebinding mallory --role=skills-agent --serviceaccount="$NS:mallory" >/dev/null 2>&1
  out="$(planted_skilljob skj-00000000000000000000000000000001 | K apply --as="system:serviceaccount:$NS:mallory" -f - 2>&1)"
  [[ "$out" == *"may name only the SkillJob's writer"* ]] || { echo "created, or refused for another reason: $out"; return 1; }
  # Naming itself is allowed (a kubectl user may say who they are).
  planted_skilljob skj-00000000000000000000000000000002 | sed "s|$AGENT|system:serviceaccount:$NS:mallory|" \
    | K apply --as="system:serviceaccount:$NS:mallory" -f - >/dev/null || { echo "naming itself was refused"; return 1; }
  K delete skilljob skj-00000000000000000000000000000002 --wait=false >/dev/null
}
check "an agent's SkillJob naming another principal as its requester is refused at admission" owner_forged_by_an_agent
owner_without_a_seal() {
  # Past admission (written as the gateway's own account), it is still no one's: no seal.
  planted_skilljob skj-00000000000000000000000000000003 | K apply --as="$GATEWAY_SA" -f - >/dev/null || { echo "not created"; return 1; }
  gw forged skj-00000000000000000000000000000003 || return 1
  [[ "$(finished skj-00000000000000000000000000000003)" == Succeeded ]] || return 1
  # Its verdict in the controller's trail names nobody.
  local line
  line="$(controller_logs | grep '"run.verdict"' | grep '"job":"skj-00000000000000000000000000000003"' | tail -n 1)"
  [[ -n "$line" ]] || { echo "no run.verdict record for it"; return 1; }
  [[ "$line" != *'"principal"'* ]] || { echo "the verdict names a principal: $line"; return 1; }
  K delete skilljob skj-00000000000000000000000000000003 --wait=false >/dev/null
}
check "a SkillJob claiming a principal without the gateway's seal is nobody's: not listed, its verdict names no one" owner_without_a_seal
check "a confirmed skill_run token replayed after skill_job_delete runs nothing again (token-reused)" gw replay
sessions_setup() {
  "$KUBECTL" -n "$NS" create serviceaccount skills-agent-2 >/dev/null 2>&1
  "$KUBECTL" -n "$NS" create rolebinding skills-agent-2 --role=skills-agent --serviceaccount="$NS:skills-agent-2" >/dev/null 2>&1
  SECOND="$("$KUBECTL" -n "$NS" create token skills-agent-2 --duration=1h)" gw sessions
}
check "another principal's DELETE, GET and POST on a session id are answered as an unknown session; it goes on for its owner" sessions_setup

# ------------------------------------------------------------ Secrets
binding_secret() {
  local out
  K create secret generic other-app-db --from-literal=password=hunter2 >/dev/null 2>&1
  "$KUBECTL" -n "$NS" create role binder --verb=create,get,update,patch --resource=skillbindings.skill-operator.dev >/dev/null 2>&1
  "$KUBECTL" -n "$NS" create rolebinding binder --role=binder --serviceaccount="$NS:mallory" >/dev/null 2>&1
  local pkg
  pkg="$(K get skillbinding word-count -o jsonpath='{.spec.package}')"
  out="$(K apply --as="system:serviceaccount:$NS:mallory" -f - 2>&1 <<YAML
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: steal }
spec: { package: $pkg, env: [{ name: DB_PASSWORD, secretKeyRef: { name: other-app-db, key: password } }] }
YAML
)"
  [[ "$out" == *"may not get every Secret this binding grants (other-app-db)"* ]] || { echo "not refused naming the Secret: $out"; return 1; }
  # With get on that Secret the same binding is written.
  "$KUBECTL" -n "$NS" create role reader --verb=get --resource=secrets --resource-name=other-app-db >/dev/null 2>&1
  "$KUBECTL" -n "$NS" create rolebinding reader --role=reader --serviceaccount="$NS:mallory" >/dev/null 2>&1
  K apply --as="system:serviceaccount:$NS:mallory" -f - >/dev/null <<YAML || { echo "refused with get on the Secret"; return 1; }
apiVersion: skill-operator.dev/v1alpha1
kind: SkillBinding
metadata: { name: steal }
spec: { package: $pkg, env: [{ name: DB_PASSWORD, secretKeyRef: { name: other-app-db, key: password } }] }
YAML
  "$KUBECTL" -n "$NS" delete rolebinding reader >/dev/null
  # Without get on it again: a write leaving the spec alone passes (the
  # controller's finalizer is such a write); any change of the spec is refused.
  K label skillbinding steal --as="system:serviceaccount:$NS:mallory" e2e=relabelled >/dev/null || { echo "a label-only write was refused"; return 1; }
  out="$(K patch skillbinding steal --as="system:serviceaccount:$NS:mallory" --type merge -p '{"spec":{"egress":true}}' 2>&1)"
  [[ "$out" == *"may not get every Secret"* ]] || { echo "a spec change without get on the Secret: $out"; return 1; }
  K delete skillbinding steal --wait=false >/dev/null
}
check "a SkillBinding granting a Secret its author may not get is refused, naming it; with get it is written; a later spec change needs get again, a label does not" binding_secret

# ------------------------------------------------------------ the trail
refusals_recorded() {
  local mcp=(-H "Authorization: Bearer $ALLOWED" -H 'Accept: application/json, text/event-stream')
  curl -s -o /dev/null "$GW/mcp/Not_A_Namespace" "${mcp[@]}" -H 'Content-Type: application/json' -d '{}'
  curl -s -o /dev/null "$GW/mcp/$NS" "${mcp[@]}" -H 'Content-Type: application/json' -d '{"jsonrpc":'
  curl -s -o /dev/null "$GW/mcp/$NS" "${mcp[@]}" -H 'Content-Type: text/plain' -d 'x'
  head -c 5000000 /dev/zero | tr '\0' ' ' >"$WORK/big.json"
  curl -s -o /dev/null "$GW/mcp/$NS" "${mcp[@]}" -H 'Content-Type: application/json' --data-binary "@$WORK/big.json"
  local trail
  for _ in $(seq 20); do
    trail="$("$KUBECTL" -n "$OPNS" logs -l app.kubernetes.io/component=gateway --tail=-1 --prefix=false 2>/dev/null)"
    trail="$(grep '"request.refused"' <<<"$trail")"
    [[ "$(grep -c . <<<"$trail")" -ge 4 ]] && break
    sleep 0.5
  done
  local want
  for want in '"request":"POST /mcp/Not_A_Namespace"' 'fail to deserialize' 'http:415' 'body-too-large'; do
    [[ "$trail" == *"$want"* ]] || { echo "no request.refused record with $want in: $(tail -n 4 <<<"$trail")"; return 1; }
  done
  local named
  named="$(grep '"request":"POST /mcp/'"$NS"'"' <<<"$trail")"
  [[ "$named" == *"$AGENT"* ]] || { echo "the refusals after authentication do not name the caller"; return 1; }
}
check "refusals before any tool (bad path, malformed, wrong media type, body too large) are each one request.refused record" refusals_recorded
fence_refusal_recorded() {
  skilljob undeclared word-count scripts/not-declared.sh "" >/dev/null || return 1
  [[ "$(finished undeclared)" == Failed ]] || return 1
  local line
  for _ in $(seq 20); do
    line="$(controller_logs | grep '"run.verdict"' | grep '"job":"undeclared"' | tail -n 1)"
    [[ -n "$line" ]] && break
    sleep 0.5
  done
  [[ "$line" == *'"outcome":"refused"'* ]] || { echo "verdict: $line"; return 1; }
}
check "a run the fence refused is a run.verdict with outcome refused" fence_refusal_recorded

# ------------------------------------------------------------ /metrics
metrics_guarded() {
  "$KUBECTL" -n "$NS" create serviceaccount scraper >/dev/null 2>&1
  "$KUBECTL" create clusterrolebinding "$RELEASE-e2e-scraper" --clusterrole="$RELEASE-skill-operator-metrics-reader" \
    --serviceaccount="$NS:scraper" >/dev/null 2>&1
  local scraper ip url
  scraper="$("$KUBECTL" -n "$NS" create token scraper --duration=1h)"
  ip="$("$KUBECTL" -n "$OPNS" get pods -l app.kubernetes.io/component=controller -o jsonpath='{.items[0].status.podIP}')"
  for url in "http://$ip:8080/metrics" "$GW/metrics" "http://$ARTIFACTS_CLUSTER_IP:8443/metrics"; do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "$url")" == 401 ]] || { echo "$url without a token: not 401"; return 1; }
    [[ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $ALLOWED" "$url")" == 403 ]] || { echo "$url with an agent's token: not 403"; return 1; }
    local code
    for _ in $(seq 30); do
      code="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $scraper" "$url")"
      [[ "$code" == 200 ]] && break
      sleep 1  # a refusal is believed for 10 s: the binding above may be newer
    done
    [[ "$code" == 200 ]] || { echo "$url with the reader's token: $code"; return 1; }
  done
  "$KUBECTL" delete clusterrolebinding "$RELEASE-e2e-scraper" >/dev/null
}
check "every component's /metrics: 401 without a token, 403 for an agent, 200 for a metrics reader" metrics_guarded

# ------------------------------------------------------------ NetworkPolicy
netpol_probe_found() {
  local cond
  cond="$(K get skilljob forge-cold -o jsonpath='{.status.conditions[?(@.type=="NetworkPolicyEnforced")].reason}')"
  [[ "$cond" == ProbeNotEnforced ]] || { echo "NetworkPolicyEnforced reason $cond"; return 1; }
  [[ "$(controller_logs)" == *"NetworkPolicy is NOT enforced"* ]] || { echo "the controller's log does not say it"; return 1; }
  [[ -z "$("$KUBECTL" -n "$OPNS" get pod,networkpolicy skill-operator-netpol-probe -o name 2>/dev/null)" ]] || { echo "the probe's objects were left"; return 1; }
}
check "the NetworkPolicy probe finds this CNI does not enforce policies: every run says so, the log says it loudly" netpol_probe_found
