//! Running the controllers: three kube-runtime controllers, each watching
//! its resource and the children it owns, plus a small HTTP server for
//! `/metrics`, `/healthz` and `/readyz`, all stopped by one shutdown signal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, reflector, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;

use super::builders::{LABEL_MANAGED_BY, MANAGED_BY};
use super::context::{Context, Error};
use super::{binding, package, skilljob};
use crate::api::binding::SkillBinding;
use crate::api::job::SkillJob;
use crate::api::package::SkillPackage;

fn error_policy<K>(kind: &'static str) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |_obj, error, ctx| {
        tracing::warn!(kind, %error, "reconcile failed");
        ctx.metrics.failed(kind, error.metric_label());
        // A package or binding still in use is retried slowly; API errors quickly.
        match error {
            Error::InUse(_) => Action::requeue(Duration::from_secs(20)),
            _ => Action::requeue(Duration::from_secs(5)),
        }
    }
}

/// The metrics and health endpoints.
pub fn web(ctx: Arc<Context>) -> Router {
    Router::new()
        .route("/metrics", get(|State(ctx): State<Arc<Context>>| async move { ctx.metrics.render() }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(ctx)
}

/// Run every controller until SIGTERM or Ctrl-C.
pub async fn run(ctx: Arc<Context>, listen: SocketAddr) -> anyhow::Result<()> {
    let client = ctx.client.clone();
    // Fail early with an actionable message when the CRDs are not installed.
    let probe: Api<SkillPackage> = Api::all(client.clone());
    if let Err(err) = probe.list(&kube::api::ListParams::default().limit(1)).await {
        anyhow::bail!("cannot list SkillPackages ({err}): install the CRDs first (`kubectl apply -f crds/` or the Helm chart)");
    }

    let packages = Controller::new(Api::<SkillPackage>::all(client.clone()), watcher::Config::default());
    let bindings = Controller::new(Api::<SkillBinding>::all(client.clone()), watcher::Config::default());
    // SkillJob reconciles read bindings and packages from these caches.
    ctx.lookups.set_stores(bindings.store(), packages.store());
    let packages = packages
        // A binding going away may unblock a package's deletion.
        .watches(Api::<SkillBinding>::all(client.clone()), watcher::Config::default(), |b| {
            Some(ObjectRef::<SkillPackage>::new(&b.spec.package))
        })
        .shutdown_on_signal()
        .run(package::reconcile, error_policy::<SkillPackage>("SkillPackage"), ctx.clone())
        .for_each(|_| async {});

    let lookups = ctx.lookups.clone();
    let siblings = ctx.lookups.clone();
    let bindings = bindings
        // Two bindings serving one skill name refuse each other: the first
        // must hear of the second (and of its going).
        .watches(Api::<SkillBinding>::all(client.clone()), watcher::Config::default(), move |b| {
            b.namespace().map(|ns| siblings.sibling_bindings(&ns, &b.name_any())).unwrap_or_default()
        })
        // A SkillJob going away may unblock a binding's deletion. Only a
        // binding being deleted cares: waking every binding on every
        // SkillJob status change was most of the API load under a burst.
        .watches(Api::<SkillJob>::all(client.clone()), watcher::Config::default(), move |j| {
            let ns = j.namespace()?;
            lookups.binding_is_deleting(&ns, &j.spec.binding).then(|| ObjectRef::<SkillBinding>::new(&j.spec.binding).within(&ns))
        })
        .shutdown_on_signal()
        .run(binding::reconcile, error_policy::<SkillBinding>("SkillBinding"), ctx.clone())
        .for_each(|_| async {});

    // The children are watched once, by label, into stores the SkillJob
    // reconciler reads instead of asking the API server each time.
    let children = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let (job_store, job_writer) = reflector::store::<Job>();
    let (policy_store, policy_writer) = reflector::store::<NetworkPolicy>();
    ctx.lookups.set_child_stores(job_store, policy_store);
    // managedFields are most of a Job's bytes and nothing here reads them.
    let job_events =
        reflector(job_writer, watcher(Api::<Job>::all(client.clone()), children.clone()).modify(|j| j.managed_fields_mut().clear()))
            .default_backoff()
            .touched_objects();
    let policy_events =
        reflector(policy_writer, watcher(Api::<NetworkPolicy>::all(client.clone()), children).modify(|p| p.managed_fields_mut().clear()))
            .default_backoff()
            .touched_objects();
    let jobs = Controller::new(Api::<SkillJob>::all(client.clone()), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.config.reconcile_concurrency))
        .owns_stream(job_events)
        .owns_stream(policy_events)
        .shutdown_on_signal()
        .run(skilljob::reconcile, error_policy::<SkillJob>("SkillJob"), ctx.clone())
        .for_each(|_| async {});

    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "metrics and health endpoints up");
    let server = axum::serve(listener, web(ctx.clone())).with_graceful_shutdown(crate::serve::shutdown_signal());
    let (_, _, _, served) = tokio::join!(packages, bindings, jobs, server);
    served?;
    Ok(())
}
