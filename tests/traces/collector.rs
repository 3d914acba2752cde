//! An OTLP/HTTP trace collector of the tests: `POST /v1/traces` on
//! loopback, protobuf or JSON as the exporter sends them, decoded with the
//! OTLP's own message types and kept as flat spans a test can query.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;

/// One received span, ids in lower-case hex (`parent` empty for a root).
#[derive(Debug, Clone)]
pub(crate) struct Span {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub service: String,
    pub attributes: BTreeMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// 2: error (OTLP's STATUS_CODE_ERROR).
    pub status: i32,
}

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    /// The content type of every export request.
    encodings: Vec<String>,
}

pub(crate) struct Collector {
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    /// Woken on every export request received.
    arrived: Arc<tokio::sync::Notify>,
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<Span> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| text(a.value.as_ref()))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for s in scope.spans {
                out.push(Span {
                    name: s.name,
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent: hex::encode(&s.parent_span_id),
                    service: service.clone(),
                    attributes: s.attributes.iter().map(|a| (a.key.clone(), text(a.value.as_ref()))).collect(),
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                    status: s.status.map(|st| st.code).unwrap_or(0),
                });
            }
        }
    }
    out
}

impl Collector {
    pub(crate) async fn start() -> Collector {
        let received: Arc<Mutex<Received>> = Arc::default();
        let arrived: Arc<tokio::sync::Notify> = Arc::default();
        let (kept, wake) = (received.clone(), arrived.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let (kept, wake) = (kept.clone(), wake.clone());
                async move {
                    let kind = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                    let decoded = if kind.starts_with("application/json") {
                        serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string())
                    } else {
                        ExportTraceServiceRequest::decode(body.as_ref()).map_err(|e| e.to_string())
                    };
                    match decoded {
                        Ok(request) => {
                            let mut r = kept.lock().unwrap();
                            r.spans.extend(flatten(request));
                            r.encodings.push(kind.clone());
                            drop(r);
                            wake.notify_waiters();
                            if kind.starts_with("application/json") {
                                (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], b"{}".to_vec()).into_response()
                            } else {
                                let answer = ExportTraceServiceResponse::default().encode_to_vec();
                                (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-protobuf")], answer).into_response()
                            }
                        }
                        Err(err) => (StatusCode::BAD_REQUEST, format!("not an OTLP trace export ({kind}): {err}")).into_response(),
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Collector { addr, received, arrived }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn spans(&self) -> Vec<Span> {
        self.received.lock().unwrap().spans.clone()
    }

    pub(crate) fn encodings(&self) -> Vec<String> {
        self.received.lock().unwrap().encodings.clone()
    }

    /// The spans once `done` holds for them, checked on every export
    /// received (the exporter sends in batches), at most 30 s.
    pub(crate) async fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let arrived = self.arrived.notified();
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!("the collector never received {what}; it has: {spans:#?}");
            }
        }
    }
}
