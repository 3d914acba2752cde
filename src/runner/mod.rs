//! Runners: backends that carry out a run the fence has decided
//! ([`crate::core::fence`]); a runner only starts processes.
//!
//! - [`process`]: the local process executor (process group, timeout, caps, uid drop, rlimits).
//! - [`sandbox`]: bubblewrap wrapping for the local executor.
//! - [`local`]: the local backend (interpreters, sandbox probe, run slots, run directories).
//! - [`executor`]: the standalone server's MCP executor (job store + local backend).
//! - [`launch`]: `skill-operator launch`, the same fence inside a Job's pod.

pub mod executor;
pub mod launch;
pub mod local;
pub mod process;
pub mod sandbox;
