#![allow(dead_code)]
//! Shared helpers for the executor tests. Tests spawn real bash/python3/node.
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use skill_operator::runner::process::{ExecSpec, RunAs};
use skill_operator::runner::sandbox::{detect_bwrap, SandboxSpec};
use skill_operator::runner::sandbox_probe::{builtin_self_test, bwrap_self_test};

pub(crate) const PY: &str = "/usr/bin/python3";
pub(crate) const NODE: &str = "/usr/bin/node";
pub(crate) const BASH: &str = "/usr/bin/bash";

pub(crate) fn init_tracing() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
    });
}

pub(crate) fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

pub(crate) fn base_env() -> Vec<(OsString, OsString)> {
    vec![("PATH".into(), "/usr/bin:/bin".into()), ("HOME".into(), "/tmp".into()), ("LANG".into(), "C.UTF-8".into())]
}

/// A spec with a minimal env, cwd /tmp, short defaults for tests.
pub(crate) fn spec(program: &str, args: &[&str]) -> ExecSpec {
    init_tracing();
    let mut s = ExecSpec::new(program, "/tmp");
    s.args = args.iter().map(OsString::from).collect();
    s.env = base_env();
    s.timeout = Duration::from_secs(20);
    s
}

/// A uid no other test (and, we assume, nothing else on the machine) uses, so
/// RLIMIT_NPROC accounting and "no process of this uid is left" checks are isolated.
pub(crate) fn fresh_uid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    61000 + (std::process::id() % 200) * 20 + NEXT.fetch_add(1, Ordering::SeqCst)
}

pub(crate) fn as_user(s: &mut ExecSpec, uid: u32) {
    s.run_as = RunAs::User { uid, gid: uid };
}

/// A temp dir owned by `uid` (0700), for use as cwd / writable work dir.
pub(crate) fn workdir_for(uid: u32) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    chown(d.path(), uid);
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    d
}

pub(crate) fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).expect("chown");
}

/// A world-readable temp dir (0755) holding `files` (0644), like an installed skill package.
pub(crate) fn package(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for (name, body) in files {
        let p = d.path().join(name);
        std::fs::write(&p, body).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    d
}

/// Live (non-zombie) processes whose real uid is `uid`.
pub(crate) fn procs_of_uid(uid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else { continue };
        let mut is_uid = false;
        let mut zombie = false;
        for line in status.lines() {
            if let Some(rest) = line.strip_prefix("Uid:") {
                is_uid = rest.split_whitespace().next() == Some(&uid.to_string());
            }
            if let Some(rest) = line.strip_prefix("State:") {
                zombie = rest.trim_start().starts_with('Z') || rest.trim_start().starts_with('X');
            }
        }
        if is_uid && !zombie {
            out.push(pid);
        }
    }
    out
}

/// Wait up to `within` for every process of `uid` to be gone; returns the leftovers.
pub(crate) fn wait_uid_gone(uid: u32, within: Duration) -> Vec<i32> {
    let end = Instant::now() + within;
    loop {
        let left = procs_of_uid(uid);
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn kill_uid(uid: u32) {
    for pid in procs_of_uid(uid) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

pub(crate) fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // state is the field after the ")" that closes comm
            let state = s.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("X");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Which sandbox the sandbox tests exercise: `SKILL_OPERATOR_TEST_SANDBOX=builtin`
/// runs every one of them against the built-in sandbox (scripts/test.sh runs
/// them both ways); otherwise bubblewrap.
pub(crate) fn test_builtin() -> bool {
    std::env::var("SKILL_OPERATOR_TEST_SANDBOX").is_ok_and(|v| v == "builtin")
}

/// This build's binary, open for the built-in sandbox's launcher (kept for the test process's life).
pub(crate) fn self_exe() -> std::sync::Arc<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    static EXE: OnceLock<std::sync::Arc<std::os::fd::OwnedFd>> = OnceLock::new();
    EXE.get_or_init(|| {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(env!("CARGO_BIN_EXE_skill-operator"))
            .expect("open the skill-operator binary");
        std::sync::Arc::new(file.into())
    })
    .clone()
}

/// The sandbox base, or None (test skipped) when bwrap is not installed. When bwrap is
/// installed the self-test must pass: a broken sandbox is a failure, not a skip. With
/// [`test_builtin`], the built-in sandbox, whose self-test must pass.
pub(crate) async fn sandbox() -> Option<SandboxSpec> {
    init_tracing();
    if test_builtin() {
        let exe = self_exe();
        builtin_self_test(exe.clone(), RunAs::Auto).await.expect("built-in sandbox self-test");
        return Some(SandboxSpec::builtin(std::os::fd::AsRawFd::as_raw_fd(exe.as_ref())));
    }
    let Some(bwrap) = detect_bwrap() else {
        skill_operator::gated::skip("sandbox test", "bwrap not installed (apt-get install bubblewrap)");
        return None;
    };
    bwrap_self_test(&bwrap, RunAs::Auto).await.expect("bwrap self-test");
    Some(SandboxSpec::new(bwrap))
}

pub(crate) fn split_nul(b: &[u8]) -> Vec<String> {
    b.split(|c| *c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(crate) fn path(s: &Path) -> PathBuf {
    s.to_path_buf()
}
