//! [`JobIndex`]: the gateway's one view of the SkillJobs it wrote, in every
//! namespace. A reflector narrowed to the gateway's `created-by` label
//! (managed fields dropped) feeds both job lists (`skill_job_list`, the
//! console's table) and the console's event streams, so neither costs an
//! API call per request or a watch per open page.
//!
//! A cache answers from the past, so the index keeps this gateway's own
//! writes visible to the caller who made them: after a create or a delete
//! the executor says what it expects ([`JobIndex::expect`]), and a list in
//! that namespace first waits (at most [`INDEX_CATCH_UP_WAIT`]) until the
//! watch has delivered it. What the controller writes (phases, results)
//! arrives when the watch brings it, as the event stream always did. The
//! 100-SkillJob cap is still counted with a live list: a cap is a rule,
//! not a view.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::names::{CREATED_BY, LABEL_CREATED_BY};
use crate::api::job::SkillJob;
use crate::shutdown::Shutdown;

/// How long a list waits for the watch to deliver this gateway's own
/// create or delete before it answers without it.
pub const INDEX_CATCH_UP_WAIT: Duration = Duration::from_secs(2);
/// Changes buffered per event stream; one that falls further behind is
/// sent every current job again (the page merges them).
const CHANGES_BUFFER: usize = 1_024;

/// One SkillJob applied or deleted, as the watch saw it.
#[derive(Debug, Clone)]
pub enum IndexChange {
    Applied(Arc<SkillJob>),
    Deleted(Arc<SkillJob>),
}

impl IndexChange {
    fn job(&self) -> &SkillJob {
        match self {
            IndexChange::Applied(sj) | IndexChange::Deleted(sj) => sj,
        }
    }
}

/// What a list must see of a write before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Present,
    Absent,
}

/// The shared SkillJob cache (see the module docs).
pub struct JobIndex {
    store: Store<SkillJob>,
    changes: broadcast::Sender<IndexChange>,
    /// Bumped on every event the watch delivers: what a catching-up list waits on.
    seen: watch::Sender<u64>,
    expected: Mutex<HashMap<ObjectRef<SkillJob>, (Expect, Instant)>>,
}

impl JobIndex {
    /// Start the reflector over every namespace; the index is ready once
    /// its first list is in ([`Self::wait_until_ready`]).
    pub fn spawn(client: Client, shutdown: Shutdown) -> Arc<JobIndex> {
        let config = watcher::Config::default().labels(&format!("{LABEL_CREATED_BY}={CREATED_BY}"));
        let events = watcher(Api::<SkillJob>::all(client), config).default_backoff().modify(|sj| {
            // Nobody reads who wrote which field; it is most of an object's size.
            sj.managed_fields_mut().clear();
        });
        let (index, run) = Self::from_events(events);
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.wait() => {}
                _ = run => {}
            }
        });
        index
    }

    /// The index over a stream of watch events, and the future that feeds
    /// it (separate so tests can drive the events).
    pub fn from_events(
        events: impl Stream<Item = Result<watcher::Event<SkillJob>, watcher::Error>> + Send + 'static,
    ) -> (Arc<JobIndex>, impl std::future::Future<Output = ()> + Send + 'static) {
        let (store, writer) = reflector::store::<SkillJob>();
        let index = Arc::new(JobIndex {
            store,
            changes: broadcast::channel(CHANGES_BUFFER).0,
            seen: watch::channel(0).0,
            expected: Mutex::new(HashMap::new()),
        });
        let feeding = index.clone();
        let run = async move {
            let mut events = std::pin::pin!(reflector(writer, events));
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(sj) | watcher::Event::InitApply(sj)) => {
                        let _ = feeding.changes.send(IndexChange::Applied(Arc::new(sj)));
                    }
                    Ok(watcher::Event::Delete(sj)) => {
                        let _ = feeding.changes.send(IndexChange::Deleted(Arc::new(sj)));
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                    Err(err) => tracing::warn!(error = %err, "the gateway's SkillJob watch failed; retrying"),
                }
                feeding.seen.send_modify(|n| *n += 1);
            }
        };
        (index, run)
    }

    pub async fn wait_until_ready(&self) -> bool {
        self.store.wait_until_ready().await.is_ok()
    }

    /// After this gateway created (`present`) or deleted a SkillJob: lists
    /// in its namespace wait until the watch shows it so.
    pub fn expect(&self, namespace: &str, name: &str, present: bool) {
        let key = ObjectRef::new(name).within(namespace);
        let expect = if present { Expect::Present } else { Expect::Absent };
        self.expected().insert(key, (expect, Instant::now() + INDEX_CATCH_UP_WAIT));
    }

    fn expected(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<SkillJob>, (Expect, Instant)>> {
        self.expected.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drop what the store now shows or what waited long enough; the
    /// latest deadline among `namespace`'s remaining expectations.
    fn outstanding(&self, namespace: &str) -> Option<Instant> {
        let now = Instant::now();
        let mut expected = self.expected();
        expected.retain(|key, (expect, deadline)| {
            let shown = self.store.get(key).is_some() == (*expect == Expect::Present);
            if !shown && *deadline <= now {
                tracing::warn!(job = %key, "the SkillJob watch has not shown this gateway's own write in time; listing without it");
            }
            !shown && *deadline > now
        });
        expected.iter().filter(|(key, _)| key.namespace.as_deref() == Some(namespace)).map(|(_, (_, deadline))| *deadline).max()
    }

    /// Every SkillJob of `namespace` in the store, once this gateway's own
    /// writes there are in it (or their wait ran out). `None`: the store
    /// has not been listed yet.
    pub async fn jobs(&self, namespace: &str) -> Option<Vec<Arc<SkillJob>>> {
        if !self.ready() {
            return None;
        }
        let mut seen = self.seen.subscribe();
        while let Some(deadline) = self.outstanding(namespace) {
            match tokio::time::timeout_at(deadline, seen.changed()).await {
                // A new event, or the deadline: look again.
                Ok(Ok(())) | Err(_) => continue,
                Ok(Err(_)) => break,
            }
        }
        Some(self.store.state().into_iter().filter(|sj| sj.namespace().as_deref() == Some(namespace)).collect())
    }

    fn ready(&self) -> bool {
        // A reflector store is ready once its first list is in; a clone of
        // the readiness future resolves at once when it is.
        futures::FutureExt::now_or_never(self.store.wait_until_ready()).is_some_and(|r| r.is_ok())
    }

    /// Every change to `namespace`'s SkillJobs from now on. A receiver
    /// that falls behind gets `Err(Lagged)`: send the current jobs again.
    pub fn changes(&self) -> broadcast::Receiver<IndexChange> {
        self.changes.subscribe()
    }

    /// Whether `change` concerns `namespace`.
    pub fn in_namespace(change: &IndexChange, namespace: &str) -> bool {
        change.job().namespace().as_deref() == Some(namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::job::SkillJobSpec;

    fn job(ns: &str, name: &str) -> SkillJob {
        let spec = SkillJobSpec { binding: "b".into(), script: "scripts/s.py".into(), args: vec![], inputs: vec![], timeout_seconds: None };
        let mut sj = SkillJob::new(name, spec);
        sj.metadata.namespace = Some(ns.into());
        sj
    }

    type Events = futures::channel::mpsc::UnboundedSender<Result<watcher::Event<SkillJob>, watcher::Error>>;

    fn index() -> (Arc<JobIndex>, Events) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let (index, run) = JobIndex::from_events(rx);
        tokio::spawn(run);
        (index, tx)
    }

    fn listed(tx: &Events, jobs: &[SkillJob]) {
        tx.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        for sj in jobs {
            tx.unbounded_send(Ok(watcher::Event::InitApply(sj.clone()))).unwrap();
        }
        tx.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
    }

    async fn names(index: &JobIndex, ns: &str) -> Vec<String> {
        let mut names: Vec<String> = index.jobs(ns).await.expect("ready").iter().map(|sj| sj.name_any()).collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn lists_one_namespace_and_nothing_before_the_first_list() {
        let (index, tx) = index();
        assert!(index.jobs("a").await.is_none(), "an unlisted store is no answer (the caller lists itself)");
        listed(&tx, &[job("a", "one"), job("b", "two"), job("a", "three")]);
        assert!(index.wait_until_ready().await);
        assert_eq!(names(&index, "a").await, ["one", "three"]);
        assert_eq!(names(&index, "b").await, ["two"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_waits_for_the_gateways_own_create_and_delete() {
        let (index, tx) = index();
        listed(&tx, &[job("a", "old")]);
        assert!(index.wait_until_ready().await);

        index.expect("a", "new", true);
        index.expect("a", "old", false);
        let list = tokio::spawn({
            let index = index.clone();
            async move { names(&index, "a").await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!list.is_finished(), "answered before the watch showed the create");
        tx.unbounded_send(Ok(watcher::Event::Apply(job("a", "new")))).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!list.is_finished(), "answered before the watch showed the delete");
        tx.unbounded_send(Ok(watcher::Event::Delete(job("a", "old")))).unwrap();
        assert_eq!(list.await.unwrap(), ["new"]);

        // Another namespace's pending write does not hold this one up.
        index.expect("b", "elsewhere", true);
        let start = Instant::now();
        assert_eq!(names(&index, "a").await, ["new"]);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_watch_never_shows_costs_one_wait() {
        let (index, tx) = index();
        listed(&tx, &[]);
        assert!(index.wait_until_ready().await);
        index.expect("a", "lost", true);
        let start = Instant::now();
        assert!(names(&index, "a").await.is_empty());
        assert_eq!(start.elapsed(), INDEX_CATCH_UP_WAIT);
        let start = Instant::now();
        assert!(names(&index, "a").await.is_empty());
        assert_eq!(start.elapsed(), Duration::ZERO, "given up once, not on every list");
    }

    #[tokio::test]
    async fn changes_reach_every_subscriber() {
        let (index, tx) = index();
        listed(&tx, &[]);
        assert!(index.wait_until_ready().await);
        let mut one = index.changes();
        let mut two = index.changes();
        tx.unbounded_send(Ok(watcher::Event::Apply(job("a", "x")))).unwrap();
        tx.unbounded_send(Ok(watcher::Event::Delete(job("b", "y")))).unwrap();
        for rx in [&mut one, &mut two] {
            let first = rx.recv().await.unwrap();
            assert!(matches!(&first, IndexChange::Applied(sj) if sj.name_any() == "x") && JobIndex::in_namespace(&first, "a"));
            let second = rx.recv().await.unwrap();
            assert!(matches!(&second, IndexChange::Deleted(sj) if sj.name_any() == "y") && !JobIndex::in_namespace(&second, "a"));
        }
    }
}
