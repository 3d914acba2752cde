//! Shared pieces of the egress suites: a resolver the test controls, the
//! proxy on loopback, upstream servers (plain HTTP, HTTPS with a test CA,
//! echo, hold), and a raw proxy client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use skill_operator::egress::identity::authorization_value;
use skill_operator::egress::{proxy_token, Allowlist, JobBudget, JobId, JobSpec, MemoryRegistry, Proxy, ProxyConfig, Resolver};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The operator key of every test proxy.
pub(crate) const KEY: [u8; 32] = [42; 32];

/// Names to addresses, changeable between calls; counts calls per name.
/// With [`TestResolver::sequence`], successive calls get successive answers
/// (the last one repeats).
#[derive(Default)]
pub(crate) struct TestResolver {
    map: Mutex<HashMap<String, std::collections::VecDeque<Vec<IpAddr>>>>,
    calls: Mutex<HashMap<String, usize>>,
}

impl TestResolver {
    pub(crate) fn set(&self, name: &str, ips: &[&str]) {
        self.sequence(name, &[ips]);
    }
    pub(crate) fn sequence(&self, name: &str, answers: &[&[&str]]) {
        let answers = answers.iter().map(|ips| ips.iter().map(|s| s.parse().unwrap()).collect()).collect();
        self.map.lock().unwrap().insert(name.to_string(), answers);
    }
    pub(crate) fn calls(&self, name: &str) -> usize {
        self.calls.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

impl Resolver for TestResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        *self.calls.lock().unwrap().entry(host.to_string()).or_default() += 1;
        let answer = {
            let mut map = self.map.lock().unwrap();
            map.get_mut(host).and_then(|q| if q.len() > 1 { q.pop_front() } else { q.front().cloned() })
        };
        Box::pin(async move { answer.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such test name")) })
    }
}

/// The tests' configuration: loopback allowed (it is all tests can reach).
pub(crate) fn test_config() -> ProxyConfig {
    let mut cfg = ProxyConfig::new(KEY.to_vec());
    cfg.allow_cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    // Tests stop the proxy with tunnels open: cut them at once.
    cfg.limits.shutdown_grace = std::time::Duration::from_millis(50);
    cfg
}

/// A proxy on 127.0.0.1:0 with its registry and resolver.
pub(crate) struct Harness {
    pub proxy: Proxy,
    pub addr: SocketAddr,
    pub registry: MemoryRegistry,
    pub resolver: Arc<TestResolver>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

/// The proxy serving one job on a unix socket, as `serve` does for a
/// sandboxed run; [`UnixServed::stop`] ends it and checks it ended cleanly.
pub(crate) struct UnixServed {
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
    stop: oneshot::Sender<()>,
    task: JoinHandle<io::Result<()>>,
}

impl UnixServed {
    pub(crate) async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

impl Harness {
    /// Serve `job` (namespace `team`) on a fresh unix socket.
    pub(crate) fn serve_unix(&self, job: &str) -> UnixServed {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (stop, rx) = oneshot::channel::<()>();
        let proxy = self.proxy.clone();
        let job = JobId::new("team", job);
        let task = tokio::spawn(async move {
            proxy
                .serve_unix(listener, job, async {
                    let _ = rx.await;
                })
                .await
        });
        UnixServed { path, _dir: dir, stop, task }
    }

    pub(crate) async fn start(config: ProxyConfig) -> Harness {
        let registry = MemoryRegistry::new();
        let resolver = Arc::new(TestResolver::default());
        let proxy = Proxy::new(config, Arc::new(registry.clone()), resolver.clone()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let p = proxy.clone();
        let task = tokio::spawn(async move {
            p.serve_tcp(listener, async {
                let _ = rx.await;
            })
            .await
        });
        Harness { proxy, addr, registry, resolver, stop: Some(tx), task: Some(task) }
    }

    /// Register a job from 127.0.0.1 (or `source`) and return its token.
    pub(crate) fn job(&self, uid: &str, allow: &[&str]) -> String {
        self.job_with(uid, allow, Some("127.0.0.1"), JobBudget::default())
    }

    pub(crate) fn job_with(&self, uid: &str, allow: &[&str], source: Option<&str>, limits: JobBudget) -> String {
        let spec = JobSpec {
            namespace: "team".into(),
            uid: uid.into(),
            allow: Allowlist::parse(allow.iter().copied()).unwrap(),
            source: source.map(|s| s.parse().unwrap()),
            limits,
        };
        self.registry.upsert(spec);
        proxy_token(&KEY, &JobId::new("team", uid))
    }

    pub(crate) fn count(&self, verdict: &str, reason: &str) -> u64 {
        self.proxy.metrics().requests_with(verdict, reason)
    }

    /// Wait (bounded, 5 s) until `verdict`/`reason` has been counted at
    /// least `n` times: the proxy counts a request when its connection ends,
    /// which can be after the client has seen the last byte and gone.
    pub(crate) async fn wait_count(&self, verdict: &str, reason: &str, n: u64) {
        wait_for(|| self.count(verdict, reason) >= n).await;
    }

    pub(crate) async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

/// Wait (bounded, 5 s) for a condition the proxy reaches after the client saw
/// the end: the log line and counters follow the last byte.
pub(crate) async fn wait_for(cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("condition not reached");
}

/// A proxy response head: status, headers (lower-case names), body if read.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
    pub(crate) fn refused(&self) -> Option<&str> {
        self.header("x-egress-refused")
    }
}

/// Read one response head (and, with Content-Length, its body).
pub(crate) async fn read_reply<S: AsyncRead + Unpin>(s: &mut S) -> Reply {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.expect("read the proxy's reply");
        assert!(n > 0, "the connection closed before a reply; got {:?}", String::from_utf8_lossy(&buf));
        buf.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let mut body = String::new();
    if let Some(len) = headers.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.parse::<usize>().unwrap()) {
        let mut b = vec![0u8; len];
        s.read_exact(&mut b).await.unwrap();
        body = String::from_utf8_lossy(&b).to_string();
    }
    Reply { status, headers, body }
}

/// Open a connection to the proxy from `127.0.0.1` or another loopback source.
pub(crate) async fn connect_from(proxy: SocketAddr, source: Option<&str>) -> TcpStream {
    match source {
        None => TcpStream::connect(proxy).await.unwrap(),
        Some(src) => {
            let sock = TcpSocket::new_v4().unwrap();
            sock.bind(SocketAddr::new(src.parse().unwrap(), 0)).unwrap();
            sock.connect(proxy).await.unwrap()
        }
    }
}

/// `CONNECT authority` with an optional token; the stream and the reply.
pub(crate) async fn connect(proxy: SocketAddr, authority: &str, token: Option<&str>) -> (TcpStream, Reply) {
    connect_with(proxy, authority, token, None).await
}

pub(crate) async fn connect_with(proxy: SocketAddr, authority: &str, token: Option<&str>, source: Option<&str>) -> (TcpStream, Reply) {
    let mut s = connect_from(proxy, source).await;
    let auth = token.map(|t| format!("Proxy-Authorization: {}\r\n", authorization_value(t))).unwrap_or_default();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n").as_bytes()).await.unwrap();
    let reply = read_reply(&mut s).await;
    (s, reply)
}

/// Send raw bytes as a request and read the reply.
pub(crate) async fn raw(proxy: SocketAddr, request: &str) -> Reply {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    read_reply(&mut s).await
}

/// A plain HTTP GET through the proxy; the whole response text.
pub(crate) async fn http_get(proxy: SocketAddr, url: &str, token: Option<&str>, extra: &str) -> (Reply, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let auth = token.map(|t| format!("Proxy-Authorization: {}\r\n", authorization_value(t))).unwrap_or_default();
    s.write_all(format!("GET {url} HTTP/1.1\r\nHost: ignored.test\r\n{auth}{extra}\r\n").as_bytes()).await.unwrap();
    let reply = read_reply(&mut s).await;
    let mut rest = String::new();
    s.read_to_string(&mut rest).await.unwrap();
    (reply, rest)
}

// -- upstream servers ---------------------------------------------------------

/// Counts of what upstream servers saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub connections: AtomicUsize,
    pub requests: AtomicUsize,
    pub bytes: AtomicUsize,
    pub last_head: Mutex<String>,
}

/// Files an upstream serves by path (the pip index); others get the echo page.
pub(crate) type Files = Arc<HashMap<String, (String, Vec<u8>)>>;

/// Plain HTTP on 127.0.0.1:0.
pub(crate) async fn http_upstream(files: Files) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            s.connections.fetch_add(1, Ordering::SeqCst);
            let (s, files) = (s.clone(), files.clone());
            tokio::spawn(async move {
                let _ = serve_http(stream, &s, &files).await;
            });
        }
    });
    (addr, seen)
}

/// One request per connection: the echo page (`host=... path=... proxy-auth=...`),
/// `/big/<n>` (n bytes), or a file.
pub(crate) async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, seen: &Seen, files: &Files) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        seen.bytes.fetch_add(n, Ordering::SeqCst);
        buf.extend_from_slice(&chunk[..n]);
    }
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let head = String::from_utf8_lossy(&buf).to_string();
    *seen.last_head.lock().unwrap() = head.clone();
    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
    let host = head.lines().find_map(|l| l.strip_prefix("Host: ").or_else(|| l.strip_prefix("host: "))).unwrap_or("-").trim().to_string();
    let proxy_auth = head.to_ascii_lowercase().contains("proxy-authorization");
    let (ctype, body): (String, Vec<u8>) = if let Some(n) = path.strip_prefix("/big/") {
        ("application/octet-stream".into(), vec![b'x'; n.parse().unwrap_or(0)])
    } else if let Some((ctype, bytes)) = files.get(&path) {
        (ctype.clone(), bytes.clone())
    } else if files.contains_key("404") {
        let resp = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        stream.write_all(resp.as_bytes()).await?;
        return stream.shutdown().await;
    } else {
        ("text/plain".into(), format!("hello host={host} path={path} proxy-auth={proxy_auth}\n").into_bytes())
    };
    let resp = format!("HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nKeep-Alive: timeout=5\r\n\r\n", body.len());
    stream.write_all(resp.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.flush().await?;
    stream.shutdown().await
}

/// The test CA and a server certificate for the test names.
pub(crate) struct TestPki {
    pub ca_pem: String,
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn pki() -> TestPki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "skill-operator egress test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let names: Vec<String> =
        ["allowed.test", "other.test", "rebind.test", "a.wild.test", "localhost"].iter().map(|s| s.to_string()).collect();
    let mut leaf = CertificateParams::new(names).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "allowed.test");
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();

    let key_der = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf_cert.der().clone(), ca_cert.der().clone()], key_der)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TestPki { ca_pem: ca_cert.pem(), server: Arc::new(server), client: Arc::new(client) }
}

/// HTTPS on 127.0.0.1:0 serving [`serve_http`].
pub(crate) async fn https_upstream(server: Arc<rustls::ServerConfig>, files: Files) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            s.connections.fetch_add(1, Ordering::SeqCst);
            let (s, files, acceptor) = (s.clone(), files.clone(), acceptor.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    let _ = serve_http(tls, &s, &files).await;
                }
            });
        }
    });
    (addr, seen)
}

/// Echo every byte back.
pub(crate) async fn echo_upstream() -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            s.connections.fetch_add(1, Ordering::SeqCst);
            let s = s.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            s.bytes.fetch_add(n, Ordering::SeqCst);
                            if stream.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Send `n` bytes to every connection, then close.
pub(crate) async fn source_upstream(n: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let chunk = vec![b'y'; 65536];
                let mut left = n;
                while left > 0 {
                    let k = left.min(chunk.len());
                    if stream.write_all(&chunk[..k]).await.is_err() {
                        return;
                    }
                    left -= k;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

/// Read until end of stream or error; the bytes read.
pub(crate) async fn drain<S: AsyncRead + Unpin>(s: &mut S) -> usize {
    let mut buf = vec![0u8; 65536];
    let mut total = 0;
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return total,
            Ok(n) => total += n,
        }
    }
}

/// A TLS client over a tunnel.
pub(crate) async fn tls_over(
    stream: TcpStream,
    client: Arc<rustls::ClientConfig>,
    name: &str,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    tokio_rustls::TlsConnector::from(client).connect(server_name, stream).await
}

/// Whether a gated prerequisite may be skipped (`SKILL_OPERATOR_REQUIRE_GATED=1` says no).
pub(crate) fn skip(why: &str) {
    if std::env::var("SKILL_OPERATOR_REQUIRE_GATED").as_deref() == Ok("1") {
        panic!("SKILL_OPERATOR_REQUIRE_GATED=1 and a prerequisite is missing: {why}");
    }
    println!("SKIPPED: {why}");
}
