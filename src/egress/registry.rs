//! The jobs the proxy serves: for each, its effective allowlist, the
//! source address its connections must come from, and its budgets.
//!
//! [`JobRegistry`] is what the proxy reads; whoever embeds the proxy feeds
//! it. [`MemoryRegistry`] is a shared handle (clone it freely) that the
//! controller updates from its watch (`upsert` when a pod gets its IP,
//! `remove` when the job ends), that the standalone server fills per run,
//! and that `egress-proxy --jobs FILE` loads from JSON. A custom registry
//! only has to implement [`JobRegistry::job`].
//!
//! Usage (open tunnels, bytes spent) lives in the entry, and `upsert` of a
//! known job keeps it: updating a pod's address does not refill its
//! budget.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::allowlist::Allowlist;
use super::config::{JobBudget, JobLimits};
use super::identity::JobId;

/// What the proxy reads.
pub trait JobRegistry: Send + Sync + 'static {
    /// The job's entry, `None` when the job is unknown (or gone).
    fn job(&self, id: &JobId) -> Option<Arc<JobEntry>>;

    /// Ticks whenever an entry is added or changed, for a request whose
    /// verified credential names a job the registry has not heard of yet
    /// (its record trails the run by a watch event). `None`: the registry
    /// never changes while it serves (a jobs file), so nothing is waited for.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// One job as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub namespace: String,
    pub uid: String,
    /// The effective allowlist (allowed ∩ the binding's narrowing).
    #[serde(default)]
    pub allow: Allowlist,
    /// The pod's address. TCP requests for this job are refused from any
    /// other address, and refused altogether while it is unknown. Unused on
    /// a unix-socket listener, where the socket is the identity.
    #[serde(default)]
    pub source: Option<IpAddr>,
    /// Overrides of the proxy's per-job defaults.
    #[serde(default)]
    pub limits: JobBudget,
}

impl JobSpec {
    pub fn id(&self) -> JobId {
        JobId::new(&self.namespace, &self.uid)
    }
}

/// A registered job and its running usage.
#[derive(Debug)]
pub struct JobEntry {
    pub spec: JobSpec,
    pub usage: Arc<Usage>,
}

impl JobEntry {
    pub fn new(spec: JobSpec) -> JobEntry {
        JobEntry { spec, usage: Arc::default() }
    }
}

/// A job's running usage.
#[derive(Debug, Default)]
pub struct Usage {
    active: AtomicU32,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl Usage {
    /// Take one of `max` connection slots; `None` when all are taken.
    pub fn try_open(self: &Arc<Self>, max: u32) -> Option<Slot> {
        self.active.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(Slot(self.clone()))
    }

    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    pub fn bytes_up(&self) -> u64 {
        self.bytes_up.load(Ordering::Relaxed)
    }

    pub fn bytes_down(&self) -> u64 {
        self.bytes_down.load(Ordering::Relaxed)
    }

    /// Charge `n` bytes against `budget`; how many of them fit.
    pub(crate) fn charge(&self, up: bool, n: usize, budget: u64) -> usize {
        let counter = if up { &self.bytes_up } else { &self.bytes_down };
        let before = counter.fetch_add(n as u64, Ordering::Relaxed);
        budget.saturating_sub(before).min(n as u64) as usize
    }

    /// Whether the budget is already spent.
    pub(crate) fn spent(&self, limits: &JobLimits) -> Option<&'static str> {
        if self.bytes_up() >= limits.max_bytes_up {
            Some("max_bytes_up")
        } else if self.bytes_down() >= limits.max_bytes_down {
            Some("max_bytes_down")
        } else {
            None
        }
    }
}

/// An open connection slot; released on drop.
#[derive(Debug)]
pub struct Slot(Arc<Usage>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a jobs file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read the jobs file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the jobs file {path} is not `{{\"jobs\": [{{\"namespace\", \"uid\", \"allow\", \"source\", \"limits\"}}]}}`: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The JSON file `egress-proxy --jobs` reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsFile {
    pub jobs: Vec<JobSpec>,
}

/// An in-memory registry; a cheap, shared handle.
#[derive(Clone, Default)]
pub struct MemoryRegistry {
    jobs: Arc<RwLock<HashMap<JobId, Arc<JobEntry>>>>,
    /// Bumped by every upsert and replace (see [`JobRegistry::changes`]).
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl MemoryRegistry {
    pub fn new() -> MemoryRegistry {
        MemoryRegistry::default()
    }

    /// Add a job or replace its spec (keeping its usage).
    pub fn upsert(&self, spec: JobSpec) {
        let id = spec.id();
        let mut jobs = self.jobs.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let usage = jobs.get(&id).map(|e| e.usage.clone()).unwrap_or_default();
        jobs.insert(id, Arc::new(JobEntry { spec, usage }));
        drop(jobs);
        self.changed();
    }

    /// Tells waiting requests that an entry was added or changed (after the lock is let go).
    fn changed(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Forget a job: its next request is refused.
    pub fn remove(&self, id: &JobId) {
        self.jobs.write().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(id);
    }

    /// Make the registry exactly `specs` (usage kept for jobs that stay).
    pub fn replace_all(&self, specs: Vec<JobSpec>) {
        let mut jobs = self.jobs.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut next = HashMap::with_capacity(specs.len());
        for spec in specs {
            let id = spec.id();
            let usage = jobs.get(&id).map(|e| e.usage.clone()).unwrap_or_default();
            next.insert(id, Arc::new(JobEntry { spec, usage }));
        }
        *jobs = next;
        drop(jobs);
        self.changed();
    }

    /// A job's current spec (a copy).
    pub fn job_spec(&self, id: &JobId) -> Option<JobSpec> {
        self.jobs.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(id).map(|e| e.spec.clone())
    }

    pub fn len(&self) -> usize {
        self.jobs.read().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replace the contents with a jobs file.
    pub fn load_file(&self, path: &Path) -> Result<usize, RegistryError> {
        let text = std::fs::read(path).map_err(|source| RegistryError::Read { path: path.display().to_string(), source })?;
        let file: JobsFile =
            serde_json::from_slice(&text).map_err(|source| RegistryError::Parse { path: path.display().to_string(), source })?;
        let n = file.jobs.len();
        self.replace_all(file.jobs);
        Ok(n)
    }
}

impl JobRegistry for MemoryRegistry {
    fn job(&self, id: &JobId) -> Option<Arc<JobEntry>> {
        self.jobs.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(id).cloned()
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.changed.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(uid: &str, source: &str) -> JobSpec {
        JobSpec {
            namespace: "team".into(),
            uid: uid.into(),
            allow: Allowlist::parse(["x.test"]).unwrap(),
            source: Some(source.parse().unwrap()),
            limits: JobBudget::default(),
        }
    }

    #[test]
    fn upsert_keeps_usage_and_slots_are_bounded() {
        let reg = MemoryRegistry::new();
        reg.upsert(spec("a", "10.0.0.1"));
        let entry = reg.job(&JobId::new("team", "a")).unwrap();
        let s1 = entry.usage.try_open(2).unwrap();
        let _s2 = entry.usage.try_open(2).unwrap();
        assert!(entry.usage.try_open(2).is_none());
        drop(s1);
        assert!(entry.usage.try_open(2).is_some());
        assert_eq!(entry.usage.charge(true, 100, 150), 100);
        assert_eq!(entry.usage.charge(true, 100, 150), 50);
        assert_eq!(entry.usage.charge(true, 100, 150), 0);
        reg.upsert(spec("a", "10.0.0.2"));
        let again = reg.job(&JobId::new("team", "a")).unwrap();
        assert_eq!(again.spec.source, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(again.usage.bytes_up(), 300);
        reg.remove(&JobId::new("team", "a"));
        assert!(reg.job(&JobId::new("team", "a")).is_none());
    }

    #[test]
    fn jobs_file_parses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.json");
        std::fs::write(
            &path,
            r#"{"jobs": [{"namespace": "team", "uid": "u1", "source": "10.1.2.3",
                "allow": ["api.example.com", {"host": "*.example.org", "ports": [443, 8443]}],
                "limits": {"max_connections": 4}}]}"#,
        )
        .unwrap();
        let reg = MemoryRegistry::new();
        assert_eq!(reg.load_file(&path).unwrap(), 1);
        let e = reg.job(&JobId::new("team", "u1")).unwrap();
        assert_eq!(e.spec.allow.to_string(), "api.example.com:443 *.example.org:443,8443");
        assert_eq!(e.spec.limits.resolve(&JobLimits::default()).max_connections, 4);
        std::fs::write(&path, r#"{"jobs": [{"namespace": "team", "uid": "u1", "allow": ["0x7f.1"]}]}"#).unwrap();
        let err = reg.load_file(&path).unwrap_err().to_string();
        assert!(err.contains("IP address literal"), "{err}");
        // A failed load leaves the registry as it was.
        assert_eq!(reg.len(), 1);
    }
}
