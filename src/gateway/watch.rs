//! The gateway's view of the cluster: reflectors over every SkillBinding
//! and SkillPackage, and the loop that turns their changes into rebuilt
//! namespace snapshots. A binding change touches its own namespace only; a
//! package change may touch any served namespace (bindings name packages
//! by name across namespaces). Changes are gathered for a quiet moment, so
//! applying fifty bindings is one rebuild. Unchanged objects saved again
//! rebuild to the same snapshot, which [`super::namespaces::Namespaces::refresh`]
//! drops without telling anyone.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, reflector, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use crate::api::{SkillBinding, SkillPackage};
use crate::core::limits::GATEWAY_REBUILD_DEBOUNCE;
use crate::shutdown::Shutdown;

use super::executor::index::JobIndex;
use super::http::Readiness;
use super::namespaces::Namespaces;
use super::ratelimits::NamespaceLimits;

/// What changed, as far as the namespaces care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// A binding in this namespace.
    Namespace(String),
    /// A package: any namespace may bind it.
    Everything,
}

/// The caches the snapshot builder reads.
#[derive(Clone)]
pub struct Stores {
    pub bindings: Store<SkillBinding>,
    pub packages: Store<SkillPackage>,
    /// The SkillJobs this gateway wrote, every namespace (job lists and the console's streams).
    pub jobs: Arc<JobIndex>,
}

/// Start the reflectors and the rebuild loop; the stores fill as the
/// watches list, and `ready` is set once all three have (and `limits` has
/// read every Namespace, when it reads them).
pub fn spawn(client: Client, namespaces: Arc<Namespaces>, limits: Arc<NamespaceLimits>, ready: Readiness, shutdown: Shutdown) -> Stores {
    let (bindings, binding_writer) = reflector::store::<SkillBinding>();
    let (packages, package_writer) = reflector::store::<SkillPackage>();
    let binding_events = reflector(binding_writer, watcher(Api::<SkillBinding>::all(client.clone()), watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .filter_map(|b| async move { b.ok().map(|b| Touched::Namespace(b.namespace().unwrap_or_default())) });
    let jobs = JobIndex::spawn(client.clone(), shutdown.clone());
    let package_events = reflector(package_writer, watcher(Api::<SkillPackage>::all(client), watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .filter_map(|p| async move { p.ok().map(|_| Touched::Everything) });
    let events = futures::stream::select(binding_events, package_events);
    let stores = Stores { bindings: bindings.clone(), packages: packages.clone(), jobs: jobs.clone() };
    tokio::spawn(run_rebuilds(events, namespaces.clone(), shutdown.clone()));
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.wait() => return,
            synced = async { tokio::try_join!(bindings.wait_until_ready(), packages.wait_until_ready()) } => {
                if synced.is_err() || !jobs.wait_until_ready().await || !limits.wait_until_ready().await {
                    return;
                }
            }
        }
        // Namespaces made before the sync saw empty stores: bring them current.
        namespaces.refresh_all().await;
        namespaces.apply_rate_limits(None);
        ready.set_ready();
        tracing::info!("bindings, packages, SkillJobs (and Namespaces, when their limits are read) synced; serving");
    });
    stores
}

/// Gather touched objects until a quiet [`GATEWAY_REBUILD_DEBOUNCE`], then
/// rebuild what they touched; until the stream ends or shutdown.
pub async fn run_rebuilds(events: impl Stream<Item = Touched> + Send, namespaces: Arc<Namespaces>, shutdown: Shutdown) {
    let mut events = std::pin::pin!(events);
    loop {
        let first = tokio::select! {
            _ = shutdown.wait() => return,
            next = events.next() => match next { Some(t) => t, None => return },
        };
        let mut touched = vec![first];
        // A steady stream of changes still gets rebuilt now and then.
        let latest = tokio::time::Instant::now() + GATEWAY_REBUILD_DEBOUNCE * 10;
        while tokio::time::Instant::now() < latest {
            match tokio::time::timeout(GATEWAY_REBUILD_DEBOUNCE, events.next()).await {
                Ok(Some(t)) => touched.push(t),
                Ok(None) | Err(_) => break,
            }
        }
        let changed = if touched.contains(&Touched::Everything) {
            namespaces.refresh_all().await
        } else {
            let which: BTreeSet<String> =
                touched.into_iter().filter_map(|t| if let Touched::Namespace(n) = t { Some(n) } else { None }).collect();
            namespaces.refresh(&which).await
        };
        if !changed.is_empty() {
            tracing::debug!(?changed, "namespaces rebuilt");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::namespaces::testing::registry;
    use super::*;

    #[tokio::test]
    async fn a_binding_change_rebuilds_its_namespace_and_a_package_change_all() {
        let (trees, reg) = registry(10);
        let reg = Arc::new(reg);
        trees.put("a", &["one"]);
        trees.put("b", &["two"]);
        let (a, b) = (reg.get("a").await.unwrap(), reg.get("b").await.unwrap());
        let (mut wake_a, mut wake_b) = (a.state.snapshots.subscribe(), b.state.snapshots.subscribe());
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let shutdown = Shutdown::default();
        let looping = tokio::spawn(run_rebuilds(rx, reg.clone(), shutdown.clone()));
        // Both trees change, but only `a`'s binding is reported: only `a` is rebuilt.
        trees.put("a", &["one", "three"]);
        trees.put("b", &["two", "four"]);
        tx.unbounded_send(Touched::Namespace("a".into())).unwrap();
        wake_a.changed().await.unwrap();
        assert_eq!(a.state.snapshot().catalog.names(), vec!["one", "three"]);
        assert!(!wake_b.has_changed().unwrap());
        // A package change rebuilds every served namespace.
        tx.unbounded_send(Touched::Everything).unwrap();
        wake_b.changed().await.unwrap();
        assert_eq!(b.state.snapshot().catalog.names(), vec!["four", "two"]);
        shutdown.trigger();
        looping.await.unwrap();
    }
}
