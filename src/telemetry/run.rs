//! A finished SkillJob's own spans: the run as a whole (created → its
//! verdict recorded) and its phases. With the times the pod reported
//! (`result.json`): waiting for the pod (created → the fetch started:
//! admission, sandbox, image), the fetch, the launch (the run container's
//! start), the script, and the upload with the verdict (the script's end →
//! recorded). Without them: pending and script from the SkillJob's status
//! times. Made through the OpenTelemetry API with explicit times, as
//! children of the trace its `traceparent` names; a no-op without an exporter.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};

use crate::api::job::{SkillJob, SkillJobPhase, SkillJobStatus};
use crate::api::outcome::PodTimes;

fn system_time(t: &Time) -> SystemTime {
    let nanos = t.0.as_nanosecond();
    if nanos >= 0 {
        UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    } else {
        UNIX_EPOCH
    }
}

fn from_unix_nanos(nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(nanos)
}

/// The run's phases, in order, each inside `[created, end]` and starting
/// where the previous ended: the pod's times when it reported them (a
/// forged or skewed time moves a boundary inside the run, never outside),
/// else the status's `started` (pending, script).
pub fn phases(
    created: SystemTime,
    end: SystemTime,
    started: Option<SystemTime>,
    pod: Option<&PodTimes>,
) -> Vec<(&'static str, SystemTime, SystemTime)> {
    let end = end.max(created);
    let marks: Vec<(&'static str, SystemTime)> = match pod {
        Some(pod) => {
            let mut marks = Vec::new();
            if let Some(fetch) = &pod.fetch {
                marks.push(("skilljob.pending", from_unix_nanos(fetch.start_unix_nano)));
                marks.push(("skilljob.fetch", from_unix_nanos(fetch.end_unix_nano)));
                marks.push(("skilljob.launch", from_unix_nanos(pod.script_start_unix_nano)));
            } else {
                marks.push(("skilljob.pending", from_unix_nanos(pod.script_start_unix_nano)));
            }
            marks.push(("skilljob.script", from_unix_nanos(pod.script_end_unix_nano)));
            marks.push(("skilljob.upload", end));
            marks
        }
        None => match started {
            Some(started) => vec![("skilljob.pending", started), ("skilljob.script", end)],
            None => Vec::new(),
        },
    };
    let mut from = created;
    marks
        .into_iter()
        .map(|(label, to)| {
            let to = to.clamp(from, end);
            let phase = (label, from, to);
            from = to;
            phase
        })
        .collect()
}

/// Record `job`'s run under `traceparent` once its phase is final (now: its
/// verdict is being recorded), with the pod's own times when it reported them.
pub fn record_run(traceparent: &str, job: &SkillJob, status: &SkillJobStatus, phase: SkillJobPhase, pod: Option<&PodTimes>) {
    let parent = super::parent_context(traceparent);
    if !parent.span().span_context().is_valid() {
        return;
    }
    let Some(created) = job.metadata.creation_timestamp.as_ref().map(system_time) else { return };
    // The status's times are whole seconds; the verdict is recorded now.
    let recorded = SystemTime::now().max(created);
    let finished = status.finished_at.as_ref().map(system_time).unwrap_or(recorded).max(created);
    let end = if pod.is_some() { recorded.max(finished) } else { finished };
    let started = status.started_at.as_ref().map(system_time).map(|t| t.clamp(created, end));
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
    for (label, from, to) in phases(created, end, started, pod) {
        let mut span = tracer.span_builder(label).with_start_time(from).start_with_context(&tracer, &run_cx);
        span.end_with_timestamp(to);
    }
    run_cx.span().end_with_timestamp(end);
}
