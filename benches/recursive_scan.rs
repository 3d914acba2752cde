//! Discovery of 1,000 skills: the recursive layout (`serve --layout
//! recursive`, what `catalog build` uses) against the standard three-layout
//! scan, on one tree both find whole.
//!
//! The tree is `<root>/skills/s0000 .. s0999`, each skill a `SKILL.md`
//! with a declared script, the script and two reference files: the
//! standard layout's `<root>/skills/<name>` form. The two scans alternate
//! (standard, recursive, standard, ...) so that cache warmth and machine
//! load fall on both alike, one untimed pass each first. Printed: the
//! median wall time of each and the ratio recursive / standard (goal:
//! at most 1.5). Nothing is asserted about time; the skill counts are.
//!
//! `cargo bench --bench recursive_scan` (release, 15 rounds); without
//! `--bench` (`cargo test --all-targets`) two rounds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use skill_operator::core::discovery::{discover_with, Layout, Limits};

const SKILLS: usize = 1_000;
const ROUNDS: usize = 15;
const QUICK_ROUNDS: usize = 2;
const GOAL_RATIO: f64 = 1.5;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a file in a folder")).unwrap();
    std::fs::write(path, text).unwrap();
}

fn tree(root: &Path) {
    for i in 0..SKILLS {
        let dir = root.join(format!("skills/s{i:04}"));
        write(
            &dir.join("SKILL.md"),
            &format!("---\nname: s{i:04}\ndescription: Generated skill {i} for the recursive scan benchmark.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/run.py\n      interpreter: python\n---\n# s{i:04}\n"),
        );
        write(&dir.join("scripts/run.py"), "print('hi')\n");
        write(&dir.join("references/a.md"), "# A\n");
        write(&dir.join("references/b.md"), "# B\n");
    }
}

fn scan(roots: &[PathBuf], layout: Layout) -> Duration {
    let t = Instant::now();
    let catalog = discover_with(roots, Limits::default(), layout);
    let took = t.elapsed();
    assert_eq!(catalog.skills.len(), SKILLS, "{layout:?} finds every skill: {:?}", catalog.problems.first());
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = if quick { QUICK_ROUNDS } else { ROUNDS };
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    let roots = [tmp.path().to_path_buf()];
    scan(&roots, Layout::Standard);
    scan(&roots, Layout::Recursive);
    let (mut standard, mut recursive) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        standard.push(scan(&roots, Layout::Standard));
        recursive.push(scan(&roots, Layout::Recursive));
    }
    let (s, r) = (median(standard), median(recursive));
    let ratio = r.as_secs_f64() / s.as_secs_f64();
    println!("recursive_scan ({profile}): {SKILLS} skills at skills/<name>, {rounds} alternating rounds");
    println!(
        "  median standard {:.1} ms, recursive {:.1} ms, ratio {ratio:.2}; goal <= {GOAL_RATIO}: {}",
        s.as_secs_f64() * 1e3,
        r.as_secs_f64() * 1e3,
        if ratio <= GOAL_RATIO { "met" } else { "NOT met" }
    );
}
