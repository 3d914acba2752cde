//! The in-pod launcher, run for real as a process: argv kept literal, only
//! allowed variables passed, timeout, caps, exit status, and the verdict
//! it sends the sidecar (a [`Collector`] stands in for the sidecar here and
//! writes what it receives into `result/`).

use std::path::Path;
use std::process::Command;

use skill_operator::artifacts::verdict::Collector;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

/// The sidecar's stand-in for a launcher started in `dir` (a fresh one: a
/// test that launches twice in one directory gets a second sidecar's volume).
fn sidecar(dir: &Path) -> Collector {
    let result = dir.join("result");
    let _ = std::fs::remove_dir_all(&result);
    std::fs::create_dir_all(&result).unwrap();
    Collector::start(&result.join("result.json")).expect("the collector listens")
}

fn launch(dir: &Path, timeout: &str, allow: &[&str], command: &[&str]) -> (i32, serde_json::Value) {
    let sidecar = sidecar(dir);
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir)
        .env("SECRET_OF_NODE", "leak")
        .env("API_KEY", "k")
        .args(["launch", "--verdict", &sidecar.name])
        .args(["--timeout", timeout]);
    for a in allow {
        cmd.args(["--allow-env", a]);
    }
    let status = cmd.arg("--").args(command).status().unwrap();
    sidecar.wait().expect("the launcher sent its verdict");
    let result = serde_json::from_slice(&std::fs::read(dir.join("result/result.json")).unwrap()).unwrap();
    (status.code().unwrap_or(-1), result)
}

fn setup() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("result")).unwrap();
    t
}

#[test]
fn runs_the_script_with_literal_args_and_only_allowed_env() {
    let t = setup();
    std::fs::write(t.path().join("input.txt"), "hello").unwrap();
    let script = "import json,os,sys; open('output.txt','w').write(open('input.txt').read().upper()); print(json.dumps({'argv': sys.argv[1:], 'env': sorted(os.environ)}))";
    let (code, result) = launch(t.path(), "10", &["API_KEY"], &["/usr/bin/python3", "-c", script, "; rm -rf /", "$(id)"]);
    assert_eq!(code, 0);
    assert_eq!(result["exitCode"], 0);
    let out: serde_json::Value = serde_json::from_slice(&std::fs::read(t.path().join("result/stdout")).unwrap()).unwrap();
    assert_eq!(out["argv"], serde_json::json!(["; rm -rf /", "$(id)"]));
    let env: Vec<&str> = out["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(env.contains(&"API_KEY") && !env.contains(&"SECRET_OF_NODE"), "{env:?}");
    assert_eq!(std::fs::read_to_string(t.path().join("output.txt")).unwrap(), "HELLO");
}

#[test]
fn exit_codes_signals_and_timeouts_become_the_launcher_status() {
    let t = setup();
    let (code, result) = launch(t.path(), "10", &[], &["/bin/bash", "-c", "echo oops >&2; exit 3"]);
    assert_eq!((code, result["exitCode"].as_i64()), (3, Some(3)));
    assert_eq!(std::fs::read_to_string(t.path().join("result/stderr")).unwrap(), "oops\n");
    let (code, result) = launch(t.path(), "1", &[], &["/bin/bash", "-c", "sleep 30"]);
    assert_eq!(code, 124);
    assert_eq!(result["timedOut"], true);
    let (code, _) = launch(t.path(), "10", &[], &["/bin/bash", "-c", "kill -9 $$"]);
    assert_eq!(code, 128 + 9);
}

#[test]
fn output_is_capped_at_one_mib_per_stream() {
    let t = setup();
    let (code, result) =
        launch(t.path(), "10", &[], &["/usr/bin/python3", "-c", "import sys\nfor _ in range(40): sys.stdout.write('x'*65536)"]);
    assert_eq!(code, 0);
    assert_eq!(result["stdoutBytes"], 40 * 65536);
    assert_eq!(result["stdoutTruncated"], true);
    assert_eq!(std::fs::metadata(t.path().join("result/stdout")).unwrap().len(), 1024 * 1024);
}

#[test]
fn a_missing_interpreter_is_reported_not_hidden() {
    let t = setup();
    let (code, result) = launch(t.path(), "10", &[], &["/nonexistent/python", "x.py"]);
    assert_eq!(code, 127);
    assert!(result["error"].as_str().unwrap().contains("could not be started"));
}

/// Issue 8: the launcher was PID 1 with no SIGTERM handler, so a deleted
/// SkillJob's script ran until its own timeout or the 30 s grace SIGKILL.
#[test]
fn sigterm_kills_the_scripts_whole_group_at_once_and_the_result_says_cancelled() {
    let t = setup();
    let started = t.path().join("started");
    // A background grandchild too: the whole group must go, not just the leader.
    let script = format!("sleep 300 & echo $! > {}.pid; touch {}; wait", started.display(), started.display());
    let sidecar = sidecar(t.path());
    let mut child = Command::new(BIN)
        .current_dir(t.path())
        .args(["launch", "--verdict", &sidecar.name])
        .args(["--timeout", "120", "--", "/bin/bash", "-c", &script])
        .spawn()
        .unwrap();
    // Wait for the script's own sign of life (not a fixed sleep).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !started.exists() {
        assert!(std::time::Instant::now() < deadline, "the script never started");
        std::thread::yield_now();
    }
    let grandchild: i32 = std::fs::read_to_string(format!("{}.pid", started.display())).unwrap().trim().parse().unwrap();
    let sent = std::time::Instant::now();
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    // Well inside the kubelet's 30 s grace and the issue's 5 s: the script was killed, not waited for.
    assert!(took < std::time::Duration::from_secs(5), "the launcher took {took:?} to stop");
    sidecar.wait().unwrap();
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(t.path().join("result/result.json")).unwrap()).unwrap();
    assert_eq!(result["cancelled"], true, "{result}");
    assert_eq!(result["timedOut"], false);
    // The background sleep is gone too (kill(pid, 0) fails with ESRCH once it is reaped by init).
    let gone = (0..200).any(|_| {
        let alive = unsafe { libc::kill(grandchild, 0) } == 0
            && std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|s| !s.contains(") Z "));
        if alive {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        !alive
    });
    assert!(gone, "the script's background child survived the cancel");
}

/// As PID 1 (the run container's entry point) the launcher kills what the
/// script left in its PID namespace before it writes the result: the
/// controller records the verdict as soon as the result is stored, so
/// nothing may still be changing the work files then. The straggler here
/// left the script's process group (`setsid`) and appends to a file as fast
/// as it can; the last append must come before the result was written.
#[test]
fn as_pid_1_nothing_the_script_left_outlives_the_result() {
    let Some(bwrap) = skill_operator::runner::sandbox::detect_bwrap() else {
        skill_operator::gated::skip("the launcher as PID 1", "bwrap not installed (apt-get install bubblewrap)");
        return;
    };
    let t = setup();
    let script = "setsid bash -c 'while :; do echo x >> tick; done' & until [ -s tick ]; do :; done; exit 0";
    let dir = t.path().to_str().unwrap();
    let sidecar = sidecar(t.path());
    let status = Command::new(bwrap)
        .args(["--dev-bind", "/", "/", "--unshare-pid", "--as-pid-1", "--die-with-parent", "--chdir", dir, "--"])
        .arg(BIN)
        .args(["launch", "--verdict", &sidecar.name])
        .args(["--timeout", "30", "--", "/bin/bash", "-c", script])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    sidecar.wait().unwrap();
    let mtime = |p: &str| std::fs::metadata(t.path().join(p)).unwrap().modified().unwrap();
    let (tick, stdout) = (mtime("tick"), mtime("result/stdout"));
    assert!(tick <= stdout, "the straggler still wrote {:?} after the result files were begun", tick.duration_since(stdout).unwrap());
}

/// The launcher reports where the pod's time went (for the run's trace):
/// the script's start and end on the node's clock, around the script's own
/// reading of it, and the fetch container's times when it left them beside
/// the launcher in the tools volume (here: a copy of the binary in a
/// folder of the test's own).
#[test]
fn reports_the_scripts_times_and_the_fetchs_left_beside_it() {
    let nanos = |s: &str| s.trim().parse::<u64>().unwrap();
    let t = setup();
    let (_, plain) = launch(t.path(), "10", &[], &["/usr/bin/python3", "-c", "import time; print(time.time_ns())"]);
    let inside = nanos(&std::fs::read_to_string(t.path().join("result/stdout")).unwrap());
    let times = &plain["times"];
    let (start, end) = (times["scriptStartUnixNano"].as_u64().unwrap(), times["scriptEndUnixNano"].as_u64().unwrap());
    assert!(start <= inside && inside <= end, "the script ran between the reported start and end: {times}");
    assert!(times.get("fetch").is_none(), "no fetch times beside the test's binary: {times}");

    let tools = tempfile::tempdir().unwrap();
    let launcher = tools.path().join("skill-operator");
    std::fs::copy(BIN, &launcher).unwrap();
    let fetched = serde_json::json!({"startUnixNano": 1_000, "endUnixNano": 2_000});
    std::fs::write(tools.path().join("fetch-times.json"), fetched.to_string()).unwrap();
    let sidecar = sidecar(t.path());
    let status = Command::new(&launcher)
        .current_dir(t.path())
        .args(["launch", "--verdict", &sidecar.name])
        .args(["--timeout", "10", "--", "/bin/true"])
        .status()
        .unwrap();
    assert!(status.success());
    sidecar.wait().unwrap();
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(t.path().join("result/result.json")).unwrap()).unwrap();
    assert_eq!(result["times"]["fetch"], fetched, "{result}");
}

/// The script runs as the launcher's uid in the launcher's container, so
/// it must find no way to stand in for the launcher's word. As the run
/// container's uid (65532, as in a pod), it tries every way this machine
/// has: writing the verdict where the sidecar keeps it, connecting to the
/// verdict channel itself, stopping the launcher with SIGTERM (a
/// `cancelled` verdict it did not earn), and reading the launcher through
/// `/proc` (its environment, its descriptors, its memory). Each fails, and
/// the verdict is the launcher's: the script timed out, and its stdout is
/// what it printed. (Before the channel the launcher wrote the verdict to
/// files in a directory the script could write, and the sidecar uploaded
/// whatever it found there first.)
#[test]
fn a_script_cannot_forge_the_launchers_verdict_or_stop_it() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if unsafe { libc::geteuid() } != 0 {
        skill_operator::gated::skip("the forged-verdict attack", "it runs the launcher as uid 65532, which needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    // The sidecar's volume: not the script's (root's, 0700, as another container's would be unreachable).
    let kept = t.path().join("sidecar/result");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::set_permissions(t.path().join("sidecar"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::os::unix::fs::chown(&work, Some(65532), Some(65532)).unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sidecar = Collector::start(&kept.join("result.json")).unwrap();
    let script = r#"
import json, os, socket, sys, time
ppid = os.getppid()
def attempt(what, f):
    try:
        f()
        print(what, "done", flush=True)
    except OSError as e:
        print(what, "failed:", e.__class__.__name__, flush=True)
forged = json.dumps({"exitCode": 0})
def forge_files():
    for d in (sys.argv[1], "result"):
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "stdout"), "w").write("forged\n")
        open(os.path.join(d, "result.json"), "w").write(forged)
attempt("files", forge_files)
def forge_channel():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + os.environ["VERDICT_NAME"])
    s.sendall(b"skill-operator verdict v1\n" + b"R" + len(forged).to_bytes(4, "big") + forged.encode())
attempt("channel", forge_channel)
attempt("environ", lambda: open(f"/proc/{ppid}/environ", "rb").read())
attempt("fds", lambda: os.listdir(f"/proc/{ppid}/fd"))
attempt("mem", lambda: open(f"/proc/{ppid}/mem", "rb").read(1))
os.kill(ppid, 15)
print("sigterm sent", flush=True)
time.sleep(30)
"#;
    let started = std::time::Instant::now();
    let status = Command::new(BIN)
        .current_dir(&work)
        .uid(65532)
        .gid(65532)
        .env("VERDICT_NAME", &sidecar.name)
        .args(["launch", "--verdict", &sidecar.name, "--timeout", "3", "--allow-env", "VERDICT_NAME", "--"])
        .args(["/usr/bin/python3", "-c", script])
        .arg(&kept)
        .status()
        .unwrap();
    let verdict = sidecar.wait().expect("the launcher's own verdict arrived");
    assert_eq!(status.code(), Some(124), "the launcher's status is the timeout's, not the forged exit 0");
    assert!(verdict.result.outcome.timed_out, "{:?}", verdict.result);
    assert!(!verdict.result.outcome.cancelled, "the script's SIGTERM did not count as a cancel: {:?}", verdict.result);
    assert_eq!(verdict.result.outcome.exit_code, None);
    assert!(started.elapsed() >= std::time::Duration::from_secs(3), "the run lasted until its timeout");
    let stdout = String::from_utf8_lossy(&verdict.stdout);
    for line in [
        "files failed: PermissionError",
        "channel failed: ConnectionRefusedError",
        "environ failed: PermissionError",
        "fds failed: PermissionError",
        "mem failed: PermissionError",
        "sigterm sent",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} not in the script's stdout:\n{stdout}");
    }
    assert!(!stdout.contains("forged"), "{stdout}");
    // What the sidecar keeps is the launcher's: the timeout, the script's real output.
    let kept_result: serde_json::Value = serde_json::from_slice(&std::fs::read(kept.join("result.json")).unwrap()).unwrap();
    assert_eq!(kept_result["timedOut"], true, "{kept_result}");
    assert_eq!(std::fs::read(kept.join("stdout")).unwrap(), verdict.stdout);
}
