//! The gateway executor's own bounds. The job caps it shares with the
//! standalone server (retained jobs, upload and read chunks, file sizes)
//! are in [`crate::core::limits`]; these exist only here.

use std::time::Duration;

/// A caller waiting for a run hears from the gateway at least this often
/// (a progress notification), so proxies that drop silent streams after
/// 20-30 s keep it open.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(15);

/// How many times an upload retries its draft-record write when another
/// replica wrote the record in between (optimistic concurrency).
pub const DRAFT_WRITE_RETRIES: usize = 5;

/// Finished SkillJobs a cap refusal names, oldest first.
pub const CAP_NAMES_SHOWN: usize = 5;
