//! Issue 9, class 2: a run's resources are bounded for the whole run, and
//! a run that passes a limit is stopped and reported `limit-exceeded`
//! naming the limit, while the server keeps serving. Each attack here
//! ended `succeeded` before: shared memory is not counted by
//! `RLIMIT_DATA`, four children each under it passed it together, `/tmp`
//! was a tmpfs of half the RAM and `/work` had no cap.
//!
//! Needs root (a cgroup per run, the run's tmpfs), cgroups the server may
//! create, and bubblewrap; otherwise the tests are skipped visibly.
#[path = "fence/harness.rs"]
mod harness;

use harness::*;
use skill_operator::api::outcome::LimitHit;
use skill_operator::jobs::JobState;
use skill_operator::mcp::executor::Executor;
use skill_operator::runner::cgroup::CgroupMode;

const HOST: &str = "  version: 1\n  run:\n    - script: scripts/attack.py\n      interpreter: python\n      timeout: 60\n    - script: scripts/attack.sh\n      interpreter: bash\n      timeout: 60\n    - script: scripts/ok.py\n      interpreter: python\n";

async fn world_with(attack_py: &str, attack_sh: &str) -> Option<(World, std::sync::Arc<skill_operator::runner::executor::LocalExecutor>)> {
    if !is_root() || !bwrap_works() {
        skill_operator::gated::skip(module_path!(), "needs root and bubblewrap (a cgroup and a tmpfs per run)");
        return None;
    }
    let world = World::new();
    world.skill("hog", HOST, &[("scripts/attack.py", attack_py), ("scripts/attack.sh", attack_sh), ("scripts/ok.py", "print('ok')\n")]);
    let exec = world.executor(|o| o.runner.cgroup = CgroupMode::Required).await;
    let detail = exec.summary(skill_operator::core::confirm::ConfirmMode::Auto).sandbox.detail;
    if detail.contains("per process only") {
        skill_operator::gated::skip(module_path!(), &format!("no cgroup per run here: {detail}"));
        return None;
    }
    assert!(detail.contains("cgroup"), "{detail}");
    Some((world, exec))
}

/// The run is reported over `limit`, with a note naming it, and the next run works.
async fn assert_stopped_for(
    world: &World,
    exec: &skill_operator::runner::executor::LocalExecutor,
    script: &str,
    limit: LimitHit,
    words: &str,
) {
    let started = std::time::Instant::now();
    let report = run(exec, world.plan("hog", script, &[]), vec![]).await;
    let outcome = report.record.run.as_ref().expect("run").outcome.clone();
    assert_eq!(
        report.record.state,
        JobState::LimitExceeded,
        "{script}: {outcome:?}\nstdout {}\nstderr {}",
        text(&report.stdout),
        text(&report.stderr)
    );
    assert_eq!(outcome.limit_exceeded, Some(limit), "{outcome:?}");
    let note = report.note.clone().unwrap_or_default();
    eprintln!("{script}: {:?} in {:?}: {note}", outcome.limit_exceeded, started.elapsed());
    assert!(note.contains(words), "the note names the limit: {note}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "stopped when it passed the limit, not at its timeout: {:?}",
        started.elapsed()
    );
    let ok = run(exec, world.plan("hog", "scripts/ok.py", &[]), vec![]).await;
    assert_eq!((ok.record.state, text(&ok.stdout)), (JobState::Succeeded, "ok\n".to_string()), "the server keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_hog_is_stopped_for_memory() {
    // MAP_SHARED|MAP_ANONYMOUS: shared memory, which RLIMIT_DATA does not count.
    let hog = "import mmap, time\nm = mmap.mmap(-1, 1536 << 20)\nfor i in range(1536):\n    m.write(b'x' * (1 << 20))\nprint('held 1.5 GiB of shared memory', flush=True)\ntime.sleep(30)\n";
    let Some((world, exec)) = world_with(hog, "true").await else { return };
    assert_stopped_for(&world, &exec, "scripts/attack.py", LimitHit::Memory, "memory limit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_together_are_stopped_for_memory() {
    // Four children of 300 MiB each: every one under RLIMIT_DATA, 1.2 GiB together.
    let hog = "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        b = bytearray(300 << 20)\n        for i in range(0, len(b), 4096): b[i] = 1\n        time.sleep(30)\n        os._exit(0)\nfor _ in range(4): os.wait()\nprint('all four held their memory')\n";
    let Some((world, exec)) = world_with(hog, "true").await else { return };
    assert_stopped_for(&world, &exec, "scripts/attack.py", LimitHit::Memory, "memory limit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_is_stopped_for_processes() {
    let bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
    let Some((world, exec)) = world_with(bomb, "true").await else { return };
    assert_stopped_for(&world, &exec, "scripts/attack.py", LimitHit::Pids, "process limit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmp_filler_is_stopped_for_disk() {
    // dd stops at the first ENOSPC and exits: the limit must still be named.
    let filler = "dd if=/dev/zero of=/tmp/fill bs=1M count=1024\n";
    let Some((world, exec)) = world_with("pass", filler).await else { return };
    assert_stopped_for(&world, &exec, "scripts/attack.sh", LimitHit::Disk, "tmpfs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_filler_is_stopped_for_disk() {
    // 4 MiB files (each far under RLIMIT_FSIZE) until 1 GiB: /work has the job's cap.
    let filler = "import time\nfor i in range(256):\n    with open(f'/work/fill-{i}', 'wb') as f:\n        f.write(b'0' * (4 << 20))\nprint('wrote 1 GiB into /work')\n";
    let Some((world, exec)) = world_with(filler, "true").await else { return };
    assert_stopped_for(&world, &exec, "scripts/attack.py", LimitHit::Disk, "/work passed the job's disk limit").await;
}

/// Without a cgroup the fallback is visible: `skill_list` and every preview say limits are per process only.
#[tokio::test]
async fn without_cgroups_the_fallback_is_said() {
    let world = World::new();
    world.skill("hog", HOST, &[("scripts/attack.py", "pass"), ("scripts/attack.sh", "true"), ("scripts/ok.py", "print('ok')\n")]);
    let exec = world
        .executor(|o| {
            o.runner.cgroup = CgroupMode::Off;
            if is_root() {
                o.runner.run_as_uids = Some("62860-62869".parse().unwrap());
            }
        })
        .await;
    let detail = exec.summary(skill_operator::core::confirm::ConfirmMode::Auto).sandbox.detail;
    assert!(detail.contains("run limits: per process only (cgroups switched off (--cgroup off))"), "{detail}");
    let preview = exec.describe(&world.plan("hog", "scripts/ok.py", &[]), None).await.unwrap();
    assert!(preview.limits[0].starts_with("per process only, no cgroup"), "{:?}", preview.limits);
    // --cgroup required without cgroups refuses, before anything starts.
    let required = world
        .executor(|o| {
            o.runner.cgroup = CgroupMode::Required;
            o.runner.cgroup_parent = Some(world.path().join("not-a-cgroup"));
            if is_root() {
                o.runner.run_as_uids = Some("62870-62879".parse().unwrap());
            }
        })
        .await;
    let err = required.describe(&world.plan("hog", "scripts/ok.py", &[]), None).await.unwrap_err();
    assert_eq!(err.code, "cgroup-required", "{}", err.message);
}

/// A run joins its cgroup without waiting for an RCU grace period: the
/// server holds a `favordynmods` cgroup hierarchy of its own (on v1 the
/// kernel lists it for every process), says so in `skill_list`, runs
/// still work, and `--cgroup-favor-dynmods false` leaves the host alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_joins_skip_the_grace_period() {
    let Some((world, exec)) = world_with("pass", "true").await else { return };
    let detail = exec.summary(skill_operator::core::confirm::ConfirmMode::Auto).sandbox.detail;
    assert!(detail.contains("runs join without an RCU grace period (favordynmods)"), "{detail}");
    if detail.contains("cgroup v1") {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let name = format!(":name=skill-operator-favordynmods.{}:", std::process::id());
        assert!(own.contains(&name), "the server's favordynmods hierarchy is mounted (detached): {own}");
    }
    let report = run(&exec, world.plan("hog", "scripts/ok.py", &[]), vec![]).await;
    assert_eq!(report.record.state, JobState::Succeeded, "{}", text(&report.stderr));
    assert_eq!(text(&report.stdout), "ok\n");

    let plain = world
        .executor(|o| {
            o.runner.cgroup = CgroupMode::Required;
            o.runner.cgroup_favor_dynmods = false;
        })
        .await;
    let detail = plain.summary(skill_operator::core::confirm::ConfirmMode::Auto).sandbox.detail;
    assert!(detail.contains("each run waits for an RCU grace period as it joins (favordynmods not asked for)"), "{detail}");
}

/// Live processes (not zombies) running as a uid in `range`.
fn live_procs_of(range: std::ops::RangeInclusive<u32>) -> Vec<(i32, u32)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let zombie = status.lines().any(|l| l.starts_with("State:") && l.contains('Z'));
        let uid =
            status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().next()).and_then(|u| u.parse().ok());
        if let Some(uid) = uid.filter(|u| range.contains(u)) {
            if !zombie {
                found.push((pid, uid));
            }
        }
    }
    found
}

/// An unsandboxed run's leftovers (detached with `setsid`, deaf to SIGTERM
/// and SIGHUP, forking again) are dead when the run's result is told. Its
/// cgroup is emptied before the result: that is what lets the run skip the
/// slower sweep of its uid, so a process of the uid outside the cgroup
/// would be a hole this test finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_leftovers_of_an_unsandboxed_run_are_dead_when_its_result_is_told() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root (a uid and a cgroup per run)");
        return;
    }
    let world = World::new();
    let leave = "trap '' TERM HUP\n(setsid bash -c \"trap '' TERM HUP; sleep 60 & sleep 61\" &)\nsetsid sleep 62 &\nnohup sleep 63 >/dev/null 2>&1 &\necho left\n";
    world.skill("hog", HOST, &[("scripts/attack.py", "pass"), ("scripts/attack.sh", leave), ("scripts/ok.py", "print('ok')\n")]);
    let exec = world
        .executor(|o| {
            o.runner.cgroup = CgroupMode::Required;
            o.runner.sandbox = skill_operator::runner::local::SandboxMode::Off;
            o.runner.run_as_uids = Some("62890-62899".parse().unwrap());
        })
        .await;
    let detail = exec.summary(skill_operator::core::confirm::ConfirmMode::Auto).sandbox.detail;
    if detail.contains("per process only") {
        skill_operator::gated::skip(module_path!(), &format!("no cgroup per run here: {detail}"));
        return;
    }
    for _ in 0..3 {
        let report = run(&exec, world.plan("hog", "scripts/attack.sh", &[]), vec![]).await;
        assert_eq!((report.record.state, text(&report.stdout)), (JobState::Succeeded, "left\n".to_string()), "{}", text(&report.stderr));
        let alive = live_procs_of(62890..=62899);
        assert!(alive.is_empty(), "the run's leftovers outlived its result: {alive:?}");
    }
}
