//! Traces of the real `serve --http` binary, exported over OTLP/HTTP to a
//! collector of the tests on loopback: with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! set, a confirmed `skill_run` arrives as spans of the service
//! `skill-operator-serve` (the run a child of its call, in the call's
//! trace) and a `tools/list` as none (listings are not traced), in
//! protobuf by default and in JSON when asked; without it no exporter is
//! started.

#[path = "serve/client.rs"]
mod client;
#[path = "traces/collector.rs"]
mod collector;

use client::{Client, ALICE};
use collector::{Collector, Span};
use serde_json::json;

/// A short batch delay: the spans leave within a fraction of a second.
const FAST_BATCHES: (&str, &str) = ("OTEL_BSP_SCHEDULE_DELAY", "100");

async fn run_once(client: &mut Client) -> String {
    let list = client.post(&json!({"jsonrpc":"2.0","id":99,"method":"tools/list","params":{}})).await;
    assert_eq!(list.status(), 200);
    let _ = list.bytes().await;
    let run = json!({"skill":"tool","script":"scripts/a.sh","args":["x"]});
    let preview = client.call("skill_run", run.clone()).await;
    let token = preview["result"]["structuredContent"]["token"].as_str().unwrap_or_else(|| panic!("{preview}")).to_string();
    let mut confirmed = run;
    confirmed["confirm"] = json!(token);
    let done = client.call("skill_run", confirmed).await;
    assert_eq!(done["result"]["structuredContent"]["state"], "succeeded", "{done}");
    done["result"]["structuredContent"]["job"].as_str().unwrap().to_string()
}

/// Threads of process `pid` named as the exporter's runtime names its worker.
fn export_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "otlp-export"))
        .count()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_one_trace_from_the_call_to_the_script() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let server = client::start_with_env(&[], false, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), FAST_BATCHES]);
    let mut alice = Client::connect(&server.url, ALICE).await;
    run_once(&mut alice).await;

    let spans = collector.wait_for("a run span", |s| !named(s, "run").is_empty() && named(s, "tools/call").len() >= 2).await;
    assert!(collector.encodings().iter().all(|e| e == "application/x-protobuf"), "{:?}", collector.encodings());
    let run = named(&spans, "run")[0];
    let calls = named(&spans, "tools/call");
    let parent = calls.iter().find(|c| c.span_id == run.parent).unwrap_or_else(|| panic!("the run's parent is a tools/call: {spans:#?}"));
    assert_eq!(parent.trace_id, run.trace_id, "one trace");
    assert_eq!(parent.attributes.get("tool").map(String::as_str), Some("skill_run"));
    assert_eq!(parent.attributes.get("principal").map(String::as_str), Some("alice"));
    assert_eq!(run.attributes.get("script").map(String::as_str), Some("scripts/a.sh"));
    assert!(parent.start_ns <= run.start_ns && run.end_ns <= parent.end_ns, "the run inside its call: {parent:?} {run:?}");
    assert!(calls.iter().all(|c| c.parent.is_empty()), "a call starts its trace (no incoming traceparent): {calls:#?}");
    assert!(spans.iter().all(|s| s.service == "skill-operator-serve"), "{spans:#?}");
    let previews: Vec<&&Span> = calls.iter().filter(|c| c.span_id != parent.span_id).collect();
    assert!(previews.iter().all(|p| p.trace_id != run.trace_id), "the preview is a call of its own");
    // The listing ended before the run's spans, which the batches export in
    // the order spans end: had it been exported, it would be here by now.
    assert!(named(&spans, "tools/list").is_empty(), "listings are not traced: {spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_when_asked_and_nothing_without_an_endpoint() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let json_server = client::start_with_env(
        &[],
        false,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"), FAST_BATCHES],
    );
    let mut alice = Client::connect(&json_server.url, ALICE).await;
    run_once(&mut alice).await;
    collector.wait_for("the run's spans in JSON", |s| !named(s, "run").is_empty()).await;
    assert!(collector.encodings().iter().all(|e| e.starts_with("application/json")), "{:?}", collector.encodings());

    assert!(export_threads(json_server.child.id()) > 0, "the exporter runs on its own thread");

    // Without the variables no exporter is started at all.
    let plain = client::start_with_env(&[], false, &[FAST_BATCHES]);
    let mut bob = Client::connect(&plain.url, ALICE).await;
    run_once(&mut bob).await;
    assert_eq!(export_threads(plain.child.id()), 0, "no exporter thread without an endpoint");
}
