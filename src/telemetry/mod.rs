//! OpenTelemetry traces through `tracing`, off unless an OTLP endpoint is
//! configured the standard way (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` plus `/v1/traces`; `OTEL_EXPORTER_OTLP_PROTOCOL`
//! `http/protobuf` (default) or `http/json`; `OTEL_SERVICE_NAME`).
//!
//! A run is one trace across processes: the gateway's `tools/call` span
//! puts its W3C `traceparent` on the SkillJob it creates
//! ([`TRACEPARENT_ANNOTATION`]); the controller parents its reconciles and
//! the run's own spans (pending, running, from the times the SkillJob
//! records) on it. Spans are exported in batches from a thread of their
//! own, through a reqwest client on a one-worker runtime of its own, so a
//! slow collector never holds a request.

mod export;
mod run;

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

pub use export::{init, Protocol, Telemetry, TelemetryError, TraceConfig};
pub use run::{phases, record_run};

/// The annotation carrying the creating request's W3C trace context
/// (`traceparent`, `00-<trace id>-<span id>-<flags>`) on a SkillJob.
pub const TRACEPARENT_ANNOTATION: &str = "skill-operator.dev/traceparent";

/// The current span's `traceparent`, when it is part of a sampled trace
/// (`None` with tracing off: nothing is written on the SkillJob).
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Parent `span` on the trace `traceparent` names (a malformed value is
/// ignored: the span starts a trace of its own).
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    let cx = parent_context(traceparent);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The remote context a `traceparent` names (invalid when it is malformed).
pub fn parent_context(traceparent: &str) -> opentelemetry::Context {
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    TraceContextPropagator::new().extract(&carrier)
}

#[cfg(test)]
mod tests;
