//! What this process remembers of its stagings, and the gate runs share
//! with the sweep (the rules are in the module above).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a staging this process made is trusted without staging again.
pub const REMEMBER_FOR: Duration = super::super::lookups::REMEMBER_FOR;
/// How many remembered stagings make the map drop its stale ones.
const REMEMBERED_MAX: usize = 4096;

/// `(namespace, digest)`.
pub(super) type Key = (String, String);

#[derive(Default)]
pub struct StagedPackages {
    /// Staged by this process: when, in which leadership term.
    remembered: Mutex<HashMap<Key, (Instant, u64)>>,
    /// Shared from a run's staging to its Job's creation; the sweep's alone.
    pub(super) gate: tokio::sync::RwLock<()>,
}

impl StagedPackages {
    /// Held by a run from its staging until its Job exists (or it gave up).
    pub async fn gate(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }

    pub(super) fn fresh(&self, key: &Key, term: u64) -> bool {
        let map = self.remembered.lock().expect("lock poisoned");
        map.get(key).is_some_and(|(at, t)| *t == term && at.elapsed() < REMEMBER_FOR)
    }

    pub(super) fn remember(&self, key: Key, term: u64) {
        let mut map = self.remembered.lock().expect("lock poisoned");
        if map.len() >= REMEMBERED_MAX {
            map.retain(|_, (at, _)| at.elapsed() < REMEMBER_FOR);
        }
        map.insert(key, (Instant::now(), term));
    }

    pub(super) fn forget(&self, key: &Key) {
        self.remembered.lock().expect("lock poisoned").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, d: &str) -> Key {
        (ns.to_string(), d.to_string())
    }

    #[test]
    fn a_staging_is_trusted_for_one_term_and_a_while() {
        let s = StagedPackages::default();
        let k = key("team", "sha256:a");
        assert!(!s.fresh(&k, 1));
        s.remember(k.clone(), 1);
        assert!(s.fresh(&k, 1));
        assert!(!s.fresh(&k, 2), "a staging of an earlier term was trusted (another leader may have swept it)");
        s.remembered.lock().unwrap().insert(k.clone(), (Instant::now() - REMEMBER_FOR, 1));
        assert!(!s.fresh(&k, 1), "a staging older than REMEMBER_FOR was trusted");
        s.remember(k.clone(), 1);
        s.forget(&k);
        assert!(!s.fresh(&k, 1), "a swept copy was still trusted");
    }

    #[tokio::test]
    async fn the_sweep_waits_for_runs_between_staging_and_their_job() {
        let s = StagedPackages::default();
        let run = s.gate().await;
        assert!(s.gate.try_write().is_err(), "the sweep could run while a run was between its staging and its Job");
        drop(run);
        assert!(s.gate.try_write().is_ok());
    }
}
