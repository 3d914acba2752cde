#!/usr/bin/env python3
"""Validate the sample manifests in config/samples/k8s without a cluster.

usage: validate_samples.py SAMPLES_DIR CRD_DIR BUILTIN_OUT.yaml

- Custom resources (group skill-operator.dev) are validated against their
  CRD's openAPIV3Schema with jsonschema, made as strict as the API server's
  strict field validation (`kubectl apply --validate=strict`): every object
  schema with `properties` refuses unknown fields, `nullable` allows null.
  CEL rules (x-kubernetes-validations) are not evaluated: the CRDs' only
  rules are `self == oldSelf` immutability checks, which cannot fail on create.
  Scope is checked too (cluster-scoped kinds carry no namespace).
- References between the samples must resolve: binding -> package, job ->
  binding, env grant -> Secret key, job script -> the package's allowedScripts,
  namespaced objects -> a sample Namespace.
- RBAC samples: a RoleBinding's Role and ServiceAccounts are among the
  samples (same namespace); Role rules on skill-operator.dev name resources
  its CRDs define and grant only what the gateway checks for an agent (get
  skillbindings; create/get/delete skilljobs); no rule touches Secrets or
  uses a wildcard.
- Built-in kinds are written to BUILTIN_OUT.yaml for `kubernetes-validate --strict`.

Prints "ok"/"FAIL" lines and exits 1 on any failure.
"""
import copy
import glob
import os
import re
import sys

import jsonschema
import yaml

GROUP = "skill-operator.dev"
# What the MCP gateway asks a SubjectAccessReview about for an agent: the most
# an agent sample Role may grant (config/samples/k8s/agent-rbac.yaml).
AGENT_VERBS = {"skillbindings": {"get"}, "skilljobs": {"create", "get", "delete"}}
# The chart's controller ServiceAccount for the release and namespace the
# samples assume (skill-operator in skill-operator). A namespace may grant it
# `get` on named Secrets of its own, for warm runs granted variables
# (config/samples/k8s/warm-secrets-rbac.yaml); nothing else may touch Secrets.
CONTROLLER_SA = ("skill-operator", "skill-operator-controller")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def strict(schema):
    """openAPIV3Schema -> JSON Schema with unknown fields refused."""
    s = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        node.pop("x-kubernetes-validations", None)
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for v in node.get("properties", {}).values():
            walk(v)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])
    walk(s)
    # The object envelope: what the API server accepts besides spec/status.
    s["properties"].update({
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    })
    return s


def rbac_problems(objs, named, plurals):
    out = []
    roles, accounts, secrets = named("Role"), named("ServiceAccount"), named("Secret")
    subjects = {}
    for (ns, name), b in named("RoleBinding").items():
        ref = b["roleRef"]
        if ref.get("kind") != "Role" or (ns, ref.get("name")) not in roles:
            out.append(f"RoleBinding {name}: roleRef {ref} is not a sample Role in {ns}")
        for sub in b.get("subjects") or []:
            who = (sub.get("namespace"), sub.get("name"))
            subjects.setdefault((ns, ref.get("name")), set()).add(who if sub.get("kind") == "ServiceAccount" else None)
            if sub.get("kind") != "ServiceAccount" or (who not in accounts and who != CONTROLLER_SA):
                out.append(f"RoleBinding {name}: subject {sub} is not a sample ServiceAccount")
    for (ns, name), r in roles.items():
        for rule in r.get("rules") or []:
            groups, resources, verbs = rule.get("apiGroups") or [], rule.get("resources") or [], rule.get("verbs") or []
            if "*" in groups + resources + verbs:
                out.append(f"Role {name}: a wildcard in {rule}")
            if "secrets" in resources:
                names = rule.get("resourceNames") or []
                only_controller = subjects.get((ns, name), set()) <= {CONTROLLER_SA}
                if verbs != ["get"] or not names or any((ns, n) not in secrets for n in names) or not only_controller:
                    out.append(f"Role {name}: a rule on Secrets other than get on named sample Secrets for the controller")
            if GROUP not in groups:
                continue
            for res in resources:
                if res not in plurals:
                    out.append(f"Role {name}: {GROUP} has no resource {res!r} (CRD plurals: {sorted(plurals)})")
                extra = set(verbs) - AGENT_VERBS.get(res, set())
                if extra:
                    out.append(f"Role {name}: {sorted(extra)} on {res}, beyond what the gateway checks for an agent")
    return out


def main():
    samples_dir, crd_dir, builtin_out = sys.argv[1:4]
    crds, plurals = {}, set()
    for path in glob.glob(os.path.join(crd_dir, "*.yaml")):
        with open(path) as f:
            crd = yaml.safe_load(f)
        for v in crd["spec"]["versions"]:
            crds[(f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])] = (
                crd["spec"]["scope"], strict(v["schema"]["openAPIV3Schema"]))
        plurals.add(crd["spec"]["names"]["plural"])

    fails, oks = [], 0
    builtin, objs = [], []
    for path in sorted(glob.glob(os.path.join(samples_dir, "*.yaml"))):
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        if not docs:
            fails.append(f"{path}: no documents")
        for d in docs:
            objs.append(d)
            if d.get("apiVersion", "").split("/")[0] != GROUP:
                builtin.append(d)
                continue
            md = d.get("metadata") or {}
            name = md.get("name") or md.get("generateName", "").rstrip("-") or "?"
            where = f"{os.path.basename(path)} {d.get('kind')}/{name}"
            key = (d["apiVersion"], d.get("kind"))
            if key not in crds:
                fails.append(f"{where}: no CRD for {key}")
                continue
            scope, schema = crds[key]
            errs = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                    for e in jsonschema.Draft7Validator(schema).iter_errors(d)]
            if not DNS_SUBDOMAIN.match(name):
                errs.append(f"name {name!r} is not a DNS subdomain")
            if scope == "Cluster" and "namespace" in md:
                errs.append("cluster-scoped object has a namespace")
            if scope == "Namespaced" and not md.get("namespace"):
                errs.append("namespaced object without metadata.namespace")
            if errs:
                fails.extend(f"{where}: {e}" for e in errs)
            else:
                oks += 1
                print(f"ok   {where} (CRD schema, strict)")

    # References between the samples.
    def named(kind):
        return {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                for o in objs if o.get("kind") == kind and "name" in o["metadata"]}
    namespaces = {n for (_, n) in named("Namespace")}
    packages = {n: o for (_, n), o in named("SkillPackage").items()}
    bindings, secrets = named("SkillBinding"), named("Secret")
    refs = []
    for o in objs:
        ns = o["metadata"].get("namespace")
        if ns and ns not in namespaces:
            refs.append(f"{o['kind']} in namespace {ns}, which no sample creates")
    for (ns, name), b in bindings.items():
        if b["spec"]["package"] not in packages:
            refs.append(f"SkillBinding {name}: package {b['spec']['package']} not among the samples")
        for g in b["spec"].get("env", []):
            ref = g["secretKeyRef"]
            s = secrets.get((ns, ref["name"]))
            if s is None or ref["key"] not in {**s.get("data", {}), **s.get("stringData", {})}:
                refs.append(f"SkillBinding {name}: Secret {ref['name']} key {ref['key']} not among the samples")
    for j in (o for o in objs if o.get("kind") == "SkillJob"):
        b = bindings.get((j["metadata"].get("namespace"), j["spec"]["binding"]))
        if b is None:
            refs.append(f"SkillJob: binding {j['spec']['binding']} not among the samples")
            continue
        runtime = (packages.get(b["spec"]["package"]) or {}).get("spec", {}).get("runtime") or {}
        if j["spec"]["script"] not in runtime.get("allowedScripts", []):
            refs.append(f"SkillJob: script {j['spec']['script']} not in the package's allowedScripts")
    if refs:
        fails.extend(refs)
    else:
        oks += 1
        print("ok   references between the samples resolve")

    rbac = rbac_problems(objs, named, plurals)
    if rbac:
        fails.extend(rbac)
    elif named("Role") or named("RoleBinding"):
        oks += 1
        print("ok   RBAC samples: bindings resolve, agent Roles grant only the gateway's verbs")

    with open(builtin_out, "w") as f:
        yaml.safe_dump_all(builtin, f, sort_keys=False)
    for e in fails:
        print(f"FAIL {e}")
    print(f"{oks} passed, {len(fails)} failed ({len(builtin)} built-in objects written to {builtin_out})")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
