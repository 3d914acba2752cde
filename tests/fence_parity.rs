//! One fence for both backends: the same cases (declaration, grant, profile,
//! call) go through the standalone server's path (catalog + grants →
//! `fence::plan`) and the controller's path (SkillPackage status +
//! SkillBinding + SkillJob → `decide::admit`), and the verdicts must be the
//! same: the same refusal code, or the same script, timeout, variables,
//! arguments and network decision. A rule added to one path only fails here.
//! The gateway's path (the package pushed to a real registry, pulled into
//! the package cache, a namespace snapshot built from the SkillBinding →
//! `Snapshot::plan`) is held to the same table, and its script statuses to
//! the standalone server's.

#[path = "oci/common.rs"]
mod common;

use std::collections::BTreeSet;

use skill_operator::api::binding::{EnvGrant, SecretKeyRef, SkillBinding, SkillBindingSpec, SkillBindingStatus};
use skill_operator::api::conditions::set_condition;
use skill_operator::api::job::SkillJobSpec;
use skill_operator::api::package::{OciSource, PackageSource, RunResources, RuntimeProfile, SkillPackage, SkillPackageSpec};
use skill_operator::controller::decide::{admit, package_status, AdmitRefusal, PackageFacts};
use skill_operator::core::declaration::Interpreter;
use skill_operator::core::discovery::{discover, Limits};
use skill_operator::core::fence::{self, Profile, Request};
use skill_operator::core::grants::Grants;

const SKILL_MD: &str = "---\nname: tool\ndescription: d\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/ok.py\n      interpreter: python\n      env: [API_KEY, OTHER]\n      timeout: 30\n    - script: scripts/long.py\n      interpreter: python\n      timeout: 200\n    - script: scripts/run.js\n      interpreter: node\n    - script: scripts/x.rb\n      interpreter: ruby\n    - script: scripts/missing.py\n      interpreter: python\n    - script: scripts/inject.py\n      interpreter: python\n      env: [GLIBC_TUNABLES]\n  env:\n    - name: API_KEY\n    - name: OTHER\n  egress: [api.example.com]\n---\nbody\n";

fn skill_dir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let s = t.path().join("tool");
    std::fs::create_dir_all(s.join("scripts")).unwrap();
    std::fs::write(s.join("SKILL.md"), SKILL_MD).unwrap();
    for f in ["ok.py", "long.py", "run.js", "x.rb", "inject.py"] {
        std::fs::write(s.join("scripts").join(f), "0").unwrap();
    }
    t
}

/// One case: what the owner grants, what the admin allows, what is asked.
struct Case {
    name: &'static str,
    script: &'static str,
    args: Vec<String>,
    timeout: Option<u64>,
    interpreter: Interpreter,
    allowed: &'static [&'static str],
    ceiling: Option<u32>,
    granted_env: &'static [&'static str],
    egress: bool,
}

fn case(name: &'static str, script: &'static str) -> Case {
    Case {
        name,
        script,
        args: vec![],
        timeout: None,
        interpreter: Interpreter::Python,
        allowed: &["scripts/ok.py", "scripts/long.py", "scripts/run.js", "scripts/x.rb", "scripts/missing.py", "scripts/inject.py"],
        ceiling: None,
        granted_env: &["API_KEY"],
        egress: false,
    }
}

/// The verdict, in terms both paths share.
#[derive(Debug, PartialEq)]
enum Verdict {
    Runs { script: String, timeout: u64, env: Vec<String>, args: Vec<String>, egress: bool },
    Refused(&'static str),
}

fn local(dir: &std::path::Path, c: &Case) -> Verdict {
    let catalog = discover(&[dir.to_path_buf()], Limits::default());
    let rows: Vec<serde_json::Value> =
        ["scripts/ok.py", "scripts/long.py", "scripts/run.js", "scripts/x.rb", "scripts/missing.py", "scripts/inject.py"]
            .iter()
            .map(|s| serde_json::json!({"skill": "tool", "script": s, "env": c.granted_env, "egress": c.egress}))
            .collect();
    let text = serde_json::to_string(&rows).unwrap();
    let grants = Grants::resolve(&move |k| (k == "MCP_SKILL_RUN").then(|| text.clone()), None);
    let profile = Profile {
        interpreters: [c.interpreter].into_iter().collect::<BTreeSet<_>>(),
        allowed_scripts: Some(c.allowed.iter().map(|s| s.to_string()).collect()),
        timeout_ceiling_secs: c.ceiling.map(u64::from),
    };
    match fence::plan(&catalog, &grants, &profile, "tool", &Request { script: c.script, args: &c.args, timeout_secs: c.timeout }) {
        Ok(p) => Verdict::Runs {
            script: p.script.to_string(),
            timeout: p.timeout_secs,
            env: p.granted_env.clone(),
            args: p.args.clone(),
            egress: p.egress_granted,
        },
        Err(r) => Verdict::Refused(r.code()),
    }
}

/// The SkillPackage (its status from the controller's own `package_status`) and the SkillBinding of a case.
fn k8s_objects(dir: &std::path::Path, c: &Case, reference: &str, digest: &str) -> (SkillPackage, SkillBinding) {
    let catalog = discover(&[dir.join("tool")], Limits::default());
    let runtime = RuntimeProfile {
        interpreter: c.interpreter,
        image: Some("img@sha256:00".into()),
        interpreter_path: None,
        allowed_scripts: c.allowed.iter().map(|s| s.to_string()).collect(),
        allowed_egress: vec![],
        timeout_seconds: c.ceiling,
        resources: RunResources::default(),
        prepare: false,
        image_mode: None,
        dependencies: None,
    };
    let mut package = SkillPackage::new(
        "tool-1",
        SkillPackageSpec {
            source: PackageSource { oci: OciSource { reference: reference.into(), pull_secret: None, insecure: true } },
            runtime: Some(runtime),
        },
    );
    package.status = Some(package_status(
        &package,
        Ok(&PackageFacts { digest: digest.into(), catalog, requirement_files: vec![], dependencies: Default::default() }),
    ));
    let mut binding = SkillBinding::new(
        "tool",
        SkillBindingSpec {
            package: "tool-1".into(),
            env: c
                .granted_env
                .iter()
                .map(|n| EnvGrant { name: n.to_string(), secret_key_ref: SecretKeyRef { name: "s".into(), key: "k".into() } })
                .collect(),
            egress: c.egress,
            egress_hosts: None,
            warm: None,
        },
    );
    let mut status = SkillBindingStatus::default();
    set_condition(&mut status.conditions, "Ready", true, "Ready", "ok", None);
    binding.status = Some(status);
    (package, binding)
}

fn kubernetes(dir: &std::path::Path, c: &Case) -> Verdict {
    let (package, binding) = k8s_objects(dir, c, "r/tool:1", "sha256:ab");
    let spec = SkillJobSpec {
        binding: "tool".into(),
        script: c.script.into(),
        args: c.args.clone(),
        inputs: vec![],
        timeout_seconds: c.timeout.map(|t| t as u32),
    };
    match admit(&spec, Some(&binding), Some(&package)) {
        Ok(a) => Verdict::Runs {
            script: a.script,
            timeout: a.timeout_secs,
            env: a.env.into_iter().map(|(n, _, _)| n).collect(),
            args: a.args,
            egress: a.egress,
        },
        Err(AdmitRefusal::Fence(r)) => Verdict::Refused(r.code()),
        Err(other) => panic!("{}: refused outside the fence: {other}", c.name),
    }
}

fn cases() -> Vec<Case> {
    let many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
    vec![
        case("granted, within the ceiling", "scripts/ok.py"),
        Case { args: vec!["; rm -rf /".into(), "$(id)".into()], ..case("shell text is just text", "scripts/ok.py") },
        Case { granted_env: &["API_KEY", "OTHER", "NOT_ASKED"], ..case("only asked-for names", "scripts/ok.py") },
        Case { granted_env: &[], ..case("no variables granted", "scripts/ok.py") },
        Case { egress: true, ..case("egress granted", "scripts/ok.py") },
        Case { timeout: Some(5), ..case("caller lowers the timeout", "scripts/ok.py") },
        Case { timeout: Some(999), ..case("caller cannot raise it", "scripts/ok.py") },
        Case { ceiling: Some(100), ..case("profile ceiling below the declaration", "scripts/long.py") },
        case("declaration under the hard ceiling", "scripts/long.py"),
        case("undeclared", "scripts/nope.py"),
        case("traversal", "../tool/scripts/ok.py"),
        case("absolute", "/etc/passwd"),
        case("closed interpreter set", "scripts/x.rb"),
        case("declared file missing", "scripts/missing.py"),
        case("reserved variable", "scripts/inject.py"),
        case("interpreter not in this deployment", "scripts/run.js"),
        Case { allowed: &["scripts/long.py"], ..case("not in allowedScripts", "scripts/ok.py") },
        Case { args: many, ..case("too many args", "scripts/ok.py") },
        Case { args: vec!["x".repeat(8 * 1024 + 1)], ..case("args too large", "scripts/ok.py") },
        Case { args: vec!["a\0b".into()], ..case("NUL in an argument", "scripts/ok.py") },
    ]
}

#[test]
fn both_backends_reach_the_same_verdict() {
    let t = skill_dir();
    let cases = cases();
    let mut refused = BTreeSet::new();
    for c in &cases {
        let (l, k) = (local(t.path(), c), kubernetes(t.path(), c));
        assert_eq!(l, k, "{}: the local and the Kubernetes verdicts differ", c.name);
        if let Verdict::Refused(code) = l {
            refused.insert(code);
        }
    }
    // The table reaches every refusal the fence has.
    let all: BTreeSet<&str> =
        ["bad-path", "not-declared", "unavailable", "not-allowed", "too-many-args", "args-too-large", "nul-in-arg"].into_iter().collect();
    assert_eq!(refused, all);
    // And the verdicts are the expected ones, not just equal.
    assert_eq!(
        local(t.path(), &cases[0]),
        Verdict::Runs { script: "scripts/ok.py".into(), timeout: 30, env: vec!["API_KEY".into()], args: vec![], egress: false }
    );
    assert!(matches!(local(t.path(), &cases[4]), Verdict::Runs { egress: true, .. }));
    assert!(matches!(local(t.path(), &cases[6]), Verdict::Runs { timeout: 30, .. }));
    assert!(matches!(local(t.path(), &cases[7]), Verdict::Runs { timeout: 100, .. }));
    assert!(matches!(local(t.path(), &cases[8]), Verdict::Runs { timeout: 200, .. }));
}

/// The local verdict's policy as the standalone server's grant and profile, for status comparison.
fn local_policy(c: &Case) -> (Grants, Profile) {
    let rows: Vec<serde_json::Value> =
        ["scripts/ok.py", "scripts/long.py", "scripts/run.js", "scripts/x.rb", "scripts/missing.py", "scripts/inject.py"]
            .iter()
            .map(|s| serde_json::json!({"skill": "tool", "script": s, "env": c.granted_env, "egress": c.egress}))
            .collect();
    let text = serde_json::to_string(&rows).unwrap();
    let grants = Grants::resolve(&move |k| (k == "MCP_SKILL_RUN").then(|| text.clone()), None);
    let profile = Profile {
        interpreters: [c.interpreter].into_iter().collect::<BTreeSet<_>>(),
        allowed_scripts: Some(c.allowed.iter().map(|s| s.to_string()).collect()),
        timeout_ceiling_secs: c.ceiling.map(u64::from),
    };
    (grants, profile)
}

#[tokio::test]
async fn the_gateway_catalog_reaches_the_same_verdict() {
    use skill_operator::gateway::catalog::{CacheOptions, NamespaceCatalog, PackageCache};
    let t = skill_dir();
    let reg = common::TestRegistry::start().await;
    let pkg = skill_operator::core::package::build_from_dir(&t.path().join("tool")).unwrap();
    let cfg = skill_operator::oci::SkillConfig::for_package(&pkg, "tool", "d", None).unwrap();
    let reference = reg.reference("skills/tool:1");
    let digest = reg.registry().push(&reference, &pkg, &cfg).await.unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = PackageCache::new(CacheOptions::new(cache_dir.path())).unwrap();
    let local_catalog = discover(&[t.path().to_path_buf()], Limits::default());
    let local_skill = local_catalog.get("tool").unwrap();
    let mut refused = BTreeSet::new();
    for c in &cases() {
        let (package, binding) = k8s_objects(t.path(), c, &reference, &digest);
        let packages = [("tool-1".to_string(), package)].into_iter().collect();
        let snap = NamespaceCatalog::build("parity", &[binding], &packages, &cache).await;
        assert_eq!(snap.catalog.names(), vec!["tool"], "{}: {:?}", c.name, snap.problems);
        let gateway = match snap.plan("tool", &Request { script: c.script, args: &c.args, timeout_secs: c.timeout }) {
            Ok(p) => Verdict::Runs {
                script: p.script.to_string(),
                timeout: p.timeout_secs,
                env: p.granted_env.clone(),
                args: p.args.clone(),
                egress: p.egress_granted,
            },
            Err(r) => Verdict::Refused(r.code()),
        };
        assert_eq!(gateway, local(t.path(), c), "{}: the gateway and the local verdicts differ", c.name);
        assert_eq!(gateway, kubernetes(t.path(), c), "{}: the gateway and the controller verdicts differ", c.name);
        if let Verdict::Refused(code) = gateway {
            refused.insert(code);
        }
        // What skill_list says of every script, too.
        let (grants, profile) = local_policy(c);
        let skill = snap.catalog.get("tool").unwrap();
        for (g, l) in skill.scripts.iter().zip(&local_skill.scripts) {
            let local_status = fence::script_status("tool", &fence::ScriptFacts::from(l), &grants, &profile);
            assert_eq!(snap.status(skill, g), local_status, "{}: {} is listed differently", c.name, g.decl.script);
        }
    }
    assert_eq!(cache.stats().pulls, 1, "one digest, one pull, whatever the bindings say");
    assert_eq!(refused.len(), 7, "{refused:?}");
}
