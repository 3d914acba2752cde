//! Whether a cached SkillJob that says its run has not started can be
//! believed, without asking the API server.
//!
//! A Job is created only from a copy of the SkillJob that says none was
//! made. The cache can be behind the API server (after a restart, a lost
//! watch, or this process's own status write whose echo the watch has not
//! delivered yet), and a run's Job is deleted once its verdict is recorded:
//! a Job created from a copy that predates the verdict would be accepted
//! and run the script a second time. Every start used to read the API
//! server's copy first, one GET per run: a third of what a run cost the API
//! server on the way to its Job.
//!
//! The read is now made only when the cached copy cannot be vouched for.
//! Three facts make the vouching sound:
//! - a run's start (a recorded Job or warm pod, or a final phase) is never
//!   undone: every status write is guarded by the version it was derived
//!   from, and nothing clears those fields;
//! - this controller is the only writer of a SkillJob's status, and a
//!   leader that loses its lease stops writing before another may start:
//!   what an earlier leader wrote came before this replica's term began;
//! - the cache only moves forward (watch events in order, relists are
//!   quorum reads), and a reconcile is handed the cache's copy of its day.
//!
//! So, for one term, a cached copy shows every start once it shows
//! - this process's own last status write to it (the version that write
//!   returned; a write whose answer was lost is not known), and, before
//!   any, the API server's copy of the term's start (one paged metadata
//!   list at the term's first start: a SkillJob it did not hold is newer);
//! - and from then on, any copy does: versions are compared for equality
//!   only, and an entry is dropped once the cache has shown it.
//!
//! Anything else is read from the API server, as before.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::controller::lean_list;

/// How many SkillJobs one request of the term's list asks for.
pub const LIST_PAGE: u32 = 500;

/// What this replica knows of the API server's SkillJobs for the start rule.
#[derive(Default)]
pub struct StartGuard {
    views: Mutex<Views>,
    /// Held while the term's list is read: starts at once wait for one list.
    listing: tokio::sync::Mutex<()>,
}

impl StartGuard {
    /// Whether the cached copy of the SkillJob `uid` at `version` (one
    /// that says its run has not started) shows every start made so far;
    /// reads the term's list first (the SkillJobs matching `selector`, through
    /// `client`) if this term has none yet.
    pub async fn vouches(
        &self,
        client: &kube::Client,
        selector: Option<&str>,
        term: u64,
        uid: &str,
        version: &str,
    ) -> Result<bool, kube::Error> {
        if !self.views(term).listed {
            let _one = self.listing.lock().await;
            if !self.views(term).listed {
                let keep = |m: lean_list::Meta| Some((m.uid?, m.resource_version?));
                let listed = lean_list::list_metadata::<crate::api::job::SkillJob, _>(client, selector, LIST_PAGE, keep).await?;
                tracing::debug!(skilljobs = listed.len(), term, "read the SkillJobs' versions at the start of the term");
                self.views(term).listed(listed);
            }
        }
        Ok(self.views(term).shows_all(uid, version))
    }

    /// A reconcile's copy of the SkillJob `uid` at `version`, which says
    /// its run `started` or not: forgets what the cache has caught up with.
    pub fn seen(&self, term: u64, uid: &str, version: &str, started: bool) {
        let mut views = self.views(term);
        if started {
            views.forget(uid);
        } else {
            views.shows_all(uid, version);
        }
    }

    /// A status write to the SkillJob `uid` is about to be sent.
    pub fn writing(&self, term: u64, uid: &str) {
        self.views(term).written.insert(uid.to_string(), None);
    }

    /// The write was applied and gave the SkillJob `version`.
    pub fn wrote(&self, term: u64, uid: &str, version: Option<String>) {
        self.views(term).written.insert(uid.to_string(), version);
    }

    /// The SkillJob is gone (its finalizer's cleanup ran).
    pub fn forget(&self, term: u64, uid: &str) {
        self.views(term).forget(uid);
    }

    /// How many SkillJobs the cache has yet to catch up with.
    #[cfg(test)]
    fn pending(&self, term: u64) -> usize {
        let views = self.views(term);
        views.written.len() + views.at_list.keys().filter(|uid| !views.written.contains_key(*uid)).count()
    }

    fn views(&self, term: u64) -> MutexGuard<'_, Views> {
        let mut views = self.views.lock().expect("lock poisoned");
        views.begin(term);
        views
    }
}

/// One term's knowledge, by SkillJob UID. An entry is a version the cache
/// must show before its copies are believed; it goes once the cache has.
#[derive(Default, Debug)]
struct Views {
    term: u64,
    /// Whether the term's list has been read.
    listed: bool,
    /// The version each SkillJob had in the term's list.
    at_list: HashMap<String, String>,
    /// The version this process's last status write gave each SkillJob
    /// (`None`: sent, and not known to have been applied or not).
    written: HashMap<String, Option<String>>,
}

impl Views {
    /// What an earlier term learnt may have been undone by another leader since.
    fn begin(&mut self, term: u64) {
        if self.term != term {
            *self = Views { term, ..Views::default() };
        }
    }

    fn listed(&mut self, versions: Vec<(String, String)>) {
        self.listed = true;
        self.at_list = versions.into_iter().collect();
    }

    /// The rule: the copy at `version` shows every start when it is this
    /// process's last write to it, or (with none) the list's copy, or
    /// (with neither) any copy of a listed term.
    fn shows_all(&mut self, uid: &str, version: &str) -> bool {
        // Our own write is the newer knowledge, whenever the list was read.
        let expected = match (self.written.get(uid), self.at_list.get(uid)) {
            (Some(written), _) => written.as_deref(),
            (None, Some(listed)) => Some(listed.as_str()),
            (None, None) => return self.listed,
        };
        if expected != Some(version) {
            return false;
        }
        self.forget(uid);
        true
    }

    fn forget(&mut self, uid: &str) {
        self.written.remove(uid);
        self.at_list.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(versions: &[(&str, &str)]) -> Views {
        let mut views = Views { term: 1, ..Views::default() };
        views.listed(versions.iter().map(|(u, v)| (u.to_string(), v.to_string())).collect());
        views
    }

    #[test]
    fn nothing_is_believed_before_the_term_s_list() {
        let mut views = Views { term: 1, ..Views::default() };
        assert!(!views.shows_all("a", "1"));
        views.listed(Vec::new());
        assert!(views.shows_all("a", "1"), "a SkillJob the list did not hold is newer than it");
    }

    #[test]
    fn a_listed_skilljob_is_believed_at_the_list_s_version_and_after() {
        let mut views = listed(&[("a", "5")]);
        assert!(!views.shows_all("a", "4"), "a copy older than the list may predate a start");
        assert!(!views.shows_all("a", "6"), "versions are compared for equality only: another is read");
        assert!(views.shows_all("a", "5"));
        // The cache has shown the list's copy: every later one is at least as new.
        assert!(views.shows_all("a", "6"));
        assert!(views.at_list.is_empty());
    }

    #[test]
    fn after_its_own_write_a_copy_is_believed_only_once_it_shows_that_write() {
        let mut views = listed(&[("a", "5")]);
        views.written.insert("a".into(), None);
        assert!(!views.shows_all("a", "5"), "the write may have been applied: the list's copy predates it");
        assert!(!views.shows_all("a", "6"), "the write's version is not known: nothing is believed");
        views.written.insert("a".into(), Some("7".into()));
        assert!(!views.shows_all("a", "5"));
        assert!(!views.shows_all("a", "6"));
        assert!(views.shows_all("a", "7"));
        assert!(views.shows_all("a", "8"), "caught up: forgotten");
        assert!(views.written.is_empty() && views.at_list.is_empty());
    }

    #[test]
    fn a_write_made_before_the_list_still_decides() {
        let mut views = Views { term: 1, ..Views::default() };
        views.written.insert("a".into(), Some("7".into()));
        views.listed(vec![("a".into(), "8".into())]);
        assert!(!views.shows_all("a", "6"));
        assert!(views.shows_all("a", "7"));
    }

    #[test]
    fn a_new_term_forgets_the_last_one() {
        let mut views = listed(&[]);
        views.written.insert("a".into(), Some("7".into()));
        views.begin(2);
        assert!(!views.listed && views.written.is_empty());
        assert!(!views.shows_all("b", "1"), "the new term needs its own list");
    }

    #[test]
    fn a_copy_that_shows_the_start_is_the_end_of_the_entry() {
        let guard = StartGuard::default();
        guard.views(1).listed(vec![("u".into(), "5".into())]);
        guard.writing(1, "u");
        guard.seen(1, "u", "6", false);
        assert_eq!(guard.pending(1), 1, "a copy that does not show the write leaves it expected");
        guard.seen(1, "u", "6", true);
        assert_eq!(guard.pending(1), 0);
    }
}
