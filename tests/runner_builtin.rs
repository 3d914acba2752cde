//! The built-in sandbox (`skill-operator sandbox-exec`), attacked from the
//! script inside it: the rules bubblewrap has no flag for (seccomp, the
//! init's command line), the ones it shares (capabilities, nested user
//! namespaces, mounts; checked against bubblewrap too where it is
//! installed), and the launcher's own command line. Every other fence
//! rule is checked by the runner and fence suites, which scripts/test.sh
//! runs against this sandbox as well (`SKILL_OPERATOR_TEST_SANDBOX=builtin`).
#[path = "runner/common.rs"]
mod common;
use common::*;

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;

use skill_operator::runner::process::{execute, ExecOutcome, RunAs};
use skill_operator::runner::sandbox::{detect_bwrap, SandboxSpec};
use skill_operator::runner::sandbox_probe::builtin_self_test;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

/// The built-in sandbox, or None (SKIPPED) where this kernel gives an
/// unprivileged process no user namespace.
async fn builtin() -> Option<SandboxSpec> {
    let exe = self_exe();
    if let Err(err) = builtin_self_test(exe.clone(), RunAs::Auto).await {
        skill_operator::gated::skip("built-in sandbox", &format!("it does not work on this kernel: {err}"));
        return None;
    }
    Some(SandboxSpec::builtin(exe.as_raw_fd()))
}

/// Both sandboxes where they work here: the rule must hold in each.
async fn every_sandbox() -> Vec<SandboxSpec> {
    let mut all: Vec<SandboxSpec> = builtin().await.into_iter().collect();
    if let Some(bwrap) = detect_bwrap() {
        all.push(SandboxSpec::new(bwrap));
    }
    all
}

async fn python(sb: &SandboxSpec, code: &str) -> ExecOutcome {
    let mut s = spec(PY, &["-c", code]);
    s.sandbox = Some(sb.clone());
    execute(s).await.expect("the sandbox starts")
}

/// A raw syscall from the script, printed as `rc errno`.
fn syscall_probe(nr: &str, args: &str) -> String {
    format!("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.syscall({nr}{args})\nprint(rc, ctypes.get_errno())")
}

#[tokio::test]
async fn no_capability_in_any_set() {
    for sb in every_sandbox().await {
        let out = python(&sb, "for l in open('/proc/self/status'):\n  if l.startswith('Cap'): print(l.split()[0], l.split()[1])").await;
        let o = text(&out.stdout);
        for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            assert!(o.contains(&format!("{set} 0000000000000000")), "{:?}: {set} not empty:\n{o}", sb.launcher);
        }
    }
}

#[tokio::test]
async fn no_nested_user_namespace() {
    for sb in every_sandbox().await {
        // unshare(CLONE_NEWUSER) and clone(CLONE_NEWUSER), as a script would try them.
        let code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x10000000), ctypes.get_errno())";
        let out = python(&sb, code).await;
        let o = text(&out.stdout);
        assert!(o.starts_with("-1 "), "{:?}: a nested user namespace was created:\n{o}{}", sb.launcher, text(&out.stderr));
        let out = python(&sb, "import subprocess\nr = subprocess.run(['unshare', '-U', '-r', 'id', '-u'], capture_output=True)\nprint(r.returncode, r.stdout)").await;
        assert!(!text(&out.stdout).starts_with("0 "), "{:?}: unshare -U ran: {}", sb.launcher, text(&out.stdout));
    }
}

#[tokio::test]
async fn no_mount_from_inside() {
    for sb in every_sandbox().await {
        let code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\nprint(rc, ctypes.get_errno())";
        let out = python(&sb, code).await;
        assert_eq!(text(&out.stdout).trim(), "-1 1", "{:?}: mount(2) must fail with EPERM", sb.launcher);
    }
}

#[tokio::test]
async fn seccomp_refuses_what_no_namespace_separates() {
    let Some(sb) = builtin().await else { return };
    // The kernel keyring is the host's: add_key (248), keyctl (250), request_key (249) on x86-64.
    if cfg!(target_arch = "x86_64") {
        for (nr, args) in [("248", ", b'user', b'k', b'v', 1, -2"), ("250", ", 0, -2, 0, 0, 0"), ("249", ", b'user', b'k', None, 0")] {
            let out = python(&sb, &syscall_probe(nr, args)).await;
            assert_eq!(text(&out.stdout).trim(), "-1 1", "syscall {nr}: {}", text(&out.stderr));
        }
        // setns (308): EPERM whatever the descriptor.
        let out = python(&sb, &syscall_probe("308", ", 0, 0")).await;
        assert_eq!(text(&out.stdout).trim(), "-1 1", "setns: {}", text(&out.stderr));
        // clone3 (435): ENOSYS, so libc falls back to clone, whose flags the filter reads.
        let out = python(&sb, &syscall_probe("435", ", 0, 0")).await;
        assert_eq!(text(&out.stdout).trim(), "-1 38", "clone3: {}", text(&out.stderr));
        // An x32 call (getpid with the x32 bit) would be another numbering: the process is killed.
        let out = python(&sb, &syscall_probe("0x40000027", "")).await;
        assert_eq!(out.outcome.exit_code, Some(128 + libc::SIGSYS), "an x32 syscall must kill the script: {out:?}");
        // Ordinary work still runs (the filter is a deny list of a few calls).
        let out = python(&sb, "import subprocess, threading\nt = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\nprint(subprocess.run(['true']).returncode)").await;
        assert_eq!(text(&out.stdout), "thread\n0\n", "{}", text(&out.stderr));
    }
}

#[tokio::test]
async fn init_shows_no_host_path() {
    let Some(sb) = builtin().await else { return };
    let wd = workdir_for(65534);
    let out = python(&sb.rw_bind(wd.path()), "print(repr(open('/proc/1/cmdline','rb').read()))").await;
    let o = text(&out.stdout);
    assert_eq!(o.trim().trim_start_matches('b').trim_matches('\'').trim_end_matches("\\x00").replace("\\x00", ""), "init", "{o}");
    assert!(!o.contains(&wd.path().display().to_string()), "the init's command line names a host path: {o}");
}

/// The launcher is exec'd from a descriptor: a root server whose binary
/// lives under a 0700 directory still sandboxes runs as an unprivileged uid.
#[tokio::test]
async fn a_binary_the_run_uid_cannot_reach_by_path_still_launches() {
    if !is_root() || builtin().await.is_none() {
        skill_operator::gated::skip(module_path!(), "needs root (a run uid other than the server's)");
        return;
    }
    use std::os::unix::fs::OpenOptionsExt;
    let private = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let copy = private.path().join("skill-operator");
    // Copied by another process: a copy written here would leave its write
    // descriptor in any child another test thread forks meanwhile, and the
    // exec below would then fail with ETXTBSY (Text file busy).
    let copied = std::process::Command::new("cp").arg(BIN).arg(&copy).status().expect("cp");
    assert!(copied.success(), "cp {BIN} failed");
    let exe: std::os::fd::OwnedFd =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_CLOEXEC).open(&copy).expect("open").into();
    let mut s = spec(PY, &["-c", "import os; print(os.getuid())"]);
    s.run_as = RunAs::User { uid: 65534, gid: 65534 };
    s.keep_fds.push(std::sync::Arc::new(exe.try_clone().expect("dup")));
    s.sandbox = Some(SandboxSpec::builtin(s.keep_fds[0].as_raw_fd()));
    let out = execute(s).await.expect("the sandbox starts from the descriptor");
    assert_eq!(text(&out.stdout).trim(), "65534", "{}", text(&out.stderr));
}

/// The launcher takes only this project's own sandbox shape: a weaker or
/// unknown command line is refused before anything runs.
#[test]
fn the_launcher_refuses_a_weaker_command_line() {
    let marks = tempfile::tempdir().expect("tempdir");
    let mark = marks.path().join("ran");
    let touch = ["--", "/usr/bin/touch", mark.to_str().expect("utf-8")];
    let full = ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent", "--new-session"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--unshare-all"], "no weaker shape"),
        ([&full[..], &["--share-net"]].concat(), "unknown option \"--share-net\""),
        ([&full[..], &["--cap-add", "ALL"]].concat(), "unknown option \"--cap-add\""),
        ([&full[..], &["--bind", "/", "/work/../.."]].concat(), "absolute path without `..`"),
    ];
    for (flags, why) in cases {
        let out = std::process::Command::new(BIN).arg("sandbox-exec").args(&flags).args(touch).output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(stderr.starts_with("sandbox-exec: ") && stderr.contains(why), "{flags:?}: {stderr}");
        assert!(!mark.exists(), "{flags:?}: the program ran");
    }
}
