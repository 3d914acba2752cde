//! Rate limits per principal through the real `serve --http` binary: two
//! tokens, two principals. Alice spends her call budget and is answered a
//! JSON-RPC error (-32029, data.retryAfterSeconds); her refused confirmed
//! `skill_run` creates no job; Bob's budget is untouched; `/metrics`
//! counts the refusal.

#[path = "serve/client.rs"]
mod client;

use client::{Client, Server, ALICE, BOB};
use serde_json::json;

const BURST: usize = 5;

/// One call a minute after the burst: nothing refills during the test.
fn start() -> Server {
    client::start(&["--rate-calls-per-minute", "1", "--rate-burst-calls", &BURST.to_string()], false)
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
    let metrics = alice.http.get(&metrics_url).bearer_auth(ALICE).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("skill_operator_serve_rate_limited_total{limit=\"calls\"} 3"), "{metrics}");
}

/// A call over the limit is answered before rmcp's session machinery (a
/// plain JSON body, the request's id echoed), and only `tools/call` is
/// refused there: a listing and a body that is not JSON-RPC pass on to rmcp,
/// and the call that passed took exactly one token (the burst of 5 above
/// would end early if the tool handler took a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_answered_before_the_session_and_only_calls_are_refused() {
    let server = client::start(&["--rate-calls-per-minute", "1", "--rate-burst-calls", "1"], false);
    let mut alice = Client::connect(&server.url, ALICE).await;
    assert!(alice.call("skill_list", json!({})).await.get("result").is_some());

    let over = json!({"jsonrpc":"2.0","id":"over-7","method":"tools/call","params":{"name":"skill_list","arguments":{}}});
    let refused = alice.post(&over).await;
    assert_eq!(refused.status(), 200);
    assert_eq!(refused.headers()["content-type"], "application/json", "not an SSE stream: answered before rmcp");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["id"], "over-7");
    assert_eq!(body["error"]["code"], -32029, "{body}");
    assert_eq!(body["error"]["data"]["status"], 429);

    // Not a call: rmcp answers, limits or not.
    let list = alice.post(&json!({"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}})).await;
    assert_eq!(list.status(), 200);
    assert!(list.text().await.unwrap().contains("skill_list"), "a listing is not a call");
    let garbage = alice.post(&json!("not a request")).await;
    assert!(garbage.status().is_client_error(), "rmcp refuses what is not JSON-RPC: {}", garbage.status());
}
