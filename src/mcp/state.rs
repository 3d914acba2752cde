//! What a server (one standalone process, or one gateway namespace) holds:
//! the current skills snapshot and, when it runs scripts, the execution
//! seam with its confirmation gate. Shared by every session.

use std::sync::Arc;

use crate::core::confirm::{ConfirmMode, Confirmations};

use super::executor::Executor;
use super::snapshot::{Snapshot, SnapshotCell};

/// How runs happen: the backend, the confirmation tokens and the mode.
pub struct Execution {
    pub executor: Arc<dyn Executor>,
    pub confirmations: Confirmations,
    pub mode: ConfirmMode,
}

impl Execution {
    pub fn new(executor: Arc<dyn Executor>, mode: ConfirmMode) -> Self {
        Execution { executor, confirmations: Confirmations::default(), mode }
    }
}

/// Everything a request handler needs.
pub struct ServerState {
    pub snapshots: SnapshotCell,
    /// `None`: this server only reads skills (no run or job tools).
    pub execution: Option<Execution>,
}

impl ServerState {
    pub fn new(snapshot: Snapshot) -> Self {
        ServerState { snapshots: SnapshotCell::new(snapshot), execution: None }
    }

    pub fn with_execution(mut self, execution: Execution) -> Self {
        self.execution = Some(execution);
        self
    }

    /// The snapshot a call works on, from its start to its end.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshots.load()
    }
}
