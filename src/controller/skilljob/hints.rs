//! Which runs' stored outputs the artifact endpoint has announced: the
//! mark the follower ([`super::stored`]) leaves for the reconcile. Apart
//! from the follower so that the reconcilers' shared context can hold it.

use std::collections::HashSet;
use std::sync::Mutex;

/// Marks kept at most; past it the oldest knowledge is dropped (a mark
/// nobody takes belongs to a run that ended another way).
const MAX_HINTS: usize = 10_000;

/// Jobs (namespace, UID) whose outputs were announced as stored.
#[derive(Debug, Default)]
pub struct StoredHints(Mutex<HashSet<(String, String)>>);

impl StoredHints {
    pub fn mark(&self, ns: &str, uid: &str) {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if set.len() >= MAX_HINTS {
            set.clear();
        }
        set.insert((ns.to_string(), uid.to_string()));
    }

    /// Whether the job's outputs were announced, forgetting the mark.
    pub fn take(&self, ns: &str, uid: &str) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&(ns.to_string(), uid.to_string()))
    }
}
