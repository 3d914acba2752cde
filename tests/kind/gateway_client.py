"""The real-cluster gateway checks, driven by the real Python `mcp` client.

Usage: gateway_client.py CHECK BASE_URL NS OTHER_NS TOKEN_ALLOWED TOKEN_DENIED
  BASE_URL   http://<gateway ClusterIP>:8090 (this machine reaches ClusterIPs)
  NS         a namespace with the samples bound, where TOKEN_ALLOWED's
             ServiceAccount may use the gateway
  OTHER_NS   a namespace where it may use the gateway but nothing is bound yet;
             the check "bind" waits for a binding made there by the caller
  CHECK      one of the functions below (run.sh calls each as its own check);
             "limits" takes a phase after the tokens; "bench" (the gateway's
             warm-run benchmark, run.sh with BENCH_RUNS) takes RUNS SKILL SCRIPT

Every check prints one line on failure and exits 1.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx2 as httpx  # the mcp client ships httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

TIMEOUT = 120.0


class Failed(Exception):
    pass


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise Failed(message)


async def connect(url: str, token: str | None, mode: str, host: str | None = None, **kwargs: Any):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if host:
        # A replica reached on its pod address still answers only its Service's Host names.
        headers["Host"] = host
    headers = headers or None
    http = create_mcp_http_client(headers=headers, timeout=httpx.Timeout(TIMEOUT))
    return http, Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs)


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    expect(not result.is_error, f"{tool} failed: {text[:400]}")
    return result.structured_content or json.loads(text)


async def run_word_count(client: Client) -> dict[str, Any]:
    content = base64.b64encode(b"one two three\nfour\n").decode()
    args = {
        "skill": "word-count",
        "script": "scripts/wc.sh",
        "args": ["in.txt"],
        "inputs": [{"path": "in.txt", "content": content, "encoding": "base64"}],
    }
    preview = await call(client, "skill_run", args)
    expect(preview.get("status") == "confirmation-required", f"no preview first: {json.dumps(preview)[:300]}")
    return await call(client, "skill_run", {**args, "confirm": preview["token"]})


async def check_run(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """skill_list shows the bound samples; skill_run becomes a SkillJob that runs on the node."""
    for mode in ("auto", "legacy"):
        http, client = await connect(f"{base}/mcp/{ns}", allowed, mode)
        async with http, client:
            tools = {t.name for t in (await client.list_tools()).tools}
            expect({"skill_list", "skill_run", "skill_job_status"} <= tools, f"{mode}: tools {sorted(tools)}")
            listed = await call(client, "skill_list", {})
            names = {s["name"] for s in listed["skills"]}
            expect({"csv-stats", "word-count"} <= names, f"{mode}: skill_list {sorted(names)}")
            result = await run_word_count(client)
            expect(result.get("exitCode") == 0, f"{mode}: exit {result.get('exitCode')}: {json.dumps(result)[:400]}")
            expect("in.txt" in result.get("stdout", ""), f"{mode}: stdout {result.get('stdout')!r}")
            expect("2\t4\t" in result["stdout"], f"{mode}: wc output {result['stdout']!r}")
            job = result["job"]
            sj = subprocess.run(["kubectl", "-n", ns, "get", "skilljob", job, "-o", "json"], capture_output=True, text=True)
            expect(sj.returncode == 0, f"{mode}: no SkillJob {job} in {ns}: {sj.stderr.strip()}")
            annotations = json.loads(sj.stdout)["metadata"].get("annotations", {})
            expect(any("skills-agent" in v for v in annotations.values()), f"{mode}: the SkillJob does not name its caller: {annotations}")


async def check_auth(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """No token 401 naming the metadata; denied 403 naming the verb; garbage 401."""
    async with httpx.AsyncClient(timeout=30) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        r = await http.post(f"{base}/mcp/{ns}", json=body, headers=headers)
        expect(r.status_code == 401, f"no token: {r.status_code}")
        challenge = r.headers.get("www-authenticate", "")
        expect("resource_metadata=" in challenge, f"no resource_metadata in {challenge!r}")
        meta = await http.get(f"{base}/.well-known/oauth-protected-resource/mcp/{ns}")
        expect(meta.status_code == 200 and meta.json().get("resource", "").endswith(f"/mcp/{ns}"), f"metadata: {meta.status_code} {meta.text[:200]}")
        r = await http.post(f"{base}/mcp/{ns}", json=body, headers={**headers, "Authorization": "Bearer not-a-token"})
        expect(r.status_code == 401, f"garbage token: {r.status_code}")
        r = await http.post(f"{base}/mcp/{ns}", json=body, headers={**headers, "Authorization": f"Bearer {denied}"})
        expect(r.status_code == 403, f"denied caller: {r.status_code} {r.text[:200]}")
        expect("get" in r.text and "skillbindings" in r.text, f"the 403 does not name the verb and resource: {r.text[:300]}")


async def check_isolation(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """The allowed caller of NS cannot reach a namespace it has no rights in, nor a job of NS through OTHER_NS."""
    async with httpx.AsyncClient(timeout=30) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", "Authorization": f"Bearer {allowed}"}
        r = await http.post(f"{base}/mcp/kube-system", json=body, headers=headers)
        expect(r.status_code == 403, f"kube-system with the agent's token: {r.status_code}")
        # A legacy session of NS means nothing on OTHER_NS's path.
        r = await http.post(f"{base}/mcp/{ns}", json=body, headers=headers)
        session = r.headers.get("mcp-session-id")
        expect(r.status_code == 200 and session, f"initialize in {ns}: {r.status_code} {r.text[:200]}")
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        r = await http.post(f"{base}/mcp/{other}", json=listing, headers={**headers, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"})
        expect(r.status_code in (400, 404), f"{ns}'s session on {other}'s path: {r.status_code} {r.text[:200]}")
    # A job of NS is missing from OTHER_NS.
    http, client = await connect(f"{base}/mcp/{ns}", allowed, "auto")
    async with http, client:
        job = (await run_word_count(client))["job"]
    http, client = await connect(f"{base}/mcp/{other}", allowed, "auto")
    async with http, client:
        # run.sh calls this check after OTHER_NS got its binding, so the job tools exist there.
        result = await client.call_tool("skill_job_status", {"job": job})
        text = " ".join(getattr(c, "text", "") for c in result.content)
        expect(result.is_error and "not-found" in text, f"{ns}'s job {job} on {other}: {text[:300]}")


async def check_bind(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """OTHER_NS starts with no tools; a binding made there (by run.sh, once this prints READY) brings them with list_changed; NS hears nothing."""
    changed: dict[str, list[str]] = {"other": [], "ns": []}

    def handler(key: str):
        async def on_message(message: Any) -> None:
            if isinstance(message, types.ServerNotification):
                method = getattr(message, "method", None) or getattr(getattr(message, "root", None), "method", "")
                if method.endswith("list_changed"):
                    changed[key].append(method)

        return on_message

    http1, in_other = await connect(f"{base}/mcp/{other}", allowed, "legacy", message_handler=handler("other"))
    http2, in_ns = await connect(f"{base}/mcp/{ns}", allowed, "legacy", message_handler=handler("ns"))
    async with http1, in_other, http2, in_ns:
        tools = (await in_other.list_tools()).tools
        expect(tools == [], f"{other} offers tools before any binding: {[t.name for t in tools]}")
        print("READY", flush=True)
        # run.sh binds a skill in OTHER_NS now; the notification is the event waited for.
        for _ in range(int(TIMEOUT * 10)):
            if changed["other"]:
                break
            await asyncio.sleep(0.1)
        expect(bool(changed["other"]), f"no list_changed reached {other}'s session")
        tools = {t.name for t in (await in_other.list_tools()).tools}
        expect("skill_run" in tools, f"{other} after the binding: {sorted(tools)}")
        # Best effort (the ordering proof is the namespaces unit test): by
        # now NS's session would have heard the same notification.
        await in_ns.list_tools()
        expect(changed["ns"] == [], f"{ns}'s session heard {other}'s change: {changed['ns']}")


async def refusal(client: Client) -> MCPError | None:
    """One skill_list: None when answered, the JSON-RPC error when refused."""
    try:
        await call(client, "skill_list", {})
        return None
    except MCPError as err:
        return err


async def until(client: Client, want, what: str) -> MCPError | None:
    """Call skill_list until `want(refusal)` holds (the gateway applies an
    annotation once its Namespace watch reports it): the last refusal."""
    for _ in range(int(TIMEOUT * 5)):
        refused = await refusal(client)
        if want(refused):
            return refused
        await asyncio.sleep(0.2)
    raise Failed(f"never {what}")


def limited(status: int):
    return lambda err: err is not None and err.code == -32029 and (err.data or {}).get("status") == status


async def check_limits(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """run.sh annotates OTHER_NS before each phase (argv[7]): `strict` (1 call
    a minute): refused 429 with a retry-after while NS, unannotated, still
    answers; `typo`: refused 503 naming the annotation (fail closed); `none`: answered."""
    phase = sys.argv[7]
    http, client = await connect(f"{base}/mcp/{other}", allowed, "auto")
    async with http, client:
        if phase == "strict":
            err = await until(client, limited(429), "refused by the annotation's limit")
            expect(err.data.get("limit") == "calls" and err.data.get("perMinute") == 1, f"data {err.data}")
            expect(1 <= err.data.get("retryAfterSeconds", 0) <= 60, f"retry after {err.data}")
            expect("skills-agent" in err.data.get("principal", ""), f"principal {err.data}")
            expect(await refusal(client) is not None, "a second call within the minute passed")
            # The same budget covers the console and the file route.
            async with httpx.AsyncClient(timeout=30) as http:
                auth = {"Authorization": f"Bearer {allowed}"}
                for path in (f"/ui/api/ns/{other}/skills", f"/ui/api/ns/{other}/skills/word-count/file?path=SKILL.md", f"/ui/api/ns/{other}/jobs", f"/files/{other}/skj-00000000000000000000000000000000/out.txt"):
                    r = await http.get(f"{base}{path}", headers=auth)
                    expect(r.status_code == 429, f"{path} inside the exhausted budget: {r.status_code} {r.text[:200]}")
                    expect(int(r.headers.get("retry-after", "0")) >= 1, f"{path}: no Retry-After")
            h2, in_ns = await connect(f"{base}/mcp/{ns}", allowed, "auto")
            async with h2, in_ns:
                for _ in range(3):
                    expect(await refusal(in_ns) is None, f"{other}'s annotation limited {ns}")
        elif phase == "typo":
            err = await until(client, limited(503), "closed by the bad annotation")
            expect("calls-per-minute=sixty" in err.message and "fail closed" in err.message, err.message)
            expect(err.data.get("retryAfterSeconds", 0) >= 1, f"data {err.data}")
        else:
            await until(client, lambda err: err is None, "answered once the annotation is gone")


def sleep_jobs(ns: str) -> dict[str, str]:
    """The e2e-sleep SkillJobs in NS: name -> phase."""
    out = subprocess.run(["kubectl", "-n", ns, "get", "skilljobs", "-o", "json"], capture_output=True, text=True, check=True)
    return {
        j["metadata"]["name"]: (j.get("status") or {}).get("phase", "")
        for j in json.loads(out.stdout)["items"]
        if (j["metadata"].get("annotations") or {}).get("skill-operator.dev/skill") == "e2e-sleep"
    }


def kill_replica(pod_uid: str) -> str:
    """SIGKILL the gateway process of the pod POD_UID: on the local cluster
    it runs on this machine, found by the pod's cgroup (no release, no
    graceful close of its connections)."""
    import os
    import signal

    marks = (pod_uid, pod_uid.replace("-", "_"))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/cgroup") as f:
                cgroup = f.read()
        except OSError:
            continue
        if b"gateway" in argv and any(m in cgroup for m in marks):
            os.kill(int(pid), signal.SIGKILL)
            return f"SIGKILLed pid {pid}"
    raise Failed(f"no gateway process of pod {pod_uid} on this machine")


async def check_failover(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """A gateway replica SIGKILLed during a confirmed skill_run (argv[7]: its
    base URL, argv[8]: its pod UID; argv[9]: the other replica's base URL):
    the caller's retry of the same confirmed call on the other replica
    attaches to the same SkillJob and returns that run's result, and no
    second SkillJob is made."""
    replica, pod_uid, survivor = sys.argv[7:10]
    host = base.split("://", 1)[1]
    args = {"skill": "e2e-sleep", "script": "scripts/sleep.sh", "args": ["6"]}
    before = set(sleep_jobs(ns))
    http, client = await connect(f"{replica}/mcp/{ns}", allowed, "auto", host=host)
    name, killed = None, False
    try:
        async with http, client:
            preview = await call(client, "skill_run", args)
            expect(preview.get("status") == "confirmation-required", f"no preview first: {json.dumps(preview)[:300]}")
            token = preview["token"]
            pending = asyncio.create_task(call(client, "skill_run", {**args, "confirm": token}))
            for _ in range(600):
                running = {n: p for n, p in sleep_jobs(ns).items() if n not in before}
                if any(p == "Running" for p in running.values()):
                    name = next(n for n, p in running.items() if p == "Running")
                    break
                if pending.done():
                    ended = pending.exception() or pending.result()
                    raise Failed(f"the call ended before the run was seen running: {str(ended)[:300]}")
                await asyncio.sleep(0.1)
            expect(name is not None, "the run's SkillJob never reached Running")
            print(f"gateway failover: {kill_replica(pod_uid)} while {name} ran", file=sys.stderr)
            killed = True
            try:
                await asyncio.wait_for(pending, 30)
                raise Failed("the call on the killed replica answered")
            except Failed:
                raise
            except BaseException:
                pass  # the connection went with the replica, as it should
    except Failed:
        raise
    except BaseException:
        if not killed:
            raise
        # else: closing a session whose server is gone
    http, client = await connect(f"{survivor}/mcp/{ns}", allowed, "auto", host=host)
    async with http, client:
        result = await call(client, "skill_run", {**args, "confirm": token})
    expect(result.get("job") == name, f"the retry answered job {result.get('job')}, not {name}")
    brief = {k: result.get(k) for k in ("phase", "exitCode", "message", "stdout", "stderr", "timedOut", "cancelled")}
    expect(result.get("exitCode") == 0 and "slept 6" in result.get("stdout", ""), f"result {json.dumps(brief)[:600]}")
    made = set(sleep_jobs(ns)) - before
    expect(made == {name}, f"SkillJobs made for one confirmed call: {sorted(made)}")


def kubectl(*args: str) -> str:
    done = subprocess.run(["kubectl", *args], capture_output=True, text=True)
    expect(done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr.strip()[:300]}")
    return done.stdout


def waiting_pods(ns: str, binding: str) -> int:
    """The binding's warm pods that wait for a run (Running, Ready, not going)."""
    uid = kubectl("-n", ns, "get", "skillbinding", binding, "-o", "jsonpath={.metadata.uid}")
    pods = json.loads(kubectl("-n", ns, "get", "pods", "-l", f"skill-operator.dev/warm-binding={uid},skill-operator.dev/warm-state=idle", "-o", "json"))
    ready = lambda p: any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    return sum(1 for p in pods["items"] if p["status"].get("phase") == "Running" and ready(p) and not p["metadata"].get("deletionTimestamp"))


def quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[round((len(ordered) - 1) * 0.9)]
    return f"p50 {statistics.median(ordered):,.0f} ms (p90 {p90:,.0f})"


async def check_bench(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """skill_run through the gateway, cold then on warm pods, in one run.

    Timed per run on this client: the preview call, and the confirmed call
    (the SkillJob made, run and read back: what an agent waits for). The
    binding keeps no pool for the cold runs; for the warm ones it keeps one
    pod, and each run starts once a pod waits (the claim's latency, not how
    fast the pool refills). A warm run that went cold is counted apart.
    """
    runs, skill, script = int(sys.argv[7]), sys.argv[8], sys.argv[9]
    http, client = await connect(f"{base}/mcp/{ns}", allowed, "auto")
    refusals: list[str] = []

    async def answered(response: httpx.Response) -> None:
        # An HTTP-level refusal reaches the client only as "Server returned an error response".
        if response.status_code >= 400:
            await response.aread()
            refusals.append(f"HTTP {response.status_code}: {response.text[:300]}")

    http.event_hooks["response"].append(answered)
    done_runs = 0
    async with http, client:

        async def one(tag: str) -> tuple[float, float, str]:
            nonlocal done_runs
            expect(not refusals, f"after {done_runs} runs: {refusals[:2]}")
            args = {"skill": skill, "script": script, "args": [tag]}
            try:
                t0 = time.perf_counter()
                preview = await call(client, "skill_run", args)
                t1 = time.perf_counter()
                result = await call(client, "skill_run", {**args, "confirm": preview["token"]})
                t2 = time.perf_counter()
            except MCPError as err:
                raise Failed(f"{tag}, after {done_runs} runs: {err} {refusals[:2]}") from err
            expect(result.get("exitCode") == 0 and f"run: {tag}" in result.get("stdout", ""), f"{tag}: {json.dumps(result)[:300]}")
            done_runs += 1
            return (t1 - t0) * 1e3, (t2 - t1) * 1e3, result["job"]

        def done(job: str) -> str:
            pod = kubectl("-n", ns, "get", "skilljob", job, "-o", "jsonpath={.status.warmPod}")
            kubectl("-n", ns, "delete", "skilljob", job, "--wait=false")
            return pod

        kubectl("-n", ns, "patch", "skillbinding", skill, "--type", "merge", "-p", '{"spec":{"warm":null}}')
        done((await one("warmup"))[2])
        previews, cold, warm, went_cold, warm_both = [], [], [], 0, []
        for i in range(runs):
            p, c, job = await one(f"cold-{i}")
            expect(done(job) == "", f"{job} ran on a warm pod with no pool")
            previews.append(p)
            cold.append(c)
        kubectl("-n", ns, "patch", "skillbinding", skill, "--type", "merge", "-p", '{"spec":{"warm":{"min":1,"max":1,"idleTimeoutSeconds":600}}}')
        for i in range(runs):
            deadline = time.monotonic() + 180
            while waiting_pods(ns, skill) < 1:
                expect(time.monotonic() < deadline, "no warm pod waited within 180 s")
                await asyncio.sleep(0.2)
            p, c, job = await one(f"warm-{i}")
            previews.append(p)
            if done(job):
                warm.append(c)
                warm_both.append(p + c)
            else:
                went_cold += 1
        kubectl("-n", ns, "patch", "skillbinding", skill, "--type", "merge", "-p", '{"spec":{"warm":null}}')
    expect(len(warm) > 0, "no run was warm")
    ratio = statistics.median(warm) / statistics.median(cold)
    print(f"gateway skill_run, confirmed call ({runs} runs each, one warm-up): cold {quantiles(cold)}; warm {quantiles(warm)}; warm/cold {ratio:.3f}")
    print(f"gateway skill_run preview call ({len(previews)} runs): {quantiles(previews)}; warm runs that went cold: {went_cold} of {runs}")
    print(f"gateway skill_run on a warm pod, preview and confirmed call together: {quantiles(warm_both)}")


async def check_forged(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """run.sh planted a SkillJob (argv[7]) naming the agent as its requester,
    without the gateway's seal: it is not the agent's, in any tool."""
    planted = sys.argv[7]
    http, client = await connect(f"{base}/mcp/{ns}", allowed, "auto")
    async with http, client:
        listed = await call(client, "skill_job_list", {})
        ids = [j.get("id") for j in listed.get("jobs", [])]
        expect(planted not in ids, f"the planted SkillJob is listed as the agent's: {ids}")
        result = await client.call_tool("skill_job_status", {"job": planted})
        text = " ".join(getattr(c, "text", "") for c in result.content)
        expect(result.is_error and "not-found" in text, f"skill_job_status of the planted job: {text[:300]}")


async def check_replay(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """A confirmed call's token, replayed after its job was deleted, runs nothing."""
    args = {"skill": "word-count", "script": "scripts/wc.sh", "args": ["/package/SKILL.md"]}
    http, client = await connect(f"{base}/mcp/{ns}", allowed, "auto")
    async with http, client:
        preview = await call(client, "skill_run", args)
        token = preview["token"]
        first = await call(client, "skill_run", {**args, "confirm": token})
        job = first["job"]
        uid = kubectl("-n", ns, "get", "skilljob", job, "-o", "jsonpath={.metadata.uid}")
        await call(client, "skill_job_delete", {"job": job})
        result = await client.call_tool("skill_run", {**args, "confirm": token})
        text = " ".join(getattr(c, "text", "") for c in result.content)
        expect(result.is_error and "token-reused" in text, f"the replayed token: {text[:300]}")
        # No second SkillJob: the name is the first run's (held, deleting) or gone.
        again = subprocess.run(["kubectl", "-n", ns, "get", "skilljob", job, "-o", "jsonpath={.metadata.uid}"], capture_output=True, text=True)
        expect(again.returncode != 0 or again.stdout == uid, f"a new SkillJob {job} was made: uid {again.stdout}, first {uid}")


async def check_sessions(base: str, ns: str, other: str, allowed: str, denied: str) -> None:
    """A session id another principal of the namespace learns opens nothing for them."""
    import os

    second = os.environ["SECOND"]
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    common = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{base}/mcp/{ns}", json=init, headers={**common, "Authorization": f"Bearer {allowed}"})
        session = r.headers.get("mcp-session-id")
        expect(r.status_code == 200 and session, f"initialize: {r.status_code}")
        on = {**common, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        theirs = {**on, "Authorization": f"Bearer {second}"}
        r = await http.delete(f"{base}/mcp/{ns}", headers=theirs)
        expect(r.status_code == 404, f"another principal's DELETE: {r.status_code}")
        r = await http.post(f"{base}/mcp/{ns}", json=listing, headers=theirs)
        expect(r.status_code == 404, f"another principal's POST: {r.status_code}")
        async with http.stream("GET", f"{base}/mcp/{ns}", headers=theirs) as stream:
            expect(stream.status_code == 404, f"another principal's GET (event stream): {stream.status_code}")
        r = await http.post(f"{base}/mcp/{ns}", json=listing, headers={**on, "Authorization": f"Bearer {allowed}"})
        expect(r.status_code == 200, f"the owner's session after the attempts: {r.status_code}")


CHECKS = {"forged": check_forged, "replay": check_replay, "sessions": check_sessions, "failover": check_failover, "run": check_run, "auth": check_auth, "isolation": check_isolation, "bind": check_bind, "limits": check_limits, "bench": check_bench}

if __name__ == "__main__":
    name, base, ns, other, allowed, denied = sys.argv[1:7]
    try:
        # The benchmark's runs each take seconds (a cold one, or a wait for a warm pod).
        limit = TIMEOUT * 2 + (2 * int(sys.argv[7]) * 15 if name == "bench" else 0)
        asyncio.run(asyncio.wait_for(CHECKS[name](base, ns, other, allowed, denied), limit))
    except Failed as err:
        print(err)
        sys.exit(1)
    except Exception as err:  # a crash is a failed check, with its reason
        leaves = [err]
        while any(isinstance(e, BaseExceptionGroup) for e in leaves):
            leaves = [x for e in leaves for x in (e.exceptions if isinstance(e, BaseExceptionGroup) else [e])]
        print("; ".join(f"{type(e).__name__}: {e}" for e in leaves))
        sys.exit(1)
