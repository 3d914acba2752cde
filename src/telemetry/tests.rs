use super::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k: &str| map.get(k).cloned()
}

#[test]
fn no_endpoint_is_off_and_the_standard_variables_configure_it() {
    assert_eq!(TraceConfig::from_env(&env(&[]), "svc").unwrap(), None);
    let base = TraceConfig::from_env(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]), "svc").unwrap().unwrap();
    assert_eq!(base, TraceConfig { url: "http://collector:4318/v1/traces".into(), protocol: Protocol::Protobuf, service: "svc".into() });
    let full = TraceConfig::from_env(
        &env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://collector.example/custom/traces"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_SERVICE_NAME", "gw-a"),
        ]),
        "svc",
    )
    .unwrap()
    .unwrap();
    assert_eq!(full.url, "https://collector.example/custom/traces", "the traces variable is the whole URL");
    assert_eq!((full.protocol, full.service.as_str()), (Protocol::Json, "gw-a"));
}

#[test]
fn a_bad_endpoint_or_protocol_says_what_to_set() {
    let err = TraceConfig::from_env(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]), "svc").unwrap_err();
    assert!(err.to_string().contains("OTEL_EXPORTER_OTLP_ENDPOINT") && err.to_string().contains("http://"), "{err}");
    let err = TraceConfig::from_env(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "file:///tmp/x")]), "svc").unwrap_err();
    assert!(err.to_string().contains("file:///tmp/x"), "{err}");
    let err =
        TraceConfig::from_env(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]), "svc")
            .unwrap_err();
    assert!(err.to_string().contains("grpc") && err.to_string().contains("http/protobuf"), "{err}");
}

#[test]
fn a_traceparent_round_trips_and_a_forged_one_starts_no_trace() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let cx = parent_context(tp);
    let sc = cx.span().span_context().clone();
    assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
    assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
    for bad in [
        "",
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    ] {
        assert!(!parent_context(bad).span().span_context().is_valid(), "{bad:?}");
    }
}

#[test]
fn without_a_tracing_layer_there_is_no_traceparent_to_write() {
    let span = tracing::info_span!("no-subscriber");
    let _in = span.enter();
    assert_eq!(current_traceparent(), None);
}

/// A subscriber with the OpenTelemetry layer and no exporter: spans are
/// sampled and carry real ids, nothing leaves the process.
fn traced() -> impl tracing::Subscriber {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
}

#[test]
fn a_request_span_hands_its_trace_to_the_skilljob_and_the_controller_continues_it() {
    tracing::subscriber::with_default(traced(), || {
        let request = tracing::info_span!("tools/call");
        let (traceparent, trace_id) = request.in_scope(|| {
            let tp = current_traceparent().expect("a sampled span has a traceparent");
            (tp, tracing::Span::current().context().span().span_context().trace_id())
        });
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "01"), "{traceparent}");
        assert_eq!(parts[1], trace_id.to_string());

        // The controller's reconcile, in another process: parented by the annotation.
        let reconcile = tracing::info_span!("reconcile SkillJob");
        set_parent(&reconcile, &traceparent);
        let child = reconcile.context().span().span_context().clone();
        assert_eq!(child.trace_id(), trace_id, "one trace across the two");
        assert_ne!(child.span_id().to_string(), parts[2], "a span of its own");

        // A forged annotation cannot attach a reconcile to a trace: it starts its own.
        let other = tracing::info_span!("reconcile SkillJob");
        set_parent(&other, "00-zzzz-yyyy-01");
        assert_ne!(other.context().span().span_context().trace_id(), trace_id);
    });
}

mod phases {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use crate::api::outcome::{FetchTimes, PodTimes};
    use crate::telemetry::phases;

    const S: u64 = 1_000_000_000;

    fn at(secs_tenths: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(1_000 * S + secs_tenths * S / 10)
    }

    fn nanos(secs_tenths: u64) -> u64 {
        1_000 * S + secs_tenths * S / 10
    }

    fn labels(p: &[(&'static str, SystemTime, SystemTime)]) -> Vec<&'static str> {
        p.iter().map(|(l, _, _)| *l).collect()
    }

    /// Contiguous, ordered, inside [created, end]: each phase starts where the last ended.
    fn well_formed(p: &[(&'static str, SystemTime, SystemTime)], created: SystemTime, end: SystemTime) {
        let mut from = created;
        for (label, start, stop) in p {
            assert_eq!(*start, from, "{label} starts where the last phase ended");
            assert!(start <= stop && *stop <= end, "{label} inside the run");
            from = *stop;
        }
    }

    #[test]
    fn the_pods_times_make_five_phases_in_order() {
        let pod = PodTimes {
            fetch: Some(FetchTimes { start_unix_nano: nanos(4), end_unix_nano: nanos(9) }),
            script_start_unix_nano: nanos(12),
            script_end_unix_nano: nanos(13),
        };
        let p = phases(at(0), at(20), Some(at(10)), Some(&pod));
        assert_eq!(labels(&p), ["skilljob.pending", "skilljob.fetch", "skilljob.launch", "skilljob.script", "skilljob.upload"]);
        well_formed(&p, at(0), at(20));
        assert_eq!((p[1].1, p[1].2), (at(4), at(9)), "the fetch as the fetch container saw it");
        assert_eq!((p[3].1, p[3].2), (at(12), at(13)), "the script to the nanosecond, not the status's whole seconds");
        assert_eq!((p[4].1, p[4].2), (at(13), at(20)), "upload and verdict: the script's end to the record");
    }

    /// A script that forged result.json's times (or a skewed clock) moves a
    /// boundary inside the run, never outside it, never backwards.
    #[test]
    fn forged_times_stay_inside_the_run() {
        let forged = PodTimes {
            fetch: Some(FetchTimes { start_unix_nano: 0, end_unix_nano: u64::MAX }),
            script_start_unix_nano: nanos(1),
            script_end_unix_nano: 5,
        };
        let p = phases(at(10), at(20), None, Some(&forged));
        well_formed(&p, at(10), at(20));
        assert_eq!(p[0].2, at(10), "a fetch 'before' the SkillJob existed starts with it");
        assert_eq!(p[1].2, at(20), "a fetch 'after' the verdict ends with the run");
    }

    #[test]
    fn without_the_pods_times_the_status_gives_two_and_without_a_start_none() {
        let p = phases(at(0), at(20), Some(at(15)), None);
        assert_eq!(labels(&p), ["skilljob.pending", "skilljob.script"]);
        well_formed(&p, at(0), at(20));
        assert!(phases(at(0), at(20), None, None).is_empty(), "a run that never started has no phases");
        let no_fetch = PodTimes { fetch: None, script_start_unix_nano: nanos(5), script_end_unix_nano: nanos(6) };
        assert_eq!(labels(&phases(at(0), at(20), None, Some(&no_fetch))), ["skilljob.pending", "skilljob.script", "skilljob.upload"]);
    }
}
