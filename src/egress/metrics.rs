//! Per-verdict counters, bytes and open tunnels, for an embedder to
//! register in its own `prometheus-client` registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Tunnel or forwarded request ran and ended normally.
    Allowed,
    /// Refused before any byte reached the upstream host.
    Refused,
    /// Allowed, then cut by a bound (budget, idle, lifetime, shutdown).
    Cut,
    /// Allowed, but the upstream failed (resolution, connect, response).
    Failed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Refused => "refused",
            Verdict::Cut => "cut",
            Verdict::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub verdict: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: String,
}

/// The proxy's metrics (clones share the same counters).
#[derive(Clone, Debug, Default)]
pub struct ProxyMetrics {
    /// Requests by verdict and reason (`ok` for a normal end).
    pub requests: Family<OutcomeLabels, Counter>,
    /// Bytes spliced, `up` (to upstream) and `down`.
    pub bytes: Family<DirectionLabel, Counter>,
    /// Of `bytes`, those moved with splice(2) (never in user space).
    pub zero_copy_bytes: Family<DirectionLabel, Counter>,
    /// Tunnels open now.
    pub tunnels: Gauge,
    /// Requests with a valid credential waiting now for their run's record
    /// (see [`crate::egress::RECORD_GRACE`]).
    pub waiting_for_record: Gauge,
}

impl ProxyMetrics {
    /// Register under the registry's prefix: `egress_requests_total`,
    /// `egress_bytes_total`, `egress_zero_copy_bytes_total`, `egress_tunnels`,
    /// `egress_waiting_for_record`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("egress_requests", "Egress proxy requests by verdict and reason", self.requests.clone());
        registry.register("egress_bytes", "Bytes through the egress proxy by direction", self.bytes.clone());
        registry.register(
            "egress_zero_copy_bytes",
            "Of the egress proxy's bytes, those moved with splice(2), by direction",
            self.zero_copy_bytes.clone(),
        );
        registry.register("egress_tunnels", "Egress tunnels open now", self.tunnels.clone());
        registry.register(
            "egress_waiting_for_record",
            "Egress requests with a valid credential waiting for their run's record",
            self.waiting_for_record.clone(),
        );
    }

    pub(crate) fn count(&self, verdict: Verdict, reason: &str) {
        self.requests.get_or_create(&OutcomeLabels { verdict: verdict.as_str().into(), reason: reason.into() }).inc();
    }

    pub(crate) fn add_bytes(&self, up: u64, down: u64) {
        self.bytes.get_or_create(&DirectionLabel { direction: "up".into() }).inc_by(up);
        self.bytes.get_or_create(&DirectionLabel { direction: "down".into() }).inc_by(down);
    }

    pub(crate) fn add_zero_copy_bytes(&self, up: u64, down: u64) {
        self.zero_copy_bytes.get_or_create(&DirectionLabel { direction: "up".into() }).inc_by(up);
        self.zero_copy_bytes.get_or_create(&DirectionLabel { direction: "down".into() }).inc_by(down);
    }

    /// Bytes moved with splice(2) in one direction, `up` or `down` (tests).
    pub fn zero_copy_bytes_with(&self, direction: &str) -> u64 {
        self.zero_copy_bytes.get_or_create(&DirectionLabel { direction: direction.into() }).get()
    }

    /// The count for one verdict and reason (tests, health checks).
    pub fn requests_with(&self, verdict: &str, reason: &str) -> u64 {
        self.requests.get_or_create(&OutcomeLabels { verdict: verdict.into(), reason: reason.into() }).get()
    }
}
