//! Dedicated uids for runs (`--run-as-uids FIRST-LAST`).
//!
//! Without the sandbox, two runs under one uid can read and rewrite each
//! other's inputs, outputs and streams, and signal or trace each other's
//! processes. So a root server gives every run a uid of its own from a
//! range nothing else uses: the run's job directory is `0700` to that uid
//! while it runs; when the run ends, every process left under the uid is
//! killed, the job directory goes back to the server, and only then is the
//! uid free for another run. A later run under the same uid therefore
//! finds nothing of the earlier one it could open. Without a range, a root
//! server refuses unsandboxed runs (sandboxed runs keep the default uid:
//! each sees only its own `/work` and its own PID namespace).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::core::limits::RUN_UID_RANGE_MAX;

/// A range of dedicated uids, as the flag gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

/// Why a uid range was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UidRangeError {
    #[error("{0:?} is not a uid range: give FIRST-LAST (e.g. 62000-62099) or one uid")]
    Syntax(String),
    #[error("uid range {first}-{last} is empty (FIRST must not be above LAST)")]
    Empty { first: u32, last: u32 },
    #[error("uid range {first}-{last} holds {count} uids; at most {RUN_UID_RANGE_MAX}")]
    TooLarge { first: u32, last: u32, count: u64 },
    #[error("uid range {first}-{last} includes uid {uid}, which is not a dedicated uid (root, the server's own, or nobody)")]
    Reserved { first: u32, last: u32, uid: u32 },
}

impl std::str::FromStr for UidRange {
    type Err = UidRangeError;
    fn from_str(text: &str) -> Result<UidRange, UidRangeError> {
        let bad = || UidRangeError::Syntax(text.to_string());
        let (first, last) = match text.split_once('-') {
            Some((a, b)) => (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?),
            None => {
                let uid = text.trim().parse().map_err(|_| bad())?;
                (uid, uid)
            }
        };
        UidRange::new(first, last)
    }
}

impl UidRange {
    pub fn new(first: u32, last: u32) -> Result<UidRange, UidRangeError> {
        if first > last {
            return Err(UidRangeError::Empty { first, last });
        }
        let count = u64::from(last - first) + 1;
        if count > u64::from(RUN_UID_RANGE_MAX) {
            return Err(UidRangeError::TooLarge { first, last, count });
        }
        // SAFETY: trivial getter.
        let own = unsafe { libc::geteuid() };
        for uid in [0, own, super::process::NOBODY_UID] {
            if (first..=last).contains(&uid) {
                return Err(UidRangeError::Reserved { first, last, uid });
            }
        }
        Ok(UidRange { first, last })
    }

    pub fn len(&self) -> usize {
        (self.last - self.first) as usize + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// The free uids of a range.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
    free: Mutex<BTreeSet<u32>>,
}

/// A uid taken for one run; back in the pool when dropped.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    pool: Arc<UidPool>,
}

impl UidLease {
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).insert(self.uid);
    }
}

impl UidPool {
    pub fn new(range: UidRange) -> Arc<UidPool> {
        Arc::new(UidPool { range, free: Mutex::new((range.first..=range.last).collect()) })
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// The lowest free uid, or `None` when every one is in use.
    pub fn take(self: &Arc<Self>) -> Option<UidLease> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let uid = *free.iter().next()?;
        free.remove(&uid);
        Some(UidLease { uid, pool: self.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_shared_uids() {
        assert_eq!("62000-62009".parse::<UidRange>().unwrap().len(), 10);
        assert_eq!("62000".parse::<UidRange>().unwrap().to_string(), "62000");
        assert!(matches!("x-1".parse::<UidRange>(), Err(UidRangeError::Syntax(_))));
        assert!(matches!("5-4".parse::<UidRange>(), Err(UidRangeError::Empty { .. })));
        assert!(matches!("65000-65535".parse::<UidRange>(), Err(UidRangeError::Reserved { uid: 65534, .. })));
        assert!(matches!("0-10".parse::<UidRange>(), Err(UidRangeError::Reserved { uid: 0, .. })));
        assert!(matches!("100000-300000".parse::<UidRange>(), Err(UidRangeError::TooLarge { .. })));
    }

    #[test]
    fn a_uid_is_leased_to_one_run_at_a_time() {
        let pool = UidPool::new("62000-62001".parse().unwrap());
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_ne!(a.uid(), b.uid());
        assert!(pool.take().is_none());
        let freed = a.uid();
        drop(a);
        assert_eq!(pool.take().unwrap().uid(), freed);
    }
}
