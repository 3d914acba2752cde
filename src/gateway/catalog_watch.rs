//! Keeping the gateway's catalog (`skill_search` scope `catalog`) the
//! cluster's: a watch on the one ConfigMap
//! [`CONFIGMAP_NAME`](crate::catalog::cluster::CONFIGMAP_NAME) in the
//! gateway's namespace, each change loaded and swapped in by
//! [`LiveCatalog::apply`]. Until it is seen (and while it does not load)
//! the embedded snapshot (or the last good catalog) serves; the gateway's
//! readiness does not wait for it.
//!
//! The watch is narrowed to that name by a field selector, which is what
//! lets the chart grant `list`/`watch` with `resourceNames`.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::catalog::cluster::CONFIGMAP_NAME;
use crate::catalog::live::LiveCatalog;
use crate::shutdown::Shutdown;

/// The field selector narrowing the watch to the catalog's ConfigMap.
pub fn field_selector() -> String {
    format!("metadata.name={CONFIGMAP_NAME}")
}

/// Watch the catalog's ConfigMap in `namespace` and keep `live` on it, until shutdown.
pub fn spawn(client: Client, namespace: &str, live: Arc<LiveCatalog>, shutdown: Shutdown) {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let events =
        watcher::watcher(api, watcher::Config::default().fields(&field_selector())).default_backoff().filter_map(|event| async move {
            match event {
                Ok(event) => Some(event),
                Err(e) => {
                    // The backoff retries; the catalog in use keeps serving.
                    tracing::warn!(error = %e, "watching the catalog ConfigMap failed; retrying");
                    None
                }
            }
        });
    tokio::spawn(follow(events, live, shutdown));
}

/// Apply each event to `live`: an object seen is loaded, a deletion (or a
/// re-list that finds none) brings back the snapshot.
pub async fn follow(events: impl Stream<Item = Event<ConfigMap>> + Send, live: Arc<LiveCatalog>, shutdown: Shutdown) {
    let mut events = std::pin::pin!(events);
    // Whether the (re-)list in progress has found the ConfigMap.
    let mut listed = false;
    loop {
        let event = tokio::select! {
            _ = shutdown.wait() => return,
            next = events.next() => match next { Some(e) => e, None => return },
        };
        let seen = match event {
            Event::Init => {
                listed = false;
                continue;
            }
            Event::InitApply(cm) => {
                listed = true;
                Some(cm)
            }
            Event::InitDone if listed => continue,
            Event::InitDone | Event::Delete(_) => None,
            Event::Apply(cm) => Some(cm),
        };
        // Inflating and indexing a catalog is CPU work: off the async threads.
        let live = live.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || live.apply(seen.as_ref())).await {
            tracing::error!(error = %e, "loading the catalog panicked; the catalog in use keeps serving");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::cluster::tests::catalog;
    use crate::catalog::cluster::{config_map, encode};
    use crate::catalog::store::Origin;

    fn cm(names: &[&str], version: &str) -> ConfigMap {
        let c = catalog(names, |_| "Edit spreadsheets.".into());
        config_map("ops", &c, encode(&c).unwrap(), Some(version.into()))
    }

    #[tokio::test]
    async fn a_list_a_change_a_deletion_and_an_empty_relist_each_set_the_catalog() {
        let live = Arc::new(LiveCatalog::from_snapshot().unwrap());
        let entries = |live: &LiveCatalog| live.load().searcher.catalog().entries.len();
        // Each step is one stream, followed to its end: its events applied in order.
        let step = |events: Vec<Event<ConfigMap>>| follow(futures::stream::iter(events), live.clone(), Shutdown::default());
        step(vec![Event::Init, Event::InitApply(cm(&["pdf"], "1")), Event::InitDone]).await;
        assert_eq!(entries(&live), 1);
        step(vec![Event::Apply(cm(&["pdf", "xlsx"], "2"))]).await;
        assert_eq!(entries(&live), 2);
        step(vec![Event::Delete(cm(&["pdf", "xlsx"], "2"))]).await;
        assert_eq!(live.load().origin, Origin::Snapshot);
        step(vec![Event::Apply(cm(&["pdf"], "3")), Event::Init, Event::InitDone]).await;
        assert_eq!(live.load().origin, Origin::Snapshot, "a re-list that finds none: it was deleted while the watch was down");
        step(vec![Event::Init, Event::InitApply(cm(&["pdf"], "3")), Event::InitDone]).await;
        assert_eq!(entries(&live), 1, "a re-list that finds it keeps it");
    }
}
