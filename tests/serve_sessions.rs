//! Issue 9, class 6: HTTP sessions are bounded.
//!
//! Before, 10,000 `initialize` calls from loopback took the server from 13
//! to 566 MiB (a session each, kept for its 300 s idle timeout). Now at
//! most `--max-sessions` are held: a new one closes the oldest idle one,
//! and when every session is busy (a request or stream open on it) the
//! new one is refused with an error that says so. The real binary is
//! started on loopback and its own VmRSS is read from /proc.

#[path = "serve/client.rs"]
mod client;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");
const TOKEN: &str = "sessions-test-token-0123456789abcdef";
const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}"#;

struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(max_sessions: usize) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("flood {TOKEN}\n")).unwrap();
    std::fs::create_dir(dir.path().join("skills")).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--read-only", "--http", "127.0.0.1:0", "--max-sessions", &max_sessions.to_string()])
        .arg("--skills")
        .arg(dir.path().join("skills"))
        .arg("--http-token-file")
        .arg(&tokens)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = client::listening_url(&mut child);
    Server { child, url, _dir: dir }
}

fn http_client() -> reqwest::Client {
    // reqwest is built without a TLS provider of its own; plain HTTP here, but it still asks.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()).unwrap()
}

async fn initialize(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client
        .post(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(INIT)
        .send()
        .await
        .unwrap()
}

/// An initialized session: its id.
async fn session(client: &reqwest::Client, url: &str) -> String {
    let r = initialize(client, url).await;
    assert_eq!(r.status(), 200);
    let id = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let _ = r.bytes().await;
    let r = client
        .post(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-11-25")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    id
}

async fn ping(client: &reqwest::Client, url: &str, id: &str) -> reqwest::StatusCode {
    client
        .post(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("mcp-session-id", id)
        .header("mcp-protocol-version", "2025-11-25")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_initialize_calls_keep_memory_bounded() {
    let server = start(skill_operator::core::limits::HTTP_SESSIONS_MAX);
    let client = http_client();
    let url = server.url.clone();
    for _ in 0..300 {
        let _ = initialize(&client, &url).await.bytes().await;
    }
    let before = rss_kib(server.child.id());
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5_000 {
                let r = initialize(&client, &url).await;
                assert_eq!(r.status(), 200, "an idle session makes room for each new one");
                let _ = r.bytes().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let after = rss_kib(server.child.id());
    println!("VmRSS after 300 sessions {before} KiB, after 10,000 more {after} KiB");
    // Unbounded, 10,000 sessions cost about 550 MiB here.
    assert!(after < before + 48 * 1024, "RSS grew from {before} KiB to {after} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_idle_session_goes_and_a_full_house_says_so() {
    let server = start(3);
    let client = http_client();
    let url = server.url.clone();
    let first = session(&client, &url).await;
    let second = session(&client, &url).await;
    let third = session(&client, &url).await;
    assert_eq!(ping(&client, &url, &first).await, 200);
    // `second` is now the oldest idle session: a fourth one replaces it.
    let fourth = session(&client, &url).await;
    assert_eq!(ping(&client, &url, &second).await, 404, "the oldest idle session was closed");
    for id in [&first, &third, &fourth] {
        assert_eq!(ping(&client, &url, id).await, 200);
    }
    // Hold a stream open on each: none is idle, so a new session is refused, clearly.
    let mut streams = Vec::new();
    for id in [&first, &third, &fourth] {
        let r = client
            .get(&url)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("mcp-session-id", id.as_str())
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let r = initialize(&client, &url).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body = r.text().await.unwrap();
    assert!(body.contains("maximum of 3 MCP sessions") && body.contains("every one is in use"), "{body}");
    // Closing one stream makes its session idle again: room for a new one.
    drop(streams.remove(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = initialize(&client, &url).await;
        if r.status() == 200 {
            break;
        }
        // The server notices the closed stream when its connection goes: wait for that event, bounded.
        assert!(tokio::time::Instant::now() < deadline, "the closed stream never freed its session: {}", r.status());
        tokio::task::yield_now().await;
    }
}
