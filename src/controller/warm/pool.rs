//! The leader keeps every pool at its size (see the module above for the rules).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Resource, ResourceExt};

use super::claim::waiting;
use super::shape::PoolShape;
use crate::api::binding::SkillBinding;
use crate::controller::builders::job::{JobParams, PackageDelivery, RunResources, MAX_TIMEOUT_SECS};
use crate::controller::builders::warm::{build_warm_pod, WarmPodParams, LABEL_WARM_BINDING, LABEL_WARM_POOL, LABEL_WARM_STATE, WARM_IDLE};
use crate::controller::context::{Context, Result};
use crate::controller::metrics::StateLabel;

/// How often the pools are looked at without a wake-up (a claim, a miss).
pub const MAINTAIN_EVERY: Duration = Duration::from_secs(2);
/// The Namespace annotation that sets its warm-pod budget.
pub const BUDGET_ANNOTATION: &str = "skill-operator.dev/warm-pods";
/// How long a namespace's budget is trusted before it is read again.
const BUDGET_TTL: Duration = Duration::from_secs(30);
const _: () = assert!(crate::core::limits::WARM_POOL_MAX == 20, "the CRD's bounds on spec.warm say 20");

/// Keeps the pools until `stop`, while this replica leads.
pub async fn maintain_every(ctx: Arc<Context>, stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut budgets: HashMap<String, (Instant, u32)> = HashMap::new();
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ctx.warm.woken() => {}
            _ = tokio::time::sleep(MAINTAIN_EVERY) => {}
        }
        if !ctx.leadership.is_leading() {
            continue;
        }
        if let Err(err) = maintain(&ctx, &mut budgets).await {
            tracing::warn!(error = %err, "keeping the warm pools failed; trying again shortly");
        }
    }
}

/// What a pod of a pool is, for the pool's count.
fn counts(pods: &[Arc<Pod>]) -> (u32, u32) {
    let idle: Vec<_> = pods.iter().filter(|p| p.labels().get(LABEL_WARM_STATE).map(String::as_str) == Some(WARM_IDLE)).collect();
    let ready = idle.iter().filter(|p| waiting(p)).count() as u32;
    (ready, idle.len() as u32 - ready)
}

/// Whether the pool is still asked for: its binding exists and keeps
/// `spec.warm`. A pool removed and added again is a new pool (kept full
/// for one idle timeout from then), not one idle since its last run.
fn pooled(bindings: &[Arc<SkillBinding>], (ns, name): &super::memory::PoolId) -> bool {
    bindings.iter().any(|b| b.spec.warm.is_some() && b.namespace().as_deref() == Some(ns.as_str()) && &b.name_any() == name)
}

fn ended(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"))
}

/// One pass over every pool.
async fn maintain(ctx: &Context, budgets: &mut HashMap<String, (Instant, u32)>) -> Result<()> {
    let warm_pods = ctx.lookups.cached_pods_where(|p| p.labels().contains_key(LABEL_WARM_POOL));
    let bindings = ctx.lookups.cached_bindings();
    let (ready, starting) = counts(&warm_pods);
    ctx.metrics.warm_pods.get_or_create(&StateLabel { state: "waiting".into() }).set(i64::from(ready));
    ctx.metrics.warm_pods.get_or_create(&StateLabel { state: "starting".into() }).set(i64::from(starting));

    // Waiting pods by binding UID; the namespace's waiting pods, for its budget.
    let mut by_binding: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
    let mut in_namespace: BTreeMap<String, u32> = BTreeMap::new();
    for pod in &warm_pods {
        if pod.labels().get(LABEL_WARM_STATE).map(String::as_str) != Some(WARM_IDLE) {
            continue;
        }
        if let Some(b) = pod.labels().get(LABEL_WARM_BINDING) {
            by_binding.entry(b.clone()).or_default().push(pod.clone());
        }
        *in_namespace.entry(pod.namespace().unwrap_or_default()).or_default() += 1;
    }
    let live: std::collections::BTreeSet<String> = bindings.iter().filter_map(|b| b.metadata.uid.clone()).collect();
    ctx.warm.retain(|id| pooled(&bindings, id));

    // Pods of bindings that are gone (the garbage collector takes them too;
    // this is at once, and counts for budgets now).
    for (binding, pods) in &by_binding {
        if !live.contains(binding) {
            for pod in pods {
                delete(ctx, pod).await?;
            }
        }
    }

    for binding in bindings.iter() {
        let Some(warm) = binding.spec.warm.clone() else {
            // `warm` removed: its pods go.
            for pod in by_binding.get(binding.metadata.uid.as_deref().unwrap_or_default()).into_iter().flatten() {
                delete(ctx, pod).await?;
            }
            continue;
        };
        let ns = binding.namespace().unwrap_or_default();
        let uid = binding.metadata.uid.clone().unwrap_or_default();
        let pods = by_binding.get(&uid).cloned().unwrap_or_default();
        let shape = match ctx.lookups.package(&ctx.client, &binding.spec.package).await? {
            Some(package) if binding.metadata.deletion_timestamp.is_none() => PoolShape::of_binding(binding, &package),
            _ => Err(super::shape::NotWarm::NotReady),
        };
        let key = shape.as_ref().ok().map(PoolShape::key);
        // Another shape (a new package digest, profile, image), ended, or waiting
        // longer than its idle timeout (replaced, if the pool still wants one):
        // so a claimed pod always has a whole run's time left before its deadline.
        let idle = Duration::from_secs(u64::from(warm.idle_timeout_seconds));
        let mut kept = Vec::new();
        for pod in pods {
            let stale = key.as_ref() != pod.labels().get(LABEL_WARM_POOL);
            let expired = super::claim::older_than(&pod, idle);
            if stale || ended(&pod) || expired {
                delete(ctx, &pod).await?;
                *in_namespace.entry(ns.clone()).or_default() -= 1;
            } else {
                kept.push(pod);
            }
        }
        let Ok(shape) = shape else { continue };
        let target = ctx.warm.target(&(ns.clone(), binding.name_any()), warm.min, warm.max, idle);
        let have = kept.len() as u32;
        if have > target {
            // The newest go first: the oldest are the ones already up.
            kept.sort_by(|a, b| b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp));
            for pod in kept.iter().take((have - target) as usize) {
                delete(ctx, pod).await?;
                *in_namespace.entry(ns.clone()).or_default() -= 1;
            }
            continue;
        }
        let budget = budget(ctx, &ns, budgets).await?;
        let used = in_namespace.get(&ns).copied().unwrap_or(0);
        let room = budget.saturating_sub(used);
        let make = (target - have).min(room);
        if make < target - have {
            tracing::debug!(namespace = %ns, binding = %binding.name_any(), budget, used, "the namespace's warm-pod budget holds this pool back");
        }
        for _ in 0..make {
            create(ctx, binding, &ns, &shape, &warm).await?;
            *in_namespace.entry(ns.clone()).or_default() += 1;
        }
    }
    Ok(())
}

/// The namespace's warm-pod budget: its annotation, else the controller's
/// flag. Read from the controller's Namespace cache (a change counts at
/// the next pass); without one (tests), asked of the API server and kept
/// for [`BUDGET_TTL`].
async fn budget(ctx: &Context, ns: &str, budgets: &mut HashMap<String, (Instant, u32)>) -> Result<u32> {
    let annotated = match ctx.lookups.cached_namespace_annotation(ns, BUDGET_ANNOTATION) {
        Some(value) => value,
        None => {
            if let Some((at, n)) = budgets.get(ns) {
                if at.elapsed() < BUDGET_TTL {
                    return Ok(*n);
                }
            }
            let namespace = Api::<Namespace>::all(ctx.client.clone()).get_opt(ns).await?;
            let value = namespace.as_ref().and_then(|n| n.annotations().get(BUDGET_ANNOTATION).cloned());
            let n = parse_budget(ns, value.as_deref(), ctx.config.warm_budget);
            budgets.insert(ns.to_string(), (Instant::now(), n));
            return Ok(n);
        }
    };
    Ok(parse_budget(ns, annotated.as_deref(), ctx.config.warm_budget))
}

/// The annotation's number; absent: `default`; anything else: 0 (fail
/// closed: a budget nobody can read allows nothing).
fn parse_budget(ns: &str, value: Option<&str>, default: u32) -> u32 {
    match value.map(|v| v.trim().parse::<u32>()) {
        None => default,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            tracing::warn!(namespace = ns, annotation = BUDGET_ANNOTATION, "the warm-pod budget is not a number; no warm pods there");
            0
        }
    }
}

async fn delete(ctx: &Context, pod: &Pod) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    match api.delete(&pod.name_any(), &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// One new pod for the pool: its package staged for the namespace and the
/// namespace's run children there first, as for a cold run.
async fn create(ctx: &Context, binding: &SkillBinding, ns: &str, shape: &PoolShape, warm: &crate::api::binding::WarmSpec) -> Result<()> {
    let warm_uid = format!("warm-{}", uuid::Uuid::new_v4().simple());
    let staged = (shape.delivery == PackageDelivery::Fetched).then(|| shape.digest.clone());
    let params = WarmPodParams {
        shape: JobParams {
            skilljob_name: binding.name_any(),
            namespace: ns.to_string(),
            skilljob_uid: warm_uid.clone(),
            run_image: shape.image.clone(),
            operator_image: ctx.config.operator_image.clone(),
            operator_pull_policy: ctx.config.operator_image_pull_policy.clone(),
            timeout_secs: MAX_TIMEOUT_SECS,
            resources: RunResources {
                cpu: shape.cpu.clone(),
                memory: shape.memory.clone(),
                ephemeral_storage: shape.ephemeral_storage.clone(),
            },
            artifact_endpoint: ctx.config.artifact_endpoint.clone(),
            service_account: crate::artifacts::RUN_SERVICE_ACCOUNT.into(),
            host_aliases: ctx.config.host_aliases.clone(),
            delivery: shape.delivery.clone(),
            staged_package: staged.clone(),
            ..JobParams::default()
        },
        warm_uid,
        pool: shape.key(),
        binding: binding.controller_owner_ref(&()).unwrap_or_default(),
        idle_timeout_secs: warm.idle_timeout_seconds,
    };
    if let Err(err) = params.validate() {
        tracing::warn!(namespace = ns, binding = %binding.name_any(), %err, "a warm pod cannot be built; the pool stays empty");
        return Ok(());
    }
    // As a run: the gate from trusting the copy until the pod naming it exists.
    let _staging = ctx.staged.gate().await;
    if let Some(digest) = &staged {
        crate::controller::staged::ensure(ctx, ns, digest, &shape.source).await?;
    }
    crate::controller::skilljob::ensure_namespace(ctx, ns).await?;
    Api::<Pod>::namespaced(ctx.client.clone(), ns).create(&PostParams::default(), &build_warm_pod(&params)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_the_annotation_else_the_flag_and_nothing_when_unreadable() {
        assert_eq!(super::parse_budget("team", None, 10), 10);
        assert_eq!(super::parse_budget("team", Some(" 3 "), 10), 3);
        assert_eq!(super::parse_budget("team", Some("0"), 10), 0);
        assert_eq!(super::parse_budget("team", Some("three"), 10), 0);
        assert_eq!(super::parse_budget("team", Some("-1"), 10), 0);
    }

    #[test]
    fn a_pool_is_remembered_only_while_its_binding_keeps_spec_warm() {
        use crate::api::binding::{SkillBindingSpec, WarmSpec};
        let binding = |ns: &str, name: &str, warm: bool| {
            let spec: SkillBindingSpec = serde_json::from_value(serde_json::json!({ "package": "p" })).unwrap();
            let mut b = SkillBinding::new(
                name,
                SkillBindingSpec { warm: warm.then_some(WarmSpec { min: 1, max: 1, idle_timeout_seconds: 60 }), ..spec },
            );
            b.metadata.namespace = Some(ns.into());
            Arc::new(b)
        };
        let id = ("team".to_string(), "report".to_string());
        assert!(pooled(&[binding("team", "report", true)], &id));
        assert!(!pooled(&[binding("team", "report", false)], &id), "spec.warm removed: forgotten");
        assert!(!pooled(&[binding("other", "report", true)], &id));
        assert!(!pooled(&[], &id));

        // Forgotten, and added again later: full from then, not idle since its last run.
        let pools = super::super::WarmPools::default();
        let idle = Duration::from_millis(50);
        pools.ran(id.clone(), false);
        std::thread::sleep(idle);
        assert_eq!(pools.target(&id, 1, 1, idle), 0, "idle past its timeout");
        pools.retain(|id| pooled(&[binding("team", "report", false)], id));
        assert_eq!(pools.target(&id, 1, 1, idle), 1, "a new spec.warm is a new pool");
    }
}
