//! A run's limits, checked while it runs and once more after it ends.
//!
//! The kernel enforces what it can at once (the cgroup's memory and
//! process limits, the tmpfs size, the per-file size); this watcher turns
//! each of those hits, and the one limit the kernel cannot enforce here
//! (the job's disk budget on `/work`, an ordinary directory), into a run
//! that is stopped and reported `limit-exceeded` with the limit named:
//!
//! - **memory**: the cgroup counted an OOM kill;
//! - **pids**: the cgroup refused a fork at its process limit (a fork bomb
//!   would otherwise spin until its timeout);
//! - **disk**: `/work` uses more than the job's cap (allocated blocks, so a
//!   sparse file costs what it stores), or holds more than
//!   [`RUN_WORK_ENTRIES`] entries; or the run's tmpfs is full.
//!
//! Every [`RUN_WATCH_INTERVAL`] a check runs on the blocking pool; the
//! first hit kills the whole cgroup (every process, wherever it went) and
//! tells the executor, which kills the process group and records the
//! limit. After the run, the same check runs once more, so a run that
//! passed a limit and exited before the next tick is still reported. The
//! interval is the only slack: `/work` can grow past its cap by what the
//! script writes in one interval before it is stopped (and each file stays
//! under `RLIMIT_FSIZE`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::api::outcome::LimitHit;
use crate::core::limits::{bytes_text, count_text, RUN_MEMORY_BYTES, RUN_PIDS, RUN_TMP_BYTES, RUN_WATCH_INTERVAL, RUN_WORK_ENTRIES};
use crate::shutdown::Shutdown;

use super::cgroup::RunCgroup;
use super::tmpfs::RunTmpfs;

/// A limit a run passed, and the sentence that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub limit: LimitHit,
    pub note: String,
}

/// What one run is watched for.
pub struct Watch {
    /// The run's cgroup, when it has one.
    pub cgroup: Option<Arc<RunCgroup>>,
    /// The job's work directory on the host.
    pub work: PathBuf,
    /// Bytes `/work` may use.
    pub work_bytes: u64,
    /// The run's tmpfs, when the server mounted one.
    pub tmpfs: Option<Arc<RunTmpfs>>,
}

/// Disk use of a tree: allocated bytes and entries, never following a link.
/// Stops counting once `max_entries` is passed.
pub fn usage(root: &Path, max_entries: usize) -> (u64, usize) {
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0u64;
    let mut entries = 0usize;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(iter) = std::fs::read_dir(&dir) else { continue };
        for entry in iter.flatten() {
            entries += 1;
            if entries > max_entries {
                return (bytes, entries);
            }
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
            bytes = bytes.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    (bytes, entries)
}

impl Watch {
    /// One check of every limit (blocking: reads cgroup files and walks `/work`).
    pub fn check(&self) -> Option<Finding> {
        if let Some(cg) = &self.cgroup {
            let c = cg.counters();
            if c.oom_kills > 0 {
                return Some(Finding {
                    limit: LimitHit::Memory,
                    note: format!(
                        "the run passed its memory limit ({} for all its processes, shared memory and tmpfs included): the kernel killed a process and the run was stopped",
                        bytes_text(RUN_MEMORY_BYTES)
                    ),
                });
            }
            if c.pids_refused > 0 {
                return Some(Finding {
                    limit: LimitHit::Pids,
                    note: format!(
                        "the run reached its process limit ({} processes and threads): a fork was refused and the run was stopped",
                        RUN_PIDS
                    ),
                });
            }
        }
        if let Some(tmpfs) = &self.tmpfs {
            if tmpfs.is_full() {
                return Some(Finding {
                    limit: LimitHit::Disk,
                    note: format!("the run filled its tmpfs (/tmp and /dev/shm, {} together) and was stopped", bytes_text(RUN_TMP_BYTES)),
                });
            }
        }
        let (bytes, entries) = usage(&self.work, RUN_WORK_ENTRIES);
        if entries > RUN_WORK_ENTRIES {
            return Some(Finding {
                limit: LimitHit::Disk,
                note: format!("the run left more than {} entries in /work and was stopped", count_text(RUN_WORK_ENTRIES)),
            });
        }
        if bytes > self.work_bytes {
            return Some(Finding {
                limit: LimitHit::Disk,
                note: format!(
                    "/work passed the job's disk limit ({}; it used {} bytes) and the run was stopped",
                    bytes_text(self.work_bytes),
                    bytes
                ),
            });
        }
        None
    }

    /// Kill every process of the run (its cgroup), when it has one.
    fn kill(&self) {
        if let Some(cg) = &self.cgroup {
            cg.kill_all();
        }
    }

    /// Check every [`RUN_WATCH_INTERVAL`] until `stop`; on the first hit,
    /// kill the run and send the limit on `tx`. Returns the finding.
    pub fn spawn(self: Arc<Self>, tx: watch::Sender<Option<LimitHit>>, stop: Shutdown) -> tokio::task::JoinHandle<Option<Finding>> {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(RUN_WATCH_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // the first tick is immediate
            loop {
                tokio::select! {
                    biased;
                    _ = stop.wait() => return None,
                    _ = ticks.tick() => {}
                }
                let me = self.clone();
                let found = tokio::task::spawn_blocking(move || me.check().inspect(|_| me.kill())).await.ok().flatten();
                if let Some(finding) = found {
                    let _ = tx.send(Some(finding.limit));
                    return Some(finding);
                }
            }
        })
    }
}
