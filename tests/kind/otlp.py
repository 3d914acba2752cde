"""An OTLP/HTTP JSON trace collector of the real-cluster suite, and its check.

Usage:
  otlp.py serve PORT FILE   receive POST /v1/traces (OTLP JSON) on 0.0.0.0:PORT
                            (the chart's gateway and controller pods reach this
                            machine at the pod gateway), one body per line in FILE
  otlp.py check FILE        one run is one trace across processes: a gateway
                            `tools/call` of skill_run, its `run` span, and as
                            that span's children (through the SkillJob's
                            traceparent annotation) the controller's
                            `reconcile SkillJob` spans and the run's `skilljob`
                            span with the pod's five phases (pending, fetch,
                            launch, script, upload), contiguous

The check waits up to 60 s for the spans (the exporters send batches every
5 s) and prints one line on failure, exiting 1.
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 16 << 20


def serve(port: int, path: str) -> None:
    out = open(path, "a", encoding="utf-8")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/v1/traces" or not 0 < length <= MAX_BODY:
                self.send_response(400)
                self.end_headers()
                return
            try:
                request = json.loads(self.rfile.read(length))
            except ValueError:
                self.send_response(400)
                self.end_headers()
                return
            out.write(json.dumps(request, separators=(",", ":")) + "\n")
            out.flush()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args) -> None:
            pass

    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


def spans(path: str) -> list[dict]:
    """Every span in FILE, with its service and its attributes as a dict."""
    found = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except FileNotFoundError:
        return found
    for line in lines:
        for rs in json.loads(line).get("resourceSpans", []):
            attrs = {a["key"]: a["value"] for a in rs.get("resource", {}).get("attributes", [])}
            service = attrs.get("service.name", {}).get("stringValue", "")
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    s = dict(s)
                    s["service"] = service
                    s["attrs"] = {a["key"]: next(iter(a["value"].values()), None) for a in s.get("attributes", [])}
                    found.append(s)
    return found


def whole_run(all_spans: list[dict]) -> str | None:
    """A problem with the best candidate trace, or None when one trace is whole."""
    calls = [s for s in all_spans if s["service"] == "skill-operator-gateway" and s["name"] == "tools/call"
             and s["attrs"].get("tool") == "skill_run"]
    if not calls:
        return f"no gateway tools/call of skill_run among {len(all_spans)} spans"
    problem = "no skill_run call has a reconcile of its SkillJob"
    for call in calls:
        trace = [s for s in all_spans if s["traceId"] == call["traceId"]]
        reconciles = [s for s in trace if s["service"] == "skill-operator-controller" and s["name"] == "reconcile SkillJob"]
        if not reconciles:
            continue
        gw_runs = [s for s in trace if s["service"] == "skill-operator-gateway" and s["name"] == "run"
                   and s.get("parentSpanId") == call["spanId"]]
        if len(gw_runs) != 1:
            problem = f"{len(gw_runs)} gateway run spans under the call in trace {call['traceId']}"
            continue
        parent = gw_runs[0]
        if not all(r.get("parentSpanId") == parent["spanId"] for r in reconciles):
            problem = f"reconciles in trace {call['traceId']} are not children of the gateway's run span: {[r.get('parentSpanId') for r in reconciles]}"
            continue
        runs = [s for s in trace if s["service"] == "skill-operator-controller" and s["name"] == "skilljob"]
        if len(runs) != 1:
            problem = f"{len(runs)} skilljob spans in trace {call['traceId']}"
            continue
        run = runs[0]
        if run.get("parentSpanId") != parent["spanId"]:
            problem = f"the skilljob span is not a child of the gateway's run span: {run.get('parentSpanId')} != {parent['spanId']}"
            continue
        if run["attrs"].get("skilljob.phase") != "Succeeded":
            problem = f"the run's span says {run['attrs']}"
            continue
        phases = {s["name"]: s for s in trace if s.get("parentSpanId") == run["spanId"]}
        want = ["skilljob.pending", "skilljob.fetch", "skilljob.launch", "skilljob.script", "skilljob.upload"]
        if set(phases) != set(want):
            problem = f"the run's phases: {sorted(phases)}, want the pod's five: {want}"
            continue
        # In order, each starting where the last ended (the pod's own clock readings).
        ordered = [phases[n] for n in want]
        if any(int(a["endTimeUnixNano"]) != int(b["startTimeUnixNano"]) for a, b in zip(ordered, ordered[1:])):
            problem = f"the phases are not contiguous: {[(p['name'], p['startTimeUnixNano'], p['endTimeUnixNano']) for p in ordered]}"
            continue
        # Clocks: the gateway, the controller and the SkillJob's status times
        # are all this one node's (the status times in whole seconds).
        if int(run["startTimeUnixNano"]) > int(call["endTimeUnixNano"]):
            problem = "the SkillJob starts after the call that created it ended"
            continue
        return None
    return problem


def check(path: str) -> int:
    deadline = time.monotonic() + 60
    while True:
        problem = whole_run(spans(path))
        if problem is None:
            return 0
        if time.monotonic() > deadline:
            print(problem)
            return 1
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(check(sys.argv[2]))
