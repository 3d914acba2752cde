//! Packages pulled by pinned digest, verified, unpacked once per digest into
//! a bounded directory, and handed out as leases.
//!
//! - **Pinned**: a package is pulled as `repository@<status.digest>` with
//!   [`crate::oci::Registry::pull`], which checks the manifest against that
//!   digest and every blob against its descriptor; the digest it reports
//!   must be the pin. Nothing is taken from a tag.
//! - **Once per digest, single-flight**: the digest is the key (the content
//!   is the same wherever it was pulled from); concurrent requests for one
//!   digest share one pull, run in a task of its own so that a caller going
//!   away does not abort it halfway. A failed pull is not remembered: the
//!   next request tries again.
//! - **Bounded**: the unpacked bytes of all entries stay under
//!   [`CacheOptions::cap_bytes`]; past it, the least recently used entries
//!   that no lease holds are removed until the rest fit (exactly at the cap
//!   nothing goes). A package larger than the whole cap is refused. An entry
//!   held by a live snapshot is never removed: when only leased entries are
//!   left the cache stays over its cap (reported in [`CacheStats`] and the
//!   log) until their snapshots are dropped, and a dropped lease tries again.
//! - **Layout**: `<dir>/<hex>/<skill name>/…`, the same path for the same
//!   digest every time (so a re-pulled package produces the same problems,
//!   and a rebuild does not look like a change). A pull unpacks into
//!   `<dir>/.pull-<hex>-<n>` and is renamed into place; an evicted entry is
//!   renamed to `<dir>/.trash-<n>` before it is deleted, so its path is free
//!   at once. Entries left by an earlier process are removed at start-up.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use futures::future::{BoxFuture, FutureExt, Shared};

use super::limits::DEFAULT_CACHE_BYTES;
use super::secrets::PullSecrets;
use crate::api::package::OciSource;
use crate::controller::decide::pinned_reference;
use crate::core::catalog::Catalog;
use crate::core::discovery::{discover, Limits};
use crate::core::package::PackageError;
use crate::oci::{registry_of, Auth, OciError, OciLimits, Registry, RegistryOptions};

/// How the cache pulls and how much it keeps.
#[derive(Clone)]
pub struct CacheOptions {
    /// The cache's own directory (created if missing).
    pub dir: PathBuf,
    /// Unpacked bytes kept on disk.
    pub cap_bytes: u64,
    /// Registries (`host:port`) always reached over plain HTTP.
    pub plain_http: Vec<String>,
    /// Credentials for particular registries (`host:port`), winning over a
    /// pull secret there: the artifact endpoint's built-in store takes the
    /// operator credential.
    pub credentials: Vec<(String, Auth)>,
    /// Where a package's `pullSecret` is read; `None`: packages naming one are refused.
    pub secrets: Option<Arc<dyn PullSecrets>>,
    pub limits: OciLimits,
}

impl CacheOptions {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CacheOptions {
            dir: dir.into(),
            cap_bytes: DEFAULT_CACHE_BYTES,
            plain_http: Vec::new(),
            credentials: Vec::new(),
            secrets: None,
            limits: OciLimits::DEFAULT,
        }
    }
}

/// Why a package could not be put in the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("digest {digest:?} is not sha256:<64 lowercase hex>; the SkillPackage's status.digest is what the controller pinned")]
    InvalidDigest { digest: String },
    #[error("the package names pullSecret `{secret}`, but this gateway was started without access to Secrets; give it the operator namespace's Secrets")]
    NoSecretSource { secret: String },
    #[error("pull secret `{secret}`: {detail}")]
    PullSecret { secret: String, detail: String },
    #[error("pull secret `{secret}` holds no usable credentials for {registry}: {source}")]
    Credentials {
        secret: String,
        registry: String,
        #[source]
        source: Box<OciError>,
    },
    #[error("pulling {reference}: {source}")]
    Pull {
        reference: String,
        #[source]
        source: Box<OciError>,
    },
    #[error("the registry answered {got} for {reference}, pinned to {pinned}; refusing it")]
    PinMismatch { reference: String, pinned: String, got: String },
    #[error("package {digest} cannot be unpacked: {source}")]
    Unpack {
        digest: String,
        #[source]
        source: PackageError,
    },
    #[error("package {digest} cannot be served: {detail}")]
    NotServable { digest: String, detail: String },
    #[error("package {digest} unpacks to {bytes} bytes, more than the whole {cap}-byte package cache; raise the cache size")]
    TooLarge { digest: String, bytes: u64, cap: u64 },
    #[error("package cache: {what}: {source}; check that the cache directory is writable and has room")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("package cache: the pull task failed: {0}")]
    Task(String),
}

impl CacheError {
    /// The error as a client may see it: a disk failure names the cache's
    /// directories, which mean nothing outside the pod (the gateway's log
    /// has them), so it says only what failed.
    pub fn for_client(&self) -> String {
        match self {
            CacheError::Io { source, .. } => {
                format!("the gateway's package cache could not store it ({source}); the gateway's log names the directory")
            }
            other => other.to_string(),
        }
    }

    /// Whether asking again later may succeed (the registry or the disk),
    /// as opposed to a package that is wrong as it is.
    pub fn is_transient(&self) -> bool {
        match self {
            CacheError::Pull { source, .. } => matches!(**source, OciError::Unreachable { .. } | OciError::Registry { .. }),
            CacheError::PullSecret { .. } | CacheError::Io { .. } | CacheError::Task(_) => true,
            _ => false,
        }
    }
}

/// One unpacked package: where it is and what discovery found in it.
#[derive(Debug)]
pub struct Unpacked {
    pub digest: String,
    /// The skill's name (its `SKILL.md` `name`), which is also its directory's.
    pub name: String,
    /// `<dir>/<hex>/<name>`: the root discovery was given.
    pub skill_root: PathBuf,
    /// Bytes of the package's files.
    pub bytes: u64,
    /// Discovery over [`Self::skill_root`] with the standalone server's rules.
    pub catalog: Catalog,
    entry_dir: PathBuf,
}

/// A hold on one unpacked package: while any lease of a digest lives, its
/// directory stays. Snapshots keep the leases of the packages they serve.
pub struct PackageLease {
    unpacked: Option<Arc<Unpacked>>,
    cache: Weak<Inner>,
}

impl PackageLease {
    pub fn package(&self) -> &Unpacked {
        self.unpacked.as_deref().expect("a lease holds its package until dropped")
    }
}

impl std::ops::Deref for PackageLease {
    type Target = Unpacked;
    fn deref(&self) -> &Unpacked {
        self.package()
    }
}

impl Clone for PackageLease {
    fn clone(&self) -> Self {
        PackageLease { unpacked: self.unpacked.clone(), cache: self.cache.clone() }
    }
}

impl std::fmt::Debug for PackageLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageLease").field("digest", &self.package().digest).finish()
    }
}

impl Drop for PackageLease {
    fn drop(&mut self) {
        drop(self.unpacked.take());
        // The last lease of an entry over the cap lets it go now.
        if let Some(inner) = self.cache.upgrade() {
            inner.evict();
        }
    }
}

/// What the cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub entries: usize,
    pub bytes: u64,
    /// Entries some lease holds.
    pub leased: usize,
    pub cap_bytes: u64,
    /// Pulls started since the cache was made (each one a registry round).
    pub pulls: u64,
}

/// The package cache. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct PackageCache {
    inner: Arc<Inner>,
}

type PullResult = Result<Arc<Unpacked>, Arc<CacheError>>;
type Pending = Shared<BoxFuture<'static, PullResult>>;

struct Inner {
    opts: CacheOptions,
    state: Mutex<State>,
    seq: AtomicU64,
}

#[derive(Default)]
struct State {
    ready: HashMap<String, Entry>,
    pulling: HashMap<String, Pending>,
    clock: u64,
    pulls: u64,
}

struct Entry {
    unpacked: Arc<Unpacked>,
    last_used: u64,
}

impl PackageCache {
    /// A cache in `opts.dir`, which is created when missing; entries an
    /// earlier process left there are removed (only names this cache makes).
    pub fn new(opts: CacheOptions) -> Result<PackageCache, CacheError> {
        let io = |what: String| move |source| CacheError::Io { what, source };
        std::fs::create_dir_all(&opts.dir).map_err(io(format!("create {}", opts.dir.display())))?;
        for entry in std::fs::read_dir(&opts.dir).map_err(io(format!("list {}", opts.dir.display())))?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if is_hex_digest(&name) || name.starts_with(".pull-") || name.starts_with(".trash-") {
                std::fs::remove_dir_all(entry.path()).map_err(io(format!("remove the stale entry {}", entry.path().display())))?;
            }
        }
        Ok(PackageCache { inner: Arc::new(Inner { opts, state: Mutex::default(), seq: AtomicU64::new(0) }) })
    }

    pub fn options(&self) -> &CacheOptions {
        &self.inner.opts
    }

    /// The package `source` pinned to `digest`, pulled and unpacked unless
    /// the cache already holds it.
    pub async fn acquire(&self, source: &OciSource, digest: &str) -> Result<PackageLease, Arc<CacheError>> {
        let hex = digest.strip_prefix("sha256:").filter(|h| is_hex_digest(h));
        if hex.is_none() {
            return Err(Arc::new(CacheError::InvalidDigest { digest: digest.to_string() }));
        }
        let pending = {
            let mut st = self.inner.lock();
            st.clock += 1;
            let now = st.clock;
            if let Some(entry) = st.ready.get_mut(digest) {
                entry.last_used = now;
                return Ok(self.lease(entry.unpacked.clone()));
            }
            match st.pulling.get(digest) {
                Some(p) => p.clone(),
                None => {
                    st.pulls += 1;
                    let p = self.start_pull(source.clone(), digest.to_string());
                    st.pulling.insert(digest.to_string(), p.clone());
                    p
                }
            }
        };
        pending.await.map(|u| self.lease(u))
    }

    pub fn stats(&self) -> CacheStats {
        let st = self.inner.lock();
        CacheStats {
            entries: st.ready.len(),
            bytes: st.ready.values().map(|e| e.unpacked.bytes).sum(),
            leased: st.ready.values().filter(|e| Arc::strong_count(&e.unpacked) > 1).count(),
            cap_bytes: self.inner.opts.cap_bytes,
            pulls: st.pulls,
        }
    }

    /// Whether the cache holds `digest` unpacked now.
    pub fn holds(&self, digest: &str) -> bool {
        self.inner.lock().ready.contains_key(digest)
    }

    fn lease(&self, unpacked: Arc<Unpacked>) -> PackageLease {
        PackageLease { unpacked: Some(unpacked), cache: Arc::downgrade(&self.inner) }
    }

    fn start_pull(&self, source: OciSource, digest: String) -> Pending {
        let inner = self.inner.clone();
        let task = tokio::spawn({
            let (inner, digest) = (inner.clone(), digest.clone());
            async move {
                let result = inner.pull(&source, &digest).await.map(Arc::new).map_err(Arc::new);
                inner.settle(&digest, &result);
                result
            }
        });
        async move {
            match task.await {
                Ok(result) => result,
                Err(e) => {
                    let err = Arc::new(CacheError::Task(e.to_string()));
                    inner.settle(&digest, &Err(err.clone()));
                    Err(err)
                }
            }
        }
        .boxed()
        .shared()
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a pair of maps updated in single statements: a
        // panic elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn pull(&self, source: &OciSource, digest: &str) -> Result<Unpacked, CacheError> {
        let reference = pinned_reference(&source.reference, digest);
        let registry_host = registry_of(&reference).map_err(|e| CacheError::Pull { reference: reference.clone(), source: Box::new(e) })?;
        let mut options = RegistryOptions {
            plain_http: self.opts.plain_http.clone(),
            credentials: self.opts.credentials.clone(),
            limits: self.opts.limits,
            ..Default::default()
        };
        if source.insecure {
            options.plain_http.push(registry_host.clone());
        }
        if let Some(secret) = &source.pull_secret {
            let secrets = self.opts.secrets.as_ref().ok_or_else(|| CacheError::NoSecretSource { secret: secret.clone() })?;
            let json = secrets.docker_config(secret).await.map_err(|detail| CacheError::PullSecret { secret: secret.clone(), detail })?;
            options.auth = Auth::from_docker_config(&json, &registry_host).map_err(|e| CacheError::Credentials {
                secret: secret.clone(),
                registry: registry_host.clone(),
                source: Box::new(e),
            })?;
        }
        let registry = Registry::new(options).map_err(|e| CacheError::Pull { reference: reference.clone(), source: Box::new(e) })?;
        let pulled = registry.pull(&reference).await.map_err(|e| CacheError::Pull { reference: reference.clone(), source: Box::new(e) })?;
        if pulled.digest != digest {
            return Err(CacheError::PinMismatch { reference, pinned: digest.to_string(), got: pulled.digest });
        }
        // The config's byte count was checked against the package by the
        // pull: a package that cannot fit is refused before it is unpacked.
        if pulled.config.total_bytes > self.opts.cap_bytes {
            return Err(CacheError::TooLarge { digest: digest.to_string(), bytes: pulled.config.total_bytes, cap: self.opts.cap_bytes });
        }
        let staging = self.opts.dir.join(format!(".pull-{}-{}", hex_of(digest), self.seq.fetch_add(1, Ordering::Relaxed)));
        let entry_dir = self.opts.dir.join(hex_of(digest));
        let (digest, limits, cap) = (digest.to_string(), self.opts.limits.files, self.opts.cap_bytes);
        tokio::task::spawn_blocking(move || {
            let result = unpack_entry(&pulled.package, &digest, &staging, &entry_dir, &limits, cap);
            if result.is_err() {
                let _ = std::fs::remove_dir_all(&staging);
            }
            result
        })
        .await
        .map_err(|e| CacheError::Task(e.to_string()))?
    }

    /// Record how a pull ended: its entry is in (and the cache trimmed), or
    /// it is forgotten so that the next request tries again.
    fn settle(&self, digest: &str, result: &PullResult) {
        {
            let mut st = self.lock();
            st.pulling.remove(digest);
            if let Ok(unpacked) = result {
                st.clock += 1;
                let last_used = st.clock;
                st.ready.insert(digest.to_string(), Entry { unpacked: unpacked.clone(), last_used });
            }
        }
        self.evict();
    }

    /// Remove least recently used, unleased entries until the rest fit.
    fn evict(&self) {
        let cap = self.opts.cap_bytes;
        let mut doomed = Vec::new();
        {
            let mut st = self.lock();
            let entries: Vec<EvictionCandidate> = st
                .ready
                .iter()
                .map(|(k, e)| EvictionCandidate {
                    key: k.clone(),
                    bytes: e.unpacked.bytes,
                    last_used: e.last_used,
                    leased: Arc::strong_count(&e.unpacked) > 1,
                })
                .collect();
            let plan = plan_eviction(&entries, cap);
            for key in &plan.victims {
                if let Some(entry) = st.ready.remove(key) {
                    // Renamed under the lock: the digest's path is free for
                    // a new pull before the old tree is gone.
                    let trash = self.opts.dir.join(format!(".trash-{}", self.seq.fetch_add(1, Ordering::Relaxed)));
                    match std::fs::rename(&entry.unpacked.entry_dir, &trash) {
                        Ok(()) => doomed.push(trash),
                        Err(e) => {
                            tracing::warn!(path = %entry.unpacked.entry_dir.display(), error = %e, "could not move an evicted package aside");
                            doomed.push(entry.unpacked.entry_dir.clone());
                        }
                    }
                }
            }
            if plan.remaining > cap {
                tracing::warn!(
                    bytes = plan.remaining,
                    cap,
                    "package cache over its cap: every remaining package is in use by a live snapshot; it shrinks when they are replaced"
                );
            }
        }
        if doomed.is_empty() {
            return;
        }
        // A lease may be dropped on an async worker: the deletion runs beside it.
        let remove = move || {
            for dir in doomed {
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(path = %dir.display(), error = %e, "could not remove an evicted package");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// One entry as eviction sees it.
#[derive(Debug, Clone)]
pub(crate) struct EvictionCandidate {
    pub key: String,
    pub bytes: u64,
    pub last_used: u64,
    pub leased: bool,
}

/// What eviction removes, and what is left.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct EvictionPlan {
    pub victims: Vec<String>,
    pub remaining: u64,
}

/// Least recently used first, leased entries never, until the total is at
/// most `cap` (a total exactly at the cap keeps everything).
pub(crate) fn plan_eviction(entries: &[EvictionCandidate], cap: u64) -> EvictionPlan {
    let mut remaining: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut order: Vec<&EvictionCandidate> = entries.iter().filter(|e| !e.leased).collect();
    order.sort_by(|a, b| (a.last_used, &a.key).cmp(&(b.last_used, &b.key)));
    let mut victims = Vec::new();
    for e in order {
        if remaining <= cap {
            break;
        }
        remaining -= e.bytes;
        victims.push(e.key.clone());
    }
    EvictionPlan { victims, remaining }
}

/// Unpack into `staging`, name the skill by its `SKILL.md`, run discovery,
/// and move the tree to `entry_dir` (blocking).
fn unpack_entry(
    package: &[u8],
    digest: &str,
    staging: &Path,
    entry_dir: &Path,
    limits: &crate::core::package::Limits,
    cap: u64,
) -> Result<Unpacked, CacheError> {
    let io = |what: String| move |source| CacheError::Io { what, source };
    std::fs::create_dir(staging).map_err(io(format!("create {}", staging.display())))?;
    let tree = staging.join("package");
    let files =
        crate::core::package::unpack_with(package, &tree, limits).map_err(|source| CacheError::Unpack { digest: digest.into(), source })?;
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    if bytes > cap {
        return Err(CacheError::TooLarge { digest: digest.into(), bytes, cap });
    }
    // Named by its SKILL.md, like the controller does: a package has no
    // directory of its own, and discovery names a skill by its directory.
    let name = crate::controller::package::skill_name(&tree).map_err(|detail| CacheError::NotServable { digest: digest.into(), detail })?;
    std::fs::rename(&tree, staging.join(&name)).map_err(io(format!("rename {}", tree.display())))?;
    if entry_dir.exists() {
        std::fs::remove_dir_all(entry_dir).map_err(io(format!("remove the stale {}", entry_dir.display())))?;
    }
    std::fs::rename(staging, entry_dir).map_err(io(format!("move the package into {}", entry_dir.display())))?;
    let skill_root = entry_dir.join(&name);
    let catalog = discover(std::slice::from_ref(&skill_root), Limits::default());
    Ok(Unpacked { digest: digest.into(), name, skill_root, bytes, catalog, entry_dir: entry_dir.to_path_buf() })
}

fn is_hex_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &str, bytes: u64, last_used: u64, leased: bool) -> EvictionCandidate {
        EvictionCandidate { key: key.into(), bytes, last_used, leased }
    }

    #[test]
    fn exactly_at_the_cap_keeps_everything() {
        let plan = plan_eviction(&[c("a", 60, 1, false), c("b", 40, 2, false)], 100);
        assert_eq!(plan, EvictionPlan { victims: vec![], remaining: 100 });
    }

    #[test]
    fn one_byte_over_removes_the_least_recently_used() {
        let plan = plan_eviction(&[c("new", 41, 3, false), c("a", 60, 1, false), c("b", 40, 2, false)], 140);
        assert_eq!(plan, EvictionPlan { victims: vec!["a".into()], remaining: 81 });
    }

    #[test]
    fn leased_entries_stay_even_over_the_cap() {
        let plan = plan_eviction(&[c("a", 60, 1, true), c("b", 40, 2, false), c("c", 50, 3, false)], 100);
        assert_eq!(plan.victims, vec!["b".to_string(), "c".to_string()], "the unleased go, oldest first; the leased oldest stays");
        assert_eq!(plan.remaining, 60);
        let plan = plan_eviction(&[c("a", 60, 1, true), c("b", 40, 2, false), c("c", 50, 3, false)], 110);
        assert_eq!(plan, EvictionPlan { victims: vec!["b".into()], remaining: 110 }, "stops as soon as the rest fit");
        let plan = plan_eviction(&[c("a", 60, 1, true), c("c", 50, 3, true)], 100);
        assert_eq!(plan, EvictionPlan { victims: vec![], remaining: 110 });
    }

    #[test]
    fn start_up_removes_only_what_an_earlier_cache_left() {
        let t = tempfile::tempdir().unwrap();
        for stale in ["ab".repeat(32), ".pull-x-1".into(), ".trash-7".into()] {
            std::fs::create_dir_all(t.path().join(&stale).join("inner")).unwrap();
        }
        std::fs::create_dir(t.path().join("not-ours")).unwrap();
        std::fs::write(t.path().join("notes.txt"), "kept").unwrap();
        let cache = PackageCache::new(CacheOptions::new(t.path())).unwrap();
        let mut left: Vec<String> =
            std::fs::read_dir(t.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, vec!["not-ours".to_string(), "notes.txt".to_string()]);
        assert_eq!(cache.stats(), CacheStats { entries: 0, bytes: 0, leased: 0, cap_bytes: DEFAULT_CACHE_BYTES, pulls: 0 });
    }

    #[test]
    fn digests_are_checked_before_anything_is_pulled() {
        assert!(is_hex_digest(&"ab".repeat(32)));
        assert!(!is_hex_digest(&"AB".repeat(32)));
        assert!(!is_hex_digest(&"ab".repeat(31)));
        assert!(!is_hex_digest("../../etc"));
    }
}
