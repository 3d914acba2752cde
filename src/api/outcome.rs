//! How one run ended: the single shape the local executor, the job store,
//! the tool results, the in-pod launcher's `result.json` and the controller
//! all speak. It lives beside the API types because a pod writes it and the
//! controller reads it back; everything else embeds it (`#[serde(flatten)]`)
//! rather than copying its fields.
//!
//! [`RunOutcome::end`] is the one place that decides what an outcome means
//! (succeeded, failed, timed out, cancelled, over a limit); the job store's
//! states and a SkillJob's phases are both derived from it, so a timeout can
//! never be reported as a plain failure with exit code 124 again.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which run-wide limit stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LimitHit {
    /// The run's memory (all its processes, shared memory included).
    Memory,
    /// The run's process and thread count.
    Pids,
    /// The job's disk budget (the work directory).
    Disk,
    /// One file grew past the per-file size limit (SIGXFSZ).
    FileSize,
    /// CPU seconds (SIGXCPU).
    Cpu,
}

impl LimitHit {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitHit::Memory => "memory",
            LimitHit::Pids => "pids",
            LimitHit::Disk => "disk",
            LimitHit::FileSize => "file-size",
            LimitHit::Cpu => "cpu",
        }
    }
}

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to a run that started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunOutcome {
    /// The script's exit code (`None` when a signal ended it or it never exited).
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal that ended the script.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Stopped because its timeout (or the Job's deadline) passed.
    #[serde(default)]
    pub timed_out: bool,
    /// Stopped because the run was cancelled (SIGTERM to the launcher, a
    /// deleted SkillJob, a cancelled task).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
    /// Stopped, or failed, because it passed a run-wide limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_exceeded: Option<LimitHit>,
    /// Wall-clock milliseconds from start to settled.
    #[serde(default)]
    pub duration_ms: u64,
    /// Bytes the script wrote to stdout (kept or not).
    #[serde(default)]
    pub stdout_bytes: u64,
    /// Bytes the script wrote to stderr (kept or not).
    #[serde(default)]
    pub stderr_bytes: u64,
    /// More stdout was written than kept.
    #[serde(default)]
    pub stdout_truncated: bool,
    /// More stderr was written than kept.
    #[serde(default)]
    pub stderr_truncated: bool,
}

/// The file, beside the launcher in the tools volume, where the fetch
/// container leaves its [`FetchTimes`] for the launcher to report.
pub const FETCH_TIMES_FILE: &str = "fetch-times.json";

/// When the fetch container worked (Unix nanoseconds, this node's clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FetchTimes {
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
}

/// Where a pod's time went, as the pod saw it (Unix nanoseconds, the node's
/// clock): the run's trace spans. Only spans are made of them, clamped into
/// the SkillJob's own times: a script that forged them could only move a
/// span inside its run, never change a verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTimes {
    /// The fetch container's work (package and inputs), when it reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch: Option<FetchTimes>,
    /// The launcher started the script.
    pub script_start_unix_nano: u64,
    /// The script and everything it started had ended.
    pub script_end_unix_nano: u64,
}

/// The in-pod launcher's `result.json`: how the run ended, or why it never
/// started. The upload sidecar stores it; the controller reads it back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaunchResult {
    /// How the run ended.
    #[serde(flatten)]
    pub outcome: RunOutcome,
    /// Set when the script could not be started at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the pod's time went (for traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<PodTimes>,
}

/// Now, in Unix nanoseconds (0 before 1970).
pub fn unix_nanos_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// What an outcome means, decided once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    LimitExceeded(LimitHit),
}

impl RunOutcome {
    /// The meaning of this outcome. Order matters: a cancelled run that
    /// also passed its deadline was cancelled; a run killed for memory is
    /// over a limit whatever exit code its killer left; only then do time,
    /// the exit code and signals count.
    pub fn end(&self) -> RunEnd {
        if self.cancelled {
            RunEnd::Cancelled
        } else if let Some(limit) = self.limit_exceeded {
            RunEnd::LimitExceeded(limit)
        } else if self.timed_out {
            RunEnd::TimedOut
        } else if self.exit_code == Some(0) && self.signal.is_none() {
            RunEnd::Succeeded
        } else {
            RunEnd::Failed
        }
    }

    /// One sentence for a person: what ended the run.
    pub fn describe(&self) -> String {
        match self.end() {
            RunEnd::Succeeded => "the script exited 0".into(),
            RunEnd::Cancelled => "the run was cancelled and its script stopped".into(),
            RunEnd::LimitExceeded(limit) => format!("the run passed its {limit} limit and was stopped"),
            RunEnd::TimedOut => "the run passed its timeout and was stopped".into(),
            RunEnd::Failed => match (self.exit_code, self.signal) {
                (Some(code), _) => format!("the script exited {code}"),
                (None, Some(signal)) => format!("the script was killed by signal {signal}"),
                (None, None) => "the script did not exit normally".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(f: impl FnOnce(&mut RunOutcome)) -> RunOutcome {
        let mut out = RunOutcome::default();
        f(&mut out);
        out
    }

    #[test]
    fn the_meaning_is_decided_in_one_order() {
        assert_eq!(o(|o| o.exit_code = Some(0)).end(), RunEnd::Succeeded);
        assert_eq!(o(|o| o.exit_code = Some(3)).end(), RunEnd::Failed);
        assert_eq!(o(|o| o.signal = Some(9)).end(), RunEnd::Failed);
        // The launcher's timeout exit (124) is a timeout, not a failure.
        assert_eq!(
            o(|o| {
                o.exit_code = Some(124);
                o.timed_out = true
            })
            .end(),
            RunEnd::TimedOut
        );
        assert_eq!(
            o(|o| {
                o.timed_out = true;
                o.cancelled = true
            })
            .end(),
            RunEnd::Cancelled
        );
        assert_eq!(
            o(|o| {
                o.signal = Some(9);
                o.limit_exceeded = Some(LimitHit::Memory)
            })
            .end(),
            RunEnd::LimitExceeded(LimitHit::Memory)
        );
    }

    #[test]
    fn older_records_without_new_fields_still_read() {
        let old: RunOutcome = serde_json::from_str(r#"{"exitCode":0,"signal":null,"timedOut":false,"stdoutBytes":3,"stderrBytes":0,"stdoutTruncated":false,"stderrTruncated":false}"#).unwrap();
        assert_eq!(old.end(), RunEnd::Succeeded);
        assert!(!serde_json::to_string(&old).unwrap().contains("cancelled"), "false flags stay out of the JSON");
    }
}
