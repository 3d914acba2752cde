//! Git repositories made by the tests with the git CLI: a fixed identity
//! and dates and no user or system configuration, so commits are stable.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

/// Runs git in `dir`; returns stdout, trimmed.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Writes `text` at `root/rel`, making its folders.
pub(crate) fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Feeds `script` to `git fast-import` in `repo`: the way to make very
/// large or very deep trees quickly.
pub(crate) fn fast_import(repo: &Path, script: impl FnOnce(&mut dyn std::io::Write)) {
    let mut child = Command::new("git")
        .current_dir(repo)
        .args(["fast-import", "--quiet"])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = std::io::BufWriter::new(child.stdin.take().unwrap());
        script(&mut stdin);
        std::io::Write::flush(&mut stdin).unwrap();
    }
    assert!(child.wait().unwrap().success(), "git fast-import failed");
}

/// `git daemon` as its own process: `git daemon` forks the real daemon and
/// killing that parent left the daemon serving, so tests start the program
/// from git's exec path directly and their kill reaches it.
pub(crate) fn git_daemon_command() -> Command {
    let exec_path = Command::new("git").arg("--exec-path").output().expect("git runs");
    let dir = String::from_utf8(exec_path.stdout).unwrap().trim().to_string();
    Command::new(Path::new(&dir).join("git-daemon"))
}
