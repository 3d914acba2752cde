//! Runners: backends that execute a checked run plan. The fence's decisions
//! (what may run, with which argv, environment and limits) are made in
//! [`crate::core`]; a runner only carries them out.
//!
//! - [`process`]: the local process executor (process group, timeout, caps, uid drop, rlimits).
//! - [`sandbox`]: bubblewrap wrapping for the local executor.

pub mod launch;
pub mod local;
pub mod process;
pub mod sandbox;
