//! The catalog a long-running server answers from, swapped whole when the
//! cluster's catalog changes ([`LiveCatalog::apply`]); a search in flight
//! finishes on the catalog it started with.
//!
//! What serves:
//! - no ConfigMap (none yet, or deleted): the embedded snapshot;
//! - a ConfigMap that loads: its catalog;
//! - a ConfigMap that does not load: whatever served before (the last good
//!   cluster catalog, else the snapshot), with a warning. `catalog refresh
//!   --cluster` never writes such a one; it comes from a hand edit, and
//!   falling back to the snapshot would lose a good refresh for a typo.
//!
//! Each change is judged once: the same `resourceVersion` seen again (a
//! watch that re-lists after a reconnect) is skipped, so its warning is
//! logged once per change, not once per re-list.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::ConfigMap;

use super::cluster;
use super::model::CatalogError;
use super::query::Searcher;
use super::store::{self, Origin};

/// A catalog with its index and where it came from.
pub struct Active {
    pub searcher: Searcher,
    pub origin: Origin,
}

/// What [`LiveCatalog::apply`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The ConfigMap's catalog serves now.
    Loaded,
    /// There is no ConfigMap: the embedded snapshot serves.
    Snapshot,
    /// The ConfigMap does not load; what served before still does.
    Kept(String),
    /// This version was already judged.
    Unchanged,
}

/// The catalog in use, replaceable while it is read.
pub struct LiveCatalog {
    current: ArcSwap<Active>,
    /// The `resourceVersion` last judged (`Some("")` for "no ConfigMap").
    judged: Mutex<Option<String>>,
}

impl LiveCatalog {
    /// Serving the embedded snapshot until a cluster catalog loads. It is
    /// judged as "no ConfigMap" already, so the watch's first list finding
    /// none does not inflate and index the snapshot a second time.
    pub fn from_snapshot() -> Result<LiveCatalog, CatalogError> {
        Ok(LiveCatalog { current: ArcSwap::from_pointee(snapshot_active()?), judged: Mutex::new(Some(String::new())) })
    }

    /// The catalog to answer one call from.
    pub fn load(&self) -> Arc<Active> {
        self.current.load_full()
    }

    /// Make the catalog of `cm` (`None`: there is none) the one in use, as
    /// the module docs say. Decoding inflates and indexes a few MiB: call
    /// it off the async threads.
    pub fn apply(&self, cm: Option<&ConfigMap>) -> Applied {
        let version = cm.map(|c| c.metadata.resource_version.clone().unwrap_or_default()).unwrap_or_default();
        {
            let mut judged = self.judged.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // A ConfigMap without a resourceVersion (only in tests) is judged every time.
            if judged.as_deref() == Some(version.as_str()) && (cm.is_none() || !version.is_empty()) {
                return Applied::Unchanged;
            }
            *judged = Some(version);
        }
        let Some(cm) = cm else {
            return match snapshot_active() {
                Ok(active) => {
                    self.current.store(Arc::new(active));
                    tracing::info!("no catalog ConfigMap: skill_search scope catalog answers from the embedded snapshot");
                    Applied::Snapshot
                }
                Err(e) => self.keep(format!("the embedded snapshot does not load: {e}")),
            };
        };
        match cluster::decode(cm) {
            Ok(catalog) => {
                let at = format!("ConfigMap {}", cluster::describe(cm.metadata.namespace.as_deref().unwrap_or_default()));
                tracing::info!(catalog = %at, entries = catalog.entries.len(), built = %catalog.built, "catalog loaded");
                self.current.store(Arc::new(Active { searcher: Searcher::new(catalog), origin: Origin::Stored(at) }));
                Applied::Loaded
            }
            Err(e) => self.keep(e.to_string()),
        }
    }

    fn keep(&self, why: String) -> Applied {
        let serving = self.current.load().origin.to_string();
        tracing::warn!(%serving, "the cluster's catalog is not used: {why}; {serving} keeps serving skill_search scope catalog");
        Applied::Kept(why)
    }
}

fn snapshot_active() -> Result<Active, CatalogError> {
    Ok(Active { searcher: Searcher::new(store::snapshot()?), origin: Origin::Snapshot })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::cluster::tests::catalog;
    use crate::catalog::cluster::{config_map, encode, CONFIGMAP_KEY};

    fn cm(names: &[&str], version: &str) -> ConfigMap {
        let c = catalog(names, |_| "Edit spreadsheets.".into());
        config_map("ops", &c, encode(&c).unwrap(), Some(version.into()))
    }

    fn entries(live: &LiveCatalog) -> usize {
        live.load().searcher.catalog().entries.len()
    }

    #[test]
    fn the_snapshot_serves_until_a_config_map_loads_and_after_it_is_deleted() {
        let live = LiveCatalog::from_snapshot().unwrap();
        let snapshot_entries = entries(&live);
        assert_eq!(live.load().origin, Origin::Snapshot);
        assert_eq!(live.apply(None), Applied::Unchanged, "start-up's list finding none does not index the snapshot again");
        assert_eq!(live.apply(Some(&cm(&["pdf", "xlsx"], "1"))), Applied::Loaded);
        assert_eq!(entries(&live), 2);
        assert_eq!(live.load().origin.to_string(), "ConfigMap ops/skill-operator-catalog");
        assert_eq!(live.apply(None), Applied::Snapshot);
        assert_eq!(entries(&live), snapshot_entries);
        assert_eq!(live.apply(None), Applied::Unchanged, "judged once per change");
    }

    #[test]
    fn a_corrupt_config_map_is_refused_and_the_previous_catalog_kept() {
        let live = LiveCatalog::from_snapshot().unwrap();
        assert_eq!(live.apply(Some(&cm(&["pdf"], "1"))), Applied::Loaded);
        let held = live.load();
        let mut broken = cm(&["pdf", "xlsx"], "2");
        broken.binary_data.as_mut().unwrap().insert(CONFIGMAP_KEY.into(), k8s_openapi::ByteString(b"{\"schema\":\"x\"}".to_vec()));
        assert!(matches!(live.apply(Some(&broken)), Applied::Kept(why) if why.contains("schema")));
        assert!(Arc::ptr_eq(&held, &live.load()), "the previous catalog still serves");
        assert_eq!(live.apply(Some(&broken)), Applied::Unchanged, "the same version is not judged (nor warned about) twice");
        assert_eq!(live.apply(Some(&cm(&["pdf", "xlsx", "docx"], "3"))), Applied::Loaded, "a fixed one loads");
        assert_eq!(entries(&live), 3);
    }
}
