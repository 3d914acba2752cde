"""Checks on the MCP gateway objects of a `helm template` rendering (used by
check_rendered.py; they run whenever a gateway Deployment is rendered).

  gateway-rbac     the gateway ClusterRole grants exactly GATEWAY_RULES (no
                   Secrets, no wildcards, no resourceNames, no URLs); its Role
                   (release namespace) exactly GATEWAY_NAMESPACE_RULES, plus
                   `get` on Secrets only when limited by resourceNames, plus
                   exactly one CATALOG_RULE (get/list/watch on the catalog's
                   ConfigMap, by resourceNames); each binding gives them to
                   the gateway ServiceAccount only
  gateway-pod      args (listen, artifact endpoint = the controller's, token
                   key file on a read-only mount of the token-key Secret, the
                   Service's in-cluster Host names, cache dir on a sized
                   emptyDir with --cache-max-bytes inside it, confirm and
                   on-disconnect values), port 8090 named mcp, readiness
                   /readyz and liveness /healthz on it, a ServiceAccount token
  gateway-service  port 8090 named mcp, targeting mcp, selecting the gateway pods
  gateway-pdb      a PodDisruptionBudget (minAvailable 1, the gateway pods) iff
                   replicas > 1
  gateway-netpol   when rendered: selects the gateway pods, both policy types,
                   ingress only on TCP 8090, every egress rule has peers and
                   ports, DNS (53) only to labelled pods (never an ipBlock),
                   the artifact endpoint pods on 8443 in the release
                   namespace, the trace collector's labelled pods on the
                   port of the gateway's OTLP endpoint, no other pod peers

Expectations (--expect): gateway=absent, gateway-arg=ARG, no-gateway-arg=PREFIX,
gateway-pdb=present|absent, gateway-netpol=present|absent,
gateway-catalog=NAMESPACE (the Role holding CATALOG_RULE is in NAMESPACE).
"""

import urllib.parse

# The gateway's whole cluster-wide grant, one (apiGroup, resource, verb) per
# row. It is the list; growing it needs a reason in gateway-rbac.yaml.
GATEWAY_RULES = {
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
    *{("skill-operator.dev", r, v) for r in ("skillbindings", "skillpackages") for v in ("get", "list", "watch")},
    *{("skill-operator.dev", "skilljobs", v) for v in ("create", "get", "list", "watch", "delete", "patch")},
}
# With --namespace-rate-limits: each namespace's annotation, by a metadata watch.
NAMESPACE_LIMIT_RULES = {("", "namespaces", v) for v in ("list", "watch")}
# In the release namespace only (a Role): the draft job records.
GATEWAY_NAMESPACE_RULES = {("", "configmaps", v) for v in ("create", "get", "list", "update", "delete")}
# The catalog of public skills (skill_search scope catalog): one ConfigMap,
# read and watched by name (src/catalog/cluster.rs CONFIGMAP_NAME; the watch's
# field selector is what lets list/watch be limited by resourceNames).
CATALOG_CONFIGMAP = "skill-operator-catalog"
CATALOG_RULE = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CATALOG_CONFIGMAP],
                "verbs": ["get", "list", "watch"]}
COMPONENT = "app.kubernetes.io/component"
CACHE_DIR = "/var/cache/skill-operator"
QUANTITY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(q):
    q = str(q)
    for suffix, mult in sorted(QUANTITY.items(), key=lambda kv: -len(kv[0])):
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * mult)
    return int(q)


def of_component(objs, kind, component):
    return [o for o in objs if o["kind"] == kind
            and (o["metadata"].get("labels") or {}).get(COMPONENT) == component]


def gateway_deployment(objs):
    found = [o for o in objs if o["kind"] == "Deployment"
             and o["spec"]["template"]["metadata"]["labels"].get(COMPONENT) == "gateway"]
    return found[0] if found else None


def container_args(deploy):
    return deploy["spec"]["template"]["spec"]["containers"][0].get("args") or []


def flag_values(args, flag):
    return [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]


def grants(role, where, allow_named_secrets):
    """(granted triples, problems) of one Role or ClusterRole."""
    out, granted = [], set()
    for rule in role.get("rules") or []:
        named_secrets = allow_named_secrets and rule.get("resources") == ["secrets"] and rule.get("verbs") == ["get"] \
            and rule.get("apiGroups") == [""] and bool(rule.get("resourceNames"))
        if rule.get("nonResourceURLs"):
            out.append(f"{where}: a rule with nonResourceURLs {rule['nonResourceURLs']}")
        if rule.get("resourceNames") and not named_secrets:
            out.append(f"{where}: a rule with resourceNames {rule['resourceNames']}")
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    if "*" in (group, resource, verb):
                        out.append(f"{where}: wildcard in {group!r}/{resource!r} {verb!r}")
                    if (resource == "secrets" or resource.startswith("secrets/")) and not named_secrets:
                        out.append(f"{where}: {verb} on {group!r}/{resource} (the gateway reads no Secret but named pull secrets)")
                    elif not named_secrets:
                        granted.add((group, resource, verb))
    if role.get("aggregationRule"):
        out.append(f"{where}: an aggregationRule (its rules would be filled in by the cluster)")
    return granted, out


def exactly(granted, want, where):
    return [f"{where}: grants {extra}, which the gateway does not need" for extra in sorted(granted - want)] + \
        [f"{where}: lacks {missing}" for missing in sorted(want - granted)]


def bound_to_gateway(objs, kind, role, sa, ns):
    out = []
    bindings = [b for b in objs if b["kind"] == kind and b["roleRef"]["name"] == role["metadata"]["name"]
                and b["metadata"].get("namespace") == role["metadata"].get("namespace")]
    if len(bindings) != 1:
        out.append(f"{len(bindings)} {kind}s to {role['metadata']['name']}, want 1")
    for b in bindings:
        if b["roleRef"]["kind"] != role["kind"]:
            out.append(f"{kind} roleRef kind {b['roleRef']['kind']}")
        want = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
        if b.get("subjects") != want:
            out.append(f"{kind} subjects {b.get('subjects')}, want {want}")
    return out


def rbac_problems(objs, deploy):
    out = []
    sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
    ns = deploy["metadata"]["namespace"]
    cluster = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-gateway")]
    if len(cluster) != 1:
        return [f"{len(cluster)} gateway ClusterRoles, want 1"]
    granted, problems = grants(cluster[0], "ClusterRole", allow_named_secrets=False)
    # Namespaces' metadata, only for the per-namespace rate limits that read it.
    wanted = GATEWAY_RULES | (NAMESPACE_LIMIT_RULES if "--namespace-rate-limits" in container_args(deploy) else set())
    out += problems + exactly(granted, wanted, "ClusterRole")
    out += bound_to_gateway(objs, "ClusterRoleBinding", cluster[0], sa, ns)
    roles = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-gateway")]
    if len(roles) != 1 or roles[0]["metadata"].get("namespace") != ns:
        return out + [f"gateway Roles {[(r['metadata'].get('namespace'), r['metadata']['name']) for r in roles]}, want one in {ns}"]
    rules = roles[0].get("rules") or []
    catalog = [r for r in rules if CATALOG_CONFIGMAP in (r.get("resourceNames") or [])]
    if catalog != [CATALOG_RULE]:
        out.append(f"Role: catalog rules {catalog}, want exactly [{CATALOG_RULE}]")
    others = dict(roles[0], rules=[r for r in rules if r not in catalog])
    granted, problems = grants(others, "Role", allow_named_secrets=True)
    out += problems + exactly(granted, GATEWAY_NAMESPACE_RULES, "Role")
    out += bound_to_gateway(objs, "RoleBinding", roles[0], sa, ns)
    return out


def pod_problems(objs, deploy):
    out = []
    ns = deploy["metadata"]["namespace"]
    spec = deploy["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = container_args(deploy)
    if args[:1] != ["gateway"]:
        out.append(f"args start {args[:1]}, want the gateway subcommand")
    if flag_values(args, "--listen") != ["0.0.0.0:8090"]:
        out.append(f"--listen {flag_values(args, '--listen')}, want [0.0.0.0:8090]")
    controllers = [o for o in objs if o["kind"] == "Deployment"
                   and o["spec"]["template"]["metadata"]["labels"].get(COMPONENT) == "controller"]
    if controllers:
        want = flag_values(container_args(controllers[0]), "--artifact-endpoint")
        if flag_values(args, "--artifact-endpoint") != want:
            out.append(f"--artifact-endpoint {flag_values(args, '--artifact-endpoint')}, the controller's is {want}")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    keyfile = flag_values(args, "--token-key-file")
    if len(keyfile) != 1:
        out.append(f"--token-key-file {keyfile}, want one")
    else:
        directory, _, name = keyfile[0].rpartition("/")
        m = mounts.get(directory)
        vol = volumes.get(m["name"]) if m else None
        if not m or m.get("readOnly") is not True:
            out.append(f"the token key directory {directory} is not a read-only mount")
        elif not vol or "secret" not in vol:
            out.append(f"{directory} is not a Secret volume")
        else:
            secret = vol["secret"]
            secret_names = {v["secret"]["secretName"] for o in controllers
                            for v in o["spec"]["template"]["spec"]["volumes"] if "secret" in v}
            if controllers and secret["secretName"] not in secret_names:
                out.append(f"token key Secret {secret['secretName']}, the controller mounts {secret_names}")
            if [i["path"] for i in secret.get("items") or []] != [name]:
                out.append(f"the Secret volume does not project {name}")
    svc = deploy["metadata"]["name"]
    hosts = flag_values(args, "--allowed-host")
    for h in (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"):
        if h not in hosts:
            out.append(f"--allowed-host lacks {h}")
    if flag_values(args, "--cache-dir") != [CACHE_DIR]:
        out.append(f"--cache-dir {flag_values(args, '--cache-dir')}, want [{CACHE_DIR}]")
    cache = mounts.get(CACHE_DIR)
    cache_vol = volumes.get(cache["name"]) if cache else None
    if not cache_vol or "emptyDir" not in cache_vol or "sizeLimit" not in cache_vol["emptyDir"]:
        out.append(f"{CACHE_DIR} is not an emptyDir with a sizeLimit")
    else:
        limit = quantity_bytes(cache_vol["emptyDir"]["sizeLimit"])
        max_bytes = flag_values(args, "--cache-max-bytes")
        if len(max_bytes) != 1 or not max_bytes[0].isdigit() or not 0 < int(max_bytes[0]) <= limit:
            out.append(f"--cache-max-bytes {max_bytes} is not a whole number within the volume's {limit} bytes")
    for flag, allowed in (("--confirm", {"ask", "auto", "refuse"}), ("--on-disconnect", {"cancel", "keep"})):
        got = flag_values(args, flag)
        if len(got) != 1 or got[0] not in allowed:
            out.append(f"{flag} {got}, want one of {sorted(allowed)}")
    ports = c.get("ports") or []
    if [(p.get("name"), p.get("containerPort")) for p in ports] != [("mcp", 8090)]:
        out.append(f"container ports {ports}, want mcp 8090 only")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or get.get("port") not in ("mcp", 8090):
            out.append(f"{probe} {get}, want {path} on mcp/8090")
    if spec.get("automountServiceAccountToken") is not True:
        projected = [v for v in spec.get("volumes") or []
                     if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources") or [])]
        if not projected:
            out.append("no ServiceAccount token (the gateway calls TokenReview and SubjectAccessReview)")
    return out


def service_problems(objs, deploy):
    svcs = [s for s in of_component(objs, "Service", "gateway")]
    if len(svcs) != 1:
        return [f"{len(svcs)} gateway Services, want 1"]
    s = svcs[0]
    out = []
    if s["metadata"]["name"] != deploy["metadata"]["name"]:
        out.append(f"Service {s['metadata']['name']} != Deployment {deploy['metadata']['name']} (the allowed Host names)")
    ports = [(p.get("name"), p.get("port"), p.get("targetPort")) for p in s["spec"]["ports"]]
    if ports != [("mcp", 8090, "mcp")]:
        out.append(f"ports {ports}, want [('mcp', 8090, 'mcp')]")
    if s["spec"]["selector"] != deploy["spec"]["selector"]["matchLabels"]:
        out.append(f"selector {s['spec']['selector']} != the gateway pods' {deploy['spec']['selector']['matchLabels']}")
    return out


def pdb_problems(objs, deploy):
    pdbs = [p for p in objs if p["kind"] == "PodDisruptionBudget"
            and p["spec"]["selector"].get("matchLabels") == deploy["spec"]["selector"]["matchLabels"]]
    replicas = deploy["spec"]["replicas"]
    if replicas <= 1:
        return [f"a PodDisruptionBudget with {replicas} replica(s) would only block drains"] if pdbs else []
    if len(pdbs) != 1:
        return [f"{len(pdbs)} PodDisruptionBudgets for {replicas} replicas, want 1"]
    p = pdbs[0]["spec"]
    return [] if p.get("minAvailable") == 1 and "maxUnavailable" not in p else [f"PDB spec {p}, want minAvailable 1"]


def netpol_problems(objs, deploy):
    pols = [p for p in objs if p["kind"] == "NetworkPolicy"
            and p["spec"]["podSelector"].get("matchLabels") == deploy["spec"]["selector"]["matchLabels"]]
    if not pols:
        return []
    if len(pols) != 1:
        return [f"{len(pols)} NetworkPolicies select the gateway pods"]
    spec = pols[0]["spec"]
    out = []
    if sorted(spec.get("policyTypes") or []) != ["Egress", "Ingress"]:
        out.append(f"policyTypes {spec.get('policyTypes')}")
    for rule in spec.get("ingress") or []:
        ports = [(p.get("protocol", "TCP"), p.get("port")) for p in rule.get("ports") or []]
        if ports != [("TCP", 8090)]:
            out.append(f"ingress rule on ports {ports}, want TCP 8090 only")
    if not spec.get("ingress"):
        out.append("no ingress rule: agents could not connect")
    ns = deploy["metadata"]["namespace"]
    artifacts = [o for o in objs if o["kind"] == "Deployment"
                 and o["spec"]["template"]["metadata"]["labels"].get(COMPONENT) == "artifacts"]
    saw_artifacts = saw_dns = False
    # The trace collector's rule is allowed on the port the gateway exports to, when it exports.
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0].get("env") or []}
    endpoint = urllib.parse.urlsplit(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "")
    collector_port = (endpoint.port or (443 if endpoint.scheme == "https" else 4318)) if endpoint.scheme else None
    for rule in spec.get("egress") or []:
        to, ports = rule.get("to"), rule.get("ports")
        if not to or not ports:
            out.append(f"an egress rule without peers or ports (allow-all): {rule}")
            continue
        numbers = {p.get("port") for p in ports}
        for peer in to:
            if "ipBlock" in peer:
                if 53 in numbers:
                    out.append(f"DNS to an ipBlock {peer['ipBlock']}")
                continue
            sel = (peer.get("podSelector") or {}).get("matchLabels")
            nsel = (peer.get("namespaceSelector") or {}).get("matchLabels")
            if not sel:
                out.append(f"an egress peer without pod labels (every pod of {nsel}): {peer}")
            if artifacts and sel == artifacts[0]["spec"]["selector"]["matchLabels"]:
                saw_artifacts = True
                if nsel != {"kubernetes.io/metadata.name": ns} or numbers != {8443}:
                    out.append(f"the artifact endpoint rule: namespace {nsel}, ports {numbers}")
            elif numbers == {53}:
                saw_dns = True
            elif collector_port is not None and numbers == {collector_port}:
                pass
            else:
                out.append(f"egress to pods {sel} on {numbers}")
    if artifacts and not saw_artifacts:
        out.append("no egress rule to the artifact endpoint pods")
    if not saw_dns:
        out.append("no DNS egress rule")
    return out


def checks(objs):
    """[(name, problems)] for the gateway objects; [] when no gateway is rendered."""
    deploy = gateway_deployment(objs)
    if deploy is None:
        stray = [f"{o['kind']}/{o['metadata']['name']}" for o in objs
                 if (o["metadata"].get("labels") or {}).get(COMPONENT) == "gateway"]
        return [("gateway-objects", [f"{s} without a gateway Deployment" for s in stray])] if stray else []
    return [
        ("gateway-rbac", rbac_problems(objs, deploy)),
        ("gateway-pod", pod_problems(objs, deploy)),
        ("gateway-service", service_problems(objs, deploy)),
        ("gateway-pdb", pdb_problems(objs, deploy)),
        ("gateway-netpol", netpol_problems(objs, deploy)),
    ]


def register(expect):
    @expect("gateway")
    def _(objs, value):
        assert value == "absent", value
        deploy = gateway_deployment(objs)
        return [f"a gateway Deployment {deploy['metadata']['name']}"] if deploy else []

    @expect("gateway-arg")
    def _(objs, value):
        deploy = gateway_deployment(objs)
        if deploy is None:
            return ["no gateway Deployment"]
        args = container_args(deploy)
        return [] if value in args else [f"gateway args {args} lack {value}"]

    @expect("no-gateway-arg")
    def _(objs, value):
        deploy = gateway_deployment(objs)
        if deploy is None:
            return ["no gateway Deployment"]
        return [f"gateway args contain {a}" for a in container_args(deploy) if a.startswith(value)]

    @expect("gateway-pull-secrets")
    def _(objs, value):
        # The Secret names the gateway's Role may get ("" for none).
        want = sorted(value.split(",")) if value else []
        got = sorted(n for r in objs if r["kind"] == "Role" and r["metadata"]["name"].endswith("-gateway")
                     for rule in r.get("rules") or [] if "secrets" in (rule.get("resources") or [])
                     for n in rule.get("resourceNames") or ["<every Secret>"])
        return [] if got == want else [f"gateway Role gets Secrets {got}, want {want}"]

    @expect("gateway-catalog")
    def _(objs, value):
        # The namespaces whose gateway Role reads the catalog ConfigMap.
        got = sorted(r["metadata"].get("namespace") for r in objs
                     if r["kind"] == "Role" and r["metadata"]["name"].endswith("-gateway") and CATALOG_RULE in (r.get("rules") or []))
        return [] if got == [value] else [f"the catalog ConfigMap rule is in the gateway Roles of {got}, want [{value}]"]

    @expect("gateway-pdb")
    def _(objs, value):
        got = "present" if of_component(objs, "PodDisruptionBudget", "gateway") else "absent"
        return [] if got == value else [f"gateway PodDisruptionBudget {got}, want {value}"]

    @expect("gateway-netpol")
    def _(objs, value):
        got = "present" if of_component(objs, "NetworkPolicy", "gateway") else "absent"
        return [] if got == value else [f"gateway NetworkPolicy {got}, want {value}"]
