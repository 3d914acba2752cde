//! Warm run pods, the pod side: the upload sidecar's warm mode (`upload
//! --claim-dir DIR`), and the checks it shares with the launcher's claim
//! mode (`launch --claim-dir DIR`, src/runner/launch.rs).
//!
//! A warm pod is made before its run: `fetch --no-inputs` brings the
//! package and the launcher; the sidecar, with the pod's own warm uid as
//! `--job`, waits for a claim at the endpoint (`GET .../claim?wait=`,
//! [`CLAIM_POD_WAIT_SECS`] at a time, an endpoint outage waited out as
//! long as it lasts, SIGTERM ending the wait quietly: an idle warm pod is
//! deleted so). When the claim comes, the sidecar
//! 1. checks that nothing was left in the pod before it (see below); when
//!    something was, it uploads under the claimed SkillJob's uid a result
//!    that says so (nothing ran) and exits non-zero, leaving
//!    `DIR/`[`REFUSED_DIR`] so that a restarted sidecar never hands the
//!    claim over either;
//! 2. fetches the run's inputs into the work directory on the SkillJob's
//!    routes ([`Endpoint::claimed`]), refusing a staged set that is not the
//!    claim's, and verifying each file as `fetch` does;
//! 3. writes `DIR/`[`CLAIM_FILE`] (a temporary file, fsync, rename) for the
//!    launcher, which has waited for exactly that file;
//! 4. is the run's upload sidecar from then on, for the SkillJob's uid.
//!
//! A sidecar restarted after step 3 finds its own claim file, equal to the
//! endpoint's claim, and goes on with step 4.
//!
//! Before it waits, the sidecar publishes the key the launcher made at its
//! start (`--claim-key FILE`, written by `launch --claim-key FILE`): a run
//! granted variables gets them sealed to that key in its claim
//! ([`crate::artifacts::sealed`]). The launcher keeps the private half; the
//! sidecar only carries the public one to the endpoint
//! (`PUT .../claim-key`, write-once). A pod whose key could not be
//! published still serves runs granted no variable. Finding another key
//! published under the pod's identity (409 `key_published`: only someone
//! inside the pod, with its token, could have) is tampering: the claim is
//! refused as for a planted file.
//!
//! # Why the checks
//! An idle warm pod waits, possibly for minutes, with a run's fence around
//! it but no run in it yet. Whoever could get into it meanwhile (`kubectl
//! exec`, or something the image starts) could leave a process or a file
//! that would meet the next run: read its inputs, change its script's
//! `/tmp`, or stand in for its result. A cold run's pod never has that
//! window. So both ends check, right before the run, that the pod is as it
//! was made: no process but their own in their container
//! ([`other_processes`], reading `/proc`, which in a container of its own
//! PID namespace lists that container's processes only), and nothing
//! where nothing can be yet: the result directory, the work directory
//! before the inputs come (the launcher: the inputs and nothing else, each
//! with its claimed digest), and the launcher's `--empty-dir`s (`/tmp`).

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::super::sealed::{ClaimKey, CLAIM_KEY_MAX_BYTES};
use super::super::verdict;
use super::super::{
    is_warm_uid, termination_error, Claim, ClaimInput, InputsManifest, CLAIM_FILE, CLAIM_POD_WAIT_SECS, CLAIM_RECHECK, MAX_CLAIM_BYTES,
};
use super::*;
use crate::api::outcome::{LaunchResult, RunOutcome};
use crate::shutdown::Shutdown;

/// The start of the error a refused claim's result carries.
pub const TAMPERED: &str = "the warm pod was tampered with before its claim";
/// Where a sidecar that refused its claim kept the result it uploaded
/// (under the claim directory); while it exists the pod runs nothing.
pub const REFUSED_DIR: &str = ".refused";
/// Entries named in a "holds ..." message.
const NAMED: usize = 4;

/// `what` as a refused claim's error.
pub fn tampered(what: &str) -> String {
    format!("{TAMPERED}: {what}")
}

/// The processes of this container other than `own_pid`: the numeric
/// entries of `proc_root` (`/proc` in the pod, where the container has a
/// PID namespace of its own; a test passes a directory of its own), sorted.
/// Threads are not entries of their own (they are under `<pid>/task`).
pub fn other_processes(proc_root: &Path, own_pid: u32) -> io::Result<Vec<u32>> {
    let mut others = Vec::new();
    for entry in std::fs::read_dir(proc_root)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str().filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        if let Ok(pid) = name.parse::<u32>() {
            if pid != own_pid {
                others.push(pid);
            }
        }
    }
    others.sort_unstable();
    Ok(others)
}

/// Nothing but `own_pid` runs in the container, or what does.
pub fn check_alone(proc_root: &Path, own_pid: u32) -> Result<(), String> {
    match other_processes(proc_root, own_pid) {
        Ok(others) if others.is_empty() => Ok(()),
        Ok(others) => {
            let named: Vec<String> = others.iter().take(NAMED).map(u32::to_string).collect();
            let more = if others.len() > NAMED { format!(" and {} more", others.len() - NAMED) } else { String::new() };
            Err(format!("another process runs in its container (pid {}{more})", named.join(", ")))
        }
        Err(e) => Err(format!("its container's processes cannot be listed ({}: {e})", proc_root.display())),
    }
}

/// Up to `max` names of `dir`'s entries (the first found, sorted), and
/// whether there were more.
pub fn some_entries(dir: &Path, max: usize) -> io::Result<(Vec<String>, bool)> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        if names.len() == max {
            return Ok((names, true));
        }
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok((names, false))
}

/// `dir` holds nothing, or what it holds.
pub fn check_empty(dir: &Path) -> Result<(), String> {
    match some_entries(dir, NAMED) {
        Ok((names, _)) if names.is_empty() => Ok(()),
        Ok((names, more)) => Err(format!("{} holds {}{}", dir.display(), names.join(", "), if more { ", ..." } else { "" })),
        Err(e) => Err(format!("{} cannot be read: {e}", dir.display())),
    }
}

/// The work directory holds exactly the claim's inputs, each with its
/// claimed digest: nothing else (directories only as parents of inputs),
/// no input missing, no symlink or special file.
pub fn check_work(work: &Path, inputs: &[ClaimInput]) -> Result<(), String> {
    let wanted: HashMap<&str, &str> = inputs.iter().map(|i| (i.path.as_str(), i.digest.as_str())).collect();
    let parents: HashSet<&str> = inputs.iter().flat_map(|i| i.path.match_indices('/').map(|(at, _)| &i.path[..at])).collect();
    // Bounded by the claim: every entry is an input or a parent of one (each
    // once), or the walk ends at it.
    let mut found = HashSet::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = if rel.is_empty() { work.to_path_buf() } else { work.join(&rel) };
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{} cannot be read: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{} cannot be read: {e}", dir.display()))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = if rel.is_empty() { name.into_owned() } else { format!("{rel}/{name}") };
            // Not followed: the entry's own type.
            let kind = entry.file_type().map_err(|e| format!("{path} in the work directory cannot be read: {e}"))?;
            if kind.is_dir() && parents.contains(path.as_str()) {
                stack.push(path);
            } else if kind.is_file() && wanted.contains_key(path.as_str()) {
                let actual = file_digest(&entry.path()).map_err(|e| format!("{path} in the work directory cannot be read: {e}"))?;
                let claimed = wanted[path.as_str()];
                if actual != claimed {
                    return Err(format!("the input {path} in the work directory is {actual}, the claim says {claimed}"));
                }
                found.insert(path);
            } else if kind.is_dir() {
                return Err(format!("the work directory holds {path}/, which holds none of the claim's inputs"));
            } else if kind.is_file() {
                return Err(format!("the work directory holds {path}, which is not one of the claim's inputs"));
            } else {
                return Err(format!("the work directory holds {path}, a symlink or special file"));
            }
        }
    }
    let mut missing: Vec<&str> = wanted.keys().copied().filter(|p| !found.contains(*p)).collect();
    missing.sort_unstable();
    match missing.first() {
        None => Ok(()),
        Some(first) => Err(format!("the input {first} is missing from the work directory")),
    }
}

/// `sha256:<hex>` of a file's content, read as a stream.
fn file_digest(path: &Path) -> io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut file = std::fs::File::open(path)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(format!("sha256:{}", hex::encode(hash.finalize()))),
            n => hash.update(&buf[..n]),
        }
    }
}

/// Writes `DIR/claim.json` so that a reader sees all of it or nothing: a
/// temporary file in the same directory, synced, then renamed.
pub fn write_claim_file(dir: &Path, claim: &Claim) -> io::Result<PathBuf> {
    let path = dir.join(CLAIM_FILE);
    write_whole(&path, &serde_json::to_vec(claim).map_err(io::Error::other)?)?;
    Ok(path)
}

/// `bytes` at `path`, all or nothing for a reader: a temporary file beside
/// it, synced, then renamed.
fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.partial"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // The rename itself, durable too (best effort: the reader looks at once anyway).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The launcher's public key, left for the sidecar (`launch --claim-key`).
pub fn write_key_file(path: &Path, key: &ClaimKey) -> io::Result<()> {
    write_whole(path, &serde_json::to_vec(key).map_err(io::Error::other)?)
}

/// Reads and validates a key file (at most [`CLAIM_KEY_MAX_BYTES`]).
pub fn read_key_file(path: &Path) -> Result<ClaimKey, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(CLAIM_KEY_MAX_BYTES as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() > CLAIM_KEY_MAX_BYTES {
        return Err(format!("{} is larger than {CLAIM_KEY_MAX_BYTES} bytes", path.display()));
    }
    let key: ClaimKey = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    key.validate().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(key)
}

/// How long the sidecar waits for the launcher's key file before it waits
/// for its claim without one (the launcher starts right after the sidecar;
/// runs granted variables then pass the pod by).
pub const KEY_FILE_WAIT: Duration = Duration::from_secs(60);

/// Publishes the launcher's key: `Ok(false)` when stopped first.
async fn publish_key(http: &reqwest::Client, ep: &Endpoint, file: &Path, patience: Duration, stop: &Shutdown) -> Result<bool, ClientError> {
    match tokio::time::timeout(KEY_FILE_WAIT, wait_for_file(file, stop)).await {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(_) => return Err(ClientError::Protocol(format!("the launcher left no key in {} within {KEY_FILE_WAIT:?}", file.display()))),
    }
    let key = read_key_file(file).map_err(ClientError::Protocol)?;
    let body = serde_json::to_vec(&key).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let url = ep.url("claim-key");
    // The same key again is a no-op at the endpoint: sending it twice is safe.
    let put =
        |http: &reqwest::Client, url: &str| http.put(url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body.clone());
    tokio::select! {
        _ = stop.wait() => Ok(false),
        sent = send_idempotent(http, ep, &url, patience, put) => sent.map(|_| true),
    }
}

/// Waits until `file` exists (`true`) or the shutdown comes first
/// (`false`): an inotify watch on its directory, with a poll (every
/// second, or every [`FILE_POLL`] where no watch can be made).
pub async fn wait_for_file(file: &Path, shutdown: &Shutdown) -> bool {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // Watched before the first look, so a file written in between still wakes it.
    let (watch, mut woken) = super::watch_dir(dir);
    let poll = if watch.is_some() { Duration::from_secs(1) } else { FILE_POLL };
    loop {
        if std::fs::symlink_metadata(file).is_ok() {
            return true;
        }
        if shutdown.is_triggered() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            Some(()) = woken.recv() => {}
            _ = shutdown.wait() => {}
        }
    }
}

/// The poll for a file where no inotify watch can be made.
pub const FILE_POLL: Duration = Duration::from_millis(5);

/// Reads and validates a claim file (at most [`MAX_CLAIM_BYTES`]).
pub fn read_claim_file(path: &Path) -> Result<Claim, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CLAIM_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_CLAIM_BYTES {
        return Err(format!("{} is larger than {MAX_CLAIM_BYTES} bytes", path.display()));
    }
    let claim: Claim = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    claim.validate().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(claim)
}

/// The staged inputs are the claim's: the same paths with the same digests.
pub fn inputs_match(manifest: &InputsManifest, claim: &Claim) -> Result<(), String> {
    let mut staged: Vec<(&str, &str)> = manifest.files.iter().map(|f| (f.path.as_str(), f.digest.as_str())).collect();
    let mut claimed: Vec<(&str, &str)> = claim.inputs.iter().map(|i| (i.path.as_str(), i.digest.as_str())).collect();
    staged.sort_unstable();
    claimed.sort_unstable();
    if staged == claimed {
        return Ok(());
    }
    let staged_set: HashSet<_> = staged.iter().collect();
    let claimed_set: HashSet<_> = claimed.iter().collect();
    let differs = match (claimed.iter().find(|c| !staged_set.contains(c)), staged.iter().find(|s| !claimed_set.contains(s))) {
        (Some((path, digest)), _) => format!("the claim names {path} at {digest}, which is not staged so"),
        (None, Some((path, digest))) => format!("{path} at {digest} is staged and not in the claim"),
        (None, None) => "they differ".to_string(),
    };
    Err(format!("the staged inputs are not the claim's: {differs}"))
}

/// What the sidecar checks when the claim comes: nothing else runs in its
/// container, and the work directory is still empty. (Its result directory
/// is its own: no other container mounts it.)
pub fn check_before_handover(proc_root: &Path, own_pid: u32, work: &Path) -> Result<(), String> {
    check_alone(proc_root, own_pid)?;
    check_empty(work)
}

/// The upload sidecar of a warm pod (`upload --claim-dir`).
#[derive(Debug, Clone)]
pub struct WarmOptions {
    /// As for a run's sidecar, with the warm pod's own endpoint (`--job` is its warm uid).
    pub upload: UploadOptions,
    /// Where the claim is left for the launcher (`--claim-dir`).
    pub claim_dir: PathBuf,
    /// The proc filesystem the process check lists (`/proc`).
    pub proc_root: PathBuf,
    /// `?wait=` of each claim request ([`CLAIM_POD_WAIT_SECS`]).
    pub wait_secs: u64,
    /// Where the launcher leaves its public key (`--claim-key`), published
    /// before the wait. `None`: no key, so no run granted variables.
    pub claim_key: Option<PathBuf>,
}

impl WarmOptions {
    pub fn new(upload: UploadOptions, claim_dir: PathBuf) -> Self {
        WarmOptions { upload, claim_dir, proc_root: PathBuf::from("/proc"), wait_secs: CLAIM_POD_WAIT_SECS, claim_key: None }
    }
}

/// How a warm pod's sidecar ended (refusing its claim is an error:
/// [`ClientError::Refused`]).
#[derive(Debug)]
pub enum WarmEnd {
    /// Stopped before any run claimed the pod.
    Unclaimed,
    /// Claimed, and then the run's sidecar: its report as [`run_upload_sidecar`] gives it.
    Ran { claim: Box<Claim>, report: Option<Box<UploadReport>> },
}

/// Waits for this warm pod's claim: `Ok(None)` once stopped first. An
/// endpoint that cannot be reached is asked again for as long as it takes
/// (the pod is idle); a refusal (401, 403...) ends the wait with its error.
pub async fn wait_for_claim(
    http: &reqwest::Client,
    ep: &Endpoint,
    wait_secs: u64,
    patience: Duration,
    stop: &Shutdown,
) -> Result<Option<Claim>, ClientError> {
    let url = format!("{}?wait={wait_secs}", ep.url("claim"));
    loop {
        let asked = tokio::time::Instant::now();
        let ask = async {
            let resp = get(http, ep, &url, patience).await?;
            if resp.status() == reqwest::StatusCode::NO_CONTENT {
                return Ok(None);
            }
            let body = read_capped(resp, MAX_CLAIM_BYTES).await?;
            let claim: Claim = serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(format!("the claim: {e}")))?;
            claim.validate().map_err(|e| ClientError::Protocol(format!("the claim: {e}")))?;
            Ok(Some(claim))
        };
        let answer: Result<Option<Claim>, ClientError> = tokio::select! {
            biased;
            _ = stop.wait() => return Ok(None),
            answer = ask => answer,
        };
        let pause = match answer {
            Ok(Some(claim)) => return Ok(Some(claim)),
            // An early 204 (the endpoint stopping) is not asked again at once.
            Ok(None) => CLAIM_RECHECK.saturating_sub(asked.elapsed()),
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "no claim: the artifact endpoint did not answer; asking again");
                MAX_RETRY_DELAY
            }
            Err(e) => return Err(e),
        };
        tokio::select! {
            _ = stop.wait() => return Ok(None),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// The warm pod's sidecar: see the module docs. Errors before the claim
/// is handed over go to the termination log; a refused claim's log line
/// is the digest of the result it uploaded.
pub async fn run_warm_upload_sidecar(w: &WarmOptions, stop: &Shutdown) -> Result<WarmEnd, ClientError> {
    let handed = match hand_over(w, stop).await {
        Ok(handed) => handed,
        Err(e) => {
            if !matches!(e, ClientError::Refused(_)) {
                write_termination_log(&w.upload, &termination_error(&e.to_string()));
            }
            return Err(e);
        }
    };
    let Some((claim, claimed, channel)) = handed else { return Ok(WarmEnd::Unclaimed) };
    eprintln!("skill-operator upload: claimed by SkillJob {}; waiting for its verdict", claim.skilljob_uid);
    let report = upload_with(&claimed, channel, stop).await?;
    stop.wait().await;
    Ok(WarmEnd::Ran { claim: Box::new(claim), report: report.map(Box::new) })
}

/// Steps 1-3 of the module docs: the claim, the run's sidecar options and
/// the launcher's verdict channel, `None` when stopped first.
async fn hand_over(w: &WarmOptions, stop: &Shutdown) -> Result<Option<(Claim, UploadOptions, Channel)>, ClientError> {
    let ep = &w.upload.endpoint;
    if !is_warm_uid(&ep.uid) || ep.claim.is_some() {
        return Err(ClientError::Config(format!(
            "--claim-dir is a warm pod's: --job must be its warm uid (warm-<32 lowercase hex>), not {:?}",
            ep.uid
        )));
    }
    // The launcher connects at its start, before the pod is idle: the
    // channel is the launcher's before anyone could get into the pod.
    // A sidecar restarted after its run's verdict arrived has it in its
    // own volume (and goes on to upload it below); one restarted before
    // that cannot take any verdict ([`Channel::Lost`]).
    let channel = Channel::open(&w.upload).map_err(|e| ClientError::Refused(e.to_string()))?;
    let Some(channel) = channel.connected(stop).await.map_err(|e| ClientError::Refused(e.to_string()))? else { return Ok(None) };
    let http = http_client()?;
    // Another key already published under this pod's identity can only have
    // come from inside the pod, with its token: the claim is refused.
    let mut key_taken = None;
    if let Some(file) = &w.claim_key {
        match publish_key(&http, ep, file, w.upload.patience, stop).await {
            Ok(true) => eprintln!("skill-operator upload: published this pod's key for sealed variables"),
            Ok(false) => return Ok(None),
            Err(ClientError::Endpoint { code, message, .. }) if ErrorCode::parse(&code) == Some(ErrorCode::KeyPublished) => {
                eprintln!("skill-operator upload: another key was published for this pod: {message}");
                key_taken = Some(format!("another key was published for it before its sidecar could publish the launcher's ({message})"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "no key published: runs granted variables pass this pod by");
                eprintln!("skill-operator upload: no key published ({e}); runs granted variables pass this pod by");
            }
        }
    }
    let Some(claim) = wait_for_claim(&http, ep, w.wait_secs, w.upload.patience, stop).await? else { return Ok(None) };
    let claimed = UploadOptions { endpoint: ep.claimed(&claim.skilljob_uid)?, ..w.upload.clone() };
    let refused = w.claim_dir.join(REFUSED_DIR);
    if std::fs::symlink_metadata(&refused).is_ok() {
        // Restarted after refusing: the refusal again (its upload may not
        // have gone through; the same bytes store the same set), never the claim.
        let again = refusal_upload(&claimed, &refused);
        if std::fs::symlink_metadata(&again.result_file).is_ok() {
            send_outputs(&again).await?;
        }
        return Err(ClientError::Refused(format!(
            "this warm pod refused its claim before it was restarted (see {}); it runs nothing",
            refused.display()
        )));
    }
    let file = w.claim_dir.join(CLAIM_FILE);
    if std::fs::symlink_metadata(&file).is_ok() {
        // Restarted after handing the claim over: the run is under way.
        return match read_claim_file(&file) {
            Ok(mine) if mine == claim => match channel {
                Channel::Received => Ok(Some((claim, claimed, channel))),
                // Its channel went with the process before the restart.
                _ => Err(ClientError::Refused(verdict::VerdictError::Restarted.to_string())),
            },
            Ok(_) => refuse(&claimed, &w.claim_dir, tampered(&format!("{} is not the claim the endpoint holds", file.display()))).await,
            Err(e) => refuse(&claimed, &w.claim_dir, tampered(&format!("the claim file cannot be read: {e}"))).await,
        };
    }
    if let Some(what) = key_taken {
        return refuse(&claimed, &w.claim_dir, tampered(&what)).await;
    }
    if !matches!(channel, Channel::Connected(_)) {
        return refuse(&claimed, &w.claim_dir, tampered(&verdict::VerdictError::Restarted.to_string())).await;
    }
    if let Err(what) = check_before_handover(&w.proc_root, std::process::id(), &w.upload.work_dir) {
        return refuse(&claimed, &w.claim_dir, tampered(&what)).await;
    }
    let inputs = async {
        let manifest = read_inputs_manifest(&http, &claimed.endpoint, &w.upload.limits, w.upload.patience).await?;
        inputs_match(&manifest, &claim).map_err(ClientError::Protocol)?;
        download_inputs(&http, &claimed.endpoint, &w.upload.work_dir, &manifest, w.upload.patience).await
    };
    if let Err(e) = inputs.await {
        return refuse(&claimed, &w.claim_dir, format!("the claimed run's inputs could not be fetched into the warm pod: {e}")).await;
    }
    write_claim_file(&w.claim_dir, &claim).map_err(io_err(format!("writing the claim into {}", w.claim_dir.display())))?;
    Ok(Some((claim, claimed, channel)))
}

/// Uploads, under the claimed SkillJob's uid, a result saying why nothing
/// ran (empty streams, no work files), leaves [`REFUSED_DIR`], and ends
/// with [`ClientError::Refused`].
async fn refuse<T>(claimed: &UploadOptions, claim_dir: &Path, why: String) -> Result<T, ClientError> {
    eprintln!("skill-operator upload: {why}");
    let opts = refusal_upload(claimed, &claim_dir.join(REFUSED_DIR));
    let result_dir = opts.result_file.parent().unwrap_or(claim_dir).to_path_buf();
    for d in [&result_dir, &opts.work_dir] {
        std::fs::create_dir_all(d).map_err(io_err(format!("creating {}", d.display())))?;
    }
    let result = LaunchResult { outcome: RunOutcome::default(), error: Some(why.clone()), times: None };
    let json = serde_json::to_vec(&result).map_err(|e| ClientError::Protocol(e.to_string()))?;
    // The result last: a restarted sidecar sends the refusal again once it is whole.
    for (name, bytes) in [("stdout", &[][..]), ("stderr", &[][..]), ("result.json.partial", &json[..])] {
        let path = result_dir.join(name);
        std::fs::write(&path, bytes).map_err(io_err(format!("writing {}", path.display())))?;
    }
    std::fs::rename(result_dir.join("result.json.partial"), &opts.result_file).map_err(io_err("writing the refusal's result"))?;
    send_outputs(&opts).await?;
    Err(ClientError::Refused(why))
}

/// The upload of a refusal kept in `dir`: its result and streams, and an
/// empty work directory (nothing of the pod's is the run's).
fn refusal_upload(claimed: &UploadOptions, dir: &Path) -> UploadOptions {
    UploadOptions { work_dir: dir.join("work"), result_file: dir.join("result").join("result.json"), ..claimed.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(bytes: &[u8]) -> String {
        crate::artifacts::sha256_digest(bytes)
    }

    fn input(path: &str, bytes: &[u8]) -> ClaimInput {
        ClaimInput { path: path.into(), digest: digest(bytes) }
    }

    #[test]
    fn other_processes_are_the_numeric_entries_but_its_own() {
        let proc = tempfile::tempdir().unwrap();
        for name in ["1", "self", "thread-self", "sys", "cpuinfo", "+7", "12a"] {
            std::fs::create_dir(proc.path().join(name)).unwrap();
        }
        assert_eq!(other_processes(proc.path(), 1).unwrap(), Vec::<u32>::new(), "only itself (and no `+7`)");
        assert_eq!(check_alone(proc.path(), 1), Ok(()));
        std::fs::create_dir(proc.path().join("42")).unwrap();
        std::fs::create_dir(proc.path().join("7")).unwrap();
        assert_eq!(other_processes(proc.path(), 1).unwrap(), vec![7, 42]);
        assert_eq!(other_processes(proc.path(), 42).unwrap(), vec![1, 7]);
        let err = check_alone(proc.path(), 1).unwrap_err();
        assert!(err.contains("another process") && err.contains("pid 7, 42"), "{err}");
        for n in 100..110 {
            std::fs::create_dir(proc.path().join(n.to_string())).unwrap();
        }
        let err = check_alone(proc.path(), 1).unwrap_err();
        assert!(err.ends_with("and 8 more)"), "{err}");
        let err = check_alone(&proc.path().join("missing"), 1).unwrap_err();
        assert!(err.contains("cannot be listed"), "{err}");
    }

    #[test]
    fn empty_means_no_entry_at_all() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(check_empty(d.path()), Ok(()));
        std::fs::write(d.path().join(".hidden"), b"").unwrap();
        let err = check_empty(d.path()).unwrap_err();
        assert!(err.ends_with("holds .hidden"), "{err}");
        for n in 0..6 {
            std::fs::create_dir(d.path().join(format!("d{n}"))).unwrap();
        }
        assert!(check_empty(d.path()).unwrap_err().ends_with(", ..."));
        assert!(check_empty(&d.path().join("none")).unwrap_err().contains("cannot be read"));
    }

    #[test]
    fn the_work_directory_must_hold_exactly_the_inputs() {
        let w = tempfile::tempdir().unwrap();
        let inputs = vec![input("a.csv", b"a"), input("data/deep/b.txt", b"b")];
        std::fs::write(w.path().join("a.csv"), b"a").unwrap();
        let err = check_work(w.path(), &inputs).unwrap_err();
        assert_eq!(err, "the input data/deep/b.txt is missing from the work directory");
        std::fs::create_dir_all(w.path().join("data/deep")).unwrap();
        std::fs::write(w.path().join("data/deep/b.txt"), b"b").unwrap();
        assert_eq!(check_work(w.path(), &inputs), Ok(()));
        assert_eq!(check_work(tempfile::tempdir().unwrap().path(), &[]), Ok(()), "no inputs, nothing there");

        // A wrong digest.
        std::fs::write(w.path().join("a.csv"), b"A").unwrap();
        let err = check_work(w.path(), &inputs).unwrap_err();
        assert!(err.contains("a.csv") && err.contains(&digest(b"A")) && err.contains(&digest(b"a")), "{err}");
        std::fs::write(w.path().join("a.csv"), b"a").unwrap();
        // An extra file, beside or below an input.
        for extra in ["extra.txt", "data/extra.txt", "data/deep/extra.txt"] {
            std::fs::write(w.path().join(extra), b"x").unwrap();
            let err = check_work(w.path(), &inputs).unwrap_err();
            assert!(err.contains(extra) && err.contains("not one of the claim's inputs"), "{extra}: {err}");
            std::fs::remove_file(w.path().join(extra)).unwrap();
        }
        // An extra directory, even empty.
        std::fs::create_dir(w.path().join("data/other")).unwrap();
        let err = check_work(w.path(), &inputs).unwrap_err();
        assert!(err.contains("data/other/"), "{err}");
        std::fs::remove_dir(w.path().join("data/other")).unwrap();
        // A symlink where an input should be (to the right content) is no input.
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("a");
        std::fs::write(&target, b"a").unwrap();
        std::fs::remove_file(w.path().join("a.csv")).unwrap();
        std::os::unix::fs::symlink(&target, w.path().join("a.csv")).unwrap();
        let err = check_work(w.path(), &inputs).unwrap_err();
        assert!(err.contains("symlink"), "{err}");
        // An input where a parent directory should be.
        let nested = vec![input("x/y", b"y")];
        let w2 = tempfile::tempdir().unwrap();
        std::fs::write(w2.path().join("x"), b"y").unwrap();
        assert!(check_work(w2.path(), &nested).unwrap_err().contains("holds x,"));
    }

    #[test]
    fn a_claim_file_is_written_whole_and_read_back_checked() {
        let d = tempfile::tempdir().unwrap();
        let claim = Claim {
            skilljob_uid: "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60".into(),
            interpreter: "/usr/bin/python3".into(),
            script: "/package/scripts/x.py".into(),
            args: vec!["--n".into(), "3".into()],
            timeout_secs: 30,
            inputs: vec![input("a.csv", b"a")],
            proxy: None,
            env: None,
        };
        let path = write_claim_file(d.path(), &claim).unwrap();
        assert_eq!(path, d.path().join(CLAIM_FILE));
        assert_eq!(some_entries(d.path(), 10).unwrap(), (vec![CLAIM_FILE.to_string()], false), "no temporary file is left");
        assert_eq!(read_claim_file(&path).unwrap(), claim);
        let bad = Claim { timeout_secs: 0, ..claim.clone() };
        std::fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(read_claim_file(&path).unwrap_err().contains("timeoutSecs"));
        std::fs::write(&path, b"{\"skilljobUid\":1}").unwrap();
        assert!(read_claim_file(&path).is_err());
        std::fs::write(&path, vec![b' '; MAX_CLAIM_BYTES as usize + 1]).unwrap();
        assert!(read_claim_file(&path).unwrap_err().contains("larger than"));
    }

    #[test]
    fn the_staged_inputs_must_be_the_claims() {
        let claim = Claim {
            skilljob_uid: "uid".into(),
            interpreter: "/bin/sh".into(),
            script: "/package/x".into(),
            args: vec![],
            timeout_secs: 1,
            inputs: vec![input("b", b"b"), input("a", b"a")],
            proxy: None,
            env: None,
        };
        let file =
            |path: &str, bytes: &[u8]| crate::artifacts::SetFile { path: path.into(), size: bytes.len() as u64, digest: digest(bytes) };
        let staged = InputsManifest { digest: Some(digest(b"set")), files: vec![file("a", b"a"), file("b", b"b")] };
        assert_eq!(inputs_match(&staged, &claim), Ok(()), "order does not matter");
        let changed = InputsManifest { files: vec![file("a", b"a"), file("b", b"B")], ..staged.clone() };
        assert!(inputs_match(&changed, &claim).unwrap_err().contains("the claim names b at"));
        let more = InputsManifest { files: vec![file("a", b"a"), file("b", b"b"), file("c", b"c")], ..staged.clone() };
        assert!(inputs_match(&more, &claim).unwrap_err().contains("c at"));
        let none = InputsManifest { digest: None, files: vec![] };
        assert!(inputs_match(&none, &claim).is_err());
    }

    #[test]
    fn the_sidecar_refuses_a_work_file_or_a_process_left_before_the_claim() {
        let proc = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        assert_eq!(check_before_handover(proc.path(), 1, work.path()), Ok(()));
        std::fs::write(work.path().join("planted"), b"").unwrap();
        assert!(check_before_handover(proc.path(), 1, work.path()).unwrap_err().contains("planted"));
        std::fs::create_dir(proc.path().join("9")).unwrap();
        assert!(check_before_handover(proc.path(), 1, work.path()).unwrap_err().contains("pid 9"));
    }
}
