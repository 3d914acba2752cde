//! Start-up and listing benchmark: spawn -> MCP handshake -> full
//! `skill_list` reply over stdio, for 20 and 2,000 generated skills (4 files
//! each), plus HTTP `skill_list` throughput and latency on loopback.
//!
//! Run: `cargo bench --bench stdio_listing` (prints medians; RSS is the
//! server's own VmHWM read from /proc just before it is closed).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

fn corpus(root: &Path, skills: usize) {
    for i in 0..skills {
        let dir = root.join(format!("skill-{i:04}"));
        std::fs::create_dir_all(dir.join("scripts")).unwrap();
        std::fs::create_dir_all(dir.join("references")).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: skill-{i:04}\ndescription: Generated skill number {i} for the listing benchmark.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/run.py\n      interpreter: python\n---\n# Skill {i}\n\nRun scripts/run.py.\n"),
        )
        .unwrap();
        std::fs::write(dir.join("scripts/run.py"), "print('hi')\n").unwrap();
        std::fs::write(dir.join("references/guide.md"), "# Guide\n".repeat(20)).unwrap();
        std::fs::write(dir.join("references/api.md"), "# API\n".repeat(20)).unwrap();
    }
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .unwrap_or(0)
}

/// One stdio run: returns (time to the skill_list reply, server peak RSS KiB, reply bytes).
fn stdio_once(root: &Path) -> (Duration, u64, usize) {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .args(["serve", "--skills"])
        .arg(root)
        .env_remove("MCP_SKILL_RUN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn skill-operator");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let messages = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"skill_list","arguments":{}}}"#,
    ];
    for m in messages {
        writeln!(stdin, "{m}").unwrap();
    }
    stdin.flush().unwrap();
    let mut line = String::new();
    let elapsed = loop {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            panic!("server closed stdout before replying");
        }
        if line.starts_with(r#"{"jsonrpc":"2.0","id":2"#) {
            break start.elapsed();
        }
    };
    let rss = vm_hwm_kib(child.id());
    drop(stdin);
    let _ = child.wait();
    (elapsed, rss, line.len())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// The binary's bare process start: spawn `--version` and wait for its exit.
fn version_once() -> Duration {
    let start = Instant::now();
    let status = Command::new(BIN).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().expect("spawn skill-operator");
    assert!(status.success());
    start.elapsed()
}

/// The 2.5x goal: spawn -> 20-skill skill_list of the default `serve` (run
/// tools, job store, sandbox probe in the background) against `--version`,
/// interleaved in one run so drift hits both alike.
fn startup_ratio(runs: usize) {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), 20);
    version_once();
    stdio_once(dir.path());
    let (mut bare, mut listed) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        bare.push(version_once().as_secs_f64() * 1000.0);
        listed.push(stdio_once(dir.path()).0.as_secs_f64() * 1000.0);
    }
    let (b, l) = (median(bare), median(listed));
    let verdict = if l <= 2.5 * b { "met" } else { "NOT met" };
    println!("start-up: --version median {b:.1} ms; default serve spawn->20-skill skill_list median {l:.1} ms; ratio {:.2}x (goal <= 2.5x: {verdict}), {runs} runs", l / b);
}

fn stdio_case(label: &str, skills: usize, runs: usize) {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), skills);
    stdio_once(dir.path()); // warm the page cache
    let mut times = Vec::new();
    let mut rss = Vec::new();
    let mut bytes = 0;
    for _ in 0..runs {
        let (t, r, b) = stdio_once(dir.path());
        times.push(t.as_secs_f64() * 1000.0);
        rss.push(r as f64 / 1024.0);
        bytes = b;
    }
    println!(
        "stdio {label:>12}: spawn->skill_list reply median {:.1} ms (p90 {:.1} ms), server VmHWM median {:.1} MiB, reply {} KiB, {runs} runs",
        median(times.clone()),
        percentile(times, 0.9),
        median(rss),
        bytes / 1024
    );
}

/// POST one JSON-RPC message; returns the raw response (headers + body) read to EOF.
fn post(addr: &str, session: Option<&str>, body: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let session = session.map(|s| format!("Mcp-Session-Id: {s}\r\n")).unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n{session}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    out
}

fn http_case(skills: usize, requests_per_client: usize, clients: usize) {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), skills);
    let mut child = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--http-no-auth", "--skills"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        stderr.read_line(&mut line).unwrap();
        if let Some(rest) = line.trim().strip_prefix("skill-operator: listening on http://") {
            break rest.trim_end_matches("/mcp").to_string();
        }
    };
    let init = post(
        &addr,
        None,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#,
    );
    let session = init
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: ").or_else(|| l.strip_prefix("Mcp-Session-Id: ")))
        .expect("session id")
        .trim()
        .to_string();
    post(&addr, Some(&session), r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let addr = addr.clone();
            let session = session.clone();
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(requests_per_client);
                for i in 0..requests_per_client {
                    let body = format!(
                        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"skill_list","arguments":{{}}}}}}"#,
                        10 + c * 100_000 + i
                    );
                    let t = Instant::now();
                    let resp = post(&addr, Some(&session), &body);
                    assert!(resp.contains("\"result\""), "{resp}");
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                lat
            })
        })
        .collect();
    let lat: Vec<f64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let total = start.elapsed().as_secs_f64();
    let rss = vm_hwm_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "http  {skills:>5} skills: {} skill_list calls from {clients} clients, {:.0} req/s, latency median {:.2} ms p99 {:.2} ms, server VmHWM {:.1} MiB",
        lat.len(),
        lat.len() as f64 / total,
        median(lat.clone()),
        percentile(lat, 0.99),
        rss as f64 / 1024.0
    );
}

fn main() {
    // `cargo test --benches` runs this with --bench absent: keep it quick then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (small_runs, big_runs, http_requests) = if quick { (3, 1, 20) } else { (30, 10, 1000) };
    startup_ratio(small_runs);
    stdio_case("empty", 0, small_runs);
    stdio_case("20 skills", 20, small_runs);
    stdio_case("2000 skills", 2000, big_runs);
    http_case(20, http_requests, 2);
}
