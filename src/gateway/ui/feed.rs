//! The caller's SkillJobs in one namespace, as they change: read from the
//! gateway's shared [`JobIndex`] (one watch for every open page, not one
//! per page), kept to the jobs the gateway's seal proves the caller's (as
//! in the job tools).

use std::collections::VecDeque;
use std::sync::Arc;

use futures::stream::{self, BoxStream};
use futures::StreamExt;
use kube::ResourceExt;
use tokio::sync::broadcast::error::RecvError;

use super::JobChange;
use crate::api::job::SkillJob;
use crate::core::owner::OwnerSeal;
use crate::gateway::executor::index::{IndexChange, JobIndex};
use crate::gateway::executor::record::{job_record, outcome_of, owner};
use crate::mcp::executor::Caller;

struct Feed {
    index: Arc<JobIndex>,
    seal: OwnerSeal,
    changes: tokio::sync::broadcast::Receiver<IndexChange>,
    namespace: String,
    principal: String,
    pending: VecDeque<JobChange>,
    /// Send every current job (first, and after falling behind).
    replay: bool,
}

impl Feed {
    fn mine(&self, sj: &SkillJob) -> bool {
        owner(sj, &self.seal) == Some(self.principal.as_str()) && sj.namespace().as_deref() == Some(self.namespace.as_str())
    }

    async fn next(&mut self) -> Option<JobChange> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Some(change);
            }
            if std::mem::take(&mut self.replay) {
                let jobs = self.index.jobs(&self.namespace).await.unwrap_or_default();
                let current = jobs
                    .iter()
                    .filter(|sj| self.mine(sj) && sj.metadata.deletion_timestamp.is_none())
                    .map(|sj| changed(sj))
                    .collect::<Vec<_>>();
                self.pending.extend(current);
                continue;
            }
            match self.changes.recv().await {
                // Being deleted (its name held for its token's life): gone for the page.
                Ok(IndexChange::Applied(sj)) if self.mine(&sj) && sj.metadata.deletion_timestamp.is_some() => {
                    self.pending.push_back(JobChange::Gone(sj.name_any()))
                }
                Ok(IndexChange::Applied(sj)) if self.mine(&sj) => self.pending.push_back(changed(&sj)),
                Ok(IndexChange::Deleted(sj)) if self.mine(&sj) => self.pending.push_back(JobChange::Gone(sj.name_any())),
                Ok(_) => {}
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "a console event stream fell behind the SkillJob watch; sending its jobs again");
                    self.replay = true;
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }
}

fn changed(sj: &SkillJob) -> JobChange {
    JobChange::Changed(Box::new(job_record(sj, &outcome_of(sj, None))))
}

/// The changes to `caller`'s SkillJobs in `namespace`. The first events are
/// every current job (the page merges them into what it listed), and so are
/// the events after the stream fell behind the watch.
pub fn skilljobs(index: Arc<JobIndex>, seal: OwnerSeal, namespace: &str, caller: &Caller) -> BoxStream<'static, JobChange> {
    // Subscribed before the first replay, so a change in between is not lost.
    let feed = Feed {
        changes: index.changes(),
        index,
        seal,
        namespace: namespace.to_string(),
        principal: caller.principal.clone(),
        pending: VecDeque::new(),
        replay: true,
    };
    stream::unfold(feed, |mut feed| async move { feed.next().await.map(|change| (change, feed)) }).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::job::SkillJobSpec;
    use crate::api::job::{OWNER_SEAL_ANNOTATION, REQUESTED_BY_ANNOTATION};
    use crate::core::owner::OwnerClaim;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::runtime::watcher;

    fn seal() -> OwnerSeal {
        OwnerSeal::new(b"feed-test-key-of-at-least-32-bytes!")
    }

    /// A SkillJob claiming `by`, unsealed (as anyone with `create` can write one).
    fn claimed(ns: &str, name: &str, by: &str) -> SkillJob {
        let spec = SkillJobSpec { binding: "b".into(), script: "scripts/s.py".into(), args: vec![], inputs: vec![], timeout_seconds: None };
        let mut sj = SkillJob::new(name, spec);
        sj.metadata.namespace = Some(ns.into());
        sj.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        sj.annotations_mut().insert(REQUESTED_BY_ANNOTATION.into(), by.into());
        sj
    }

    /// A SkillJob the gateway wrote for `by`.
    fn job(ns: &str, name: &str, by: &str) -> SkillJob {
        let mut sj = claimed(ns, name, by);
        let claim = OwnerClaim { namespace: ns, name, principal: by, spec_digest: &sj.spec_digest() };
        let sealed = seal().seal(&claim, k8s_openapi::jiff::Timestamp::now().as_second());
        sj.annotations_mut().insert(OWNER_SEAL_ANNOTATION.into(), sealed);
        sj
    }

    fn caller(principal: &str) -> Caller {
        Caller::named(principal)
    }

    fn ids(changes: &[JobChange]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                JobChange::Changed(r) => format!("+{}", r.id),
                JobChange::Gone(id) => format!("-{id}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_stream_replays_then_follows_only_the_callers_jobs_in_its_namespace() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let (index, run) = JobIndex::from_events(rx);
        tokio::spawn(run);
        tx.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        for sj in [
            job("a", "skj-mine", "alice"),
            job("a", "skj-theirs", "bob"),
            job("b", "skj-elsewhere", "alice"),
            claimed("a", "skj-planted", "alice"),
        ] {
            tx.unbounded_send(Ok(watcher::Event::InitApply(sj))).unwrap();
        }
        tx.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        assert!(index.wait_until_ready().await);

        let mut feed = skilljobs(index, seal(), "a", &caller("alice"));
        let first = feed.next().await.unwrap();
        assert_eq!(ids(&[first]), ["+skj-mine"], "the replay holds the caller's job in this namespace only, and none it cannot prove");
        for sj in [
            job("a", "skj-bobs", "bob"),
            job("b", "skj-other-ns", "alice"),
            claimed("a", "skj-forged", "alice"),
            job("a", "skj-new", "alice"),
        ] {
            tx.unbounded_send(Ok(watcher::Event::Apply(sj))).unwrap();
        }
        tx.unbounded_send(Ok(watcher::Event::Delete(job("a", "skj-theirs", "bob")))).unwrap();
        tx.unbounded_send(Ok(watcher::Event::Delete(job("a", "skj-mine", "alice")))).unwrap();
        let next: Vec<JobChange> = vec![feed.next().await.unwrap(), feed.next().await.unwrap()];
        assert_eq!(ids(&next), ["+skj-new", "-skj-mine"]);
    }
}
