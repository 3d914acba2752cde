//! A build's outputs, read back through the artifact endpoint (the build's
//! upload sidecar stored them under the build's UID like a run's outputs):
//! the launcher's result and stderr (the log tail of a failure), the
//! `image deps` report and the installed tree.
//!
//! Nothing from the build pod is trusted as it is: the outputs manifest
//! must be complete, every file of the tree is checked against the digest
//! and size the manifest lists (which the endpoint checked on upload) while
//! it is written to a private spool directory, paths go through the same
//! rules as every job path, and the report's lock digest must be the one
//! the controller planned from the package. The layer is then written by
//! the controller itself (deterministic, symlinks and special files
//! refused), never taken from the pod.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::PrepareError;
use crate::api::outcome::LaunchResult;
use crate::artifacts::{OutputManifest, SkipReason};
use crate::controller::builders::build_job::{OUTPUT_DEPS_PREFIX, OUTPUT_REPORT};
use crate::controller::context::ArtifactStore;
use crate::core::limits::BUILD_LOG_TAIL_BYTES;
use crate::core::paths::RelPath;
use crate::image::DepsReport;

const RESULT_JSON: &str = "result/result.json";
const STDERR: &str = "result/stderr";

/// A build's tree, checked and spooled, with its report.
#[derive(Debug)]
pub struct Collected {
    dir: tempfile::TempDir,
    pub report: DepsReport,
    /// Symlinks the upload did not carry (npm's `.bin` links; `NODE_PATH`
    /// resolution does not need them).
    pub skipped_links: usize,
}

impl Collected {
    /// The tree's root (what goes under `/deps`).
    pub fn tree(&self) -> PathBuf {
        self.dir.path().join("deps")
    }
}

/// Reads a succeeded build's outputs (see the module docs).
pub async fn collect(
    artifacts: &dyn ArtifactStore,
    ns: &str,
    uid: &str,
    lock_digest: &str,
    spool: Option<&Path>,
) -> Result<Collected, PrepareError> {
    let manifest = artifacts.outputs(ns, uid).await?.ok_or_else(|| PrepareError::Outputs("the build stored no outputs".into()))?;
    check_manifest(&manifest, ns, uid)?;
    let result = launch_result(artifacts, ns, uid).await?;
    if let Some(failure) = launch_failure(&result) {
        let tail = stderr_tail(artifacts, ns, uid).await;
        return Err(PrepareError::Build { reason: classify(&result, &tail), message: format!("the build {failure}{}", tail_text(&tail)) });
    }
    let skipped_links = check_skipped(&manifest)?;
    let report_bytes = artifacts.output_file(ns, uid, OUTPUT_REPORT).await?;
    let listed =
        manifest.files.iter().find(|f| f.path == OUTPUT_REPORT).ok_or_else(|| PrepareError::Outputs(format!("no {OUTPUT_REPORT}")))?;
    check_content(OUTPUT_REPORT, &report_bytes, listed.size, &listed.digest)?;
    let report: DepsReport = serde_json::from_slice(&report_bytes)
        .map_err(|e| PrepareError::Outputs(format!("{OUTPUT_REPORT} is not a dependency report: {e}")))?;
    if report.lock_digest.as_deref() != Some(lock_digest) {
        return Err(PrepareError::Outputs(format!(
            "the build installed for lock {:?}, the package declares {lock_digest}",
            report.lock_digest
        )));
    }
    let dir = match spool {
        Some(d) => tempfile::Builder::new().prefix("prepare-").tempdir_in(d)?,
        None => tempfile::Builder::new().prefix("prepare-").tempdir()?,
    };
    let root = dir.path().join("deps");
    std::fs::create_dir_all(&root)?;
    for f in manifest.files.iter().filter(|f| f.path.starts_with(OUTPUT_DEPS_PREFIX)) {
        let rel = &f.path[OUTPUT_DEPS_PREFIX.len()..];
        let rel = RelPath::parse(rel).map_err(|e| PrepareError::Outputs(format!("{}: {e}", f.path)))?;
        let bytes = artifacts.output_file(ns, uid, &f.path).await?;
        check_content(&f.path, &bytes, f.size, &f.digest)?;
        write_new(&root, rel.as_str(), &bytes)?;
    }
    Ok(Collected { dir, report, skipped_links })
}

/// The outputs belong to this build and are whole.
fn check_manifest(m: &OutputManifest, ns: &str, uid: &str) -> Result<(), PrepareError> {
    if m.namespace != ns || m.uid != uid {
        return Err(PrepareError::Outputs(format!("the outputs name {}/{}, not this build", m.namespace, m.uid)));
    }
    if !m.complete {
        return Err(PrepareError::Outputs("the upload stopped before the build finished (no result)".into()));
    }
    Ok(())
}

/// Skipped symlinks are counted; any other skip means the tree is not whole.
fn check_skipped(m: &OutputManifest) -> Result<usize, PrepareError> {
    let mut links = 0;
    let mut others = Vec::new();
    for s in &m.skipped {
        if s.reason == SkipReason::Symlink {
            links += 1;
        } else {
            others.push(format!("{} ({:?})", s.path, s.reason));
        }
    }
    if !others.is_empty() || m.skipped_omitted > 0 {
        return Err(PrepareError::Outputs(format!(
            "the dependency tree did not come back whole: {} file(s) not carried, e.g. {}; a tree over {} files or {} is refused",
            others.len() as u64 + m.skipped_omitted,
            others.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            crate::core::limits::count_text(crate::core::limits::MAX_FILES),
            crate::core::limits::bytes_text(crate::core::limits::MAX_TOTAL_BYTES),
        )));
    }
    Ok(links)
}

/// Size and sha256 as listed: a file changed anywhere between the build pod
/// and here is refused.
pub fn check_content(path: &str, bytes: &[u8], size: u64, digest: &str) -> Result<(), PrepareError> {
    let actual = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
    if bytes.len() as u64 != size || actual != digest {
        return Err(PrepareError::Outputs(format!(
            "{path}: {} bytes hashing to {actual}, the outputs manifest lists {size} bytes {digest}: tampered or corrupt",
            bytes.len()
        )));
    }
    Ok(())
}

/// Creates `root/rel` (parents 0755, the file 0644, never over an existing entry).
fn write_new(root: &Path, rel: &str, bytes: &[u8]) -> Result<(), PrepareError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&path)?;
    f.write_all(bytes)?;
    Ok(())
}

async fn launch_result(artifacts: &dyn ArtifactStore, ns: &str, uid: &str) -> Result<LaunchResult, PrepareError> {
    let bytes = artifacts.output_file(ns, uid, RESULT_JSON).await?;
    serde_json::from_slice(&bytes).map_err(|e| PrepareError::Outputs(format!("{RESULT_JSON} is not a launcher result: {e}")))
}

/// Why the launcher's result is not a success, or `None` when it is.
fn launch_failure(r: &LaunchResult) -> Option<String> {
    if let Some(e) = &r.error {
        return Some(format!("did not start: {e}"));
    }
    if r.outcome.timed_out {
        return Some("ran past its time limit".into());
    }
    match (r.outcome.exit_code, r.outcome.signal) {
        (Some(0), _) => None,
        (Some(code), _) => Some(format!("exited {code}")),
        (None, Some(sig)) => Some(format!("was killed by signal {sig}")),
        (None, None) => Some("ended without an exit code".into()),
    }
}

/// The last [`BUILD_LOG_TAIL_BYTES`] of the build's stderr (empty when it stored none).
async fn stderr_tail(artifacts: &dyn ArtifactStore, ns: &str, uid: &str) -> String {
    match artifacts.output_file(ns, uid, STDERR).await {
        Ok(bytes) => tail(&bytes),
        Err(_) => String::new(),
    }
}

/// The last bytes of a log, cut at a line start where it can be.
pub fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(BUILD_LOG_TAIL_BYTES);
    let text = String::from_utf8_lossy(&bytes[start..]).into_owned();
    match (start > 0, text.find('\n')) {
        (true, Some(i)) if i + 1 < text.len() => text[i + 1..].trim_end().to_string(),
        _ => text.trim_end().to_string(),
    }
}

fn tail_text(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("\n--- build log (tail) ---\n{tail}")
    }
}

/// The reason a failed build gets: the dependency step's own refusals by
/// name (its messages are this crate's, see `image::deps::DepsError`).
pub fn classify(result: &LaunchResult, tail: &str) -> &'static str {
    if result.outcome.timed_out {
        "BuildTimedOut"
    } else if tail.contains("no wheel of") {
        "NoWheel"
    } else if tail.contains("declare install scripts") {
        "LifecycleScripts"
    } else if tail.contains("package-lock.json") && tail.contains("commit a package-lock.json") {
        "NoLockfile"
    } else if tail.contains("requirements.txt line") {
        "BadRequirement"
    } else {
        "BuildFailed"
    }
}

/// Why a failed build Job failed, from what it stored (or its own condition).
pub async fn failure(
    artifacts: &dyn ArtifactStore,
    ns: &str,
    uid: &str,
    job_name: &str,
    job_condition: Option<(String, String)>,
) -> PrepareError {
    let deadline = job_condition.as_ref().is_some_and(|(r, _)| r == "DeadlineExceeded");
    let stored = matches!(artifacts.outputs(ns, uid).await, Ok(Some(_)));
    if stored {
        if let Ok(result) = launch_result(artifacts, ns, uid).await {
            let tail = stderr_tail(artifacts, ns, uid).await;
            let what = launch_failure(&result).unwrap_or_else(|| "succeeded, but its Job failed".into());
            let reason = if deadline { "BuildTimedOut" } else { classify(&result, &tail) };
            return PrepareError::Build { reason, message: format!("the build Job {ns}/{job_name} {what}{}", tail_text(&tail)) };
        }
    }
    let (reason, why) = job_condition.unwrap_or_else(|| ("Failed".into(), "no reason given".into()));
    PrepareError::Build {
        reason: if deadline { "BuildTimedOut" } else { "BuildFailed" },
        message: format!(
            "the build Job {ns}/{job_name} failed before storing a result ({reason}: {why}); see `kubectl -n {ns} describe job {job_name}`"
        ),
    }
}
