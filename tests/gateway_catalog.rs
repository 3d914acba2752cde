//! The gateway's namespace catalog against a real `docker-registry` on
//! loopback: packages pushed with the library, SkillPackage statuses made by
//! the controller's own `package_status`, snapshots built by
//! `NamespaceCatalog::build` and compared with what `serve` builds from the
//! same skill directories. Registry traffic is counted by a small forwarding
//! proxy in front of the registry (it only counts; the registry answers).

#[path = "oci/common.rs"]
mod common;
// Only the API server start-up is used here.
#[allow(dead_code)]
#[path = "envtest/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use skill_operator::api::binding::{EnvGrant, SecretKeyRef, SkillBinding, SkillBindingSpec};
use skill_operator::api::package::{OciSource, PackageSource, RunResources, RuntimeProfile, SkillPackage, SkillPackageSpec};
use skill_operator::controller::decide::{package_status, PackageFacts};
use skill_operator::core::declaration::Interpreter;
use skill_operator::core::discovery::{discover, Limits};
use skill_operator::core::grants::Grants;
use skill_operator::core::problems::{Problem, Reason};
use skill_operator::gateway::catalog::{
    binding_verdict, package_location, CacheError, CacheOptions, NamespaceCatalog, PackageCache, ServedIndex, StaticSecrets,
};
use skill_operator::mcp::snapshot::Snapshot;
use skill_operator::mcp::state::ServerState;
use skill_operator::mcp::tools::{skill_list, skill_load, SkillListInput, SkillLoadInput};
use skill_operator::oci::SkillConfig;

use common::TestRegistry;

const ALPHA: &str = "---\nname: alpha\ndescription: Alpha does things.\nflavour: extra\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/run.py\n      interpreter: python\n      env: [API_KEY, OTHER]\n      timeout: 30\n    - script: scripts/gone.py\n      interpreter: python\n  egress: [api.example.com]\n---\n# Alpha\nUse it well.\n";
const BETA: &str = "---\nname: beta\ndescription: Beta counts words.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/count.js\n      interpreter: node\n---\n# Beta\n";

/// A skill directory named `name` under a fresh root.
fn skill_tree(name: &str, skill_md: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SKILL.md"), skill_md).unwrap();
    for (path, body) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    root
}

fn alpha() -> tempfile::TempDir {
    skill_tree("alpha", ALPHA, &[("scripts/run.py", "print(1)\n"), ("reference.md", "ref\n")])
}

fn beta() -> tempfile::TempDir {
    skill_tree("beta", BETA, &[("scripts/count.js", "console.log(1)\n")])
}

/// A package pushed from `root/name`: (repository reference, digest, layer digest, package bytes).
struct Pushed {
    repo: String,
    digest: String,
    layer: String,
}

async fn push(reg: &TestRegistry, root: &Path, name: &str) -> Pushed {
    let dir = root.join(name);
    let pkg = skill_operator::core::package::build_from_dir(&dir).unwrap();
    let cfg = SkillConfig::for_package(&pkg, name, "d", Some("1".into())).unwrap();
    let repo = format!("skills/{name}");
    let digest = reg.registry().push(&reg.reference(&format!("{repo}:1")), &pkg, &cfg).await.unwrap();
    Pushed { repo, digest, layer: skill_operator::core::package::digest(&pkg) }
}

/// A SkillPackage as the controller leaves it: source at `host`, status from
/// `package_status` over discovery of the same tree.
fn package(name: &str, host: &str, pushed: &Pushed, root: &Path, skill: &str, runtime: Option<RuntimeProfile>) -> SkillPackage {
    let mut p = SkillPackage::new(
        name,
        SkillPackageSpec {
            source: PackageSource { oci: OciSource { reference: format!("{host}/{}:1", pushed.repo), pull_secret: None, insecure: true } },
            runtime,
        },
    );
    let catalog = discover(&[root.join(skill)], Limits::default());
    p.status = Some(package_status(
        &p,
        Ok(&PackageFacts { digest: pushed.digest.clone(), catalog, requirement_files: vec![], dependencies: Default::default() }),
    ));
    p
}

fn runtime(interpreter: Interpreter, allowed: &[&str]) -> RuntimeProfile {
    RuntimeProfile {
        interpreter,
        image: Some("img@sha256:00".into()),
        interpreter_path: None,
        allowed_scripts: allowed.iter().map(|s| s.to_string()).collect(),
        allowed_egress: Vec::new(),
        timeout_seconds: None,
        resources: RunResources::default(),
        prepare: false,
        image_mode: None,
        dependencies: None,
    }
}

/// A binding as the controller leaves one it found nothing wrong with
/// (Ready for its generation); [`decided`] applies the controller's real verdict.
fn binding(name: &str, package: &str, env: &[&str], egress: bool) -> SkillBinding {
    let mut b = undecided(name, package, env, egress);
    let mut status = skill_operator::api::binding::SkillBindingStatus::default();
    skill_operator::api::conditions::set_condition(&mut status.conditions, "Ready", true, "Bound", "bound", b.metadata.generation);
    b.status = Some(status);
    b
}

/// `b` with the status the controller's binding reconciler writes when it
/// sees `others` in the namespace (`binding_decision`, `binding_status`).
fn decided(mut b: SkillBinding, pkgs: &BTreeMap<String, SkillPackage>, others: &[&SkillBinding]) -> SkillBinding {
    let siblings: Vec<(String, String)> = others
        .iter()
        .filter_map(|o| Some((o.metadata.name.clone()?, pkgs.get(&o.spec.package)?.status.as_ref()?.skill_name.clone()?)))
        .collect();
    let d = skill_operator::controller::decide::binding_decision(&b, pkgs.get(&b.spec.package), &siblings);
    b.status = Some(skill_operator::controller::binding::binding_status(&b, &d));
    b
}

/// A binding the controller has not looked at (no status), at generation 1.
fn undecided(name: &str, package: &str, env: &[&str], egress: bool) -> SkillBinding {
    let mut b = SkillBinding::new(
        name,
        SkillBindingSpec {
            package: package.into(),
            env: env
                .iter()
                .map(|n| EnvGrant { name: n.to_string(), secret_key_ref: SecretKeyRef { name: "creds".into(), key: n.to_lowercase() } })
                .collect(),
            egress,
            egress_hosts: None,
            warm: None,
        },
    );
    b.metadata.generation = Some(1);
    b
}

fn cache(dir: &Path) -> PackageCache {
    PackageCache::new(CacheOptions::new(dir)).unwrap()
}

fn packages(list: Vec<SkillPackage>) -> BTreeMap<String, SkillPackage> {
    list.into_iter().map(|p| (p.metadata.name.clone().unwrap(), p)).collect()
}

/// A problem with the skill directory's location cut off, so the gateway's
/// cache path and serve's directory compare equal.
/// `p` with each of `dirs` (a directory of `serve`, or a location the
/// gateway shows) written `<dir>`.
fn portable(p: &Problem, dirs: &[&str]) -> Problem {
    let mut p = p.clone();
    for d in dirs {
        p.path = p.path.replace(d, "<dir>");
        p.detail = p.detail.replace(d, "<dir>");
    }
    p
}

/// Every spelling of `dir` a text could hold (as given, canonical).
fn spellings(dir: &Path) -> Vec<String> {
    let mut out = vec![dir.display().to_string()];
    if let Ok(real) = dir.canonicalize() {
        out.push(real.display().to_string());
    }
    out
}

/// Panics when `text` names the cache directory `dir` or one of its digest entries.
fn assert_no_cache_path(text: &str, dir: &Path, digests: &[&str]) {
    for d in spellings(dir) {
        assert!(!text.contains(&d), "the cache directory {d} is shown to clients: {text}");
    }
    for digest in digests {
        let hex = digest.strip_prefix("sha256:").unwrap();
        assert!(!text.contains(&format!("/{hex}")), "a cache entry directory (…/{hex}) is shown to clients: {text}");
    }
}

/// The `skill_list` answer a read-only server holding `snap` gives, as JSON text.
fn skill_list_text(snap: Snapshot) -> (serde_json::Value, String) {
    let state = ServerState::new(snap);
    let current = state.snapshot();
    let out = skill_list(&state, &current, SkillListInput::default()).unwrap();
    let value = serde_json::to_value(&out).unwrap();
    let text = value.to_string();
    (value, text)
}

/// The served view of one skill, comparable across servers.
fn view(snap: &Snapshot, name: &str) -> serde_json::Value {
    let skill = snap.catalog.get(name).unwrap_or_else(|| panic!("`{name}` is not served"));
    let loaded = skill_load(snap, SkillLoadInput { name: name.into() }).unwrap();
    serde_json::json!({
        "name": skill.name,
        "description": skill.meta.description,
        "frontmatter": skill.frontmatter,
        "files": skill.files.iter().map(|f| (f.path.to_string(), f.size)).collect::<Vec<_>>(),
        "bytes": skill.bytes,
        "scripts": skill.scripts.iter().map(|d| (d.decl.script.to_string(), d.unavailable.clone())).collect::<Vec<_>>(),
        "egress": skill.egress,
        "extension": snap.extension_names.contains(name),
        "body": loaded.body,
        "loadedFiles": serde_json::to_value(&loaded.files).unwrap(),
    })
}

#[tokio::test]
async fn three_bindings_over_two_packages_serve_what_serve_serves() {
    let reg = TestRegistry::start().await;
    let (a, b) = (alpha(), beta());
    let (pa, pb) = (push(&reg, a.path(), "alpha").await, push(&reg, b.path(), "beta").await);
    let pkgs = packages(vec![
        package("alpha-1", &reg.addr, &pa, a.path(), "alpha", Some(runtime(Interpreter::Python, &["scripts/run.py"]))),
        package("beta-1", &reg.addr, &pb, b.path(), "beta", None),
    ]);
    let bindings = vec![
        binding("b-beta", "beta-1", &[], false),
        binding("a-alpha", "alpha-1", &["API_KEY", "NOT_ASKED"], true),
        binding("c-alpha-again", "alpha-1", &["OTHER"], false),
    ];
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let built = NamespaceCatalog::build_served("team-a", &bindings, &pkgs, &cache).await;
    assert_eq!(built.skills["alpha"].binding, "a-alpha", "of two bindings of one skill both Ready, the first by name serves it");
    assert_eq!(built.skills["alpha"].digest, pa.digest);
    assert_eq!((built.skills["beta"].binding.as_str(), built.skills["beta"].package.as_str()), ("b-beta", "beta-1"));
    let snap = built.snapshot;

    // What serve builds from the same two directories.
    let served =
        Snapshot::scan(&[a.path().to_path_buf(), b.path().to_path_buf()], Grants::resolve(&|_| None, None), Interpreter::ALL.into());
    assert_eq!(snap.catalog.names(), vec!["alpha", "beta"]);
    for name in ["alpha", "beta"] {
        assert_eq!(view(&snap, name), view(&served, name), "`{name}` differs between the gateway and serve");
    }
    // Discovery's problems are serve's, word for word but for the directory,
    // which the gateway shows as the package's name and digest.
    let gw_dirs = [package_location("alpha-1"), package_location("beta-1")];
    let gw_dirs: Vec<&str> = gw_dirs.iter().map(String::as_str).collect();
    let serve_dirs = [a.path().join("alpha").display().to_string(), b.path().join("beta").display().to_string()];
    let serve_dirs: Vec<&str> = serve_dirs.iter().map(String::as_str).collect();
    let from_discovery: Vec<Problem> =
        snap.problems.iter().filter(|p| !p.path.starts_with("skillbinding/")).map(|p| portable(p, &gw_dirs)).collect();
    let serve_problems: Vec<Problem> = served.problems.iter().map(|p| portable(p, &serve_dirs)).collect();
    let mut x = from_discovery.clone();
    let mut y = serve_problems.clone();
    x.sort_by(|p, q| (&p.path, &p.detail).cmp(&(&q.path, &q.detail)));
    y.sort_by(|p, q| (&p.path, &p.detail).cmp(&(&q.path, &q.detail)));
    assert_eq!(x, y);
    let reasons: Vec<Reason> = x.iter().map(|p| p.reason).collect();
    assert!(reasons.contains(&Reason::UnknownKey) && reasons.contains(&Reason::DeclaredScriptMissing), "{x:?}");

    // The binding's problems: the duplicate, and a grant handing nothing over.
    let dup: Vec<&Problem> = snap.problems.iter().filter(|p| p.reason == Reason::DuplicateName).collect();
    assert_eq!(dup.len(), 1, "{:?}", snap.problems);
    assert_eq!(dup[0].path, "skillbinding/c-alpha-again");
    assert!(dup[0].detail.contains("`a-alpha`"), "{}", dup[0].detail);
    let grants: Vec<&Problem> = snap.problems.iter().filter(|p| p.reason == Reason::Grant).collect();
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert!(grants[0].path == "skillbinding/a-alpha" && grants[0].detail.contains("NOT_ASKED"), "{grants:?}");

    // What runs is the binding's and the profile's word.
    let alpha = snap.catalog.get("alpha").unwrap();
    let statuses: Vec<String> = alpha.scripts.iter().map(|d| format!("{:?}", snap.status(alpha, d))).collect();
    assert_eq!(statuses[0], "Runnable { env: [\"API_KEY\"] }", "the served binding is a-alpha, which grants API_KEY");
    assert!(statuses[1].starts_with("Unavailable"), "{statuses:?}");
    let beta = snap.catalog.get("beta").unwrap();
    assert!(matches!(snap.status(beta, &beta.scripts[0]), skill_operator::core::fence::ScriptStatus::NotAllowed(_)));
    assert_eq!(snap.policy.source_label(), "skillbindings:team-a");
    let note = snap.policy.note().unwrap();
    assert!(note.contains("`beta` (SkillPackage beta-1)") && note.starts_with("some skills run nothing"), "{note}");
    assert_eq!(snap.policy.interpreters(), [Interpreter::Python].into());
    assert_eq!(cache.stats().entries, 2, "one entry per digest, not per binding");

    // skill_list shows each package by name and digest, each skill relative
    // to it, and nothing of the cache directory the files are read from.
    let (alpha_at, beta_at) = (package_location("alpha-1"), package_location("beta-1"));
    assert_eq!(snap.catalog.get("alpha").unwrap().root, dir.path().join(pa.digest.strip_prefix("sha256:").unwrap()).join("alpha"));
    let (listing, text) = skill_list_text(snap);
    let roots: Vec<(&str, u64, &str)> = listing["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["path"].as_str().unwrap(), r["skills"].as_u64().unwrap(), r["digest"].as_str().unwrap()))
        .collect();
    assert_eq!(roots, vec![(alpha_at.as_str(), 1, pa.digest.as_str()), (beta_at.as_str(), 1, pb.digest.as_str())]);
    let skills: Vec<(&str, &str)> =
        listing["skills"].as_array().unwrap().iter().map(|s| (s["root"].as_str().unwrap(), s["path"].as_str().unwrap())).collect();
    assert_eq!(skills, vec![(alpha_at.as_str(), "."), (beta_at.as_str(), ".")]);
    let gone = listing["problems"].as_array().unwrap().iter().find(|p| p["reason"] == "declared-script-missing").unwrap();
    assert_eq!(gone["path"], format!("{alpha_at}/scripts/gone.py"), "{gone}");
    assert_no_cache_path(&text, dir.path(), &[&pa.digest, &pb.digest]);
}

#[tokio::test]
async fn a_cache_that_cannot_store_a_package_names_no_directory() {
    let reg = TestRegistry::start().await;
    let a = alpha();
    let pa = push(&reg, a.path(), "alpha").await;
    let pkgs = packages(vec![package("alpha-1", &reg.addr, &pa, a.path(), "alpha", None)]);
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    let cache = cache(&cache_dir);
    // The cache directory replaced by a file: storing the pulled package fails on the disk.
    std::fs::remove_dir(&cache_dir).unwrap();
    std::fs::write(&cache_dir, b"not a directory").unwrap();
    let snap = NamespaceCatalog::build("team-io", &[binding("a", "alpha-1", &[], false)], &pkgs, &cache).await;
    assert!(snap.catalog.skills.is_empty());
    let p = snap.problems.iter().find(|p| p.path == "skillbinding/a").unwrap_or_else(|| panic!("{:?}", snap.problems));
    assert!(p.detail.contains("package cache could not store it"), "{}", p.detail);
    let (_, text) = skill_list_text(snap);
    assert_no_cache_path(&text, &cache_dir, &[&pa.digest]);
}

#[tokio::test]
async fn the_controllers_verdict_decides_which_binding_serves_and_runs() {
    let reg = TestRegistry::start().await;
    let a = alpha();
    let pa = push(&reg, a.path(), "alpha").await;
    let pkgs =
        packages(vec![package("alpha-1", &reg.addr, &pa, a.path(), "alpha", Some(runtime(Interpreter::Python, &["scripts/run.py"])))]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let index = std::sync::Arc::new(ServedIndex::default());
    let runs = index.namespace("team");

    // `z-first` came first and was called Ready; `a-second` (sorting first by
    // name) came later and the controller refused it as a duplicate.
    let first = decided(undecided("z-first", "alpha-1", &["API_KEY"], false), &pkgs, &[]);
    let second = decided(undecided("a-second", "alpha-1", &[], false), &pkgs, &[&first]);
    assert_eq!(binding_verdict(&first), Ok(()));
    assert_eq!(binding_verdict(&second).unwrap_err().0, Reason::DuplicateName);
    let snap = index.build("team", &[second.clone(), first.clone()], &pkgs, &cache).await;
    assert_eq!(snap.catalog.names(), vec!["alpha"]);
    assert!(!snap.settling, "a refusal is a verdict: nothing to wait for");
    assert_eq!(runs.binding_of("alpha").as_deref(), Some("z-first"), "a run names the binding the snapshot serves");
    let alpha = snap.catalog.get("alpha").unwrap();
    assert_eq!(format!("{:?}", snap.status(alpha, &alpha.scripts[0])), "Runnable { env: [\"API_KEY\"] }", "z-first's grant applies");
    let dup: Vec<&Problem> = snap.problems.iter().filter(|p| p.path == "skillbinding/a-second").collect();
    assert_eq!(dup.len(), 1, "{:?}", snap.problems);
    assert!(dup[0].reason == Reason::DuplicateName && dup[0].detail.contains("z-first"), "{:?}", dup[0]);
    assert_eq!(index.binding_of("elsewhere", "alpha"), None, "another namespace's build is its own");

    // The controller catches up with `z-first` too: both refused, nothing served, nothing to run.
    let first_refused = decided(first.clone(), &pkgs, &[&second]);
    assert!(binding_verdict(&first_refused).is_err());
    let snap = index.build("team", &[second.clone(), first_refused], &pkgs, &cache).await;
    assert!(snap.catalog.skills.is_empty(), "{:?}", snap.catalog.names());
    assert_eq!(runs.binding_of("alpha"), None);

    // `a-second` alone again (z-first deleted): the controller's next verdict serves it.
    let second_alone = decided(second.clone(), &pkgs, &[]);
    let snap = index.build("team", std::slice::from_ref(&second_alone), &pkgs, &cache).await;
    assert_eq!(snap.catalog.names(), vec!["alpha"]);
    assert_eq!(runs.binding_of("alpha").as_deref(), Some("a-second"));

    // Its spec edited (generation 2) and not yet re-checked: its old verdict does not carry over.
    let mut edited = second_alone.clone();
    edited.metadata.generation = Some(2);
    edited.spec.env.clear();
    let snap = index.build("team", std::slice::from_ref(&edited), &pkgs, &cache).await;
    assert!(snap.catalog.skills.is_empty());
    assert!(snap.settling, "the controller's verdict on generation 2 is on its way");
    assert!(snap.problems.iter().any(|p| p.path == "skillbinding/a-second" && p.detail.contains("generation 2")), "{:?}", snap.problems);
    assert_eq!(runs.binding_of("alpha"), None);
    // Nor does a binding the controller never looked at serve.
    let snap = index.build("team", &[undecided("fresh", "alpha-1", &[], false)], &pkgs, &cache).await;
    assert!(snap.catalog.skills.is_empty());
    assert!(snap.settling, "a binding just applied: calls wait for its verdict");
    assert!(snap.problems.iter().any(|p| p.path == "skillbinding/fresh" && p.detail.contains("not decided")), "{:?}", snap.problems);
    // A package the controller has not checked yet is on its way too.
    let mut unchecked = pkgs.clone();
    unchecked.get_mut("alpha-1").unwrap().status = None;
    let snap = index.build("team", std::slice::from_ref(&second_alone), &unchecked, &cache).await;
    assert!(snap.catalog.skills.is_empty() && snap.settling);
}

/// The quick start's race: a binding applied right after the install is
/// decided against a package the controller is still resolving. A first
/// call waits for the package's verdict and then the binding's, instead of
/// answering from an empty namespace that fills a moment later; a verdict
/// that will not change is not waited for.
#[tokio::test]
async fn a_binding_waiting_on_its_packages_verdict_is_settling() {
    use skill_operator::controller::context::ResolveError;
    use skill_operator::controller::decide::{PACKAGE_NOT_READY, RESOLVE_RETRYING};
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let a = alpha();
    let unresolved = || {
        let mut p = SkillPackage::new(
            "alpha-1",
            SkillPackageSpec {
                source: PackageSource { oci: OciSource { reference: "127.0.0.1:1/alpha:1".into(), pull_secret: None, insecure: true } },
                runtime: None,
            },
        );
        p.metadata.generation = Some(1);
        p
    };
    let with = |status: Result<&PackageFacts, &ResolveError>| {
        let mut p = unresolved();
        p.status = Some(package_status(&p, status));
        packages(vec![p])
    };
    let unreachable = ResolveError::Pull {
        reference: "127.0.0.1:1/alpha:1".into(),
        source: skill_operator::oci::OciError::Unreachable { registry: "127.0.0.1:1".into(), detail: "connection refused".into() },
    };
    let retrying = with(Err(&unreachable));
    let ready_reason = |pkgs: &BTreeMap<String, SkillPackage>| {
        pkgs["alpha-1"].status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == "Ready").unwrap().reason.clone()
    };
    assert_eq!(ready_reason(&retrying), RESOLVE_RETRYING, "an unreachable store is retried, and says so");
    let wrong = with(Err(&ResolveError::PinMismatch { pinned: "sha256:aa".into(), got: "sha256:bb".into() }));
    assert_ne!(ready_reason(&wrong), RESOLVE_RETRYING, "a package wrong as it is is a verdict");
    let facts = PackageFacts {
        digest: "sha256:00".into(),
        catalog: discover(&[a.path().join("alpha")], Limits::default()),
        requirement_files: vec![],
        dependencies: Default::default(),
    };
    let ready = with(Ok(&facts));
    let unchecked = packages(vec![unresolved()]);

    let settling = |b: &SkillBinding, pkgs: &BTreeMap<String, SkillPackage>| {
        let (b, pkgs, cache) = (b.clone(), pkgs.clone(), &cache);
        async move {
            let snap = NamespaceCatalog::build("team", std::slice::from_ref(&b), &pkgs, cache).await;
            assert!(snap.catalog.skills.is_empty(), "nothing served from a binding that is not Ready");
            snap.settling
        }
    };
    for (name, pkgs) in [("unchecked", &unchecked), ("retrying", &retrying)] {
        let b = decided(undecided("b", "alpha-1", &[], false), pkgs, &[]);
        assert_eq!(b.status.as_ref().unwrap().conditions[0].reason, PACKAGE_NOT_READY);
        assert!(settling(&b, pkgs).await, "a package {name}: its verdict is on its way");
        assert!(settling(&b, &ready).await, "decided before its package ({name}) was Ready: re-decided next");
    }
    let b = decided(undecided("b", "alpha-1", &[], false), &wrong, &[]);
    assert!(!settling(&b, &wrong).await, "a package refused as it is: nothing to wait for");
    let missing = decided(undecided("b", "alpha-1", &[], false), &BTreeMap::new(), &[]);
    assert!(!settling(&missing, &BTreeMap::new()).await, "a package that does not exist: nothing to wait for");
    assert!(settling(&missing, &unchecked).await, "the package exists since: the binding is re-decided");
}

#[tokio::test]
async fn an_empty_namespace_is_an_empty_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let snap = NamespaceCatalog::build("empty", &[], &BTreeMap::new(), &cache(dir.path())).await;
    assert!(snap.catalog.skills.is_empty() && snap.problems.is_empty());
    assert!(snap.policy.note().is_none());
}

#[tokio::test]
async fn a_bad_package_is_a_problem_of_its_binding_only() {
    let reg = TestRegistry::start().await;
    let (a, b) = (alpha(), beta());
    let (pa, pb) = (push(&reg, a.path(), "alpha").await, push(&reg, b.path(), "beta").await);
    let good = package("beta-1", &reg.addr, &pb, b.path(), "beta", None);
    let tampered = package("alpha-1", &reg.addr, &pa, a.path(), "alpha", None);
    let mut not_ready = package("alpha-2", &reg.addr, &pa, a.path(), "alpha", None);
    not_ready.status.as_mut().unwrap().conditions.retain(|c| c.type_ != "Ready");
    let mut unpinned = package("alpha-3", &reg.addr, &pa, a.path(), "alpha", None);
    unpinned.status.as_mut().unwrap().digest = None;
    let mut nowhere = package("alpha-4", &reg.addr, &pa, a.path(), "alpha", None);
    nowhere.status.as_mut().unwrap().digest = Some(format!("sha256:{}", "ab".repeat(32)));
    let pkgs = packages(vec![good, tampered, not_ready, unpinned, nowhere]);
    let bindings = vec![
        binding("good", "beta-1", &[], false),
        binding("tampered", "alpha-1", &[], false),
        binding("missing", "no-such-package", &[], false),
        binding("not-ready", "alpha-2", &[], false),
        binding("unpinned", "alpha-3", &[], false),
        binding("nowhere", "alpha-4", &[], false),
    ];
    // Same length, other bytes: the registry serves it, the pull refuses it.
    let blob = reg.blob_path(&pa.layer);
    let mut evil = std::fs::read(&blob).unwrap();
    let n = evil.len();
    evil[n / 2] ^= 0xff;
    std::fs::write(&blob, &evil).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let snap = NamespaceCatalog::build("team-b", &bindings, &pkgs, &cache).await;
    assert_eq!(snap.catalog.names(), vec!["beta"], "the good binding serves; {:?}", snap.problems);
    let of = |b: &str| -> Vec<&Problem> { snap.problems.iter().filter(|p| p.path == format!("skillbinding/{b}")).collect() };
    let one = |b: &str| -> String {
        let found = of(b);
        assert_eq!(found.len(), 1, "{b}: {found:?}");
        assert_eq!(found[0].reason, Reason::RootUnreadable);
        found[0].detail.clone()
    };
    let t = one("tampered");
    assert!(t.contains("tampered") && t.contains(&pa.layer), "{t}");
    assert_eq!(of("tampered")[0].skill.as_deref(), Some("alpha"));
    assert!(one("missing").contains("`no-such-package` does not exist"));
    assert!(one("not-ready").contains("is not Ready (not checked yet)"));
    assert!(one("unpinned").contains("not pinned"));
    assert!(one("nowhere").contains("not found"), "{}", one("nowhere"));
    assert!(of("good").is_empty());
    assert!(!cache.holds(&pa.digest), "a refused package is not kept");

    // A failure is not remembered: once the registry has the right bytes, the next build serves it.
    let mut fixed = evil;
    fixed[n / 2] ^= 0xff;
    std::fs::write(&blob, &fixed).unwrap();
    let snap = NamespaceCatalog::build("team-b", &bindings, &pkgs, &cache).await;
    assert_eq!(snap.catalog.names(), vec!["alpha", "beta"]);
}

#[tokio::test]
async fn a_package_whose_skill_md_is_bad_reports_serves_problems() {
    let reg = TestRegistry::start().await;
    // Pushed as is (the library checks paths and caps, not frontmatter): no description.
    let bad = skill_tree("gamma", "---\nname: gamma\n---\nno description\n", &[]);
    let pg = push(&reg, bad.path(), "gamma").await;
    let b = beta();
    let pb = push(&reg, b.path(), "beta").await;
    // The controller would not call it Ready; a status claiming so must not make it servable.
    let mut p = package("gamma-1", &reg.addr, &pg, bad.path(), "gamma", None);
    let st = p.status.as_mut().unwrap();
    skill_operator::api::conditions::set_condition(&mut st.conditions, "Ready", true, "Ready", "forged", None);
    st.skill_name = Some("gamma".into());
    let pkgs = packages(vec![p, package("beta-1", &reg.addr, &pb, b.path(), "beta", None)]);
    let dir = tempfile::tempdir().unwrap();
    let snap = NamespaceCatalog::build(
        "ns",
        &[binding("g", "gamma-1", &[], false), binding("b", "beta-1", &[], false)],
        &pkgs,
        &cache(dir.path()),
    )
    .await;
    assert_eq!(snap.catalog.names(), vec!["beta"]);
    let served = Snapshot::scan(&[bad.path().to_path_buf()], Grants::resolve(&|_| None, None), Interpreter::ALL.into());
    let gw_root = dir.path().join(pg.digest.strip_prefix("sha256:").unwrap()).join("gamma");
    let gw_location = package_location("gamma-1");
    let serve_problems: Vec<Problem> =
        served.problems.iter().map(|p| portable(p, &[&bad.path().join("gamma").display().to_string()])).collect();
    let gw: Vec<Problem> =
        snap.problems.iter().filter(|p| !p.path.starts_with("skillbinding/")).map(|p| portable(p, &[&gw_location])).collect();
    assert_eq!(gw, serve_problems);
    assert!(gw.iter().any(|p| p.reason == Reason::NoDescription), "{gw:?}");
    assert!(snap
        .problems
        .iter()
        .any(|p| p.path == "skillbinding/g" && p.detail.contains("holds no servable skill") && p.detail.contains(&gw_location)));
    // Read from the cache, shown as the package: no problem names the pod's directories.
    assert!(gw_root.join("SKILL.md").is_file(), "the package is read from {}", gw_root.display());
    let (_, text) = skill_list_text(snap);
    assert_no_cache_path(&text, dir.path(), &[&pg.digest, &pb.digest]);
}

/// Unpacked sizes of alpha and beta, and their digests in the registry.
async fn two_packages(reg: &TestRegistry) -> (Vec<(OciSource, String, u64)>, tempfile::TempDir, tempfile::TempDir) {
    let (a, b) = (alpha(), beta());
    let mut out = Vec::new();
    for (root, name) in [(&a, "alpha"), (&b, "beta")] {
        let p = push(reg, root.path(), name).await;
        let bytes =
            skill_operator::core::package::manifest(&skill_operator::core::package::build_from_dir(&root.path().join(name)).unwrap())
                .unwrap()
                .iter()
                .map(|f| f.size)
                .sum();
        let source = OciSource { reference: format!("{}/{}:1", reg.addr, p.repo), pull_secret: None, insecure: true };
        out.push((source, p.digest, bytes));
    }
    (out, a, b)
}

#[tokio::test]
async fn eviction_at_the_cap_edge() {
    let reg = TestRegistry::start().await;
    let (pkgs, _a, _b) = two_packages(&reg).await;
    let total = pkgs[0].2 + pkgs[1].2;
    for (cap, both_kept) in [(total, true), (total - 1, false)] {
        let dir = tempfile::tempdir().unwrap();
        let cache = PackageCache::new(CacheOptions { cap_bytes: cap, ..CacheOptions::new(dir.path()) }).unwrap();
        let first = cache.acquire(&pkgs[0].0, &pkgs[0].1).await.unwrap();
        assert_eq!(first.bytes, pkgs[0].2);
        let first_dir = first.skill_root.clone();
        drop(first);
        drop(cache.acquire(&pkgs[1].0, &pkgs[1].1).await.unwrap());
        let stats = cache.stats();
        assert_eq!(cache.holds(&pkgs[0].1), both_kept, "cap {cap} for {total} bytes");
        assert!(cache.holds(&pkgs[1].1), "the most recently used stays");
        assert_eq!(first_dir.exists(), both_kept, "an evicted package leaves the disk");
        assert_eq!(stats.bytes, if both_kept { total } else { pkgs[1].2 });
        assert!(stats.bytes <= cap);
    }
    // A package larger than the whole cache is refused, with the sizes named.
    let dir = tempfile::tempdir().unwrap();
    let cache = PackageCache::new(CacheOptions { cap_bytes: pkgs[0].2 - 1, ..CacheOptions::new(dir.path()) }).unwrap();
    let err = cache.acquire(&pkgs[0].0, &pkgs[0].1).await.unwrap_err();
    assert!(matches!(*err, CacheError::TooLarge { bytes, .. } if bytes == pkgs[0].2), "{err}");
    assert!(err.to_string().contains("raise the cache size"));
}

#[tokio::test]
async fn a_leased_digest_is_not_evicted() {
    let reg = TestRegistry::start().await;
    let (pkgs, _a, _b) = two_packages(&reg).await;
    let dir = tempfile::tempdir().unwrap();
    let cap = pkgs[0].2 + pkgs[1].2 - 1;
    let cache = PackageCache::new(CacheOptions { cap_bytes: cap, ..CacheOptions::new(dir.path()) }).unwrap();
    // A live snapshot serving alpha holds its lease.
    let mut p = SkillPackage::new("alpha-1", SkillPackageSpec { source: PackageSource { oci: pkgs[0].0.clone() }, runtime: None });
    let t = alpha();
    let catalog = discover(&[t.path().join("alpha")], Limits::default());
    p.status = Some(package_status(
        &p,
        Ok(&PackageFacts { digest: pkgs[0].1.clone(), catalog, requirement_files: vec![], dependencies: Default::default() }),
    ));
    let snap = NamespaceCatalog::build("ns", &[binding("a", "alpha-1", &[], false)], &packages(vec![p]), &cache).await;
    assert_eq!(snap.catalog.names(), vec!["alpha"]);
    let beta = cache.acquire(&pkgs[1].0, &pkgs[1].1).await.unwrap();
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.leased), (2, 2), "both in use: nothing goes, over the cap or not");
    assert!(stats.bytes > cap);
    drop(beta);
    // Beta was used last, but alpha is leased: beta goes.
    assert!(cache.holds(&pkgs[0].1) && !cache.holds(&pkgs[1].1));
    let alpha = snap.catalog.get("alpha").unwrap();
    assert!(alpha.dir.join("SKILL.md").is_file(), "the snapshot's files are still there");
    assert!(skill_load(&snap, SkillLoadInput { name: "alpha".into() }).unwrap().body.contains("Use it well"));
    // Holding beta again and dropping the snapshot: alpha goes now.
    let beta = cache.acquire(&pkgs[1].0, &pkgs[1].1).await.unwrap();
    let alpha_dir = alpha.dir.clone();
    drop(snap);
    assert!(!cache.holds(&pkgs[0].1) && cache.holds(&pkgs[1].1));
    assert!(!alpha_dir.exists());
    drop(beta);
    assert_eq!(cache.stats().entries, 1, "beta alone fits");
}

/// A forwarding proxy in front of the registry that records every request line.
struct CountingProxy {
    addr: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl CountingProxy {
    async fn start(upstream: &str) -> CountingProxy {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let (log, upstream) = (seen.clone(), upstream.to_string());
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let (http, log, upstream) = (http.clone(), log.clone(), upstream.clone());
            async move {
                let (parts, body) = req.into_parts();
                let path = parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
                log.lock().unwrap().push(format!("{} {}", parts.method, parts.uri.path()));
                let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                let mut out = http.request(parts.method, format!("http://{upstream}{path}")).body(body);
                for (k, v) in &parts.headers {
                    if k != http::header::HOST {
                        out = out.header(k, v);
                    }
                }
                let resp = out.send().await.unwrap();
                let mut answer = axum::response::Response::builder().status(resp.status());
                for (k, v) in resp.headers() {
                    if k != http::header::TRANSFER_ENCODING && k != http::header::CONTENT_LENGTH {
                        answer = answer.header(k, v);
                    }
                }
                answer.body(axum::body::Body::from(resp.bytes().await.unwrap())).unwrap()
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        CountingProxy { addr, seen }
    }

    fn gets(&self, what: &str) -> usize {
        self.seen.lock().unwrap().iter().filter(|l| l.starts_with("GET ") && l.contains(what)).count()
    }
}

#[tokio::test]
async fn ten_namespaces_binding_one_digest_pull_it_once() {
    let reg = TestRegistry::start().await;
    let proxy = CountingProxy::start(&reg.addr).await;
    let a = alpha();
    let pa = push(&reg, a.path(), "alpha").await;
    // The package is read through the proxy.
    let pkgs = packages(vec![package("alpha-1", &proxy.addr, &pa, a.path(), "alpha", None)]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let bindings: Vec<Vec<SkillBinding>> = (0..10).map(|i| vec![binding(&format!("alpha-{i}"), "alpha-1", &[], false)]).collect();
    let names: Vec<String> = (0..10).map(|i| format!("team-{i}")).collect();
    let snaps = futures::future::join_all(names.iter().zip(&bindings).map(|(ns, b)| NamespaceCatalog::build(ns, b, &pkgs, &cache))).await;
    assert!(snaps.iter().all(|s| s.catalog.names() == vec!["alpha"]), "{:?}", snaps[0].problems);
    assert_eq!(proxy.gets("/manifests/"), 1, "{:?}", proxy.seen.lock().unwrap());
    assert_eq!(proxy.gets("/blobs/"), 2, "config and layer, once each: {:?}", proxy.seen.lock().unwrap());
    assert_eq!(cache.stats().pulls, 1);
    // Served from the cache afterwards: no registry traffic at all.
    let before = proxy.seen.lock().unwrap().len();
    let again = NamespaceCatalog::build("team-x", &bindings[0], &pkgs, &cache).await;
    assert_eq!(again.catalog.names(), vec!["alpha"]);
    assert_eq!(proxy.seen.lock().unwrap().len(), before);
}

#[tokio::test]
async fn unchanged_inputs_keep_their_fingerprint_and_snapshot() {
    let reg = TestRegistry::start().await;
    let (a, b) = (alpha(), beta());
    let (pa, pb) = (push(&reg, a.path(), "alpha").await, push(&reg, b.path(), "beta").await);
    let pkgs = packages(vec![
        package("alpha-1", &reg.addr, &pa, a.path(), "alpha", Some(runtime(Interpreter::Python, &["scripts/run.py"]))),
        package("beta-1", &reg.addr, &pb, b.path(), "beta", None),
    ]);
    let bindings = vec![binding("a", "alpha-1", &["API_KEY"], false)];
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let fp = |b: &[SkillBinding], p: &BTreeMap<String, SkillPackage>| NamespaceCatalog::fingerprint("ns", b, p);
    let first = NamespaceCatalog::build("ns", &bindings, &pkgs, &cache).await;

    // Saved again: a new resourceVersion and generation, the controller's
    // same verdict on it written again (a new transition time), the same spec.
    let mut resaved = bindings.clone();
    resaved[0].metadata.resource_version = Some("999".into());
    resaved[0].metadata.generation = Some(7);
    let ready = &mut resaved[0].status.as_mut().unwrap().conditions[0];
    ready.observed_generation = Some(7);
    ready.last_transition_time = serde_json::from_value(serde_json::json!("2030-01-01T00:00:00Z")).unwrap();
    assert_eq!(fp(&resaved, &pkgs), fp(&bindings, &pkgs));
    let second = NamespaceCatalog::build("ns", &resaved, &pkgs, &cache).await;
    assert!(first.same_as(&second), "an unchanged binding saved again must not notify anyone");

    // Real changes: each moves the fingerprint, and each is a different snapshot.
    let mut egress = bindings.clone();
    egress[0].spec.egress = true;
    let mut env = bindings.clone();
    env[0].spec.env.push(EnvGrant { name: "OTHER".into(), secret_key_ref: SecretKeyRef { name: "s".into(), key: "k".into() } });
    let mut moved = pkgs.clone();
    moved.get_mut("alpha-1").unwrap().status.as_mut().unwrap().digest = Some(pb.digest.clone());
    let mut ceiling = pkgs.clone();
    ceiling.get_mut("alpha-1").unwrap().spec.runtime.as_mut().unwrap().timeout_seconds = Some(5);
    let mut refused = bindings.clone();
    let verdict = &mut refused[0].status.as_mut().unwrap().conditions[0];
    verdict.status = "False".into();
    verdict.reason = "DuplicateSkillName".into();
    for (what, b, p) in [
        ("egress", &egress, &pkgs),
        ("env", &env, &pkgs),
        ("digest", &bindings, &moved),
        ("profile", &bindings, &ceiling),
        ("verdict", &refused, &pkgs),
    ] {
        assert_ne!(fp(b, p), fp(&bindings, &pkgs), "{what} changed, the fingerprint did not");
        let changed = NamespaceCatalog::build("ns", b, p, &cache).await;
        assert!(!first.same_as(&changed), "{what} changed, the snapshot compares equal");
    }
    // Another namespace, or a package no binding names, or a reordered env list.
    assert_ne!(NamespaceCatalog::fingerprint("other", &bindings, &pkgs), fp(&bindings, &pkgs));
    let mut extra = pkgs.clone();
    extra.insert("unrelated".into(), pkgs["beta-1"].clone());
    assert_eq!(fp(&bindings, &extra), fp(&bindings, &pkgs));
    let mut reordered = env.clone();
    reordered[0].spec.env.reverse();
    reordered[0].metadata.uid = Some("u".into());
    assert_eq!(fp(&reordered, &pkgs), fp(&env, &pkgs));
}

#[tokio::test]
async fn a_pull_secret_gives_the_registry_credentials() {
    // user "tester", password "s3cret" (bcrypt cost 4), as in tests/registry.rs.
    let reg = TestRegistry::start_with_htpasswd("tester:$2b$04$Z.ZW/OHOlXPvxw5oVvfPkOGTR58bjAaX.qrTERRFtIMz6BCjjEDQy").await;
    let a = alpha();
    let pkg = skill_operator::core::package::build_from_dir(&a.path().join("alpha")).unwrap();
    let cfg = SkillConfig::for_package(&pkg, "alpha", "d", None).unwrap();
    let writer = skill_operator::oci::Registry::new(skill_operator::oci::RegistryOptions {
        auth: skill_operator::oci::Auth::Basic { username: "tester".into(), password: "s3cret".into() },
        ..skill_operator::oci::RegistryOptions::plain_http(reg.addr.clone())
    })
    .unwrap();
    let digest = writer.push(&reg.reference("skills/alpha:1"), &pkg, &cfg).await.unwrap();
    let source = |secret: Option<&str>| OciSource {
        reference: format!("{}/skills/alpha:1", reg.addr),
        pull_secret: secret.map(String::from),
        insecure: true,
    };
    let config = |pass: &str| {
        serde_json::to_vec(&serde_json::json!({"auths": {reg.addr.clone(): {"username": "tester", "password": pass}}})).unwrap()
    };
    let secrets = StaticSecrets([("good".to_string(), config("s3cret")), ("bad".to_string(), config("nope"))].into());
    let dir = tempfile::tempdir().unwrap();
    let with_secrets = PackageCache::new(CacheOptions { secrets: Some(Arc::new(secrets)), ..CacheOptions::new(dir.path()) }).unwrap();
    let err = with_secrets.acquire(&source(None), &digest).await.unwrap_err();
    assert!(matches!(&*err, CacheError::Pull { source, .. } if matches!(**source, skill_operator::oci::OciError::Auth { .. })), "{err}");
    let err = with_secrets.acquire(&source(Some("bad")), &digest).await.unwrap_err();
    assert!(matches!(&*err, CacheError::Pull { source, .. } if matches!(**source, skill_operator::oci::OciError::Auth { .. })), "{err}");
    let err = with_secrets.acquire(&source(Some("absent")), &digest).await.unwrap_err();
    assert!(matches!(&*err, CacheError::PullSecret { .. }) && err.to_string().contains("absent"), "{err}");
    let lease = with_secrets.acquire(&source(Some("good")), &digest).await.unwrap();
    assert_eq!(lease.name, "alpha");
    // Without a place to read Secrets, a package naming one is refused before any request.
    let dir2 = tempfile::tempdir().unwrap();
    let err = cache(dir2.path()).acquire(&source(Some("good")), &digest).await.unwrap_err();
    assert!(matches!(&*err, CacheError::NoSecretSource { .. }), "{err}");
}

#[tokio::test]
async fn a_digest_other_than_sha256_hex_is_refused_before_any_request() {
    let dir = tempfile::tempdir().unwrap();
    let source = OciSource { reference: "127.0.0.1:1/skills/x:1".into(), pull_secret: None, insecure: true };
    for bad in ["sha256:../../etc", "md5:abc", "sha256:ABCD", ""] {
        let err = cache(dir.path()).acquire(&source, bad).await.unwrap_err();
        assert!(matches!(&*err, CacheError::InvalidDigest { .. }), "{bad}: {err}");
    }
}

/// Gated: a real API server holds the docker-registry Secret; the cache reads it through `KubeSecrets`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_secrets_are_read_from_the_api_server() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    use skill_operator::gateway::catalog::{KubeSecrets, PullSecrets};
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip(
            "pull secrets from a real API server",
            "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver",
        );
        return;
    };
    let env = harness::Envtest::start(&assets).await;
    harness::create_namespace(&env.client, "gw-catalog-operator", false).await;
    let reg = TestRegistry::start_with_htpasswd("tester:$2b$04$Z.ZW/OHOlXPvxw5oVvfPkOGTR58bjAaX.qrTERRFtIMz6BCjjEDQy").await;
    let config = serde_json::json!({"auths": {reg.addr.clone(): {"username": "tester", "password": "s3cret"}}}).to_string();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "registry-creds"},
        "stringData": {".dockerconfigjson": config}
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "gw-catalog-operator");
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let opaque: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "opaque"}, "stringData": {"token": "x"}
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &opaque).await.unwrap();

    let kube_secrets = KubeSecrets::new(env.client.clone(), "gw-catalog-operator");
    assert_eq!(kube_secrets.docker_config("registry-creds").await.unwrap(), config.as_bytes());
    let e = kube_secrets.docker_config("opaque").await.unwrap_err();
    assert!(e.contains("no .dockerconfigjson") && e.contains("kubectl create secret docker-registry"), "{e}");
    assert!(kube_secrets.docker_config("absent").await.unwrap_err().contains("gw-catalog-operator/absent"));

    let a = alpha();
    let pkg = skill_operator::core::package::build_from_dir(&a.path().join("alpha")).unwrap();
    let cfg = SkillConfig::for_package(&pkg, "alpha", "d", None).unwrap();
    let writer = skill_operator::oci::Registry::new(skill_operator::oci::RegistryOptions {
        auth: skill_operator::oci::Auth::Basic { username: "tester".into(), password: "s3cret".into() },
        ..skill_operator::oci::RegistryOptions::plain_http(reg.addr.clone())
    })
    .unwrap();
    let digest = writer.push(&reg.reference("skills/alpha:1"), &pkg, &cfg).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = PackageCache::new(CacheOptions { secrets: Some(Arc::new(kube_secrets)), ..CacheOptions::new(dir.path()) }).unwrap();
    let source =
        OciSource { reference: format!("{}/skills/alpha:1", reg.addr), pull_secret: Some("registry-creds".into()), insecure: true };
    assert_eq!(cache.acquire(&source, &digest).await.unwrap().name, "alpha");
}
