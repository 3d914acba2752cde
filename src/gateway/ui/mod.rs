//! The web console, `/ui`: a page a person opens in a browser to see what
//! the gateway serves them, with the same authentication and authorization
//! as an MCP client gets, and no weaker path to anything.
//!
//! - The page is plain HTML, CSS and JavaScript compiled into the binary
//!   ([`assets`]); nothing is fetched from anywhere else, and every
//!   answer under `/ui` carries a strict Content-Security-Policy
//!   ([`headers`]).
//! - Its JSON API (`/ui/api/…`, [`api`]) takes the token the person
//!   pasted as `Authorization: Bearer` (the page keeps it in
//!   sessionStorage and never puts it in a URL). Every namespaced route is
//!   behind [`require_caller`](super::auth::require_caller), the gate of
//!   `/mcp/{namespace}`; then each route asks the namespace's authorizer
//!   for the action its MCP tool needs (read jobs, run), and calls the MCP
//!   tool functions themselves (`skill_list`, `skill_load`, `skill_run`
//!   with its preview-and-confirm gate, the job tools), so ownership,
//!   limits and confirmation are theirs.
//! - The namespace list is the namespaces with bindings, each checked for
//!   `get skillbindings` by SubjectAccessReview (cached like every other
//!   decision): a person sees only the namespaces they could open.
//! - Live updates ([`events`]) are server-sent events read by `fetch`
//!   (so the token travels in a header), fed by a watch of the caller's
//!   SkillJobs in the namespace ([`feed`]); a stream ends when the token's
//!   cached review would, and the page reconnects through the gate again.

pub mod api;
pub mod assets;
pub mod events;
pub mod feed;
pub mod headers;
pub mod host;
pub mod limits;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use futures::stream::BoxStream;

use super::auth::{require_caller, Authenticator};
use super::http::{Readiness, NAMESPACE_PARAM};
use super::namespaces::Namespaces;
use crate::core::limits::MCP_BODY_LIMIT;
use crate::jobs::JobRecord;
use crate::mcp::executor::Caller;

/// Where the console is mounted.
pub const UI_PREFIX: &str = "/ui";

/// A change to one of the caller's jobs, as the events stream reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum JobChange {
    /// Created, or its phase or result changed.
    Changed(Box<JobRecord>),
    /// Deleted.
    Gone(String),
}

/// What the console asks of the gateway besides the namespaces' servers.
pub trait Directory: Send + Sync {
    /// Namespaces with at least one SkillBinding: the ones worth offering.
    fn bound_namespaces(&self) -> BTreeSet<String>;
    /// The caller's jobs in `namespace` as they change (`None`: this
    /// gateway has no job feed; the stream then reports skill changes only).
    fn job_changes(&self, namespace: &str, caller: &Caller) -> Option<BoxStream<'static, JobChange>>;
}

/// What the console's handlers share.
#[derive(Clone)]
pub struct Console {
    pub(crate) namespaces: Arc<Namespaces>,
    pub(crate) ready: Readiness,
    pub(crate) auth: Authenticator,
    pub(crate) directory: Arc<dyn Directory>,
    /// One permit per open event stream ([`limits::STREAMS_MAX`]).
    pub(crate) streams: Arc<tokio::sync::Semaphore>,
    /// Host names served ([`host`]); empty: any.
    pub(crate) allowed_hosts: Vec<String>,
    /// The `calls` budgets of the routes that name no namespace (`/ui/api/me`,
    /// `/ui/api/namespaces`): the gateway's own figures (`--rate-limits`).
    pub(crate) limits: Arc<crate::mcp::ratelimit::LimiterSlot>,
}

impl Console {
    pub fn new(namespaces: Arc<Namespaces>, ready: Readiness, auth: Authenticator, directory: Arc<dyn Directory>) -> Console {
        Console {
            namespaces,
            ready,
            auth,
            directory,
            streams: Arc::new(tokio::sync::Semaphore::new(limits::STREAMS_MAX)),
            allowed_hosts: Vec::new(),
            limits: Arc::default(),
        }
    }

    /// The figures of the routes that name no namespace (default: unlimited).
    pub fn with_rate_limits(mut self, limits: crate::mcp::ratelimit::RateLimits) -> Console {
        self.limits = Arc::new(crate::mcp::ratelimit::LimiterSlot::new(crate::mcp::ratelimit::Policy::Limits(limits)));
        self
    }

    /// Serve the console only under these Host names (the MCP endpoint's list).
    pub fn with_allowed_hosts(mut self, hosts: Vec<String>) -> Console {
        self.allowed_hosts = hosts;
        self
    }
}

/// The console's routes, for merging into the gateway's router. The page
/// and its assets are open (they hold no data); `/ui/api/me` and
/// `/ui/api/namespaces` authenticate the token themselves; everything
/// under `/ui/api/ns/{namespace}` is behind the MCP endpoint's gate.
pub fn routes(console: Console) -> Router {
    let ns = format!("{UI_PREFIX}/api/ns/{{{NAMESPACE_PARAM}}}");
    let gate = axum::middleware::from_fn_with_state(console.auth.clone(), require_caller);
    let namespaced = Router::new()
        .route(&format!("{ns}/skills"), get(api::skills))
        .route(&format!("{ns}/skills/{{skill}}"), get(api::skill))
        .route(&format!("{ns}/skills/{{skill}}/file"), get(api::skill_file))
        .route(&format!("{ns}/jobs"), get(api::jobs))
        .route(&format!("{ns}/jobs/{{job}}"), get(api::job))
        .route(&format!("{ns}/run"), post(api::run))
        .route(&format!("{ns}/events"), get(events::events))
        .route_layer(gate)
        // Inline inputs of a run, like an MCP call's body.
        .layer(DefaultBodyLimit::max(MCP_BODY_LIMIT as usize));
    let open = Router::new()
        .route(UI_PREFIX, get(assets::redirect))
        .route(&format!("{UI_PREFIX}/"), get(assets::index))
        .route(&format!("{UI_PREFIX}/assets/{{name}}"), get(assets::asset))
        .route(&format!("{UI_PREFIX}/api/config"), get(api::config))
        .route(&format!("{UI_PREFIX}/api/me"), get(api::me))
        .route(&format!("{UI_PREFIX}/api/namespaces"), get(api::namespaces))
        .route(&format!("{UI_PREFIX}/{{*rest}}"), get(api::not_found));
    // Layers wrap from the inside out: the headers go on every answer, the Host refusal included.
    Router::new()
        .merge(namespaced)
        .merge(open)
        .layer(axum::middleware::from_fn_with_state(console.clone(), host::check_host))
        .layer(axum::middleware::map_response(headers::secure))
        .with_state(console)
}
