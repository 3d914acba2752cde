//! Schema validation of the generated Job, NetworkPolicy and ServiceAccount
//! with the PyPI `kubernetes-validate` tool (strict: unknown fields fail),
//! against v1.34 (the policy version the builders target) and v1.37 (the
//! newest the tool and k8s-openapi know).
//!
//! The tool comes from `scripts/install-test-deps.sh`
//! (`target/test-deps/venv/bin/kubernetes-validate`); `KUBERNETES_VALIDATE`
//! overrides the path. A missing tool fails the test: it is never skipped.

#[path = "builders/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use common::*;
use skill_operator::controller::builders::{build_build_job, build_job, build_network_policies, build_service_account, NetPolParams, Peer};

const KUBERNETES_VERSIONS: [&str; 2] = ["1.34.0", "1.37.0"];

fn tool() -> PathBuf {
    let path = std::env::var_os("KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-deps/venv/bin/kubernetes-validate"));
    assert!(
        path.is_file(),
        "kubernetes-validate not found at {}: run `scripts/install-test-deps.sh` (as root) to install the test \
         dependencies, or point KUBERNETES_VALIDATE at the tool",
        path.display()
    );
    path
}

/// Every manifest worth validating: the golden fixtures plus the whole
/// JobParams grid with a policy per job.
fn manifests() -> Vec<(String, serde_json::Value)> {
    let mut out: Vec<(String, serde_json::Value)> = vec![
        ("job-minimal".into(), serde_json::to_value(build_job(&params())).unwrap()),
        ("job-full".into(), serde_json::to_value(build_job(&params_full())).unwrap()),
        (
            "serviceaccount".into(),
            serde_json::to_value(build_service_account("skill-runner", NS, &BTreeMap::from([("team".into(), "a".into())]))).unwrap(),
        ),
        ("job-prepared".into(), serde_json::to_value(build_job(&params_prepared())).unwrap()),
        ("job-image-volume".into(), serde_json::to_value(build_job(&params_image_volume())).unwrap()),
        ("build-job".into(), serde_json::to_value(build_build_job(&build_params())).unwrap()),
        ("build-job-full".into(), serde_json::to_value(build_build_job(&build_params_full())).unwrap()),
        (
            "build-networkpolicy".into(),
            serde_json::to_value(skill_operator::controller::builders::build_job::build_network_policy(&build_netpol_params())).unwrap(),
        ),
    ];
    let policies = [
        ("netpol-minimal", netpol_params()),
        ("netpol-egress", netpol_params_egress()),
        ("netpol-egress-dns", NetPolParams { dns: Some(Peer::kube_dns()), ..netpol_params_egress() }),
    ];
    for (name, params) in policies {
        for (i, policy) in build_network_policies(&params).into_iter().enumerate() {
            out.push((format!("{name}-{i}"), serde_json::to_value(policy).unwrap()));
        }
    }
    for (i, p) in grid().into_iter().enumerate() {
        out.push((format!("grid-{i:03}-job"), serde_json::to_value(build_job(&p)).unwrap()));
        let np = if p.egress_proxy.is_some() { netpol_params_egress() } else { netpol_params() };
        np.validate().unwrap();
        for (k, policy) in build_network_policies(&np).into_iter().enumerate() {
            out.push((format!("grid-{i:03}-netpol-{k}"), serde_json::to_value(policy).unwrap()));
        }
    }
    out
}

#[test]
fn manifests_pass_kubernetes_validate_strict() {
    let tool = tool();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (name, value) in manifests() {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
        files.push(path);
    }
    for version in KUBERNETES_VERSIONS {
        let out = Command::new(&tool)
            .args(["--strict", "-k", version])
            .args(&files)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e} (reinstall with scripts/install-test-deps.sh)", tool.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let report = format!("kubernetes-validate -k {version}:\n{stdout}{stderr}");
        assert!(out.status.success(), "{report}");
        let passed = stdout.lines().filter(|l| l.starts_with("INFO") && l.contains(" passed ")).count();
        assert_eq!(passed, files.len(), "every file must pass\n{report}");
        let complaints: Vec<&str> =
            stdout.lines().chain(stderr.lines()).filter(|l| !(l.starts_with("INFO") && l.contains(" passed "))).collect();
        assert!(complaints.is_empty(), "warnings or errors:\n{}", complaints.join("\n"));
    }
}

#[test]
fn kubernetes_validate_rejects_a_broken_manifest() {
    // Proves the tool is really checking (strict mode, right schema).
    let tool = tool();
    let dir = tempfile::tempdir().unwrap();
    let mut job = serde_json::to_value(build_job(&params())).unwrap();
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = true.into();
    job["spec"]["backoffLimit"] = "zero".into();
    let path = dir.path().join("broken.json");
    std::fs::write(&path, job.to_string()).unwrap();
    let out = Command::new(&tool).args(["--strict", "-k", KUBERNETES_VERSIONS[0]]).arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("readOnlyRootFileSystem") || stdout.contains("zero"), "{stdout}");
}
