//! The audit trail of the real `serve --http` binary, read back from its
//! stdout and from `--audit-file`: every tool call (answered, refused,
//! rate limited), the run's preview, start and verdict, and a refused
//! bearer token, each one JSON line of schema v1 naming the principal;
//! arguments and inputs by digest only, never their values.

#[path = "serve/client.rs"]
mod client;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;

use client::{Client, ALICE, BOB};
use serde_json::{json, Value};

const SECRET: &str = "s3cr3t-argument-value";

fn lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON record ({e}): {l}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_and_the_run_it_starts_are_in_the_trail_by_digest() {
    let file = tempfile::tempdir().unwrap();
    let path = file.path().join("audit.jsonl");
    let path_arg = path.to_str().unwrap().to_string();
    // Four calls each, then one a minute: Bob's fifth is rate limited.
    let mut server = client::start(&["--audit-file", &path_arg, "--rate-calls-per-minute", "1", "--rate-burst-calls", "4"], true);
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });

    let mut alice = Client::connect(&server.url, ALICE).await;
    let run = json!({"skill":"tool","script":"scripts/a.sh","args":[SECRET],"inputs":[{"path":"in.txt","content":"hello"}]});
    let preview = alice.call("skill_run", run.clone()).await;
    let token = preview["result"]["structuredContent"]["token"].as_str().unwrap_or_else(|| panic!("{preview}")).to_string();
    let mut confirmed = run.clone();
    confirmed["confirm"] = json!(token);
    let done = alice.call("skill_run", confirmed).await;
    assert_eq!(done["result"]["structuredContent"]["state"], "succeeded", "{done}");
    let job = done["result"]["structuredContent"]["job"].as_str().unwrap().to_string();
    // A refusal by the fence: a script the skill does not declare.
    let refused = alice.call("skill_run", json!({"skill":"tool","script":"scripts/../../../etc/passwd"})).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");

    let mut bob = Client::connect(&server.url, BOB).await;
    for _ in 0..4 {
        assert!(bob.call("skill_list", json!({})).await.get("result").is_some());
    }
    assert_eq!(bob.call("skill_list", json!({})).await["error"]["code"], -32029);

    let wrong = alice.http.post(&server.url).header("authorization", "Bearer not-a-token-of-this-server").body("{}").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    // Refused before any tool saw them, each one record naming the caller:
    // a malformed message, a wrong media type, a batch, a Host refused.
    let raw = |content_type: &'static str, body: &'static str| {
        alice
            .http
            .post(&server.url)
            .header("authorization", format!("Bearer {ALICE}"))
            .header("content-type", content_type)
            .header("accept", "application/json, text/event-stream")
            .body(body)
    };
    let refusals = [
        raw("application/json", r#"{"jsonrpc":"#),
        raw("text/plain", "x"),
        raw("application/json", r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]"#),
        raw("application/json", "{}").header("host", "evil.example"),
    ];
    let mut statuses = Vec::new();
    for request in refusals {
        statuses.push(request.send().await.unwrap().status().as_u16());
    }
    assert!(statuses.iter().all(|s| *s >= 400), "each is refused: {statuses:?}");

    // Records are written before the answer leaves: the file is complete now.
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!text.contains(SECRET) && !text.contains("hello"), "values never reach the trail:\n{text}");
    let records = lines(&text);
    let seen: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
            (s("event"), s("outcome"), r["principal"]["name"].as_str().unwrap_or("-").to_string())
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("run.preview", "confirmation-required", "alice"),
        ("tool.call", "confirmation-required", "alice"),
        ("run.start", "ok", "alice"),
        ("run.verdict", "ok", "alice"),
        ("tool.call", "ok", "alice"),
        ("tool.call", "refused", "alice"),
        ("tool.call", "ok", "bob"),
        ("tool.call", "ok", "bob"),
        ("tool.call", "ok", "bob"),
        ("tool.call", "ok", "bob"),
        ("tool.call", "rate-limited", "bob"),
        ("auth.refused", "refused", "-"),
        ("request.refused", "refused", "alice"),
        ("request.refused", "refused", "alice"),
        ("request.refused", "refused", "alice"),
        ("request.refused", "refused", "alice"),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(seen, expected, "{text}");
    for r in &records {
        assert_eq!(r["schema"], "skill-operator.audit/v1");
        assert_eq!(r["source"], "serve");
    }
    let digest = records[0]["argsDigest"].as_str().unwrap();
    assert_eq!(records[2]["argsDigest"], digest, "the run's arguments, as previewed");
    assert_eq!(records[2]["confirmation"], "token");
    assert_eq!(records[3]["job"], job.as_str());
    assert_eq!(records[3]["exitCode"], 0);
    assert_eq!(records[2]["inputs"][0]["path"], "in.txt");
    assert!(records[2]["inputs"][0]["sha256"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(records[4]["tool"], "skill_run");
    assert!(records[4]["argsDigest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(records[5]["code"], "bad-path", "{}", records[5]);
    assert!(records[10]["retryAfterSeconds"].as_u64().unwrap() >= 1);
    assert_eq!(records[11]["code"], "unauthorized");
    for (r, status) in records[12..].iter().zip(&statuses) {
        assert_eq!(r["request"], "POST /mcp", "{r}");
        assert!(r["code"].as_str().is_some_and(|c| !c.is_empty()) && r["reason"].is_string(), "code and sentence: {r} ({status})");
    }
    assert_eq!(records[13]["code"], "http:415", "{}", records[13]);

    // Stdout carries the same lines (the log is on stderr).
    let mut out = Vec::new();
    while out.len() < records.len() {
        out.push(rx.recv_timeout(std::time::Duration::from_secs(10)).expect("stdout has every record"));
    }
    assert_eq!(out.join("\n") + "\n", text);
}

/// `--no-audit-stdout` keeps stdout empty while the file still gets every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_audit_stdout_leaves_stdout_to_the_file_alone() {
    let file = tempfile::tempdir().unwrap();
    let path = file.path().join("audit.jsonl");
    let mut server = client::start(&["--audit-file", path.to_str().unwrap(), "--no-audit-stdout"], true);
    let mut alice = Client::connect(&server.url, ALICE).await;
    assert!(alice.call("skill_list", json!({})).await.get("result").is_some());
    assert_eq!(lines(&std::fs::read_to_string(&path).unwrap()).len(), 1);
    let _ = server.child.kill();
    let _ = server.child.wait();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut server.stdout.take().unwrap(), &mut rest).unwrap();
    assert_eq!(rest, "", "nothing on stdout");
}
