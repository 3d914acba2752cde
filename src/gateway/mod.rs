//! The in-cluster MCP gateway (`skill-operator gateway`): one MCP endpoint
//! per namespace (`/mcp/{namespace}`) serving the skills that namespace's
//! SkillBindings bind, with `skill_run` and the job tools carried out as
//! SkillJobs. It reuses `src/mcp` unchanged: a per-namespace
//! [`crate::mcp::snapshot::SnapshotCell`] fed from the bindings, a
//! Kubernetes [`crate::mcp::executor::Executor`], and an authorizer asking
//! the API server about every caller.
//!
//! - [`auth`]: bearer tokens by TokenReview, actions by SubjectAccessReview;
//! - [`catalog`]: packages pulled by digest into a bounded cache, and the
//!   namespace's snapshot built from its bindings;
//! - [`catalog_watch`]: the catalog of public skills (`skill_search` scope
//!   `catalog`), kept on the cluster's ConfigMap;
//! - [`executor`]: the SkillJob-backed executor;
//! - [`files`]: the file route, for job files too large for an MCP call;
//! - [`ratelimits`]: each namespace's rate limits (flags, or its annotation);
//! - [`ui`]: the web console at `/ui`, over the same gate and tools.

pub mod auth;
pub mod catalog;
pub mod catalog_watch;
pub mod executor;
pub mod file_url;
pub mod files;
pub mod http;
pub mod metrics;
pub mod namespaces;
pub mod ratelimits;
pub mod server;
mod shared;
pub mod ui;
pub mod watch;
