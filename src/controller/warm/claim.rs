//! A run takes a warm pod: the pod made the run's by a guarded patch, then
//! the run handed over through the artifact endpoint.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::shape::PoolShape;
use crate::api::job::SkillJob;
use crate::artifacts::sealed::SealedEnv;
use crate::artifacts::{Claim, ClaimInput};
use crate::controller::builders::job::{PackageDelivery, PACKAGE_DIR, SKILL_DIR};
use crate::controller::builders::warm::{LABEL_WARM_BINDING, LABEL_WARM_POOL, LABEL_WARM_STATE, WARM_CLAIMED, WARM_IDLE};
use crate::controller::builders::{label_value, LABEL_EGRESS, LABEL_SKILLJOB, LABEL_SKILLJOB_UID};
use crate::controller::context::{Context, Error, Result};
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

/// What the pod is handed: the run's command, limits and inputs, the
/// run's proxy URL when it is granted egress (see
/// `skilljob::children::proxy_url`; the same for the same run, so a claim
/// handed over again is the same claim), and its granted variables sealed
/// to the pod ([`Claimed::env`]).
pub fn claim_of(sj: &SkillJob, uid: &str, a: &Admission, proxy: Option<String>, env: Option<SealedEnv>) -> Claim {
    let root = if a.delivery == PackageDelivery::Fetched { PACKAGE_DIR } else { SKILL_DIR };
    Claim {
        skilljob_uid: uid.to_string(),
        interpreter: a.interpreter_path.clone(),
        script: format!("{root}/{}", a.script),
        args: a.args.clone(),
        timeout_secs: a.timeout_secs as u32,
        inputs: sj.spec.inputs.iter().map(|i| ClaimInput { path: i.path.clone(), digest: i.digest.clone() }).collect(),
        proxy,
        env,
    }
}

/// A warm pod taken for a run.
#[derive(Debug)]
pub struct Claimed {
    pub pod: Pod,
    /// The run's granted variables sealed to that pod's key (`None`: it is
    /// granted none).
    pub env: Option<SealedEnv>,
}

/// Takes a waiting pod of the run's pool for it, or says why there was
/// none (`Ok(None)`: the run starts cold). A pod this run claimed before
/// (a controller that stopped before recording it) is taken again. A run
/// granted egress (`egress`: it has a proxy URL) gets its pod labelled for
/// the namespace's egress policy in the same guarded patch: the pod had no
/// network beyond the artifact endpoint until this moment. A run granted
/// variables has them read now ([`super::secrets`]) and takes only a pod
/// that published its key, sealed to that key before the pod is taken.
pub async fn claim(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, a: &Admission, egress: bool) -> Result<Option<Claimed>> {
    let started = Instant::now();
    let Some((warm, binding_uid)) = a.warm.as_ref() else { return Ok(None) };
    let idle = std::time::Duration::from_secs(u64::from(warm.idle_timeout_seconds));
    let pool_id = (ns.to_string(), sj.spec.binding.clone());
    let key = PoolShape::of_admission(a).key();
    let uid_label = label_value(uid);
    let mine = |p: &Pod| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.labels().get(LABEL_WARM_STATE).map(String::as_str) == Some(WARM_CLAIMED)
            && p.labels().get(LABEL_SKILLJOB_UID) == Some(&uid_label)
    };
    if let Some(pod) = ctx.lookups.cached_pods_where(mine).into_iter().next() {
        let env = env_again(ctx, ns, &pod.name_any(), uid, a).await?;
        return Ok(Some(Claimed { pod: Pod::clone(&pod), env }));
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
    if candidates.is_empty() {
        miss(ctx, pool_id, "empty");
        return Ok(None);
    }
    // Read only when a pod waits: an empty pool costs no Secret read.
    let values = match granted(ctx, ns, uid, a).await {
        Ok(values) => values,
        Err(()) => {
            miss(ctx, pool_id, "env");
            return Ok(None);
        }
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let mut keyless = Vec::new();
    for pod in candidates {
        // Sealed before the pod is taken: a pod with no key yet (its
        // sidecar publishes it just after its launcher starts) is passed
        // by, not spoiled.
        let env = match &values {
            None => None,
            Some(values) => match sealed_for(ctx, ns, &pod.name_any(), uid, values).await {
                Ok(Some(env)) => Some(env),
                Ok(None) => {
                    keyless.push(pod);
                    continue;
                }
                Err(err) => {
                    tracing::warn!(ns, pod = %pod.name_any(), %err, "no key of the warm pod could be read; trying another");
                    continue;
                }
            },
        };
        if let Some(taken) = take(&pods, sj, uid, &pod, egress).await? {
            return Ok(Some(hit(ctx, pool_id, started, taken, env)));
        }
    }
    // Only pods that have not published their key yet (just made ready: the
    // kubelet says so before the launcher's key is out): worth a moment
    // against the two seconds of a cold start.
    if let (Some(values), Some(pod)) = (&values, keyless.first()) {
        for pause in KEY_GRACE {
            tokio::time::sleep(pause).await;
            if let Some(env) = sealed_for(ctx, ns, &pod.name_any(), uid, values).await.ok().flatten() {
                if let Some(taken) = take(&pods, sj, uid, pod, egress).await? {
                    return Ok(Some(hit(ctx, pool_id, started, taken, Some(env))));
                }
                break;
            }
        }
    }
    miss(ctx, pool_id, "empty");
    Ok(None)
}

/// The pauses before asking a just-ready pod for its key again (about a
/// second in all) before a run granted variables starts cold.
const KEY_GRACE: [std::time::Duration; 6] = {
    use std::time::Duration;
    [
        Duration::from_millis(20),
        Duration::from_millis(40),
        Duration::from_millis(80),
        Duration::from_millis(160),
        Duration::from_millis(320),
        Duration::from_millis(400),
    ]
};

fn hit(ctx: &Context, pool: (String, String), started: Instant, pod: Pod, env: Option<SealedEnv>) -> Claimed {
    ctx.metrics.warm_hits.inc();
    ctx.metrics.warm_claim_seconds.observe(started.elapsed().as_secs_f64());
    ctx.warm.ran(pool, false);
    Claimed { pod, env }
}

/// The run's granted values (`None`: it is granted none), or `Err` when
/// they cannot be had for a claim: logged, and the run starts cold.
async fn granted(ctx: &Context, ns: &str, uid: &str, a: &Admission) -> std::result::Result<Option<Vec<(String, String)>>, ()> {
    if a.env.is_empty() {
        return Ok(None);
    }
    let values = super::secrets::sealable_values(&ctx.client, ns, &a.env).await.map_err(|why| {
        tracing::info!(ns, uid, %why, "a run granted variables starts cold: they cannot be handed to a warm pod");
    })?;
    Ok(Some(values))
}

/// `values` sealed to the key the warm pod `pod` published for the run
/// `uid`; `None` while it has published none.
pub async fn sealed_for(ctx: &Context, ns: &str, pod: &str, uid: &str, values: &[(String, String)]) -> Result<Option<SealedEnv>> {
    let warm = crate::controller::builders::warm::warm_uid_of(pod).ok_or(Error::Missing("a warm pod name"))?;
    let Some(key) = ctx.artifacts.claim_key(ns, &warm).await? else { return Ok(None) };
    // The values passed every rule of a seal (`sealable_values`); what is
    // left to fail is the pod's key.
    let sealed = crate::artifacts::sealed::seal(&key, uid, values).map_err(|e| Error::Warm(format!("sealing to warm pod {pod}: {e}")))?;
    Ok(Some(sealed))
}

/// The sealed variables for a claim handed over again (a new controller
/// does not know whether the last one did): read and sealed anew to the
/// pod's key. An error leaves the hand-over to a later look.
pub async fn env_again(ctx: &Context, ns: &str, pod: &str, uid: &str, a: &Admission) -> Result<Option<SealedEnv>> {
    if a.env.is_empty() {
        return Ok(None);
    }
    let values = super::secrets::sealable_values(&ctx.client, ns, &a.env)
        .await
        .map_err(|why| Error::Warm(format!("the claimed run's variables cannot be read again: {why}")))?;
    let sealed = sealed_for(ctx, ns, pod, uid, &values).await?;
    sealed.map(Some).ok_or_else(|| Error::Warm(format!("warm pod {pod} has published no key")))
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
