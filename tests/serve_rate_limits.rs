//! Rate limits per principal through the real `serve --http` binary: two
//! tokens, two principals. Alice spends her call budget and is answered a
//! JSON-RPC error (-32029, data.retryAfterSeconds); her refused confirmed
//! `skill_run` creates no job; Bob's budget is untouched; `/metrics`
//! counts the refusal.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");
const ALICE: &str = "alice-rate-token-0123456789abcdef";
const BOB: &str = "bob-rate-token-0123456789abcdef00";
const BURST: usize = 5;

struct Server {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
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
    // One call a minute after the burst: nothing refills during the test.
    let mut child = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--confirm", "ask"])
        .args(["--rate-calls-per-minute", "1", "--rate-burst-calls", &BURST.to_string()])
        .arg("--skills")
        .arg(dir.path().join("skills"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--http-token-file")
        .arg(&tokens)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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
    Server { child, url, dir }
}

struct Client {
    http: reqwest::Client,
    url: String,
    token: &'static str,
    session: String,
    next: u64,
}

impl Client {
    async fn post(&self, body: &Value) -> reqwest::Response {
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

    async fn connect(url: &str, token: &'static str) -> Client {
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
    async fn call(&mut self, name: &str, arguments: Value) -> Value {
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

fn job_dirs(server: &Server) -> usize {
    std::fs::read_dir(server.dir.path().join("data/jobs")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_over_its_call_limit_is_refused_and_another_is_not() {
    let server = start();
    let mut alice = Client::connect(&server.url, ALICE).await;
    let mut bob = Client::connect(&server.url, BOB).await;
    let run = json!({"skill":"tool","script":"scripts/a.sh","args":[]});

    // The burst: a preview (a call, not a run) and reads.
    let preview = alice.call("skill_run", run.clone()).await;
    let token = preview["result"]["structuredContent"]["token"].as_str().unwrap_or_else(|| panic!("{preview}")).to_string();
    for _ in 1..BURST {
        let listed = alice.call("skill_job_list", json!({})).await;
        assert_eq!(listed["result"]["structuredContent"]["jobs"], json!([]), "{listed}");
    }
    // Over it: the confirmed run is refused before anything is created.
    let mut confirmed = run.clone();
    confirmed["confirm"] = json!(token);
    let refused = alice.call("skill_run", confirmed).await;
    let error = &refused["error"];
    assert_eq!(error["code"], -32029, "{refused}");
    assert_eq!(error["data"]["status"], 429);
    assert_eq!(error["data"]["limit"], "calls");
    assert_eq!(error["data"]["principal"], "alice");
    let retry = error["data"]["retryAfterSeconds"].as_u64().unwrap();
    assert!((1..=60).contains(&retry), "{refused}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(&format!("retry after {retry} s")) && message.contains("1 calls per minute for principal alice"), "{message}");
    assert!(refused.get("result").is_none());
    assert_eq!(job_dirs(&server), 0, "a refused skill_run creates no job");
    // Every further call of hers is refused too, reads included.
    assert_eq!(alice.call("skill_list", json!({})).await["error"]["code"], -32029);

    // Bob's budget is his own.
    for _ in 0..BURST {
        let listed = bob.call("skill_job_list", json!({})).await;
        assert_eq!(listed["result"]["structuredContent"]["jobs"], json!([]), "{listed}");
    }
    assert_eq!(bob.call("skill_list", json!({})).await["error"]["data"]["principal"], "bob");

    let metrics_url = server.url.replace("/mcp", "/metrics");
    let metrics = alice.http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("skill_operator_serve_rate_limited_total{limit=\"calls\"} 3"), "{metrics}");
}
