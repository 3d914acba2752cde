//! Runners: backends that carry out a run the fence has decided
//! ([`crate::core::fence`]); a runner only starts processes.
//!
//! - [`child`]: the forked child's set-up, shared by the direct spawn and the spawn helper.
//! - [`process`]: the local process executor (process group, timeout, caps, uid drop, rlimits).
//! - [`sandbox`]: bubblewrap wrapping for the local executor; [`builtin`]: the same sandbox built by this binary (`sandbox-exec`) where bubblewrap is missing.
//! - [`local`]: the local backend (interpreters, sandbox probe, run slots, run directories).
//! - [`executor`]: the standalone server's MCP executor (job store + local backend).
//! - [`launch`]: `skill-operator launch`, the same fence inside a Job's pod.
//! - [`cgroup`]: one cgroup per run (memory, processes, CPU for the run as a whole).
//! - [`watch`]: a run's limits checked while it runs and after (cgroup counters, `/work` usage, tmpfs).
//! - [`egress`]: the in-process egress proxy and a run's socket; [`init`]: `sandbox-init`, the forwarder inside the sandbox.
//! - [`uids`]: the pool of dedicated uids for runs.
//! - [`script`]: the declared script opened once, beneath the skill (unsandboxed runs execute that descriptor).
//! - [`spawn_helper`]: the small pre-forked process `serve` starts its scripts from.

pub mod builtin;
pub mod cgroup;
pub mod child;
pub mod egress;
pub mod executor;
pub mod init;
pub mod launch;
pub mod local;
pub mod process;
pub mod sandbox;
pub mod sandbox_probe;
pub mod script;
pub mod spawn_helper;
pub mod tmpfs;
pub mod uids;
pub mod watch;
