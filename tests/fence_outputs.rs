//! Issue 9, class 5: the cost of listing a run's outputs is bounded.
//!
//! Before, 64 sparse 64 MiB files turned a 59 ms script into an 8.6 s
//! `skill_run` call (every byte hashed, on the request's path), and every
//! `skill_job_status` hashed them again (3.7 s each). Now the outputs are
//! listed once when the run ends, hashing at most
//! `OUTPUT_HASH_BUDGET` bytes (files past it are listed with their size
//! and no digest), off the async threads, and the listing is stored:
//! status reads it back.
#[path = "fence/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use harness::*;
use skill_operator::core::limits::{MIB, OUTPUT_HASH_BUDGET};
use skill_operator::jobs::{InputMatch, JobState};
use skill_operator::mcp::executor::{Caller, Executor};

const SPARSE: &str =
    "for i in range(64):\n    with open(f'sparse-{i:02}', 'wb') as f:\n        f.truncate(64 << 20)\nprint('made 64 sparse files')\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_outputs_are_hashed_once_within_the_budget() {
    let world = World::new();
    let host = "  version: 1\n  run:\n    - script: scripts/sparse.py\n      interpreter: python\n";
    world.skill("sparse", host, &[("scripts/sparse.py", SPARSE)]);
    let exec = world
        .executor(|o| {
            if is_root() {
                o.runner.run_as_uids = Some("62840-62849".parse().unwrap());
            }
        })
        .await;
    let started = Instant::now();
    let report = run(&exec, world.plan("sparse", "scripts/sparse.py", &[]), vec![]).await;
    let call = started.elapsed();
    assert_eq!(report.record.state, JobState::Succeeded, "{}", text(&report.stderr));
    let script = Duration::from_millis(report.record.run.as_ref().unwrap().outcome.duration_ms);
    println!("script {script:?}, whole call {call:?}");
    // The budget is hashed (128 MiB of holes read as zeros), nothing more.
    assert!(call < script + Duration::from_secs(3), "the call stays near the script's own time: script {script:?}, call {call:?}");
    let listing = report.outputs.clone();
    assert_eq!(listing.files.len(), 64);
    assert_eq!(listing.total_bytes, 64 * 64 * MIB, "every file is listed with its size");
    let hashed: Vec<_> = listing.files.iter().filter(|f| !f.sha256.is_empty()).collect();
    assert_eq!(hashed.len() as u64, OUTPUT_HASH_BUDGET / (64 * MIB), "hashed up to the budget");
    assert!(listing.files.iter().filter(|f| f.sha256.is_empty()).all(|f| f.input == InputMatch::Unhashed && f.size == 64 * MIB));

    // Status reads the stored listing: cheap, every time, and the same,
    // even when the files have changed since (nothing is hashed again).
    let work = world.data().join("jobs").join(&report.record.id).join("work");
    std::fs::write(work.join("sparse-00"), b"changed after the run").unwrap();
    for _ in 0..5 {
        let t = Instant::now();
        let status = exec.status(&Caller::local(), &report.record.id).await.unwrap();
        let took = t.elapsed();
        assert!(took < Duration::from_millis(500), "status re-hashed? {took:?}");
        assert_eq!(status.outputs.as_ref(), Some(&listing));
    }
    // The listing is stored beside the record.
    assert!(world.data().join("jobs").join(&report.record.id).join("outputs.json").is_file());
}
