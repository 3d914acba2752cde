//! SkillSources against a real kube-apiserver, a real registry
//! (`docker-registry`) and real git servers on loopback (`git daemon`, and
//! `git http-backend` behind tests/source/git_http.py):
//!
//! - a repository in nested layouts becomes one Ready SkillPackage per
//!   skill, pinned to `git rev-parse`'s commit, named by path, with the
//!   root's LICENSE beside a nested skill; what it holds that must not be
//!   followed (a symlink out of the tree, a submodule, an LFS pointer) or
//!   served (a skill without a description) is reported, and its
//!   `.gitattributes` filter and hook-shaped files run nothing;
//! - `Check` reports a newer commit and what would change, touching no
//!   package; approving it publishes, keeps the unchanged skill's package,
//!   keeps the bound superseded one and says so, deletes the unbound one;
//! - a private repository over HTTP gets its token from a Secret, and only
//!   its host sees it; without the Secret the source says why;
//! - a private repository over SSH (a real sshd) gets its client key and
//!   pinned host key from a Secret; a Secret without `known_hosts` is refused;
//! - a marketplace's plugin in another repository is followed when its host
//!   is listed and its entry pins a `sha` (at that commit, with its own
//!   provenance and licence); unpinned or other-host entries are reported;
//! - a ZIP over HTTP is published when its digest matches, refused when it
//!   does not, and refused over plain HTTP without `insecure`;
//! - a source naming the controller's own files, plain HTTP, or both git
//!   and zip is refused.
//!
//! SKIPPED without KUBEBUILDER_ASSETS, docker-registry or git daemon.

#[path = "source/repo.rs"]
mod repo_support;
use repo_support::{git, write};

#[path = "oci/common.rs"]
mod common;
#[path = "envtest/harness.rs"]
mod harness;
#[path = "source/sshd.rs"]
mod sshd_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use skill_operator::api::source::{SkillSource, APPROVE_ANNOTATION, REFRESH_ANNOTATION, SOURCE_LABEL};
use skill_operator::api::{SkillBinding, SkillPackage};
use skill_operator::controller::context::Context;
use skill_operator::controller::context::SourceTarget;
use skill_operator::controller::metrics::Metrics;
use skill_operator::controller::resolver::OciResolver;

const GIT_DAEMON: &str = "/usr/lib/git-core/git-daemon";

fn skill(name: &str, extra: &str) -> String {
    format!("---\nname: {name}\ndescription: the {name} skill{extra}\n---\nUse it.\n")
}

/// A repository in the layouts real ones use, with everything an attacker
/// would plant: a symlink out of the tree, a submodule, an LFS pointer, a
/// smudge filter that would write a marker if it ever ran, a hook-shaped
/// script.
fn hostile_repo(base: &Path, marker: &Path) -> PathBuf {
    let repo = base.join("skills-repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    write(&repo, "LICENSE", "MIT License\n");
    write(&repo, "plugins/docs/skills/pdf/SKILL.md", &skill("pdf", ""));
    write(&repo, "plugins/docs/skills/pdf/scripts/run.py", "print('pdf')\n");
    write(&repo, "skills/tools/lint/SKILL.md", &skill("lint", ""));
    write(&repo, "skills/broken/SKILL.md", "---\nname: broken\n---\nno description\n");
    write(&repo, ".gitattributes", "*.py filter=evil\n");
    write(&repo, "skills/tools/lint/big.bin", "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n");
    write(&repo, ".githooks/post-checkout", &format!("#!/bin/sh\ntouch {}\n", marker.display()));
    std::os::unix::fs::symlink("/etc/passwd", repo.join("skills/tools/lint/passwd")).unwrap();
    git(&repo, &["config", "filter.evil.smudge", &format!("sh -c 'touch {}; cat'", marker.display())]);
    git(&repo, &["add", "."]);
    // A submodule entry (a gitlink) pointing elsewhere.
    git(&repo, &["update-index", "--add", "--cacheinfo", "160000,1111111111111111111111111111111111111111,vendor/elsewhere"]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    repo
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_port(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "port {port} did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn git_daemon(base: &Path) -> (Server, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = repo_support::git_daemon_command()
        .args(["--export-all", "--reuseaddr", "--listen=127.0.0.1", &format!("--port={port}")])
        .arg(format!("--base-path={}", base.display()))
        .arg(base)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_port(port);
    (Server(child), port)
}

/// tests/source/git_http.py over `base`, requiring `token`; its request log.
fn git_http(base: &Path, token: &str) -> (Server, u16, PathBuf) {
    let port_file = base.join("http.port");
    let log = base.join("http.log");
    let child = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/source/git_http.py"))
        .arg(base)
        .arg(&port_file)
        .env("GIT_HTTP_TOKEN", token)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let port = loop {
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            break text.trim().parse::<u16>().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "git_http.py did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    wait_port(port);
    (Server(child), port, log)
}

async fn status_of(api: &Api<SkillSource>, name: &str) -> Option<skill_operator::api::SkillSourceStatus> {
    api.get(name).await.ok()?.status
}

async fn annotate(api: &Api<SkillSource>, name: &str, key: &str, value: &str) {
    let patch = json!({ "metadata": { "annotations": { key: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
}

async fn packages_of(api: &Api<SkillPackage>, source: &str) -> Vec<SkillPackage> {
    let mut items = api.list(&ListParams::default().labels(&format!("{SOURCE_LABEL}={source}"))).await.unwrap().items;
    items.sort_by_key(|p| p.metadata.name.clone());
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_publish_check_and_refuse_against_a_real_api_server() {
    let Some(assets) = harness::assets() else {
        eprintln!("SKIPPED: set KUBEBUILDER_ASSETS to run the SkillSource envtest suite");
        return;
    };
    for (bin, what) in [(common::REGISTRY_BIN, "docker-registry"), (GIT_DAEMON, "git daemon")] {
        if !Path::new(bin).exists() {
            eprintln!("SKIPPED: {what} is not installed ({bin})");
            return;
        }
    }
    let registry = common::TestRegistry::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("ran");
    let repo = hostile_repo(tmp.path(), &marker);
    let (_daemon, port) = git_daemon(tmp.path());
    let url = format!("git://127.0.0.1:{port}/skills-repo");

    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::install_crds(&client).await;
    harness::create_namespace(&client, "skill-system", false).await;
    harness::create_namespace(&client, "team", false).await;
    let options = skill_operator::oci::RegistryOptions::plain_http(registry.addr.clone());
    let resolver = OciResolver { plain_http: vec![registry.addr.clone()], credentials: Vec::new() };
    let ctx = Context::new(
        client.clone(),
        Arc::new(Metrics::default()),
        harness::operator_config(),
        Arc::new(resolver),
        Arc::new(skill_operator::controller::context::NoArtifacts),
    )
    .with_sources(SourceTarget { repository: format!("{}/sources", registry.addr), options });
    let _controller = harness::spawn_context(Arc::new(ctx));

    let sources: Api<SkillSource> = Api::all(client.clone());
    let packages: Api<SkillPackage> = Api::all(client.clone());
    harness::create(
        &sources,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": "team" },
            "spec": { "git": { "url": url, "ref": "main" }, "updatePolicy": "Check", "checkIntervalSeconds": 3600 }
        }),
    )
    .await;
    let first = git(&repo, &["rev-parse", "main"]);
    let status = harness::wait_for(
        || async { status_of(&sources, "team").await.filter(|s| s.commit.is_some() && harness::ready(&s.conditions).is_some()) },
        "the source published",
    )
    .await;
    assert_eq!(status.commit.as_deref(), Some(first.as_str()), "pinned to git rev-parse's commit");
    let names: Vec<(&str, &str)> = status.skills.iter().map(|s| (s.name.as_str(), s.path.as_str())).collect();
    assert_eq!(names, [("docs/pdf", "plugins/docs/skills/pdf"), ("tools/lint", "skills/tools/lint")]);
    let problems = status.problems.join("\n");
    for expected in [
        "skills/tools/lint/passwd: a symlink",
        "vendor/elsewhere: a submodule",
        "skills/tools/lint/big.bin: a Git LFS pointer",
        "skills/broken",
    ] {
        assert!(problems.contains(expected), "`{expected}` not reported in:\n{problems}");
    }
    assert_eq!(status.problem_count as usize, status.problems.len());
    assert!(!marker.exists(), "a filter or hook of the repository ran");

    // One Ready SkillPackage per skill, validated by the controller's own
    // pull from the registry, served under its path's last segment.
    let pkgs = harness::wait_for(
        || async {
            let pkgs = packages_of(&packages, "team").await;
            (pkgs.len() == 2 && pkgs.iter().all(|p| p.status.as_ref().is_some_and(|s| harness::ready(&s.conditions).is_some())))
                .then_some(pkgs)
        },
        "two Ready SkillPackages",
    )
    .await;
    let served: Vec<_> = pkgs.iter().map(|p| p.status.as_ref().unwrap().skill_name.clone().unwrap()).collect();
    assert_eq!(served, ["pdf", "lint"], "each served under its path's last segment");
    for p in &pkgs {
        let ann = p.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann.get("org.opencontainers.image.revision"), Some(&first));
        assert_eq!(ann.get("org.opencontainers.image.source"), Some(&url));
        assert!(p.spec.runtime.is_none(), "instructions only until an admin sets a profile");
        assert_eq!(p.metadata.owner_references.as_ref().unwrap()[0].kind, "SkillSource");
    }
    let lint_pkg = pkgs.iter().find(|p| p.status.as_ref().unwrap().skill_name.as_deref() == Some("lint")).unwrap().clone();
    let pulled = registry.registry().pull(&lint_pkg.spec.source.oci.reference).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    skill_operator::core::package::unpack(&pulled.package, &dir.path().join("p")).unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("p/LICENSE")).unwrap(), "MIT License\n", "the root's LICENSE travels");
    assert!(!dir.path().join("p/passwd").exists(), "a symlink is never packaged");

    // A newer commit: Check reports it and what would change, touching nothing.
    write(&repo, "skills/tools/lint/SKILL.md", &skill("lint", " (v2)"));
    write(&repo, "skills/new/SKILL.md", &skill("new", ""));
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "two"]);
    let second = git(&repo, &["rev-parse", "main"]);
    annotate(&sources, "team", REFRESH_ANNOTATION, "check-1").await;
    let status =
        harness::wait_for(|| async { status_of(&sources, "team").await.filter(|s| s.available.is_some()) }, "the newer commit reported")
            .await;
    let available = status.available.unwrap();
    assert_eq!(available.commit, second);
    assert_eq!((available.added, available.removed, available.changed), (vec!["new".to_string()], vec![], vec!["tools/lint".to_string()]));
    assert_eq!(status.commit.as_deref(), Some(first.as_str()), "Check moves nothing");
    assert_eq!(packages_of(&packages, "team").await.len(), 2, "Check creates no package");

    // Bind the old lint package, then approve: the bound one stays, says so.
    harness::create(
        &Api::<SkillBinding>::namespaced(client.clone(), "team"),
        json!({ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding", "metadata": { "name": "lint", "namespace": "team" },
                "spec": { "package": lint_pkg.metadata.name } }),
    )
    .await;
    harness::wait_for(
        || async {
            let b = Api::<SkillBinding>::namespaced(client.clone(), "team").get("lint").await.ok()?;
            harness::ready(&b.status?.conditions)
        },
        "the binding Ready",
    )
    .await;
    // The branch moves on after the check: approving the reported commit
    // publishes that commit, not the branch's newer head.
    write(&repo, "skills/late/SKILL.md", &skill("late", ""));
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "three"]);
    let third = git(&repo, &["rev-parse", "main"]);
    annotate(&sources, "team", APPROVE_ANNOTATION, &second).await;
    let status = harness::wait_for(
        || async { status_of(&sources, "team").await.filter(|s| s.commit.as_deref() != Some(first.as_str())) },
        "the approved commit published",
    )
    .await;
    assert_eq!(status.commit.as_deref(), Some(second.as_str()), "exactly the approved commit is published");
    assert!(status.available.is_none());
    let names: Vec<&str> = status.skills.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["docs/pdf", "new", "tools/lint"]);
    let old_pdf = pkgs.iter().find(|p| p.metadata.name.as_deref().unwrap().contains("docs-pdf")).unwrap();
    assert_eq!(status.skills[0].package, old_pdf.metadata.name.clone().unwrap(), "unchanged files keep their package");
    let lint_now = &status.skills[2].package;
    assert_ne!(lint_now, lint_pkg.metadata.name.as_ref().unwrap(), "changed files are a new package");
    assert!(
        status.problems.iter().any(|p| p.starts_with(lint_pkg.metadata.name.as_ref().unwrap()) && p.contains("superseded but still bound")),
        "{:?}",
        status.problems
    );
    let binding = Api::<SkillBinding>::namespaced(client.clone(), "team").get("lint").await.unwrap();
    assert_eq!(binding.spec.package, lint_pkg.metadata.name.clone().unwrap(), "a binding never moves by itself");
    let all: Vec<String> = packages_of(&packages, "team").await.into_iter().filter_map(|p| p.metadata.name).collect();
    assert_eq!(all.len(), 4, "three current packages and the bound superseded one: {all:?}");

    // A private repository over smart HTTP: the token comes from a Secret.
    let (_http, http_port, http_log) = git_http(tmp.path(), "s3cret-token");
    let private = format!("http://127.0.0.1:{http_port}/skills-repo");
    harness::create(
        &sources,
        json!({ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": "private" },
                "spec": { "git": { "url": private, "path": "skills/tools", "secretRef": "repo-token", "insecure": true } } }),
    )
    .await;
    let failed = harness::wait_for(
        || async { status_of(&sources, "private").await.filter(|s| s.conditions.iter().any(|c| c.type_ == "Fetched")) },
        "the missing Secret reported",
    )
    .await;
    let fetched = failed.conditions.iter().find(|c| c.type_ == "Fetched").unwrap();
    assert_eq!((fetched.status.as_str(), fetched.reason.as_str()), ("False", "SecretMissing"), "{}", fetched.message);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "skill-system");
    harness::create(
        &secrets,
        json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "repo-token", "namespace": "skill-system" },
                "stringData": { "token": "s3cret-token" } }),
    )
    .await;
    annotate(&sources, "private", REFRESH_ANNOTATION, "with-secret").await;
    let status =
        harness::wait_for(|| async { status_of(&sources, "private").await.filter(|s| s.commit.is_some()) }, "the private source published")
            .await;
    assert_eq!(status.commit.as_deref(), Some(third.as_str()), "the branch's head");
    let names: Vec<&str> = status.skills.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["lint"], "a path's folder is the root the names start from");
    let log = std::fs::read_to_string(&http_log).unwrap();
    assert!(log.lines().any(|l| l.contains("auth=yes ok=True")), "the token was sent:\n{log}");

    // A private repository over SSH: the client key and the pinned host key
    // come from a Secret; without `known_hosts` the source says to pin one.
    let client_key = tmp.path().join("ssh-client");
    let client_pub = sshd_support::keygen(&client_key);
    let ssh_dir = tmp.path().join("sshd");
    std::fs::create_dir(&ssh_dir).unwrap();
    if let Some(server) = sshd_support::sshd(&ssh_dir, &client_pub) {
        let ssh_url = format!("ssh://{}@127.0.0.1:{}{}", sshd_support::user(), server.port, repo.display());
        let private = std::fs::read_to_string(&client_key).unwrap();
        for (name, data) in [
            ("repo-ssh", json!({ "ssh-privatekey": private, "known_hosts": server.known_hosts() })),
            ("repo-ssh-unpinned", json!({ "ssh-privatekey": private })),
        ] {
            harness::create(
                &secrets,
                json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": name, "namespace": "skill-system" },
                        "type": "kubernetes.io/ssh-auth", "stringData": data }),
            )
            .await;
            harness::create(
                &sources,
                json!({ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": name },
                        "spec": { "git": { "url": ssh_url, "path": "skills/tools", "secretRef": name } } }),
            )
            .await;
        }
        let status = harness::wait_for(
            || async { status_of(&sources, "repo-ssh").await.filter(|s| s.commit.is_some()) },
            "the SSH source published",
        )
        .await;
        assert_eq!(status.commit.as_deref(), Some(third.as_str()));
        assert_eq!(status.skills.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["lint"]);
        let unpinned = harness::wait_for(
            || async { status_of(&sources, "repo-ssh-unpinned").await.filter(|s| s.conditions.iter().any(|c| c.type_ == "Fetched")) },
            "the unpinned SSH source refused",
        )
        .await;
        let c = unpinned.conditions.iter().find(|c| c.type_ == "Fetched").unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "SecretMissing"), "{}", c.message);
        assert!(c.message.contains("known_hosts"), "{}", c.message);
        assert!(server.logins() >= 1);
    }

    // A marketplace listing plugins of other repositories: the one pinned
    // by `sha` on a listed host is fetched at that commit (not the branch's
    // newer head) and named `<plugin>/<skill>` with its own provenance; an
    // unpinned one and one on another host are reported and never fetched.
    let plugin_repo = tmp.path().join("plugin-repo");
    std::fs::create_dir_all(&plugin_repo).unwrap();
    git(&plugin_repo, &["init", "-q", "-b", "main"]);
    write(&plugin_repo, "LICENSE", "Apache-2.0 (the plugin's own)\n");
    write(&plugin_repo, "plugins/kit/skills/chart/SKILL.md", &skill("chart", ""));
    write(&plugin_repo, "plugins/kit/LICENSE", "Apache-2.0 (the plugin's own)\n");
    std::os::unix::fs::symlink("/etc/shadow", plugin_repo.join("plugins/kit/skills/chart/shadow")).unwrap();
    git(&plugin_repo, &["add", "."]);
    git(&plugin_repo, &["commit", "-q", "-m", "kit one"]);
    let pinned = git(&plugin_repo, &["rev-parse", "main"]);
    write(&plugin_repo, "plugins/kit/skills/later/SKILL.md", &skill("later", ""));
    git(&plugin_repo, &["add", "."]);
    git(&plugin_repo, &["commit", "-q", "-m", "kit two"]);
    let plugin_url = format!("git://127.0.0.1:{port}/plugin-repo");
    let market_repo = tmp.path().join("market");
    std::fs::create_dir_all(&market_repo).unwrap();
    git(&market_repo, &["init", "-q", "-b", "main"]);
    write(&market_repo, "LICENSE", "MIT (the marketplace's)\n");
    write(&market_repo, "plugins/local/skills/notes/SKILL.md", &skill("notes", ""));
    let marketplace = json!({ "name": "market", "plugins": [
        { "name": "kit", "source": { "source": "git-subdir", "url": plugin_url, "path": "plugins/kit", "ref": "main", "sha": pinned } },
        { "name": "moving", "source": { "source": "url", "url": plugin_url, "ref": "main" } },
        { "name": "faraway", "source": { "source": "github", "repo": "acme/faraway", "sha": pinned } },
        { "name": "local", "source": "./plugins/local" }
    ]});
    write(&market_repo, ".claude-plugin/marketplace.json", &marketplace.to_string());
    git(&market_repo, &["add", "."]);
    git(&market_repo, &["commit", "-q", "-m", "market"]);
    harness::create(
        &sources,
        json!({ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": "market" },
                "spec": { "git": { "url": format!("git://127.0.0.1:{port}/market"), "followHosts": ["127.0.0.1"] } } }),
    )
    .await;
    let status =
        harness::wait_for(|| async { status_of(&sources, "market").await.filter(|s| s.commit.is_some()) }, "the marketplace published")
            .await;
    let names: Vec<(&str, &str)> = status.skills.iter().map(|s| (s.name.as_str(), s.path.as_str())).collect();
    assert_eq!(names, [("kit/chart", "plugins/kit/skills/chart"), ("local/notes", "plugins/local/skills/notes")], "{:?}", status.problems);
    assert_eq!(status.followed.len(), 1);
    let kit = &status.followed[0];
    assert_eq!(
        (kit.plugin.as_str(), kit.url.as_str(), kit.path.as_deref(), kit.commit.as_str()),
        ("kit", plugin_url.as_str(), Some("plugins/kit"), pinned.as_str())
    );
    let problems = status.problems.join("\n");
    for expected in [
        "`moving` (plugins[1]) is not followed: the marketplace does not pin it",
        "`faraway` (plugins[2]) is not followed: its host \"github.com\" is not in spec.git.followHosts",
        "skills/chart/shadow: a symlink",
    ] {
        assert!(problems.contains(expected), "`{expected}` not reported in:\n{problems}");
    }
    let pkgs = packages_of(&packages, "market").await;
    let chart =
        pkgs.iter().find(|p| p.annotations().get("skill-operator.dev/source-skill").map(String::as_str) == Some("kit/chart")).unwrap();
    let ann = chart.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann.get("org.opencontainers.image.source"), Some(&plugin_url), "a followed skill names its own repository");
    assert_eq!(ann.get("org.opencontainers.image.revision"), Some(&pinned), "and the commit the marketplace pins");
    let pulled = registry.registry().pull(&chart.spec.source.oci.reference).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    skill_operator::core::package::unpack(&pulled.package, &dir.path().join("p")).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("p/LICENSE")).unwrap(),
        "Apache-2.0 (the plugin's own)\n",
        "the plugin's licence, not the marketplace's"
    );
    assert!(!dir.path().join("p/shadow").exists());

    // A ZIP over HTTP (insecure: a loopback server), pinned by digest; a
    // wrong digest is refused before anything is read from the archive.
    let zips = tmp.path().join("zips");
    std::fs::create_dir(&zips).unwrap();
    let archive = {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default();
        for (name, text) in [("bundle/skills/csv/SKILL.md", skill("csv", "")), ("bundle/skills/csv/scripts/stats.py", "print(1)\n".into())]
        {
            zip.start_file(name, opts).unwrap();
            zip.write_all(text.as_bytes()).unwrap();
        }
        zip.finish().unwrap().into_inner()
    };
    std::fs::write(zips.join("skills.zip"), &archive).unwrap();
    let zip_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _zip_server = Server(
        Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1", &zip_port.to_string(), "--directory"])
            .arg(&zips)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(zip_port);
    let digest = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(&archive));
    let zip_url = format!("http://127.0.0.1:{zip_port}/skills.zip");
    for (name, digest, insecure) in
        [("zip", digest.clone(), true), ("zip-moved", format!("sha256:{}", "0".repeat(64)), true), ("zip-plain", digest, false)]
    {
        harness::create(
            &sources,
            json!({ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": name },
                    "spec": { "zip": { "url": zip_url, "digest": digest, "path": "bundle", "insecure": insecure } } }),
        )
        .await;
    }
    let status = harness::wait_for(|| async { status_of(&sources, "zip").await.filter(|s| s.commit.is_some()) }, "the ZIP published").await;
    let names: Vec<&str> = status.skills.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["csv"]);
    for (name, reason) in [("zip-moved", "DigestMismatch"), ("zip-plain", "InvalidSpec")] {
        let status = harness::wait_for(
            || async { status_of(&sources, name).await.filter(|s| s.conditions.iter().any(|c| c.type_ == "Fetched")) },
            "the ZIP refusal",
        )
        .await;
        let c = status.conditions.iter().find(|c| c.type_ == "Fetched").unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason), "{name}: {}", c.message);
        assert!(packages_of(&packages, name).await.is_empty());
    }

    // Refusals: the controller's own files, plain HTTP without `insecure`,
    // and a spec naming both kinds of source.
    for (name, url, reason) in [("local", "file:///etc", "local paths"), ("plain", "http://127.0.0.1:1/r", "http://")] {
        harness::create(
            &sources,
            json!({ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": name },
                    "spec": { "git": { "url": url } } }),
        )
        .await;
        let status = harness::wait_for(
            || async { status_of(&sources, name).await.filter(|s| s.conditions.iter().any(|c| c.type_ == "Fetched")) },
            "the refusal",
        )
        .await;
        let c = status.conditions.iter().find(|c| c.type_ == "Fetched").unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Refused"), "{name}: {}", c.message);
        assert!(c.message.contains(reason), "{name}: {}", c.message);
        assert!(status.skills.is_empty() && packages_of(&packages, name).await.is_empty());
    }
    let both: SkillSource = serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": "both" },
        "spec": { "git": { "url": "https://h/r" }, "zip": { "url": "https://h/r.zip", "digest": format!("sha256:{}", "0".repeat(64)) } }
    }))
    .unwrap();
    let err = sources.create(&Default::default(), &both).await.unwrap_err().to_string();
    assert!(err.contains("exactly one of git and zip"), "{err}");
}
