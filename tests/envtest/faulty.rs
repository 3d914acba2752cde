//! A fault-injecting proxy of the tests between a controller and a real
//! kube-apiserver: TLS in (a self-signed certificate; the controller's
//! kubeconfig skips verification, as envtest's does), each request passed
//! on through a `kube::Client` to the API server, and on the way:
//! - every request delayed by 0 to `max_delay`;
//! - bursts: for `burst` out of every `burst_every`, every request that is
//!   not a watch answered 429 (with `Retry-After: 1`), 500 or 503 in turn;
//! - every `gone_every`th watch answered with a 410 Gone ERROR event, the
//!   API server's "your resourceVersion is too old", which forces a relist;
//! - every other watch cut after 0.5 to 3 s with the connection dropped
//!   mid-stream (an error, not a clean end);
//! - every `hold_every`th request (a watch or not) never answered, its
//!   connection left open: a peer gone silent, as a dropped route or a
//!   middlebox leaves it;
//! - every `silence_every`th watch (unless answered 410) answered with the
//!   API server's head, its stream then silent and never ended.
//!
//! What it injected is counted, so a suite can show each fault happened.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, Error>;

#[derive(Clone, Copy)]
pub(crate) struct Faults {
    pub max_delay: Duration,
    pub burst: Duration,
    pub burst_every: Duration,
    pub gone_every: u64,
    /// 0: none held.
    pub hold_every: u64,
    /// 0: none silenced.
    pub silence_every: u64,
}

#[derive(Default, Debug)]
pub(crate) struct Counts {
    pub requests: AtomicU64,
    pub watches: AtomicU64,
    pub throttled: AtomicU64,
    pub server_errors: AtomicU64,
    pub gone: AtomicU64,
    pub cut: AtomicU64,
    pub held: AtomicU64,
    pub silenced: AtomicU64,
    /// Which watches (by their number) were silenced, and which of them
    /// their client has given up.
    pub silenced_watches: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    pub given_up_watches: std::sync::Mutex<std::collections::BTreeSet<u64>>,
}

impl Counts {
    pub(crate) fn summary(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} requests ({} watches): {} answered 429, {} answered 500/503, {} watches answered 410 Gone, {} watches cut mid-stream, {} requests never answered, {} watches gone silent",
            n(&self.requests),
            n(&self.watches),
            n(&self.throttled),
            n(&self.server_errors),
            n(&self.gone),
            n(&self.cut),
            n(&self.held),
            n(&self.silenced)
        )
    }
}

pub(crate) struct FaultyProxy {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

struct Shared {
    upstream: kube::Client,
    faults: Faults,
    counts: Arc<Counts>,
    started: Instant,
    sequence: AtomicU64,
}

impl FaultyProxy {
    pub(crate) async fn start(upstream: kube::Client, faults: Faults) -> FaultyProxy {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().self_signed(&key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()))
            .unwrap();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Shared { upstream, faults, counts: counts.clone(), started: Instant::now(), sequence: AtomicU64::new(0) });
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (acceptor, shared) = (acceptor.clone(), shared.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(forward(&shared, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
                });
            }
        });
        FaultyProxy { addr, counts, _task: tokio_util::task::AbortOnDropHandle::new(task) }
    }

    /// `direct` (a kubeconfig of the API server that skips TLS
    /// verification, as envtest's does) pointed at this proxy instead,
    /// written into `dir`.
    pub(crate) fn kubeconfig(&self, direct: &std::path::Path, dir: &std::path::Path) -> std::path::PathBuf {
        let text = std::fs::read_to_string(direct).unwrap();
        let proxied: Vec<String> = text
            .lines()
            .map(|line| match line.trim_start().strip_prefix("server: ") {
                Some(_) => format!("    server: https://{}", self.addr),
                None => line.to_string(),
            })
            .collect();
        assert!(proxied.iter().any(|l| l.contains(&self.addr.to_string())), "no server line in {}", direct.display());
        let path = dir.join("faulty-kubeconfig");
        std::fs::write(&path, proxied.join("\n") + "\n").unwrap();
        path
    }
}

/// Marks a silenced watch given up by its client when dropped.
struct GivenUp(Arc<Counts>, u64);

impl Drop for GivenUp {
    fn drop(&mut self) {
        self.0.given_up_watches.lock().unwrap().insert(self.1);
    }
}

fn is_watch(req: &Request<Incoming>) -> bool {
    req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

fn status(code: StatusCode, reason: &str) -> Response<Body> {
    let body = serde_json::json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                                   "message": format!("injected by the test's proxy: {reason}"), "code": code.as_u16() });
    let mut response = Response::new(full(serde_json::to_vec(&body).unwrap()));
    *response.status_mut() = code;
    response.headers_mut().insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
    if code == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert(http::header::RETRY_AFTER, "1".parse().unwrap());
    }
    response
}

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes)).map_err(|never| match never {}).boxed_unsync()
}

/// A small deterministic spread (no RNG crate): the request's sequence
/// number, mixed.
fn spread(n: u64, modulo: u64) -> u64 {
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % modulo.max(1)
}

async fn forward(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let n = shared.sequence.fetch_add(1, Ordering::Relaxed);
    let counts = &shared.counts;
    let faults = shared.faults;
    counts.requests.fetch_add(1, Ordering::Relaxed);
    let delay_ms = faults.max_delay.as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(spread(n, delay_ms + 1))).await;
    let watch = is_watch(&req);
    if faults.hold_every > 0 && n % faults.hold_every == faults.hold_every - 1 {
        counts.held.fetch_add(1, Ordering::Relaxed);
        // Held until the client gives the connection up (or the test ends).
        std::future::pending::<()>().await;
    }
    // Which watch this is (a watch's faults are chosen by it).
    let w = watch.then(|| counts.watches.fetch_add(1, Ordering::Relaxed));
    if let Some(w) = w {
        if faults.gone_every > 0 && w % faults.gone_every == faults.gone_every - 1 {
            counts.gone.fetch_add(1, Ordering::Relaxed);
            let event = serde_json::json!({ "type": "ERROR", "object": { "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "too old resource version (injected by the test's proxy)", "reason": "Expired", "code": 410 } });
            let mut line = serde_json::to_vec(&event).unwrap();
            line.push(b'\n');
            let mut response = Response::new(full(line));
            response.headers_mut().insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
            return response;
        }
    } else {
        let into = shared.started.elapsed().as_millis() as u64 % faults.burst_every.as_millis().max(1) as u64;
        if into < faults.burst.as_millis() as u64 {
            return match n % 3 {
                0 => {
                    counts.throttled.fetch_add(1, Ordering::Relaxed);
                    status(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests")
                }
                1 => {
                    counts.server_errors.fetch_add(1, Ordering::Relaxed);
                    status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError")
                }
                _ => {
                    counts.server_errors.fetch_add(1, Ordering::Relaxed);
                    status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable")
                }
            };
        }
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = body.collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest");
    };
    let mut upstream = Request::builder().method(parts.method).uri(parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"));
    for (name, value) in parts.headers.iter() {
        if name != http::header::AUTHORIZATION && name != http::header::HOST && name != http::header::CONTENT_LENGTH {
            upstream = upstream.header(name, value);
        }
    }
    let upstream = upstream.body(kube::client::Body::from(bytes.to_vec())).unwrap();
    let response = match shared.upstream.send(upstream).await {
        Ok(r) => r,
        Err(_) => return status(StatusCode::BAD_GATEWAY, "BadGateway"),
    };
    let (mut parts, body) = response.into_parts();
    // Framing is this hop's own.
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    parts.headers.remove(http::header::CONNECTION);
    let silenced = w.is_some_and(|w| faults.silence_every > 0 && w % faults.silence_every == faults.silence_every - 1);
    let body: Body = if silenced {
        // The answer's head went out; nothing more ever will, and the stream never ends.
        counts.silenced.fetch_add(1, Ordering::Relaxed);
        drop(body);
        // Counted when the connection goes (hyper drops the body then).
        let number = w.unwrap_or_default();
        counts.silenced_watches.lock().unwrap().insert(number);
        let given_up = GivenUp(shared.counts.clone(), number);
        let silent = futures::stream::unfold(given_up, |given_up| async move {
            std::future::pending::<()>().await;
            Some((Ok::<_, Error>(Frame::data(Bytes::new())), given_up))
        });
        BodyExt::boxed_unsync(StreamBody::new(silent))
    } else if watch && n.is_multiple_of(2) {
        // Dropped mid-stream: pass the stream on for a while, then fail it,
        // which aborts the connection (a truncated chunked body).
        counts.cut.fetch_add(1, Ordering::Relaxed);
        let until = tokio::time::Instant::now() + Duration::from_millis(500 + spread(n, 2500));
        let frames = body.into_data_stream();
        let stream = futures::stream::unfold((frames, false), move |(mut frames, done)| async move {
            use futures::StreamExt as _;
            if done {
                return None;
            }
            match tokio::time::timeout_at(until, frames.next()).await {
                Ok(Some(Ok(data))) => Some((Ok(Frame::data(data)), (frames, false))),
                Ok(Some(Err(e))) => Some((Err(Error::from(e)), (frames, true))),
                Ok(None) => None,
                Err(_) => Some((Err(Error::from("connection dropped by the test's proxy")), (frames, true))),
            }
        });
        BodyExt::boxed_unsync(StreamBody::new(stream))
    } else {
        body.map_err(Error::from).boxed_unsync()
    };
    Response::from_parts(parts, body)
}
