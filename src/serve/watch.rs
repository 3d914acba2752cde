//! `serve --watch`: the skills roots (and the grants file) are watched, and
//! after a quiet moment the catalog is scanned again and swapped in
//! ([`crate::mcp::snapshot::SnapshotCell::replace`]). A swap that changed
//! what clients see sends them `list_changed` ([`crate::mcp::notify`]); a
//! save that changed nothing sends nothing. Calls in flight keep the
//! snapshot they started with.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{new_debouncer, DebounceEventResult};

use crate::core::declaration::Interpreter;
use crate::core::grants::Grants;
use crate::mcp::snapshot::Snapshot;
use crate::mcp::state::ServerState;
use crate::shutdown::Shutdown;

/// How long the tree must be quiet before a rescan: an editor's save or a
/// `git checkout` is many events, and one scan should follow them all.
pub const DEBOUNCE: Duration = Duration::from_millis(250);

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch {path} for changes: {source} (on Linux, raise fs.inotify.max_user_watches, or serve without --watch)")]
    Watch { path: PathBuf, source: notify_debouncer_mini::notify::Error },
    #[error("cannot start the file watcher: {0}")]
    Start(notify_debouncer_mini::notify::Error),
}

/// What a rescan needs: the same inputs the first scan had.
#[derive(Debug, Clone)]
pub struct Rescan {
    pub roots: Vec<PathBuf>,
    pub layout: crate::core::discovery::Layout,
    pub grants_file: Option<PathBuf>,
    pub interpreters: BTreeSet<Interpreter>,
}

impl Rescan {
    /// A fresh snapshot (blocking: it scans the roots). Grants are read
    /// again, so an edited grants file takes effect too.
    pub fn snapshot(&self) -> Snapshot {
        let lookup = |k: &str| std::env::var(k).ok();
        let grants = Grants::resolve(&lookup, self.grants_file.as_deref());
        Snapshot::scan_with(&self.roots, self.layout, grants, self.interpreters.clone())
    }
}

/// Watch until shutdown, swapping in a new snapshot after every quiet
/// change. Returns once the watcher is set up (its errors are the caller's).
pub fn spawn(state: Arc<ServerState>, rescan: Rescan, shutdown: Shutdown) -> Result<(), WatchError> {
    // One pending wake-up is enough: a rescan reads the whole tree anyway.
    let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(1);
    let mut debouncer = new_debouncer(DEBOUNCE, move |events: DebounceEventResult| match events {
        Ok(_) => {
            let _ = wake.try_send(());
        }
        Err(err) => tracing::warn!(%err, "file watcher error"),
    })
    .map_err(WatchError::Start)?;
    for root in &rescan.roots {
        watch(&mut debouncer, root, RecursiveMode::Recursive)?;
    }
    if let Some(file) = &rescan.grants_file {
        // The directory, not the file: editors replace a file by renaming over it.
        let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        watch(&mut debouncer, dir, RecursiveMode::NonRecursive)?;
    }
    tokio::spawn(async move {
        // The debouncer stops watching when dropped: it lives as long as this task.
        let _debouncer = debouncer;
        loop {
            tokio::select! {
                _ = shutdown.wait() => return,
                woke = woken.recv() => if woke.is_none() { return },
            }
            let rescan = rescan.clone();
            let next = match tokio::task::spawn_blocking(move || rescan.snapshot()).await {
                Ok(next) => next,
                Err(err) => {
                    tracing::error!(%err, "rescan failed; keeping the current catalog");
                    continue;
                }
            };
            let (skills, problems) = (next.catalog.skills.len(), next.problems.len());
            if state.snapshots.replace(next) {
                tracing::info!(skills, problems, "catalog changed; clients notified");
            } else {
                tracing::debug!("rescan found no change");
            }
        }
    });
    Ok(())
}

fn watch(
    debouncer: &mut notify_debouncer_mini::Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>,
    path: &Path,
    mode: RecursiveMode,
) -> Result<(), WatchError> {
    debouncer.watcher().watch(path, mode).map_err(|source| WatchError::Watch { path: path.to_path_buf(), source })
}
