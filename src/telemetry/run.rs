//! A finished SkillJob's own spans, with the times it recorded: the run as
//! a whole (created → finished), waiting for its pod (created → the script
//! started: admission, image, package fetch) and the script (started →
//! finished). Made through the OpenTelemetry API with explicit times, as
//! children of the trace its `traceparent` names; a no-op without an exporter.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};

use crate::api::job::{SkillJob, SkillJobPhase, SkillJobStatus};

fn system_time(t: &Time) -> SystemTime {
    let nanos = t.0.as_nanosecond();
    if nanos >= 0 {
        UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    } else {
        UNIX_EPOCH
    }
}

/// Record `job`'s run under `traceparent` once its phase is final.
pub fn record_run(traceparent: &str, job: &SkillJob, status: &SkillJobStatus, phase: SkillJobPhase) {
    let parent = super::parent_context(traceparent);
    if !parent.span().span_context().is_valid() {
        return;
    }
    let Some(created) = job.metadata.creation_timestamp.as_ref().map(system_time) else { return };
    let finished = status.finished_at.as_ref().map(system_time).unwrap_or_else(SystemTime::now).max(created);
    let started = status.started_at.as_ref().map(system_time).map(|t| t.clamp(created, finished));
    let tracer = opentelemetry::global::tracer("skill-operator");
    let name = job.metadata.name.clone().unwrap_or_default();
    let mut attributes = vec![
        KeyValue::new("k8s.namespace.name", job.metadata.namespace.clone().unwrap_or_default()),
        KeyValue::new("skilljob.name", name),
        KeyValue::new("skilljob.uid", job.metadata.uid.clone().unwrap_or_default()),
        KeyValue::new("skilljob.phase", format!("{phase:?}")),
        KeyValue::new("skilljob.script", job.spec.script.clone()),
    ];
    if let Some(code) = status.exit_code {
        attributes.push(KeyValue::new("process.exit.code", i64::from(code)));
    }
    let mut run = tracer
        .span_builder("skilljob")
        .with_kind(SpanKind::Internal)
        .with_start_time(created)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    if phase != SkillJobPhase::Succeeded {
        run.set_status(Status::error(status.message.clone().unwrap_or_else(|| format!("{phase:?}"))));
    }
    let run_cx = Context::current_with_span(run);
    if let Some(started) = started {
        for (label, from, to) in [("skilljob.pending", created, started), ("skilljob.script", started, finished)] {
            let mut span = tracer.span_builder(label).with_start_time(from).start_with_context(&tracer, &run_cx);
            span.end_with_timestamp(to);
        }
    }
    run_cx.span().end_with_timestamp(finished);
}
