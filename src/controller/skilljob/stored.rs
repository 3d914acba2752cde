//! Runs whose outputs the artifact endpoint has just stored.
//!
//! The launcher writes its result only once nothing of the script is left
//! running, and the upload sidecar stores it at once, so a stored result is
//! the run's end. Waiting instead for the kubelet to report the run
//! container's end costs a relist (about half a second on average, up to
//! one). [`follow`] turns the endpoint's stream of stored outputs into
//! SkillJob wake-ups and leaves a mark ([`super::hints`]) the reconcile
//! reads ([`super::observe`]). Missed events (a reconnect, a lag) only
//! mean the slower path decides that run.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;

use crate::api::job::SkillJob;
use crate::artifacts::OutputsStored;
use crate::controller::builders::job::job_name;
use crate::controller::context::{ArtifactError, Context};

/// The wait before following again after the stream broke, doubled up to the cap.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_CAP: Duration = Duration::from_secs(30);

/// SkillJobs to reconcile, one per announced run of ours, following the
/// endpoint again whenever the stream breaks. Ends only when the store
/// cannot announce anything.
pub fn follow(ctx: Arc<Context>) -> impl Stream<Item = ObjectRef<SkillJob>> + Send + 'static {
    // `pause`: none before the first attempt; after a stream that ended,
    // the first retry's, so an endpoint that ends streams at once is not
    // asked again in a tight loop.
    futures::stream::unfold((ctx, RETRY_FIRST, Duration::ZERO), |(ctx, retry, pause)| async move {
        tokio::time::sleep(pause).await;
        match ctx.artifacts.follow_stored().await {
            Err(ArtifactError::Unsupported(_)) => None,
            Err(err) => {
                tracing::debug!(%err, ?retry, "cannot follow stored outputs; the pods' reported ends decide meanwhile");
                Some((futures::stream::empty().boxed(), (ctx, (retry * 2).min(RETRY_CAP), retry)))
            }
            Ok(events) => {
                let waker = ctx.clone();
                let wakes = events
                    .take_while(|e| {
                        if let Err(err) = e {
                            tracing::debug!(%err, "the stored-outputs stream broke; following again");
                        }
                        std::future::ready(e.is_ok())
                    })
                    .filter_map(move |e| std::future::ready(e.ok().and_then(|stored| wake(&waker, &stored))))
                    .boxed();
                Some((wakes, (ctx, RETRY_FIRST, RETRY_FIRST)))
            }
        }
    })
    .flatten()
}

/// The SkillJob a stored run belongs to, through its Job in the cache (the
/// endpoint knows jobs by UID only), marked for its reconcile.
fn wake(ctx: &Context, stored: &OutputsStored) -> Option<ObjectRef<SkillJob>> {
    let owner = match ctx.lookups.cached_job(&stored.namespace, &job_name(&stored.uid)) {
        Some(job) => job.metadata.owner_references.into_iter().flatten().find(|o| o.kind == "SkillJob" && o.controller == Some(true))?,
        // A run on a warm pod has no Job: its claimed pod names it (the claim's patch).
        None => claimed_pod_owner(ctx, &stored.namespace, &stored.uid)?,
    };
    if owner.uid != stored.uid {
        return None;
    }
    ctx.stored.mark(&stored.namespace, &stored.uid);
    Some(ObjectRef::<SkillJob>::new(&owner.name).within(&stored.namespace))
}

/// The SkillJob owning the warm pod claimed for the run `uid`, per the pod cache.
fn claimed_pod_owner(ctx: &Context, ns: &str, uid: &str) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    use crate::controller::builders::{label_value, LABEL_SKILLJOB_UID};
    let uid_label = label_value(uid);
    let pods = ctx.lookups.cached_pods_where(|p| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SKILLJOB_UID)) == Some(&uid_label)
            && p.metadata.labels.as_ref().is_some_and(|l| l.contains_key(crate::controller::builders::warm::LABEL_WARM_POOL))
    });
    pods.iter()
        .flat_map(|p| p.metadata.owner_references.iter().flatten())
        .find(|o| o.kind == "SkillJob" && o.controller == Some(true) && o.uid == uid)
        .cloned()
}
