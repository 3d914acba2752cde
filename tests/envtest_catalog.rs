//! The catalog kept in the cluster, against a real kube-apiserver:
//!
//! - `catalog refresh --cluster` (the binary, through KUBECONFIG) writes the
//!   ConfigMap, and `catalog search --cluster` reads it back;
//! - a refresh refused (a catalog over the ConfigMap cap, a file that is not
//!   a catalog) leaves the ConfigMap exactly as it was, and says why;
//! - the gateway's watch, as a ServiceAccount holding only the chart's rule
//!   (get/list/watch on that one name), loads the catalog and follows a
//!   refresh: list and watch by resourceNames work through the field selector.
//!
//! SKIPPED without KUBEBUILDER_ASSETS.

// Only the API server start is used here, not the CRD and controller helpers.
#[allow(dead_code)]
#[path = "envtest/harness.rs"]
mod harness;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use skill_operator::catalog::cluster::{CONFIGMAP_NAME, MAX_CONFIGMAP_GZIP_BYTES};
use skill_operator::catalog::live::LiveCatalog;
use skill_operator::catalog::model::{Catalog, Entry, Files, Repository};
use skill_operator::catalog::store::Origin;
use skill_operator::shutdown::Shutdown;

const NS: &str = "skills-system";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const GATEWAY: &str = "gateway";

fn catalog(names: &[String], description: impl Fn(usize) -> String) -> Catalog {
    let url = "https://github.com/acme/skills";
    let entries = names
        .iter()
        .enumerate()
        .map(|(i, name)| Entry {
            id: format!("acme/skills/{name}"),
            repository: url.into(),
            path: format!("skills/{name}"),
            commit: COMMIT.into(),
            name: name.clone(),
            description: description(i),
            author: None,
            license: None,
            category: None,
            files: Files { count: 1, bytes: 10 },
            scripts: Vec::new(),
            requirements: Vec::new(),
        })
        .collect();
    Catalog::new(vec![Repository { url: url.into(), commit: COMMIT.into(), skills: names.len() }], entries)
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("skill{i}")).collect()
}

/// The binary's `catalog …` with KUBECONFIG at the test's API server: (success, stdout, stderr).
fn cli(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skill-operator"))
        .arg("catalog")
        .args(args)
        .args(["--cluster", "--namespace", NS])
        .env("KUBECONFIG", kubeconfig)
        .env_remove("SKILL_OPERATOR_CATALOG")
        .output()
        .expect("run skill-operator");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

async fn resource_version(api: &Api<ConfigMap>) -> Option<String> {
    api.get_opt(CONFIGMAP_NAME).await.unwrap().and_then(|cm| cm.metadata.resource_version)
}

/// Grant `system:serviceaccount:NS:gateway` the chart's catalog rule only,
/// and a client acting as it.
async fn gateway_client(client: &kube::Client, kubeconfig: &Path) -> kube::Client {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": { "name": "catalog", "namespace": NS },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIGMAP_NAME], "verbs": ["get", "list", "watch"] }],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": "catalog", "namespace": NS },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "catalog" },
        "subjects": [{ "kind": "ServiceAccount", "name": GATEWAY, "namespace": NS }],
    });
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(client.clone(), NS);
    roles.create(&PostParams::default(), &serde_json::from_value(role).unwrap()).await.unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> = Api::namespaced(client.clone(), NS);
    bindings.create(&PostParams::default(), &serde_json::from_value(binding).unwrap()).await.unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(kubeconfig).unwrap(), &KubeConfigOptions::default()).await.unwrap();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{NS}:{GATEWAY}"));
    config.auth_info.impersonate_groups = Some(vec!["system:serviceaccounts".into(), "system:authenticated".into()]);
    kube::Client::try_from(config).unwrap()
}

async fn until(what: &str, check: impl Fn() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen in 20 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_writes_the_cluster_catalog_whole_or_not_at_all_and_the_gateway_follows_it() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the cluster catalog", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::create_namespace(&client, NS, false).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let dir = tempfile::tempdir().unwrap();

    // The gateway's watch, as the gateway's ServiceAccount with only the chart's rule.
    let as_gateway = gateway_client(&client, &env.kubeconfig).await;
    let others: Api<ConfigMap> = Api::namespaced(as_gateway.clone(), NS);
    assert!(others.get_opt("kube-root-ca.crt").await.is_err(), "the rule reads one ConfigMap, no other");
    let live = Arc::new(LiveCatalog::from_snapshot().unwrap());
    let shutdown = Shutdown::default();
    skill_operator::gateway::catalog_watch::spawn(as_gateway, NS, live.clone(), shutdown.clone());

    // Nothing stored: the commands read the embedded snapshot.
    let (ok, _, stderr) = cli(&env.kubeconfig, &["search", "pdf"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("the embedded snapshot"), "{stderr}");

    // A refresh writes the ConfigMap; search reads it back.
    let first = dir.path().join("first.json.gz");
    catalog(&names(2), |i| ["Edit Excel spreadsheets.", "Fill PDF forms."][i].into()).save(&first).unwrap();
    let (ok, stdout, stderr) = cli(&env.kubeconfig, &["refresh", "--from", first.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(&format!("refreshed ConfigMap {NS}/{CONFIGMAP_NAME}: 2 entries")), "{stdout}");
    let (ok, stdout, stderr) = cli(&env.kubeconfig, &["search", "spreadsheets", "--json"]);
    assert!(ok, "{stderr}");
    let found: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(found["total"], 1, "{found}");
    assert_eq!(found["results"][0]["id"], "acme/skills/skill0");
    let (ok, stdout, stderr) = cli(&env.kubeconfig, &["install", "acme/skills/skill1"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(COMMIT) && stdout.contains("path: skills/skill1"), "{stdout}");
    until("the gateway loading the cluster's catalog", || live.load().searcher.catalog().entries.len() == 2).await;
    assert_eq!(live.load().origin, Origin::Stored(format!("ConfigMap {NS}/{CONFIGMAP_NAME}")));

    // Refused refreshes leave the ConfigMap exactly as it was, and say why.
    let written = resource_version(&configmaps).await;
    let noise = |i: usize| (0..80).map(|j| format!("{:032x}", unpredictable(i * 100 + j))).collect::<String>();
    let over = dir.path().join("over.json.gz");
    catalog(&names(800), noise).save(&over).unwrap();
    assert!(std::fs::metadata(&over).unwrap().len() as usize > MAX_CONFIGMAP_GZIP_BYTES, "the file itself is over the cap");
    let not_catalog = dir.path().join("not.json");
    std::fs::write(&not_catalog, br#"{"schema": "something/else"}"#).unwrap();
    for (file, why) in [(&over, "a ConfigMap holds at most 900 KiB"), (&not_catalog, "is not a usable catalog")] {
        let (ok, _, stderr) = cli(&env.kubeconfig, &["refresh", "--from", file.to_str().unwrap()]);
        assert!(!ok, "{} was accepted", file.display());
        assert!(stderr.contains(why), "{stderr}");
        assert!(stderr.contains(&format!("the catalog in ConfigMap {NS}/{CONFIGMAP_NAME} (built")), "{stderr}");
        assert!(stderr.contains("stays in use"), "{stderr}");
        assert_eq!(resource_version(&configmaps).await, written, "the ConfigMap was not written");
    }

    // A second refresh replaces it (an update of the version read), and the gateway follows.
    let second = dir.path().join("second.json");
    catalog(&names(3), |_| "Edit documents.".into()).save(&second).unwrap();
    let (ok, _, stderr) = cli(&env.kubeconfig, &["refresh", "--from", second.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert_ne!(resource_version(&configmaps).await, written);
    until("the gateway following the refresh", || live.load().searcher.catalog().entries.len() == 3).await;

    // Deleted: the snapshot serves again.
    configmaps.delete(CONFIGMAP_NAME, &Default::default()).await.unwrap();
    until("the gateway going back to the snapshot", || live.load().origin == Origin::Snapshot).await;
    shutdown.trigger();
}

/// Sixteen bytes that gzip cannot predict, from `n` (a hash, not for security).
fn unpredictable(n: usize) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut a = std::collections::hash_map::DefaultHasher::new();
    n.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    (n, a.finish()).hash(&mut b);
    ((a.finish() as u128) << 64) | b.finish() as u128
}
