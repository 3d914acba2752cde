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
