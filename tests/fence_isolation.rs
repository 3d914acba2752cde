//! Issue 9, class 8: without the sandbox, jobs are isolated from each
//! other, and the file checked is the file run.
//!
//! Before: every unsandboxed run had the same uid and `jobs/` was
//! world-readable, so one job's script read and rewrote another job's
//! input and stdout; and a declared script swapped for an outside symlink
//! between the check and the exec ran the outside file in 10 of 40 tries.
//! Now each run has its own uid from `--run-as-uids`, its work directory
//! is `0700` to that uid while it runs and the server's again afterwards,
//! a root server without a range refuses unsandboxed runs, and the script
//! is opened once beneath the skill and handed over as a descriptor.
#[path = "fence/harness.rs"]
mod harness;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use harness::*;
use skill_operator::jobs::JobState;
use skill_operator::mcp::executor::{Caller, Executor, RunControl};
use skill_operator::runner::local::SandboxMode;

const VICTIM: &str = "import os, sys, time\nopen('result.txt', 'w').write('victim output')\nprint('victim stdout', flush=True)\nopen(sys.argv[1] + '/victim-started', 'w').close()\nend = time.time() + 20\nwhile not os.path.exists(sys.argv[1] + '/attacker-done') and time.time() < end:\n    time.sleep(0.01)\n";

const ATTACKER: &str = r#"import json, os, sys
marks, job = sys.argv[1], sys.argv[2]
out = {}
def attempt(name, f):
    try:
        out[name] = "done: " + str(f())
    except OSError as e:
        out[name] = type(e).__name__
attempt("read_input", lambda: open(f"{job}/work/input.txt").read())
attempt("rewrite_input", lambda: open(f"{job}/work/input.txt", "w").write("rewritten"))
attempt("read_output", lambda: open(f"{job}/work/result.txt").read())
attempt("read_stdout", lambda: open(f"{job}/stdout").read())
attempt("read_record", lambda: open(f"{job}/job.json").read())
attempt("list_job", lambda: os.listdir(job))
attempt("list_jobs", lambda: os.listdir(os.path.dirname(job)))
print(json.dumps(out))
open(f"{marks}/attacker-done", "w").close()
"#;

fn skills(world: &World) {
    let host = "  version: 1\n  run:\n    - script: scripts/victim.py\n      interpreter: python\n      timeout: 30\n    - script: scripts/attacker.py\n      interpreter: python\n      timeout: 30\n";
    world.skill("pair", host, &[("scripts/victim.py", VICTIM), ("scripts/attacker.py", ATTACKER)]);
}

fn assert_all_denied(report: &skill_operator::mcp::executor::RunReport, when: &str) {
    let got: serde_json::Value =
        serde_json::from_slice(&report.stdout).unwrap_or_else(|e| panic!("{e}: {} {}", text(&report.stdout), text(&report.stderr)));
    println!("{when}: {got}");
    for (attack, result) in got.as_object().expect("object") {
        // jobs/ is 0711 and job directories 0711 while running, 0700 after;
        // records and streams 0600. (A stream not written yet is simply absent.)
        let refused = result == "PermissionError" || (attack == "read_stdout" && result == "FileNotFoundError");
        assert!(refused, "{when}: {attack} must be refused, got {result}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_cannot_read_or_rewrite_another_jobs_files() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root (a uid per run)");
        return;
    }
    let world = World::new();
    skills(&world);
    let exec = world
        .executor(|o| {
            o.runner.sandbox = SandboxMode::Off;
            o.runner.run_as_uids = Some("62800-62809".parse().unwrap());
            o.runner.max_concurrent = 2;
        })
        .await;
    let marks = world.marks().display().to_string();
    let caller = Caller::local();

    // While the victim runs: its work directory is its own uid's.
    let victim = exec.create(&caller, "pair").await.unwrap();
    let info = exec.upload(&caller, &victim.id, "input.txt", 0, b"victim input".to_vec()).await.unwrap();
    let victim_dir: PathBuf = world.data().join("jobs").join(&victim.id);
    let plan = world.plan("pair", "scripts/victim.py", &[&marks]);
    let (exec2, id, caller2) = (exec.clone(), victim.id.clone(), caller.clone());
    let victim_run =
        tokio::spawn(async move { exec2.run(&caller2, &id, plan, vec![(info.path, info.sha256)], RunControl::default()).await });
    assert!(exists_within(&world.marks().join("victim-started"), Duration::from_secs(20)), "the victim started");
    let attacker = run(&exec, world.plan("pair", "scripts/attacker.py", &[&marks, &victim_dir.display().to_string()]), vec![]).await;
    assert_all_denied(&attacker, "while the victim runs");
    let victim_report = victim_run.await.unwrap().unwrap();
    assert_eq!(victim_report.record.state, JobState::Succeeded, "{}", text(&victim_report.stderr));
    assert_ne!(victim_report.command.run_as, None);

    // After: the victim's directory is the server's, 0700; a later run (even
    // one under the victim's old uid) gets nothing.
    let meta = std::fs::metadata(&victim_dir).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
    assert_eq!(std::fs::metadata(victim_dir.join("work/result.txt")).unwrap().uid(), 0);
    std::fs::remove_file(world.marks().join("attacker-done")).unwrap();
    let later = run(&exec, world.plan("pair", "scripts/attacker.py", &[&marks, &victim_dir.display().to_string()]), vec![]).await;
    assert_all_denied(&later, "after the victim ran");
    assert_eq!(std::fs::read_to_string(victim_dir.join("work/input.txt")).unwrap(), "victim input");
}

#[tokio::test]
async fn unsandboxed_runs_as_root_need_a_uid_range() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "the refusal is for root servers");
        return;
    }
    let world = World::new();
    skills(&world);
    let exec = world.executor(|o| o.runner.sandbox = SandboxMode::Off).await;
    let err = exec.describe(&world.plan("pair", "scripts/victim.py", &["x"]), None).await.unwrap_err();
    assert_eq!(err.code, "unsandboxed-needs-uids", "{}", err.message);
    assert!(err.message.contains("--run-as-uids"), "the message says what to do: {}", err.message);
}

/// Swap `scripts/run.py` between the real file and a symlink to an outside
/// script as fast as possible while `tries` runs go; the outside script
/// leaves a mark when it runs. It never may.
async fn swapped_script_never_runs_outside(sandbox: SandboxMode, tries: usize) {
    let world = World::new();
    let host = "  version: 1\n  run:\n    - script: scripts/run.py\n      interpreter: python\n      timeout: 30\n";
    let skill = world.skill("swap", host, &[("scripts/run.py", "print('inside')\n")]);
    let outside = world.path().join("outside.py");
    std::fs::write(&outside, format!("open({:?}, 'a').write('ran\\n')\nprint('outside')\n", world.marks().join("outside-ran").display()))
        .unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
    let exec = world
        .executor(|o| {
            o.runner.sandbox = sandbox;
            // Each test of this binary its own range: runs end by killing
            // whatever is left under their uid, so two executors sharing a
            // range (which the flag's docs forbid) kill each other's runs.
            o.runner.run_as_uids = Some(if sandbox == SandboxMode::Off { "62820-62829" } else { "62830-62839" }.parse().unwrap());
        })
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, dir) = (stop.clone(), skill.join("scripts"));
    let swapper = std::thread::spawn(move || {
        let mut swaps = 0u64;
        // Attack pacing (not a wait for anything): each state holds for about
        // a millisecond, so a check often passes and the open after it often
        // meets the other state.
        let hold = Duration::from_micros(800);
        while !flag.load(Ordering::Relaxed) {
            let _ = std::fs::remove_file(dir.join("link.tmp"));
            std::os::unix::fs::symlink(&outside, dir.join("link.tmp")).unwrap();
            std::fs::write(dir.join("file.tmp"), "print('inside')\n").unwrap();
            std::fs::set_permissions(dir.join("file.tmp"), std::fs::Permissions::from_mode(0o644)).unwrap();
            std::fs::rename(dir.join("link.tmp"), dir.join("run.py")).unwrap();
            std::thread::sleep(hold);
            std::fs::rename(dir.join("file.tmp"), dir.join("run.py")).unwrap();
            std::thread::sleep(hold);
            swaps += 1;
        }
        swaps
    });
    let (mut inside, mut refused) = (0, 0);
    for _ in 0..tries {
        match exec.run_new(&Caller::local(), world.plan_unchecked("swap", "scripts/run.py"), vec![], RunControl::default()).await {
            Ok(report) if text(&report.stdout) == "inside\n" => inside += 1,
            Ok(report) => {
                assert_ne!(text(&report.stdout), "outside\n");
                refused += 1;
            }
            Err(_) => refused += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    println!("{sandbox:?}: {tries} tries, {inside} ran the declared script, {refused} refused or failed; {swaps} swaps");
    assert!(!world.marks().join("outside-ran").exists(), "the outside file ran");
    // Control: with the file left in place, the declared script runs.
    let report = run(&exec, world.plan("swap", "scripts/run.py", &[]), vec![]).await;
    assert_eq!(text(&report.stdout), "inside\n", "the control run: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_script_never_runs_the_outside_file_unsandboxed() {
    if !is_root() {
        skill_operator::gated::skip(module_path!(), "needs root (unsandboxed runs need a uid range)");
        return;
    }
    swapped_script_never_runs_outside(SandboxMode::Off, 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_script_never_runs_the_outside_file_sandboxed() {
    if !bwrap_works() {
        skill_operator::gated::skip(module_path!(), "needs bubblewrap");
        return;
    }
    swapped_script_never_runs_outside(SandboxMode::Auto, 40).await;
}

/// Unsandboxed, every interpreter of the closed set runs its script from
/// the descriptor the runner opened (node told to keep that path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_interpreter_runs_from_the_opened_descriptor() {
    let world = World::new();
    let host = "  version: 1\n  run:\n    - script: scripts/a.py\n      interpreter: python\n    - script: scripts/a.js\n      interpreter: node\n    - script: scripts/a.sh\n      interpreter: bash\n";
    world.skill(
        "three",
        host,
        &[
            ("scripts/a.py", "import sys\nprint('python', sys.argv[0], sys.argv[1:])\n"),
            ("scripts/a.js", "console.log('node', process.argv[1], process.argv.slice(2))\n"),
            ("scripts/a.sh", "echo bash \"$0\" \"$@\"\n"),
        ],
    );
    let exec = world
        .executor(|o| {
            o.runner.sandbox = SandboxMode::Off;
            if is_root() {
                o.runner.run_as_uids = Some("62880-62889".parse().unwrap());
            }
        })
        .await;
    for (script, name) in [("scripts/a.py", "python"), ("scripts/a.js", "node"), ("scripts/a.sh", "bash")] {
        let report = run(&exec, world.plan("three", script, &["x y"]), vec![]).await;
        let out = text(&report.stdout);
        assert_eq!(report.record.state, JobState::Succeeded, "{name}: {}", text(&report.stderr));
        assert!(out.starts_with(&format!("{name} /proc/self/fd/")), "{name} read its script through the descriptor: {out}");
        assert!(out.contains("x y"), "{out}");
    }
}
