//! What a server (one standalone process, or one gateway namespace) holds:
//! the current skills snapshot and, when it runs scripts, the execution
//! seam with its confirmation gate. Shared by every session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::confirm::{ConfirmMode, ConfirmStore, Confirmations};

use super::error::ToolError;
use super::executor::{Caller, Executor, Tasks};
use super::ratelimit::{LimiterSlot, Policy};
use super::snapshot::{Snapshot, SnapshotCell};
use crate::core::limits::GATEWAY_SETTLE_WAIT as SETTLE_WAIT;

/// What a request wants to do, as an authorizer sees it. Every tool maps
/// to exactly one ([`Action::of_tool`]); the gateway asks a
/// SubjectAccessReview for each, the standalone server has no authorizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// List and read skills (tools/list, prompts, resources, skills/*, the read tools).
    ReadSkills,
    /// Start work: create a job, upload to it, run it.
    Run,
    /// Read jobs: status, output, list, tasks/get.
    ReadJobs,
    /// Delete or cancel a job.
    DeleteJobs,
    /// Search the catalog of public skills (`skill_search` scope `catalog`):
    /// asked on top of [`Action::ReadSkills`], by those who may install
    /// what they find. Decided cluster-wide, not in the path's namespace.
    SearchCatalog,
}

impl Action {
    /// The action a tool call is. An unknown tool reads skills: it is
    /// refused as unknown after authorization.
    pub fn of_tool(tool: &str) -> Action {
        match tool {
            "skill_run" | "skill_job_create" | "skill_job_upload" | "skill_job_run" => Action::Run,
            "skill_job_status" | "skill_job_read" | "skill_job_list" => Action::ReadJobs,
            "skill_job_delete" => Action::DeleteJobs,
            _ => Action::ReadSkills,
        }
    }
}

/// Decides whether a caller may do an action on this server. An `Err` is
/// what the caller reads (code `forbidden`, naming what is missing).
#[async_trait::async_trait]
pub trait Authorize: Send + Sync {
    async fn authorize(&self, caller: &Caller, action: Action) -> Result<(), ToolError>;
}

/// How runs happen: the backend, the confirmation tokens and the mode.
pub struct Execution {
    pub executor: Arc<dyn Executor>,
    pub confirmations: Arc<dyn ConfirmStore>,
    pub mode: ConfirmMode,
    /// What a token is bound to besides the call and the caller: the
    /// gateway's namespace (empty for the standalone server).
    pub scope: String,
    /// `Some`: `skill_run` can answer a client that declared the tasks
    /// extension with a task (and the server advertises it).
    pub tasks: Option<Arc<dyn Tasks>>,
}

impl Execution {
    /// Tokens kept in this process's memory.
    pub fn new(executor: Arc<dyn Executor>, mode: ConfirmMode) -> Self {
        Execution { executor, confirmations: Arc::new(Confirmations::default()), mode, scope: String::new(), tasks: None }
    }

    /// Tokens from `store`, bound to `scope`.
    pub fn with_confirmations(mut self, store: Arc<dyn ConfirmStore>, scope: impl Into<String>) -> Self {
        self.confirmations = store;
        self.scope = scope.into();
        self
    }

    /// Runs `skill_run` as an MCP task for clients that declared the tasks extension.
    pub fn with_tasks(mut self, tasks: Arc<dyn Tasks>) -> Self {
        self.tasks = Some(tasks);
        self
    }
}

/// Everything a request handler needs.
pub struct ServerState {
    pub snapshots: SnapshotCell,
    /// `None`: this server only reads skills (no run or job tools).
    pub execution: Option<Execution>,
    /// `None`: every caller that reached the server may do everything
    /// (stdio, or HTTP behind its own bearer check).
    pub authorizer: Option<std::sync::Arc<dyn Authorize>>,
    /// The catalog `skill_search` scope `catalog` answers from
    /// ([`Self::with_catalog`]); `None` (serve): that scope says to use
    /// `skill-operator catalog search`.
    pub catalog: Option<Arc<crate::catalog::live::LiveCatalog>>,
    /// Offer no tools while the snapshot has no skill (the gateway: a
    /// namespace without a ready binding shows nothing to call).
    pub tools_only_when_bound: bool,
    /// Calls and runs per principal ([`Self::with_rate_limits`]; unlimited by
    /// default); a gateway namespace's change with its annotation.
    pub rate_limits: LimiterSlot,
    /// Where this server's audit records go ([`Self::with_audit`]; off by default).
    pub audit: crate::audit::Audit,
    /// The snapshot generation (plus one) whose settling [`Self::settled`]
    /// waited out; 0: none.
    waited_out: AtomicU64,
}

impl ServerState {
    pub fn new(snapshot: Snapshot) -> Self {
        ServerState {
            snapshots: SnapshotCell::new(snapshot),
            execution: None,
            authorizer: None,
            catalog: None,
            tools_only_when_bound: false,
            rate_limits: LimiterSlot::default(),
            audit: crate::audit::Audit::off(),
            waited_out: AtomicU64::new(0),
        }
    }

    pub fn with_authorizer(mut self, authorizer: std::sync::Arc<dyn Authorize>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }

    /// Answers `skill_search` scope `catalog` from `catalog`.
    pub fn with_catalog(mut self, catalog: Arc<crate::catalog::live::LiveCatalog>) -> Self {
        self.catalog = Some(catalog);
        self
    }

    /// Limits every principal's tool calls and runs on this server.
    pub fn with_rate_limits(mut self, policy: impl Into<Policy>) -> Self {
        self.rate_limits = LimiterSlot::new(policy.into());
        self
    }

    /// Writes this server's audit records to `audit`.
    pub fn with_audit(mut self, audit: crate::audit::Audit) -> Self {
        self.audit = audit;
        self
    }

    /// Whether `caller` may do `action` here.
    pub async fn authorize(&self, caller: &Caller, action: Action) -> Result<(), ToolError> {
        match &self.authorizer {
            Some(a) => a.authorize(caller, action).await,
            None => Ok(()),
        }
    }

    /// See [`Self::tools_only_when_bound`].
    pub fn tools_only_when_bound(mut self) -> Self {
        self.tools_only_when_bound = true;
        self
    }

    pub fn with_execution(mut self, execution: Execution) -> Self {
        self.execution = Some(execution);
        self
    }

    /// The snapshot a call works on, from its start to its end.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshots.load()
    }

    /// The snapshot once nothing in it is still being decided, or as it is
    /// after [`SETTLE_WAIT`]: a caller who applies a binding and calls at
    /// once gets its skill, not an empty list that changes a moment later.
    /// A snapshot waited out once is not waited for again (a controller
    /// that is down must not make every call slow), a new one is.
    pub async fn settled(&self) -> Arc<Snapshot> {
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        // Subscribed before the first look, so a swap in between is seen.
        let mut changes = self.snapshots.subscribe();
        loop {
            let generation = *changes.borrow_and_update() + 1;
            let snap = self.snapshot();
            if !snap.settling || self.waited_out.load(Ordering::Relaxed) == generation {
                return snap;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => {
                    tracing::warn!("a binding here is still undecided after {SETTLE_WAIT:?}; answering without it");
                    self.waited_out.store(generation, Ordering::Relaxed);
                    return self.snapshot();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::grants::Grants;

    fn empty(settling: bool) -> Snapshot {
        let mut snap = Snapshot::scan(&[], Grants::resolve(&|_| None, None), Default::default());
        snap.settling = settling;
        snap
    }

    #[tokio::test(start_paused = true)]
    async fn a_settling_snapshot_is_waited_for_until_its_verdict() {
        let state = Arc::new(ServerState::new(empty(true)));
        let waiter = tokio::spawn({
            let state = state.clone();
            async move { state.settled().await.settling }
        });
        tokio::time::sleep(SETTLE_WAIT / 2).await;
        assert!(!waiter.is_finished(), "answered from a snapshot about to change");
        assert!(state.snapshots.replace(empty(false)), "settling is part of what changed");
        assert!(!waiter.await.unwrap(), "the settled snapshot is the one served");
    }

    #[tokio::test(start_paused = true)]
    async fn a_verdict_that_never_comes_costs_one_wait_at_most() {
        let state = ServerState::new(empty(true));
        let start = tokio::time::Instant::now();
        assert!(state.settled().await.settling, "answered as it is");
        assert_eq!(start.elapsed(), SETTLE_WAIT);
        let start = tokio::time::Instant::now();
        state.settled().await;
        assert_eq!(start.elapsed(), std::time::Duration::ZERO, "the same snapshot is not waited for twice");
        let mut next = empty(true);
        next.problems.push(crate::core::problems::Problem::new("skillbinding/b", crate::core::problems::Reason::RootUnreadable, "another"));
        assert!(state.snapshots.replace(next));
        let start = tokio::time::Instant::now();
        state.settled().await;
        assert_eq!(start.elapsed(), SETTLE_WAIT, "a new undecided binding is waited for again");
        let state = ServerState::new(empty(false));
        let start = tokio::time::Instant::now();
        state.settled().await;
        assert_eq!(start.elapsed(), std::time::Duration::ZERO, "a settled namespace never waits");
    }
}
