//! The bubblewrap sandbox: network, filesystem view, /proc, env, identity, teardown.
#[path = "runner/common.rs"]
mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use skill_operator::runner::process::{execute, ExecError, ExecSpec};
use skill_operator::runner::sandbox::{bwrap_args, detect_bwrap, SandboxSpec};

fn sandboxed(program: &str, args: &[&str], sb: SandboxSpec) -> ExecSpec {
    let mut s = spec(program, args);
    s.sandbox = Some(sb);
    s
}

#[tokio::test]
async fn detect_and_self_test() {
    if sandbox().await.is_none() {
        return;
    }
    assert_eq!(detect_bwrap().as_deref(), Some(std::path::Path::new("/usr/bin/bwrap")));
}

/// Issue 9, class 1: a run with granted egress used to get `--share-net`
/// and reached the server's own port. The sandbox's network namespace is
/// its own whatever the spec says; `network: true` only binds TLS files.
#[tokio::test]
async fn no_host_network_ever() {
    let Some(sb) = sandbox().await else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port().to_string();
    let connect = "import socket,sys\ntry:\n  socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2); print('connected')\nexcept OSError as e:\n  print(type(e).__name__); sys.exit(1)";
    for network in [false, true] {
        let out = execute(sandboxed(PY, &["-c", connect, &port], sb.clone().with_network(network))).await.expect("execute");
        assert_eq!(out.outcome.exit_code, Some(1), "network={network}: {out:?}");
        assert_eq!(text(&out.stdout).trim(), "ConnectionRefusedError", "network={network}: own empty loopback only");
    }
    // Control: the listener is there, on the host's loopback.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().expect("port"))).is_ok());
}

/// Issue 9, class 7: printing `bwrap: ...` on stderr and exiting 1 used to
/// turn a run that happened (and wrote files) into a set-up failure with
/// its streams dropped. bubblewrap's status descriptor says the program
/// ran; the script cannot write to it.
#[tokio::test]
async fn a_script_cannot_forge_a_sandbox_failure() {
    let Some(sb) = sandbox().await else { return };
    let wd = workdir_for(65534);
    let script = "import os, sys\nopen('/work/made-it', 'w').write('x')\nfor fd in range(3, 64):\n  try: os.write(fd, b'{\"exit-code\": 0}\\n')\n  except OSError: pass\nsys.stderr.write('bwrap: Can\\'t mount proc on /newroot/proc: Operation not permitted\\n')\nsys.exit(1)";
    let sb = sb.rw_bind(wd.path());
    let mut s = sandboxed(PY, &["-c", script], sb.clone());
    s.sandbox.as_mut().expect("sandbox").rw_binds.push((wd.path().to_path_buf(), "/work".into()));
    let out = execute(s).await.expect("a script's own exit is an outcome, never a set-up error");
    assert_eq!(out.outcome.exit_code, Some(1));
    assert!(text(&out.stderr).starts_with("bwrap: Can't mount proc"), "the script's stderr is kept: {}", text(&out.stderr));
    assert!(wd.path().join("made-it").exists());
    // A real set-up failure is still one.
    let mut bad = sb;
    bad.rw_binds.push((wd.path().to_path_buf(), "/usr/zzz-not-there".into()));
    assert!(matches!(execute(sandboxed("/usr/bin/true", &[], bad)).await, Err(ExecError::SandboxSetup { .. })));
}

/// The sandbox's root and /dev are read-only, /tmp and /dev/shm sized.
#[tokio::test]
async fn only_work_and_the_sized_tmpfs_are_writable() {
    let Some(sb) = sandbox().await else { return };
    let probe = "import os\nfor d in ['/', '/dev', '/usr', '/tmp', '/dev/shm']:\n  try:\n    open(os.path.join(d, 'w'), 'w').write('x'); print(d, 'writable', os.statvfs(d).f_blocks * os.statvfs(d).f_frsize)\n  except OSError as e:\n    print(d, e.strerror)";
    let out = execute(sandboxed(PY, &["-c", probe], sb)).await.expect("execute");
    let t = text(&out.stdout);
    let size = skill_operator::core::limits::RUN_TMP_BYTES;
    assert!(t.contains("/ Read-only file system\n") && t.contains("/dev Read-only file system\n"), "{t}");
    assert!(t.contains(&format!("/tmp writable {size}\n")) && t.contains(&format!("/dev/shm writable {size}\n")), "{t}");
}

#[tokio::test]
async fn package_is_read_only_and_workdir_is_writable() {
    let Some(sb) = sandbox().await else { return };
    let script = "import sys, os\nprint(open(__file__).read().count('\\n') > 0)\nfor d in sys.argv[1:]:\n  try:\n    open(os.path.join(d, 'written'), 'w').write('x'); print('ok')\n  except OSError as e:\n    print(e.strerror)";
    let pkg = package(&[("probe.py", script)]);
    // World-writable on the host: only the read-only bind stops the write.
    std::fs::set_permissions(pkg.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let uid = 65534;
    let wd = workdir_for(uid);
    let probe = pkg.path().join("probe.py");
    let (p, w) = (pkg.path().to_str().expect("utf8"), wd.path().to_str().expect("utf8"));
    let sb = sb.ro_bind(pkg.path()).rw_bind(wd.path());
    let mut s = sandboxed(PY, &[probe.to_str().expect("utf8"), p, w, "/usr", "/tmp"], sb);
    s.cwd = wd.path().to_path_buf();
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "True\nRead-only file system\nok\nRead-only file system\nok\n");
    assert!(!pkg.path().join("written").exists());
    assert_eq!(std::fs::read_to_string(wd.path().join("written")).expect("written"), "x");
    // /tmp inside is a private tmpfs: nothing reached the host's /tmp.
    assert!(!std::path::Path::new("/tmp/written").exists());
}

#[tokio::test]
async fn host_files_outside_the_binds_are_invisible() {
    let Some(sb) = sandbox().await else { return };
    let secret_dir = package(&[("secret.txt", "hunter2")]); // 0755 / 0644: readable on the host by anyone
    let secret = secret_dir.path().join("secret.txt");
    let probe = "import os,sys\nfor p in sys.argv[1:]: print(p, os.path.exists(p))";
    let paths = [
        secret.to_str().expect("utf8"),
        "/root",
        "/home",
        "/work",
        "/etc/passwd",
        "/etc/shadow",
        "/var",
        "/run",
        "/usr/bin/python3",
        "/etc/ld.so.cache",
    ];
    let mut args = vec!["-c", probe];
    args.extend_from_slice(&paths);
    let out = execute(sandboxed(PY, &args, sb)).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    for (p, l) in paths.iter().zip(&lines) {
        let visible = l.ends_with("True");
        let should = *p == "/usr/bin/python3" || *p == "/etc/ld.so.cache";
        assert_eq!(visible, should, "{l}");
    }
}

#[tokio::test]
async fn proc_shows_no_host_process_and_environ_is_the_given_env() {
    let Some(sb) = sandbox().await else { return };
    let probe = "import os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\nprint(pids)\nfor p in pids:\n  try: print(p, open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0', b' ').decode())\n  except OSError as e: print(p, e)\nprint('PPID', os.getppid())\nprint('ENV', sorted(open(f'/proc/{os.getppid()}/environ','rb').read().split(b'\\0')))";
    let mut s = sandboxed(PY, &["-c", probe], sb);
    s.env.push(("GRANTED".into(), "yes".into()));
    let out = execute(s).await.expect("execute");
    let o = text(&out.stdout);
    assert_eq!(out.outcome.exit_code, Some(0), "{o}{}", text(&out.stderr));
    let first = o.lines().next().unwrap_or_default();
    // bwrap's init (1) and the script (2); nothing from the host.
    assert_eq!(first, "[1, 2]", "{o}");
    assert!(!o.contains("cargo") && !o.contains("sandbox-") && !o.contains("/target/"), "{o}");
    assert!(o.contains("PPID 1"), "{o}");
    assert!(o.contains("ENV [b'', b'GRANTED=yes', b'HOME=/tmp', b'LANG=C.UTF-8', b'PATH=/usr/bin:/bin']"), "{o}");
}

#[tokio::test]
async fn env_is_exact_inside_the_sandbox_and_not_on_the_command_line() {
    let Some(sb) = sandbox().await else { return };
    let mut s = sandboxed("/usr/bin/env", &["-0"], sb.clone());
    s.env = vec![("TOKEN".into(), "s3cr3t".into()), ("PATH".into(), "/usr/bin".into())];
    let args = bwrap_args(&sb, &s.inside()).expect("args");
    assert!(!args.iter().any(|a| a.to_string_lossy().contains("s3cr3t")), "env values must not be in bwrap's argv");
    let out = execute(s).await.expect("execute");
    let mut got = split_nul(&out.stdout);
    got.sort();
    // bwrap always exports PWD (= --chdir); nothing else is added.
    assert_eq!(got, vec!["PATH=/usr/bin", "PWD=/tmp", "TOKEN=s3cr3t"]);
}

#[tokio::test]
async fn runs_as_unprivileged_uid_inside() {
    let Some(sb) = sandbox().await else { return };
    let out = execute(sandboxed("/usr/bin/id", &["-u"], sb.clone())).await.expect("execute");
    let want = if is_root() { 65534 } else { unsafe { libc::geteuid() } };
    assert_eq!(text(&out.stdout).trim(), want.to_string());
    if is_root() {
        let uid = fresh_uid();
        let mut s = sandboxed("/usr/bin/id", &["-u"], sb);
        as_user(&mut s, uid);
        let out = execute(s).await.expect("execute");
        assert_eq!(text(&out.stdout).trim(), uid.to_string());
    }
}

#[tokio::test]
async fn argv_is_literal_inside_the_sandbox() {
    let Some(sb) = sandbox().await else { return };
    let tricky = ["; touch /tmp/pwned", "$(id)", "`id`", "*", "--", "--bind", "/ /", ""];
    let mut args = vec!["-c", "import sys; sys.stdout.buffer.write(b''.join(a.encode()+b'\\0' for a in sys.argv[1:]))"];
    args.extend_from_slice(&tricky);
    let out = execute(sandboxed(PY, &args, sb)).await.expect("execute");
    let got: Vec<String> = out.stdout.split(|c| *c == 0).map(text).collect();
    let mut want: Vec<String> = tricky.iter().map(|s| s.to_string()).collect();
    want.push(String::new());
    assert_eq!(got, want);
}

#[tokio::test]
async fn timeout_tears_down_the_whole_namespace_even_detached_children() {
    let Some(sb) = sandbox().await else { return };
    let uid = fresh_uid();
    let mut s = sandboxed(BASH, &["-c", "setsid sleep 30 & setsid sleep 31 & sleep 30"], sb);
    if is_root() {
        as_user(&mut s, uid);
    }
    s.timeout = Duration::from_millis(500);
    let out = execute(s).await.expect("execute");
    assert!(out.outcome.timed_out);
    assert!(out.duration < Duration::from_millis(1500), "{:?}", out.duration);
    if is_root() {
        let left = wait_uid_gone(uid, Duration::from_secs(2));
        assert!(left.is_empty(), "sandbox left processes: {left:?}");
    }
}

#[tokio::test]
async fn detached_child_dies_with_the_sandbox_on_normal_exit() {
    let Some(sb) = sandbox().await else { return };
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root");
        return;
    }
    let uid = fresh_uid();
    let mut s = sandboxed(BASH, &["-c", "setsid sleep 30 & echo started"], sb);
    as_user(&mut s, uid);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0));
    assert_eq!(text(&out.stdout), "started\n");
    // PID namespace init exited => kernel killed the rest; no drain wait needed.
    assert!(out.duration < Duration::from_millis(800), "{:?}", out.duration);
    assert!(wait_uid_gone(uid, Duration::from_secs(2)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_in_sandbox_is_contained() {
    let Some(sb) = sandbox().await else { return };
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root");
        return;
    }
    let uid = fresh_uid();
    let mut s = sandboxed(BASH, &["-c", "b() { b | b & }; b; sleep 30"], sb);
    as_user(&mut s, uid);
    s.limits.nproc = Some(32);
    s.timeout = Duration::from_millis(1500);
    let hard = s.hard_deadline();
    let out = execute(s).await.expect("execute");
    assert!(out.duration < hard);
    assert!(text(&out.stderr).contains("Resource temporarily unavailable"), "{}", text(&out.stderr[..out.stderr.len().min(300)]));
    assert!(wait_uid_gone(uid, Duration::from_secs(2)).is_empty());
    assert_eq!(execute(spec("/usr/bin/true", &[])).await.expect("after").outcome.exit_code, Some(0));
}

#[tokio::test]
async fn memory_and_file_limits_apply_inside() {
    let Some(sb) = sandbox().await else { return };
    let out = execute(sandboxed(PY, &["-c", "bytearray(2 * 1024**3)"], sb.clone())).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(1));
    assert!(text(&out.stderr).contains("MemoryError"));
    let mut s = sandboxed("/usr/bin/dd", &["if=/dev/zero", "of=/tmp/big", "bs=1M", "count=50"], sb);
    s.limits.fsize_bytes = Some(2 << 20);
    let out = execute(s).await.expect("execute");
    // bwrap reports a child killed by signal N as exit 128+N.
    assert_eq!(out.outcome.exit_code, Some(128 + libc::SIGXFSZ), "{out:?}");
}

#[tokio::test]
async fn node_runs_in_the_sandbox() {
    let Some(sb) = sandbox().await else { return };
    let out = execute(sandboxed(NODE, &["-e", "console.log(require('os').userInfo ? 'node ' + process.version : 'x')"], sb))
        .await
        .expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("node v"));
}

#[tokio::test]
async fn setup_failures_are_errors_not_script_results() {
    let Some(sb) = sandbox().await else { return };
    let wd = workdir_for(65534);
    // A mount point under the read-only /usr cannot be created.
    let mut bad = sb.clone();
    bad.rw_binds.push((wd.path().to_path_buf(), "/usr/zzz-not-there".into()));
    let e = execute(sandboxed("/usr/bin/true", &[], bad)).await.unwrap_err();
    assert!(matches!(e, ExecError::SandboxSetup { .. }), "{e}");
    // The sandbox's own words: bubblewrap's, or the built-in sandbox's.
    assert!(e.to_string().contains(if test_builtin() { "sandbox-exec: " } else { "bwrap" }), "{e}");
    // Interpreter outside every bind.
    let e = execute(sandboxed("/opt/node/bin/node", &[], sb.clone())).await.unwrap_err();
    assert!(matches!(e, ExecError::SandboxPath { .. }), "{e}");
    // Missing bind source.
    let e = execute(sandboxed("/usr/bin/true", &[], sb.clone().ro_bind("/no/such/skill"))).await.unwrap_err();
    assert!(matches!(e, ExecError::SandboxPath { .. }), "{e}");
    // cwd not bound.
    let mut s = sandboxed("/usr/bin/true", &[], sb);
    s.cwd = "/work".into();
    let e = execute(s).await.unwrap_err();
    assert!(matches!(e, ExecError::SandboxPath { .. }), "{e}");
}

/// A stand-in for bwrap that fails its first `failures` calls with
/// `message` (as bwrap prints a clone(2) failure) and then runs the real
/// one; every call is counted in `calls`.
fn flaky_bwrap(dir: &std::path::Path, failures: usize, message: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    // bwrap runs as the uid scripts get (nobody, for a root test process).
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let calls = dir.join("calls");
    let script = dir.join("bwrap");
    // Written here as a plain file and copied to its executable name by
    // another process: an executable written by this process could be held
    // open in a child another test thread forks meanwhile (exec: ETXTBSY).
    let source = dir.join("bwrap.txt");
    std::fs::write(
        &source,
        format!(
            "#!/bin/sh\necho call >> '{calls}'\nif [ \"$(wc -l < '{calls}')\" -le {failures} ]; then echo 'bwrap: {message}' >&2; exit 1; fi\nexec /usr/bin/bwrap \"$@\"\n",
            calls = calls.display()
        ),
    )
    .unwrap();
    assert!(std::process::Command::new("cp").arg(&source).arg(&script).status().unwrap().success());
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, calls)
}

fn calls(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

/// A self-test that met EAGAIN (other sandboxes starting at that moment)
/// used to give the sandbox up for the server's whole life: seen as a root
/// server refusing every run during a loaded test run.
#[tokio::test]
async fn a_transient_self_test_failure_is_tried_again() {
    use skill_operator::runner::sandbox_probe::{bwrap_self_test, SELF_TEST_ATTEMPTS};
    if sandbox().await.is_none() {
        return;
    }
    let eagain = "Creating new namespace failed: Resource temporarily unavailable";
    let dir = tempfile::tempdir().unwrap();
    let (bwrap, count) = flaky_bwrap(dir.path(), SELF_TEST_ATTEMPTS as usize - 1, eagain);
    bwrap_self_test(&bwrap, Default::default()).await.expect("works on the last try");
    assert_eq!(calls(&count), SELF_TEST_ATTEMPTS as usize);

    // Still failing after every try: given up, with bwrap's message.
    let dir = tempfile::tempdir().unwrap();
    let (bwrap, count) = flaky_bwrap(dir.path(), usize::MAX >> 1, eagain);
    let err = bwrap_self_test(&bwrap, Default::default()).await.expect_err("never works");
    assert!(err.to_string().contains("Resource temporarily unavailable"), "{err}");
    assert_eq!(calls(&count), SELF_TEST_ATTEMPTS as usize);

    // Any other failure is the verdict at once.
    let dir = tempfile::tempdir().unwrap();
    let (bwrap, count) = flaky_bwrap(dir.path(), 1, "No permissions to creating new namespace");
    let err = bwrap_self_test(&bwrap, Default::default()).await.expect_err("a real refusal");
    assert!(err.to_string().contains("No permissions"), "{err}");
    assert_eq!(calls(&count), 1);
}
