//! A run takes a warm pod: the pod made the run's by a guarded patch, then
//! the run handed over through the artifact endpoint.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::shape::PoolShape;
use crate::api::job::SkillJob;
use crate::artifacts::{Claim, ClaimInput};
use crate::controller::builders::job::{PackageDelivery, PACKAGE_DIR, SKILL_DIR};
use crate::controller::builders::warm::{LABEL_WARM_BINDING, LABEL_WARM_POOL, LABEL_WARM_STATE, WARM_CLAIMED, WARM_IDLE};
use crate::controller::builders::{label_value, LABEL_EGRESS, LABEL_SKILLJOB, LABEL_SKILLJOB_UID};
use crate::controller::context::{Context, Result};
use crate::controller::decide::Admission;

/// Whether a pod waits for a run: still idle, not going, and every
/// container up (fetch done, the sidecar polling, the launcher waiting).
pub fn waiting(pod: &Pod) -> bool {
    let idle = pod.labels().get(LABEL_WARM_STATE).map(String::as_str) == Some(WARM_IDLE);
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    idle && running && ready && pod.metadata.deletion_timestamp.is_none()
}

/// Whether the pod was made more than `limit` ago: past its pool's idle
/// timeout it is never claimed (its deadline is the timeout plus a whole
/// run) and the pool replaces it.
pub fn older_than(pod: &Pod, limit: std::time::Duration) -> bool {
    pod.metadata.creation_timestamp.as_ref().map(crate::api::conditions::age).is_some_and(|age| age >= limit)
}

/// What the pod is handed: the run's command, limits and inputs, and the
/// run's proxy URL when it is granted egress (see
/// `skilljob::children::proxy_url`; the same for the same run, so a claim
/// handed over again is the same claim).
pub fn claim_of(sj: &SkillJob, uid: &str, a: &Admission, proxy: Option<String>) -> Claim {
    let root = if a.delivery == PackageDelivery::Fetched { PACKAGE_DIR } else { SKILL_DIR };
    Claim {
        skilljob_uid: uid.to_string(),
        interpreter: a.interpreter_path.clone(),
        script: format!("{root}/{}", a.script),
        args: a.args.clone(),
        timeout_secs: a.timeout_secs as u32,
        inputs: sj.spec.inputs.iter().map(|i| ClaimInput { path: i.path.clone(), digest: i.digest.clone() }).collect(),
        proxy,
    }
}

/// Takes a waiting pod of the run's pool for it, or says why there was
/// none (`Ok(None)`: the run starts cold). A pod this run claimed before
/// (a controller that stopped before recording it) is taken again. A run
/// granted egress (`egress`: it has a proxy URL) gets its pod labelled for
/// the namespace's egress policy in the same guarded patch: the pod had no
/// network beyond the artifact endpoint until this moment.
pub async fn claim(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, a: &Admission, egress: bool) -> Result<Option<Pod>> {
    let started = Instant::now();
    let Some((warm, binding_uid)) = a.warm.as_ref() else { return Ok(None) };
    let idle = std::time::Duration::from_secs(u64::from(warm.idle_timeout_seconds));
    let pool_id = (ns.to_string(), sj.spec.binding.clone());
    let key = match PoolShape::of_admission(a) {
        Ok(shape) => shape.key(),
        Err(why) => {
            miss(ctx, pool_id, why.label());
            return Ok(None);
        }
    };
    let uid_label = label_value(uid);
    let mine = |p: &Pod| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.labels().get(LABEL_WARM_STATE).map(String::as_str) == Some(WARM_CLAIMED)
            && p.labels().get(LABEL_SKILLJOB_UID) == Some(&uid_label)
    };
    if let Some(pod) = ctx.lookups.cached_pods_where(mine).into_iter().next() {
        return Ok(Some(Pod::clone(&pod)));
    }
    let ours = |p: &Pod| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.labels().get(LABEL_WARM_POOL) == Some(&key)
            && p.labels().get(LABEL_WARM_BINDING) == Some(binding_uid)
            && waiting(p)
            && !older_than(p, idle)
    };
    let mut candidates = ctx.lookups.cached_pods_where(ours);
    // The longest-waiting first: it is the nearest to its deadline.
    candidates.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for pod in candidates {
        if let Some(taken) = take(&pods, sj, uid, &pod, egress).await? {
            ctx.metrics.warm_hits.inc();
            ctx.metrics.warm_claim_seconds.observe(started.elapsed().as_secs_f64());
            ctx.warm.ran(pool_id, false);
            return Ok(Some(taken));
        }
    }
    miss(ctx, pool_id, "empty");
    Ok(None)
}

fn miss(ctx: &Context, pool: (String, String), why: &str) {
    ctx.metrics.warm_misses.get_or_create(&crate::controller::metrics::KindLabel { kind: why.into() }).inc();
    ctx.warm.ran(pool, why == "empty");
}

/// The claim patch: the pod made the run's (its labels, its owner), and
/// with `egress` selected by the egress policy.
fn claim_patch(sj: &SkillJob, uid: &str, version: &str, egress: bool) -> serde_json::Value {
    let owner = crate::controller::builders::job::controller_owner(&sj.controller_owner_ref(&()).unwrap_or_default());
    let mut labels = json!({
        LABEL_WARM_STATE: WARM_CLAIMED,
        LABEL_SKILLJOB_UID: label_value(uid),
        LABEL_SKILLJOB: label_value(&sj.name_any()),
    });
    if egress {
        labels[LABEL_EGRESS] = json!("true");
    }
    json!({ "metadata": { "resourceVersion": version, "labels": labels, "ownerReferences": [owner] } })
}

/// The guarded patch: applied only at the resourceVersion the pod had when
/// it was seen waiting (a stale cache: read it again once). `None`: another
/// run took it, or it changed (deleted, not ready any more).
async fn take(pods: &Api<Pod>, sj: &SkillJob, uid: &str, seen: &Pod, egress: bool) -> Result<Option<Pod>> {
    let mut pod = seen.clone();
    for _ in 0..2 {
        let Some(version) = pod.resource_version() else { return Ok(None) };
        let patch = claim_patch(sj, uid, &version, egress);
        match pods.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(taken) => return Ok(Some(taken)),
            Err(kube::Error::Api(e)) if e.code == 409 => match pods.get_opt(&pod.name_any()).await? {
                Some(fresh) if waiting(&fresh) => pod = fresh,
                _ => return Ok(None),
            },
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::job::SkillJobSpec;

    #[test]
    fn the_claim_patch_is_guarded_and_labels_egress_only_for_a_run_granted_it() {
        let mut sj = SkillJob::new(
            "run-1",
            SkillJobSpec { binding: "b".into(), script: "s.py".into(), args: vec![], inputs: vec![], timeout_seconds: None },
        );
        let uid = "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60";
        sj.metadata.namespace = Some("team".into());
        sj.metadata.uid = Some(uid.into());
        let plain = claim_patch(&sj, uid, "41", false);
        assert_eq!(plain["metadata"]["resourceVersion"], "41", "applied only at the version seen waiting");
        let labels = &plain["metadata"]["labels"];
        assert_eq!((labels[LABEL_WARM_STATE].as_str(), labels[LABEL_SKILLJOB_UID].as_str()), (Some(WARM_CLAIMED), Some(uid)));
        assert!(labels.get(LABEL_EGRESS).is_none(), "no egress grant, no egress label: {labels}");
        assert_eq!(plain["metadata"]["ownerReferences"][0]["uid"], uid);
        assert_eq!(plain["metadata"]["ownerReferences"][0]["controller"], true);
        let egress = claim_patch(&sj, uid, "41", true);
        assert_eq!(egress["metadata"]["labels"][LABEL_EGRESS], "true");
    }
}
