//! The OTLP exporter: configuration from the standard environment, the
//! HTTP client it posts with, and the process's subscriber (logs to stderr
//! as before, spans of this crate to the exporter when one is configured).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`: what collectors take by default on port 4318.
    Protobuf,
    /// `http/json`.
    Json,
}

/// Where spans go, read from the standard `OTEL_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub url: String,
    pub protocol: Protocol,
    pub service: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "{var}={value:?} is not an http:// or https:// URL; set it to the collector's OTLP/HTTP address, e.g. http://otel-collector:4318"
    )]
    BadEndpoint { var: &'static str, value: String },
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0:?}: this build exports http/protobuf or http/json (not grpc)")]
    BadProtocol(String),
    #[error("the trace exporter could not be built: {0}")]
    Exporter(String),
    #[error("the trace exporter's runtime could not start: {0}")]
    Runtime(#[source] std::io::Error),
}

impl TraceConfig {
    /// `None`: no endpoint is set, tracing is off.
    pub fn from_env(lookup: &dyn Fn(&str) -> Option<String>, default_service: &str) -> Result<Option<TraceConfig>, TelemetryError> {
        let set = |k: &str| lookup(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let url = if let Some(full) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            checked("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", full)?
        } else if let Some(base) = set("OTEL_EXPORTER_OTLP_ENDPOINT") {
            let base = checked("OTEL_EXPORTER_OTLP_ENDPOINT", base)?;
            format!("{}/v1/traces", base.trim_end_matches('/'))
        } else {
            return Ok(None);
        };
        let protocol = match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL")).as_deref() {
            None | Some("http/protobuf") => Protocol::Protobuf,
            Some("http/json") => Protocol::Json,
            Some(other) => return Err(TelemetryError::BadProtocol(other.to_string())),
        };
        let service = set("OTEL_SERVICE_NAME").unwrap_or_else(|| default_service.to_string());
        Ok(Some(TraceConfig { url, protocol, service }))
    }
}

fn checked(var: &'static str, value: String) -> Result<String, TelemetryError> {
    match reqwest::Url::parse(&value) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => Ok(value),
        _ => Err(TelemetryError::BadEndpoint { var, value }),
    }
}

/// Posts the exporter's requests from a runtime of its own: the batch
/// processor calls from its own thread, where no runtime runs.
#[derive(Debug)]
struct Client {
    http: reqwest::Client,
    handle: tokio::runtime::Handle,
}

/// A collector's answer is a few bytes; anything past this is not read.
const ANSWER_MAX_BYTES: usize = 64 * 1024;
/// One export request at most this long.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let http = self.http.clone();
        let sent = self.handle.spawn(async move {
            let request = reqwest::Request::try_from(request)?;
            let mut answer = http.execute(request).await?;
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                response = response.header(name, value);
            }
            // Read no more than the cap: a collector that streams on cannot fill our memory.
            let mut body = Vec::new();
            while let Some(chunk) = answer.chunk().await? {
                let room = ANSWER_MAX_BYTES - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() == ANSWER_MAX_BYTES {
                    break;
                }
            }
            Ok::<_, HttpError>(response.body(Bytes::from(body))?)
        });
        sent.await?
    }
}

/// The exporter's parts; dropping it flushes what is pending, then stops.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Telemetry {
    /// Nothing exported.
    pub fn off() -> Telemetry {
        Telemetry { provider: None, runtime: None }
    }

    /// An exporter to `config`'s collector (not yet attached to any subscriber: see [`Telemetry::layer`]).
    pub fn start(config: &TraceConfig) -> Result<Telemetry, TelemetryError> {
        let (provider, runtime) = provider(config)?;
        // The controller records a run's phases with their own times through the global tracer.
        opentelemetry::global::set_tracer_provider(provider.clone());
        Ok(Telemetry { provider: Some(provider), runtime: Some(runtime) })
    }

    pub fn enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// The `tracing` layer sending this crate's spans at INFO and above to
    /// the exporter (`None` when off).
    pub fn layer<S>(&self) -> Option<impl tracing_subscriber::Layer<S> + Send + Sync + 'static>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let tracer = self.provider.as_ref()?.tracer("skill-operator");
        let spans = tracing_subscriber::filter::Targets::new().with_target("skill_operator", tracing::Level::INFO);
        // No busy/idle timing (a clock read on every poll of an instrumented
        // future), no thread or source-location attributes: a span costs its
        // ids, its own fields and its export.
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_target(false);
        Some(layer.with_filter(spans))
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(err) = provider.shutdown() {
                eprintln!("skill-operator: the last spans could not be exported: {err}");
            }
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The tracer provider for `config`: batches, posted by [`Client`].
fn provider(config: &TraceConfig) -> Result<(SdkTracerProvider, tokio::runtime::Runtime), TelemetryError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(TelemetryError::Runtime)?;
    crate::tls::install_crypto_provider();
    let http = reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build().map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let client = Client { http, handle: runtime.handle().clone() };
    let protocol = match config.protocol {
        Protocol::Protobuf => opentelemetry_otlp::Protocol::HttpBinary,
        Protocol::Json => opentelemetry_otlp::Protocol::HttpJson,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(config.url.clone())
        .with_protocol(protocol)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let resource = Resource::builder().with_service_name(config.service.clone()).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    Ok((provider, runtime))
}

/// Install the process's subscriber: logs to stderr filtered by
/// `SKILL_OPERATOR_LOG` (default `warn`), and, for a server (`service`) when
/// `OTEL_EXPORTER_OTLP_*` names a collector, this crate's spans at INFO and
/// above to it. An exporter that cannot be set up is reported and tracing
/// stays off.
pub fn init(service: Option<&str>) -> Telemetry {
    let lookup = |k: &str| std::env::var(k).ok();
    let filter = tracing_subscriber::EnvFilter::try_from_env("SKILL_OPERATOR_LOG").unwrap_or_else(|_| "warn".into());
    // Logs go to stderr: over stdio, stdout belongs to the protocol.
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter);
    let exporter = match service {
        Some(service) => TraceConfig::from_env(&lookup, service).and_then(|c| c.map(|c| Telemetry::start(&c)).transpose()),
        None => Ok(None),
    };
    let telemetry = exporter.unwrap_or_else(|err| {
        eprintln!("skill-operator: traces are off: {err}");
        None
    });
    let telemetry = telemetry.unwrap_or_else(Telemetry::off);
    tracing_subscriber::registry().with(logs).with(telemetry.layer()).init();
    telemetry
}
