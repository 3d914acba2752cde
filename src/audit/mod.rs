//! The audit trail: one JSON line per security-relevant action, in one
//! versioned shape ([`SCHEMA`], documented in `docs/audit.md`) whichever
//! process writes it: `serve`, the gateway, the controller (run verdicts)
//! and the egress proxy.
//!
//! A record names who (the principal a TokenReview returned, or `serve`'s
//! principal), where (namespace), what (tool, skill, script, the digest of
//! the arguments and of every input, never their values) and how it ended
//! (outcome, error code, reason). Records are written synchronously, one
//! `write` per line under a lock, so a process that answered a call has
//! already written its record, and lines from concurrent calls never
//! interleave.
//!
//! An [`Audit`] is cheap to clone; [`Audit::off`] writes nothing.

pub mod http;
mod record;
mod sink;

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::counter::Counter;

pub use record::{digest_json, Event, FileRef, Outcome, Principal, Record};
pub use sink::{SharedBuffer, Sink, SinkError};

/// The `schema` of every record this build writes. A change that removes
/// or renames a field, or changes a field's meaning, is a new version.
pub const SCHEMA: &str = "skill-operator.audit/v1";

/// Where a process writes its audit records (`serve`, `gateway`,
/// `controller` and `egress-proxy` take the same flags).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct AuditArgs {
    /// Also append the audit records to this file (JSON lines, created 0600).
    #[arg(long = "audit-file", value_name = "PATH", env = "SKILL_OPERATOR_AUDIT_FILE")]
    pub file: Option<PathBuf>,
    /// Do not write audit records to stdout (they still go to --audit-file).
    /// `serve` over stdio never writes them to stdout: the protocol owns it.
    #[arg(long = "no-audit-stdout")]
    pub no_stdout: bool,
}

impl AuditArgs {
    /// The sinks these flags name; `stdout_free` is false where stdout is
    /// not ours to write (the stdio transport).
    pub fn open(&self, source: &'static str, stdout_free: bool) -> Result<Audit, SinkError> {
        let mut sinks = Vec::new();
        if stdout_free && !self.no_stdout {
            sinks.push(Sink::stdout());
        }
        if let Some(path) = &self.file {
            sinks.push(Sink::file(path)?);
        }
        Ok(Audit::new(source, sinks))
    }
}

/// Lines written and lines a sink failed to take, since the process started
/// (shared by every registry they are registered in: one count per process).
static WRITTEN: LazyLock<Counter> = LazyLock::new(Counter::default);
static FAILED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// (written, failed) lines across every [`Audit`] of this process.
pub fn counts() -> (u64, u64) {
    (WRITTEN.get(), FAILED.get())
}

/// Registers `…_audit_records_total` and `…_audit_write_failures_total` in `registry`.
pub fn register_metrics(registry: &mut prometheus_client::registry::Registry) {
    registry.register("audit_records", "Audit lines written (one per record and sink)", WRITTEN.clone());
    registry.register("audit_write_failures", "Audit lines a sink could not take (the process's log says why)", FAILED.clone());
}

/// A process's (or one server's) audit writer.
#[derive(Clone, Default)]
pub struct Audit {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    source: &'static str,
    /// Stamped on records that name none (a gateway namespace's server).
    namespace: Option<String>,
    sinks: Arc<Vec<Sink>>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => f.write_str("Audit(off)"),
            Some(i) => write!(f, "Audit({}, {} sinks)", i.source, i.sinks.len()),
        }
    }
}

impl Audit {
    /// Writes nothing.
    pub fn off() -> Audit {
        Audit { inner: None }
    }

    /// Records from `source` (`serve`, `gateway`, `controller`, `egress-proxy`) to `sinks`; no sinks is [`Audit::off`].
    pub fn new(source: &'static str, sinks: Vec<Sink>) -> Audit {
        if sinks.is_empty() {
            return Audit::off();
        }
        Audit { inner: Some(Arc::new(Inner { source, namespace: None, sinks: Arc::new(sinks) })) }
    }

    /// The same sinks, stamping `namespace` on records that name none.
    pub fn for_namespace(&self, namespace: &str) -> Audit {
        match &self.inner {
            None => Audit::off(),
            Some(i) => {
                Audit { inner: Some(Arc::new(Inner { source: i.source, namespace: Some(namespace.to_string()), sinks: i.sinks.clone() })) }
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Write `record` to every sink. A sink that fails is counted and
    /// logged; the action it records goes on (the log says so loudly).
    pub fn record(&self, mut record: Record) {
        let Some(inner) = &self.inner else { return };
        record.source = inner.source;
        if record.namespace.is_none() {
            record.namespace.clone_from(&inner.namespace);
        }
        let mut line = match serde_json::to_vec(&record) {
            Ok(line) => line,
            Err(err) => {
                FAILED.inc();
                tracing::error!(%err, event = record.event.as_str(), "an audit record could not be encoded");
                return;
            }
        };
        line.push(b'\n');
        for sink in inner.sinks.iter() {
            match sink.write_line(&line) {
                Ok(()) => {
                    WRITTEN.inc();
                }
                Err(err) => {
                    FAILED.inc();
                    tracing::error!(sink = %sink, %err, event = record.event.as_str(), "an audit record could not be written");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
