#!/usr/bin/env python3
"""Checks on a `helm template` rendering of charts/skill-operator.

usage: check_rendered.py RENDERED.yaml RELEASE CRD_SOURCE_DIR [--expect KEY=VALUE ...]

Prints one line per check ("ok  <name>" or "FAIL <name>: why") and exits 1
when any check failed. Checks:
  restricted     every container, init container and ephemeral container of
                 every workload passes Pod Security "restricted" (explicit
                 allowPrivilegeEscalation false, runAsNonRoot with a non-zero
                 numeric runAsUser, capabilities drop ALL and add nothing but
                 NET_BIND_SERVICE, seccomp RuntimeDefault/Localhost, allowed
                 volume types, no host namespaces/ports) plus readOnlyRootFilesystem
  resources      requests == limits (cpu, memory, ephemeral-storage) everywhere
  probes         liveness and readiness probes on every container
  token          automountServiceAccountToken set explicitly on every pod;
                 true only for the components that call the API
  names          every cluster-scoped object's name contains the release
                 name (CRDs excepted: their names are fixed by the API group)
  crd-keep       every CRD carries helm.sh/resource-policy: keep
  crd-content    every rendered CRD equals its source in CRD_SOURCE_DIR
                 (apart from the labels and annotations the chart adds)
  peer-labels    the controller's --operator-pod-label flags are exactly the
                 artifacts pods' selector labels (each run's NetworkPolicy
                 peer), and the artifacts container listens on 8443
  servicemonitor a ServiceMonitor, when rendered, selects the metrics Service
                 and names its port
  prometheusrule every alert has an expr, a severity (critical, warning,
                 info), a summary and a description; names unique
  dashboard      the Grafana dashboard parses, every panel has a query
                 filtered by $namespace, panel ids are unique
  gateway-*      the MCP gateway's objects, when rendered (gateway_checks.py)
  expect         --expect checks on the rendering (see EXPECTATIONS)
"""
import glob
import os
import sys

import yaml

import gateway_checks

CLUSTER_SCOPED = {
    "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace",
    "PriorityClass", "StorageClass", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "PersistentVolume", "IngressClass",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet", "Pod"}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret", "image",
}
# Components whose pods may carry a ServiceAccount token (they call the API).
API_COMPONENTS = {"controller", "artifacts", "gateway", "egress-proxy"}

failures = []
passes = []


def check(name, problems):
    if problems:
        failures.append(name)
        for p in problems:
            print(f"FAIL {name}: {p}")
    else:
        passes.append(name)
        print(f"ok   {name}")


def pod_spec(obj):
    kind = obj["kind"]
    spec = obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return spec["template"]["spec"]


def containers(spec):
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            yield field, c


def restricted_problems(obj):
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    spec = pod_spec(obj)
    psc = spec.get("securityContext") or {}
    out = []
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(f):
            out.append(f"{where}: {f} is set")
    for v in spec.get("volumes") or []:
        kinds = [k for k in v if k != "name"]
        if not kinds or kinds[0] not in RESTRICTED_VOLUMES:
            out.append(f"{where}: volume {v.get('name')} of type {kinds} is not allowed")
    for field, c in containers(spec):
        cw = f"{where} {field}[{c['name']}]"
        sc = c.get("securityContext") or {}

        def eff(key):
            return sc[key] if key in sc else psc.get(key)

        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{cw}: allowPrivilegeEscalation must be false (explicitly)")
        if sc.get("privileged"):
            out.append(f"{cw}: privileged")
        if eff("runAsNonRoot") is not True:
            out.append(f"{cw}: runAsNonRoot must be true")
        uid = eff("runAsUser")
        if not isinstance(uid, int) or isinstance(uid, bool) or uid == 0:
            out.append(f"{cw}: runAsUser must be a non-zero number (got {uid!r})")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{cw}: capabilities.drop must contain ALL")
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            out.append(f"{cw}: capabilities.add {sorted(extra)}")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{cw}: seccompProfile.type must be RuntimeDefault or Localhost (got {seccomp!r})")
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(f"{cw}: readOnlyRootFilesystem must be true")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{cw}: hostPort {p['hostPort']}")
    return out


def resources_problems(obj):
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    out = []
    for field, c in containers(pod_spec(obj)):
        r = c.get("resources") or {}
        req, lim = r.get("requests") or {}, r.get("limits") or {}
        for k in ("cpu", "memory", "ephemeral-storage"):
            if k not in lim:
                out.append(f"{where} {field}[{c['name']}]: no {k} limit")
        if req != lim:
            out.append(f"{where} {field}[{c['name']}]: requests {req} != limits {lim}")
    return out


def probe_problems(obj):
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    out = []
    for field, c in containers(pod_spec(obj)):
        if field != "containers":
            continue
        for p in ("livenessProbe", "readinessProbe"):
            path = ((c.get(p) or {}).get("httpGet") or {}).get("path")
            if path not in ("/healthz", "/readyz"):
                out.append(f"{where} [{c['name']}]: {p} is not an HTTP probe on /healthz or /readyz")
    return out


def token_problems(obj):
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    spec = pod_spec(obj)
    component = obj["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
    mount = spec.get("automountServiceAccountToken")
    if mount is None:
        return [f"{where}: automountServiceAccountToken not set explicitly"]
    if mount and component not in API_COMPONENTS:
        return [f"{where}: component {component} gets a ServiceAccount token but does not call the API"]
    return []


def args_of(deploy):
    return deploy["spec"]["template"]["spec"]["containers"][0].get("args") or []


SEVERITIES = {"critical", "warning", "info"}


def prometheus_rule_problems(rules):
    """Every alert has an expression, a severity a router can match, and a
    summary and description a person reads; names are unique."""
    problems, seen = [], set()
    for r in rules:
        groups = (r.get("spec") or {}).get("groups") or []
        if not groups:
            problems.append(f"{r['metadata']['name']}: no groups")
        for g in groups:
            if not g.get("rules"):
                problems.append(f"group {g.get('name')}: no rules")
            for rule in g.get("rules") or []:
                name = rule.get("alert") or rule.get("record") or "?"
                if name in seen:
                    problems.append(f"{name}: defined twice")
                seen.add(name)
                if not str(rule.get("expr") or "").strip():
                    problems.append(f"{name}: no expr")
                if "alert" not in rule:
                    continue
                if (rule.get("labels") or {}).get("severity") not in SEVERITIES:
                    problems.append(f"{name}: severity {(rule.get('labels') or {}).get('severity')!r} not in {sorted(SEVERITIES)}")
                ann = rule.get("annotations") or {}
                for key in ("summary", "description"):
                    if not str(ann.get(key) or "").strip():
                        problems.append(f"{name}: no annotations.{key}")
    return problems


def dashboard_problems(maps):
    """The dashboard parses, every panel shows something (a Prometheus
    expression), panel ids are unique, and the namespace variable exists."""
    import json
    problems = []
    for m in maps:
        data = m.get("data") or {}
        if len(data) != 1:
            problems.append(f"{m['metadata']['name']}: {len(data)} files, want 1")
            continue
        (key, text), = data.items()
        try:
            dash = json.loads(text)
        except ValueError as e:
            problems.append(f"{key}: not JSON: {e}")
            continue
        ids = [p.get("id") for p in dash.get("panels") or []]
        if len(ids) != len(set(ids)):
            problems.append(f"{key}: panel ids repeat")
        variables = {v.get("name") for v in (dash.get("templating") or {}).get("list") or []}
        if not {"datasource", "namespace"} <= variables:
            problems.append(f"{key}: variables {sorted(variables)} lack datasource or namespace")
        for p in dash.get("panels") or []:
            if p.get("type") == "row":
                continue
            exprs = [t.get("expr") for t in p.get("targets") or [] if t.get("expr")]
            if not exprs:
                problems.append(f"{key}: panel {p.get('title')!r} has no query")
            if any('namespace="$namespace"' not in e for e in exprs):
                problems.append(f"{key}: panel {p.get('title')!r} is not filtered by $namespace")
    return problems


# --expect KEY=VALUE checks: KEY -> function(objs, value) -> list of problems.
EXPECTATIONS = {}


def expect(name):
    def wrap(fn):
        EXPECTATIONS[name] = fn
        return fn
    return wrap


def deployments(objs):
    return {o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: o
            for o in objs if o["kind"] == "Deployment"}


@expect("image-digest")
def _(objs, value):
    want = f"@{value}"
    return [f"{c['name']}: image {c['image']} is not pinned by {value}"
            for o in objs if o["kind"] in WORKLOADS for _, c in containers(pod_spec(o))
            if not c["image"].endswith(want)]


@expect("pull-secret")
def _(objs, value):
    return [f"{o['metadata']['name']}: no imagePullSecret {value}" for o in objs if o["kind"] in WORKLOADS
            and {"name": value} not in (pod_spec(o).get("imagePullSecrets") or [])]


@expect("monitors")
def _(objs, value):
    want = sorted(value.split(","))
    got = sorted((o["metadata"].get("labels") or {}).get("app.kubernetes.io/component", "?")
                 for o in objs if o["kind"] == "ServiceMonitor")
    return [] if got == want else [f"ServiceMonitors for {got}, want {want}"]


@expect("kinds")
def _(objs, value):
    want = sorted(value.split(","))
    got = sorted({o["kind"] for o in objs})
    return [] if got == want else [f"kinds {got}, want {want}"]


@expect("controller-arg")
def _(objs, value):
    args = args_of(deployments(objs)["controller"])
    return [] if value in args else [f"controller args {args} lack {value}"]


@expect("no-controller-arg")
def _(objs, value):
    args = args_of(deployments(objs)["controller"])
    return [f"controller args contain {a}" for a in args if a.startswith(value)]


@expect("egress-arg")
def _(objs, value):
    args = args_of(deployments(objs)["egress-proxy"])
    return [] if value in args else [f"egress-proxy args {args} lack {value}"]


@expect("no-egress-arg")
def _(objs, value):
    args = args_of(deployments(objs)["egress-proxy"])
    return [f"egress-proxy args contain {a}" for a in args if a.startswith(value)]


def env_of(deploy):
    return {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0].get("env") or []}


@expect("env")
def _(objs, value):
    component, pair = value.split(":", 1)
    name, want = pair.split("=", 1)
    got = env_of(deployments(objs)[component]).get(name)
    return [] if got == want else [f"{component} env {name}={got!r}, want {want!r}"]


@expect("no-env")
def _(objs, value):
    component, prefix = value.split(":", 1)
    return [f"{component} env has {n}" for n in env_of(deployments(objs)[component]) if n.startswith(prefix)]


@expect("gateway-netpol-port")
def _(objs, value):
    policy = next((o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-gateway")), None)
    if policy is None:
        return ["no gateway NetworkPolicy"]
    ports = [p.get("port") for rule in policy["spec"].get("egress") or [] for p in rule.get("ports") or []]
    return [] if int(value) in ports else [f"the gateway NetworkPolicy's egress ports {ports} lack {value}"]


@expect("artifacts-arg")
def _(objs, value):
    args = args_of(deployments(objs)["artifacts"])
    return [] if value in args else [f"artifacts args {args} lack {value}"]


@expect("artifacts-grants")
def _(objs, value):
    # group/resource,...: exactly what the artifacts ClusterRole grants (each
    # verb set is checked by `rule`), and no other binding names its account.
    want = sorted(v for v in value.split(",") if v)
    role = next((o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-artifacts")), None)
    if role is None:
        return [] if not want else ["no ClusterRole *-artifacts"]
    got = sorted({f"{g}/{r}" for rule in role.get("rules") or [] for g in rule.get("apiGroups", []) for r in rule.get("resources", [])})
    out = [] if got == want else [f"artifacts ClusterRole grants {got}, want {want}"]
    for b in objs:
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding") and not b["metadata"]["name"].endswith("-artifacts"):
            for subject in b.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount" and subject["name"].endswith("-artifacts"):
                    out.append(f"{b['kind']} {b['metadata']['name']} also binds the artifacts ServiceAccount")
    return out


@expect("rule")
def _(objs, value):
    # role-suffix:apiGroup:resource:verb1+verb2  (exact verb set)
    role, group, resource, verbs = value.split(":")
    for o in objs:
        if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith(f"-{role}"):
            got = [sorted(r["verbs"]) for r in o["rules"]
                   if group in r.get("apiGroups", []) and resource in r.get("resources", [])]
            want = sorted(verbs.split("+")) if verbs else None
            if want is None:
                return [f"{role}: {resource} is granted {got}"] if got else []
            return [] if got == [want] else [f"{role}: {group}/{resource} verbs {got}, want {want}"]
    return [] if not verbs else [f"no ClusterRole *-{role}"]


@expect("nsrule")
def _(objs, value):
    # role-suffix:apiGroup:resource:verb1+verb2 on a namespaced Role (exact
    # verb set); no verbs: neither any Role nor any ClusterRole grants it.
    role, group, resource, verbs = value.split(":")
    roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
    granted = [(o["kind"], o["metadata"]["name"], sorted(r["verbs"])) for o in roles for r in o.get("rules") or []
               if group in r.get("apiGroups", []) and resource in r.get("resources", [])]
    if not verbs:
        return [f"{kind} {name} grants {group}/{resource} {v}" for kind, name, v in granted]
    want = sorted(verbs.split("+"))
    mine = [v for kind, name, v in granted if kind == "Role" and name.endswith(f"-{role}")]
    out = [] if mine == [want] else [f"Role *-{role}: {group}/{resource} verbs {mine}, want [{want}]"]
    out += [f"{kind} {name} also grants {group}/{resource} {v}" for kind, name, v in granted
            if not (kind == "Role" and name.endswith(f"-{role}"))]
    return out


@expect("proxy-internet")
def _(objs, value):
    # present: the proxy's NetworkPolicy has its internet (0.0.0.0/0) rule;
    # absent: it has none (the CiliumNetworkPolicy is its way out).
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"
                and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "egress-proxy"]
    if len(policies) != 1:
        return [f"{len(policies)} egress-proxy NetworkPolicies, want 1"]
    blocks = [p["ipBlock"]["cidr"] for r in policies[0]["spec"].get("egress") or [] for p in r.get("to") or [] if "ipBlock" in p]
    internet = any(b in ("0.0.0.0/0", "::/0") for b in blocks)
    return [] if internet == (value == "present") else [f"internet rule {'missing' if value == 'present' else 'present'}: {blocks}"]


@expect("token-key-secret")
def _(objs, value):
    out = []
    for comp in ("controller", "artifacts"):
        vols = deployments(objs)[comp]["spec"]["template"]["spec"]["volumes"]
        names = [v["secret"]["secretName"] for v in vols if v["name"] == "token-key" and "secret" in v]
        if names != [value]:
            out.append(f"{comp}: token-key volume from secrets {names}, want [{value}]")
    return out


@expect("store")
def _(objs, value):
    # pvc | emptyDir | absent: the artifact endpoint's built-in store and its
    # volume. With the store: --store on that volume, strategy Recreate (one
    # writer), one replica, and a claim (when pvc) that uninstall keeps.
    deploy = deployments(objs)["artifacts"]
    spec = deploy["spec"]["template"]["spec"]
    args = args_of(deploy)
    claims = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    if value == "absent":
        out = [f"--store in artifacts args {args}" for a in args if a.startswith("--store")]
        out += [f"a claim {c['metadata']['name']} without the store" for c in claims]
        if not any(a.startswith("--registry=") for a in args):
            out.append(f"neither --store nor --registry in {args}")
        return out
    out = []
    if "--store=/var/lib/skill-operator/store" not in args or any(a.startswith("--registry") for a in args):
        out.append(f"artifacts args {args}: want --store=/var/lib/skill-operator/store and no --registry")
    mounts = {m["name"]: m for m in spec["containers"][0].get("volumeMounts") or []}
    if (mounts.get("store") or {}).get("mountPath") != "/var/lib/skill-operator/store":
        out.append("the store volume is not mounted at /var/lib/skill-operator/store")
    vol = next((v for v in spec.get("volumes") or [] if v["name"] == "store"), {})
    if (deploy["spec"].get("strategy") or {}).get("type") != "Recreate":
        out.append("the store's Deployment must use strategy Recreate (one writer)")
    if deploy["spec"]["replicas"] != 1:
        out.append(f"{deploy['spec']['replicas']} replicas on the built-in store")
    if value == "pvc":
        if len(claims) != 1:
            return out + [f"{len(claims)} claims, want 1"]
        c = claims[0]
        if (vol.get("persistentVolumeClaim") or {}).get("claimName") != c["metadata"]["name"]:
            out.append(f"the store volume {vol} is not the claim {c['metadata']['name']}")
        if (c["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") != "keep":
            out.append("the claim lacks helm.sh/resource-policy: keep (uninstall would delete the store)")
    else:
        if "emptyDir" not in vol:
            out.append(f"the store volume is {vol}, want an emptyDir")
        if claims:
            out.append(f"claims {[c['metadata']['name'] for c in claims]} with an emptyDir store")
    return out


@expect("samples")
def _(objs, value):
    # N | 0: the sample SkillPackages in the ConfigMap the endpoint applies.
    # Each names the store by the artifact endpoint URL's host:port (what the
    # controller maps to the operator credential); the artifacts ClusterRole
    # may create SkillPackages and get/patch exactly these, nothing more.
    import json
    from urllib.parse import urlsplit
    maps = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-samples")]
    role = next((o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-artifacts")), None)
    rules = [r for r in (role or {}).get("rules") or [] if "skillpackages" in r.get("resources", [])]
    if value == "0":
        out = [f"a samples ConfigMap {m['metadata']['name']}" for m in maps]
        return out + [f"artifacts rule on skillpackages without samples: {r}" for r in rules]
    if len(maps) != 1:
        return [f"{len(maps)} samples ConfigMaps, want 1"]
    packages = json.loads(maps[0]["data"]["skillpackages.json"])
    out = [] if len(packages) == int(value) else [f"{len(packages)} sample packages, want {value}"]
    endpoint = next(a.split("=", 1)[1] for a in args_of(deployments(objs)["controller"]) if a.startswith("--artifact-endpoint="))
    u = urlsplit(endpoint)
    host = f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"
    names = []
    for p in packages:
        name = p["metadata"]["name"]
        names.append(name)
        src = p["spec"]["source"]["oci"]
        if not src["reference"].startswith(f"{host}/samples/"):
            out.append(f"{name}: reference {src['reference']} does not name the store as {host}")
        if src.get("insecure", False) != (u.scheme == "http"):
            out.append(f"{name}: insecure {src.get('insecure')} for an {u.scheme} endpoint")
        if p["kind"] != "SkillPackage" or "namespace" in p["metadata"]:
            out.append(f"{name}: not a cluster-scoped SkillPackage")
    want_rules = [{"verbs": ["create"]}, {"verbs": ["get", "patch"], "resourceNames": sorted(names)}]
    got_rules = [{k: (sorted(v) if isinstance(v, list) else v) for k, v in r.items() if k in ("verbs", "resourceNames")} for r in rules]
    canon = lambda rs: sorted(json.dumps(r, sort_keys=True) for r in rs)
    if canon(got_rules) != canon(want_rules):
        out.append(f"artifacts skillpackages rules {got_rules}, want {want_rules}")
    return out


gateway_checks.register(expect)
INTERNAL_V4 = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"}
INTERNAL_V6 = {"fc00::/7", "fe80::/10", "::1/128"}


def proxy_policy_problems(policy, deploy):
    problems = []
    spec = policy["spec"]
    if spec["podSelector"]["matchLabels"] != deploy["spec"]["selector"]["matchLabels"]:
        problems.append("the policy does not select the proxy pods")
    if sorted(spec.get("policyTypes") or []) != ["Egress", "Ingress"]:
        problems.append(f"policyTypes {spec.get('policyTypes')}")
    args = args_of(deploy)
    denied = {a.split("=", 1)[1] for a in args if a.startswith("--deny-cidr=")}
    for rule in spec.get("ingress") or []:
        if not rule.get("from") or not rule.get("ports"):
            problems.append(f"an ingress rule open to everything: {rule}")
    for rule in spec.get("egress") or []:
        to, ports = rule.get("to"), rule.get("ports")
        if not to or not ports:
            problems.append(f"an egress rule without peers or ports (allow-all): {rule}")
            continue
        port_numbers = {p.get("port") for p in ports}
        for peer in to:
            if "ipBlock" in peer:
                block = peer["ipBlock"]
                if block["cidr"] in ("0.0.0.0/0", "::/0"):
                    v6 = ":" in block["cidr"]
                    need = (INTERNAL_V6 if v6 else INTERNAL_V4) | {c for c in denied if (":" in c) == v6}
                    missing = need - set(block.get("except") or [])
                    if missing:
                        problems.append(f"{block['cidr']} does not except {sorted(missing)}")
                    if 53 in port_numbers:
                        problems.append("DNS to the internet")
            elif port_numbers != {53}:
                problems.append(f"an in-cluster peer other than DNS: {peer} on {sorted(port_numbers)}")
    return problems


def controller_ha_problems(objs, deploy):
    """Leader election: the flags, the Lease's Role (create; get/update of
    the one Lease by name, nothing else), and over one replica a PDB and
    spreading (unless affinity was given)."""
    out = []
    args = args_of(deploy)
    name = next((a.split("=", 1)[1] for a in args if a.startswith("--leader-elect-lease-name=")), None)
    if "--leader-elect" not in args or not name:
        return [f"controller args {args} lack --leader-elect and its lease name"]
    ns = deploy["metadata"]["namespace"]
    sa = pod_spec(deploy)["serviceAccountName"]
    roles = [o for o in objs if o["kind"] == "Role" and any("leases" in r.get("resources", []) for r in o.get("rules", []))]
    if len(roles) != 1:
        return out + [f"{len(roles)} Roles grant leases, want 1"]
    role = roles[0]
    if role["metadata"].get("namespace") != ns:
        out.append(f"the Lease Role is in {role['metadata'].get('namespace')}, not the release namespace {ns}")
    got = sorted((tuple(r.get("apiGroups", [])), tuple(r.get("resources", [])), tuple(sorted(r.get("verbs", []))),
                  tuple(r.get("resourceNames", []))) for r in role["rules"])
    want = sorted([(("coordination.k8s.io",), ("leases",), ("create",), ()),
                   (("coordination.k8s.io",), ("leases",), ("get", "update"), (name,))])
    if got != want:
        out.append(f"the Lease Role's rules {got} != {want}")
    bindings = [o for o in objs if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == role["metadata"]["name"]]
    if [(s["kind"], s["name"]) for b in bindings for s in b["subjects"]] != [("ServiceAccount", sa)]:
        out.append(f"the Lease Role is bound to {[b['subjects'] for b in bindings]}, want the controller's account {sa} only")
    replicas = deploy["spec"]["replicas"]
    labels = deploy["spec"]["selector"]["matchLabels"]
    pdbs = [p for p in objs if p["kind"] == "PodDisruptionBudget" and p["spec"]["selector"].get("matchLabels") == labels]
    if replicas > 1 and [p["spec"].get("minAvailable") for p in pdbs] != [1]:
        out.append(f"{len(pdbs)} controller PodDisruptionBudgets (minAvailable 1) for {replicas} replicas, want 1")
    if replicas <= 1 and pdbs:
        out.append(f"a controller PodDisruptionBudget with {replicas} replica(s) would only block drains")
    spread = (pod_spec(deploy).get("affinity") or {}).get("podAntiAffinity")
    if replicas > 1 and not pod_spec(deploy).get("affinity"):
        out.append(f"{replicas} controller replicas with no affinity at all")
    if replicas <= 1 and spread:
        out.append("anti-affinity on a single controller replica")
    if (deploy["spec"].get("strategy") or {}).get("type") != "RollingUpdate":
        out.append("the controller must roll (a new pod stands by until the old one releases the Lease)")
    return out


def main():
    rendered, release, crd_dir = sys.argv[1:4]
    expects = []
    rest = sys.argv[4:]
    while rest:
        flag, kv = rest[0], rest[1]
        assert flag == "--expect", flag
        k, _, v = kv.partition("=")
        assert k in EXPECTATIONS, k
        expects.append((k, v))
        rest = rest[2:]

    with open(rendered) as f:
        objs = [d for d in yaml.safe_load_all(f) if d]

    workloads = [o for o in objs if o["kind"] in WORKLOADS]
    if not workloads:
        check("workloads", ["no workloads rendered"])
    check("restricted", [p for o in workloads for p in restricted_problems(o)])
    check("resources", [p for o in workloads for p in resources_problems(o)])
    check("probes", [p for o in workloads if o["kind"] == "Deployment" for p in probe_problems(o)])
    check("token", [p for o in workloads if o["kind"] == "Deployment" for p in token_problems(o)])
    check("names", [f"{o['kind']}/{o['metadata']['name']} does not contain the release name {release!r}"
                    for o in objs if o["kind"] in CLUSTER_SCOPED and o["kind"] != "CustomResourceDefinition"
                    and release not in o["metadata"]["name"]])
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    check("crd-keep", [f"{o['metadata']['name']}: annotations {o['metadata'].get('annotations')}"
                       for o in crds
                       if (o["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") != "keep"])
    sources = {}
    for path in sorted(glob.glob(os.path.join(crd_dir, "*.yaml"))):
        with open(path) as f:
            doc = yaml.safe_load(f)
        sources[doc["metadata"]["name"]] = doc
    content = []
    if crds:
        if sorted(sources) != sorted(o["metadata"]["name"] for o in crds):
            content.append(f"rendered CRDs {sorted(o['metadata']['name'] for o in crds)} != sources {sorted(sources)}")
        for o in crds:
            src = sources.get(o["metadata"]["name"])
            if src is None:
                continue
            a, b = dict(o), dict(src)
            a["metadata"] = {"name": o["metadata"]["name"]}
            b["metadata"] = {"name": src["metadata"]["name"]}
            if a != b:
                content.append(f"{o['metadata']['name']}: rendered CRD differs from {crd_dir}")
        check("crd-content", content)

    deps = deployments(objs)
    peer = []
    if "controller" in deps and "artifacts" in deps:
        flags = dict(a.split("=", 1)[1].split("=", 1) for a in args_of(deps["controller"])
                     if a.startswith("--operator-pod-label="))
        art = deps["artifacts"]
        if flags != art["spec"]["selector"]["matchLabels"]:
            peer.append(f"--operator-pod-label {flags} != artifacts selector {art['spec']['selector']['matchLabels']}")
        if not flags.items() <= art["spec"]["template"]["metadata"]["labels"].items():
            peer.append("artifacts pod labels lack some --operator-pod-label")
        ports = [p["containerPort"] for p in art["spec"]["template"]["spec"]["containers"][0]["ports"]]
        if ports != [8443]:
            peer.append(f"artifacts container ports {ports}, want [8443] (the runs' NetworkPolicy port)")
    else:
        peer.append("controller or artifacts Deployment missing")
    # The egress proxy: the runs' second peer, when deployed.
    if "egress-proxy" in deps and "controller" in deps:
        flags = dict(a.split("=", 1)[1].split("=", 1) for a in args_of(deps["controller"])
                     if a.startswith("--egress-proxy-pod-label="))
        proxy = deps["egress-proxy"]
        if flags != proxy["spec"]["selector"]["matchLabels"]:
            peer.append(f"--egress-proxy-pod-label {flags} != egress-proxy selector {proxy['spec']['selector']['matchLabels']}")
        ports = [p["containerPort"] for p in proxy["spec"]["template"]["spec"]["containers"][0]["ports"]]
        if ports[:1] != [3128]:
            peer.append(f"egress-proxy container ports {ports}, want 3128 first (the runs' NetworkPolicy port)")
    elif any(a.startswith("--egress-proxy=") for a in args_of(deps.get("controller", {"spec": {"template": {"spec": {"containers": [{}]}}}}))):
        peer.append("the controller names an egress proxy that is not deployed")
    check("peer-labels", peer)

    # The proxy's own NetworkPolicy: internet only (public addresses, the
    # pod/service ranges excepted), DNS pods, the API server; nothing else.
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"
                and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "egress-proxy"]
    if "egress-proxy" in deps and policies:
        check("egress-proxy-policy", proxy_policy_problems(policies[0], deps["egress-proxy"]))

    monitors = [o for o in objs if o["kind"] == "ServiceMonitor"]
    sm = []
    for m in monitors:
        sel = m["spec"]["selector"]["matchLabels"]
        svcs = [s for s in objs if s["kind"] == "Service" and sel.items() <= (s["metadata"].get("labels") or {}).items()]
        if len(svcs) != 1:
            sm.append(f"{m['metadata']['name']}: selects {len(svcs)} Services, want 1")
            continue
        names = {p.get("name") for p in svcs[0]["spec"]["ports"]}
        for e in m["spec"]["endpoints"]:
            if e.get("port") not in names:
                sm.append(f"{m['metadata']['name']}: endpoint port {e.get('port')} not in {names}")
    if monitors:
        check("servicemonitor", sm)

    rules = [o for o in objs if o["kind"] == "PrometheusRule"]
    if rules:
        check("prometheusrule", prometheus_rule_problems(rules))
    dashboards = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    if dashboards:
        check("dashboard", dashboard_problems(dashboards))

    if "controller" in deps:
        check("controller-ha", controller_ha_problems(objs, deps["controller"]))

    for name, problems in gateway_checks.checks(objs):
        check(name, problems)

    for k, v in expects:
        check(f"expect {k}={v}", EXPECTATIONS[k](objs, v))

    print(f"{len(passes)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
