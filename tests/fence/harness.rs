#![allow(dead_code)]
//! The standalone server's executor with real processes: a world
//! directory under /tmp (readable by the run-as uids), skills written by
//! the test, and a [`LocalExecutor`] whose sandbox forwarder is this
//! build's `skill-operator` binary. Runs go through the same path as
//! `skill_run` after its confirmation: the fence's plan, then the executor.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use skill_operator::core::declaration::Interpreter;
use skill_operator::core::fence::{Request, RunPlan};
use skill_operator::core::grants::Grants;
use skill_operator::mcp::executor::{Caller, Executor, RunControl, RunReport};
use skill_operator::mcp::snapshot::Snapshot;
use skill_operator::runner::executor::{LocalExecutor, LocalOptions};
use skill_operator::runner::local::SandboxBackend;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

pub(crate) struct World {
    pub(crate) dir: tempfile::TempDir,
}

pub(crate) fn is_root() -> bool {
    skill_operator::gated::is_root()
}

/// `SKILL_OPERATOR_TEST_SANDBOX=builtin`: every fence test against the built-in
/// sandbox (scripts/test.sh runs them both ways); otherwise `auto` (bubblewrap here).
pub(crate) fn test_backend() -> SandboxBackend {
    match std::env::var("SKILL_OPERATOR_TEST_SANDBOX").as_deref() {
        Ok("builtin") => SandboxBackend::Builtin,
        Ok("bwrap") => SandboxBackend::Bwrap,
        _ => SandboxBackend::Auto,
    }
}

/// A sandbox the tests expect to work: bubblewrap installed, or the built-in one asked for.
pub(crate) fn bwrap_works() -> bool {
    test_backend() == SandboxBackend::Builtin || skill_operator::runner::sandbox::detect_bwrap().is_some()
}

impl World {
    pub(crate) fn new() -> World {
        let dir = tempfile::Builder::new().prefix("so-fence-").tempdir_in("/tmp").expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        for sub in ["skills", "data", "marks"] {
            std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        }
        std::fs::set_permissions(dir.path().join("skills"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(dir.path().join("data"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // Marks: where an attack leaves evidence it ran (anyone may write).
        std::fs::set_permissions(dir.path().join("marks"), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        World { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn skills(&self) -> PathBuf {
        self.path().join("skills")
    }

    pub(crate) fn data(&self) -> PathBuf {
        self.path().join("data")
    }

    pub(crate) fn marks(&self) -> PathBuf {
        self.path().join("marks")
    }

    /// `skills/<name>` with an `mcp-host:` block (YAML text after
    /// `mcp-host:`) and files (world-readable, like an installed package).
    pub(crate) fn skill(&self, name: &str, host: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.skills().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("SKILL.md"), format!("---\nname: {name}\ndescription: fence test\nmcp-host:\n{host}\n---\nbody\n"))
            .expect("write");
        for (rel, body) in files {
            let path = dir.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, body).expect("write");
        }
        chmod_tree(&dir);
        dir
    }

    /// The options `serve` would use here, with this build's binary for the forwarder.
    pub(crate) fn options(&self) -> LocalOptions {
        let mut o = LocalOptions::new(self.data());
        o.runner.self_exe = Some(PathBuf::from(BIN));
        o.runner.sandbox_backend = test_backend();
        o
    }

    pub(crate) async fn executor(&self, f: impl FnOnce(&mut LocalOptions)) -> Arc<LocalExecutor> {
        let mut o = self.options();
        f(&mut o);
        let exec = LocalExecutor::start(o);
        let _ = exec.interpreters().await; // wait for the start-up probes
        exec
    }

    /// The fence's plan for a call, as `skill_run` makes it (standalone: the declaration stands).
    pub(crate) fn plan(&self, skill: &str, script: &str, args: &[&str]) -> RunPlan {
        let grants = Grants::resolve(&|_| None, None);
        let interpreters: BTreeSet<Interpreter> = Interpreter::ALL.into_iter().collect();
        let snap = Snapshot::scan(&[self.skills()], grants, interpreters);
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        snap.plan(skill, &Request { script, args: &args, timeout_secs: None }).expect("the fence allows the call")
    }
}

impl World {
    /// The plan, made while the skill may be changing under it (the swap
    /// attack): a refusal is returned as the plan of a run that the
    /// executor then refuses too, so the caller only counts.
    pub(crate) fn plan_unchecked(&self, skill: &str, script: &str) -> RunPlan {
        let grants = Grants::resolve(&|_| None, None);
        let interpreters: BTreeSet<Interpreter> = Interpreter::ALL.into_iter().collect();
        loop {
            let snap = Snapshot::scan(&[self.skills()], grants.clone(), interpreters.clone());
            if let Ok(plan) = snap.plan(skill, &Request { script, args: &[], timeout_secs: None }) {
                return plan;
            }
        }
    }
}

pub(crate) fn chmod_tree(path: &Path) {
    let meta = std::fs::symlink_metadata(path).expect("stat");
    if meta.file_type().is_symlink() {
        return;
    }
    let mode = if meta.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    if meta.is_dir() {
        for e in std::fs::read_dir(path).expect("read_dir").flatten() {
            chmod_tree(&e.path());
        }
    }
}

/// `skill_run` after confirmation: a new job with `inputs`, then the run.
pub(crate) async fn run(exec: &LocalExecutor, plan: RunPlan, inputs: Vec<(&str, &[u8])>) -> RunReport {
    let inputs = inputs.into_iter().map(|(p, b)| (p.to_string(), b.to_vec())).collect();
    match exec.run_new(&Caller::local(), plan, inputs, RunControl::default()).await {
        Ok(report) => report,
        Err(e) => panic!("the run did not start: {} ({})", e.message, e.code),
    }
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether a file appears within `within` (for evidence a run left).
pub(crate) fn exists_within(path: &Path, within: Duration) -> bool {
    let end = std::time::Instant::now() + within;
    loop {
        if path.exists() {
            return true;
        }
        if std::time::Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
