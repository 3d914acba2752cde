//! `skill-operator artifacts`: the artifact endpoint (axum) and its storage
//! in an OCI registry. See the parent module for the credential scheme, the
//! tags and the transfer format.
//!
//! Routes (all JSON errors are `{"error":{"code","message"}}`):
//!
//! ```text
//! GET    /healthz                                  200 "ok"
//! GET    /readyz                                   200 when the registry answers
//! GET    /v1/jobs/{ns}/{uid}/package               job|operator  package bytes (.tar.gz)
//! PUT    /v1/jobs/{ns}/{uid}/package               operator      body: package bytes
//! GET    /v1/jobs/{ns}/{uid}/inputs                job|operator  InputsManifest JSON
//! PUT    /v1/jobs/{ns}/{uid}/inputs                operator      body: tar of input files (replaces the set)
//! GET    /v1/jobs/{ns}/{uid}/inputs/{*path}        job|operator  file bytes  [?set=<set digest>]
//! PUT    /v1/jobs/{ns}/{uid}/inputs/{*path}        operator      body: file bytes (adds or replaces one)
//! PUT    /v1/jobs/{ns}/{uid}/outputs               job           body: outputs tar (manifest.json last)
//! GET    /v1/jobs/{ns}/{uid}/outputs               operator      the stored manifest.json bytes
//! GET    /v1/jobs/{ns}/{uid}/outputs/{*path}       operator      file bytes (result/..., work/..., manifest.json)
//! DELETE /v1/jobs/{ns}/{uid}                       operator      removes the three tags
//! ```
//!
//! Order of checks on every job route: namespace and UID as names (400
//! `bad_job`), then the credential (401 `unauthorized`, 403 `forbidden`),
//! then `{*path}` with `RelPath::parse` (400 `bad_path`); the registry is
//! touched only after all three.
//!
//! Bodies: every PUT streams its body into an unnamed temporary file (the
//! spool directory) while counting and hashing, under an explicit limit:
//! 32 MiB for one input file, the package cap for a package, and
//! [`ArtifactLimits::max_batch_body_bytes`] (128 MiB plus overhead) for the
//! two tar routes, whose axum `DefaultBodyLimit` is raised for them alone.
//! A body over its limit is read on (and discarded) for up to
//! [`DRAIN_SLACK`] more bytes so the client sees the 413 rather than a reset
//! connection. Files are then pushed one at a time, so memory per request is
//! one file (one package for the package routes); a weighted semaphore
//! (`memory_budget_mib`) bounds what concurrent requests hold together.
//!
//! Single-writer assumption: writes to one job are serialised by a striped
//! in-process lock (an input PUT is read-modify-write of the set). Run one
//! replica, or route a job's writes to one replica. Reads are safe anywhere:
//! a set is cached only under the digest read from the registry, and a
//! `?set=` pin is honoured only when it equals the digest this replica read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io::Seek;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Json, RequestExt, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use super::{
    check_namespace, check_uid, tag, ArtifactKind, ArtifactLimits, ErrorBody, ErrorDetail, InputsManifest, OutputManifest, SetFile,
    ANNOTATION_JOB, ANNOTATION_KIND, HEADER_CONTENT_DIGEST, HEADER_SET_DIGEST, MANIFEST_PATH, OPERATOR_SUBJECT, RESULT_PREFIX, WORK_PREFIX,
};
use crate::core::package::{self, PackageError};
use crate::core::paths::RelPath;
use crate::core::token::verify_job_token;
use crate::oci::{self, BlobSet, OciError, OciLimits, Registry, RegistryOptions, SkillConfig};

/// Bytes read past a body's limit before answering 413 (see module docs).
pub const DRAIN_SLACK: u64 = 64 * 1024 * 1024;
/// Striped per-job write locks.
const LOCK_STRIPES: usize = 64;
/// Cached set manifests before the cache is cleared.
const CACHE_ENTRIES: usize = 1024;
const MIB: u64 = 1024 * 1024;

/// How the endpoint is set up (the lead's CLI maps flags onto this).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `HOST[:PORT]/REPO`: every job artifact is a tag in this repository.
    pub registry: String,
    /// Talk plain HTTP to the registry host.
    pub plain_http: bool,
    pub registry_auth: oci::Auth,
    /// The key job tokens derive from (the controller's `--token-key-file`).
    pub token_key: Vec<u8>,
    pub limits: ArtifactLimits,
    /// Where request bodies are spooled; `None` for the system temp dir.
    pub spool_dir: Option<PathBuf>,
    /// MiB of file data all requests may hold in memory together.
    pub memory_budget_mib: u32,
}

impl ServerConfig {
    pub fn new(registry: impl Into<String>, token_key: Vec<u8>) -> Self {
        ServerConfig {
            registry: registry.into(),
            plain_http: false,
            registry_auth: oci::Auth::Anonymous,
            token_key,
            limits: ArtifactLimits::DEFAULT,
            spool_dir: None,
            memory_budget_mib: 1024,
        }
    }
}

/// Shared state of the router.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    /// `HOST[:PORT]/REPO`.
    repo: String,
    key: Vec<u8>,
    limits: ArtifactLimits,
    spool_dir: PathBuf,
    packages: Registry,
    sets: Registry,
    memory: Semaphore,
    memory_permits: u32,
    locks: Vec<tokio::sync::Mutex<()>>,
    cache: Mutex<HashMap<String, Arc<BlobSet>>>,
    /// Packages already checked, by sha256: a burst of jobs of one package
    /// unpacks it once. Cleared when it reaches [`VALIDATED_ENTRIES`].
    validated: Mutex<HashMap<String, SkillConfig>>,
}

/// Validated package configs kept before the memo is cleared.
const VALIDATED_ENTRIES: usize = 256;
/// The config name of every staged package: the job is named in a manifest
/// annotation instead, so the blobs of one package are shared by all its jobs.
const STAGED_PACKAGE_NAME: &str = "staged-package";

impl AppState {
    pub fn new(cfg: ServerConfig) -> Result<AppState, String> {
        let (host, repo) = cfg
            .registry
            .split_once('/')
            .filter(|(h, r)| !h.is_empty() && !r.is_empty())
            .ok_or_else(|| format!("--registry {:?}: expected HOST[:PORT]/REPOSITORY", cfg.registry))?;
        if repo.contains(':') || repo.contains('@') {
            return Err(format!("--registry {:?}: give a repository without tag or digest", cfg.registry));
        }
        if cfg.token_key.len() < 32 {
            return Err("the token key is shorter than 32 bytes".into());
        }
        let base = RegistryOptions {
            auth: cfg.registry_auth.clone(),
            plain_http: if cfg.plain_http { vec![host.to_string()] } else { Vec::new() },
            ..Default::default()
        };
        let packages = Registry::new(RegistryOptions {
            limits: OciLimits { max_package_bytes: cfg.limits.max_package_bytes, ..OciLimits::DEFAULT },
            ..base.clone()
        });
        let sets = Registry::new(RegistryOptions { limits: OciLimits { files: set_limits(&cfg.limits), ..OciLimits::DEFAULT }, ..base });
        let permits = cfg.memory_budget_mib.max(1);
        Ok(AppState(Arc::new(Inner {
            repo: format!("{host}/{repo}"),
            key: cfg.token_key,
            limits: cfg.limits,
            spool_dir: cfg.spool_dir.unwrap_or_else(std::env::temp_dir),
            packages,
            sets,
            memory: Semaphore::new(permits as usize),
            memory_permits: permits,
            locks: (0..LOCK_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            cache: Mutex::new(HashMap::new()),
            validated: Mutex::new(HashMap::new()),
        })))
    }

    fn reference(&self, ns: &str, uid: &str, kind: ArtifactKind) -> String {
        format!("{}:{}", self.0.repo, tag(ns, uid, kind))
    }

    async fn hold(&self, bytes: u64) -> tokio::sync::SemaphorePermit<'_> {
        let n = (bytes.div_ceil(MIB) as u32).clamp(1, self.0.memory_permits);
        self.0.memory.acquire_many(n).await.expect("the semaphore is never closed")
    }

    fn lock(&self, ns: &str, uid: &str) -> &tokio::sync::Mutex<()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (ns, uid).hash(&mut h);
        &self.0.locks[(h.finish() as usize) % LOCK_STRIPES]
    }

    fn forget(&self, reference: &str) {
        self.0.cache.lock().unwrap().remove(reference);
    }

    /// Reads a job's set from the registry (checked to be that job's), and
    /// caches it under the reference.
    async fn read_set(&self, ns: &str, uid: &str, kind: ArtifactKind) -> Result<Arc<BlobSet>, ApiError> {
        let reference = self.reference(ns, uid, kind);
        let set = self.0.sets.blob_set(&reference).await.map_err(oci_error)?;
        let job = format!("{ns}/{uid}");
        if set.annotations.get(ANNOTATION_JOB) != Some(&job)
            || set.annotations.get(ANNOTATION_KIND).map(String::as_str) != Some(kind.as_str())
        {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "wrong_artifact",
                format!("{reference} is not the {} of job {job}", kind.as_str()),
            ));
        }
        let set = Arc::new(set);
        let mut cache = self.0.cache.lock().unwrap();
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(reference, set.clone());
        Ok(set)
    }

    /// The set a file read refers to: with a pin, the cached set when its
    /// digest matches, else a fresh read that must match (409 otherwise).
    async fn set_for(&self, ns: &str, uid: &str, kind: ArtifactKind, pin: Option<&str>) -> Result<Arc<BlobSet>, ApiError> {
        if let Some(pin) = pin {
            let reference = self.reference(ns, uid, kind);
            if let Some(s) = self.0.cache.lock().unwrap().get(&reference).filter(|s| s.digest == pin) {
                return Ok(s.clone());
            }
        }
        let set = self.read_set(ns, uid, kind).await?;
        if let Some(pin) = pin {
            if set.digest != pin {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "set_changed",
                    format!("the job's {} changed (now {}, asked for {pin}); read the manifest again", kind.as_str(), set.digest),
                ));
            }
        }
        Ok(set)
    }

    /// Pushes spooled entries one at a time, then the set manifest.
    async fn push_set(
        &self,
        ns: &str,
        uid: &str,
        kind: ArtifactKind,
        spool: Arc<std::fs::File>,
        entries: Vec<SpoolEntry>,
    ) -> Result<String, ApiError> {
        let reference = self.reference(ns, uid, kind);
        let mut pushed = HashSet::new();
        let mut files = Vec::with_capacity(entries.len());
        for e in entries {
            if pushed.insert(e.digest.clone()) {
                let _held = self.hold(e.size).await;
                let f = spool.clone();
                let (offset, size) = (e.offset, e.size);
                let data = blocking(move || {
                    let mut buf = vec![0u8; size as usize];
                    f.read_exact_at(&mut buf, offset).map_err(internal)?;
                    Ok(buf)
                })
                .await?;
                let digest = self.0.sets.push_set_blob(&reference, &data).await.map_err(oci_error)?;
                if digest != e.digest {
                    return Err(internal(format!("spooled {} changed: {digest} != {}", e.path, e.digest)));
                }
            }
            files.push(SetFile { path: e.path, size: e.size, digest: e.digest });
        }
        let annotations =
            BTreeMap::from([(ANNOTATION_JOB.to_string(), format!("{ns}/{uid}")), (ANNOTATION_KIND.to_string(), kind.as_str().to_string())]);
        let digest = self.0.sets.push_set_manifest(&reference, files, annotations).await.map_err(oci_error)?;
        self.forget(&reference);
        Ok(digest)
    }
}

/// Registry-side caps of a job file set: the work caps plus room for the
/// outputs' `result/` files and `manifest.json` (the endpoint checks the
/// real caps per category before pushing).
fn set_limits(l: &ArtifactLimits) -> package::Limits {
    let d = package::Limits::DEFAULT;
    package::Limits {
        max_file_bytes: l.max_file_bytes.max(l.max_manifest_bytes).max(l.max_stream_bytes).max(l.max_result_bytes),
        max_total_bytes: l.max_total_bytes + l.max_result_bytes + 2 * l.max_stream_bytes + l.max_manifest_bytes,
        max_files: l.max_files + 4,
        max_dirs: l.max_dirs + 2,
        max_path_bytes: d.max_path_bytes + WORK_PREFIX.len(),
        max_depth: d.max_depth + 1,
        ..d
    }
}

/// The axum app.
pub fn router(state: AppState) -> Router {
    let l = state.0.limits;
    let batch = DefaultBodyLimit::max((l.max_batch_body_bytes() + DRAIN_SLACK) as usize);
    let file = DefaultBodyLimit::max((l.max_file_bytes + DRAIN_SLACK) as usize);
    let pkg = DefaultBodyLimit::max((l.max_package_bytes + DRAIN_SLACK) as usize);
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/v1/jobs/{ns}/{uid}", delete(delete_job))
        .route("/v1/jobs/{ns}/{uid}/package", get(get_package))
        .route("/v1/jobs/{ns}/{uid}/package", put(put_package).layer(pkg))
        .route("/v1/jobs/{ns}/{uid}/inputs", get(get_inputs))
        .route("/v1/jobs/{ns}/{uid}/inputs", put(put_inputs).layer(batch))
        .route("/v1/jobs/{ns}/{uid}/inputs/{*path}", get(get_input_file))
        .route("/v1/jobs/{ns}/{uid}/inputs/{*path}", put(put_input_file).layer(file))
        .route("/v1/jobs/{ns}/{uid}/outputs", get(get_outputs))
        .route("/v1/jobs/{ns}/{uid}/outputs", put(put_outputs).layer(batch))
        .route("/v1/jobs/{ns}/{uid}/outputs/{*path}", get(get_output_file))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route".into()) })
        .layer(DefaultBodyLimit::max(64 * 1024))
        .with_state(state)
}

/// Serves `router` until `shutdown` completes (then drains in-flight requests).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

// -- errors -------------------------------------------------------------------

/// A JSON error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: String) -> Self {
        ApiError { status, code, message }
    }
    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message.into())
    }
    fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, code, message.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = self.code, message = %self.message, "artifact request failed");
        }
        let body = ErrorBody { error: ErrorDetail { code: self.code.into(), message: self.message } };
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

fn oci_error(e: OciError) -> ApiError {
    let msg = e.to_string();
    match e {
        OciError::NotFound { .. } => ApiError::new(StatusCode::NOT_FOUND, "not_found", msg),
        OciError::DigestMismatch { .. } | OciError::SizeMismatch { .. } => ApiError::new(StatusCode::BAD_GATEWAY, "digest_mismatch", msg),
        OciError::Unreachable { .. } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "registry_unavailable", msg),
        OciError::Auth { .. } => ApiError::new(StatusCode::BAD_GATEWAY, "registry_auth", msg),
        _ => ApiError::new(StatusCode::BAD_GATEWAY, "registry_error", msg),
    }
}

/// Cap errors from the package path rules are 413, the rest 400.
fn file_set_error(e: PackageError) -> ApiError {
    match e {
        PackageError::FileTooLarge { .. } => ApiError::too_large("file_too_large", e.to_string()),
        PackageError::TotalTooLarge { .. } => ApiError::too_large("total_too_large", e.to_string()),
        PackageError::TooManyFiles { .. } => ApiError::too_large("too_many_files", e.to_string()),
        PackageError::TooManyDirs { .. } => ApiError::too_large("too_many_dirs", e.to_string()),
        other => ApiError::bad("bad_path", other.to_string()),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(internal(e)),
    }
}

// -- authentication -----------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The route's own job.
    Job,
    Operator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Package and inputs, read.
    ReadStaged,
    /// Package and inputs, write.
    Stage,
    WriteOutputs,
    ReadOutputs,
    Delete,
}

/// Route names, then credential, then role.
fn admit(state: &AppState, headers: &HeaderMap, ns: &str, uid: &str, access: Access) -> Result<(), ApiError> {
    check_namespace(ns).map_err(|m| ApiError::bad("bad_job", m))?;
    check_uid(uid).map_err(|m| ApiError::bad("bad_job", m))?;
    let caller = authenticate(&state.0.key, headers, ns, uid)?;
    let ok = match (caller, access) {
        (Caller::Job, Access::ReadStaged | Access::WriteOutputs) => true,
        (Caller::Job, _) => false,
        (Caller::Operator, Access::WriteOutputs) => false,
        (Caller::Operator, _) => true,
    };
    if ok {
        Ok(())
    } else if caller == Caller::Job {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a job token may read its package and inputs and write its outputs, nothing else".into(),
        ))
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "only the job itself writes its outputs".into()))
    }
}

fn authenticate(key: &[u8], headers: &HeaderMap, ns: &str, uid: &str) -> Result<Caller, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m.into());
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("missing Authorization: Bearer credential"))?
        .to_str()
        .map_err(|_| unauthorized("malformed Authorization header"))?;
    let (scheme, cred) = value.split_once(' ').ok_or_else(|| unauthorized("malformed Authorization header"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthorized("use Authorization: Bearer"));
    }
    let cred = cred.trim();
    if let Some(rest) = cred.strip_prefix("job:") {
        let mut parts = rest.splitn(3, ':');
        let (Some(tns), Some(tuid), Some(token)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(unauthorized("malformed job credential; expected job:<namespace>:<uid>:<token>"));
        };
        if check_namespace(tns).is_err() || check_uid(tuid).is_err() || !verify_job_token(key, tns, tuid, token) {
            return Err(unauthorized("invalid job token"));
        }
        if tns != ns || tuid != uid {
            return Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "this token belongs to another job".into()));
        }
        Ok(Caller::Job)
    } else if let Some(token) = cred.strip_prefix("operator:") {
        if verify_job_token(key, "", OPERATOR_SUBJECT, token) {
            Ok(Caller::Operator)
        } else {
            Err(unauthorized("invalid operator token"))
        }
    } else if verify_job_token(key, ns, uid, cred) {
        Ok(Caller::Job)
    } else if verify_job_token(key, "", OPERATOR_SUBJECT, cred) {
        Ok(Caller::Operator)
    } else {
        Err(unauthorized("invalid token"))
    }
}

fn rel_path(raw: &str) -> Result<RelPath, ApiError> {
    RelPath::parse(raw).map_err(|e| ApiError::bad("bad_path", format!("path {raw:?}: {e}")))
}

// -- bodies -------------------------------------------------------------------

struct Spooled {
    file: Arc<std::fs::File>,
    len: u64,
    digest: String,
}

/// One regular file inside a spooled tar.
#[derive(Debug, Clone)]
struct SpoolEntry {
    path: String,
    offset: u64,
    size: u64,
    digest: String,
}

/// Streams a request body into an unnamed temp file (see module docs).
async fn spool(state: &AppState, req: Request, limit: u64, what: &str) -> Result<Spooled, ApiError> {
    let over = || ApiError::too_large("body_too_large", format!("{what} is larger than {limit} bytes"));
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit + DRAIN_SLACK) {
        return Err(over());
    }
    let file = tempfile::tempfile_in(&state.0.spool_dir).map_err(|e| internal(format!("spool file: {e}")))?;
    let mut out = tokio::fs::File::from_std(file.try_clone().map_err(internal)?);
    let mut stream = req.with_limited_body().into_body().into_data_stream();
    let mut n = 0u64;
    let mut h = Sha256::new();
    let mut overflow = false;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) if overflow || is_length_limit(&e) => return Err(over()),
            Err(_) => return Err(ApiError::bad("bad_body", format!("reading the {what} failed"))),
        };
        n += chunk.len() as u64;
        if n > limit {
            // Read on (discarding) so the client gets to see the answer.
            overflow = true;
            if n > limit + DRAIN_SLACK {
                return Err(over());
            }
            continue;
        }
        h.update(&chunk);
        out.write_all(&chunk).await.map_err(|e| internal(format!("spool write: {e}")))?;
    }
    if overflow {
        return Err(over());
    }
    out.flush().await.map_err(internal)?;
    Ok(Spooled { file: Arc::new(file), len: n, digest: format!("sha256:{}", hex::encode(h.finalize())) })
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Lists the regular files of a spooled tar with offsets and digests.
/// Directory entries are ignored; links and special entries are refused.
fn scan_tar(file: &std::fs::File, max_entries: usize) -> Result<Vec<SpoolEntry>, ApiError> {
    struct HashWriter(Sha256);
    impl std::io::Write for HashWriter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let not_tar = |e: std::io::Error| ApiError::bad("bad_tar", format!("the body is not a readable tar: {e}"));
    let mut f = file.try_clone().map_err(internal)?;
    f.rewind().map_err(internal)?;
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(256 * 1024, f));
    let mut out: Vec<SpoolEntry> = Vec::new();
    let mut seen = HashSet::new();
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        match entry.header().entry_type() {
            tar::EntryType::Regular => {}
            tar::EntryType::Directory => continue,
            other => {
                return Err(ApiError::bad(
                    "bad_tar",
                    format!("tar entry {} is a {other:?}; only regular files are accepted", String::from_utf8_lossy(&entry.path_bytes())),
                ))
            }
        }
        if out.len() >= max_entries {
            return Err(ApiError::too_large("too_many_files", format!("more than {max_entries} entries")));
        }
        let path =
            String::from_utf8(entry.path_bytes().into_owned()).map_err(|_| ApiError::bad("bad_path", "a tar entry name is not UTF-8"))?;
        if !seen.insert(path.clone()) {
            return Err(ApiError::bad("bad_tar", format!("tar entry {path} appears twice")));
        }
        let offset = entry.raw_file_position();
        let size = entry.size();
        let mut h = HashWriter(Sha256::new());
        let copied = std::io::copy(&mut entry, &mut h).map_err(not_tar)?;
        if copied != size {
            return Err(ApiError::bad("bad_tar", format!("tar entry {path} is cut short")));
        }
        out.push(SpoolEntry { path, offset, size, digest: format!("sha256:{}", hex::encode(h.0.finalize())) });
    }
    Ok(out)
}

fn read_entry(file: &std::fs::File, e: &SpoolEntry) -> Result<Vec<u8>, ApiError> {
    let mut buf = vec![0u8; e.size as usize];
    file.read_exact_at(&mut buf, e.offset).map_err(internal)?;
    Ok(buf)
}

/// Checks input paths and the per-job caps; 413 for caps, 400 for names.
fn check_work_set<'a>(files: impl Iterator<Item = (&'a str, u64)> + Clone, l: &ArtifactLimits) -> Result<(), ApiError> {
    let mut count = 0usize;
    let mut total = 0u64;
    for (path, size) in files.clone() {
        rel_path(path)?;
        count += 1;
        if count > l.max_files {
            return Err(ApiError::too_large("too_many_files", format!("more than {} files", l.max_files)));
        }
        if size > l.max_file_bytes {
            return Err(ApiError::too_large("file_too_large", format!("{path} is {size} bytes, over the {}-byte cap", l.max_file_bytes)));
        }
        total += size;
        if total > l.max_total_bytes {
            return Err(ApiError::too_large("total_too_large", format!("files add up to more than {} bytes", l.max_total_bytes)));
        }
    }
    package::check_file_set(files, &l.file_set()).map_err(file_set_error)
}

fn bytes_response(data: Vec<u8>, content_type: &'static str, digest: &str, set_digest: Option<&str>) -> Response {
    let mut resp = Response::new(Body::from(data));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(digest) {
        h.insert(HEADER_CONTENT_DIGEST, v);
    }
    if let Some(v) = set_digest.and_then(|s| HeaderValue::from_str(s).ok()) {
        h.insert(HEADER_SET_DIGEST, v);
    }
    resp
}

// -- handlers -----------------------------------------------------------------

async fn readyz(State(state): State<AppState>) -> Response {
    let probe = format!("{}:readyz-probe", state.0.repo);
    match state.0.sets.blob_set(&probe).await {
        Ok(_) | Err(OciError::NotFound { .. }) => "ok".into_response(),
        Err(e) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "registry_unavailable", e.to_string()).into_response(),
    }
}

async fn get_package(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadStaged)?;
    let _held = state.hold(state.0.limits.max_package_bytes).await;
    let reference = state.reference(&ns, &uid, ArtifactKind::Package);
    let pulled = state.0.packages.pull(&reference).await.map_err(oci_error)?;
    if pulled.annotations.get(ANNOTATION_JOB) != Some(&format!("{ns}/{uid}")) {
        return Err(ApiError::new(StatusCode::BAD_GATEWAY, "wrong_artifact", format!("{reference} is not this job's package")));
    }
    let digest = package::digest(&pulled.package);
    Ok(bytes_response(pulled.package, "application/gzip", &digest, Some(&pulled.digest)))
}

async fn put_package(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    admit(&state, req.headers(), &ns, &uid, Access::Stage)?;
    let limit = state.0.limits.max_package_bytes;
    let sp = spool(&state, req, limit, "package").await?;
    let _held = state.hold(sp.len).await;
    let _lock = state.lock(&ns, &uid).lock().await;
    let file = sp.file.clone();
    let len = sp.len;
    let known = state.0.validated.lock().expect("lock poisoned").get(&sp.digest).cloned();
    let checked = known.is_some();
    let (bytes, config) = blocking(move || {
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0).map_err(internal)?;
        let config = match known {
            Some(config) => config,
            None => SkillConfig::for_package(&bytes, STAGED_PACKAGE_NAME.to_string(), "", None)
                .map_err(|e| ApiError::bad("bad_package", format!("not a valid package: {e}")))?,
        };
        Ok((bytes, config))
    })
    .await?;
    {
        let mut memo = state.0.validated.lock().expect("lock poisoned");
        if memo.len() >= VALIDATED_ENTRIES {
            memo.clear();
        }
        memo.insert(sp.digest.clone(), config.clone());
    }
    let reference = state.reference(&ns, &uid, ArtifactKind::Package);
    let job = BTreeMap::from([(ANNOTATION_JOB.to_string(), format!("{ns}/{uid}"))]);
    let pushed = if checked {
        state.0.packages.push_checked(&reference, &bytes, &config, job).await
    } else {
        state.0.packages.push_annotated(&reference, &bytes, &config, job).await
    };
    let digest = pushed.map_err(oci_error)?;
    Ok(Json(json!({
        "digest": digest,
        "packageDigest": sp.digest,
        "files": config.file_count,
        "totalBytes": config.total_bytes,
    }))
    .into_response())
}

async fn get_inputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<InputsManifest>, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadStaged)?;
    match state.read_set(&ns, &uid, ArtifactKind::Inputs).await {
        Ok(set) => Ok(Json(InputsManifest { digest: Some(set.digest.clone()), files: set.files.clone() })),
        Err(e) if e.status == StatusCode::NOT_FOUND => Ok(Json(InputsManifest { digest: None, files: Vec::new() })),
        Err(e) => Err(e),
    }
}

#[derive(Debug, Deserialize)]
struct SetQuery {
    set: Option<String>,
}

/// `Path` with the JSON error shape (a path that does not decode is 400 `bad_path`).
struct JobPath<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for JobPath<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(JobPath(v)),
            Err(e) => Err(ApiError::bad("bad_path", e.body_text())),
        }
    }
}

/// `?set=<digest>` with the JSON error shape.
struct SetPin(SetQuery);

impl<S: Send + Sync> FromRequestParts<S> for SetPin {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<SetQuery>::from_request_parts(parts, state).await {
            Ok(Query(q)) => Ok(SetPin(q)),
            Err(e) => Err(ApiError::bad("bad_query", e.body_text())),
        }
    }
}

async fn get_file(
    state: &AppState,
    ns: &str,
    uid: &str,
    kind: ArtifactKind,
    rel: &RelPath,
    pin: Option<&str>,
) -> Result<Response, ApiError> {
    let set = state.set_for(ns, uid, kind, pin).await?;
    let file = set
        .files
        .iter()
        .find(|f| f.path == rel.as_str())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no {} file {rel}", kind.as_str())))?
        .clone();
    let _held = state.hold(file.size).await;
    let reference = state.reference(ns, uid, kind);
    let data = state.0.sets.pull_set_file(&reference, &file).await.map_err(oci_error)?;
    let ct = if rel.as_str() == MANIFEST_PATH { "application/json" } else { "application/octet-stream" };
    Ok(bytes_response(data, ct, &file.digest, Some(&set.digest)))
}

async fn get_input_file(
    State(state): State<AppState>,
    JobPath((ns, uid, path)): JobPath<(String, String, String)>,
    SetPin(q): SetPin,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadStaged)?;
    let rel = rel_path(&path)?;
    get_file(&state, &ns, &uid, ArtifactKind::Inputs, &rel, q.set.as_deref()).await
}

async fn put_input_file(
    State(state): State<AppState>,
    JobPath((ns, uid, path)): JobPath<(String, String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    admit(&state, req.headers(), &ns, &uid, Access::Stage)?;
    let rel = rel_path(&path)?;
    let l = state.0.limits;
    let sp = spool(&state, req, l.max_file_bytes, "input file").await?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let mut files: Vec<SetFile> = match state.read_set(&ns, &uid, ArtifactKind::Inputs).await {
        Ok(set) => set.files.iter().filter(|f| f.path != rel.as_str()).cloned().collect(),
        Err(e) if e.status == StatusCode::NOT_FOUND => Vec::new(),
        Err(e) => return Err(e),
    };
    let new = SetFile { path: rel.as_str().into(), size: sp.len, digest: sp.digest.clone() };
    files.push(new.clone());
    check_work_set(files.iter().map(|f| (f.path.as_str(), f.size)), &l)?;
    let reference = state.reference(&ns, &uid, ArtifactKind::Inputs);
    {
        let _held = state.hold(sp.len).await;
        let file = sp.file.clone();
        let entry = SpoolEntry { path: new.path.clone(), offset: 0, size: sp.len, digest: sp.digest.clone() };
        let data = blocking(move || read_entry(&file, &entry)).await?;
        state.0.sets.push_set_blob(&reference, &data).await.map_err(oci_error)?;
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    let count = files.len();
    let annotations = BTreeMap::from([
        (ANNOTATION_JOB.to_string(), format!("{ns}/{uid}")),
        (ANNOTATION_KIND.to_string(), ArtifactKind::Inputs.as_str().to_string()),
    ]);
    let set_digest = state.0.sets.push_set_manifest(&reference, files, annotations).await.map_err(oci_error)?;
    state.forget(&reference);
    Ok(Json(json!({ "file": new, "setDigest": set_digest, "setFiles": count, "setBytes": total })).into_response())
}

async fn put_inputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    req: Request,
) -> Result<Json<InputsManifest>, ApiError> {
    admit(&state, req.headers(), &ns, &uid, Access::Stage)?;
    let l = state.0.limits;
    let sp = spool(&state, req, l.max_batch_body_bytes(), "inputs batch").await?;
    let file = sp.file.clone();
    let entries = blocking(move || {
        let entries = scan_tar(&file, l.max_files)?;
        check_work_set(entries.iter().map(|e| (e.path.as_str(), e.size)), &l)?;
        Ok(entries)
    })
    .await?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let mut files: Vec<SetFile> =
        entries.iter().map(|e| SetFile { path: e.path.clone(), size: e.size, digest: e.digest.clone() }).collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let digest = state.push_set(&ns, &uid, ArtifactKind::Inputs, sp.file, entries).await?;
    Ok(Json(InputsManifest { digest: Some(digest), files }))
}

async fn put_outputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    admit(&state, req.headers(), &ns, &uid, Access::WriteOutputs)?;
    let l = state.0.limits;
    let sp = spool(&state, req, l.max_batch_body_bytes(), "outputs batch").await?;
    let file = sp.file.clone();
    let (job_ns, job_uid) = (ns.clone(), uid.clone());
    let (entries, manifest, manifest_digest) = blocking(move || check_outputs(&file, &l, &job_ns, &job_uid)).await?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let count = manifest.files.len();
    let bytes: u64 = manifest.files.iter().map(|f| f.size).sum();
    let set_digest = state.push_set(&ns, &uid, ArtifactKind::Outputs, sp.file, entries).await?;
    Ok(Json(json!({
        "manifestDigest": manifest_digest,
        "setDigest": set_digest,
        "files": count,
        "bytes": bytes,
        "skipped": manifest.skipped_total(),
        "complete": manifest.complete,
    }))
    .into_response())
}

/// The outputs batch rules: `manifest.json` present and about this job,
/// entries and manifest agreeing exactly, only `result/{result.json,
/// stdout,stderr}` and `work/...`, caps per category.
fn check_outputs(
    file: &std::fs::File,
    l: &ArtifactLimits,
    ns: &str,
    uid: &str,
) -> Result<(Vec<SpoolEntry>, OutputManifest, String), ApiError> {
    let entries = scan_tar(file, l.max_files + 4)?;
    let m_entry = entries
        .iter()
        .find(|e| e.path == MANIFEST_PATH)
        .ok_or_else(|| ApiError::bad("bad_manifest", format!("the batch has no {MANIFEST_PATH}")))?;
    if m_entry.size > l.max_manifest_bytes {
        return Err(ApiError::too_large("manifest_too_large", format!("{MANIFEST_PATH} is over {} bytes", l.max_manifest_bytes)));
    }
    let manifest_bytes = read_entry(file, m_entry)?;
    let manifest: OutputManifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| ApiError::bad("bad_manifest", format!("{MANIFEST_PATH}: {e}")))?;
    if manifest.schema_version != 1 {
        return Err(ApiError::bad("bad_manifest", format!("schemaVersion {} (this endpoint reads 1)", manifest.schema_version)));
    }
    if manifest.namespace != ns || manifest.uid != uid {
        return Err(ApiError::bad("bad_manifest", "the manifest names another job"));
    }
    if manifest.skipped.len() > l.max_skipped_listed {
        return Err(ApiError::bad("bad_manifest", format!("more than {} skipped files listed", l.max_skipped_listed)));
    }
    let listed: HashMap<&str, &SetFile> = manifest.files.iter().map(|f| (f.path.as_str(), f)).collect();
    if listed.len() != manifest.files.len() || listed.contains_key(MANIFEST_PATH) {
        return Err(ApiError::bad("bad_manifest", "the manifest lists a path twice"));
    }
    if entries.len() != manifest.files.len() + 1 {
        return Err(ApiError::bad(
            "manifest_mismatch",
            format!("the batch has {} files, the manifest lists {}", entries.len() - 1, manifest.files.len()),
        ));
    }
    let mut work = Vec::new();
    for e in entries.iter().filter(|e| e.path != MANIFEST_PATH) {
        let f =
            listed.get(e.path.as_str()).ok_or_else(|| ApiError::bad("manifest_mismatch", format!("{} is not in the manifest", e.path)))?;
        if f.size != e.size || f.digest != e.digest {
            return Err(ApiError::bad(
                "manifest_mismatch",
                format!("{}: manifest says {} bytes {}, the batch has {} bytes {}", e.path, f.size, f.digest, e.size, e.digest),
            ));
        }
        if let Some(name) = e.path.strip_prefix(RESULT_PREFIX) {
            let cap = match name {
                "result.json" => l.max_result_bytes,
                "stdout" | "stderr" => l.max_stream_bytes,
                _ => return Err(ApiError::bad("bad_path", format!("{}: result/ holds result.json, stdout and stderr only", e.path))),
            };
            if e.size > cap {
                return Err(ApiError::too_large("file_too_large", format!("{} is over {cap} bytes", e.path)));
            }
        } else if let Some(rel) = e.path.strip_prefix(WORK_PREFIX) {
            work.push((rel, e.size));
        } else {
            return Err(ApiError::bad("bad_path", format!("{}: entries are result/..., work/... and {MANIFEST_PATH}", e.path)));
        }
    }
    check_work_set(work.iter().copied(), l)?;
    let digest = super::sha256_digest(&manifest_bytes);
    Ok((entries, manifest, digest))
}

async fn get_outputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadOutputs)?;
    let rel = RelPath::parse(MANIFEST_PATH).expect("static path");
    get_file(&state, &ns, &uid, ArtifactKind::Outputs, &rel, None).await
}

async fn get_output_file(
    State(state): State<AppState>,
    JobPath((ns, uid, path)): JobPath<(String, String, String)>,
    SetPin(q): SetPin,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadOutputs)?;
    let rel = rel_path(&path)?;
    get_file(&state, &ns, &uid, ArtifactKind::Outputs, &rel, q.set.as_deref()).await
}

async fn delete_job(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::Delete)?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let mut deleted = Vec::new();
    for kind in ArtifactKind::ALL {
        let reference = state.reference(&ns, &uid, kind);
        state.forget(&reference);
        if state.0.sets.delete(&reference).await.map_err(oci_error)? {
            deleted.push(kind.as_str());
        }
    }
    Ok(Json(json!({ "deleted": deleted })).into_response())
}
