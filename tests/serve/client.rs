//! A `serve --http` process of the real binary over a small skills tree
//! (one bash script), two bearer tokens (alice, bob), and a bare MCP client
//! over streamable HTTP (2025-11-25 sessions) that reads JSON-RPC answers
//! from JSON bodies and SSE streams alike.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");
pub(crate) const ALICE: &str = "alice-rate-token-0123456789abcdef";
pub(crate) const BOB: &str = "bob-rate-token-0123456789abcdef00";

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) dir: tempfile::TempDir,
    /// The server's stdout, when the caller asked to keep it.
    pub(crate) stdout: Option<std::process::ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve --http` with `extra` flags; `keep_stdout` pipes stdout for the caller to read.
pub(crate) fn start(extra: &[&str], keep_stdout: bool) -> Server {
    start_with_env(extra, keep_stdout, &[])
}

/// [`start`] with `env` set for the server.
pub(crate) fn start_with_env(extra: &[&str], keep_stdout: bool, env: &[(&str, &str)]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("alice {ALICE}\nbob {BOB}\n")).unwrap();
    let skill = dir.path().join("skills/tool");
    std::fs::create_dir_all(skill.join("scripts")).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: tool\ndescription: d\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/a.sh\n      interpreter: bash\n---\nbody\n",
    )
    .unwrap();
    std::fs::write(skill.join("scripts/a.sh"), "echo ran\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--confirm", "ask"])
        .args(extra)
        .arg("--skills")
        .arg(dir.path().join("skills"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--http-token-file")
        .arg(&tokens)
        .stdin(Stdio::null())
        .stdout(if keep_stdout { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::piped())
        .envs(env.iter().copied())
        .spawn()
        .unwrap();
    let url = listening_url(&mut child);
    let stdout = child.stdout.take();
    Server { child, url, dir, stdout }
}

/// The URL a `serve --http` child prints once it listens (from its piped
/// stderr, which is drained afterwards so the server never blocks on it).
pub(crate) fn listening_url(child: &mut Child) -> String {
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let url = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the server exited before listening");
        if let Some(url) = line.trim().strip_prefix("skill-operator: listening on ") {
            break url.to_string();
        }
    };
    std::thread::spawn(move || for _ in stderr.lines() {});
    url
}

pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
    url: String,
    token: &'static str,
    session: String,
    next: u64,
}

impl Client {
    pub(crate) async fn post(&self, body: &Value) -> reqwest::Response {
        let mut r = self
            .http
            .post(&self.url)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if !self.session.is_empty() {
            r = r.header("mcp-session-id", &self.session).header("mcp-protocol-version", "2025-11-25");
        }
        r.body(body.to_string()).send().await.unwrap()
    }

    pub(crate) async fn connect(url: &str, token: &'static str) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut c = Client { http: reqwest::Client::new(), url: url.to_string(), token, session: String::new(), next: 1 };
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"rate","version":"1"}}});
        let r = c.post(&init).await;
        assert_eq!(r.status(), 200);
        c.session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
        let _ = r.bytes().await;
        let r = c.post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"})).await;
        assert!(r.status().is_success(), "{}", r.status());
        c
    }

    /// One tools/call: the JSON-RPC response (from a JSON body or an SSE stream).
    pub(crate) async fn call(&mut self, name: &str, arguments: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let r = self.post(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":arguments}})).await;
        assert_eq!(r.status(), 200, "the refusal is a JSON-RPC error, not an HTTP one");
        let text = r.text().await.unwrap();
        let messages = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).chain(std::iter::once(text.trim()));
        messages
            .filter_map(|m| serde_json::from_str::<Value>(m).ok())
            .find(|m| m["id"] == json!(id))
            .unwrap_or_else(|| panic!("no response to {id} in {text}"))
    }
}
