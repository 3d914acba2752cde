//! The generated skill the gateway benchmarks serve: a declaration with
//! one granted env variable, a script and a few reference files; and its
//! SkillPackage as the controller leaves it once pushed.

use std::path::{Path, PathBuf};

/// One skill directory `<root>/<name>`; `bench` names the benchmark in its description.
pub(crate) fn skill(root: &Path, name: &str, bench: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::create_dir_all(dir.join("references")).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        format!("---\nname: {name}\ndescription: Generated skill {name} for the {bench} benchmark.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/run.py\n      interpreter: python\n      env: [API_KEY]\n---\n# {name}\n\nRun scripts/run.py.\n"),
    )
    .unwrap();
    std::fs::write(dir.join("scripts/run.py"), "print('hi')\n").unwrap();
    for i in 0..8 {
        std::fs::write(dir.join(format!("references/ref-{i}.md")), "# Ref\n".repeat(40)).unwrap();
    }
    dir
}

/// The skill at `dir` pushed to `reference` and described by a SkillPackage
/// `<name>-1` with the status the controller would give it (Ready).
pub(crate) fn ready_package(
    rt: &tokio::runtime::Runtime,
    registry: &skill_operator::oci::Registry,
    reference: String,
    dir: &Path,
    name: &str,
) -> skill_operator::api::package::SkillPackage {
    use skill_operator::api::package::{OciSource, PackageSource, SkillPackage, SkillPackageSpec};
    use skill_operator::controller::decide::{package_status, PackageFacts};
    use skill_operator::core::discovery::{discover, Limits};
    let pkg = skill_operator::core::package::build_from_dir(dir).unwrap();
    let cfg = skill_operator::oci::SkillConfig::for_package(&pkg, name, "d", None).unwrap();
    let digest = rt.block_on(registry.push(&reference, &pkg, &cfg)).unwrap();
    let mut p = SkillPackage::new(
        &format!("{name}-1"),
        SkillPackageSpec {
            source: PackageSource { oci: OciSource { reference, pull_secret: None, insecure: true } },
            runtime: serde_json::from_value(
                serde_json::json!({"interpreter": "python", "image": "i", "allowedScripts": ["scripts/run.py"]}),
            )
            .unwrap(),
        },
    );
    let catalog = discover(&[dir.to_path_buf()], Limits::default());
    p.status = Some(package_status(&p, Ok(&PackageFacts { digest, catalog, requirement_files: vec![], dependencies: Default::default() })));
    p
}
