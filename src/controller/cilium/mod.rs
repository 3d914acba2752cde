//! Keeping the egress proxy's CiliumNetworkPolicy
//! ([`super::builders::cilium`]) in step with the SkillPackages, when
//! `--egress-cilium-fqdn-policy` is on (off by default).
//!
//! The policy allows the union of every package's `runtime.allowedEgress`
//! (a profile entry that does not parse contributes nothing, as everywhere).
//! The package reconciler calls [`sync`] on every reconcile and the
//! controller once at start; the rendered object is applied (server-side,
//! under the controller's field manager) only when it differs from the last
//! one applied, or when that was [`CILIUM_REAPPLY`] ago, so a reconcile
//! that changes nothing costs a hash. One lock serialises the applies: two
//! reconciles never race an older union over a newer one.
//!
//! A package being deleted still counts while bindings use it (its deletion
//! waits for them, and their runs may still be going); once it is free its
//! hosts leave the policy, in its own last reconcile (a deletion wakes no
//! reconcile of its own).
//!
//! Where it goes wrong (nothing here fails a package's reconcile: the
//! package is fine, and the proxy still enforces every job's allowlist):
//! - The resource is not served (no Cilium, 404): logged once at WARN with
//!   what to do, shown by the metric `skill_operator_egress_cilium_policy{state="crd_missing"}`,
//!   tried again after [`CILIUM_CRD_RECHECK`]. The metric and the log, not a
//!   package condition: it is a fact about the cluster that the admin who
//!   turned the flag on can change and package authors cannot, and it would
//!   otherwise be written into every package's status.
//! - The union cannot be rendered (more than the limit): the DNS-only policy
//!   is applied instead (the proxy reaches nothing; fail closed), logged at
//!   ERROR and shown as `state="invalid"`.
//! - Any other API error: WARN, `state="failed"`, tried again within 30 s.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use sha2::{Digest, Sha256};

use super::builders::cilium::{build_cilium_policy, CiliumParams, API_VERSION, KIND, PLURAL};
use super::context::{Context, EgressProxyTarget, MANAGER};
use crate::api::package::SkillPackage;
use crate::core::limits::{CILIUM_CRD_RECHECK, CILIUM_REAPPLY};
use crate::egress::allowlist::Allowlist;

pub mod state;
pub use state::{CiliumPolicyConfig, CiliumSync, PolicyState, DEFAULT_NAME};

/// How soon a package reconcile comes back after an API error here.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(30);
/// How long a sync waits for the package cache's first full list.
const CACHE_WAIT: Duration = Duration::from_secs(30);

/// The union of the allowed hosts of every package that counts: not being
/// deleted, or being deleted while still bound; never one that `left`.
pub fn allowed_union<'a>(
    packages: impl IntoIterator<Item = &'a SkillPackage>,
    still_bound: impl Fn(&str) -> bool,
    left: &HashSet<String>,
) -> Allowlist {
    let mut entries = Vec::new();
    for pkg in packages {
        let name = pkg.metadata.name.as_deref().unwrap_or_default();
        if left.contains(name) || (pkg.metadata.deletion_timestamp.is_some() && !still_bound(name)) {
            continue;
        }
        if let Ok(list) = super::egress::allowed(pkg.spec.runtime.as_ref()) {
            entries.extend(list.entries().iter().cloned());
        }
    }
    Allowlist::new(entries)
}

fn api_resource() -> ApiResource {
    ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

async fn packages(ctx: &Context) -> Result<Vec<Arc<SkillPackage>>, String> {
    match tokio::time::timeout(CACHE_WAIT, ctx.lookups.all_packages()).await {
        Ok(Some(list)) => Ok(list),
        Ok(None) => {
            // No cache (a reconciler called on its own): ask the API server.
            let mut params = ListParams::default();
            if let Some(s) = &ctx.config.selector {
                params = params.labels(s);
            }
            let list = Api::<SkillPackage>::all(ctx.client.clone()).list(&params).await.map_err(|e| e.to_string())?;
            Ok(list.items.into_iter().map(Arc::new).collect())
        }
        Err(_) => Err(format!("the SkillPackage cache held no full list after {CACHE_WAIT:?}")),
    }
}

fn params(target: &EgressProxyTarget, config: &CiliumPolicyConfig, allowlist: Allowlist) -> CiliumParams {
    CiliumParams {
        name: config.name.clone(),
        namespace: target.namespace.clone(),
        proxy_pod_labels: target.pod_labels.clone(),
        dns_namespace: config.dns_namespace.clone(),
        dns_pod_labels: config.dns_pod_labels.clone(),
        allowlist,
    }
}

/// Bring the policy in line with the packages (see the module docs).
/// `leaving`: a package whose deletion goes ahead now. Returns how soon the
/// caller should come back, when sooner than usual.
pub async fn sync(ctx: &Context, leaving: Option<&str>) -> Option<Duration> {
    let target = ctx.config.egress_proxy.as_ref()?;
    let config = target.cilium_fqdn_policy.as_ref()?;
    // Held from the read of the packages to the apply: a sync that read
    // them earlier (a package still there) must not apply after one that
    // read them later (the package leaving).
    let mut state = ctx.cilium.state.lock().await;
    let packages = match packages(ctx).await {
        Ok(p) => p,
        Err(error) => {
            tracing::warn!(%error, "the egress proxy's CiliumNetworkPolicy was not updated: the packages could not be read");
            return Some(RETRY_AFTER_ERROR);
        }
    };
    // A package that left stays out while a cache that lags still shows it.
    if let Some(name) = leaving {
        state.leaving.insert(name.to_string());
    }
    state.leaving.retain(|name| packages.iter().any(|p| p.metadata.name.as_deref() == Some(name.as_str())));
    let union = allowed_union(packages.iter().map(|p| p.as_ref()), |name| ctx.lookups.package_is_bound(name), &state.leaving);
    let hosts = union.entries().len();
    let (policy, render_error) = match build_cilium_policy(&params(target, config, union)) {
        Ok(policy) => (policy, None),
        Err(error) => match build_cilium_policy(&params(target, config, Allowlist::default())) {
            Ok(closed) => (closed, Some(error.to_string())),
            Err(fatal) => {
                // The flags themselves are wrong (a label, a name): nothing can be applied.
                tracing::error!(error = %fatal, "the egress proxy's CiliumNetworkPolicy cannot be built: fix the --egress-cilium-* / --egress-proxy-* flags");
                ctx.metrics.cilium_state(PolicyState::Invalid, 0);
                return None;
            }
        },
    };
    let body = match serde_json::to_value(&policy) {
        Ok(v) => v,
        Err(error) => {
            tracing::error!(%error, "the egress proxy's CiliumNetworkPolicy does not encode");
            return None;
        }
    };
    let digest: [u8; 32] = Sha256::digest(body.to_string().as_bytes()).into();

    let now = Instant::now();
    if state.applied.is_some_and(|(d, at)| d == digest && now.duration_since(at) < CILIUM_REAPPLY) {
        return None;
    }
    if state.missing_until.is_some_and(|(_, until)| now < until) {
        return None;
    }
    if state.render_error != render_error {
        if let Some(error) = &render_error {
            tracing::error!(%error, "the egress proxy's CiliumNetworkPolicy allows DNS only until this is fixed (fail closed)");
        }
        state.render_error = render_error.clone();
    }
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &target.namespace, &api_resource());
    let applied = api.patch(&config.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body)).await;
    let ok_state = if render_error.is_some() { PolicyState::Invalid } else { PolicyState::Applied };
    match applied {
        Ok(_) => {
            if state.missing_until.take().is_some() {
                tracing::info!(name = %config.name, namespace = %target.namespace, "the egress proxy's CiliumNetworkPolicy is served now and applied");
            }
            tracing::debug!(hosts, "the egress proxy's CiliumNetworkPolicy applied");
            state.applied = Some((digest, now));
            ctx.metrics.cilium_state(ok_state, if render_error.is_some() { 0 } else { hosts });
            None
        }
        // An API group that is not served answers a plain-text 404, whose
        // reason kube cannot parse: the code is what tells.
        Err(kube::Error::Api(status)) if status.is_not_found() || status.code == 404 => {
            let namespace_missing = status.details.as_ref().is_some_and(|d| d.kind == "namespaces");
            let missing = if namespace_missing { PolicyState::NamespaceMissing } else { PolicyState::CrdMissing };
            let before = state.missing_until.map(|(s, _)| s);
            state.missing_until = Some((missing, now + CILIUM_CRD_RECHECK));
            state.applied = None;
            if before != Some(missing) {
                if namespace_missing {
                    tracing::warn!(namespace = %target.namespace, "the egress proxy's namespace does not exist: its CiliumNetworkPolicy is not applied (checked again every {CILIUM_CRD_RECHECK:?})");
                } else {
                    tracing::warn!(
                        "this cluster does not serve CiliumNetworkPolicy (cilium.io/v2): the egress proxy's toFQDNs policy is not applied. Install Cilium with its DNS proxy, or turn off --egress-cilium-fqdn-policy (chart: egressProxy.ciliumFqdnPolicy=false); checked again every {CILIUM_CRD_RECHECK:?}"
                    );
                }
            }
            ctx.metrics.cilium_state(missing, 0);
            None
        }
        Err(error) => {
            tracing::warn!(%error, name = %config.name, namespace = %target.namespace, "the egress proxy's CiliumNetworkPolicy could not be applied; trying again");
            ctx.metrics.cilium_state(PolicyState::Failed, 0);
            Some(RETRY_AFTER_ERROR)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn package(name: &str, allowed: &[&str], deleting: bool) -> SkillPackage {
        let mut p = super::super::egress::package_allowing(name, allowed);
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        p
    }

    fn texts(list: &Allowlist) -> Vec<String> {
        super::super::egress::texts(list)
    }

    #[test]
    fn the_union_merges_ports_and_skips_what_does_not_parse() {
        let a = package("a", &["api.example.com", "*.cdn.example.net:443,8443"], false);
        let b = package("b", &["api.example.com:8080", "203.0.113.7:22"], false);
        let broken = package("c", &["api.example.com", "*"], false);
        let union = allowed_union([&a, &b, &broken], |_| false, &HashSet::new());
        assert_eq!(texts(&union), ["api.example.com:443,8080", "*.cdn.example.net:443,8443", "203.0.113.7:22"]);
    }

    #[test]
    fn a_package_leaving_or_deleted_and_unbound_does_not_count() {
        let a = package("a", &["a.example.com"], false);
        let gone = package("b", &["b.example.com"], true);
        let held = package("c", &["c.example.com"], true);
        let union = allowed_union([&a, &gone, &held], |name| name == "c", &HashSet::new());
        assert_eq!(texts(&union), ["a.example.com:443", "c.example.com:443"]);
        let union = allowed_union([&a, &gone, &held], |name| name == "c", &HashSet::from(["a".to_string()]));
        assert_eq!(texts(&union), ["c.example.com:443"]);
        assert!(allowed_union([&gone], |_| false, &HashSet::new()).is_empty());
    }
}
