//! [`ServedIndex`]: which binding serves each skill of each namespace, as
//! the namespace's last build chose it. A run's SkillJob names that
//! binding, so the skill a caller saw in `tools/list` and the binding its
//! run goes through are one decision ([`NamespaceCatalog::build_served`]),
//! never two rules that could drift apart.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use super::build::{NamespaceCatalog, ServedSkill};
use super::cache::PackageCache;
use crate::api::binding::SkillBinding;
use crate::api::package::SkillPackage;
use crate::gateway::executor::SkillBindings;
use crate::mcp::snapshot::Snapshot;

/// Namespace → served skill → where it comes from.
#[derive(Default)]
pub struct ServedIndex {
    served: RwLock<HashMap<String, BTreeMap<String, ServedSkill>>>,
}

impl ServedIndex {
    /// [`NamespaceCatalog::build`], remembering which binding serves each skill.
    pub async fn build(
        &self,
        namespace: &str,
        bindings: &[SkillBinding],
        packages: &BTreeMap<String, SkillPackage>,
        cache: &PackageCache,
    ) -> Snapshot {
        let built = NamespaceCatalog::build_served(namespace, bindings, packages, cache).await;
        self.served.write().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(namespace.to_string(), built.skills);
        built.snapshot
    }

    /// The binding serving `skill` in `namespace` at the last build.
    pub fn binding_of(&self, namespace: &str, skill: &str) -> Option<String> {
        let served = self.served.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        served.get(namespace)?.get(skill).map(|s| s.binding.clone())
    }

    /// The [`SkillBindings`] of one namespace's executor.
    pub fn namespace(self: &Arc<Self>, namespace: &str) -> Arc<dyn SkillBindings> {
        Arc::new(NamespaceBindings { index: self.clone(), namespace: namespace.to_string() })
    }
}

struct NamespaceBindings {
    index: Arc<ServedIndex>,
    namespace: String,
}

impl SkillBindings for NamespaceBindings {
    fn binding_of(&self, skill: &str) -> Option<String> {
        self.index.binding_of(&self.namespace, skill)
    }
}
