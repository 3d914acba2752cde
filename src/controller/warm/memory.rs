//! What the controller remembers of its pools: when each binding last had
//! a run, and the runs that found its pool empty. Lost on a restart on
//! purpose: a new controller keeps every pool full for one idle timeout.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `(namespace, binding name)`.
pub type PoolId = (String, String);

#[derive(Debug, Clone)]
struct Usage {
    last_run: Instant,
    /// Runs that started cold because the pool was empty, newest last.
    misses: Vec<Instant>,
}

pub struct WarmPools {
    usage: Mutex<HashMap<PoolId, Usage>>,
    /// Runs (namespace, SkillJob uid) whose claim this process handed over.
    handed: Mutex<std::collections::HashSet<(String, String)>>,
    /// Wakes the pool loop at once (a claim took a pod, a run missed).
    wake: tokio::sync::Notify,
}

impl Default for WarmPools {
    fn default() -> Self {
        WarmPools { usage: Mutex::default(), handed: Mutex::default(), wake: tokio::sync::Notify::new() }
    }
}

impl WarmPools {
    /// A run of the binding was admitted; `missed`: it found no warm pod.
    pub fn ran(&self, id: PoolId, missed: bool) {
        let now = Instant::now();
        let mut usage = self.usage.lock().expect("lock poisoned");
        let u = usage.entry(id).or_insert(Usage { last_run: now, misses: Vec::new() });
        u.last_run = now;
        if missed {
            u.misses.push(now);
        }
        drop(usage);
        self.wake.notify_one();
    }

    /// How many pods the pool should hold now: none once idle past its
    /// timeout, else `min`, raised by the runs that found it empty within
    /// the timeout, capped at `max`.
    pub fn target(&self, id: &PoolId, min: u32, max: u32, idle: Duration) -> u32 {
        let mut usage = self.usage.lock().expect("lock poisoned");
        // A pool first seen now (a new `spec.warm`, a new controller) is
        // kept full for one idle timeout from now, as if it had just run.
        let u = usage.entry(id.clone()).or_insert_with(|| Usage { last_run: Instant::now(), misses: Vec::new() });
        u.misses.retain(|at| at.elapsed() < idle);
        let (last, misses) = (u.last_run, u.misses.len() as u32);
        if last.elapsed() >= idle {
            return 0;
        }
        min.max(misses).min(max)
    }

    /// Whether this process handed the run's claim over (a new controller
    /// hands every claimed run's over once more: the endpoint takes the
    /// same claim again as a no-op).
    pub fn handed(&self, ns: &str, uid: &str) -> bool {
        self.handed.lock().expect("lock poisoned").contains(&(ns.to_string(), uid.to_string()))
    }

    pub fn set_handed(&self, ns: &str, uid: &str, handed: bool) {
        let mut set = self.handed.lock().expect("lock poisoned");
        let key = (ns.to_string(), uid.to_string());
        if handed {
            set.insert(key);
        } else {
            set.remove(&key);
        }
    }

    /// Forget pools whose bindings are gone.
    pub fn retain(&self, keep: impl Fn(&PoolId) -> bool) {
        self.usage.lock().expect("lock poisoned").retain(|id, _| keep(id));
    }

    pub async fn woken(&self) {
        self.wake.notified().await
    }

    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> PoolId {
        ("team".into(), "report".into())
    }

    #[test]
    fn a_pool_holds_min_grows_with_misses_up_to_max_and_empties_when_idle() {
        let pools = WarmPools::default();
        let idle = Duration::from_secs(60);
        // A pool first seen (a new controller, a new spec.warm) is kept full from then.
        assert_eq!(pools.target(&id(), 1, 3, idle), 1);
        assert_eq!(pools.target(&("team".into(), "added-late".into()), 2, 3, idle), 2);
        pools.ran(id(), true);
        pools.ran(id(), true);
        assert_eq!(pools.target(&id(), 1, 3, idle), 2);
        for _ in 0..5 {
            pools.ran(id(), true);
        }
        assert_eq!(pools.target(&id(), 1, 3, idle), 3, "never above max");
        assert_eq!(pools.target(&id(), 0, 3, Duration::ZERO), 0, "idle past its timeout: empty");
    }
}
