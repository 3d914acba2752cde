//! SkillBinding reconciler: bind a package into a namespace, decide which
//! granted variables are effective, refuse two bindings serving one skill
//! name, and refuse deletion while SkillJobs use the binding.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::ResourceExt;

use super::context::{apply_status, Context, Error, Result};
use super::decide::{binding_decision, BindingDecision};
use crate::api::binding::{SkillBinding, SkillBindingStatus};
use crate::api::conditions::set_condition;
use crate::api::job::SkillJob;
use crate::api::package::SkillPackage;

/// Keeps a binding while SkillJobs (run or not) use it.
pub const FINALIZER: &str = "skill-operator.dev/binding-in-use";

pub async fn reconcile(binding: Arc<SkillBinding>, ctx: Arc<Context>) -> Result<Action> {
    // A standby replica keeps its caches warm and writes nothing.
    if let Some(later) = ctx.leadership.wait_turn().await {
        return Ok(later);
    }
    let started = Instant::now();
    let ns = binding.namespace().ok_or(Error::Missing("namespace"))?;
    let api: Api<SkillBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, binding, |event| async {
        match event {
            Finalizer::Apply(b) => apply(&b, &ctx).await,
            Finalizer::Cleanup(b) => cleanup(&b, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.reconciled("SkillBinding", started.elapsed());
    result
}

async fn apply(binding: &SkillBinding, ctx: &Context) -> Result<Action> {
    let ns = binding.namespace().ok_or(Error::Missing("namespace"))?;
    let packages: Api<SkillPackage> = Api::all(ctx.client.clone());
    let package = packages.get_opt(&binding.spec.package).await?;
    // The skill names the other bindings here serve, from their packages.
    let bindings: Api<SkillBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let mut siblings = Vec::new();
    for other in bindings.list(&ListParams::default()).await? {
        let skill = if other.spec.package == binding.spec.package {
            package.as_ref().and_then(|p| p.status.as_ref()).and_then(|s| s.skill_name.clone())
        } else {
            packages.get_opt(&other.spec.package).await?.and_then(|p| p.status).and_then(|s| s.skill_name)
        };
        if let Some(skill) = skill {
            siblings.push((other.name_any(), skill));
        }
    }
    let d = binding_decision(binding, package.as_ref(), &siblings);
    let status = binding_status(binding, &d);
    apply_status(&bindings, &binding.name_any(), &status).await?;
    Ok(Action::requeue(if d.ready.is_ok() { Duration::from_secs(300) } else { Duration::from_secs(20) }))
}

/// The status a binding gets for decision `d`: what it resolves to and its
/// `Ready` verdict for its current generation (the gateway serves a binding
/// only on that verdict).
pub fn binding_status(binding: &SkillBinding, d: &BindingDecision) -> SkillBindingStatus {
    let generation = binding.metadata.generation;
    let mut status = SkillBindingStatus {
        skill_name: d.skill_name.clone(),
        digest: d.digest.clone(),
        effective_env: d.effective_env.clone(),
        ignored_env: d.ignored_env.clone(),
        proposed_egress: d.proposed_egress.clone(),
        effective_egress: crate::controller::egress::texts(&d.egress.effective),
        dropped_egress: d.egress.dropped.clone(),
        observed_generation: generation,
        conditions: binding.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default(),
    };
    match &d.ready {
        Ok(()) => {
            let note = if d.ignored_env.is_empty() {
                String::new()
            } else {
                format!("; not handed over (no allowed script asked for them): {}", d.ignored_env.join(", "))
            };
            set_condition(
                &mut status.conditions,
                "Ready",
                true,
                "Bound",
                format!("skill `{}` is bound{note}", status.skill_name.clone().unwrap_or_default()),
                generation,
            );
        }
        Err((reason, message)) => set_condition(&mut status.conditions, "Ready", false, reason, message.clone(), generation),
    }
    status
}

async fn cleanup(binding: &SkillBinding, ctx: &Context) -> Result<Action> {
    let ns = binding.namespace().ok_or(Error::Missing("namespace"))?;
    let jobs: Api<SkillJob> = Api::namespaced(ctx.client.clone(), &ns);
    let users: Vec<String> = jobs
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter(|j| j.spec.binding == binding.name_any())
        .map(|j| j.name_any())
        .collect();
    if users.is_empty() {
        return Ok(Action::await_change());
    }
    let message = format!("deletion waits: SkillJobs use this binding ({}); delete them first", users.join(", "));
    let mut status = binding.status.clone().unwrap_or_default();
    set_condition(&mut status.conditions, "DeletionBlocked", true, "InUse", message.clone(), binding.metadata.generation);
    let api: Api<SkillBinding> = Api::namespaced(ctx.client.clone(), &ns);
    apply_status(&api, &binding.name_any(), &status).await?;
    Err(Error::InUse(message))
}
