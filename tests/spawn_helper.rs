//! The pre-forked spawn helper with real processes: scripts started
//! through it are the server's own children, fenced as a direct spawn
//! fences them; the helper comes back when killed and cannot be read by a
//! script of the server's uid.
#[path = "runner/common.rs"]
mod common;
use common::*;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use skill_operator::runner::process::{execute, ExecError, ExecSpec};
use skill_operator::runner::spawn_helper::SpawnHelper;

/// Linux 5.3 brought `clone3` with `CLONE_PIDFD`.
fn kernel_has_clone3() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (5, 3)
}

/// A started helper that has started one script (`/usr/bin/true`), or
/// `None` (SKIPPED) on a kernel older than `clone3`. On a newer one a
/// refused fork is a failure, not a skip: it is how a broken request to
/// the kernel looks.
async fn helper() -> Option<Arc<SpawnHelper>> {
    let h = SpawnHelper::start(self_exe()).expect("the spawn helper starts");
    let probe = execute(through(&h, spec("/usr/bin/true", &[]))).await.expect("a probe run");
    assert_eq!(probe.outcome.exit_code, Some(0));
    if !kernel_has_clone3() {
        skill_operator::gated::skip(module_path!(), "this kernel is older than clone3 (Linux 5.3)");
        return None;
    }
    assert!(!h.refused(), "the kernel refused the helper's clone3; see the server's log for the errno");
    assert_eq!(h.started(), 1, "the probe went through the helper");
    Some(h)
}

fn through(helper: &Arc<SpawnHelper>, mut s: ExecSpec) -> ExecSpec {
    s.spawner = Some(helper.clone());
    s
}

/// The parent pid a process has, from /proc.
fn ppid_of(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_script_started_by_the_helper_is_the_servers_own_child() {
    let Some(h) = helper().await else { return };
    let helper_pid = h.pid().expect("running") as i32;
    assert_eq!(ppid_of(helper_pid), Some(std::process::id() as i32), "the helper is the server's child");
    let s = through(&h, spec(PY, &["-c", "import os,sys; print(os.getppid()); sys.exit(3)"]));
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(3), "the exit status read through the pidfd: {}", text(&out.stderr));
    let parent: i32 = text(&out.stdout).trim().parse().expect("a pid");
    assert_eq!(parent, std::process::id() as i32, "CLONE_PARENT: the server, not the helper ({helper_pid}), is the parent");
    assert_eq!(h.started(), 2, "the helper started it, the server forked nothing");
}

#[tokio::test]
async fn signals_and_exit_codes_are_reported_as_for_a_direct_spawn() {
    let Some(h) = helper().await else { return };
    let killed = execute(through(&h, spec(BASH, &["-c", "echo before; kill -TERM $$"]))).await.expect("execute");
    assert_eq!((killed.outcome.exit_code, killed.outcome.signal), (None, Some(libc::SIGTERM)));
    assert_eq!(text(&killed.stdout), "before\n");
    let ok = execute(through(&h, spec(BASH, &["-c", "echo -n out; echo -n err >&2"]))).await.expect("execute");
    assert_eq!((ok.outcome.exit_code, text(&ok.stdout), text(&ok.stderr)), (Some(0), "out".into(), "err".into()));
    assert_eq!(h.started(), 3);
}

#[tokio::test]
async fn the_environment_and_argv_arrive_exactly() {
    let Some(h) = helper().await else { return };
    let mut s = through(&h, spec("/usr/bin/env", &["-0"]));
    s.env = vec![("ONLY".into(), "this".into()), ("EMPTY".into(), "".into()), ("PATH".into(), "/nowhere".into())];
    let out = execute(s).await.expect("execute");
    let mut got = split_nul(&out.stdout);
    got.sort();
    assert_eq!(got, vec!["EMPTY=", "ONLY=this", "PATH=/nowhere"]);
    let tricky = ["; touch pwned", "$(id)", "a b", "", "héllo ✓", "--help"];
    let mut args = vec!["-c", "import sys; sys.stdout.write('\\0'.join(sys.argv[1:]))"];
    args.extend(tricky);
    let out = execute(through(&h, spec(PY, &args))).await.expect("execute");
    assert_eq!(text(&out.stdout).split('\0').collect::<Vec<_>>(), tricky);
    assert_eq!(h.started(), 3);
}

/// Descriptors the script keeps arrive at the numbers they have in the
/// server (its script is `/proc/self/fd/N`), and nothing else does: not the
/// helper's socket, not the run's cgroup files, not another request's.
#[tokio::test]
async fn only_the_kept_descriptors_reach_the_script_at_their_numbers() {
    let Some(h) = helper().await else { return };
    let dir = package(&[("a.txt", "first file"), ("b.txt", "second file")]);
    let open = |name: &str| -> Arc<OwnedFd> { Arc::new(std::fs::File::open(dir.path().join(name)).expect("open").into()) };
    let (a, b) = (open("a.txt"), open("b.txt"));
    // An fd the server holds without O_CLOEXEC, as from its own parent.
    let stray = unsafe { libc::open(c"/etc/hostname".as_ptr(), libc::O_RDONLY) };
    assert!(stray > 2);
    let script = format!(
        "import os\nfds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\nprint(fds)\nprint(open('/proc/self/fd/{}').read())\nprint(open('/proc/self/fd/{}').read())",
        a.as_raw_fd(),
        b.as_raw_fd()
    );
    let mut s = through(&h, spec(PY, &["-c", &script]));
    s.keep_fds = vec![a.clone(), b.clone()];
    let out = execute(s).await.expect("execute");
    unsafe { libc::close(stray) };
    let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(out.outcome.exit_code, Some(0), "{}", text(&out.stderr));
    // 0, 1, 2, the two kept ones, and the directory python lists.
    let fds: Vec<i32> = lines[0].trim_matches(['[', ']']).split(", ").map(|f| f.parse().expect("fd")).collect();
    let expected = [0, 1, 2, a.as_raw_fd(), b.as_raw_fd()];
    let extra: Vec<i32> = fds.iter().copied().filter(|f| !expected.contains(f)).collect();
    assert!(expected.iter().all(|f| fds.contains(f)), "{fds:?}");
    assert_eq!(extra.len(), 1, "only the listing's own descriptor may be extra: {fds:?}");
    assert_eq!(&lines[1..3], ["first file", "second file"]);
    assert_eq!(h.started(), 2);
}

#[tokio::test]
async fn a_killed_helper_is_started_again_and_the_next_run_works() {
    let Some(h) = helper().await else { return };
    let first = h.pid().expect("running") as i32;
    assert_eq!(execute(through(&h, spec("/usr/bin/true", &[]))).await.expect("execute").outcome.exit_code, Some(0));
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
    // Its end of the socket closes with it; nothing else tells the server.
    for _ in 0..2 {
        let out = execute(through(&h, spec(BASH, &["-c", "echo $PPID"]))).await.expect("the run after the helper died");
        assert_eq!(text(&out.stdout).trim(), std::process::id().to_string());
    }
    let second = h.pid().expect("a new helper") as i32;
    assert_ne!(first, second);
    assert_eq!(h.restarts(), 1, "started again once, not per run");
    assert_eq!(h.started(), 4, "every run went through a helper");
    assert!(!pid_alive(first) || ppid_of(first).is_none(), "the dead helper was reaped");
}

/// A failure in the child's set-up reads as the direct spawn's, and a
/// program `execve` refuses is refused (std's `execvp` would hand a file
/// without an interpreter line to /bin/sh; the helper runs no shell).
#[tokio::test]
async fn spawn_failures_are_reported_and_leave_the_helper_serving() {
    let Some(h) = helper().await else { return };
    // A cgroup file the child cannot write: the fence's own set-up fails.
    let dir = package(&[("cgroup.procs", ""), ("not-elf", "just text, no interpreter line\n")]);
    let read_only: Arc<OwnedFd> = Arc::new(std::fs::File::open(dir.path().join("cgroup.procs")).expect("open").into());
    let mut direct = spec("/usr/bin/true", &[]);
    direct.cgroup_procs = vec![read_only.clone()];
    let direct = execute(direct).await.unwrap_err();
    let mut helped = through(&h, spec("/usr/bin/true", &[]));
    helped.cgroup_procs = vec![read_only];
    let helped = execute(helped).await.unwrap_err();
    assert!(matches!(helped, ExecError::Spawn { .. }), "{helped}");
    assert_eq!(helped.to_string(), direct.to_string());

    let path = dir.path().join("not-elf");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let refused = execute(through(&h, spec(path.to_str().expect("utf8"), &[]))).await.unwrap_err();
    assert!(refused.to_string().contains("Exec format error"), "{refused}");
    // The failed children were reaped, and the helper serves the next run.
    assert_eq!(execute(through(&h, spec("/usr/bin/true", &[]))).await.expect("execute").outcome.exit_code, Some(0));
    assert_eq!((h.started(), h.restarts()), (2, 0));
}

#[tokio::test]
async fn the_fence_holds_for_a_run_through_the_helper() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root to switch uids");
        return;
    }
    let Some(h) = helper().await else { return };
    let uid = fresh_uid();
    let wd = workdir_for(uid);
    let mut s = through(&h, spec(BASH, &["-c", "id -u; id -G; ulimit -u; ulimit -n; cat /proc/self/status | grep NoNewPrivs"]));
    as_user(&mut s, uid);
    s.cwd = wd.path().to_path_buf();
    let out = execute(s).await.expect("execute");
    let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(lines[0], uid.to_string(), "{lines:?}");
    assert_eq!(lines[1], uid.to_string(), "supplementary groups cleared: {lines:?}");
    assert_eq!(lines[2], skill_operator::core::limits::RUN_PIDS.to_string());
    assert_eq!(lines[3], skill_operator::core::limits::RUN_OPEN_FILES.to_string());
    assert!(lines[4].ends_with('1'), "{lines:?}");
    assert_eq!(h.started(), 2);
}

#[tokio::test]
async fn a_timed_out_or_cancelled_run_through_the_helper_leaves_nothing() {
    let Some(h) = helper().await else { return };
    let mut s = through(&h, spec(BASH, &["-c", "sleep 60 & sleep 60; wait"]));
    s.timeout = Duration::from_millis(300);
    s.kill_grace = Duration::from_millis(200);
    let out = execute(s).await.expect("execute");
    assert!(out.outcome.timed_out);
    let cancel = skill_operator::shutdown::Shutdown::new();
    let mut s = through(&h, spec(BASH, &["-c", "echo $$; sleep 60"]));
    s.cancel = Some(cancel.clone());
    let run = tokio::spawn(execute(s));
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.trigger();
    let out = run.await.expect("join").expect("execute");
    assert!(out.outcome.cancelled);
    let pid: i32 = text(&out.stdout).trim().parse().expect("pid");
    // Killed and reaped: no zombie of ours is left under that pid.
    assert!(ppid_of(pid) != Some(std::process::id() as i32), "the cancelled script is gone");
    assert_eq!(h.started(), 3);
}

/// A same-uid script may not read the helper (which holds other runs'
/// descriptors and, for a root server, root's privileges): it is not
/// dumpable. Checked as an unprivileged server, where scripts share its
/// uid; the read of `/proc/<helper>/environ` succeeds on a dumpable one.
#[test]
fn a_script_of_the_servers_uid_cannot_read_the_helper() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root to start the server as another uid");
        return;
    }
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "unprivileged_server", "--ignored", "--nocapture", "--test-threads=1"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("SPAWN_HELPER_TEST", "1")
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run as 65534");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    if !stdout.contains("through_helper=") {
        // The server's probe found the helper refused here, and said so.
        assert!(text(&out.stderr).contains("SKIPPED") || stdout.contains("SKIPPED"), "{stdout}\n{}", text(&out.stderr));
        return;
    }
    let line = stdout.lines().find_map(|l| l.split_once("helper_environ=")).map(|(_, v)| v).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("refused") && line.contains("PermissionError"), "{line}");
    // Control: the same read of a dumpable process of that uid (a `sleep` the server started) works.
    let control = stdout.lines().find_map(|l| l.split_once("control_environ=")).map(|(_, v)| v).unwrap_or_else(|| panic!("{stdout}"));
    assert!(control.starts_with("read"), "{control}");
    assert!(stdout.contains("through_helper=3"), "{stdout}");
}

/// Not a test on its own: the unprivileged server of the test above.
#[test]
#[ignore]
fn unprivileged_server() {
    if std::env::var("SPAWN_HELPER_TEST").is_err() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let Some(h) = rt.block_on(helper()) else { return };
    let helper_pid = h.pid().expect("running");
    let mut control = std::process::Command::new("/usr/bin/sleep").arg("30").spawn().expect("sleep");
    let probe = "import sys\ntry:\n  open('/proc/%s/environ' % sys.argv[1], 'rb').read(); print('read')\nexcept Exception as e:\n  print('refused', type(e).__name__)";
    let mut s = through(&h, spec(PY, &["-c", probe, &helper_pid.to_string()]));
    s.cwd = "/".into();
    let out = rt.block_on(execute(s)).expect("execute");
    println!("helper_environ={}", text(&out.stdout).trim());
    let mut s = through(&h, spec(PY, &["-c", probe, &control.id().to_string()]));
    s.cwd = "/".into();
    let out = rt.block_on(execute(s)).expect("execute");
    println!("control_environ={}", text(&out.stdout).trim());
    println!("through_helper={}", h.started());
    let _ = control.kill();
    let _ = control.wait();
}

/// The request cap holds at its edge: just under it the helper reads the
/// request (and `execve` refuses so large an environment), just over it
/// the server refuses to send it; neither falls back to forking the server.
#[tokio::test]
async fn a_request_over_the_cap_is_refused_and_one_under_it_reaches_the_helper() {
    use skill_operator::runner::spawn_helper::wire::MAX_REQUEST_BYTES;
    let Some(h) = helper().await else { return };
    let with_value = |len: usize| {
        let mut s = through(&h, spec("/usr/bin/true", &[]));
        s.env.push(("BIG".into(), "x".repeat(len).into()));
        s
    };
    let under = execute(with_value(MAX_REQUEST_BYTES - 64 * 1024)).await.unwrap_err();
    assert!(under.to_string().contains("Argument list too long"), "the helper read it and execve refused it: {under}");
    let over = execute(with_value(MAX_REQUEST_BYTES)).await.unwrap_err();
    assert!(over.to_string().contains(&format!("over the {MAX_REQUEST_BYTES}-byte cap")), "{over}");
    assert_eq!((h.started(), h.restarts()), (1, 0), "nothing ran, by the helper or by a fork of the server");
    assert_eq!(execute(through(&h, spec("/usr/bin/true", &[]))).await.expect("execute").outcome.exit_code, Some(0));
}

/// A helper that stops answering (SIGSTOP, as a script of the server's uid
/// could send) fails the run it holds within `REPLY_WITHIN`, and is
/// replaced for the next one.
#[tokio::test]
async fn a_hung_helper_fails_its_run_in_time_and_is_replaced() {
    use skill_operator::runner::spawn_helper::REPLY_WITHIN;
    let Some(h) = helper().await else { return };
    let stopped = h.pid().expect("running") as i32;
    assert_eq!(unsafe { libc::kill(stopped, libc::SIGSTOP) }, 0);
    let began = std::time::Instant::now();
    let err = execute(through(&h, spec("/usr/bin/true", &[]))).await.unwrap_err();
    let waited = began.elapsed();
    assert!(err.to_string().contains("died or hung"), "{err}");
    assert!(waited >= REPLY_WITHIN && waited < REPLY_WITHIN + Duration::from_secs(5), "answered after {waited:?}");
    assert!(ppid_of(stopped).is_none(), "the hung helper was killed and reaped");
    assert_eq!(execute(through(&h, spec("/usr/bin/true", &[]))).await.expect("execute").outcome.exit_code, Some(0));
    assert_eq!((h.started(), h.restarts()), (2, 1));
}
