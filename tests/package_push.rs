//! `skill-operator package push` against a real registry: the pushed
//! artifact pulls back byte-identical to a local build, is pinned by digest
//! in the printed SkillPackage, and nothing from the package runs.

#[path = "oci/common.rs"]
mod common;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

#[tokio::test]
async fn push_prints_a_pinned_skillpackage_and_pulls_back_identical() {
    let registry = common::TestRegistry::start().await;
    let host = registry.reference("x").split('/').next().unwrap().to_string();
    let sample = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills/csv-stats");
    // A marker the package would create if anything in it ran on import.
    let out = Command::new(BIN)
        .args(["package", "push"])
        .arg(&sample)
        .args(["--registry", &format!("{host}/skills"), "--tag", "1.0.0", "--plain-http"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let digest = stdout.lines().find_map(|l| l.strip_prefix("# digest: ")).unwrap().to_string();
    let pkg: skill_operator::api::SkillPackage =
        serde_norway::from_str(stdout.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n").as_str()).unwrap();
    assert_eq!(pkg.spec.source.oci.reference, format!("{host}/skills/csv-stats@{digest}"));
    assert!(pkg.metadata.name.unwrap().starts_with("csv-stats-"));

    let pulled = registry.registry().pull(&format!("{host}/skills/csv-stats:1.0.0")).await.unwrap();
    assert_eq!(pulled.digest, digest);
    assert_eq!(pulled.package, skill_operator::core::package::build_from_dir(&sample).unwrap(), "not byte-identical to a local build");
    assert_eq!(pulled.config.name, "csv-stats");

    // Pushing the same directory again gives the same digest (deterministic artifact).
    let again = Command::new(BIN)
        .args(["package", "push"])
        .arg(&sample)
        .args(["--registry", &format!("{host}/skills"), "--tag", "again", "--plain-http"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains(&digest));
}

#[tokio::test]
async fn push_refuses_a_directory_without_a_servable_name() {
    let registry = common::TestRegistry::start().await;
    let host = registry.reference("x").split('/').next().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("SKILL.md"), "---\nname: has space\ndescription: d\n---\n").unwrap();
    let out = Command::new(BIN)
        .args(["package", "push"])
        .arg(dir.path())
        .args(["--registry", &format!("{host}/skills"), "--plain-http"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be served"), "{}", String::from_utf8_lossy(&out.stderr));
}
