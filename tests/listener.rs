//! Every HTTP listener bounded (issue 14), with real sockets on loopback:
//! a slowloris client (thousands of connections that never finish their
//! head), a slow-body client (1 byte per second) and a connection flood,
//! each while a legitimate client keeps getting answers; run against the
//! shared builder itself and against each listener built on it: `serve
//! --http`, the artifact endpoint, the controller's metrics/health, the
//! egress proxy (its own accept loop) and its metrics endpoint. The gateway
//! cannot start without a cluster; its listener line is the shared
//! builder, covered here at that level.
//!
//! Attackers connect from 127.0.0.2 and up (Linux routes all of 127/8 to
//! lo), the legitimate client from 127.0.0.1, so the per-address cap can
//! be seen refusing the attackers' excess without starving the client.
//! Nothing waits on a sleep: every test polls a counter or a socket state
//! until a condition holds, under an overall deadline.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::{get, put};
use axum::Router;
use skill_operator::listener::{self, Bounds, Close, ListenerMetrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::Instant;

/// One attack at a time: each holds thousands of sockets (both ends in this process).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LEGIT: [u8; 4] = [127, 0, 0, 1];
/// How long a legitimate request may take while an attack runs (the
/// attacks last several header timeouts; without the bounds the request
/// gets a 503 or no answer at all, not a slow one).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// How long any test waits for its condition.
const DEADLINE: Duration = Duration::from_secs(90);
const SLOWLORIS: usize = 3000;
const FLOOD: usize = 3000;
const SLOW_BODIES: usize = 40;

/// The bounds of every listener under test: short timeouts, caps small
/// enough that the attacks exceed them.
fn bounds() -> Bounds {
    Bounds {
        header_timeout: Duration::from_millis(1000),
        idle_timeout: Duration::from_millis(1000),
        body_grace: Duration::from_millis(1000),
        body_min_rate: 64 * 1024,
        max_connections: 1000,
        max_connections_per_address: 100,
        ..Bounds::default()
    }
}

/// For the floods: a head deadline longer than the flood, so the admitted
/// connections are all still held when the excess is counted.
fn flood_bounds() -> Bounds {
    Bounds { header_timeout: Duration::from_secs(60), ..bounds() }
}

fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// A loopback listener bound the way every command binds (its backlog
/// holds a whole flood: with tokio's default of 1,024 the kernel drops
/// handshakes the accept loop has not reached yet).
fn bind() -> TcpListener {
    listener::bind("127.0.0.1:0".parse().unwrap()).unwrap()
}

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// How a listener is read: where it answers, what its counters say.
struct Target {
    name: &'static str,
    addr: SocketAddr,
    /// The legitimate request and the status it must get.
    legit: &'static str,
    legit_status: u16,
    /// The start of a request that is never finished.
    partial_head: &'static str,
    /// Closes counted for a reason (the listener's own names).
    closed: Box<dyn Fn(Close) -> u64 + Send + Sync>,
    per_address: usize,
}

impl Target {
    fn http(name: &'static str, addr: SocketAddr, metrics: ListenerMetrics, per_address: usize) -> Target {
        Target {
            name,
            addr,
            legit: "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            legit_status: 200,
            partial_head: "GET /healthz HTTP/1.1\r\nHost: x\r\n",
            closed: Box::new(move |why| metrics.closed(why)),
            per_address,
        }
    }
}

/// One request on a fresh connection from 127.0.0.1: its status, or why not.
async fn legit_once(target: &Target) -> Result<u16, String> {
    let go = async {
        let mut s = connect_from(IpAddr::from(LEGIT), target.addr).await.map_err(|e| format!("connect: {e}"))?;
        s.write_all(target.legit.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(2).any(|w| w == b"\r\n") {
            let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err(format!("closed after {} bytes", head.len()));
            }
            head.extend_from_slice(&buf[..n]);
        }
        status_of(&head).ok_or_else(|| format!("not a status line: {:?}", String::from_utf8_lossy(&head)))
    };
    match tokio::time::timeout(ANSWER_WITHIN, go).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {ANSWER_WITHIN:?}")),
    }
}

fn status_of(bytes: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(bytes);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// The legitimate client, asking again and again until stopped.
struct Legit {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
}

impl Legit {
    fn start(target: Arc<Target>) -> Legit {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut ok, mut failures) = (0, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                match legit_once(&target).await {
                    Ok(s) if s == target.legit_status => ok += 1,
                    Ok(s) => failures.push(format!("status {s}")),
                    Err(e) => failures.push(e),
                }
                tokio::task::yield_now().await;
            }
            (ok, failures)
        });
        Legit { stop, task }
    }

    /// Stop, and check every answer came, right and in time.
    async fn check(self, name: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let (ok, failures) = self.task.await.unwrap();
        assert!(
            failures.is_empty(),
            "{name}: the legitimate client failed {} times ({} ok): {:?}",
            failures.len(),
            ok,
            &failures[..failures.len().min(5)]
        );
        assert!(ok >= 3, "{name}: the legitimate client got only {ok} answers");
    }
}

/// Poll `cond` until it holds; fail with `what` at the deadline.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Open `n` connections from `from` (round robin) as fast as the kernel lets.
async fn open_many(target: &Target, n: usize, from: &[IpAddr]) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let connects = chunk.iter().map(|i| connect_from(from[i % from.len()], target.addr));
        for s in futures::future::join_all(connects).await {
            out.push(s.expect("attacker connect"));
        }
    }
    out
}

/// What became of an attacker's connection: the bytes the server sent
/// before closing it (a reset counts as closed), read until `DEADLINE`.
async fn until_closed(mut s: TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(DEADLINE, read).await.ok().map(|_| got)
}

/// Thousands of connections from three attacker addresses send the start of
/// a head and stop. Each address gets `per_address` in, the rest is refused
/// at once; those let in are cut by the head deadline (with a 408); the
/// legitimate client is answered throughout.
async fn slowloris(target: Arc<Target>, timeout_reason: Close, refused_reason: Close) {
    let _one = ONE_AT_A_TIME.lock().await;
    raise_fd_limit();
    let (timeouts0, refused0) = ((target.closed)(timeout_reason), (target.closed)(refused_reason));
    let legit = Legit::start(target.clone());
    let from = [ip(2), ip(3), ip(4)];
    let mut conns = open_many(&target, SLOWLORIS, &from).await;
    for s in &mut conns {
        // A closed (refused) socket may refuse the write too; that is fine.
        let _ = s.write_all(target.partial_head.as_bytes()).await;
    }
    let results = futures::future::join_all(conns.into_iter().map(until_closed)).await;
    let open = results.iter().filter(|r| r.is_none()).count();
    assert_eq!(open, 0, "{}: {open} slowloris connections still open after {DEADLINE:?}", target.name);
    // Every connection was refused at once or let in and cut; each address
    // had `per_address` in at least (more over time, as cut ones made room).
    let admitted = from.len() * target.per_address;
    wait_for("every connection counted as refused or cut", || {
        (target.closed)(timeout_reason) - timeouts0 >= admitted as u64
            && (target.closed)(timeout_reason) - timeouts0 + (target.closed)(refused_reason) - refused0 >= SLOWLORIS as u64
    })
    .await;
    let cut = (target.closed)(timeout_reason) - timeouts0;
    if timeout_reason == Close::HeaderTimeout {
        let answered = results.iter().flatten().filter(|b| status_of(b) == Some(408)).count() as u64;
        assert!(answered >= admitted as u64, "{}: {answered} connections cut with a 408, {cut} cut", target.name);
    }
    legit.check(target.name).await;
}

/// Many connections from one address as fast as it can, held silently:
/// past the per-address cap each is answered 503 and closed at once (while
/// the admitted ones are still held), and the legitimate client is served.
async fn flood(target: Arc<Target>, refused_reason: Close) {
    let _one = ONE_AT_A_TIME.lock().await;
    raise_fd_limit();
    let refused0 = (target.closed)(refused_reason);
    let legit = Legit::start(target.clone());
    let conns = open_many(&target, FLOOD, &[ip(5)]).await;
    let expected = (FLOOD - target.per_address) as u64;
    wait_for("the flood's excess to be refused", || (target.closed)(refused_reason) - refused0 >= expected).await;
    // The refused ones are closed by the server (after a 503); the admitted ones are still open.
    let mut held = Vec::new();
    for mut s in conns {
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                assert_eq!(status_of(&buf[..n]), Some(503), "{}: {:?}", target.name, String::from_utf8_lossy(&buf[..n]))
            }
            Ok(_) => {}
            Err(_) => held.push(s),
        }
    }
    assert_eq!(held.len(), target.per_address, "{}: flood connections held", target.name);
    legit.check(target.name).await;
    drop(held);
}

/// Bodies at one byte per second, all from one address: each is cut at the
/// body deadline, the connection answered and closed, the legitimate client served.
async fn slow_body(target: Arc<Target>, head: String, expect_status: Option<u16>) {
    let _one = ONE_AT_A_TIME.lock().await;
    let cut0 = (target.closed)(Close::BodyTimeout);
    let legit = Legit::start(target.clone());
    let mut conns = open_many(&target, SLOW_BODIES, &[ip(6)]).await;
    for s in &mut conns {
        s.write_all(head.as_bytes()).await.unwrap();
    }
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            let done = done.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 512];
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                let outcome = tokio::time::timeout(DEADLINE, async {
                    loop {
                        tokio::select! {
                            _ = tick.tick() => { if s.write_all(b"x").await.is_err() { break; } }
                            r = s.read(&mut buf) => match r {
                                Ok(0) | Err(_) => break,
                                Ok(n) => got.extend_from_slice(&buf[..n]),
                            },
                        }
                    }
                })
                .await;
                // Read what is left after a failed write.
                let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut got)).await;
                done.fetch_add(1, Ordering::Relaxed);
                (outcome.is_ok(), got)
            })
        })
        .collect();
    let results = futures::future::join_all(tasks).await;
    for r in results {
        let (closed, got) = r.unwrap();
        assert!(closed, "{}: a slow body's connection stayed open", target.name);
        if let Some(status) = expect_status {
            assert_eq!(status_of(&got), Some(status), "{}: {:?}", target.name, String::from_utf8_lossy(&got));
        }
    }
    wait_for("the body cuts to be counted", || (target.closed)(Close::BodyTimeout) - cut0 >= SLOW_BODIES as u64).await;
    legit.check(target.name).await;
}

// ---- the shared builder ----------------------------------------------------

async fn builder_target(
    bounds: Bounds,
) -> (Arc<Target>, ListenerMetrics, tokio_util::sync::CancellationToken, tokio::task::JoinHandle<std::io::Result<()>>) {
    let metrics = ListenerMetrics::default();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/upload", put(|body: Bytes| async move { format!("{} bytes", body.len()) }))
        .route(
            "/stream",
            get(|| async {
                // A long response: a chunk every 300 ms for 3 s, past both timeouts.
                let chunks = futures::stream::unfold(0, |i| async move {
                    if i == 10 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Some((Ok::<_, std::convert::Infallible>(Bytes::from(format!("chunk {i}\n"))), i + 1))
                });
                axum::body::Body::from_stream(chunks)
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                "finished"
            }),
        );
    let l = bind();
    let addr = l.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(listener::serve(l, app, bounds, metrics.clone(), stop.clone().cancelled_owned()));
    (Arc::new(Target::http("builder", addr, metrics.clone(), bounds.max_connections_per_address)), metrics, stop, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_slowloris() {
    let (t, ..) = builder_target(bounds()).await;
    slowloris(t, Close::HeaderTimeout, Close::AddressFull).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_flood() {
    let (t, ..) = builder_target(flood_bounds()).await;
    flood(t, Close::AddressFull).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_slow_body() {
    let (t, ..) = builder_target(bounds()).await;
    let head = format!("PUT /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", 1000);
    // axum's `Bytes` extractor answers a failed body 400.
    slow_body(t, head, Some(400)).await;
}

/// Past the listener's cap (addresses spread, so no per-address cap
/// applies) a connection is answered 503 at once; once the holders are cut
/// by the head deadline the listener serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_connection_cap() {
    let _one = ONE_AT_A_TIME.lock().await;
    raise_fd_limit();
    let b = Bounds { max_connections: 200, ..bounds() };
    let (t, metrics, ..) = builder_target(b).await;
    let from: Vec<IpAddr> = (10..20).map(ip).collect();
    let conns = open_many(&t, 300, &from).await;
    wait_for("100 connections over the cap refused", || metrics.closed(Close::ConnectionsFull) >= 100).await;
    assert_eq!(metrics.closed(Close::AddressFull), 0, "30 per address is under the per-address cap");
    // Full: the legitimate client is refused, with an answer.
    assert_eq!(legit_once(&t).await, Ok(503));
    wait_for("the holders cut by the head deadline", || metrics.closed(Close::HeaderTimeout) >= 200).await;
    assert_eq!(legit_once(&t).await, Ok(200));
    drop(conns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_is_closed_between_requests_but_a_long_response_is_not_cut() {
    let (t, metrics, ..) = builder_target(bounds()).await;
    let mut s = connect_from(IpAddr::from(LEGIT), t.addr).await.unwrap();
    // A streaming response of 3 s outlasts the 1 s head and idle timeouts.
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("chunk 9") {
        let n = tokio::time::timeout(DEADLINE, s.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "the stream was cut: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(metrics.closed(Close::IdleTimeout) + metrics.closed(Close::HeaderTimeout), 0);
    // Then the kept-alive connection waits for a next request: closed at the idle timeout, silently.
    let idle_since = Instant::now();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(DEADLINE, s.read_to_end(&mut rest)).await.unwrap();
    assert!(n.is_ok() && !String::from_utf8_lossy(&rest).contains("HTTP/1.1"), "{:?}", String::from_utf8_lossy(&rest));
    assert!(idle_since.elapsed() >= Duration::from_millis(900), "closed before the idle timeout");
    wait_for("the idle close to be counted", || metrics.closed(Close::IdleTimeout) == 1).await;
    assert_eq!(metrics.closed(Close::HeaderTimeout), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_cap_is_431() {
    let (t, metrics, ..) = builder_target(Bounds { max_head_bytes: 4096, max_headers: 20, ..bounds() }).await;
    for head in [
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(5000)),
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{}\r\n", (0..30).map(|i| format!("X-{i}: v\r\n")).collect::<String>()),
        format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "p".repeat(5000)),
    ] {
        let mut s = connect_from(IpAddr::from(LEGIT), t.addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let got = until_closed(s).await.expect("closed");
        assert_eq!(status_of(&got), Some(431), "{:?}", String::from_utf8_lossy(&got));
    }
    wait_for("three 431s counted", || metrics.closed(Close::HeadTooLarge) == 3).await;
    // Under the cap is fine.
    let mut s = connect_from(IpAddr::from(LEGIT), t.addr).await.unwrap();
    s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Ok: {}\r\nConnection: close\r\n\r\n", "a".repeat(3000)).as_bytes())
        .await
        .unwrap();
    assert_eq!(status_of(&until_closed(s).await.unwrap()), Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_request_in_flight_finish() {
    let (t, _, stop, server) = builder_target(bounds()).await;
    let mut s = connect_from(IpAddr::from(LEGIT), t.addr).await.unwrap();
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    // The request is in flight once a second connection's request is answered after it was sent.
    assert_eq!(legit_once(&t).await, Ok(200));
    stop.cancel();
    let got = until_closed(s).await.expect("closed after the answer");
    assert_eq!(status_of(&got), Some(200));
    assert!(String::from_utf8_lossy(&got).contains("finished"));
    tokio::time::timeout(DEADLINE, server).await.unwrap().unwrap().unwrap();
    assert!(connect_from(IpAddr::from(LEGIT), t.addr).await.is_err(), "the listener is closed");
}

#[tokio::test]
async fn bounds_are_checked() {
    assert!(Bounds::default().check().is_ok());
    let err = Bounds { max_connections_per_address: 0, ..Bounds::default() }.check().unwrap_err().to_string();
    assert!(err.contains("max-connections-per-address"), "{err}");
    assert!(Bounds { max_head_bytes: 100, ..Bounds::default() }.check().is_err());
}

// ---- serve --http ----------------------------------------------------------

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

async fn serve_http_target(bounds: Bounds) -> Arc<Target> {
    use skill_operator::core::grants::Grants;
    use skill_operator::mcp::snapshot::Snapshot;
    use skill_operator::mcp::state::ServerState;
    use skill_operator::serve::http::{serve_on, Auth, HttpOptions, Tokens};
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::scan(&[dir.path().to_path_buf()], Grants::resolve(&|_| None, None), Default::default());
    let l = bind();
    let addr = l.local_addr().unwrap();
    let metrics = ListenerMetrics::default();
    let options = HttpOptions {
        addr,
        allowed_hosts: vec![],
        allowed_origins: vec![],
        auth: Auth::Tokens(Arc::new(Tokens::single("alice", TOKEN))),
        max_sessions: 4,
        bounds,
        listener_metrics: metrics.clone(),
    };
    let state = Arc::new(ServerState::new(snapshot));
    tokio::spawn(async move {
        let _dir = dir;
        serve_on(l, state, options, skill_operator::shutdown::Shutdown::new()).await
    });
    Arc::new(Target::http("serve --http", addr, metrics, bounds.max_connections_per_address))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_slowloris() {
    slowloris(serve_http_target(bounds()).await, Close::HeaderTimeout, Close::AddressFull).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_flood() {
    flood(serve_http_target(flood_bounds()).await, Close::AddressFull).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_slow_body() {
    let t = serve_http_target(bounds()).await;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n"
    );
    slow_body(t, head, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_metrics_show_the_counters() {
    let t = serve_http_target(bounds()).await;
    let mut s = connect_from(ip(7), t.addr).await.unwrap();
    s.write_all(t.partial_head.as_bytes()).await.unwrap();
    until_closed(s).await.expect("cut");
    // Behind the same bearer token as /mcp: what the server counts is its token holders'.
    let mut s = connect_from(IpAddr::from(LEGIT), t.addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await.unwrap();
    let refused = String::from_utf8_lossy(&until_closed(s).await.unwrap()).into_owned();
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let mut s = connect_from(IpAddr::from(LEGIT), t.addr).await.unwrap();
    let get = format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n");
    s.write_all(get.as_bytes()).await.unwrap();
    let text = String::from_utf8_lossy(&until_closed(s).await.unwrap()).into_owned();
    assert!(text.contains("skill_operator_http_listener_closed_total{reason=\"header_timeout\"} 1"), "{text}");
    assert!(text.contains("skill_operator_http_listener_closed_total{reason=\"address_full\"} 0"), "{text}");
}

// ---- the artifact endpoint -------------------------------------------------

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef-listener-tests";

/// The endpoint with a registry on a closed port: the attacks never get as
/// far as the registry (the body is spooled before any registry call).
async fn artifacts_target(bounds: Bounds) -> (Arc<Target>, tempfile::TempDir) {
    use skill_operator::artifacts::server::{self, AppState, ServerConfig};
    skill_operator::tls::install_crypto_provider();
    let spool = tempfile::tempdir().unwrap();
    let metrics = ListenerMetrics::default();
    let mut cfg = ServerConfig::new("127.0.0.1:1/jobs", KEY.to_vec());
    cfg.plain_http = true;
    cfg.spool_dir = Some(spool.path().into());
    cfg.bounds = bounds;
    cfg.listener_metrics = metrics.clone();
    let l = bind();
    let addr = l.local_addr().unwrap();
    tokio::spawn(server::serve(l, AppState::new(cfg).unwrap(), std::future::pending()));
    (Arc::new(Target::http("artifacts", addr, metrics, bounds.max_connections_per_address)), spool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_slowloris() {
    let (t, _spool) = artifacts_target(bounds()).await;
    slowloris(t, Close::HeaderTimeout, Close::AddressFull).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_flood() {
    let (t, _spool) = artifacts_target(flood_bounds()).await;
    flood(t, Close::AddressFull).await;
}

/// An operator PUT of an input at one byte per second: 408 `body_too_slow`,
/// and the spool directory holds nothing afterwards (spool files are
/// unnamed; this checks no named leftover appears either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_slow_body() {
    let (t, spool) = artifacts_target(bounds()).await;
    let token = skill_operator::artifacts::operator_token(KEY);
    let head = format!(
        "PUT /v1/jobs/team-a/3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60/inputs/data.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer operator:{token}\r\nContent-Length: 1000\r\n\r\n"
    );
    slow_body(t, head, Some(408)).await;
    assert_eq!(std::fs::read_dir(spool.path()).unwrap().count(), 0, "nothing left in the spool directory");
}

// ---- the controller's metrics and health -----------------------------------

async fn controller_target(bounds: Bounds) -> (Arc<Target>, Arc<skill_operator::controller::metrics::Metrics>) {
    let metrics = Arc::new(skill_operator::controller::metrics::Metrics::default());
    let l = bind();
    let addr = l.local_addr().unwrap();
    tokio::spawn(skill_operator::controller::run::serve_web(
        l,
        metrics.clone(),
        skill_operator::metrics_access::MetricsAccess::open(),
        bounds,
        std::future::pending(),
    ));
    (Arc::new(Target::http("controller", addr, metrics.listener.clone(), bounds.max_connections_per_address)), metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_slowloris() {
    let (t, metrics) = controller_target(bounds()).await;
    slowloris(t, Close::HeaderTimeout, Close::AddressFull).await;
    // Its /metrics carries the counts.
    let text = metrics.render();
    let cut: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("skill_operator_http_listener_closed_total{reason=\"header_timeout\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(cut >= 300, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_flood() {
    let (t, _) = controller_target(flood_bounds()).await;
    flood(t, Close::AddressFull).await;
}

// ---- the egress proxy ------------------------------------------------------

/// The proxy's own accept loop: its head deadline and the per-address cap
/// on connections still sending their head; the legitimate client's
/// CONNECT without a credential is answered 407.
async fn egress_target(header_timeout: Duration) -> (Arc<Target>, skill_operator::egress::Proxy) {
    use skill_operator::egress::{MemoryRegistry, Proxy, ProxyConfig, SystemResolver};
    let mut cfg = ProxyConfig::new(vec![7; 32]);
    cfg.limits.header_timeout = header_timeout;
    cfg.limits.max_pending = 1000;
    cfg.limits.max_pending_per_address = 100;
    cfg.limits.shutdown_grace = Duration::ZERO;
    let proxy = Proxy::new(cfg, Arc::new(MemoryRegistry::default()), Arc::new(SystemResolver)).unwrap();
    let l = bind();
    let addr = l.local_addr().unwrap();
    let p = proxy.clone();
    tokio::spawn(async move { p.serve_tcp(l, std::future::pending()).await });
    let m = proxy.clone();
    let target = Target {
        name: "egress proxy",
        addr,
        legit: "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        legit_status: 407,
        partial_head: "CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n",
        closed: Box::new(move |why| match why {
            Close::HeaderTimeout => m.metrics().requests_with("refused", "header_timeout"),
            Close::AddressFull => m.metrics().requests_with("refused", "address_busy"),
            _ => 0,
        }),
        per_address: 100,
    };
    (Arc::new(target), proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_proxy_slowloris() {
    let (t, _proxy) = egress_target(bounds().header_timeout).await;
    // The proxy answers a head timeout with its own refusal (408 as well).
    slowloris(t, Close::HeaderTimeout, Close::AddressFull).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_proxy_flood() {
    let (t, _proxy) = egress_target(flood_bounds().header_timeout).await;
    flood(t, Close::AddressFull).await;
}

async fn egress_metrics_target() -> Arc<Target> {
    use skill_operator::egress::{MemoryRegistry, Proxy, ProxyConfig, SystemResolver};
    let proxy = Proxy::new(ProxyConfig::new(vec![7; 32]), Arc::new(MemoryRegistry::default()), Arc::new(SystemResolver)).unwrap();
    let l = bind();
    let addr = l.local_addr().unwrap();
    tokio::spawn(skill_operator::egress::serve_metrics(l, proxy, skill_operator::metrics_access::MetricsAccess::open(), bounds()));
    // Its counters live in the endpoint: read them from /metrics.
    let closed = Box::new(move |why: Close| scrape(addr, why));
    Arc::new(Target { closed, ..Target::http("egress metrics", addr, ListenerMetrics::default(), bounds().max_connections_per_address) })
}

/// One counter from a `/metrics` page, fetched with a blocking client (the
/// counter closures are synchronous).
fn scrape(addr: SocketAddr, why: Close) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("metrics connect");
    s.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let key = format!("skill_operator_http_listener_closed_total{{reason=\"{}\"}} ", why.as_str());
    text.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_metrics_slowloris() {
    slowloris(egress_metrics_target().await, Close::HeaderTimeout, Close::AddressFull).await;
}
