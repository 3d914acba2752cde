//! Egress proxy benchmark, on loopback, in one run (`cargo bench --bench
//! egress_proxy`):
//! - throughput (MB/s) through a CONNECT tunnel and through plain-HTTP
//!   forwarding, against a direct connection to the same upstream, and the
//!   same through a second proxy started with `--no-zero-copy` (every byte
//!   copied through user space, the path before splice(2)) as the baseline
//!   measured in the same run;
//! - added latency per new connection (median, p99 over 1,000 connections
//!   each), CONNECT and plain HTTP against direct;
//! - memory per idle tunnel: RSS delta of the proxy process over 1,000 idle
//!   tunnels.
//!
//! The proxy runs as its own process (this package's release binary,
//! `skill-operator egress-proxy`, with its access log on at info level and
//! drained), so its RSS is its own; the upstreams and clients run here.
//! The proxy resolves `localhost` with the system resolver on every request
//! (as in production; /etc/hosts here). Goals from the issue: ≤ 1 ms added
//! p50 per connection, ≥ 80% of direct throughput, ≤ 20 KiB per idle tunnel.
//! Env: EGRESS_BENCH_MIB (transfer size, default 512), EGRESS_BENCH_CONNS
//! (default 1000), EGRESS_BENCH_IDLE (default 1000).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use skill_operator::egress::identity::authorization_value;
use skill_operator::egress::{proxy_token, JobId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Raw source: after one byte from the client, send `n` bytes and close.
async fn source_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut req = [0u8; 16];
                let Ok(k) = s.read(&mut req).await else { return };
                let n: usize = std::str::from_utf8(&req[..k]).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
                let chunk = vec![b's'; 256 * 1024];
                let mut left = n;
                while left > 0 {
                    let m = left.min(chunk.len());
                    if s.write_all(&chunk[..m]).await.is_err() {
                        return;
                    }
                    left -= m;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// HTTP/1.1, one request per connection: `/big/<n>` or a tiny body.
async fn http_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut buf = Vec::new();
                let mut chunk = [0u8; 2048];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                let path = head.split(' ').nth(1).unwrap_or("/");
                let n: usize = path.strip_prefix("/big/").and_then(|n| n.parse().ok()).unwrap_or(2);
                let _ = s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n").as_bytes()).await;
                let body = vec![b'h'; 256 * 1024];
                let mut left = n;
                while left > 0 {
                    let m = left.min(body.len());
                    if s.write_all(&body[..m]).await.is_err() {
                        return;
                    }
                    left -= m;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// Echo one read, then hold the connection until the client closes.
async fn hold_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while let Ok(k) = s.read(&mut b).await {
                    if k == 0 || s.write_all(&b[..k]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

struct ProxyProcess {
    child: Child,
    addr: SocketAddr,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_proxy(dir: &std::path::Path, ports: &[u16], extra: &[&str]) -> ProxyProcess {
    let key = [9u8; 32];
    std::fs::write(dir.join("key"), key).unwrap();
    let allow: Vec<String> = ports.iter().map(|p| format!("\"localhost:{p}\"")).collect();
    std::fs::write(
        dir.join("jobs.json"),
        format!(
            r#"{{"jobs": [{{"namespace": "bench", "uid": "b1", "source": "127.0.0.1", "allow": [{}],
                "limits": {{"max_connections": 100000, "max_bytes_up": 1125899906842624, "max_bytes_down": 1125899906842624}}}}]}}"#,
            allow.join(", ")
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_skill-operator"))
        .args(["egress-proxy", "--listen", "127.0.0.1:0", "--allow-cidr", "127.0.0.0/8", "--max-tunnels", "20000", "--max-pending", "4096"])
        .args(extra)
        .arg("--token-key-file")
        .arg(dir.join("key"))
        .arg("--jobs")
        .arg(dir.join("jobs.json"))
        .env("SKILL_OPERATOR_LOG", "skill_operator::egress=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the skill-operator binary");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the proxy exited before listening").unwrap();
        if let Some(rest) = line.strip_prefix("skill-operator: egress proxy on ") {
            break rest.split(' ').next().unwrap().parse().unwrap();
        }
    };
    // Keep draining the access log so the proxy never blocks on its stderr.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    ProxyProcess { child, addr }
}

/// CPU seconds (user + system) the process has used.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / tick
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap()
}

async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.unwrap() == 0 {
            panic!("closed before the head: {}", String::from_utf8_lossy(&head));
        }
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Open a CONNECT tunnel to `localhost:port`.
async fn tunnel(proxy: SocketAddr, port: u16, auth: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

async fn drain(s: &mut TcpStream) -> usize {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return total,
            Ok(k) => total += k,
        }
    }
}

#[derive(Clone, Copy)]
enum Path {
    Direct,
    /// Direct HTTP from the same server, for the plain-HTTP ratio.
    DirectHttp,
    Connect,
    Http,
}

/// MB/s for one transfer of `bytes`.
async fn transfer(path: Path, proxy: SocketAddr, source: SocketAddr, http: SocketAddr, bytes: usize, auth: &str) -> f64 {
    let start = Instant::now();
    let got = match path {
        Path::Direct => {
            let mut s = TcpStream::connect(source).await.unwrap();
            s.write_all(format!("{bytes}\n").as_bytes()).await.unwrap();
            drain(&mut s).await
        }
        Path::DirectHttp => {
            let mut s = TcpStream::connect(http).await.unwrap();
            s.write_all(format!("GET /big/{bytes} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes()).await.unwrap();
            let head = read_head(&mut s).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            drain(&mut s).await
        }
        Path::Connect => {
            let mut s = tunnel(proxy, source.port(), auth).await;
            s.write_all(format!("{bytes}\n").as_bytes()).await.unwrap();
            drain(&mut s).await
        }
        Path::Http => {
            let mut s = TcpStream::connect(proxy).await.unwrap();
            s.write_all(
                format!("GET http://localhost:{}/big/{bytes} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {auth}\r\n\r\n", http.port())
                    .as_bytes(),
            )
            .await
            .unwrap();
            let head = read_head(&mut s).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            drain(&mut s).await
        }
    };
    assert_eq!(got, bytes, "short transfer");
    bytes as f64 / 1e6 / start.elapsed().as_secs_f64()
}

/// Microseconds for one new connection and a tiny request/response.
async fn one_request(path: Path, proxy: SocketAddr, http: SocketAddr, auth: &str) -> f64 {
    let start = Instant::now();
    let mut s = match path {
        Path::Direct | Path::DirectHttp => {
            let mut s = TcpStream::connect(http).await.unwrap();
            s.set_nodelay(true).unwrap();
            s.write_all(b"GET /small HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
            s
        }
        Path::Connect => {
            let mut s = tunnel(proxy, http.port(), auth).await;
            s.write_all(b"GET /small HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
            s
        }
        Path::Http => {
            let mut s = TcpStream::connect(proxy).await.unwrap();
            s.set_nodelay(true).unwrap();
            s.write_all(
                format!("GET http://localhost:{}/small HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {auth}\r\n\r\n", http.port()).as_bytes(),
            )
            .await
            .unwrap();
            s
        }
    };
    let n = drain(&mut s).await;
    assert!(n > 0);
    start.elapsed().as_secs_f64() * 1e6
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64) * 0.99) as usize - 1]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(bench());
}

async fn bench() {
    // `cargo test --all-targets` runs this without --bench: one small pass then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let mib = env_usize("EGRESS_BENCH_MIB", if quick { 16 } else { 512 });
    let conns = env_usize("EGRESS_BENCH_CONNS", if quick { 50 } else { 1000 });
    let idle = env_usize("EGRESS_BENCH_IDLE", if quick { 50 } else { 1000 });
    let bytes = mib << 20;
    let rounds = if quick { 1 } else { 5 };

    let source = source_server().await;
    let http = http_server().await;
    let hold = hold_server().await;
    let dir = tempfile::tempdir().unwrap();
    let ports = [source.port(), http.port(), hold.port()];
    let proxy = start_proxy(dir.path(), &ports, &[]);
    let copy_dir = tempfile::tempdir().unwrap();
    let copying = start_proxy(copy_dir.path(), &ports, &["--no-zero-copy"]);
    let auth = authorization_value(&proxy_token(&[9u8; 32], &JobId::new("bench", "b1")));
    let (p, pc) = (proxy.addr, copying.addr);
    println!(
        "egress proxy benchmark: proxy pid {} on {p} (copying: pid {} on {pc}); {rounds} rounds of {mib} MiB; {conns} connections; {idle} idle tunnels",
        proxy.child.id(),
        copying.child.id()
    );

    // Throughput, interleaved so drift hits all paths alike.
    let (mut direct, mut connect, mut forward) = (Vec::new(), Vec::new(), Vec::new());
    let (mut connect_copy, mut forward_copy) = (Vec::new(), Vec::new());
    transfer(Path::Connect, p, source, http, 16 << 20, &auth).await; // warm-up
    transfer(Path::Connect, pc, source, http, 16 << 20, &auth).await;
    let (pid, pid_copy) = (proxy.child.id(), copying.child.id());
    let (mut proxy_cpu, mut copy_cpu) = (0.0, 0.0);
    // This process runs the client and the server: its CPU per byte, direct
    // and through the proxy, shows what the extra hop costs on 2 cores.
    let me = std::process::id();
    let (mut ends_direct, mut ends_connect) = (0.0, 0.0);
    let mut direct_http = Vec::new();
    for _ in 0..rounds {
        let mine = cpu_secs(me);
        direct.push(transfer(Path::Direct, p, source, http, bytes, &auth).await);
        ends_direct += cpu_secs(me) - mine;
        direct_http.push(transfer(Path::DirectHttp, p, source, http, bytes, &auth).await);
        let (cpu, mine) = (cpu_secs(pid), cpu_secs(me));
        connect.push(transfer(Path::Connect, p, source, http, bytes, &auth).await);
        proxy_cpu += cpu_secs(pid) - cpu;
        ends_connect += cpu_secs(me) - mine;
        let cpu = cpu_secs(pid_copy);
        connect_copy.push(transfer(Path::Connect, pc, source, http, bytes, &auth).await);
        copy_cpu += cpu_secs(pid_copy) - cpu;
        forward.push(transfer(Path::Http, p, source, http, bytes, &auth).await);
        forward_copy.push(transfer(Path::Http, pc, source, http, bytes, &auth).await);
    }
    drop(copying);
    let gib = (rounds * bytes) as f64 / (1u64 << 30) as f64;
    let (cpu_per_gib, copy_cpu_per_gib) = (proxy_cpu / gib, copy_cpu / gib);
    let (ends_direct, ends_connect) = (ends_direct / gib, ends_connect / gib);
    let (d, c, dh, f) = (median(&mut direct), median(&mut connect), median(&mut direct_http), median(&mut forward));
    let (cc, fc) = (median(&mut connect_copy), median(&mut forward_copy));

    // Latency per new connection.
    for _ in 0..50 {
        one_request(Path::Connect, p, http, &auth).await;
        one_request(Path::Http, p, http, &auth).await;
    }
    let (mut ld, mut lc, mut lh) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..conns {
        ld.push(one_request(Path::Direct, p, http, &auth).await);
        lc.push(one_request(Path::Connect, p, http, &auth).await);
        lh.push(one_request(Path::Http, p, http, &auth).await);
    }
    let (ld50, lc50, lh50) = (median(&mut ld), median(&mut lc), median(&mut lh));
    let (ld99, lc99, lh99) = (p99(&mut ld), p99(&mut lc), p99(&mut lh));

    // Memory per idle tunnel.
    let mut warm = Vec::new();
    for _ in 0..100 {
        let mut s = tunnel(p, hold.port(), &auth).await;
        s.write_all(b"w").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        warm.push(s);
    }
    drop(warm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let mut open = Vec::with_capacity(idle);
    for _ in 0..idle {
        let mut s = tunnel(p, hold.port(), &auth).await;
        s.write_all(b"i").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        open.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    let per_tunnel = (after.saturating_sub(before)) as f64 / idle as f64;
    drop(open);

    println!();
    println!("| measure | direct | through the proxy | ratio / added | goal |");
    println!("|---|---:|---:|---:|---|");
    println!("| CONNECT throughput, MB/s (median of {rounds} × {mib} MiB) | {d:.0} | {c:.0} | {:.0}% | ≥ 80% |", 100.0 * c / d);
    println!("| plain-HTTP throughput, MB/s (median of {rounds} × {mib} MiB) | {dh:.0} | {f:.0} | {:.0}% | ≥ 80% |", 100.0 * f / dh);
    println!("| CONNECT throughput, copying (--no-zero-copy), MB/s | {d:.0} | {cc:.0} | {:.0}% | |", 100.0 * cc / d);
    println!("| plain-HTTP throughput, copying (--no-zero-copy), MB/s | {dh:.0} | {fc:.0} | {:.0}% | |", 100.0 * fc / dh);
    println!("| new connection + tiny request, CONNECT, µs p50 | {ld50:.0} | {lc50:.0} | +{:.0} µs | ≤ +1000 µs |", lc50 - ld50);
    println!("| new connection + tiny request, CONNECT, µs p99 | {ld99:.0} | {lc99:.0} | +{:.0} µs | |", lc99 - ld99);
    println!("| new connection + tiny request, plain HTTP, µs p50 | {ld50:.0} | {lh50:.0} | +{:.0} µs | ≤ +1000 µs |", lh50 - ld50);
    println!("| new connection + tiny request, plain HTTP, µs p99 | {ld99:.0} | {lh99:.0} | +{:.0} µs | |", lh99 - ld99);
    println!("| proxy CPU per GiB through CONNECT, s (user + system) | | {cpu_per_gib:.2} | | |");
    println!("| proxy CPU per GiB through CONNECT, copying, s (user + system) | | {copy_cpu_per_gib:.2} | | |");
    // The quick pass moves too little for the clock ticks /proc counts in.
    let ends_ratio =
        if ends_direct > 0.0 { format!("{:.2}× direct", (ends_connect + cpu_per_gib) / ends_direct) } else { "-".to_string() };
    println!("| client + server CPU per GiB (this process), CONNECT, s | {ends_direct:.2} | {ends_connect:.2} + proxy {cpu_per_gib:.2} | {ends_ratio} | |");
    println!("| proxy RSS for {idle} idle tunnels, KiB | | {before} → {after} | {per_tunnel:.1} KiB/tunnel | ≤ 20 KiB |");
    println!();
    let goals = [
        ("CONNECT throughput ≥ 80% of direct", c / d >= 0.8),
        ("plain-HTTP throughput ≥ 80% of direct", f / dh >= 0.8),
        ("added p50 ≤ 1 ms (CONNECT)", lc50 - ld50 <= 1000.0),
        ("added p50 ≤ 1 ms (plain HTTP)", lh50 - ld50 <= 1000.0),
        ("≤ 20 KiB per idle tunnel", per_tunnel <= 20.0),
    ];
    for (goal, met) in goals {
        println!("{} {goal}", if met { "met:    " } else { "NOT MET:" });
    }
}
