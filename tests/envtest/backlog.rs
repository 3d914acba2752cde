//! A backlog of SkillJobs on a real API server without a kubelet, and what
//! the fault suites check of it afterwards. Watches record each SkillJob's
//! phases in order and each SkillJob's Jobs; the test stands in for the
//! kubelet and the Job controller by failing every Job as it appears (no
//! pod ever ran), so the controller has to bring every SkillJob to a
//! truthful terminal verdict itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;
use skill_operator::api::job::SkillJobPhase;
use skill_operator::api::SkillJob;

pub(crate) struct Backlog {
    count: usize,
    history: Arc<Mutex<HashMap<String, Vec<Option<SkillJobPhase>>>>>,
    /// Each SkillJob's UID and last status message, by name.
    last_seen: Arc<Mutex<HashMap<String, (String, String)>>>,
    jobs_of: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    tasks: Vec<tokio_util::task::AbortOnDropHandle<()>>,
    creating: Option<tokio::task::JoinHandle<()>>,
}

/// What the suites assert: all empty, and `terminal == count`.
pub(crate) struct Outcome {
    pub terminal: usize,
    pub with_jobs: usize,
    /// SkillJobs no Job was ever seen for: name, UID, phases, last message.
    pub without_jobs: Vec<String>,
    pub duplicates: Vec<String>,
    pub regressions: Vec<String>,
}

fn rank(phase: Option<&SkillJobPhase>) -> u8 {
    match phase {
        None => 0,
        Some(SkillJobPhase::Pending) => 1,
        Some(SkillJobPhase::Running) => 2,
        Some(_) => 3,
    }
}

impl Backlog {
    /// Starts the watches and the Job-failing stand-in, then creates `count`
    /// SkillJobs on the binding `csv-stats` in `ns`, 16 at a time, in the
    /// background.
    pub(crate) fn start(client: &kube::Client, ns: &str, count: usize) -> Backlog {
        let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), ns);
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        let history: Arc<Mutex<HashMap<String, Vec<Option<SkillJobPhase>>>>> = Arc::default();
        let jobs_of: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
        let last_seen: Arc<Mutex<HashMap<String, (String, String)>>> = Arc::default();
        let mut tasks = Vec::new();

        let (api, h, seen_last) = (skilljobs.clone(), history.clone(), last_seen.clone());
        tasks.push(spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            // A failed watch (the API server gone) starts again: the record must span it.
            loop {
                match events.try_next().await {
                    Ok(Some(watcher::Event::Apply(sj) | watcher::Event::InitApply(sj))) => {
                        let phase = sj.status.as_ref().and_then(|s| s.phase);
                        let message = sj.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
                        seen_last.lock().unwrap().insert(sj.name_any(), (sj.uid().unwrap_or_default(), message));
                        let mut h = h.lock().unwrap();
                        let seen = h.entry(sj.name_any()).or_default();
                        if seen.last() != Some(&phase) {
                            seen.push(phase);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }));

        let (failing_tx, mut failing_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let (api, j) = (jobs.clone(), jobs_of.clone());
        tasks.push(spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            loop {
                match events.try_next().await {
                    Ok(Some(watcher::Event::Apply(job) | watcher::Event::InitApply(job))) => {
                        let Some(owner) = job.owner_references().iter().find(|o| o.kind == "SkillJob").map(|o| o.uid.clone()) else {
                            continue;
                        };
                        // By UID: a Job's name derives from its SkillJob, so a second
                        // Job made after the first was deleted has the same name.
                        let Some(job_uid) = job.uid() else { continue };
                        let fresh = j.lock().unwrap().entry(owner).or_default().insert(job_uid);
                        let done = job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| !c.is_empty());
                        if fresh && !done {
                            let _ = failing_tx.send(job.name_any());
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }));
        tasks.push(spawn(async move {
            futures::stream::poll_fn(move |cx| failing_rx.poll_recv(cx))
                .for_each_concurrent(8, |name| {
                    let api = jobs.clone();
                    async move { fail_job(&api, &name).await }
                })
                .await
        }));

        let creating = tokio::spawn(async move {
            futures::stream::iter(0..count)
                .for_each_concurrent(16, |i| {
                    let api = skilljobs.clone();
                    async move { create_skilljob(&api, i).await }
                })
                .await
        });
        Backlog { count, history, last_seen, jobs_of, tasks, creating: Some(creating) }
    }

    /// How many SkillJobs the watch has seen in a terminal phase.
    pub(crate) fn terminal(&self) -> usize {
        self.history.lock().unwrap().values().filter(|h| rank(h.last().and_then(|p| p.as_ref())) == 3).count()
    }

    /// Waits until every SkillJob was created and is terminal (or `limit`
    /// passed), then stops watching and says what happened.
    pub(crate) async fn finish(mut self, limit: Duration) -> Outcome {
        if let Some(creating) = self.creating.take() {
            creating.await.expect("every SkillJob was created");
        }
        let deadline = Instant::now() + limit;
        while self.terminal() < self.count && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let terminal = self.terminal();
        self.tasks.clear();
        let jobs_of = self.jobs_of.lock().unwrap().clone();
        let duplicates = jobs_of.iter().filter(|(_, j)| j.len() > 1).map(|(uid, j)| format!("{uid}: {j:?}")).collect();
        let mut regressions = Vec::new();
        for (name, phases) in self.history.lock().unwrap().iter() {
            let (mut top, mut last_terminal) = (0, None);
            for p in phases {
                let r = rank(p.as_ref());
                if r < top || (last_terminal.is_some() && p.as_ref() != last_terminal) {
                    regressions.push(format!("{name}: {phases:?}"));
                    break;
                }
                top = top.max(r);
                if r == 3 {
                    last_terminal = p.as_ref();
                }
            }
        }
        let history = self.history.lock().unwrap();
        let without_jobs = self
            .last_seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, (uid, _))| !jobs_of.contains_key(uid))
            .map(|(name, (uid, message))| format!("{name} ({uid}): {:?}, {message}", history.get(name)))
            .collect();
        Outcome { terminal, with_jobs: jobs_of.len(), without_jobs, duplicates, regressions }
    }
}

impl Outcome {
    pub(crate) fn assert_nothing_lost_or_doubled(&self, count: usize) {
        assert!(self.duplicates.is_empty(), "SkillJobs with more than one Job: {:?}", self.duplicates);
        assert!(self.regressions.is_empty(), "phases that went back: {:?}", self.regressions);
        assert_eq!(self.terminal, count, "SkillJobs left without a terminal phase");
        assert_eq!(self.with_jobs, count, "SkillJobs that never got a Job: {:?}", self.without_jobs);
    }
}

fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) -> tokio_util::task::AbortOnDropHandle<()> {
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(f))
}

/// Creates `run-<i>`, trying again while the API server is away.
async fn create_skilljob(api: &Api<SkillJob>, i: usize) {
    let sj: SkillJob = serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob", "metadata": { "name": format!("run-{i}") },
        "spec": { "binding": "csv-stats", "script": "scripts/stats.py", "args": ["data.csv"] }
    }))
    .unwrap();
    for _ in 0..300 {
        match api.create(&PostParams::default(), &sj).await {
            Ok(_) => return,
            // A create whose answer was lost with the API server went through.
            Err(kube::Error::Api(e)) if e.code == 409 => return,
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 400 => panic!("create run-{i}: {}", e.message),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    panic!("create run-{i}: the API server did not come back in 60 s");
}

/// What the Job controller writes when a Job's pod could not run: the
/// failure target, then Failed.
async fn fail_job(api: &Api<Job>, name: &str) {
    // Whole seconds, as the API server keeps them: a retry after a lost
    // answer then writes the same startTime (it is immutable once set).
    let now = k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second()).unwrap().to_string();
    let condition = |type_: &str| {
        json!({ "type": type_, "status": "True", "reason": "BackoffLimitExceeded", "message": "the test's stand-in for the kubelet ran no pod",
                "lastProbeTime": now, "lastTransitionTime": now })
    };
    let status = json!({ "status": { "startTime": now, "failed": 1, "conditions": [condition("FailureTarget"), condition("Failed")] } });
    for _ in 0..300 {
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(kube::Error::Api(e)) if e.code == 422 => panic!("the API server refused the failed status of {name}: {}", e.message),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
