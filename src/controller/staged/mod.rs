//! Packages staged once per namespace, not once per run.
//!
//! A fetched package used to be uploaded to the artifact endpoint for every
//! SkillJob (its own tag in the endpoint's registry): in a backlog the
//! registry then worked as hard as the API server. Now a package is staged
//! once for a namespace, under its pinned digest, and every run of that
//! namespace fetches that copy (`fetch --staged-package`; the endpoint
//! serves it only to a run of that namespace, and the pod checks the bytes).
//!
//! Two rules keep a run from ever being sent to fetch a copy that is gone:
//!
//! - what this process staged is remembered for [`REMEMBER_FOR`] and for
//!   one leadership term only (another leader may have swept it since), so
//!   a copy deleted behind its back is staged again within that time;
//! - the sweep deletes a copy only when no Job of that namespace names it
//!   ([`ANNOTATION_PACKAGE_DIGEST`]), both now and at the sweep before
//!   ([`SWEEP_EVERY`] earlier, far beyond any remembered staging of another
//!   process), and it holds [`StagedPackages::gate`] alone while it does:
//!   a run holds it shared from trusting (or making) the copy until its Job
//!   exists, so the sweep's list of Jobs always includes it.

pub mod memory;

use std::collections::BTreeSet;
use std::time::Duration;

use memory::Key;
pub use memory::{StagedPackages, REMEMBER_FOR};

use k8s_openapi::api::batch::v1::Job;

use super::builders::job::ANNOTATION_PACKAGE_DIGEST;
use super::builders::{LABEL_MANAGED_BY, MANAGED_BY};
use super::context::{Context, Result};
use crate::api::package::OciSource;
use crate::artifacts::NamespacePackage;

/// How often the leader sweeps copies no Job names.
pub const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Makes sure the namespace holds the package pinned to `digest`: staged
/// now unless this process staged it a moment ago in this term. Call it
/// holding [`StagedPackages::gate`], and keep holding it until the Job exists.
pub async fn ensure(ctx: &Context, ns: &str, digest: &str, source: &OciSource) -> Result<()> {
    let key = (ns.to_string(), digest.to_string());
    let term = ctx.leadership.term();
    if ctx.staged.fresh(&key, term) {
        return Ok(());
    }
    let fetched = ctx.resolver.fetch(source).await?;
    ctx.artifacts.stage_namespace_package(ns, digest, fetched.archive).await?;
    ctx.staged.remember(key, term);
    Ok(())
}

/// What one sweep deletes, and what it remembers for the next: a copy goes
/// when no Job names it now and none did at the sweep before.
pub fn doomed(staged: &[NamespacePackage], named: &BTreeSet<Key>, unnamed_before: &BTreeSet<Key>) -> (Vec<Key>, BTreeSet<Key>) {
    let unnamed: BTreeSet<Key> = staged.iter().map(|p| (p.namespace.clone(), p.digest.clone())).filter(|k| !named.contains(k)).collect();
    let delete = unnamed.intersection(unnamed_before).cloned().collect();
    (delete, unnamed)
}

/// The `(namespace, digest)` every run Job and every warm pod names, from
/// the API server (not a cache: a Job or pod created a moment ago must
/// count). A warm pod fetches its copy when it starts, which may be long
/// after it was made (an image pull, a full node).
async fn named_by_jobs(ctx: &Context) -> Result<BTreeSet<Key>> {
    let managed = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
    let warm = format!("{managed},{}", super::builders::warm::LABEL_WARM_POOL);
    let mut named = named_by::<Job>(&ctx.client, &managed, LIST_PAGE).await?;
    named.extend(named_by::<k8s_openapi::api::core::v1::Pod>(&ctx.client, &warm, LIST_PAGE).await?);
    Ok(named)
}

/// How many objects one list request of the sweep asks for.
pub const LIST_PAGE: u32 = 500;

/// The `(namespace, digest)` the objects of kind `K` matching `selector`
/// name, listed `page` at a time and read lean ([`super::lean_list`]): a
/// Job's managedFields made the sweep at a backlog's start the controller's
/// largest allocation.
pub async fn named_by<K>(client: &kube::Client, selector: &str, page: u32) -> Result<BTreeSet<Key>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let named = super::lean_list::list_metadata::<K, _>(client, Some(selector), page, named).await?;
    Ok(named.into_iter().collect())
}

/// The staged copy an object names, if it names one.
fn named(meta: super::lean_list::Meta) -> Option<Key> {
    Some((meta.namespace?, meta.annotations?.remove(ANNOTATION_PACKAGE_DIGEST)?))
}

/// One sweep: deletes the copies no Job named now nor at the last sweep,
/// returns how many went and the unnamed ones to pass to the next sweep.
pub async fn sweep(ctx: &Context, unnamed_before: &BTreeSet<Key>) -> Result<(usize, BTreeSet<Key>)> {
    let _alone = ctx.staged.gate.write().await;
    let staged = ctx.artifacts.namespace_packages().await?;
    let named = named_by_jobs(ctx).await?;
    let (delete, unnamed) = doomed(&staged, &named, unnamed_before);
    let mut gone = 0;
    for key in &delete {
        ctx.staged.forget(key);
        if ctx.artifacts.delete_namespace_package(&key.0, &key.1).await? {
            gone += 1;
        }
    }
    Ok((gone, unnamed))
}

/// Sweeps every [`SWEEP_EVERY`] while this replica leads, until `stop`.
/// A failed sweep is logged and tried at the next tick (nothing is lost by
/// waiting: a copy only costs space).
pub async fn sweep_every(ctx: std::sync::Arc<Context>, stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut unnamed = BTreeSet::new();
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        if !ctx.leadership.is_leading() {
            // A new leader starts its grace from nothing.
            unnamed.clear();
            continue;
        }
        match sweep(&ctx, &unnamed).await {
            Ok((gone, next)) => {
                if gone > 0 {
                    tracing::info!(gone, "staged packages no run names deleted");
                }
                unnamed = next;
            }
            Err(err) => tracing::warn!(error = %err, "sweeping staged packages failed; trying again at the next sweep"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_names_a_copy_by_its_namespace_and_digest_annotation() {
        let meta = |ns: Option<&str>, annotations: Option<&[(&str, &str)]>| super::super::lean_list::Meta {
            namespace: ns.map(String::from),
            annotations: annotations.map(|a| a.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        };
        let digest = Some(&[("other", "x"), (ANNOTATION_PACKAGE_DIGEST, "sha256:aa")][..]);
        assert_eq!(named(meta(Some("team"), digest)), Some(("team".to_string(), "sha256:aa".to_string())));
        assert_eq!(named(meta(Some("team"), Some(&[("other", "x")]))), None);
        assert_eq!(named(meta(Some("team"), None)), None);
        assert_eq!(named(meta(None, digest)), None, "a cluster-wide object names no namespace's copy");
    }

    fn key(ns: &str, d: &str) -> Key {
        (ns.to_string(), d.to_string())
    }

    fn staged(keys: &[Key]) -> Vec<NamespacePackage> {
        keys.iter().map(|(n, d)| NamespacePackage { namespace: n.clone(), digest: d.clone() }).collect()
    }

    #[test]
    fn a_copy_goes_only_when_unnamed_at_two_sweeps_in_a_row() {
        let (a, b, c) = (key("team", "sha256:a"), key("team", "sha256:b"), key("other", "sha256:a"));
        let all = staged(&[a.clone(), b.clone(), c.clone()]);
        let named = BTreeSet::from([b.clone()]);
        // First sweep: nothing was seen unnamed before, so nothing goes.
        let (delete, unnamed) = doomed(&all, &named, &BTreeSet::new());
        assert!(delete.is_empty(), "a copy went at its first unnamed sweep: {delete:?}");
        assert_eq!(unnamed, BTreeSet::from([a.clone(), c.clone()]));
        // Second sweep: `a` of `other` is named now (a run started meanwhile).
        let named = BTreeSet::from([c.clone()]);
        let (delete, unnamed) = doomed(&all, &named, &unnamed);
        assert_eq!(delete, vec![a.clone()], "the namespace is part of the key: another namespace's run keeps only its own copy");
        assert_eq!(unnamed, BTreeSet::from([a, b]));
    }
}
