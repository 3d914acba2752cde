//! Reads a SkillJob reconcile needs, served from memory where it is safe.
//!
//! A SkillJob reconcile used to GET its binding, the binding's package and
//! the namespace, and re-apply the namespace's ServiceAccount, every time:
//! four API round trips per job that return the same answer for every job of
//! a namespace. Under a burst (the benchmark sends 1,000 SkillJobs) they were
//! most of the API server's load. Now:
//!
//! - bindings and packages come from the reflector stores the binding and
//!   package controllers keep anyway (a miss falls back to a GET, so a
//!   binding created a moment ago is never reported missing);
//! - the Jobs and NetworkPolicies the operator made come from reflector
//!   stores too (a Job missing from the store is looked up with a GET before
//!   anything concludes it is gone, so a lagging cache never fails a run or
//!   creates a second Job; a NetworkPolicy missing from it is re-applied,
//!   which is idempotent);
//! - a namespace found enforcing `restricted`, and a ServiceAccount applied,
//!   are remembered for [`REMEMBER_FOR`]: a label removed or an account
//!   deleted is noticed within that time, not never.
//!
//! Nothing here decides anything; the reconcilers still do, on what they read.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Client;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::api::binding::SkillBinding;
use crate::api::package::SkillPackage;

/// How long a namespace check or an applied ServiceAccount is trusted.
pub const REMEMBER_FOR: Duration = Duration::from_secs(60);

/// Stores are set once the controllers exist; before that (and in tests
/// that call a reconciler directly) every read is a GET.
#[derive(Default)]
pub struct Lookups {
    bindings: OnceLock<Store<SkillBinding>>,
    packages: OnceLock<Store<SkillPackage>>,
    jobs: OnceLock<Store<Job>>,
    network_policies: OnceLock<Store<NetworkPolicy>>,
    pods: OnceLock<Store<Pod>>,
    /// Namespaces' metadata (their annotations: the warm-pod budget).
    namespaces: OnceLock<Store<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>>,
    restricted_namespaces: Remembered,
    service_accounts: Remembered,
    run_policies: Remembered,
}

impl Lookups {
    pub fn set_stores(&self, bindings: Store<SkillBinding>, packages: Store<SkillPackage>) {
        let _ = self.bindings.set(bindings);
        let _ = self.packages.set(packages);
    }

    pub fn set_child_stores(&self, jobs: Store<Job>, network_policies: Store<NetworkPolicy>) {
        let _ = self.jobs.set(jobs);
        let _ = self.network_policies.set(network_policies);
    }

    pub fn set_pod_store(&self, pods: Store<Pod>) {
        let _ = self.pods.set(pods);
    }

    /// The cached pods the Job with UID `job_uid` controls (pod labels are
    /// anyone's to copy; the controlling owner is the Job controller's
    /// word). `None` without a cache.
    pub fn cached_pods_of_job(&self, ns: &str, job_uid: &str) -> Option<Vec<Pod>> {
        let store = self.pods.get()?;
        let owned = |p: &Pod| {
            p.metadata.namespace.as_deref() == Some(ns)
                && p.metadata.owner_references.iter().flatten().any(|o| o.uid == job_uid && o.controller == Some(true))
        };
        Some(store.state().iter().filter(|p| owned(p)).map(|p| Pod::clone(p)).collect())
    }

    pub fn set_namespace_store(&self, namespaces: Store<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>) {
        let _ = self.namespaces.set(namespaces);
    }

    /// A namespace's annotation `key`, per the cache: `None` without a
    /// cache, `Some(None)` when the namespace (or its annotation) is absent.
    pub fn cached_namespace_annotation(&self, ns: &str, key: &str) -> Option<Option<String>> {
        let store = self.namespaces.get()?;
        Some(store.get(&ObjectRef::new(ns)).and_then(|n| n.metadata.annotations.as_ref()?.get(key).cloned()))
    }

    /// Whether the namespace is being deleted, per the cache (`false`
    /// without a cache, or when it is not in it).
    pub fn namespace_terminating(&self, ns: &str) -> bool {
        self.namespaces.get().and_then(|store| store.get(&ObjectRef::new(ns))).is_some_and(|n| n.metadata.deletion_timestamp.is_some())
    }

    /// The cached pods `keep` chooses (empty without a cache).
    pub fn cached_pods_where(&self, keep: impl Fn(&Pod) -> bool) -> Vec<std::sync::Arc<Pod>> {
        let Some(store) = self.pods.get() else { return Vec::new() };
        store.state().into_iter().filter(|p| keep(p)).collect()
    }

    /// The cached pod `name` in `ns`, if any.
    pub fn cached_pod(&self, ns: &str, name: &str) -> Option<Pod> {
        cached(&self.pods, ObjectRef::new(name).within(ns))
    }

    /// Every cached binding (empty without a cache).
    pub fn cached_bindings(&self) -> Vec<std::sync::Arc<SkillBinding>> {
        self.bindings.get().map(|s| s.state()).unwrap_or_default()
    }

    /// The Job `name` in `ns`: the cached copy, else the API's answer (so
    /// "absent" is always the API server's word, never the cache's).
    pub async fn job(&self, client: &Client, ns: &str, name: &str) -> kube::Result<Option<Job>> {
        or_get(cached(&self.jobs, ObjectRef::new(name).within(ns)), Api::namespaced(client.clone(), ns), name).await
    }

    /// The cached Job, if any; without a cache, nothing (callers then create
    /// and treat 409 as "exists").
    pub fn cached_job(&self, ns: &str, name: &str) -> Option<Job> {
        cached(&self.jobs, ObjectRef::new(name).within(ns))
    }

    /// Whether the cache holds the NetworkPolicy (false without a cache).
    pub fn cached_network_policy(&self, ns: &str, name: &str) -> Option<NetworkPolicy> {
        cached(&self.network_policies, ObjectRef::new(name).within(ns))
    }

    /// The binding `name` in `ns`: the cached copy, else the API's answer.
    pub async fn binding(&self, client: &Client, ns: &str, name: &str) -> kube::Result<Option<SkillBinding>> {
        or_get(cached(&self.bindings, ObjectRef::new(name).within(ns)), Api::namespaced(client.clone(), ns), name).await
    }

    /// The cluster-scoped package `name`: the cached copy, else the API's answer.
    pub async fn package(&self, client: &Client, name: &str) -> kube::Result<Option<SkillPackage>> {
        or_get(cached(&self.packages, ObjectRef::new(name)), Api::all(client.clone()), name).await
    }

    /// The other bindings in `ns`, per the cache: a binding that appears,
    /// changes or goes can start or end a skill-name clash with any of them.
    pub fn sibling_bindings(&self, ns: &str, name: &str) -> Vec<ObjectRef<SkillBinding>> {
        let Some(store) = self.bindings.get() else { return Vec::new() };
        store
            .state()
            .iter()
            .filter(|b| b.metadata.namespace.as_deref() == Some(ns) && b.metadata.name.as_deref() != Some(name))
            .map(|b| ObjectRef::from_obj(b.as_ref()))
            .collect()
    }

    /// The bindings of `package`, per the cache: its readiness is theirs.
    pub fn bindings_of_package(&self, package: &str) -> Vec<ObjectRef<SkillBinding>> {
        let Some(store) = self.bindings.get() else { return Vec::new() };
        store.state().iter().filter(|b| b.spec.package == package).map(|b| ObjectRef::from_obj(b.as_ref())).collect()
    }

    /// Every cached package, once the cache holds the API server's first
    /// full list (before that it may hold none of them); `None` without a cache.
    pub async fn all_packages(&self) -> Option<Vec<std::sync::Arc<SkillPackage>>> {
        let packages = self.packages.get()?;
        packages.wait_until_ready().await.ok()?;
        // Whether a deleting package is still bound is read from the bindings cache.
        if let Some(bindings) = self.bindings.get() {
            bindings.wait_until_ready().await.ok()?;
        }
        Some(packages.state())
    }

    /// Whether any binding uses `package`, per the cache (false without one).
    pub fn package_is_bound(&self, package: &str) -> bool {
        !self.bindings_of_package(package).is_empty()
    }

    /// Whether the binding is being deleted, per the cache (false when unknown).
    pub fn binding_is_deleting(&self, ns: &str, name: &str) -> bool {
        cached(&self.bindings, ObjectRef::new(name).within(ns)).is_some_and(|b| b.metadata.deletion_timestamp.is_some())
    }

    pub fn namespace_known_restricted(&self, ns: &str) -> bool {
        self.restricted_namespaces.fresh(ns)
    }

    pub fn remember_restricted(&self, ns: &str) {
        self.restricted_namespaces.remember(ns);
    }

    pub fn service_account_applied(&self, ns: &str) -> bool {
        self.service_accounts.fresh(ns)
    }

    pub fn remember_service_account(&self, ns: &str) {
        self.service_accounts.remember(ns);
    }

    /// Whether this controller applied the namespace's run policies lately
    /// (its watch may not have caught up with the write yet). What they
    /// should say is fixed for the life of the process (its flags), so the
    /// namespace is the key.
    pub fn run_policies_applied(&self, ns: &str) -> bool {
        self.run_policies.fresh(ns)
    }

    pub fn remember_run_policies(&self, ns: &str) {
        self.run_policies.remember(ns);
    }

    pub fn forget_run_policies(&self, ns: &str) {
        self.run_policies.forget(ns);
    }
}

/// The cached copy of `key`, when there is a cache and it holds one.
fn cached<K>(store: &OnceLock<Store<K>>, key: ObjectRef<K>) -> Option<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store.get()?.get(&key).map(|k| (*k).clone())
}

/// `hit`, else the API server's answer for `name`.
async fn or_get<K>(hit: Option<K>, api: Api<K>, name: &str) -> kube::Result<Option<K>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match hit {
        Some(k) => Ok(Some(k)),
        None => api.get_opt(name).await,
    }
}

/// Namespace names seen in some state, each for [`REMEMBER_FOR`].
#[derive(Default)]
struct Remembered(Mutex<HashMap<String, Instant>>);

impl Remembered {
    fn fresh(&self, ns: &str) -> bool {
        self.0.lock().expect("lock poisoned").get(ns).is_some_and(|at| at.elapsed() < REMEMBER_FOR)
    }

    fn forget(&self, ns: &str) {
        self.0.lock().expect("lock poisoned").remove(ns);
    }

    fn remember(&self, ns: &str) {
        let mut map = self.0.lock().expect("lock poisoned");
        // Forget the stale ones now and then, so a long-lived controller
        // over many short-lived namespaces does not grow without bound.
        if map.len() > 1024 {
            map.retain(|_, at| at.elapsed() < REMEMBER_FOR);
        }
        map.insert(ns.to_string(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_entries_expire() {
        let r = Remembered::default();
        assert!(!r.fresh("team"));
        r.remember("team");
        assert!(r.fresh("team"));
        assert!(!r.fresh("other"));
        r.0.lock().unwrap().insert("team".into(), Instant::now() - REMEMBER_FOR);
        assert!(!r.fresh("team"), "an entry older than REMEMBER_FOR was trusted");
    }

    #[test]
    fn stale_entries_are_swept_when_the_map_grows() {
        let r = Remembered::default();
        for i in 0..1025 {
            r.0.lock().unwrap().insert(format!("old-{i}"), Instant::now() - REMEMBER_FOR);
        }
        r.remember("new");
        let map = r.0.lock().unwrap();
        assert_eq!(map.len(), 1);
        assert!(map.contains_key("new"));
    }

    #[test]
    fn without_stores_a_deleting_binding_is_unknown() {
        let l = Lookups::default();
        assert!(!l.binding_is_deleting("team", "b"));
    }
}
