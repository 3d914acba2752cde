//! Golden manifests: fixed parameters serialised to pretty JSON and compared
//! byte for byte with `tests/golden/*.json`. After an intended change, run
//! `UPDATE_GOLDEN=1 cargo test --test builders_golden` and review the diff.

#[path = "builders/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::*;
use skill_operator::controller::builders::{build_build_job, build_job, build_network_policies, build_service_account, NetPolParams, Peer};

/// Every golden file and the object it must match.
pub fn golden_manifests() -> Vec<(&'static str, serde_json::Value)> {
    let json = |v: &dyn erased::Ser| v.value();
    vec![
        ("job-minimal.json", json(&build_job(&params()))),
        ("job-env-egress.json", json(&build_job(&params_full()))),
        // A namespace's run policies without an egress proxy: the sealing one alone.
        ("networkpolicy-minimal.json", json(&build_network_policies(&netpol_params()))),
        (
            "networkpolicy-egress-dns.json",
            json(&build_network_policies(&NetPolParams { dns: Some(Peer::kube_dns()), ..netpol_params_egress() })),
        ),
        // What the controller builds with an egress proxy: the proxy for runs granted egress, never DNS.
        ("networkpolicy-egress.json", json(&build_network_policies(&netpol_params_egress()))),
        ("serviceaccount.json", json(&build_service_account("skill-runner", NS, &BTreeMap::from([("team".into(), "a".into())])))),
        ("job-prepared.json", json(&build_job(&params_prepared()))),
        ("job-image-volume.json", json(&build_job(&params_image_volume()))),
        ("build-job.json", json(&build_build_job(&build_params()))),
        ("build-job-full.json", json(&build_build_job(&build_params_full()))),
        ("build-networkpolicy.json", json(&skill_operator::controller::builders::build_job::build_network_policy(&build_netpol_params()))),
    ]
}

mod erased {
    pub(crate) trait Ser {
        fn value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for T {
        fn value(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("k8s-openapi objects serialise")
        }
    }
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn manifests_match_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for (file, value) in golden_manifests() {
        let text = serde_json::to_string_pretty(&value).unwrap() + "\n";
        let path = golden_dir().join(file);
        if update {
            std::fs::create_dir_all(golden_dir()).unwrap();
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Err(e) => failures.push(format!("{}: {e}", path.display())),
            Ok(golden) if golden != text => {
                let line =
                    golden.lines().zip(text.lines()).position(|(a, b)| a != b).unwrap_or(golden.lines().count().min(text.lines().count()));
                failures.push(format!(
                    "{file} differs from line {}:\n  golden: {:?}\n  now:    {:?}",
                    line + 1,
                    golden.lines().nth(line).unwrap_or("<eof>"),
                    text.lines().nth(line).unwrap_or("<eof>")
                ));
            }
            Ok(_) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\nIf the change is intended, run `UPDATE_GOLDEN=1 cargo test --test builders_golden` and review the diff.",
        failures.join("\n")
    );
}

#[test]
fn golden_files_are_exactly_the_known_set() {
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        return; // the other test is (re)writing them concurrently
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(golden_dir())
        .expect("tests/golden exists (UPDATE_GOLDEN=1 creates it)")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json"))
        .collect();
    on_disk.sort();
    let mut known: Vec<String> = golden_manifests().into_iter().map(|(f, _)| f.to_string()).collect();
    known.sort();
    assert_eq!(on_disk, known, "stale or missing golden files");
}
