//! The production [`PackageResolver`]: pull a package from its OCI
//! registry (this project's format or a ToolHive skill artifact), verifying
//! every digest, and hand back the pinned digest and the archive.

use futures::future::BoxFuture;

use super::context::{FetchedPackage, PackageResolver, ResolveError};
use crate::api::package::OciSource;
use crate::oci::{registry_of, Registry, RegistryOptions};

/// Pulls packages from registries.
pub struct OciResolver {
    /// Registries always reached over plain HTTP (in-cluster test registries).
    pub plain_http: Vec<String>,
    /// Credentials for particular registries: the artifact endpoint's
    /// built-in store takes the operator credential.
    pub credentials: Vec<(String, crate::oci::Auth)>,
}

impl PackageResolver for OciResolver {
    fn fetch<'a>(&'a self, source: &'a OciSource) -> BoxFuture<'a, Result<FetchedPackage, ResolveError>> {
        Box::pin(async move {
            let mut options =
                RegistryOptions { plain_http: self.plain_http.clone(), credentials: self.credentials.clone(), ..Default::default() };
            if source.insecure {
                options.plain_http.push(
                    registry_of(&source.reference).map_err(|e| ResolveError::Pull { reference: source.reference.clone(), source: e })?,
                );
            }
            let registry = Registry::new(options).map_err(|e| ResolveError::Pull { reference: source.reference.clone(), source: e })?;
            let pulled = registry
                .pull(&source.reference)
                .await
                .map_err(|e| ResolveError::Pull { reference: source.reference.clone(), source: e })?;
            Ok(FetchedPackage { digest: pulled.digest, archive: pulled.package })
        })
    }
}

/// Packages pinned by digest never change, so a burst of SkillJobs of one
/// package needs one pull, not one per job. Only digest-pinned references
/// are kept (a tag can move); concurrent misses for one reference share a
/// single pull; the oldest entries go when the kept archives pass `budget`
/// bytes.
pub struct PinnedCache {
    inner: std::sync::Arc<dyn PackageResolver>,
    budget: usize,
    entries: std::sync::Mutex<PinnedEntries>,
}

#[derive(Default)]
struct PinnedEntries {
    cells: std::collections::HashMap<String, std::sync::Arc<tokio::sync::OnceCell<FetchedPackage>>>,
    order: std::collections::VecDeque<String>,
}

impl PinnedCache {
    pub fn new(inner: std::sync::Arc<dyn PackageResolver>, budget: usize) -> Self {
        PinnedCache { inner, budget, entries: Default::default() }
    }

    fn cell(&self, key: &str) -> std::sync::Arc<tokio::sync::OnceCell<FetchedPackage>> {
        let mut e = self.entries.lock().expect("lock poisoned");
        if let Some(cell) = e.cells.get(key) {
            return cell.clone();
        }
        let cell = std::sync::Arc::new(tokio::sync::OnceCell::new());
        e.cells.insert(key.to_string(), cell.clone());
        e.order.push_back(key.to_string());
        cell
    }

    /// Drop the oldest kept archives until the rest fit the budget.
    fn evict(&self) {
        let mut e = self.entries.lock().expect("lock poisoned");
        let size = |e: &PinnedEntries| e.cells.values().filter_map(|c| c.get()).map(|p| p.archive.len()).sum::<usize>();
        while size(&e) > self.budget {
            let Some(oldest) = e.order.pop_front() else { break };
            e.cells.remove(&oldest);
        }
    }

    fn forget(&self, key: &str) {
        let mut e = self.entries.lock().expect("lock poisoned");
        e.cells.remove(key);
        e.order.retain(|k| k != key);
    }

    #[cfg(test)]
    fn kept(&self) -> Vec<String> {
        self.entries.lock().unwrap().order.iter().cloned().collect()
    }
}

fn cache_key(source: &OciSource) -> String {
    format!("{}|{:?}|{}", source.reference, source.pull_secret, source.insecure)
}

impl PackageResolver for PinnedCache {
    fn fetch<'a>(&'a self, source: &'a OciSource) -> BoxFuture<'a, Result<FetchedPackage, ResolveError>> {
        Box::pin(async move {
            let Some((_, pinned)) = source.reference.rsplit_once('@') else {
                return self.inner.fetch(source).await;
            };
            let key = cache_key(source);
            let cell = self.cell(&key);
            let got = cell.get_or_try_init(|| self.inner.fetch(source)).await.cloned();
            match got {
                // A registry answering with other content than the pin asked
                // for is not cached (the pull itself checks digests too).
                Ok(p) if p.digest == pinned => {
                    self.evict();
                    Ok(p)
                }
                other => {
                    self.forget(&key);
                    other
                }
            }
        })
    }

    /// Kept only when it is what the pin names (a SkillSource's publisher
    /// offers the archive and manifest digest its push just returned).
    fn seed(&self, source: &OciSource, package: FetchedPackage) {
        if source.reference.rsplit_once('@').is_none_or(|(_, pinned)| pinned != package.digest) {
            return;
        }
        // An entry already there (a pull under way or done) stays as it is.
        let _ = self.cell(&cache_key(source)).set(package);
        self.evict();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    const PIN: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    /// Counts pulls; answers `digest` (the pin, unless told otherwise) and `size` bytes.
    struct Counting {
        pulls: AtomicUsize,
        answer_digest: Option<String>,
        size: usize,
    }

    impl PackageResolver for Counting {
        fn fetch<'a>(&'a self, source: &'a OciSource) -> BoxFuture<'a, Result<FetchedPackage, ResolveError>> {
            Box::pin(async move {
                self.pulls.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                let digest = self
                    .answer_digest
                    .clone()
                    .unwrap_or_else(|| source.reference.rsplit_once('@').map(|(_, d)| d.to_string()).unwrap_or_default());
                Ok(FetchedPackage { digest, archive: vec![0; self.size] })
            })
        }
    }

    fn source(reference: &str) -> OciSource {
        serde_json::from_value(serde_json::json!({ "reference": reference })).unwrap()
    }

    fn counting(answer_digest: Option<&str>, size: usize) -> Arc<Counting> {
        Arc::new(Counting { pulls: AtomicUsize::new(0), answer_digest: answer_digest.map(String::from), size })
    }

    #[tokio::test]
    async fn a_pinned_package_is_pulled_once_even_by_concurrent_callers() {
        let inner = counting(None, 10);
        let cache = Arc::new(PinnedCache::new(inner.clone(), 1 << 20));
        let src = source(&format!("r/skills/a@{PIN}"));
        let results = futures::future::join_all((0..20).map(|_| cache.fetch(&src))).await;
        assert!(results.iter().all(|r| r.as_ref().is_ok_and(|p| p.digest == PIN)));
        assert_eq!(inner.pulls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_tag_is_pulled_every_time() {
        let inner = counting(Some(PIN), 10);
        let cache = PinnedCache::new(inner.clone(), 1 << 20);
        let src = source("r/skills/a:1");
        cache.fetch(&src).await.unwrap();
        cache.fetch(&src).await.unwrap();
        assert_eq!(inner.pulls.load(Ordering::SeqCst), 2);
        assert!(cache.kept().is_empty());
    }

    #[tokio::test]
    async fn content_other_than_the_pin_is_not_kept() {
        let other = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
        let inner = counting(Some(other), 10);
        let cache = PinnedCache::new(inner.clone(), 1 << 20);
        let src = source(&format!("r/skills/a@{PIN}"));
        cache.fetch(&src).await.unwrap();
        cache.fetch(&src).await.unwrap();
        assert_eq!(inner.pulls.load(Ordering::SeqCst), 2);
        assert!(cache.kept().is_empty());
    }

    #[tokio::test]
    async fn the_oldest_archives_go_past_the_budget() {
        let inner = counting(None, 600);
        let cache = PinnedCache::new(inner.clone(), 1000);
        let a = source(&format!("r/skills/a@{PIN}"));
        let b = source(&format!("r/skills/b@{PIN}"));
        cache.fetch(&a).await.unwrap();
        cache.fetch(&b).await.unwrap();
        assert_eq!(cache.kept(), vec![format!("r/skills/b@{PIN}|None|false")], "1,200 bytes kept under a 1,000-byte budget");
        cache.fetch(&a).await.unwrap();
        assert_eq!(inner.pulls.load(Ordering::SeqCst), 3, "the evicted package was not pulled again");
    }

    #[tokio::test]
    async fn a_seeded_package_needs_no_pull_and_a_mismatched_seed_is_refused() {
        let inner = counting(None, 10);
        let cache = PinnedCache::new(inner.clone(), 1 << 20);
        let seeded = source(&format!("r/skills/a@{PIN}"));
        cache.seed(&seeded, FetchedPackage { digest: PIN.into(), archive: b"pushed".to_vec() });
        assert_eq!(cache.fetch(&seeded).await.unwrap().archive, b"pushed");
        assert_eq!(inner.pulls.load(Ordering::SeqCst), 0, "the seeded archive was served without a pull");

        // Other content than the pin names, or a tag, is never kept.
        let other = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
        let wrong = source(&format!("r/skills/b@{PIN}"));
        cache.seed(&wrong, FetchedPackage { digest: other.into(), archive: b"forged".to_vec() });
        cache.seed(&source("r/skills/c:1"), FetchedPackage { digest: PIN.into(), archive: b"tagged".to_vec() });
        assert_eq!(cache.kept(), vec![format!("r/skills/a@{PIN}|None|false")]);
        assert_eq!(cache.fetch(&wrong).await.unwrap().archive, vec![0; 10], "pulled, not the refused seed");
        assert_eq!(inner.pulls.load(Ordering::SeqCst), 1);
    }
}
