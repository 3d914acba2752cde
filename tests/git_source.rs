//! `source::git::fetch_tree` and `package push --git` against real git
//! repositories made with the git CLI (fixed dates, so commits are stable):
//! refs resolve to `git rev-parse`'s commit, nothing in the repository runs,
//! symlinks, submodules and LFS pointers are refused entries, caps hold at
//! their edge, and a git push gives the digest of a plain checkout's push.

#[path = "source/repo.rs"]
mod repo_support;
use repo_support::{fast_import, git, write};

#[path = "oci/common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use skill_operator::core::paths::RelPath;
use skill_operator::source::git::{self, Caps, GitRef, GitSourceError};

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

const SKILL_MD: &str = "---\nname: demo\ndescription: a demo skill\n---\nHello.\n";

/// main: two commits (tag v1 on the first), a skill at `skills/demo`.
fn sample_repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    write(&repo, "README.md", "top\n");
    write(&repo, "skills/demo/SKILL.md", SKILL_MD);
    write(&repo, "skills/demo/scripts/run.py", "print('v1')\n");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    git(&repo, &["tag", "v1"]);
    write(&repo, "skills/demo/scripts/run.py", "print('v2')\n");
    git(&repo, &["commit", "-q", "-am", "two"]);
    (tmp, repo)
}

fn file_url(repo: &Path) -> String {
    format!("file://{}", repo.display())
}

fn at(repo: &Path, reference: Option<&str>, path: Option<&str>) -> GitRef {
    GitRef { url: file_url(repo), reference: reference.map(String::from), path: path.map(|p| RelPath::parse(p).unwrap()) }
}

#[test]
fn a_branch_a_tag_and_a_commit_resolve_to_git_rev_parse() {
    let (tmp, repo) = sample_repo();
    let first = git(&repo, &["rev-parse", "v1^{commit}"]);
    let head = git(&repo, &["rev-parse", "main"]);
    for (reference, commit, script) in [
        (Some("main"), &head, "print('v2')\n"),
        (Some("v1"), &first, "print('v1')\n"),
        (Some(first.as_str()), &first, "print('v1')\n"),
        (None, &head, "print('v2')\n"),
    ] {
        let dest = tmp.path().join(format!("out-{}", reference.unwrap_or("head")));
        let fetched = git::fetch_tree(&at(&repo, reference, None), &Caps::DEFAULT, &dest).unwrap();
        assert_eq!(&fetched.commit, commit, "{reference:?}");
        assert_eq!(std::fs::read_to_string(dest.join("skills/demo/scripts/run.py")).unwrap(), script);
        assert_eq!(fetched.files, 3);
        assert!(fetched.refused.is_empty());
    }
}

#[test]
fn a_subfolder_is_fetched_alone() {
    let (tmp, repo) = sample_repo();
    let dest = tmp.path().join("out");
    let fetched = git::fetch_tree(&at(&repo, Some("v1"), Some("skills/demo")), &Caps::DEFAULT, &dest).unwrap();
    assert_eq!(fetched.files, 2);
    assert_eq!(std::fs::read_to_string(dest.join("SKILL.md")).unwrap(), SKILL_MD);
    assert!(!dest.join("README.md").exists());
    assert_eq!(fetched.bytes, (SKILL_MD.len() + "print('v1')\n".len()) as u64);
}

#[test]
fn a_missing_ref_names_the_refs_and_a_missing_path_says_so() {
    let (tmp, repo) = sample_repo();
    let dest = tmp.path().join("out");
    let err = git::fetch_tree(&at(&repo, Some("nope"), None), &Caps::DEFAULT, &dest).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, GitSourceError::NoSuchRef { .. }), "{text}");
    assert!(text.contains("`nope`") && text.contains("`main`") && text.contains("`v1`"), "{text}");
    let missing = "0123456789012345678901234567890123456789";
    assert!(matches!(git::fetch_tree(&at(&repo, Some(missing), None), &Caps::DEFAULT, &dest), Err(GitSourceError::NoSuchRef { .. })));

    let err = git::fetch_tree(&at(&repo, None, Some("skills/other")), &Caps::DEFAULT, &dest).unwrap_err();
    assert!(matches!(err, GitSourceError::NoSuchPath { .. }), "{err}");
    assert!(err.to_string().contains("`skills/other` does not exist"), "{err}");
    let err = git::fetch_tree(&at(&repo, None, Some("README.md")), &Caps::DEFAULT, &dest).unwrap_err();
    assert!(matches!(err, GitSourceError::NotATree { .. }), "{err}");
    assert!(!dest.exists());
}

#[test]
fn an_attacker_repository_runs_nothing_and_writes_no_link() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let smudged = tmp.path().join("smudge-ran");
    let hooked = tmp.path().join("hook-ran");
    git(&repo, &["init", "-q", "-b", "main"]);
    // A filter whose smudge (run on checkout) and a hook (run after one)
    // would each leave a marker.
    git(&repo, &["config", "filter.evil.smudge", &format!("touch {}; cat", smudged.display())]);
    git(&repo, &["config", "filter.evil.clean", "cat"]);
    git(&repo, &["config", "filter.evil.required", "true"]);
    write(&repo, ".git/hooks/post-checkout", &format!("#!/bin/sh\ntouch {}\n", hooked.display()));
    Command::new("chmod").arg("755").arg(repo.join(".git/hooks/post-checkout")).status().unwrap();
    write(&repo, ".gitattributes", "*.md filter=evil\n");
    write(&repo, "SKILL.md", SKILL_MD);
    write(&repo, "big.bin", "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 12345\n");
    std::os::unix::fs::symlink("/etc/passwd", repo.join("passwd")).unwrap();
    std::os::unix::fs::symlink("../../x", repo.join("up")).unwrap();
    git(&repo, &["add", "."]);
    let some_commit = "1111111111111111111111111111111111111111";
    git(&repo, &["update-index", "--add", "--cacheinfo", &format!("160000,{some_commit},vendor")]);
    git(&repo, &["commit", "-q", "-m", "evil"]);

    let dest = tmp.path().join("out");
    let fetched = git::fetch_tree(&at(&repo, Some("main"), None), &Caps::DEFAULT, &dest).unwrap();
    let mut refused: Vec<(String, &str)> = fetched.refused.iter().map(|r| (r.path.clone(), r.reason)).collect();
    refused.sort();
    assert_eq!(
        refused,
        vec![
            ("big.bin".to_string(), git::REFUSED_LFS),
            ("passwd".to_string(), git::REFUSED_SYMLINK),
            ("up".to_string(), git::REFUSED_SYMLINK),
            ("vendor".to_string(), git::REFUSED_SUBMODULE),
        ]
    );
    assert!(!smudged.exists(), "a smudge filter ran");
    assert!(!hooked.exists(), "a hook ran");
    assert!(!tmp.path().join("x").exists());
    // The markdown is the blob's bytes: no filter touched it.
    assert_eq!(std::fs::read_to_string(dest.join("SKILL.md")).unwrap(), SKILL_MD);
    let mut names: Vec<String> = std::fs::read_dir(&dest).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, [".gitattributes", "SKILL.md"]);
    for entry in std::fs::read_dir(&dest).unwrap() {
        assert!(!entry.unwrap().file_type().unwrap().is_symlink());
    }
    // The trap is live: a git checkout does run the smudge filter.
    std::fs::remove_file(repo.join("SKILL.md")).unwrap();
    git(&repo, &["checkout", "--", "SKILL.md"]);
    assert!(smudged.exists(), "the control checkout did not run the filter");
}

/// Trees git's porcelain would never make, built with `git mktree`.
#[test]
fn crafted_entry_names_are_refused_before_anything_is_written() {
    for name in ["..", ".git", "a\u{1}b"] {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        write(&repo, "payload", "x\n");
        let blob = git(&repo, &["hash-object", "-w", "payload"]);
        let listing = tmp.path().join("listing");
        std::fs::write(&listing, format!("100644 blob {blob}\tSKILL.md\n100644 blob {blob}\t{name}\n")).unwrap();
        let tree = {
            let out = Command::new("git")
                .current_dir(&repo)
                .arg("mktree")
                .stdin(std::fs::File::open(&listing).unwrap())
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            assert!(out.status.success());
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let commit = git(&repo, &["commit-tree", &tree, "-m", "crafted"]);
        let dest = tmp.path().join("out");
        let err = git::fetch_tree(&at(&repo, Some(&commit), None), &Caps::DEFAULT, &dest).unwrap_err();
        assert!(matches!(err, GitSourceError::UnsafeName { .. }), "{name:?}: {err}");
        assert!(!dest.exists(), "{name:?}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2, "no staging folder left behind");
    }
}

/// A name that escapes nothing but breaks the served-path rules (a no-break
/// space on its own, as one public repository has at its root; `%`; a
/// trailing space) is a refused entry: the rest of the tree is fetched.
#[test]
fn an_odd_but_harmless_name_is_a_refused_entry_not_a_failed_fetch() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    write(&repo, "skills/demo/SKILL.md", SKILL_MD);
    for odd in ["\u{a0}", "100%.md", "trailing "] {
        write(&repo, odd, "x\n");
    }
    write(&repo, "dir%/inner.md", "x\n");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "odd"]);
    let dest = tmp.path().join("out");
    let fetched = git::fetch_tree(&at(&repo, Some("main"), None), &Caps::DEFAULT, &dest).unwrap();
    let mut refused: Vec<_> = fetched.refused.iter().map(|r| (r.path.as_str(), r.reason)).collect();
    refused.sort();
    assert_eq!(
        refused,
        [("100%.md", git::REFUSED_NAME), ("dir%", git::REFUSED_NAME), ("trailing ", git::REFUSED_NAME), ("\u{a0}", git::REFUSED_NAME)]
    );
    assert!(dest.join("skills/demo/SKILL.md").is_file());
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 1, "only skills/ was written");
}

#[test]
fn caps_hold_at_their_edge_and_leave_dest_untouched() {
    let (tmp, repo) = sample_repo();
    let whole = git::fetch_tree(&at(&repo, Some("main"), None), &Caps::DEFAULT, &tmp.path().join("whole")).unwrap();
    let cases = [
        ("file count", Caps { max_files: whole.files, ..Caps::DEFAULT }, Caps { max_files: whole.files - 1, ..Caps::DEFAULT }),
        ("total bytes", Caps { max_total_bytes: whole.bytes, ..Caps::DEFAULT }, Caps { max_total_bytes: whole.bytes - 1, ..Caps::DEFAULT }),
        ("folder depth", Caps { max_depth: 3, ..Caps::DEFAULT }, Caps { max_depth: 2, ..Caps::DEFAULT }),
        (
            "file size",
            Caps { max_file_bytes: SKILL_MD.len() as u64, ..Caps::DEFAULT },
            Caps { max_file_bytes: SKILL_MD.len() as u64 - 1, ..Caps::DEFAULT },
        ),
    ];
    for (name, at_edge, over) in cases {
        let ok = tmp.path().join(format!("ok-{name}"));
        git::fetch_tree(&at(&repo, Some("main"), None), &at_edge, &ok).unwrap_or_else(|e| panic!("{name}: {e}"));
        // An existing empty destination stays exactly that.
        let dest = tmp.path().join(format!("over-{name}"));
        std::fs::create_dir(&dest).unwrap();
        let err = git::fetch_tree(&at(&repo, Some("main"), None), &over, &dest).unwrap_err();
        match &err {
            GitSourceError::Cap { cap, .. } => assert_eq!(*cap, name),
            other => panic!("{name}: {other}"),
        }
        assert!(err.to_string().contains(name), "{err}");
        assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0, "{name}: dest was written");
    }
    let staging: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".git-fetch"))
        .collect();
    assert!(staging.is_empty(), "a staging folder was left behind");
}

#[test]
fn a_git_daemon_url_is_fetched_shallow_and_by_commit() {
    if !Path::new("/usr/lib/git-core/git-daemon").exists() {
        eprintln!("SKIPPED: git daemon is not installed");
        return;
    }
    let (tmp, repo) = sample_repo();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut daemon = repo_support::git_daemon_command()
        .args(["--export-all", "--reuseaddr", "--listen=127.0.0.1", &format!("--port={port}")])
        .arg(format!("--base-path={}", tmp.path().display()))
        .arg(tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "git daemon did not listen");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let url = format!("git://127.0.0.1:{port}/repo");
    let first = git(&repo, &["rev-parse", "v1^{commit}"]);
    let result = (|| {
        let main = git::fetch_tree(
            &GitRef { url: url.clone(), reference: Some("main".into()), path: None },
            &Caps::DEFAULT,
            &tmp.path().join("a"),
        )?;
        let tag = git::fetch_tree(
            &GitRef { url: url.clone(), reference: Some("v1".into()), path: RelPath::parse("skills/demo").ok() },
            &Caps::DEFAULT,
            &tmp.path().join("b"),
        )?;
        let by_id = git::fetch_tree(
            &GitRef { url: url.clone(), reference: Some(first.clone()), path: None },
            &Caps::DEFAULT,
            &tmp.path().join("c"),
        )?;
        let missing = git::fetch_tree(
            &GitRef { url: url.clone(), reference: Some("nope".into()), path: None },
            &Caps::DEFAULT,
            &tmp.path().join("d"),
        );
        Ok::<_, GitSourceError>((main, tag, by_id, missing))
    })();
    daemon.kill().ok();
    daemon.wait().ok();
    let (main, tag, by_id, missing) = result.unwrap();
    assert_eq!(main.commit, git(&repo, &["rev-parse", "main"]));
    assert_eq!(tag.commit, first);
    assert_eq!(std::fs::read_to_string(tmp.path().join("b/scripts/run.py")).unwrap(), "print('v1')\n");
    assert_eq!(by_id.commit, first);
    let err = missing.unwrap_err().to_string();
    assert!(err.contains("`main`"), "{err}");
}

fn push(args: &[&str], host: &str) -> (String, String) {
    let out = Command::new(BIN)
        .args(["package", "push"])
        .args(args)
        .args(["--registry", &format!("{host}/skills"), "--plain-http"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let digest = stdout.lines().find_map(|l| l.strip_prefix("# digest: ")).unwrap().to_string();
    (digest, stdout)
}

#[tokio::test]
async fn package_push_from_git_equals_a_push_of_a_plain_checkout() {
    let registry = common::TestRegistry::start().await;
    let host = registry.reference("x").split('/').next().unwrap().to_string();
    let (tmp, repo) = sample_repo();
    let commit = git(&repo, &["rev-parse", "v1^{commit}"]);
    let url = file_url(&repo);
    let (from_git, stdout) = push(&["--git", &url, "--ref", "v1", "--path", "skills/demo", "--tag", "git"], &host);
    assert!(stdout.contains(&format!("# commit: {commit}")), "{stdout}");
    assert!(stdout.contains(&format!("# source: {url}")) && stdout.contains("# path: skills/demo"), "{stdout}");
    let pkg: skill_operator::api::SkillPackage =
        serde_norway::from_str(&stdout.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n")).unwrap();
    let annotations = pkg.metadata.annotations.unwrap();
    assert_eq!(annotations.get(skill_operator::oci::publish::ANNOTATION_REVISION), Some(&commit));
    assert_eq!(annotations.get(skill_operator::oci::publish::ANNOTATION_SOURCE), Some(&url));

    let checkout = tmp.path().join("checkout");
    git(tmp.path(), &["clone", "-q", "--no-checkout", repo.to_str().unwrap(), "checkout"]);
    git(&checkout, &["checkout", "-q", "v1"]);
    let (from_dir, _) = push(&[checkout.join("skills/demo").to_str().unwrap(), "--tag", "dir"], &host);
    assert_eq!(from_git, from_dir, "a git push and a checkout push differ");
}

/// The hostile repositories a SkillSource may be pointed at, at full size:
/// a 1 GiB file, 100,000 files and folders 50 deep, each on its own branch.
/// Each is refused by the whole-source caps with the cap it hit, before a
/// byte is written, and a source reports it as refused (not to be retried).
#[test]
fn a_source_refuses_a_1_gib_file_100_000_files_and_depth_50() {
    use skill_operator::source::snapshot::{self, Origin, SnapshotError};
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("hostile");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "--bare"]);
    const GIB: u64 = 1 << 30;
    fast_import(&repo, |w| {
        let commit = |w: &mut dyn std::io::Write, branch: &str, files: &mut dyn FnMut(&mut dyn std::io::Write)| {
            writeln!(w, "commit refs/heads/{branch}\ncommitter t <t@example.invalid> 1767225600 +0000\ndata 1\nx").unwrap();
            writeln!(w, "M 100644 inline SKILL.md\ndata 42\n---\nname: x\ndescription: a hostile one\n---").unwrap();
            files(w);
            writeln!(w).unwrap();
        };
        // One blob of 1 GiB of zeros, streamed (it compresses to about 1 MiB).
        writeln!(w, "blob\nmark :1\ndata {GIB}").unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(GIB >> 20) {
            w.write_all(&zeros).unwrap();
        }
        writeln!(w).unwrap();
        writeln!(w, "blob\nmark :2\ndata 2\nhi").unwrap();
        commit(w, "huge", &mut |w| writeln!(w, "M 100644 :1 skills/x/big.bin").unwrap());
        commit(w, "many", &mut |w| {
            for i in 0..100_000 {
                writeln!(w, "M 100644 :2 skills/x/d{}/f{i}", i / 1000).unwrap();
            }
        });
        commit(w, "deep", &mut |w| {
            let deep: Vec<String> = (0..50).map(|i| format!("d{i}")).collect();
            writeln!(w, "M 100644 :2 {}/f", deep.join("/")).unwrap();
        });
    });
    let url = file_url(&repo);
    for (branch, cap) in [("huge", "file size"), ("many", "file count"), ("deep", "folder depth")] {
        let dest = tmp.path().join(branch);
        let err = git::fetch_tree(&at(&repo, Some(branch), None), &snapshot::CAPS, &dest).unwrap_err();
        assert!(matches!(&err, GitSourceError::Cap { cap: hit, .. } if *hit == cap), "{branch}: {err}");
        assert!(!dest.exists(), "{branch}: something was written");
        let source = GitRef { url: url.clone(), reference: Some(branch.into()), path: None };
        let origin = Origin::Git { source, access: git::Access::command_line(), follow_hosts: Vec::new() };
        let refused = snapshot::take(&origin).unwrap_err();
        assert!(matches!(refused, SnapshotError::Git(GitSourceError::Cap { .. })) && !refused.is_transient(), "{branch}: {refused}");
    }
}
