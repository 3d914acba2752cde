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

use serde::{Deserialize, Serialize};

use super::process::{execute, ExecError, ExecSpec, ResourceLimits, RunAs};

/// What the launcher records about a run (`result.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchResult {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Set when the script could not be started at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
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
}

/// The exit status the launcher ends with: the script's own code, 128+N for
/// a signal, 124 for a timeout (as `timeout(1)`), 127 when nothing started.
pub fn exit_status(result: &LaunchResult) -> i32 {
    if result.timed_out {
        return 124;
    }
    match (result.exit_code, result.signal) {
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
    // The container already runs as a non-root uid with limits set by the
    // pod; switching uids is neither possible nor needed. RLIMIT_NPROC is
    // left alone: it counts every process of this uid on the node.
    exec.run_as = RunAs::Inherit;
    exec.limits = ResourceLimits { nproc: None, ..ResourceLimits::default() };
    let dir = spec.result.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let result = match execute(exec).await {
        Ok(out) => {
            write_atomic(&dir.join("stdout"), &out.stdout)?;
            write_atomic(&dir.join("stderr"), &out.stderr)?;
            LaunchResult {
                exit_code: out.exit_code,
                signal: out.signal,
                timed_out: out.timed_out,
                duration_ms: out.duration.as_millis() as u64,
                stdout_bytes: out.stdout_bytes,
                stderr_bytes: out.stderr_bytes,
                stdout_truncated: out.stdout_truncated,
                stderr_truncated: out.stderr_truncated,
                error: None,
            }
        }
        Err(err) => {
            write_atomic(&dir.join("stdout"), b"")?;
            write_atomic(&dir.join("stderr"), err.to_string().as_bytes())?;
            LaunchResult {
                exit_code: None,
                signal: None,
                timed_out: false,
                duration_ms: 0,
                stdout_bytes: 0,
                stderr_bytes: 0,
                stdout_truncated: false,
                stderr_truncated: false,
                error: Some(describe(&err)),
            }
        }
    };
    write_atomic(&spec.result, &serde_json::to_vec(&result).map_err(std::io::Error::other)?)?;
    Ok(result)
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
