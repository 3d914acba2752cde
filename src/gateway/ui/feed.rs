//! The caller's SkillJobs in one namespace, as they change: a watch
//! narrowed by the owner label the gateway puts on every SkillJob it
//! writes, and then checked on the owner annotation (the label is a hash
//! that only narrows; the annotation is what ownership is decided on, as
//! in the job tools). One watch per open event stream, ended with it.

use futures::stream::BoxStream;
use futures::StreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use super::JobChange;
use crate::api::job::SkillJob;
use crate::gateway::executor::names::{owner_label, LABEL_OWNER};
use crate::gateway::executor::record::{job_record, outcome_of, owner};
use crate::mcp::executor::Caller;

/// The changes to `caller`'s SkillJobs in `namespace`, from the API server
/// `client` talks to. The first events after (re)connecting are every
/// current job (the page merges them into what it listed); a watch that
/// fails is retried with the runtime's backoff.
pub fn skilljobs(client: Client, namespace: &str, caller: &Caller) -> BoxStream<'static, JobChange> {
    let api: Api<SkillJob> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().labels(&format!("{LABEL_OWNER}={}", owner_label(&caller.principal)));
    let principal = caller.principal.clone();
    watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let change = match event {
                Ok(watcher::Event::Apply(sj) | watcher::Event::InitApply(sj)) if owner(&sj) == Some(principal.as_str()) => {
                    Some(JobChange::Changed(Box::new(job_record(&sj, &outcome_of(&sj, None)))))
                }
                Ok(watcher::Event::Delete(sj)) if owner(&sj) == Some(principal.as_str()) => Some(JobChange::Gone(sj.name_any())),
                Ok(_) => None,
                Err(err) => {
                    tracing::debug!(error = %err, "the console's SkillJob watch failed; retrying");
                    None
                }
            };
            futures::future::ready(change)
        })
        .boxed()
}
