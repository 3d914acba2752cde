//! The egress proxy's splice(2) path against real sockets on loopback: a
//! direction that has carried bulk moves the rest through a pipe, and every
//! rule of the copy loop must still hold there. Each test first pushes a
//! direction past the switch and checks (by the `zero_copy_bytes` counter)
//! that splice really moved the bytes, then tries to break one rule: the
//! byte budgets cut at their exact edge, a busy tunnel is not idle and an
//! idle one is cut, end of stream half-closes only after the pipe is
//! drained, and 64 MiB arrive intact through CONNECT, plain HTTP and a
//! unix-socket client.

#[path = "egress/support.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use skill_operator::egress::{JobBudget, ProxyConfig};
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

const MIB: usize = 1 << 20;

/// `n` pseudo-random bytes (xorshift), so a lost, doubled or reordered
/// block changes the checksum. The first byte is not 0x16, so the proxy's
/// ClientHello check passes the stream as not-TLS on a non-TLS port.
fn data(n: usize) -> Arc<Vec<u8>> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v[0] = b'Z';
    Arc::new(v)
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Read to end of stream: how many bytes and their checksum.
async fn read_all<S: AsyncRead + Unpin>(s: &mut S) -> (usize, String) {
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return (total, hex::encode(hash.finalize())),
            Ok(n) => {
                hash.update(&buf[..n]);
                total += n;
            }
        }
    }
}

/// Sends `data`, half-closes, then reads until the client's end of stream
/// and reports what it read: the client→upstream direction must still
/// carry bytes after upstream→client ended.
async fn sender_upstream(data: Arc<Vec<u8>>) -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let (data, tx) = (data.clone(), tx.clone());
            tokio::spawn(async move {
                if s.write_all(&data).await.is_err() {
                    return;
                }
                let _ = s.shutdown().await;
                let mut after = Vec::new();
                let _ = s.read_to_end(&mut after).await;
                let _ = tx.send(after);
            });
        }
    });
    (addr, rx)
}

/// Reads until end of stream, reports `(length, checksum)` of what came,
/// then answers the same as `<length> <checksum>` and closes.
async fn sink_upstream() -> (SocketAddr, mpsc::UnboundedReceiver<(usize, String)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let tx = tx.clone();
            tokio::spawn(async move {
                let (n, sum) = read_all(&mut s).await;
                let _ = tx.send((n, sum.clone()));
                let _ = s.write_all(format!("{n} {sum}").as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, rx)
}

/// One HTTP response per connection: a head that asks for keep-alive
/// (which the proxy must rewrite) and `data` as the body.
async fn http_body_upstream(data: Arc<Vec<u8>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let data = data.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n", data.len());
                if s.write_all(resp.as_bytes()).await.is_ok() && s.write_all(&data).await.is_ok() {
                    let _ = s.shutdown().await;
                }
            });
        }
    });
    addr
}

/// Read a response head byte by byte (the body stays unread).
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "closed before the head: {}", String::from_utf8_lossy(&head));
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

fn config(zero_copy: bool) -> ProxyConfig {
    let mut cfg = test_config();
    cfg.zero_copy = zero_copy;
    cfg
}

/// A harness and a token for `allowed.test:<port>`.
async fn proxy_for(cfg: ProxyConfig, port: u16, budget: JobBudget) -> (Harness, String) {
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    let token = h.job_with("a", &[&format!("allowed.test:{port}")], Some("127.0.0.1"), budget);
    (h, token)
}

fn zero_copy(h: &Harness, direction: &str) -> usize {
    h.proxy.metrics().zero_copy_bytes_with(direction) as usize
}

/// Until the tunnel's access-log line and counters are written.
async fn ended(h: &Harness, verdict: &str, reason: &str) {
    for _ in 0..500 {
        if h.count(verdict, reason) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the tunnel never ended as {verdict}/{reason}");
}

#[tokio::test]
async fn a_64_mib_download_through_connect_arrives_intact_spliced_and_half_closes_after_the_pipe() {
    let body = data(64 * MIB);
    for zc in [true, false] {
        let (up, mut after) = sender_upstream(body.clone()).await;
        let (h, token) = proxy_for(config(zc), up.port(), JobBudget::default()).await;
        let (mut s, reply) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
        assert_eq!(reply.status, 200);
        // The upstream half-closed right after its last byte: the client
        // sees end of stream only after every byte, pipe included.
        assert_eq!(read_all(&mut s).await, (body.len(), sha(&body)), "zero_copy = {zc}");
        // The other direction still carries bytes after that half-close.
        s.write_all(b"after the end").await.unwrap();
        s.shutdown().await.unwrap();
        assert_eq!(after.recv().await.unwrap(), b"after the end");
        ended(&h, "allowed", "ok").await;
        if zc {
            assert!(zero_copy(&h, "down") >= 63 * MIB, "spliced only {} bytes down", zero_copy(&h, "down"));
        } else {
            assert_eq!(zero_copy(&h, "down"), 0, "--no-zero-copy must copy every byte");
        }
        h.stop().await;
    }
}

#[tokio::test]
async fn a_64_mib_upload_through_connect_arrives_intact_spliced_and_half_closes_after_the_pipe() {
    let body = data(64 * MIB);
    let (up, mut sums) = sink_upstream().await;
    let (h, token) = proxy_for(config(true), up.port(), JobBudget::default()).await;
    let (mut s, reply) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert_eq!(reply.status, 200);
    let (mut rd, mut wr) = s.split();
    let send = async {
        wr.write_all(&body).await.unwrap();
        // End of stream right after the last byte: the proxy must send
        // what its pipe still holds before it half-closes upstream.
        wr.shutdown().await.unwrap();
    };
    let mut answer = String::new();
    let (_, read) = tokio::join!(send, rd.read_to_string(&mut answer));
    read.unwrap();
    let expected = (body.len(), sha(&body));
    assert_eq!(sums.recv().await.unwrap(), expected);
    // The answer came back after the client's half-close: down stayed open.
    assert_eq!(answer, format!("{} {}", expected.0, expected.1));
    ended(&h, "allowed", "ok").await;
    assert!(zero_copy(&h, "up") >= 63 * MIB, "spliced only {} bytes up", zero_copy(&h, "up"));
    h.stop().await;
}

#[tokio::test]
async fn a_64_mib_plain_http_response_arrives_intact_spliced_with_its_head_rewritten() {
    let body = data(64 * MIB);
    let up = http_body_upstream(body.clone()).await;
    let (h, token) = proxy_for(config(true), up.port(), JobBudget::default()).await;
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let auth = skill_operator::egress::identity::authorization_value(&token);
    s.write_all(format!("GET http://allowed.test:{}/big HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {auth}\r\n\r\n", up.port()).as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("connection: close\r\n") && !head.contains("keep-alive"), "{head}");
    assert_eq!(read_all(&mut s).await, (body.len(), sha(&body)));
    // The client's end of stream ends the other direction, and the tunnel.
    drop(s);
    ended(&h, "allowed", "ok").await;
    assert!(zero_copy(&h, "down") >= 63 * MIB, "spliced only {} bytes down", zero_copy(&h, "down"));
    h.stop().await;
}

#[tokio::test]
async fn a_unix_socket_client_is_spliced_too() {
    let body = data(16 * MIB);
    let (up, mut after) = sender_upstream(body.clone()).await;
    let h = Harness::start(config(true)).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    h.job_with("run-1", &[&format!("allowed.test:{}", up.port())], None, JobBudget::default());
    let served = h.serve_unix("run-1");
    let path = served.path.clone();
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    s.write_all(format!("CONNECT allowed.test:{} HTTP/1.1\r\n\r\n", up.port()).as_bytes()).await.unwrap();
    assert_eq!(read_reply(&mut s).await.status, 200);
    assert_eq!(read_all(&mut s).await, (body.len(), sha(&body)));
    s.write_all(b"bye").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(after.recv().await.unwrap(), b"bye");
    ended(&h, "allowed", "ok").await;
    assert!(zero_copy(&h, "down") >= 15 * MIB, "spliced only {} bytes down", zero_copy(&h, "down"));
    served.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn the_down_budget_cuts_exactly_at_its_edge_on_the_splice_path() {
    // Not a multiple of any pipe or page size: the cut falls inside a splice.
    let budget = 3 * MIB + 12_345;
    let body = data(8 * MIB);
    let (up, _) = sender_upstream(body.clone()).await;
    let limits = JobBudget { max_bytes_down: Some(budget as u64), ..Default::default() };
    let (h, token) = proxy_for(config(true), up.port(), limits).await;
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    assert_eq!(read_all(&mut s).await, (budget, sha(&body[..budget])));
    ended(&h, "cut", "byte_budget").await;
    assert!(zero_copy(&h, "down") > 2 * MIB, "the cut must happen on the splice path; spliced {}", zero_copy(&h, "down"));
    h.stop().await;
}

#[tokio::test]
async fn the_up_budget_cuts_exactly_at_its_edge_on_the_splice_path() {
    let budget = 3 * MIB + 777;
    let body = data(8 * MIB);
    let (up, mut sums) = sink_upstream().await;
    let limits = JobBudget { max_bytes_up: Some(budget as u64), ..Default::default() };
    let (h, token) = proxy_for(config(true), up.port(), limits).await;
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    // The proxy cuts mid-write: the write may fail, the upstream's count decides.
    let _ = s.write_all(&body).await;
    assert_eq!(sums.recv().await.unwrap(), (budget, sha(&body[..budget])));
    ended(&h, "cut", "byte_budget").await;
    assert!(zero_copy(&h, "up") > 2 * MIB, "the cut must happen on the splice path; spliced {}", zero_copy(&h, "up"));
    h.stop().await;
}

/// 1 MiB to the echo server and back; false when the tunnel is gone.
async fn echo_burst<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, burst: &[u8]) -> bool {
    let (mut rd, mut wr) = tokio::io::split(s);
    let send = wr.write_all(burst);
    let mut back = vec![0u8; burst.len()];
    let recv = rd.read_exact(&mut back);
    let (sent, got) = tokio::join!(send, recv);
    sent.is_ok() && got.is_ok() && back == burst
}

// Real time, not tokio's paused clock: a paused clock jumps to the next
// timer whenever every task waits on a socket, which in a bulk transfer is
// often enough to fire the idle bound in the middle of a burst. The pauses
// between bursts are the traffic pattern under test, not waits for events.
const IDLE: Duration = Duration::from_secs(3);
const GAP: Duration = Duration::from_millis(250);

#[tokio::test]
async fn a_spliced_tunnel_stays_while_bytes_flow_and_is_cut_when_idle() {
    let (up, _) = echo_upstream().await;
    let mut cfg = config(true);
    cfg.limits.idle_timeout = IDLE;
    let (h, token) = proxy_for(cfg, up.port(), JobBudget::default()).await;
    let (mut s, _) = connect(h.addr, &format!("allowed.test:{}", up.port()), Some(&token)).await;
    let burst = data(MIB);
    // Twice the idle bound of bursts: only bytes moved by splice keep it
    // alive past the bound (the copy phase ends within the first burst).
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < 2 * IDLE {
        if i > 0 {
            tokio::time::sleep(GAP).await;
        }
        assert!(echo_burst(&mut s, &burst).await, "burst {i} failed at {:?}", start.elapsed());
        i += 1;
    }
    let last = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(10 * IDLE, s.read_to_end(&mut rest)).await.expect("the idle tunnel must be cut").unwrap();
    let idle = last.elapsed();
    // The proxy's clock starts at its own last send (before this read),
    // counted in whole milliseconds: it may fire a hair before ours.
    let early = Duration::from_millis(50);
    assert!(idle + early >= IDLE && idle < IDLE + Duration::from_secs(3), "{idle:?}");
    ended(&h, "cut", "idle_timeout").await;
    assert!(zero_copy(&h, "up") > 5 * MIB && zero_copy(&h, "down") > 5 * MIB, "the bursts must be spliced");
    h.stop().await;
}

#[tokio::test]
async fn a_spliced_tunnel_is_cut_at_its_lifetime_and_at_shutdown() {
    let (up, _) = echo_upstream().await;
    let mut cfg = config(true);
    cfg.limits.idle_timeout = IDLE;
    cfg.limits.tunnel_lifetime = 2 * IDLE;
    let (h, token) = proxy_for(cfg, up.port(), JobBudget::default()).await;
    let authority = format!("allowed.test:{}", up.port());
    let burst = data(MIB);
    let (mut s, _) = connect(h.addr, &authority, Some(&token)).await;
    let start = Instant::now();
    while echo_burst(&mut s, &burst).await {
        assert!(start.elapsed() < 10 * IDLE, "the lifetime never fired");
        tokio::time::sleep(GAP).await;
    }
    let lived = start.elapsed();
    assert!(lived >= 2 * IDLE && lived < 2 * IDLE + Duration::from_secs(3), "{lived:?}");
    ended(&h, "cut", "lifetime").await;
    assert!(zero_copy(&h, "up") > 3 * MIB, "the bursts must be spliced");

    // A second tunnel, spliced, then the proxy stops: cut after the grace.
    let (mut s, _) = connect(h.addr, &authority, Some(&token)).await;
    assert!(echo_burst(&mut s, &burst).await && echo_burst(&mut s, &burst).await);
    let metrics = h.proxy.metrics().clone();
    let stopping = tokio::spawn(h.stop());
    let mut rest = Vec::new();
    tokio::time::timeout(10 * IDLE, s.read_to_end(&mut rest)).await.expect("cut at shutdown").unwrap();
    stopping.await.unwrap();
    assert_eq!(metrics.requests_with("cut", "shutting_down"), 1);
}
