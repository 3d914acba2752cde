//! What the proxy's CiliumNetworkPolicy sync keeps between reconciles,
//! apart from the sync itself so that the reconcilers' shared context can
//! hold it without depending on the sync.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

/// Default name of the object (the chart names it after the release).
pub const DEFAULT_NAME: &str = "skill-operator-egress-proxy-fqdn";

/// The flag's settings (the proxy pods come from [`crate::controller::context::EgressProxyTarget`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumPolicyConfig {
    /// The object's name, in the proxy's namespace.
    pub name: String,
    /// The cluster DNS pods the proxy's resolver asks.
    pub dns_namespace: String,
    pub dns_pod_labels: BTreeMap<String, String>,
}

impl Default for CiliumPolicyConfig {
    fn default() -> Self {
        CiliumPolicyConfig {
            name: DEFAULT_NAME.into(),
            dns_namespace: "kube-system".into(),
            dns_pod_labels: BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())]),
        }
    }
}

/// What the last attempt left; the metric's `state` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyState {
    Applied,
    CrdMissing,
    NamespaceMissing,
    Invalid,
    Failed,
}

impl PolicyState {
    pub const ALL: [PolicyState; 5] =
        [PolicyState::Applied, PolicyState::CrdMissing, PolicyState::NamespaceMissing, PolicyState::Invalid, PolicyState::Failed];

    pub fn label(self) -> &'static str {
        match self {
            PolicyState::Applied => "applied",
            PolicyState::CrdMissing => "crd_missing",
            PolicyState::NamespaceMissing => "namespace_missing",
            PolicyState::Invalid => "invalid",
            PolicyState::Failed => "failed",
        }
    }
}

/// The last applied object and the last trouble, shared by every reconcile.
#[derive(Default)]
pub struct CiliumSync {
    pub(super) state: tokio::sync::Mutex<SyncState>,
}

#[derive(Default)]
pub(super) struct SyncState {
    /// Digest of the last object applied, and when.
    pub(super) applied: Option<([u8; 32], Instant)>,
    /// The resource (or namespace) was not there: not tried again before this.
    pub(super) missing_until: Option<(PolicyState, Instant)>,
    /// The last render error said (said again only when it changes).
    pub(super) render_error: Option<String>,
    /// Packages whose deletion went ahead, kept out of the union until the
    /// package cache no longer shows them.
    pub(super) leaving: HashSet<String>,
}
