//! `skill-operator launch`: the in-pod launcher. It runs as the main
//! container's entry point (copied into the pod by the fetch init container),
//! applies the fence the local runner applies (argv array, environment
//! allowlist, timeout with process-group kill, 1 MiB per stream) and writes
//! the result for the upload sidecar. The pod itself is the sandbox: no
//! network but the artifact endpoint, no credentials, restricted Pod Security.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::process::{execute, ExecError, ExecSpec, ResourceLimits, RunAs};
pub use crate::api::outcome::LaunchResult;
use crate::api::outcome::RunOutcome;
use crate::api::outcome::{unix_nanos_now, FetchTimes, PodTimes, FETCH_TIMES_FILE};
use crate::shutdown::Shutdown;

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// Where result.json goes (stdout and stderr are written beside it).
    #[arg(long, value_name = "FILE")]
    pub result: PathBuf,
    /// Wall-clock timeout in seconds (clamped to the hard ceiling).
    #[arg(long, value_name = "SECS")]
    pub timeout: u64,
    /// A variable passed through from the container's environment (repeatable); nothing else is.
    #[arg(long = "allow-env", value_name = "NAME")]
    pub allow_env: Vec<String>,
    /// The interpreter and its arguments: `-- /usr/bin/python3 /package/scripts/x.py ARGS...`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// `skill-operator launch`: run the script, write the result, and exit
/// with [`exit_status`]. A shutdown (the kubelet's SIGTERM, sent when the
/// SkillJob is deleted or the Job's deadline passes) stops the script's
/// whole process group at once and the result says `cancelled`.
pub async fn command(args: LaunchArgs, shutdown: Shutdown) -> std::io::Result<std::process::ExitCode> {
    let mut command = args.command.into_iter();
    let program = PathBuf::from(command.next().unwrap_or_default());
    let spec = Launch {
        program,
        args: command.collect(),
        allow_env: args.allow_env,
        timeout: Duration::from_secs(args.timeout.clamp(1, crate::core::limits::MAX_TIMEOUT_SECS)),
        result: args.result,
        cwd: std::env::current_dir()?,
        cancel: Some(shutdown),
        fetched: fetch_times(),
    };
    let result = launch(spec, &|k| std::env::var(k).ok()).await?;
    if let Some(error) = &result.error {
        eprintln!("skill-operator launch: {error}");
    }
    // Exit statuses are 0-255; exit_status stays inside that range.
    Ok(std::process::ExitCode::from(exit_status(&result).clamp(0, 255) as u8))
}

/// The launcher's inputs.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Names of the variables passed through from the container's environment.
    pub allow_env: Vec<String>,
    pub timeout: Duration,
    /// Where `result.json` goes; `stdout` and `stderr` are written next to it.
    pub result: PathBuf,
    pub cwd: PathBuf,
    /// Stops the run (SIGKILL to its group) when triggered; the outcome says `cancelled`.
    pub cancel: Option<Shutdown>,
    /// When the fetch container worked, reported on with the script's own times.
    pub fetched: Option<FetchTimes>,
}

/// The fetch container's times, left beside this launcher in the tools
/// volume (`None` when it left none: an older fetch, or a test).
fn fetch_times() -> Option<FetchTimes> {
    let path = std::env::current_exe().ok()?.parent()?.join(FETCH_TIMES_FILE);
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The exit status the launcher ends with: the script's own code, 128+N for
/// a signal, 124 for a timeout (as `timeout(1)`), 143 (SIGTERM's) for a
/// cancelled run, 127 when nothing started.
pub fn exit_status(result: &LaunchResult) -> i32 {
    if result.outcome.cancelled {
        return 128 + libc::SIGTERM;
    }
    if result.outcome.timed_out {
        return 124;
    }
    match (result.outcome.exit_code, result.outcome.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 127,
    }
}

/// Run the script and write `result.json`, `stdout` and `stderr`.
pub async fn launch(spec: Launch, lookup: &dyn Fn(&str) -> Option<String>) -> std::io::Result<LaunchResult> {
    let mut exec = ExecSpec::new(spec.program.clone(), spec.cwd.clone());
    exec.args = spec.args.clone();
    exec.env = spec.allow_env.iter().filter_map(|name| lookup(name).map(|v| (OsString::from(name), OsString::from(v)))).collect();
    exec.timeout = spec.timeout;
    exec.cancel = spec.cancel.clone();
    // The container already runs as a non-root uid with limits set by the
    // pod; switching uids is neither possible nor needed. RLIMIT_NPROC is
    // left alone: it counts every process of this uid on the node.
    exec.run_as = RunAs::Inherit;
    exec.limits = ResourceLimits { nproc: None, ..ResourceLimits::default() };
    let dir = spec.result.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let script_start_unix_nano = unix_nanos_now();
    let executed = execute(exec).await;
    end_stragglers();
    let times = Some(PodTimes { fetch: spec.fetched, script_start_unix_nano, script_end_unix_nano: unix_nanos_now() });
    let result = match executed {
        Ok(out) => {
            write_atomic(&dir.join("stdout"), &out.stdout)?;
            write_atomic(&dir.join("stderr"), &out.stderr)?;
            LaunchResult { outcome: out.outcome, error: None, times }
        }
        Err(err) => {
            write_atomic(&dir.join("stdout"), b"")?;
            write_atomic(&dir.join("stderr"), err.to_string().as_bytes())?;
            LaunchResult { outcome: RunOutcome::default(), error: Some(describe(&err)), times }
        }
    };
    write_atomic(&spec.result, &serde_json::to_vec(&result).map_err(std::io::Error::other)?)?;
    Ok(result)
}

/// As the container's PID 1, kill every process left in its PID namespace
/// (a `setsid` grandchild escapes the script's process group) before the
/// result is written. The result then describes a run with nothing left
/// running, so the controller may record the verdict as soon as the result
/// is stored, without waiting for the kubelet to report the container's
/// end; and the work files the sidecar uploads can no longer change. Only
/// as PID 1: anywhere else `kill(-1)` would reach every process of the uid.
fn end_stragglers() {
    if std::process::id() != 1 {
        return;
    }
    // SAFETY: plain syscall; from PID 1, -1 means every other process of
    // this PID namespace that we may signal (the script's, same uid).
    let rc = unsafe { libc::kill(-1, libc::SIGKILL) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
        tracing::warn!(err = %std::io::Error::last_os_error(), "could not kill the script's leftover processes");
    }
}

fn describe(err: &ExecError) -> String {
    format!("the script could not be started: {err}")
}

/// Write a file so a reader never sees half of it (the upload sidecar waits
/// for `result.json` to appear, so it must appear whole and last).
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("partial");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
