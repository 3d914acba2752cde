//! rlimits applied in pre_exec: memory, file size, CPU, open files, process count.
#[path = "runner/common.rs"]
mod common;
use common::*;

use std::time::Duration;

use skill_operator::runner::process::{execute, RunAs};

#[tokio::test]
async fn memory_hog_is_a_reported_failure() {
    let uid = fresh_uid();
    let mut s = spec(PY, &["-c", "b = bytearray(2 * 1024**3); print('allocated', len(b))"]);
    as_user(&mut s, uid);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(1), "{out:?}");
    assert!(text(&out.stderr).contains("MemoryError"), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn node_starts_under_default_limits_and_its_hog_fails() {
    let uid = fresh_uid();
    let mut s = spec(NODE, &["-e", "console.log('up')"]);
    as_user(&mut s, uid);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(0), "node must start under RLIMIT_DATA 512 MiB: {}", text(&out.stderr));
    let mut s = spec(NODE, &["-e", "const a=[]; for(;;) a.push(Buffer.alloc(16<<20, 1))"]);
    as_user(&mut s, uid);
    let out = execute(s).await.expect("execute");
    assert!(out.outcome.exit_code != Some(0), "{out:?}");
    eprintln!("node hog: exit {:?} signal {:?} in {:?}", out.outcome.exit_code, out.outcome.signal, out.duration);
}

#[tokio::test]
async fn disk_filler_hits_fsize_python_efbig() {
    let uid = fresh_uid();
    let wd = workdir_for(uid);
    let mut s = spec(PY, &["-c", "f = open('big', 'wb')\nfor i in range(100): f.write(b'0' * (1 << 20)); f.flush()"]);
    as_user(&mut s, uid);
    s.cwd = wd.path().to_path_buf();
    s.limits.fsize_bytes = Some(4 << 20);
    let out = execute(s).await.expect("execute");
    // Python ignores SIGXFSZ, so it sees EFBIG.
    assert_eq!(out.outcome.exit_code, Some(1), "{out:?}");
    assert!(text(&out.stderr).contains("File too large"), "{}", text(&out.stderr));
    let len = std::fs::metadata(wd.path().join("big")).expect("big").len();
    assert_eq!(len, 4 << 20);
}

#[tokio::test]
async fn disk_filler_hits_fsize_sigxfsz() {
    let uid = fresh_uid();
    let wd = workdir_for(uid);
    let mut s = spec("/usr/bin/dd", &["if=/dev/zero", "of=big", "bs=1M", "count=100"]);
    as_user(&mut s, uid);
    s.cwd = wd.path().to_path_buf();
    s.limits.fsize_bytes = Some(4 << 20);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.signal, Some(libc::SIGXFSZ), "{out:?}");
    assert!(std::fs::metadata(wd.path().join("big")).expect("big").len() <= 4 << 20);
}

#[tokio::test]
async fn cpu_limit_stops_a_spinner() {
    let uid = fresh_uid();
    let mut s = spec(PY, &["-c", "while True: pass"]);
    as_user(&mut s, uid);
    s.limits.cpu_seconds = Some(1);
    let out = execute(s).await.expect("execute");
    assert!(!out.outcome.timed_out);
    assert_eq!(out.outcome.signal, Some(libc::SIGXCPU), "{out:?}");
}

#[tokio::test]
async fn nofile_limit_applies() {
    let mut s = spec(PY, &["-c", "fs = [open('/dev/null') for _ in range(100)]"]);
    s.limits.nofile = Some(32);
    let out = execute(s).await.expect("execute");
    assert_eq!(out.outcome.exit_code, Some(1));
    assert!(text(&out.stderr).contains("Too many open files"), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_is_capped_and_fully_killed() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root (RLIMIT_NPROC needs a dedicated uid)");
        return;
    }
    let uid = fresh_uid();
    let mut s = spec(BASH, &["-c", "b() { b | b & }; b; sleep 30"]);
    as_user(&mut s, uid);
    s.limits.nproc = Some(32);
    s.timeout = Duration::from_millis(1500);
    s.kill_grace = Duration::from_millis(300);
    let hard = s.hard_deadline();
    let out = execute(s).await.expect("execute");
    assert!(out.duration < hard, "{:?}", out.duration);
    assert!(
        text(&out.stderr).contains("Resource temporarily unavailable"),
        "nproc must have bitten: {}",
        text(&out.stderr[..out.stderr.len().min(300)])
    );
    let left = wait_uid_gone(uid, Duration::from_secs(2));
    assert!(left.is_empty(), "fork bomb survivors: {left:?}");
    // The test process (the server) still works.
    let out = execute(spec("/usr/bin/true", &[])).await.expect("execute after bomb");
    assert_eq!(out.outcome.exit_code, Some(0));
}

#[tokio::test]
async fn nproc_is_not_enforced_for_root_children() {
    // Documents why RunAs::Auto drops root: with RunAs::Inherit a root child ignores NPROC.
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root");
        return;
    }
    let script = "for i in 1 2 3 4 5 6 7 8; do sleep 0.2 & done; wait; echo done";
    let mut s = spec(BASH, &["-c", script]);
    s.run_as = RunAs::Inherit;
    s.limits.nproc = Some(2);
    let out = execute(s).await.expect("execute");
    assert_eq!(text(&out.stdout), "done\n");
    assert!(!text(&out.stderr).contains("Resource temporarily unavailable"));
    // Same script as an unprivileged uid: forks fail.
    let uid = fresh_uid();
    let mut s = spec(BASH, &["-c", script]);
    as_user(&mut s, uid);
    s.limits.nproc = Some(2);
    let out = execute(s).await.expect("execute");
    assert!(text(&out.stderr).contains("Resource temporarily unavailable"), "{}", text(&out.stderr));
    kill_uid(uid);
}
