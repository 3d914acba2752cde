//! `skill-operator artifacts`: the artifact endpoint (axum) and its storage
//! in an OCI registry. See the parent module for the credential scheme, the
//! tags and the transfer format.
//!
//! Routes (all JSON errors are `{"error":{"code","message"}}`):
//!
//! ```text
//! GET    /healthz                                  200 "ok"
//! GET    /readyz                                   200 when the registry answers (503 `starting` while the
//!                                                  sample SkillPackages are applied)
//! GET    /metrics                                  the listener's counters (src/listener)
//! GET    /v1/jobs/{ns}/{uid}/package               job|operator  package bytes (.tar.gz)
//!                                                  ?digest=<d>: the namespace package of {ns} pinned at d
//! PUT    /v1/jobs/{ns}/{uid}/package               operator      body: package bytes
//! GET    /v1/jobs/{ns}/{uid}/inputs                job|operator  InputsManifest JSON
//! PUT    /v1/jobs/{ns}/{uid}/inputs                operator      body: tar of input files (replaces the set)
//! GET    /v1/jobs/{ns}/{uid}/inputs/{*path}        job|operator  file bytes  [?set=<set digest>]
//! PUT    /v1/jobs/{ns}/{uid}/inputs/{*path}        operator      body: file bytes (adds or replaces one)
//! PUT    /v1/jobs/{ns}/{uid}/outputs               job           body: outputs tar (manifest.json last)
//! GET    /v1/jobs/{ns}/{uid}/outputs               operator      the stored manifest.json bytes
//! GET    /v1/jobs/{ns}/{uid}/outputs/{*path}       operator      file bytes (result/..., work/..., manifest.json)
//! DELETE /v1/jobs/{ns}/{uid}                       operator      removes the job's tags (and a warm pod's claim and key)
//! PUT    /v1/jobs/{ns}/{warm_uid}/claim            operator      body: Claim JSON; write-once (409 `already_claimed`)
//! GET    /v1/jobs/{ns}/{warm_uid}/claim[?wait=s]   job           the Claim; 204 when none came within s (<= 60)
//! PUT    /v1/jobs/{ns}/{warm_uid}/claim-key        job           body: the pod's ClaimKey; write-once (409 `key_published`)
//! GET    /v1/jobs/{ns}/{warm_uid}/claim-key        operator      the ClaimKey a run's variables are sealed to; 404 when none
//! GET    /v1/outputs/stored                        operator      NDJSON stream: each job's outputs as they are stored
//! PUT    /v1/namespaces/{ns}/packages/{digest}     operator      body: package bytes, staged once for every run of
//!                                                  {ns} pinning digest (idempotent)
//! DELETE /v1/namespaces/{ns}/packages/{digest}     operator      {"deleted": true|false}
//! GET    /v1/namespaces/packages                   operator      [{"namespace","digest"}] of every namespace package
//! ```
//!
//! Namespace packages (src/artifacts/server/namespace_packages.rs): staged
//! once per namespace and pinned SkillPackage digest, read by every run of
//! the namespace with `?digest=`. Their routes check the namespace (400
//! `bad_job`) and the digest (400 `bad_digest`) as names, then the operator
//! credential (any job credential is 403).
//!
//! Warm pods' claims (src/artifacts/server/claims.rs): a warm pod waits
//! for its run with its own warm uid's credential; once claimed, it reads
//! the run's inputs and writes its outputs on the run's routes with the
//! header `skill-operator-claim: <warm_uid>` (the inputs GETs and the
//! outputs PUT only), admitted while the claim stored for that warm uid
//! names the route's job.
//!
//! Order of checks on every job route: namespace and UID as names (400
//! `bad_job`), then the credential (401 `unauthorized`, 403 `forbidden`;
//! 503 `unavailable` when a pod token's TokenReview cannot be made),
//! then `{*path}` with `RelPath::parse` (400 `bad_path`) or `?digest=`
//! (400 `bad_digest`); the registry is touched only after all three.
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

mod auth;
mod claim_keys;
mod claims;
mod events;
mod extract;
mod handlers;
mod namespace_packages;
pub mod pod_tokens;
mod spool;

use auth::*;
use handlers::*;
use spool::*;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Json, Router};
use tokio::sync::Semaphore;

use super::{tag, ArtifactKind, ArtifactLimits, ErrorBody, ErrorCode, ErrorDetail, SetFile, ANNOTATION_JOB, ANNOTATION_KIND, WORK_PREFIX};
use crate::core::package::{self, PackageError};
use crate::oci::{self, BlobSet, OciError, OciLimits, Registry, RegistryOptions, SkillConfig};

/// Bytes read past a body's limit before answering 413 (see module docs).
pub const DRAIN_SLACK: u64 = 64 * 1024 * 1024;
/// Striped per-job write locks.
pub(super) const LOCK_STRIPES: usize = 64;
/// Cached set manifests before the cache is cleared.
pub(super) const CACHE_ENTRIES: usize = 1024;
pub(super) const MIB: u64 = 1024 * 1024;

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
    /// The listener's timeouts and connection caps.
    pub bounds: crate::listener::Bounds,
    /// Its counters, served at `/metrics`.
    pub listener_metrics: crate::listener::ListenerMetrics,
    /// The built-in store's directory (`--store`): the endpoint serves
    /// `/v2/...` from it and is its own registry (see [`ServerConfig::use_store`]).
    pub store: Option<PathBuf>,
    /// With the store: push the embedded sample skills into it at start.
    pub seed_samples: bool,
    /// Accept run pods' projected ServiceAccount tokens, verified by
    /// TokenReview (`--pod-tokens`); `None`: HMAC job tokens only.
    pub pod_tokens: Option<pod_tokens::PodTokens>,
    /// How often a waiting `GET .../claim` reads the store again for a
    /// claim another replica stored ([`super::CLAIM_RECHECK`]; a test
    /// lengthens it to show that a claim stored here wakes the wait).
    pub claim_recheck: std::time::Duration,
    /// Who may read `/metrics` (open by default: tests; the command takes `--metrics-auth`).
    pub metrics_access: crate::metrics_access::MetricsAccess,
}

impl ServerConfig {
    /// The endpoint on its built-in store at `dir`; call [`ServerConfig::use_store`]
    /// with the bound address before [`AppState::new`].
    pub fn with_store(dir: impl Into<PathBuf>, token_key: Vec<u8>) -> Self {
        ServerConfig { store: Some(dir.into()), seed_samples: true, ..ServerConfig::new(String::new(), token_key) }
    }

    /// Points the endpoint at its own `/v2` on `listen` (an unspecified
    /// address is reached on loopback), with the operator credential.
    pub fn use_store(&mut self, listen: std::net::SocketAddr) {
        let ip = match listen.ip() {
            std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        self.registry = format!("{}/{STORE_JOBS_REPO}", std::net::SocketAddr::new(ip, listen.port()));
        self.plain_http = true;
        self.registry_auth = oci::Auth::Bearer(format!("operator:{}", super::operator_token(&self.token_key)));
    }
    pub fn new(registry: impl Into<String>, token_key: Vec<u8>) -> Self {
        ServerConfig {
            registry: registry.into(),
            plain_http: false,
            registry_auth: oci::Auth::Anonymous,
            token_key,
            limits: ArtifactLimits::DEFAULT,
            spool_dir: None,
            memory_budget_mib: 1024,
            bounds: crate::listener::Bounds::default(),
            listener_metrics: crate::listener::ListenerMetrics::default(),
            store: None,
            seed_samples: false,
            pod_tokens: None,
            claim_recheck: super::CLAIM_RECHECK,
            metrics_access: crate::metrics_access::MetricsAccess::open(),
        }
    }
}

/// The repository job artifacts live in, in the built-in store.
pub const STORE_JOBS_REPO: &str = "jobs";
/// The repository prefix the embedded samples are seeded under (`samples/<name>:latest`).
pub const STORE_SAMPLES_REPO: &str = "samples";

/// Shared state of the router.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// Why the endpoint's configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--registry {value:?}: {why}")]
    Registry { value: String, why: &'static str },
    #[error("the token key is {len} bytes; it must be at least 32 (the Helm chart generates one)")]
    ShortKey { len: usize },
    #[error("--store {dir}: {source}")]
    Store { dir: String, source: crate::artifacts::store::StoreError },
    #[error("--store needs the endpoint's own address first (ServerConfig::use_store)")]
    StoreUnbound,
    #[error(transparent)]
    Client(#[from] OciError),
}

pub(super) struct Inner {
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
    bounds: crate::listener::Bounds,
    listener_metrics: crate::listener::ListenerMetrics,
    /// Warm pods' claims known here, and the requests waiting for one.
    claims: claims::Claims,
    /// Warm pods' public keys known here.
    claim_keys: claim_keys::ClaimKeys,
    /// See [`ServerConfig::claim_recheck`].
    claim_recheck: std::time::Duration,
    /// See [`ServerConfig::metrics_access`].
    metrics_access: crate::metrics_access::MetricsAccess,
    /// Jobs whose outputs were just stored, for [`events`] followers.
    stored: tokio::sync::broadcast::Sender<crate::artifacts::OutputsStored>,
    /// Cancelled at shutdown: ends the streams that would never finish.
    stop: tokio_util::sync::CancellationToken,
    /// The built-in store, when the endpoint is its own registry.
    store: Option<crate::artifacts::store::Store>,
    seed_samples: bool,
    /// See [`ServerConfig::pod_tokens`].
    pod_tokens: Option<pod_tokens::PodTokens>,
    /// Set while the sample SkillPackages are being applied: `/readyz`
    /// answers 503 until they exist, so `helm install --wait` returns with
    /// them in place (a binding applied next finds its package).
    samples_pending: std::sync::atomic::AtomicBool,
}

/// Validated package configs kept before the memo is cleared.
pub(super) const VALIDATED_ENTRIES: usize = 256;
/// The config name of every staged package: the job is named in a manifest
/// annotation instead, so the blobs of one package are shared by all its jobs.
pub(super) const STAGED_PACKAGE_NAME: &str = "staged-package";

impl AppState {
    pub fn new(cfg: ServerConfig) -> Result<AppState, ConfigError> {
        if cfg.store.is_some() && cfg.registry.is_empty() {
            return Err(ConfigError::StoreUnbound);
        }
        let store = match &cfg.store {
            Some(dir) => Some(
                crate::artifacts::store::Store::open(dir)
                    .map_err(|source| ConfigError::Store { dir: dir.display().to_string(), source })?,
            ),
            None => None,
        };
        let (host, repo) = cfg
            .registry
            .split_once('/')
            .filter(|(h, r)| !h.is_empty() && !r.is_empty())
            .ok_or_else(|| ConfigError::Registry { value: cfg.registry.clone(), why: "expected HOST[:PORT]/REPOSITORY" })?;
        if repo.contains(':') || repo.contains('@') {
            return Err(ConfigError::Registry { value: cfg.registry.clone(), why: "give a repository without tag or digest" });
        }
        if cfg.token_key.len() < 32 {
            return Err(ConfigError::ShortKey { len: cfg.token_key.len() });
        }
        let base = RegistryOptions {
            auth: cfg.registry_auth.clone(),
            plain_http: if cfg.plain_http { vec![host.to_string()] } else { Vec::new() },
            ..Default::default()
        };
        let packages = Registry::new(RegistryOptions {
            limits: OciLimits { max_package_bytes: cfg.limits.max_package_bytes, ..OciLimits::DEFAULT },
            ..base.clone()
        })?;
        let sets = Registry::new(RegistryOptions { limits: OciLimits { files: set_limits(&cfg.limits), ..OciLimits::DEFAULT }, ..base })?;
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
            bounds: cfg.bounds,
            listener_metrics: cfg.listener_metrics,
            claims: claims::Claims::default(),
            claim_keys: claim_keys::ClaimKeys::default(),
            claim_recheck: cfg.claim_recheck,
            metrics_access: cfg.metrics_access,
            stored: tokio::sync::broadcast::channel(events::BACKLOG).0,
            stop: tokio_util::sync::CancellationToken::new(),
            store,
            seed_samples: cfg.seed_samples,
            pod_tokens: cfg.pod_tokens,
            samples_pending: std::sync::atomic::AtomicBool::new(false),
        })))
    }

    /// Holds `/readyz` at 503 until [`Self::samples_applied`].
    pub fn samples_pending(&self) {
        self.0.samples_pending.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The sample SkillPackages were applied, or applying them was given up
    /// (logged): the endpoint serves jobs either way.
    pub fn samples_applied(&self) {
        self.0.samples_pending.store(false, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn is_starting(&self) -> bool {
        self.0.samples_pending.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Warm uids with a request waiting for their claim on this replica.
    pub fn claim_waiters(&self) -> usize {
        self.0.claims.waiting()
    }

    /// The built-in store, if the endpoint runs on one.
    pub fn store(&self) -> Option<&crate::artifacts::store::Store> {
        self.0.store.as_ref()
    }

    /// Pushes the embedded sample skills to `samples/<name>:latest` in the
    /// endpoint's registry, the artifacts `package push` makes of them (same
    /// digests), and returns `(reference, digest)` per sample. Pushing what
    /// is there already uploads nothing and changes nothing.
    pub async fn seed_samples(&self) -> anyhow::Result<Vec<(String, String)>> {
        let host = self.0.repo.split('/').next().unwrap_or_default().to_string();
        let mut seeded = Vec::new();
        for sample in crate::samples::packages()? {
            let reference = format!("{host}/{STORE_SAMPLES_REPO}/{}:latest", sample.name);
            let digest = self.0.packages.push(&reference, &sample.archive, &sample.config).await?;
            seeded.push((reference, digest));
        }
        Ok(seeded)
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
            return Err(ApiError::new(ErrorCode::WrongArtifact, format!("{reference} is not the {} of job {job}", kind.as_str())));
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
                    ErrorCode::SetChanged,
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
pub(super) fn set_limits(l: &ArtifactLimits) -> package::Limits {
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
    let claim = DefaultBodyLimit::max(super::MAX_CLAIM_BYTES as usize);
    let listener_metrics = state.0.listener_metrics.clone();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        // Every run pod reaches this port (it fetches and uploads here): the
        // metrics are for the scrapers the API server vouches for only.
        .route(
            "/metrics",
            get(move || std::future::ready(listener_metrics.render()))
                .route_layer(axum::middleware::from_fn_with_state(state.0.metrics_access.clone(), crate::metrics_access::guard)),
        )
        .route("/v1/jobs/{ns}/{uid}", delete(delete_job))
        .route("/v1/jobs/{ns}/{uid}/package", get(namespace_packages::get_package))
        .route("/v1/jobs/{ns}/{uid}/package", put(put_package).layer(pkg))
        .route("/v1/jobs/{ns}/{uid}/inputs", get(get_inputs))
        .route("/v1/jobs/{ns}/{uid}/inputs", put(put_inputs).layer(batch))
        .route("/v1/jobs/{ns}/{uid}/inputs/{*path}", get(get_input_file))
        .route("/v1/jobs/{ns}/{uid}/inputs/{*path}", put(put_input_file).layer(file))
        .route("/v1/jobs/{ns}/{uid}/outputs", get(get_outputs))
        .route("/v1/jobs/{ns}/{uid}/outputs", put(put_outputs).layer(batch))
        .route("/v1/jobs/{ns}/{uid}/outputs/{*path}", get(get_output_file))
        .route("/v1/jobs/{ns}/{uid}/claim", get(claims::get_claim))
        .route("/v1/jobs/{ns}/{uid}/claim", put(claims::put_claim).layer(claim))
        .route("/v1/jobs/{ns}/{uid}/claim-key", get(claim_keys::get_claim_key))
        .route("/v1/jobs/{ns}/{uid}/claim-key", put(claim_keys::put_claim_key))
        .route("/v1/outputs/stored", get(events::stored_outputs))
        .route("/v1/namespaces/packages", get(namespace_packages::list_namespace_packages))
        .route("/v1/namespaces/{ns}/packages/{digest}", put(namespace_packages::put_namespace_package).layer(pkg))
        .route("/v1/namespaces/{ns}/packages/{digest}", delete(namespace_packages::delete_namespace_package))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .layer(DefaultBodyLimit::max(64 * 1024))
        .with_state(state.clone());
    match &state.0.store {
        // The registry API for the operator credential (src/artifacts/store/v2.rs).
        Some(store) => app.merge(crate::artifacts::store::v2::router(crate::artifacts::store::v2::V2State {
            store: store.clone(),
            key: Arc::new(state.0.key.clone()),
        })),
        None => app,
    }
}

/// Serves `router` under the configured listener bounds until `shutdown`
/// completes (then drains in-flight requests).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (bounds, metrics) = (state.0.bounds, state.0.listener_metrics.clone());
    // Graceful shutdown waits for every response to end: the event streams must.
    let stop = state.0.stop.clone();
    if let Some(store) = state.0.store.clone() {
        tokio::spawn(crate::artifacts::store::v2::collect_garbage_every(store, crate::core::limits::STORE_GC_INTERVAL, stop.clone()));
    }
    if state.0.store.is_some() && state.0.seed_samples {
        // The listener is bound already: the pushes queue until it accepts.
        let seeder = state.clone();
        tokio::spawn(async move {
            match seeder.seed_samples().await {
                Ok(seeded) => {
                    for (reference, digest) in seeded {
                        tracing::info!(%reference, %digest, "sample skill in the store");
                    }
                }
                Err(e) => tracing::error!(error = %e, "seeding the sample skills failed; SkillPackages naming them will not resolve"),
            }
        });
    }
    let shutdown = async move {
        shutdown.await;
        stop.cancel();
    };
    crate::listener::serve(listener, router(state), bounds, metrics, shutdown).await
}

// -- errors -------------------------------------------------------------------

/// A JSON error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), code, message: message.into() }
    }
    fn bad(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::new(code, message)
    }
    fn too_large(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::new(code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = self.code.as_str(), message = %self.message, "artifact request failed");
        }
        let body = ErrorBody { error: ErrorDetail { code: self.code.as_str().into(), message: self.message } };
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

pub(super) fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorCode::Internal, e.to_string())
}

pub(super) fn oci_error(e: OciError) -> ApiError {
    let msg = e.to_string();
    match e {
        OciError::NotFound { .. } => ApiError::new(ErrorCode::NotFound, msg),
        OciError::DigestMismatch { .. } | OciError::SizeMismatch { .. } => ApiError::new(ErrorCode::DigestMismatch, msg),
        OciError::Unreachable { .. } => ApiError::new(ErrorCode::RegistryUnavailable, msg),
        OciError::Auth { .. } => ApiError::new(ErrorCode::RegistryAuth, msg),
        _ => ApiError::new(ErrorCode::RegistryError, msg),
    }
}

/// Cap errors from the package path rules are 413, the rest 400.
pub(super) fn file_set_error(e: PackageError) -> ApiError {
    match e {
        PackageError::FileTooLarge { .. } => ApiError::too_large(ErrorCode::FileTooLarge, e.to_string()),
        PackageError::TotalTooLarge { .. } => ApiError::too_large(ErrorCode::TotalTooLarge, e.to_string()),
        PackageError::TooManyFiles { .. } => ApiError::too_large(ErrorCode::TooManyFiles, e.to_string()),
        PackageError::TooManyDirs { .. } => ApiError::too_large(ErrorCode::TooManyDirs, e.to_string()),
        other => ApiError::bad(ErrorCode::BadPath, other.to_string()),
    }
}

pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(internal(e)),
    }
}

#[derive(Debug, clap::Args)]
pub struct ArtifactsArgs {
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: std::net::SocketAddr,
    /// Registry and repository for job artifacts, e.g. registry.example:5000/skill-operator/jobs.
    #[arg(long, value_name = "HOST/REPO", required_unless_present = "store", conflicts_with = "store")]
    pub registry: Option<String>,
    /// Keep packages and job files in DIR instead (the built-in store: an OCI
    /// registry API at /v2 on this listener, for the operator credential only).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// With --store: do not push the embedded sample skills into it at start.
    #[arg(long, requires = "store", conflicts_with = "sample_packages")]
    pub no_samples: bool,
    /// With --store: once the samples are seeded, apply these SkillPackages
    /// (a JSON list; the chart renders it) to the cluster.
    #[arg(long, value_name = "FILE", requires = "store")]
    pub sample_packages: Option<PathBuf>,
    /// Talk plain HTTP to the registry (test registries only).
    #[arg(long, alias = "insecure-registry")]
    pub plain_http: bool,
    /// Registry credentials: a docker config JSON (a kubernetes.io/dockerconfigjson Secret's key).
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,
    /// File holding the key job tokens derive from (the controller's).
    #[arg(long, value_name = "FILE")]
    pub token_key_file: PathBuf,
    /// Where request bodies are spooled (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// MiB of file data all requests may hold in memory together.
    #[arg(long, default_value_t = 1024)]
    pub memory_budget_mib: u32,
    /// Also accept run pods' projected ServiceAccount tokens, verified by a
    /// TokenReview with the cluster (in-cluster config or KUBECONFIG); the
    /// endpoint's ServiceAccount needs `create` on tokenreviews.
    #[arg(long)]
    pub pod_tokens: bool,
    #[command(flatten)]
    pub listener: crate::listener::ListenerArgs,
    /// Who may read /metrics.
    #[command(flatten)]
    pub metrics_access: crate::metrics_access::MetricsAccessArgs,
}

/// `skill-operator artifacts`: serve the artifact endpoint until shutdown.
pub async fn command(a: ArtifactsArgs, shutdown: crate::shutdown::Shutdown) -> anyhow::Result<()> {
    use anyhow::Context;
    crate::tls::install_crypto_provider();
    let key = std::fs::read(&a.token_key_file).with_context(|| format!("cannot read the token key {}", a.token_key_file.display()))?;
    let listener = crate::listener::bind(a.listen).with_context(|| format!("cannot listen on {}", a.listen))?;
    let mut cfg = match (&a.registry, &a.store) {
        (Some(registry), None) => ServerConfig::new(registry.clone(), key),
        (None, Some(dir)) => {
            anyhow::ensure!(
                a.registry_config.is_none() && !a.plain_http,
                "--registry-config and --plain-http go with --registry, not --store"
            );
            let mut cfg = ServerConfig::with_store(dir.clone(), key);
            // With --sample-packages the seeding is done before they are applied (below).
            cfg.seed_samples = !a.no_samples && a.sample_packages.is_none();
            cfg.use_store(listener.local_addr()?);
            cfg
        }
        _ => anyhow::bail!("give exactly one of --registry HOST/REPO and --store DIR"),
    };
    cfg.plain_http |= a.plain_http;
    if let Some(path) = &a.registry_config {
        let json = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let host = cfg.registry.split('/').next().unwrap_or_default().to_string();
        cfg.registry_auth = oci::Auth::from_docker_config(&json, &host)?;
    }
    cfg.spool_dir = a.spool_dir;
    cfg.memory_budget_mib = a.memory_budget_mib;
    cfg.bounds = a.listener.bounds()?;
    let mut client = None;
    if a.pod_tokens {
        let made = kube::Client::try_default().await.context(
            "--pod-tokens needs the cluster's API server to review tokens, and no Kubernetes configuration was found \
             (run in a pod with a ServiceAccount token mounted, or set KUBECONFIG)",
        )?;
        cfg.pod_tokens = Some(pod_tokens::PodTokens::new(made.clone()));
        client = Some(made);
    }
    cfg.metrics_access = crate::metrics_access::MetricsAccess::from_args(a.metrics_access, client).await?;
    let sample_packages = a.sample_packages.as_deref().map(crate::artifacts::sample_packages::read).transpose()?;
    let state = AppState::new(cfg)?;
    if let Some(packages) = sample_packages {
        state.samples_pending();
        let seeded = state.clone();
        tokio::spawn(async move {
            // The packages name the seeded samples: seed first (serve seeds
            // too; pushing twice uploads nothing).
            match seeded.seed_samples().await {
                Err(e) => tracing::error!(error = %e, "seeding the sample skills failed; not applying their SkillPackages"),
                Ok(_) => {
                    if let Err(e) = crate::artifacts::sample_packages::apply(packages).await {
                        tracing::error!(error = %format!("{e:#}"), "the sample SkillPackages were not applied");
                    }
                }
            }
            seeded.samples_applied();
        });
    }
    match &a.store {
        Some(dir) => eprintln!("skill-operator: artifact endpoint on {}, built-in store in {}", listener.local_addr()?, dir.display()),
        None => eprintln!("skill-operator: artifact endpoint on {}", listener.local_addr()?),
    }
    serve(listener, state, shutdown.wait_owned()).await?;
    Ok(())
}
