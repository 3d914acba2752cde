//! argv, environment, environ protection, process group, drain/deadline, output caps,
//! exit reporting, cancellation and spawn errors — without the sandbox.
#[path = "runner/common.rs"]
mod common;
use common::*;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use skill_operator::runner::process::{execute, protect_server_environ, sweep_uid, ExecError, ExecSpec, RunAs};

const TRICKY: &[&str] = &[
    "; touch pwned",
    "$(touch pwned2)",
    "`touch pwned3`",
    "*",
    "/*",
    "a b  c",
    "",
    "--help",
    "\"dq\"",
    "'sq'",
    "| cat",
    "&& id",
    "$HOME",
    "~",
    "\\n",
    "héllo ✓",
];

async fn argv_roundtrip(program: &str, pre: &[&str]) {
    let uid = fresh_uid();
    let wd = workdir_for(uid);
    let mut args: Vec<&str> = pre.to_vec();
    args.extend_from_slice(TRICKY);
    let mut s = spec(program, &args);
    as_user(&mut s, uid);
    s.cwd = wd.path().to_path_buf();
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0), "stderr: {}", text(&out.stderr));
    let got: Vec<String> = out.stdout.split(|c| *c == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    let mut want: Vec<String> = TRICKY.iter().map(|s| s.to_string()).collect();
    want.push(String::new()); // trailing NUL
    assert_eq!(got, want, "argv must arrive literally");
    let leftovers: Vec<_> = std::fs::read_dir(wd.path()).expect("read_dir").flatten().map(|e| e.file_name()).collect();
    assert!(leftovers.is_empty(), "nothing may be created by argv contents: {leftovers:?}");
}

#[tokio::test]
async fn argv_is_passed_literally_python() {
    argv_roundtrip(
        PY,
        &["-c", "import sys; sys.stdout.buffer.write(b''.join(a.encode('utf-8','surrogateescape')+b'\\0' for a in sys.argv[1:]))"],
    )
    .await;
}

#[tokio::test]
async fn argv_is_passed_literally_node() {
    argv_roundtrip(NODE, &["-e", "process.stdout.write(process.argv.slice(1).map(a => a + '\\0').join(''))"]).await;
}

#[tokio::test]
async fn argv_is_passed_literally_bash_script() {
    let pkg = package(&[("echo.sh", "printf '%s\\0' \"$@\"\n")]);
    let script = pkg.path().join("echo.sh");
    let script = script.to_str().expect("utf8 path");
    argv_roundtrip(BASH, &[script]).await;
}

// ---------------------------------------------------------------------------------
// Environment and /proc/<ppid>/environ. The parent's secret must be in its *initial*
// environment (that is what /proc/<pid>/environ shows), so these tests re-exec this
// test binary as a helper process with the secret set at exec time.

const HELPER_MODE: &str = "RUNNER_TEST_HELPER_MODE";
const SECRET_NAME: &str = "RUNNER_TEST_PARENT_SECRET";
const SECRET: &str = "sk-live-7d3f9a1c-do-not-leak";
const READ_PPID_ENVIRON: &str =
    "import os,sys\ntry:\n  sys.stdout.buffer.write(open('/proc/%d/environ' % os.getppid(),'rb').read())\nexcept Exception as e:\n  print(type(e).__name__, e, file=sys.stderr); sys.exit(7)";

fn run_helper(mode: &str, uid: Option<u32>) -> String {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().expect("current_exe");
    let mut c = std::process::Command::new(exe);
    c.args(["--exact", "environ_helper", "--ignored", "--nocapture", "--test-threads=1"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(HELPER_MODE, mode)
        .env(SECRET_NAME, SECRET)
        .current_dir("/");
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    let out = c.output().expect("run helper");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "helper failed: {stdout}\n{}", text(&out.stderr));
    stdout
}

fn helper_line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find_map(|l| l.split_once(&format!("{key}=")).map(|(_, v)| v)).unwrap_or_else(|| panic!("helper printed no {key}: {out}"))
}

/// Not a test on its own: the body of the re-exec'd helper (does nothing when run directly).
#[test]
#[ignore]
fn environ_helper() {
    let Ok(mode) = std::env::var(HELPER_MODE) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let probe = |run_as: RunAs| {
        let mut s = spec(PY, &["-c", READ_PPID_ENVIRON]);
        s.cwd = "/".into();
        s.run_as = run_as;
        let o = rt.block_on(execute(s)).expect("execute");
        let visible = text(&o.stdout).contains(SECRET);
        format!("{}:{:?}:{}", if visible { "visible" } else { "hidden" }, o.outcome.exit_code, text(&o.stderr).trim())
    };
    // The child's own environment never contains the parent's variable.
    let mut s = spec("/usr/bin/env", &["-0"]);
    s.cwd = "/".into();
    let o = rt.block_on(execute(s)).expect("execute env");
    println!("child_env_has_secret={}", text(&o.stdout).contains(SECRET) || text(&o.stdout).contains(SECRET_NAME));
    match mode.as_str() {
        "root" => {
            println!("inherit={}", probe(RunAs::Inherit));
            println!("auto={}", probe(RunAs::Auto));
        }
        "user" => {
            println!("before={}", probe(RunAs::Auto));
            protect_server_environ().expect("prctl");
            println!("after={}", probe(RunAs::Auto));
        }
        other => panic!("unknown helper mode {other}"),
    }
}

#[test]
fn env_is_exactly_the_given_one() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let mut s = spec("/usr/bin/env", &["-0"]);
    s.env = vec![("ONLY".into(), "this".into()), ("PATH".into(), "/nowhere".into()), ("EMPTY".into(), "".into())];
    let out = rt.block_on(execute(s)).expect("execute");
    let mut got = split_nul(&out.stdout);
    got.sort();
    assert_eq!(got, vec!["EMPTY=", "ONLY=this", "PATH=/nowhere"]);
    // The parent's own variables (e.g. its PATH, CARGO_*) are absent.
    assert!(std::env::vars_os().count() > 0);
}

#[test]
fn parent_env_never_reaches_the_child_and_environ_is_unreadable_as_root() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root");
        return;
    }
    let out = run_helper("root", None);
    assert_eq!(helper_line(&out, "child_env_has_secret"), "false", "{out}");
    // Control: a root child (RunAs::Inherit) can read the root server's environ...
    assert!(helper_line(&out, "inherit").starts_with("visible"), "{out}");
    // ...the default (uid 65534) cannot.
    let auto = helper_line(&out, "auto");
    assert!(auto.starts_with("hidden:Some(7)") && auto.contains("PermissionError"), "{out}");
}

#[test]
fn non_root_server_is_protected_by_pr_set_dumpable() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root to start the helper as another uid");
        return;
    }
    // The helper *is* the server, running as an unprivileged uid; its children share it.
    let out = run_helper("user", Some(65534));
    assert_eq!(helper_line(&out, "child_env_has_secret"), "false", "{out}");
    // Control: same uid, dumpable server => the child reads the secret.
    assert!(helper_line(&out, "before").starts_with("visible"), "{out}");
    // After prctl(PR_SET_DUMPABLE, 0) on the server the same read is refused.
    let after = helper_line(&out, "after");
    assert!(after.starts_with("hidden:Some(7)") && after.contains("PermissionError"), "{out}");
}

// ---------------------------------------------------------------------------------
// Process group, timeout, drain, hard deadline

#[tokio::test]
async fn timeout_terms_the_whole_group() {
    let uid = fresh_uid();
    let mut s = spec(BASH, &["-c", "sleep 30 & echo $!; sleep 30"]);
    as_user(&mut s, uid);
    s.timeout = Duration::from_millis(500);
    s.kill_grace = Duration::from_secs(1);
    let out = execute(s).await.expect("execute");
    assert!(out.outcome.timed_out);
    assert_eq!(out.outcome.signal, Some(libc::SIGTERM), "{out:?}");
    assert_eq!(out.outcome.exit_code, None);
    assert!(out.duration < Duration::from_millis(1400), "{:?}", out.duration);
    let bg: i32 = text(&out.stdout).trim().parse().expect("bg pid");
    // The group was signalled before `execute` returned; the kernel may take a
    // moment to finish the kill, so allow it one second to be gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while pid_alive(bg) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!pid_alive(bg), "background job in the group must be dead");
    assert!(wait_uid_gone(uid, Duration::from_secs(1)).is_empty());
}

#[tokio::test]
async fn sigterm_ignored_means_sigkill_after_grace() {
    let uid = fresh_uid();
    let mut s = spec(BASH, &["-c", "trap '' TERM; echo armed; sleep 30"]);
    as_user(&mut s, uid);
    s.timeout = Duration::from_millis(300);
    s.kill_grace = Duration::from_millis(500);
    let hard = s.hard_deadline();
    let out = execute(s).await.expect("execute");
    assert!(out.outcome.timed_out && !out.hard_deadline_hit);
    assert_eq!(out.outcome.signal, Some(libc::SIGKILL), "{out:?}");
    assert_eq!(text(&out.stdout), "armed\n");
    assert!(out.duration >= Duration::from_millis(800), "{:?}", out.duration);
    assert!(out.duration < hard, "{:?}", out.duration);
    assert!(wait_uid_gone(uid, Duration::from_secs(1)).is_empty());
}

#[tokio::test]
async fn detached_grandchild_holding_pipes_cannot_hang_the_call() {
    let uid = fresh_uid();
    // The short sleep lets the background job reach setsid() before bash exits
    // (otherwise the post-exit group kill catches it while still in the group).
    let mut s = spec(BASH, &["-c", "setsid sleep 30 & sleep 0.2; echo $!; echo bye >&2; exit 0"]);
    as_user(&mut s, uid);
    let drain = s.drain;
    let out = execute(s).await.expect("execute");
    kill_uid(uid);
    assert_eq!(out.outcome.exit_code, Some(0));
    assert!(!out.outcome.timed_out && !out.hard_deadline_hit);
    assert_eq!(text(&out.stderr), "bye\n");
    // Settled on exit + drain, not on pipe EOF (which would take 30 s).
    assert!(out.duration >= drain + Duration::from_millis(200), "{:?}", out.duration);
    assert!(out.duration < drain + Duration::from_millis(1100), "{:?}", out.duration);
}

#[tokio::test]
async fn timeout_with_detached_grandchild_returns_within_hard_deadline() {
    let uid = fresh_uid();
    let mut s = spec(BASH, &["-c", "setsid sleep 30 & trap '' TERM; sleep 30"]);
    as_user(&mut s, uid);
    s.timeout = Duration::from_millis(400);
    s.kill_grace = Duration::from_millis(400);
    let hard = s.hard_deadline();
    let out = execute(s).await.expect("execute");
    kill_uid(uid);
    assert!(out.outcome.timed_out);
    assert_eq!(out.outcome.signal, Some(libc::SIGKILL));
    assert!(out.duration < hard, "{:?} vs hard deadline {:?}", out.duration, hard);
}

#[tokio::test]
async fn sweep_uid_kills_detached_survivors() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root");
        return;
    }
    let uid = fresh_uid();
    let mut s = spec(BASH, &["-c", "setsid sleep 30 & setsid sleep 31 & sleep 0.2"]);
    as_user(&mut s, uid);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0));
    assert_eq!(procs_of_uid(uid).len(), 2, "two detached survivors expected");
    sweep_uid(uid, uid).expect("sweep");
    assert!(wait_uid_gone(uid, Duration::from_secs(1)).is_empty());
    assert!(sweep_uid(0, 0).is_err());
}

#[tokio::test]
async fn cancelled_execute_kills_the_group() {
    let uid = fresh_uid();
    let wd = workdir_for(uid);
    let pidfile = wd.path().join("pids");
    let script = format!("sleep 30 & echo $! $$ > {}; sleep 30", pidfile.display());
    let mut s = spec(BASH, &["-c", &script]);
    as_user(&mut s, uid);
    let r = tokio::time::timeout(Duration::from_millis(600), execute(s)).await;
    assert!(r.is_err(), "should have been cancelled");
    let pids = std::fs::read_to_string(&pidfile).expect("pidfile");
    let left = wait_uid_gone(uid, Duration::from_secs(2));
    assert!(left.is_empty(), "processes left after cancel: {left:?} (pids {pids})");
}

// ---------------------------------------------------------------------------------
// Output caps

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0))))
        .unwrap_or(0)
}

#[tokio::test]
async fn flood_of_writes_is_capped_and_counted() {
    let s = spec(PY, &["-c", "import sys\nfor i in range(40):\n  sys.stdout.buffer.write(b'x'*65536); sys.stdout.flush(); sys.stderr.buffer.write(b'y'*65536)"]);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0), "{}", text(&out.stderr[..200.min(out.stderr.len())]));
    assert_eq!(out.stdout.len(), 1024 * 1024);
    assert_eq!(out.outcome.stdout_bytes, 40 * 65536);
    assert!(out.outcome.stdout_truncated);
    assert!(out.stdout.iter().all(|b| *b == b'x'));
    assert_eq!(out.stderr.len(), 1024 * 1024);
    assert_eq!(out.outcome.stderr_bytes, 40 * 65536);
    assert!(out.outcome.stderr_truncated);
}

#[tokio::test]
async fn output_exactly_at_cap_is_not_truncated() {
    let s = spec(PY, &["-c", "import sys; sys.stdout.buffer.write(b'z'*(1024*1024))"]);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.stdout.len(), 1024 * 1024);
    assert_eq!(out.outcome.stdout_bytes, 1024 * 1024);
    assert!(!out.outcome.stdout_truncated && !out.outcome.stderr_truncated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_yes_stays_bounded() {
    let before = rss_kib();
    let mut s = spec("/usr/bin/yes", &[]);
    s.timeout = Duration::from_millis(1000);
    let out = execute(s).await.expect("execute");
    let after = rss_kib();
    assert!(out.outcome.timed_out);
    assert_eq!(out.outcome.signal, Some(libc::SIGTERM));
    assert_eq!(out.stdout.len(), 1024 * 1024);
    assert!(out.outcome.stdout_truncated);
    assert!(out.outcome.stdout_bytes > 16 * 1024 * 1024, "read and discarded: {}", out.outcome.stdout_bytes);
    assert!(after.saturating_sub(before) < 64 * 1024, "RSS grew {before} -> {after} KiB");
    eprintln!("yes: {} MiB read in {:?}, RSS {before} -> {after} KiB", out.outcome.stdout_bytes >> 20, out.duration);
}

// ---------------------------------------------------------------------------------
// Exit reporting

#[tokio::test]
async fn non_zero_exit_is_a_normal_result() {
    let s = spec(PY, &["-c", "import sys; print('partial'); print('oops', file=sys.stderr); sys.exit(3)"]);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(3));
    assert_eq!(out.outcome.signal, None);
    assert_eq!(text(&out.stdout), "partial\n");
    assert_eq!(text(&out.stderr), "oops\n");
    assert!(!out.outcome.timed_out && !out.hard_deadline_hit);
}

#[tokio::test]
async fn death_by_signal_is_reported_with_output() {
    let s = spec(BASH, &["-c", "echo before; kill -SEGV $$"]);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, None);
    assert_eq!(out.outcome.signal, Some(libc::SIGSEGV));
    assert_eq!(text(&out.stdout), "before\n");
}

#[tokio::test]
async fn default_run_as_is_nobody_when_root() {
    let s = spec("/usr/bin/id", &["-u"]);
    let out = execute(s).await.expect("execute");
    let expect = if is_root() { 65534 } else { unsafe { libc::geteuid() } };
    assert_eq!(text(&out.stdout).trim(), expect.to_string());
    assert_eq!(out.uid, expect);
    let s = spec("/usr/bin/id", &["-G"]);
    let out = execute(s).await.expect("execute");
    if is_root() {
        assert_eq!(text(&out.stdout).trim(), "65534", "supplementary groups must be dropped");
    }
}

#[tokio::test]
async fn inherited_fds_do_not_leak_into_the_child() {
    // An fd the server got without O_CLOEXEC (as from its own parent).
    let fd = unsafe { libc::open(c"/etc/hostname".as_ptr(), libc::O_RDONLY) };
    assert!(fd > 2);
    let s = spec("/usr/bin/ls", &["/proc/self/fd"]);
    let out = execute(s).await.expect("execute");
    unsafe { libc::close(fd) };
    let fds: Vec<String> = text(&out.stdout).split_whitespace().map(String::from).collect();
    // 0,1,2 and the fd ls opened for the listing itself.
    // 0, 1, 2 and the directory fd ls opened for the listing itself: nothing inherited.
    assert_eq!(fds.len(), 4, "{fds:?}");
}

// ---------------------------------------------------------------------------------
// Errors a caller can act on

#[tokio::test]
async fn spawn_errors_are_specific() {
    let e = execute(spec("python3", &[])).await.unwrap_err();
    assert!(matches!(e, ExecError::ProgramNotAbsolute { .. }), "{e}");
    let e = execute(spec("/usr/bin/no-such-interpreter", &[])).await.unwrap_err();
    assert!(matches!(e, ExecError::ProgramUnusable { .. }), "{e}");
    let plain = package(&[("data.txt", "not a program")]);
    let e = execute(spec(plain.path().join("data.txt").to_str().expect("utf8"), &[])).await.unwrap_err();
    assert!(matches!(e, ExecError::ProgramNotExecutable { .. }), "{e}");
    let mut s = spec(PY, &[]);
    s.cwd = "/no/such/dir".into();
    let e = execute(s).await.unwrap_err();
    assert!(matches!(e, ExecError::CwdNotDirectory { .. }), "{e}");
    let mut s = spec(PY, &[]);
    s.args = vec![OsString::from("a\0b")];
    let e = execute(s).await.unwrap_err();
    assert!(matches!(e, ExecError::NulByte { .. }), "{e}");
    let mut s = spec(PY, &[]);
    s.env.push(("A=B".into(), "x".into()));
    let e = execute(s).await.unwrap_err();
    assert!(matches!(e, ExecError::InvalidEnvName { .. }), "{e}");
    let mut s = spec(PY, &[]);
    s.timeout = Duration::ZERO;
    assert!(matches!(execute(s).await.unwrap_err(), ExecError::InvalidSpec { .. }));
}

#[tokio::test]
async fn interpreter_not_accessible_to_run_as_uid_is_named() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root");
        return;
    }
    // Like a pyenv python under /root: fine for root, unusable for uid 65534.
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let tool = d.path().join("tool");
    std::fs::copy("/usr/bin/true", &tool).expect("copy");
    let e = execute(ExecSpec { env: base_env(), ..ExecSpec::new(&tool, "/tmp") }).await.unwrap_err();
    match &e {
        ExecError::NotAccessible { path, uid, .. } => {
            assert_eq!(path, &std::fs::canonicalize(d.path()).expect("canon"));
            assert_eq!(*uid, 65534);
        }
        other => panic!("wrong error: {other}"),
    }
    assert!(e.to_string().contains("chmod"), "{e}");
    // The same program as root works (control).
    let out = execute(ExecSpec { env: base_env(), run_as: RunAs::Inherit, ..ExecSpec::new(&tool, "/tmp") }).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0));
}

#[test]
fn debug_output_never_shows_env_values() {
    let mut s = spec(PY, &[]);
    s.env.push(("API_KEY".into(), "sk-should-not-be-logged".into()));
    let d = format!("{s:?}");
    assert!(d.contains("API_KEY") && !d.contains("sk-should-not-be-logged"), "{d}");
}
