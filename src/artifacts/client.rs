//! The pod side: `skill-operator fetch` (init container) and
//! `skill-operator upload` (native sidecar), as library functions over plain
//! structs; the CLI only maps flags.
//!
//! Both talk to one URL only (`--endpoint`, an IP: the pod has no DNS),
//! never through a proxy and never following a redirect (the token must not
//! go anywhere else), and both identify as `job:<ns>:<uid>:<token>`, the
//! token read from a file mounted into these two containers only.
//!
//! # fetch
//! 1. `GET .../package`: at most [`ArtifactLimits::max_package_bytes`]
//!    (checked against Content-Length, then while reading), sha256 compared
//!    with the `X-Content-Digest` the endpoint announces (and with
//!    `--package-digest` when given), then `package::unpack` into the
//!    package directory with all its checks (paths, types, caps).
//! 2. `GET .../inputs`: the manifest is checked whole before any download:
//!    every path through `RelPath::parse` and the package path rules, the
//!    count, per-file and total caps. Then each file is streamed to disk
//!    (never held in memory: the container has a 128 MiB limit), created
//!    with `create_new` under directories this call made, capped at the
//!    announced size and checked against the announced digest; reads are
//!    pinned to the manifest's set digest (`?set=`), so a set replaced
//!    mid-fetch fails (409) instead of mixing two versions.
//! 3. Copies its own executable to `<tools>/skill-operator` (0755, via a
//!    temporary name and rename) so the run image needs nothing of ours.
//!
//! # upload
//! Waits (polling) until the result file exists or the stop signal (SIGTERM:
//! the kubelet sends it once `run` has exited) arrives, then uploads in one
//! streamed tar (see the parent module): the result file, `stdout`,
//! `stderr`, and every regular file under the work directory. The walk
//! never follows a symlink: directories are opened with `openat(...,
//! O_NOFOLLOW | O_DIRECTORY)` relative to their parent and files with
//! `O_NOFOLLOW`, so a script that leaves `out -> /var/run/skill-operator/token`
//! (or swaps a directory for a link) cannot make the sidecar read through
//! it; symlinks, FIFOs, sockets and devices are skipped and reported. Over-cap
//! files are reported, not sent. The manifest goes last, so everything is
//! read once; its sha256, with counts, is the termination message (< 4 KiB).
//! After a successful upload the sidecar stays up until stopped: a native
//! sidecar that exits is restarted by the kubelet while `run` still runs.

use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

use super::{
    check_namespace, check_uid, job_bearer, termination_error, termination_message, ArtifactLimits, ErrorBody, InputsManifest,
    OutputManifest, SetFile, SkipReason, Skipped, HEADER_CONTENT_DIGEST, MANIFEST_PATH, RESULT_PREFIX, TAR_CONTENT_TYPE, WORK_PREFIX,
};
use crate::core::package::{self, PackageError};
use crate::core::paths::RelPath;

/// Where the endpoint is and who this pod is.
#[derive(Clone)]
pub struct Endpoint {
    /// Base URL including the API version, e.g. `http://10.96.0.10:8443/v1`.
    pub base: String,
    pub namespace: String,
    /// The SkillJob's UID.
    pub uid: String,
    /// The job token (the token file's content).
    pub token: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base", &self.base)
            .field("namespace", &self.namespace)
            .field("uid", &self.uid)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    pub fn new(
        base: impl Into<String>,
        namespace: impl Into<String>,
        uid: impl Into<String>,
        token: impl Into<String>,
    ) -> Result<Self, ClientError> {
        let base = base.into().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::Config(format!("--endpoint {base:?}: expected http://IP:PORT/v1")));
        }
        let (namespace, uid, token) = (namespace.into(), uid.into(), token.into().trim().to_string());
        check_namespace(&namespace).map_err(ClientError::Config)?;
        check_uid(&uid).map_err(ClientError::Config)?;
        if token.is_empty() || token.len() > 1024 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientError::Config("the job token is empty or malformed".into()));
        }
        Ok(Endpoint { base, namespace, uid, token })
    }

    /// Reads the token from `token_file` (the mounted Secret).
    pub fn with_token_file(
        base: impl Into<String>,
        namespace: impl Into<String>,
        uid: impl Into<String>,
        token_file: &Path,
    ) -> Result<Self, ClientError> {
        let mut raw = String::new();
        std::fs::File::open(token_file)
            .and_then(|f| f.take(4096).read_to_string(&mut raw))
            .map_err(|source| ClientError::Io { what: format!("reading the token file {}", token_file.display()), source })?;
        Endpoint::new(base, namespace, uid, raw)
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/jobs/{}/{}/{tail}", self.base, self.namespace, self.uid)
    }

    fn bearer(&self) -> String {
        job_bearer(&self.namespace, &self.uid, &self.token)
    }
}

/// Why fetch or upload failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Config(String),
    #[error("cannot reach the artifact endpoint ({url}): {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the artifact endpoint answered {status} {code} for {url}: {message}")]
    Endpoint { url: String, status: u16, code: String, message: String },
    #[error("{what}: content hashes to {actual}, the endpoint announced {expected}; the stored copy or the transfer is corrupt")]
    DigestMismatch { what: String, expected: String, actual: String },
    #[error("{what}: got {actual} bytes, the endpoint announced {expected}")]
    SizeMismatch { what: String, expected: u64, actual: u64 },
    #[error("{what} is larger than {limit} bytes")]
    TooLarge { what: String, limit: u64 },
    #[error("the endpoint's answer is not usable: {0}")]
    Protocol(String),
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl ClientError {
    /// Worth another attempt: the network, a busy or failing endpoint, a
    /// file that changed under the upload. Not: refusals and integrity errors.
    fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::Io { .. } => true,
            ClientError::Endpoint { status, code, .. } => *status >= 500 && code != "digest_mismatch",
            _ => false,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ClientError {
    let what = what.into();
    move |source| ClientError::Io { what, source }
}

fn http_client() -> reqwest::Client {
    crate::oci::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(120))
        .build()
        .expect("reqwest client with static settings")
}

/// Path segments and query values as the URL carries them.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

fn encode_path(rel: &str) -> String {
    rel.split('/').map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect::<Vec<_>>().join("/")
}

async fn endpoint_error(url: &str, resp: reqwest::Response) -> ClientError {
    let status = resp.status().as_u16();
    let body = read_capped(resp, 64 * 1024).await.unwrap_or_default();
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(e) => ClientError::Endpoint { url: url.into(), status, code: e.error.code, message: e.error.message },
        Err(_) => ClientError::Endpoint {
            url: url.into(),
            status,
            code: "http".into(),
            message: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        },
    }
}

async fn read_capped(mut resp: reqwest::Response, cap: u64) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| ClientError::Protocol(format!("reading an answer: {e}")))? {
        if out.len() as u64 + chunk.len() as u64 > cap {
            return Err(ClientError::TooLarge { what: "an answer".into(), limit: cap });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A GET, retried on connection errors and 503 (the endpoint restarting).
async fn get(http: &reqwest::Client, ep: &Endpoint, url: &str) -> Result<reqwest::Response, ClientError> {
    let mut delay = Duration::from_millis(250);
    for attempt in 0..4 {
        let last = attempt == 3;
        match http.get(url).header(AUTHORIZATION, ep.bearer()).send().await {
            Ok(r) if r.status().is_success() => return Ok(r),
            Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE && !last => {}
            Ok(r) => return Err(endpoint_error(url, r).await),
            Err(e) if (e.is_connect() || e.is_timeout()) && !last => {}
            Err(e) => return Err(ClientError::Unreachable { url: url.into(), detail: error_chain(&e) }),
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    unreachable!("the last attempt returns")
}

use crate::oci::error_chain;

fn announced_digest(resp: &reqwest::Response, what: &str) -> Result<String, ClientError> {
    let d = resp
        .headers()
        .get(HEADER_CONTENT_DIGEST)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ClientError::Protocol(format!("{what}: no {HEADER_CONTENT_DIGEST} header")))?;
    check_digest(d).map_err(ClientError::Protocol)?;
    Ok(d.to_string())
}

fn check_digest(d: &str) -> Result<(), String> {
    match d.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => Ok(()),
        _ => Err(format!("{d:?} is not a sha256:<hex> digest")),
    }
}

// -- fetch --------------------------------------------------------------------

/// What `fetch` does (the `skill-operator fetch` flags).
#[derive(Debug, Clone)]
pub struct FetchOptions {
    pub endpoint: Endpoint,
    /// Empty directory (or missing, its parent existing) for the package.
    pub package_dir: PathBuf,
    /// Where input files go (an empty emptyDir in the pod).
    pub work_dir: PathBuf,
    /// Where to copy this executable as `skill-operator`; `None` to skip.
    pub tools_dir: Option<PathBuf>,
    /// Refuse a package whose sha256 differs (`--package-digest`).
    pub expect_package_digest: Option<String>,
    pub limits: ArtifactLimits,
}

/// What `fetch` did.
#[derive(Debug, Clone)]
pub struct FetchReport {
    /// sha256 of the package bytes.
    pub package_digest: String,
    pub package_files: usize,
    /// The inputs' set digest, when any were staged.
    pub inputs_digest: Option<String>,
    pub inputs: Vec<SetFile>,
    /// The copied launcher.
    pub tools: Option<PathBuf>,
}

/// The init container's work; see the module docs.
pub async fn fetch(opts: &FetchOptions) -> Result<FetchReport, ClientError> {
    let http = http_client();
    let ep = &opts.endpoint;
    let l = opts.limits;

    // 1. The package.
    let url = ep.url("package");
    let resp = get(&http, ep, &url).await?;
    let announced = announced_digest(&resp, "package")?;
    if let Some(want) = &opts.expect_package_digest {
        if want != &announced {
            return Err(ClientError::DigestMismatch {
                what: "package (--package-digest)".into(),
                expected: want.clone(),
                actual: announced,
            });
        }
    }
    if resp.content_length().is_some_and(|n| n > l.max_package_bytes) {
        return Err(ClientError::TooLarge { what: "the package".into(), limit: l.max_package_bytes });
    }
    let bytes = read_capped(resp, l.max_package_bytes).await?;
    let actual = super::sha256_digest(&bytes);
    if actual != announced {
        return Err(ClientError::DigestMismatch { what: "package".into(), expected: announced, actual });
    }
    let dest = opts.package_dir.clone();
    let unpacked = tokio::task::spawn_blocking(move || package::unpack(&bytes, &dest))
        .await
        .map_err(|e| ClientError::Protocol(format!("unpack task: {e}")))??;

    // 2. The inputs.
    let url = ep.url("inputs");
    let resp = get(&http, ep, &url).await?;
    let body = read_capped(resp, l.max_manifest_bytes).await?;
    let manifest: InputsManifest = serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(format!("inputs manifest: {e}")))?;
    check_inputs(&manifest, &l)?;
    make_parent_dirs(&opts.work_dir, &manifest.files)?;
    let set = manifest.digest.clone();
    let results = futures::stream::iter(manifest.files.iter())
        .map(|f| fetch_input(&http, ep, &opts.work_dir, f, set.as_deref()))
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;

    // 3. The launcher.
    let tools = match &opts.tools_dir {
        Some(dir) => Some(copy_self(dir)?),
        None => None,
    };
    Ok(FetchReport { package_digest: actual, package_files: unpacked.len(), inputs_digest: manifest.digest, inputs: manifest.files, tools })
}

/// The whole inputs manifest against the caps and path rules, before any download.
fn check_inputs(m: &InputsManifest, l: &ArtifactLimits) -> Result<(), ClientError> {
    let bad = |m: String| ClientError::Protocol(format!("inputs manifest: {m}"));
    if m.files.len() > l.max_files {
        return Err(bad(format!("{} files, over the {}-file cap", m.files.len(), l.max_files)));
    }
    if m.digest.is_none() && !m.files.is_empty() {
        return Err(bad("files without a set digest".into()));
    }
    let mut total = 0u64;
    for f in &m.files {
        RelPath::parse(&f.path).map_err(|e| bad(format!("path {:?}: {e}", f.path)))?;
        check_digest(&f.digest).map_err(bad)?;
        if f.size > l.max_file_bytes {
            return Err(ClientError::TooLarge { what: format!("input {}", f.path), limit: l.max_file_bytes });
        }
        total += f.size;
    }
    if total > l.max_total_bytes {
        return Err(ClientError::TooLarge { what: "the inputs together".into(), limit: l.max_total_bytes });
    }
    package::check_file_set(m.files.iter().map(|f| (f.path.as_str(), f.size)), &l.file_set())?;
    Ok(())
}

/// Creates every parent directory (0755) below `work`; an existing entry
/// must be a real directory (never a symlink).
fn make_parent_dirs(work: &Path, files: &[SetFile]) -> Result<(), ClientError> {
    use std::os::unix::fs::DirBuilderExt;
    let mut made = std::collections::BTreeSet::new();
    for f in files {
        let mut acc = String::new();
        let mut parts: Vec<&str> = f.path.split('/').collect();
        parts.pop();
        for p in parts {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(p);
            if !made.insert(acc.clone()) {
                continue;
            }
            let dir = work.join(&acc);
            match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let meta = std::fs::symlink_metadata(&dir).map_err(io_err(format!("checking {}", dir.display())))?;
                    if !meta.is_dir() {
                        return Err(ClientError::Protocol(format!("{} exists and is not a directory", dir.display())));
                    }
                }
                Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
            }
        }
    }
    Ok(())
}

async fn fetch_input(http: &reqwest::Client, ep: &Endpoint, work: &Path, f: &SetFile, set: Option<&str>) -> Result<(), ClientError> {
    let mut url = ep.url(&format!("inputs/{}", encode_path(&f.path)));
    if let Some(set) = set {
        url.push_str("?set=");
        url.push_str(&utf8_percent_encode(set, SEGMENT).to_string());
    }
    let what = format!("input {}", f.path);
    let mut resp = get(http, ep, &url).await?;
    let announced = announced_digest(&resp, &what)?;
    if announced != f.digest {
        return Err(ClientError::DigestMismatch { what, expected: f.digest.clone(), actual: announced });
    }
    if let Some(n) = resp.content_length() {
        if n != f.size {
            return Err(ClientError::SizeMismatch { what, expected: f.size, actual: n });
        }
    }
    let path = work.join(&f.path);
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .await
        .map_err(io_err(format!("creating {}", path.display())))?;
    let mut file = tokio::io::BufWriter::with_capacity(256 * 1024, file);
    let result: Result<(), ClientError> = async {
        let mut h = Sha256::new();
        let mut n = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| ClientError::Protocol(format!("{what}: {e}")))? {
            n += chunk.len() as u64;
            if n > f.size {
                return Err(ClientError::SizeMismatch { what: what.clone(), expected: f.size, actual: n });
            }
            h.update(&chunk);
            file.write_all(&chunk).await.map_err(io_err(format!("writing {}", path.display())))?;
        }
        file.flush().await.map_err(io_err(format!("writing {}", path.display())))?;
        if n != f.size {
            return Err(ClientError::SizeMismatch { what: what.clone(), expected: f.size, actual: n });
        }
        let actual = format!("sha256:{}", hex::encode(h.finalize()));
        if actual != f.digest {
            return Err(ClientError::DigestMismatch { what: what.clone(), expected: f.digest.clone(), actual });
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&path).await;
    }
    result
}

/// Copies this executable to `<dir>/skill-operator`, 0755.
fn copy_self(dir: &Path) -> Result<PathBuf, ClientError> {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe().map_err(io_err("finding this executable"))?;
    let dest = dir.join("skill-operator");
    let tmp = dir.join(".skill-operator.partial");
    let _ = std::fs::remove_file(&tmp);
    std::fs::copy(&exe, &tmp).map_err(io_err(format!("copying {} to {}", exe.display(), tmp.display())))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(io_err(format!("chmod {}", tmp.display())))?;
    std::fs::rename(&tmp, &dest).map_err(io_err(format!("renaming to {}", dest.display())))?;
    Ok(dest)
}

// -- upload -------------------------------------------------------------------

/// What `upload` does (the `skill-operator upload` flags).
#[derive(Debug, Clone)]
pub struct UploadOptions {
    pub endpoint: Endpoint,
    pub work_dir: PathBuf,
    /// The launcher's `result.json`; `stdout` and `stderr` are its siblings.
    pub result_file: PathBuf,
    /// Where the digest line goes (`/dev/termination-log`); `None` to skip.
    pub termination_log: Option<PathBuf>,
    pub limits: ArtifactLimits,
    /// How often to look for the result file.
    pub poll_interval: Duration,
    /// Upload attempts (transient failures only), backing off from 500 ms.
    pub attempts: u32,
}

impl UploadOptions {
    pub fn new(endpoint: Endpoint, work_dir: PathBuf, result_file: PathBuf) -> Self {
        UploadOptions {
            endpoint,
            work_dir,
            result_file,
            termination_log: Some(PathBuf::from("/dev/termination-log")),
            limits: ArtifactLimits::DEFAULT,
            poll_interval: Duration::from_millis(250),
            attempts: 5,
        }
    }
}

/// What `upload` sent.
#[derive(Debug, Clone)]
pub struct UploadReport {
    pub manifest: OutputManifest,
    /// sha256 of the `manifest.json` bytes sent (and stored).
    pub manifest_digest: String,
    /// The OCI manifest digest of the stored outputs set.
    pub set_digest: String,
    /// The line written to the termination log.
    pub termination_message: String,
}

/// A stop signal for [`upload`] and [`run_upload_sidecar`]: turns true on
/// SIGTERM or SIGINT. Call it first thing in `main` (inside the runtime),
/// so a SIGTERM never meets the default action (exit without uploading).
pub fn stop_signal() -> io::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = tx.send(true);
        std::future::pending::<()>().await;
    });
    Ok(rx)
}

async fn wait_stop(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The sidecar: [`upload`], then stay up until stopped (a native sidecar
/// that exits is restarted while `run` runs). Exit 0 on `Ok`.
pub async fn run_upload_sidecar(opts: &UploadOptions, mut stop: watch::Receiver<bool>) -> Result<UploadReport, ClientError> {
    let report = upload(opts, stop.clone()).await?;
    wait_stop(&mut stop).await;
    Ok(report)
}

/// Waits for the result file or the stop signal, uploads (retrying
/// transient failures), and writes the termination log either way.
pub async fn upload(opts: &UploadOptions, mut stop: watch::Receiver<bool>) -> Result<UploadReport, ClientError> {
    let mut stop_gone = false;
    while std::fs::symlink_metadata(&opts.result_file).is_err() && !*stop.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(opts.poll_interval) => {}
            r = stop.changed(), if !stop_gone => stop_gone = r.is_err(),
        }
    }
    let http = http_client();
    let mut delay = Duration::from_millis(500);
    let mut attempt = 1;
    let result = loop {
        match upload_once(&http, opts).await {
            Ok(r) => break Ok(r),
            Err(e) if e.is_transient() && attempt < opts.attempts.max(1) => {
                tracing::warn!(error = %e, attempt, "upload failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
                attempt += 1;
            }
            Err(e) => break Err(e),
        }
    };
    let line = match &result {
        Ok(r) => r.termination_message.clone(),
        Err(e) => termination_error(&e.to_string()),
    };
    if let Some(path) = &opts.termination_log {
        if let Err(e) = std::fs::write(path, line.as_bytes()) {
            tracing::warn!(error = %e, path = %path.display(), "cannot write the termination log");
        }
    }
    result
}

async fn upload_once(http: &reqwest::Client, opts: &UploadOptions) -> Result<UploadReport, ClientError> {
    let ep = &opts.endpoint;
    let (work, result_file, limits) = (opts.work_dir.clone(), opts.result_file.clone(), opts.limits);
    let plan = tokio::task::spawn_blocking(move || plan_upload(&work, &result_file, &limits))
        .await
        .map_err(|e| ClientError::Protocol(format!("walk task: {e}")))??;

    let (tx, rx) = mpsc::channel::<io::Result<Vec<u8>>>(8);
    let (ns, uid) = (ep.namespace.clone(), ep.uid.clone());
    let writer = tokio::task::spawn_blocking(move || write_tar(plan, &ns, &uid, tx));
    let url = ep.url("outputs");
    let sent = http
        .put(&url)
        .header(AUTHORIZATION, ep.bearer())
        .header(CONTENT_TYPE, TAR_CONTENT_TYPE)
        .body(reqwest::Body::wrap_stream(RxStream(rx)))
        .send()
        .await;
    let written = writer.await.map_err(|e| ClientError::Protocol(format!("tar task: {e}")))?;
    let resp = match sent {
        Ok(r) if !r.status().is_success() => return Err(endpoint_error(&url, r).await),
        Ok(r) => r,
        // The writer's own failure (a file that shrank...) aborts the body
        // and is the better report; a broken pipe is only the consequence.
        Err(e) => match written {
            Err(w) if !is_broken_pipe(&w) => return Err(w),
            _ => return Err(ClientError::Unreachable { url, detail: error_chain(&e) }),
        },
    };
    let (manifest, manifest_bytes) = written?;
    let manifest_digest = super::sha256_digest(&manifest_bytes);
    let body = read_capped(resp, 64 * 1024).await?;
    let answer: serde_json::Value = serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(format!("outputs answer: {e}")))?;
    if answer.get("manifestDigest").and_then(|v| v.as_str()) != Some(manifest_digest.as_str()) {
        return Err(ClientError::Protocol(format!(
            "the endpoint stored manifest {:?}, this upload sent {manifest_digest}",
            answer.get("manifestDigest")
        )));
    }
    let set_digest = answer.get("setDigest").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let termination_message = termination_message(&manifest_digest, &manifest);
    Ok(UploadReport { manifest, manifest_digest, set_digest, termination_message })
}

fn is_broken_pipe(e: &ClientError) -> bool {
    matches!(e, ClientError::Io { source, .. } if source.kind() == io::ErrorKind::BrokenPipe)
}

/// The request body: chunks from the tar writer thread.
struct RxStream(mpsc::Receiver<io::Result<Vec<u8>>>);

impl futures::Stream for RxStream {
    type Item = io::Result<Vec<u8>>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// `Write` into the channel in 256 KiB chunks (backpressure: the channel
/// holds 8, so at most ~2 MiB is buffered).
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

const CHUNK: usize = 256 * 1024;

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the request ended before the upload was sent"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Which directory a planned file is under.
#[derive(Debug, Clone, Copy)]
enum Root {
    Work,
    Result,
}

#[derive(Debug)]
struct PlanFile {
    /// `result/...` or `work/...`.
    set_path: String,
    root: Root,
    /// Components below the root.
    comps: Vec<CString>,
    size: u64,
}

#[derive(Debug)]
struct Plan {
    work: PathBuf,
    result_dir: PathBuf,
    files: Vec<PlanFile>,
    skipped: Vec<Skipped>,
    skipped_omitted: u64,
    complete: bool,
    max_skipped: usize,
}

impl Plan {
    fn skip(&mut self, path: String, reason: SkipReason, size: Option<u64>) {
        if self.skipped.len() < self.max_skipped {
            self.skipped.push(Skipped { path, reason, size });
        } else {
            self.skipped_omitted += 1;
        }
    }
}

/// Decides what to send: the result files, then the walk of the work
/// directory with the caps applied in walk order (names sorted).
fn plan_upload(work: &Path, result_file: &Path, l: &ArtifactLimits) -> Result<Plan, ClientError> {
    let result_dir = result_file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let result_name = result_file.file_name().unwrap_or(OsStr::new("result.json"));
    let mut plan = Plan {
        work: work.to_path_buf(),
        result_dir: result_dir.clone(),
        files: Vec::new(),
        skipped: Vec::new(),
        skipped_omitted: 0,
        complete: false,
        max_skipped: l.max_skipped_listed,
    };
    // The result files.
    if let Ok(dir) = fsx::open_dir(&result_dir) {
        for (name, stored, cap) in [
            (result_name, "result.json", l.max_result_bytes),
            (OsStr::new("stdout"), "stdout", l.max_stream_bytes),
            (OsStr::new("stderr"), "stderr", l.max_stream_bytes),
        ] {
            let c = CString::new(name.as_bytes()).map_err(|_| ClientError::Config("the result path has a NUL".into()))?;
            let set_path = format!("{RESULT_PREFIX}{stored}");
            match fsx::stat_at(&dir, &c) {
                Err(_) => {}
                Ok(st) => match fsx::kind(&st) {
                    fsx::Kind::Symlink => plan.skip(set_path, SkipReason::Symlink, None),
                    fsx::Kind::Other | fsx::Kind::Dir => plan.skip(set_path, SkipReason::NotRegular, None),
                    fsx::Kind::File if st.st_size as u64 > cap => plan.skip(set_path, SkipReason::FileTooLarge, Some(st.st_size as u64)),
                    fsx::Kind::File => {
                        plan.complete |= stored == "result.json";
                        plan.files.push(PlanFile { set_path, root: Root::Result, comps: vec![c], size: st.st_size as u64 });
                    }
                },
            }
        }
    }
    // The work directory.
    let root = fsx::open_dir(work).map_err(io_err(format!("opening {}", work.display())))?;
    let mut walk = Walk { l: *l, seen: 0, stopped: false, files: 0, dirs: 0, total: 0, lower: std::collections::HashMap::new() };
    walk.dir(&mut plan, &root, "", &[], 0);
    Ok(plan)
}

struct Walk {
    l: ArtifactLimits,
    seen: usize,
    stopped: bool,
    files: usize,
    dirs: usize,
    total: u64,
    /// Lower-cased path -> the path taken (files and implied directories).
    lower: std::collections::HashMap<String, String>,
}

impl Walk {
    /// `prefix` is the directory's path below the work root (`""` or `a/b/`).
    fn dir(&mut self, plan: &mut Plan, fd: &OwnedFd, prefix: &str, comps: &[CString], depth: usize) {
        let names = match fsx::list(fd) {
            Ok(n) => n,
            Err(_) => {
                plan.skip(format!("{WORK_PREFIX}{prefix}"), SkipReason::Unreadable, None);
                return;
            }
        };
        for name in names {
            if self.stopped {
                return;
            }
            self.seen += 1;
            let shown = format!("{WORK_PREFIX}{prefix}{}", String::from_utf8_lossy(name.as_bytes()));
            if self.seen > self.l.max_walk_entries {
                self.stopped = true;
                plan.skip(shown, SkipReason::WalkLimit, None);
                return;
            }
            let Ok(st) = fsx::stat_at(fd, &name) else {
                plan.skip(shown, SkipReason::Unreadable, None);
                continue;
            };
            let size = st.st_size as u64;
            let Ok(utf8) = std::str::from_utf8(name.as_bytes()) else {
                plan.skip(shown, SkipReason::BadName, None);
                continue;
            };
            let rel = format!("{prefix}{utf8}");
            let mut sub = comps.to_vec();
            sub.push(name.clone());
            match fsx::kind(&st) {
                fsx::Kind::Symlink => plan.skip(shown, SkipReason::Symlink, None),
                fsx::Kind::Other => plan.skip(shown, SkipReason::NotRegular, None),
                fsx::Kind::Dir => {
                    // Files inside sit one level deeper than the directory.
                    if depth + 2 > self.l.file_set().max_depth {
                        plan.skip(shown, SkipReason::TooDeep, None);
                        continue;
                    }
                    match fsx::open_dir_at(fd, &name) {
                        Ok(child) => self.dir(plan, &child, &format!("{rel}/"), &sub, depth + 1),
                        Err(_) => plan.skip(shown, SkipReason::Unreadable, None),
                    }
                }
                fsx::Kind::File => {
                    if let Some(reason) = self.admit(&rel, size) {
                        plan.skip(shown, reason, Some(size));
                    } else {
                        plan.files.push(PlanFile { set_path: format!("{WORK_PREFIX}{rel}"), root: Root::Work, comps: sub, size });
                    }
                }
            }
        }
    }

    /// The caps and path rules for one file, in the order the endpoint checks them.
    fn admit(&mut self, rel: &str, size: u64) -> Option<SkipReason> {
        let l = self.l;
        // Both rule sets: the package rules the registry set obeys, and
        // RelPath's, which `GET .../outputs/{*path}` applies when reading back.
        if package::check_rel_path(rel, &l.file_set()).is_err() || RelPath::parse(rel).is_err() {
            return Some(SkipReason::BadName);
        }
        // Case collisions with anything taken, the file and its parents.
        let parents: Vec<&str> = rel.match_indices('/').map(|(i, _)| &rel[..i]).collect();
        let mut new_dirs = 0;
        for p in &parents {
            match self.lower.get(&p.to_lowercase()) {
                Some(taken) if taken != p => return Some(SkipReason::CaseCollision),
                Some(_) => {}
                None => new_dirs += 1,
            }
        }
        if self.lower.contains_key(&rel.to_lowercase()) {
            return Some(SkipReason::CaseCollision);
        }
        if size > l.max_file_bytes {
            return Some(SkipReason::FileTooLarge);
        }
        if self.files >= l.max_files {
            return Some(SkipReason::FileLimit);
        }
        if self.total + size > l.max_total_bytes {
            return Some(SkipReason::TotalTooLarge);
        }
        if self.dirs + new_dirs > l.max_dirs {
            return Some(SkipReason::DirLimit);
        }
        for p in parents {
            self.lower.entry(p.to_lowercase()).or_insert_with(|| p.to_string());
        }
        self.lower.insert(rel.to_lowercase(), rel.to_string());
        self.dirs += new_dirs;
        self.files += 1;
        self.total += size;
        None
    }
}

/// Hashes what it reads and insists on exactly `size` bytes (a tar header
/// promises the size before the content).
struct ExactReader {
    inner: io::Take<std::fs::File>,
    left: u64,
    hasher: Sha256,
}

impl Read for ExactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank while it was being uploaded"));
        }
        self.left -= n as u64;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes the tar (on a blocking thread) and returns the manifest sent
/// last. On failure the body stream ends with an error, so the request is
/// aborted rather than ending in a truncated (but well-framed) body.
fn write_tar(plan: Plan, ns: &str, uid: &str, tx: mpsc::Sender<io::Result<Vec<u8>>>) -> Result<(OutputManifest, Vec<u8>), ClientError> {
    let abort = tx.clone();
    let result = write_tar_inner(plan, ns, uid, tx);
    if let Err(e) = &result {
        let _ = abort.blocking_send(Err(io::Error::other(e.to_string())));
    }
    result
}

fn write_tar_inner(
    plan: Plan,
    ns: &str,
    uid: &str,
    tx: mpsc::Sender<io::Result<Vec<u8>>>,
) -> Result<(OutputManifest, Vec<u8>), ClientError> {
    let mut builder = tar::Builder::new(ChannelWriter { tx, buf: Vec::with_capacity(CHUNK) });
    let mut files = Vec::with_capacity(plan.files.len());
    for pf in &plan.files {
        let root = match pf.root {
            Root::Work => &plan.work,
            Root::Result => &plan.result_dir,
        };
        let file = fsx::open_beneath(root, &pf.comps).map_err(io_err(format!("opening {}", pf.set_path)))?;
        let mut reader = ExactReader { inner: file.take(pf.size), left: pf.size, hasher: Sha256::new() };
        let mut header = file_header(pf.size);
        builder.append_data(&mut header, &pf.set_path, &mut reader).map_err(io_err(format!("sending {}", pf.set_path)))?;
        files.push(SetFile {
            path: pf.set_path.clone(),
            size: pf.size,
            digest: format!("sha256:{}", hex::encode(reader.hasher.finalize())),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let manifest = OutputManifest {
        schema_version: 1,
        namespace: ns.into(),
        uid: uid.into(),
        complete: plan.complete,
        files,
        skipped: plan.skipped,
        skipped_omitted: plan.skipped_omitted,
    };
    let bytes = serde_json::to_vec(&manifest).expect("the manifest serializes");
    let mut header = file_header(bytes.len() as u64);
    builder.append_data(&mut header, MANIFEST_PATH, bytes.as_slice()).map_err(io_err("sending the manifest"))?;
    let mut w = builder.into_inner().map_err(io_err("finishing the upload"))?;
    w.flush().map_err(io_err("finishing the upload"))?;
    Ok((manifest, bytes))
}

fn file_header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Directory walking relative to open directory descriptors, never
/// following a symlink below the root (see the module docs).
mod fsx {
    use super::*;

    pub enum Kind {
        File,
        Dir,
        Symlink,
        Other,
    }

    pub fn kind(st: &libc::stat) -> Kind {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }

    fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    /// The configured root itself (a mount point; following it is fine).
    pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn open_dir_at(dir: &OwnedFd, name: &CStr) -> io::Result<OwnedFd> {
        let fd = cvt(unsafe {
            libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        })?;
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A regular file only: O_NONBLOCK so a FIFO swapped in cannot hang us.
    pub fn open_file_at(dir: &OwnedFd, name: &CStr) -> io::Result<std::fs::File> {
        let fd = cvt(unsafe {
            libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        })?;
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file any more"));
        }
        Ok(file)
    }

    pub fn open_beneath(root: &Path, comps: &[CString]) -> io::Result<std::fs::File> {
        let (last, dirs) = comps.split_last().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut dir = open_dir(root)?;
        for c in dirs {
            dir = open_dir_at(&dir, c)?;
        }
        open_file_at(&dir, last)
    }

    pub fn stat_at(dir: &OwnedFd, name: &CStr) -> io::Result<libc::stat> {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        cvt(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
        Ok(st)
    }

    /// Entry names, sorted, without `.` and `..`.
    pub fn list(dir: &OwnedFd) -> io::Result<Vec<CString>> {
        let dup = cvt(unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        let dirp = unsafe { libc::fdopendir(dup) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            unsafe { libc::close(dup) };
            return Err(e);
        }
        let mut names = Vec::new();
        loop {
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                break;
            }
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            let b = name.to_bytes();
            if b != b"." && b != b".." {
                names.push(name.to_owned());
            }
        }
        unsafe { libc::closedir(dirp) };
        names.sort();
        Ok(names)
    }
}
