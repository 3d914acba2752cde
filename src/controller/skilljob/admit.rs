//! Step 1: may this SkillJob run, and with what? The fence decides
//! ([`crate::controller::decide::admit`]); then the named inputs must be
//! staged exactly, and the namespace's Pod Security is checked.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::{age_secs, patch_status, publish, set_phase, INPUTS_POLL};
use crate::api::conditions::set_condition;
use crate::api::job::{SkillJob, SkillJobPhase, SkillJobStatus};
use crate::controller::context::{Context, Result};
use crate::controller::decide::{self, namespace_is_restricted, Admission, PSS_ENFORCE_LABEL};

/// What admission decided.
pub(super) enum Admitted {
    /// Start the run with this.
    Start(Box<Admission>),
    /// Not (yet): the status says why.
    Wait(Action),
}

pub(super) async fn admit(sj: &SkillJob, ctx: &Context, ns: &str, uid: &str, status: &mut SkillJobStatus) -> Result<Admitted> {
    let generation = sj.metadata.generation;
    let binding = ctx.lookups.binding(&ctx.client, ns, &sj.spec.binding).await?;
    let package = match &binding {
        Some(b) => ctx.lookups.package(&ctx.client, &b.spec.package).await?,
        None => None,
    };
    let admission = match decide::admit(&sj.spec, binding.as_ref(), package.as_ref()) {
        Ok(a) => a,
        Err(refusal) => {
            let (reason, message) = (refusal.reason(), refusal.to_string());
            if refusal.is_transient() {
                set_phase(status, SkillJobPhase::Pending, reason, message, generation);
                patch_status(ctx, sj, status).await?;
                return Ok(Admitted::Wait(Action::requeue(std::time::Duration::from_secs(15))));
            }
            set_phase(status, SkillJobPhase::Failed, reason, message.clone(), generation);
            patch_status(ctx, sj, status).await?;
            publish(ctx, sj, EventType::Warning, reason, &message).await;
            return Ok(Admitted::Wait(Action::await_change()));
        }
    };
    status.skill = Some(admission.skill.clone());
    // Named inputs must be staged, exactly, before the Job may start.
    if !sj.spec.inputs.is_empty() {
        let staged = ctx.artifacts.staged_inputs(ns, uid).await?;
        if let Some(why) = decide::inputs_mismatch(&sj.spec.inputs, &staged) {
            let waited = age_secs(sj.metadata.creation_timestamp.as_ref()).unwrap_or(0);
            if waited > decide::INPUTS_WAIT_SECS {
                let message = format!("the inputs were not staged within {} s: {why}", decide::INPUTS_WAIT_SECS);
                set_phase(status, SkillJobPhase::Failed, "InputsNotStaged", message.clone(), generation);
                patch_status(ctx, sj, status).await?;
                publish(ctx, sj, EventType::Warning, "InputsNotStaged", &message).await;
                return Ok(Admitted::Wait(Action::await_change()));
            }
            set_phase(status, SkillJobPhase::Pending, "AwaitingInputs", format!("waiting for the inputs to be staged: {why}"), generation);
            patch_status(ctx, sj, status).await?;
            // Whoever stages them annotates the SkillJob, which wakes this
            // reconcile at once; the poll is only for those who do not.
            return Ok(Admitted::Wait(Action::requeue(INPUTS_POLL)));
        }
    }
    check_namespace(ctx, ns, status, generation).await?;
    Ok(Admitted::Start(Box::new(admission)))
}

/// A namespace that does not enforce `restricted` gets the label (when the
/// operator may add it) or a visible condition.
pub(super) async fn check_namespace(ctx: &Context, ns: &str, status: &mut SkillJobStatus, generation: Option<i64>) -> Result<()> {
    let enforced = |status: &mut SkillJobStatus| {
        set_condition(
            &mut status.conditions,
            "NamespaceRestricted",
            true,
            "Enforced",
            "the namespace enforces Pod Security `restricted`",
            generation,
        );
    };
    if ctx.lookups.namespace_known_restricted(ns) {
        enforced(status);
        return Ok(());
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let Some(namespace) = namespaces.get_opt(ns).await? else { return Ok(()) };
    if namespace_is_restricted(namespace.metadata.labels.as_ref()) {
        ctx.lookups.remember_restricted(ns);
        enforced(status);
        return Ok(());
    }
    if ctx.config.label_namespaces {
        let patch = json!({ "metadata": { "labels": { PSS_ENFORCE_LABEL: "restricted" } } });
        namespaces.patch(ns, &PatchParams::default(), &Patch::Merge(patch)).await?;
        set_condition(
            &mut status.conditions,
            "NamespaceRestricted",
            true,
            "Labelled",
            "labelled the namespace pod-security.kubernetes.io/enforce=restricted",
            generation,
        );
    } else {
        set_condition(
            &mut status.conditions,
            "NamespaceRestricted",
            false,
            "NotEnforced",
            "the namespace does not enforce Pod Security `restricted` (label it pod-security.kubernetes.io/enforce=restricted); runs still use restricted pods",
            generation,
        );
    }
    Ok(())
}
