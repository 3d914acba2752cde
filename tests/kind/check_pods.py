#!/usr/bin/env python3
"""Checks the run pods a `kubectl get pods --watch -o json` stream saw.

usage: check_pods.py WATCH.jsonl MIN_PODS

Every pod version the API server stored for the suite's namespace is
checked as it was admitted: Pod Security "restricted" on every container,
init container and sidecar (allowPrivilegeEscalation false, runAsNonRoot
with a non-zero runAsUser, capabilities drop ALL, seccomp RuntimeDefault),
plus what this project adds: read-only root filesystems, no ServiceAccount
token, no service links, no host namespaces, requests == limits. Prints
one line per pod and exits 1 on any problem or when fewer than MIN_PODS
distinct pods were seen.
"""
import json
import sys

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret", "image"}


def objects(path):
    """The stream holds JSON objects back to back (one per watch event)."""
    text = open(path).read()
    decoder = json.JSONDecoder()
    i = 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        obj, i = decoder.raw_decode(text, i)
        yield obj.get("object", obj)


def problems(pod):
    spec = pod["spec"]
    psc = spec.get("securityContext", {})
    out = []
    if spec.get("automountServiceAccountToken") is not False:
        out.append("automountServiceAccountToken is not false")
    if spec.get("enableServiceLinks") is not False:
        out.append("enableServiceLinks is not false")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"{field} is set")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} is {sorted(kinds)}")
    containers = spec.get("initContainers", []) + spec.get("containers", []) + spec.get("ephemeralContainers", [])
    if len(containers) < 3:
        out.append(f"{len(containers)} containers (fetch, upload, run expected)")
    for c in containers:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            out.append(f"{name}: runAsNonRoot is not true")
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        if not uid:
            out.append(f"{name}: runAsUser is {uid!r}")
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"] or caps.get("add"):
            out.append(f"{name}: capabilities {caps}")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccomp {seccomp!r}")
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(f"{name}: readOnlyRootFilesystem is not true")
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        res = c.get("resources", {})
        if res.get("requests") != res.get("limits") or not res.get("limits"):
            out.append(f"{name}: requests != limits ({res})")
    return out


def main():
    path, minimum = sys.argv[1], int(sys.argv[2])
    seen = {}
    for pod in objects(path):
        if pod.get("kind") != "Pod":
            continue
        seen.setdefault(pod["metadata"]["uid"], pod)
    bad = 0
    for uid, pod in sorted(seen.items(), key=lambda kv: kv[1]["metadata"]["name"]):
        found = problems(pod)
        name = pod["metadata"]["name"]
        if found:
            bad += 1
            for p in found:
                print(f"FAIL pod {name}: {p}")
        else:
            print(f"ok   pod {name}: restricted and hardened")
    if len(seen) < minimum:
        print(f"FAIL only {len(seen)} run pods seen, at least {minimum} expected")
        bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
