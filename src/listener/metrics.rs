//! Why connections were closed by a bound, and how many are open.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The bound that closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Close {
    HeaderTimeout,
    IdleTimeout,
    BodyTimeout,
    ConnectionsFull,
    AddressFull,
    HeadTooLarge,
}

impl Close {
    pub const ALL: [Close; 6] =
        [Close::HeaderTimeout, Close::IdleTimeout, Close::BodyTimeout, Close::ConnectionsFull, Close::AddressFull, Close::HeadTooLarge];

    pub fn as_str(self) -> &'static str {
        match self {
            Close::HeaderTimeout => "header_timeout",
            Close::IdleTimeout => "idle_timeout",
            Close::BodyTimeout => "body_timeout",
            Close::ConnectionsFull => "connections_full",
            Close::AddressFull => "address_full",
            Close::HeadTooLarge => "head_too_large",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// One listener's counters (clones share them).
#[derive(Clone, Debug, Default)]
pub struct ListenerMetrics {
    closed: Family<ReasonLabel, Counter>,
    /// Connections open now.
    pub open: Gauge,
}

impl ListenerMetrics {
    /// Register as `http_listener_closed_total{reason}` and
    /// `http_listener_connections` under the registry's prefix.
    pub fn register(&self, registry: &mut Registry) {
        for why in Close::ALL {
            // Every reason shows from the start, at 0.
            let _ = self.closed.get_or_create(&ReasonLabel { reason: why.as_str().into() });
        }
        registry.register("http_listener_closed", "Connections closed by a listener bound, by bound", self.closed.clone());
        registry.register("http_listener_connections", "Connections open on the listener", self.open.clone());
    }

    /// The counters alone, in the OpenMetrics text format, prefixed
    /// `skill_operator_` (for a `/metrics` that has nothing else).
    pub fn render(&self) -> String {
        let mut registry = Registry::with_prefix("skill_operator");
        self.register(&mut registry);
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out = "# the metrics could not be encoded\n".into();
        }
        out
    }

    /// `text` (an OpenMetrics exposition of other metrics) followed by these
    /// counters, as one exposition (one `# EOF`).
    pub fn render_after(&self, text: &str) -> String {
        let mut out = text.strip_suffix("# EOF\n").unwrap_or(text).to_string();
        out.push_str(&self.render());
        out
    }

    pub(crate) fn count(&self, why: Close) {
        self.closed.get_or_create(&ReasonLabel { reason: why.as_str().into() }).inc();
    }

    /// Connections closed so far for `why`.
    pub fn closed(&self, why: Close) -> u64 {
        self.closed.get_or_create(&ReasonLabel { reason: why.as_str().into() }).get()
    }
}
