//! The gateway's SkillJob executor.
//!
//! - Request sequencing (tower-test `mock::pair` standing in for the API
//!   server: only the order and shape of the calls is the subject): run
//!   names, a retried call attaching, the 100-job cap, another principal's
//!   job, disconnect → cancel or keep, progress heartbeats.
//! - Gated (`KUBECONFIG`, the real local cluster): `run_new` through the
//!   executor creates a SkillJob that the real controller runs in a real
//!   pod on the node, the artifact endpoint and its registry real too; a
//!   draft job uploaded in chunks and run; and an executor of namespace A
//!   asked for namespace B's job finds nothing. See [`cluster`].
//! - Gated, through the gateway's HTTP router with real ServiceAccount
//!   tokens: MCP Tasks (a task client gets a task, `tasks/get` reads the
//!   SkillJob while its pod runs, `tasks/cancel` stops it, the task id is
//!   nothing on another namespace's path or for another caller) and the
//!   file route (a 3 MiB input up, the script's copy down). See [`over_http`].

#[path = "gateway_executor/cluster.rs"]
mod cluster;
#[path = "oci/common.rs"]
mod oci_common;
#[path = "gateway_executor/over_http.rs"]
mod over_http;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use skill_operator::artifacts::operator::HttpArtifacts;
use skill_operator::core::declaration::Interpreter;
use skill_operator::core::fence::{Decision, RunPlan};
use skill_operator::core::paths::RelPath;
use skill_operator::gateway::executor::names::run_name;
use skill_operator::gateway::executor::{KubeExecutor, KubeOptions, OnDisconnect};
use skill_operator::jobs::{JobState, ReadTarget};
use skill_operator::mcp::executor::{Caller, Executor, ProgressUpdate, RunControl};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Reply = tower_test::mock::SendResponse<Response<Body>>;

const NS: &str = "team";
const GW_NS: &str = "gw-system";
const SJ_PATH: &str = "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs";

fn plan(args: &[&str]) -> RunPlan {
    RunPlan {
        decision: Decision {
            skill: "echo".into(),
            script: RelPath::parse("scripts/echo.sh").unwrap(),
            interpreter: Interpreter::Bash,
            args: args.iter().map(|a| a.to_string()).collect(),
            granted_env: Vec::new(),
            timeout_secs: 30,
            egress: Vec::new(),
            egress_granted: false,
        },
        skill_dir: PathBuf::new(),
    }
}

fn executor(on_disconnect: OnDisconnect) -> (Arc<KubeExecutor>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    // Never reached in these tests (no inputs are staged, no finished run is read).
    let artifacts = Arc::new(HttpArtifacts::new("http://127.0.0.1:9/v1", b"0123456789abcdef0123456789abcdef"));
    let bindings: BTreeMap<String, String> = BTreeMap::from([("echo".to_string(), "echo-binding".to_string())]);
    let mut options = KubeOptions::new(NS, GW_NS, seal());
    options.on_disconnect = on_disconnect;
    (Arc::new(KubeExecutor::new(client, artifacts, Arc::new(bindings), options)), handle)
}

async fn next(handle: &mut Handle) -> (Request<Body>, Reply) {
    tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("the executor made no further API call")
        .expect("the client went away")
}

/// Nothing more is asked of the API server (within a moment).
async fn silent(handle: &mut Handle) {
    if let Ok(Some((req, _))) = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await {
        panic!("unexpected API call {} {}", req.method(), req.uri());
    }
}

async fn body_json(req: Request<Body>) -> Value {
    let bytes = req.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn ok(value: Value) -> Response<Body> {
    Response::builder().body(Body::from(serde_json::to_vec(&value).unwrap())).unwrap()
}

fn status(code: u16, reason: &str) -> Response<Body> {
    let s = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason });
    Response::builder().status(code).body(Body::from(serde_json::to_vec(&s).unwrap())).unwrap()
}

fn list(kind: &str, items: Vec<Value>) -> Response<Body> {
    ok(json!({ "apiVersion": "v1", "kind": kind, "metadata": { "resourceVersion": "7" }, "items": items }))
}

fn complete(phase: &str) -> Value {
    json!({ "phase": phase, "conditions": [{ "type": "Complete", "status": "True", "reason": phase, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" }] })
}

/// A SkillJob as the API server would hold it.
/// A SkillJob as the gateway wrote it for `principal` (sealed at its creation).
fn skilljob(name: &str, principal: &str, args: &[&str], created: &str, status: Value) -> Value {
    let mut sj = json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "5", "creationTimestamp": created,
            "annotations": { "skill-operator.dev/requested-by": principal, "skill-operator.dev/skill": "echo" },
        },
        "spec": { "binding": "echo-binding", "script": "scripts/echo.sh", "args": args, "inputs": [], "timeoutSeconds": 30 },
        "status": status,
    });
    let mut typed: skill_operator::api::job::SkillJob = serde_json::from_value(sj.clone()).unwrap();
    let at: k8s_openapi::jiff::Timestamp = created.parse().unwrap();
    typed.seal_owner(&seal(), principal, at.as_second());
    sj["metadata"]["annotations"] = serde_json::to_value(typed.metadata.annotations).unwrap();
    sj
}

/// The seal the executor under test checks (its token key's).
fn seal() -> skill_operator::core::owner::OwnerSeal {
    skill_operator::core::owner::OwnerSeal::new(b"0123456789abcdef0123456789abcdef")
}

fn control(key: &str) -> (RunControl, CancellationToken, Arc<Mutex<Vec<ProgressUpdate>>>) {
    let cancel = CancellationToken::new();
    let seen: Arc<Mutex<Vec<ProgressUpdate>>> = Default::default();
    let sink = seen.clone();
    let progress: skill_operator::mcp::executor::ProgressSink = Arc::new(move |u| sink.lock().unwrap().push(u));
    (RunControl { key: key.into(), progress: Some(progress), cancel: cancel.clone() }, cancel, seen)
}

/// The cap's two lists: the namespace's SkillJobs, then its drafts.
async fn answer_cap(handle: &mut Handle, held: Vec<Value>) {
    let (req, reply) = next(handle).await;
    assert_eq!((req.method(), req.uri().path()), (&Method::GET, SJ_PATH), "the cap counts the namespace's SkillJobs");
    reply.send_response(list("SkillJobList", held));
    let (req, reply) = next(handle).await;
    assert_eq!(req.uri().path(), format!("/api/v1/namespaces/{GW_NS}/configmaps"), "and the namespace's drafts");
    assert!(req.uri().query().unwrap_or_default().contains("draft-namespace%3Dteam"), "{}", req.uri());
    reply.send_response(list("ConfigMapList", vec![]));
}

/// The watch on the one SkillJob: its list answered with `current`, its
/// watch request held open (returned, so it stays open).
async fn answer_watch(handle: &mut Handle, name: &str, current: Value) -> Reply {
    let (req, reply) = next(handle).await;
    let query = req.uri().query().unwrap_or_default().to_string();
    assert!(req.uri().path() == SJ_PATH && query.contains(&format!("fieldSelector=metadata.name%3D{name}")), "{}", req.uri());
    assert!(!query.contains("watch=true"), "the watch starts with a list: {query}");
    reply.send_response(list("SkillJobList", vec![current]));
    let (req, reply) = next(handle).await;
    assert!(req.uri().query().unwrap_or_default().contains("watch=true"), "then watches: {}", req.uri());
    reply
}

/// run_new up to its SkillJob being created and watched; returns the POSTed
/// body and the held watch.
async fn through_create(handle: &mut Handle, name: &str) -> (Value, Reply) {
    let (req, reply) = next(handle).await;
    assert_eq!((req.method(), req.uri().path().to_string()), (&Method::GET, format!("{SJ_PATH}/{name}")), "a retry is looked for first");
    reply.send_response(status(404, "NotFound"));
    answer_cap(handle, vec![]).await;
    let (req, reply) = next(handle).await;
    assert_eq!((req.method(), req.uri().path()), (&Method::POST, SJ_PATH));
    let mut posted = body_json(req).await;
    let sent = posted.clone();
    posted["metadata"]["uid"] = json!(format!("uid-{name}"));
    posted["metadata"]["resourceVersion"] = json!("5");
    posted["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    reply.send_response(ok(posted.clone()));
    let watch = answer_watch(handle, name, posted).await;
    (sent, watch)
}

#[tokio::test]
async fn a_run_is_named_from_its_key_records_its_caller_and_is_cancelled_when_the_caller_goes() {
    let (exec, mut handle) = executor(OnDisconnect::Cancel);
    let name = run_name(NS, "alice", "key-1");
    let (ctl, cancel, _) = control("key-1");
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan(&["a b", "; rm -rf /"]), Vec::new(), ctl).await }
    });
    let (posted, _watch) = through_create(&mut handle, &name).await;
    assert_eq!(posted["metadata"]["name"], name);
    assert!(name.starts_with("skj-") && name.len() == 36, "{name}");
    assert_eq!(posted["metadata"]["annotations"]["skill-operator.dev/requested-by"], "alice");
    // Made with the controller's finalizer: the controller writes no metadata patch for it.
    assert_eq!(posted["metadata"]["finalizers"], json!([skill_operator::controller::skilljob::FINALIZER]));
    assert_eq!(
        posted["spec"],
        json!({ "binding": "echo-binding", "script": "scripts/echo.sh", "args": ["a b", "; rm -rf /"], "inputs": [], "timeoutSeconds": 30 })
    );

    // The caller goes away while the run is pending: the SkillJob is cancelled.
    cancel.cancel();
    let (req, reply) = next(&mut handle).await;
    assert_eq!((req.method(), req.uri().path().to_string()), (&Method::PATCH, format!("{SJ_PATH}/{name}")));
    let patch = body_json(req).await;
    assert_eq!(patch["metadata"]["annotations"]["skill-operator.dev/cancel"], "alice", "{patch}");
    reply.send_response(ok(skilljob(&name, "alice", &["a b", "; rm -rf /"], "2026-01-01T00:00:00Z", json!({}))));
    let report = run.await.unwrap().expect("a cancelled report");
    assert_eq!(report.record.state, JobState::Cancelled);
    assert!(report.record.run.as_ref().unwrap().outcome.cancelled);
    assert_eq!(report.record.id, name);
}

#[tokio::test]
async fn keep_leaves_the_run_alone_when_the_caller_goes() {
    let (exec, mut handle) = executor(OnDisconnect::Keep);
    let name = run_name(NS, "alice", "key-2");
    let (ctl, cancel, _) = control("key-2");
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan(&[]), Vec::new(), ctl).await }
    });
    let (_, _watch) = through_create(&mut handle, &name).await;
    cancel.cancel();
    let err = run.await.unwrap().expect_err("kept, not a result");
    assert_eq!(err.code, "run-kept");
    assert!(err.message.contains(&name), "{}", err.message);
    silent(&mut handle).await;
}

#[tokio::test]
async fn a_retried_call_attaches_to_its_skilljob_and_a_different_one_is_refused() {
    let (exec, mut handle) = executor(OnDisconnect::Keep);
    let name = run_name(NS, "alice", "key-3");
    let existing = skilljob(&name, "alice", &["x"], "2026-01-01T00:00:00Z", json!({ "phase": "Running" }));

    // Same owner, same spec: no cap count, no create, straight to the watch.
    let (ctl, cancel, _) = control("key-3");
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan(&["x"]), Vec::new(), ctl).await }
    });
    let (req, reply) = next(&mut handle).await;
    assert_eq!(req.uri().path(), format!("{SJ_PATH}/{name}"));
    reply.send_response(ok(existing.clone()));
    let _watch = answer_watch(&mut handle, &name, existing.clone()).await;
    cancel.cancel();
    assert_eq!(run.await.unwrap().unwrap_err().code, "run-kept");

    // The create lost a race with another replica (409): it attaches too.
    let (ctl, cancel, _) = control("key-3");
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan(&["x"]), Vec::new(), ctl).await }
    });
    let (_, reply) = next(&mut handle).await;
    reply.send_response(status(404, "NotFound"));
    answer_cap(&mut handle, vec![]).await;
    let (req, reply) = next(&mut handle).await;
    assert_eq!(req.method(), Method::POST);
    reply.send_response(status(409, "AlreadyExists"));
    let (req, reply) = next(&mut handle).await;
    assert_eq!((req.method(), req.uri().path().to_string()), (&Method::GET, format!("{SJ_PATH}/{name}")));
    reply.send_response(ok(existing.clone()));
    let _watch = answer_watch(&mut handle, &name, existing.clone()).await;
    cancel.cancel();
    assert_eq!(run.await.unwrap().unwrap_err().code, "run-kept");

    // The same name asking for another run (other arguments): refused, nothing created.
    assert_eq!(refused_finding(&exec, &mut handle, &["other"], existing.clone()).await.code, "job-name-taken");

    // The same run, claiming alice without the gateway's seal (someone else
    // wrote it): not hers to attach to, nothing runs.
    let mut planted = existing.clone();
    planted["metadata"]["annotations"].as_object_mut().unwrap().remove("skill-operator.dev/owner-seal");
    assert_eq!(refused_finding(&exec, &mut handle, &["x"], planted).await.code, "job-name-taken");

    // Deleted since (its name held for the token's life): the token already
    // ran its call once; nothing is made or run again.
    let mut deleted = existing;
    deleted["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:05:00Z");
    let err = refused_finding(&exec, &mut handle, &["x"], deleted).await;
    assert_eq!(err.code, "token-reused", "{}", err.message);
}

/// alice's run of `args` under key-3, whose look-up of its name finds
/// `found`: the error it ends with, and nothing asked of the API after it.
async fn refused_finding(
    exec: &Arc<KubeExecutor>,
    handle: &mut Handle,
    args: &[&str],
    found: Value,
) -> skill_operator::mcp::error::ToolError {
    let (ctl, _, _) = control("key-3");
    let plan = plan(args);
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan, Vec::new(), ctl).await }
    });
    let (_, reply) = next(handle).await;
    reply.send_response(ok(found));
    let err = run.await.unwrap().unwrap_err();
    silent(handle).await;
    err
}

#[tokio::test]
async fn the_namespace_cap_allows_the_hundredth_job_and_refuses_the_hundred_and_first() {
    let (exec, mut handle) = executor(OnDisconnect::Keep);
    let held = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| {
                // Every third one finished; older ones have smaller numbers.
                let status = if i % 3 == 0 { complete("Succeeded") } else { json!({ "phase": "Running" }) };
                skilljob(&format!("job-{i:03}"), "someone", &[], &format!("2026-01-01T00:{:02}:{:02}Z", i / 60, i % 60), status)
            })
            .rev()
            .collect()
    };

    // 99 held: the 100th is created.
    let (ctl, cancel, _) = control("cap-99");
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan(&[]), Vec::new(), ctl).await }
    });
    let (_, reply) = next(&mut handle).await;
    reply.send_response(status(404, "NotFound"));
    answer_cap(&mut handle, held(99)).await;
    let (req, reply) = next(&mut handle).await;
    assert_eq!(req.method(), Method::POST, "at 99 jobs the run is created");
    reply.send_response(status(500, "InternalError"));
    assert_eq!(run.await.unwrap().unwrap_err().code, "backend-unavailable");
    drop(cancel);

    // 100 held: refused before anything is created, naming the oldest finished ones.
    let (ctl, _, _) = control("cap-100");
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan(&[]), Vec::new(), ctl).await }
    });
    let (_, reply) = next(&mut handle).await;
    reply.send_response(status(404, "NotFound"));
    answer_cap(&mut handle, held(100)).await;
    let err = run.await.unwrap().unwrap_err();
    assert_eq!(err.code, "job-cap-reached");
    assert!(err.message.contains("100") && err.message.contains("job-000, job-003, job-006, job-009, job-012"), "{}", err.message);
    assert!(!err.message.contains("job-001"), "a running job is not offered for deletion: {}", err.message);
    silent(&mut handle).await;

    // A draft (skill_job_create) obeys the same cap.
    let create = tokio::spawn({
        let exec = exec.clone();
        async move { exec.create(&Caller::named("alice"), "echo").await }
    });
    answer_cap(&mut handle, held(100)).await;
    assert_eq!(create.await.unwrap().unwrap_err().code, "job-cap-reached");
    silent(&mut handle).await;
}

#[tokio::test]
async fn another_principals_job_is_reported_missing() {
    let (exec, mut handle) = executor(OnDisconnect::Cancel);
    let name = run_name(NS, "alice", "k");
    let alices = skilljob(&name, "alice", &[], "2026-01-01T00:00:00Z", complete("Succeeded"));
    let bob = Caller::named("bob");

    for call in ["get", "status", "read", "delete", "upload", "task_status", "task_cancel"] {
        let work = tokio::spawn({
            let (exec, bob, name) = (exec.clone(), bob.clone(), name.clone());
            async move {
                match call {
                    "get" => exec.get(&bob, &name).await.map(|_| ()),
                    "status" => exec.status(&bob, &name).await.map(|_| ()),
                    "read" => exec.read(&bob, &name, ReadTarget::Stdout, 0, 1024).await.map(|_| ()),
                    "delete" => exec.delete(&bob, &name).await,
                    "upload" => exec.upload(&bob, &name, "a.txt", 0, b"x".to_vec()).await.map(|_| ()),
                    "task_status" => exec.task_status(&bob, &name).await.map(|_| ()).map_err(Into::into),
                    _ => exec.task_cancel(&bob, &name).await.map_err(Into::into),
                }
            }
        });
        let (req, reply) = next(&mut handle).await;
        assert_eq!(req.uri().path(), format!("{SJ_PATH}/{name}"), "{call}");
        reply.send_response(ok(alices.clone()));
        if !call.starts_with("task") {
            // Not a run of bob's: perhaps a draft of his? Not that either.
            let (req, reply) = next(&mut handle).await;
            assert!(req.uri().path().ends_with(&format!("/configmaps/skill-draft-team-{name}")), "{call}: {}", req.uri());
            reply.send_response(status(404, "NotFound"));
        }
        let err = work.await.unwrap().expect_err(call);
        assert_eq!(err.code, "job-not-found", "{call}: {}", err.message);
        assert!(!err.message.contains("alice"), "{call} names the owner: {}", err.message);
        silent(&mut handle).await;
    }
    // bob's list filters by his owner label and drops anything not annotated his.
    let listed = tokio::spawn({
        let (exec, bob) = (exec.clone(), bob.clone());
        async move { exec.list(&bob).await }
    });
    let (req, reply) = next(&mut handle).await;
    assert!(req.uri().query().unwrap_or_default().contains("requested-by-hash"), "{}", req.uri());
    reply.send_response(list("SkillJobList", vec![alices]));
    let (_, reply) = next(&mut handle).await;
    reply.send_response(list("ConfigMapList", vec![]));
    assert!(listed.await.unwrap().unwrap().is_empty());

    // An id not shaped like the gateway's asks nothing of the API server.
    assert_eq!(exec.get(&bob, "../other-namespace/x").await.unwrap_err().code, "job-not-found");
    silent(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_wait_sends_a_heartbeat_every_interval() {
    let (exec, mut handle) = executor(OnDisconnect::Keep);
    let name = run_name(NS, "alice", "beat");
    let (ctl, cancel, seen) = control("beat");
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run_new(&Caller::named("alice"), plan(&[]), Vec::new(), ctl).await }
    });
    let (_, _watch) = through_create(&mut handle, &name).await;
    assert_eq!(seen.lock().unwrap().len(), 1, "one report when the wait begins");
    tokio::time::sleep(skill_operator::gateway::executor::limits::PROGRESS_INTERVAL * 2 + Duration::from_secs(1)).await;
    let updates = seen.lock().unwrap().clone();
    assert_eq!(updates.len(), 3, "{updates:?}");
    assert!(updates[1].message.starts_with("still") && updates[1].elapsed_secs >= 15, "{:?}", updates[1]);
    assert!(updates[2].elapsed_secs >= 30, "{:?}", updates[2]);
    cancel.cancel();
    assert_eq!(run.await.unwrap().unwrap_err().code, "run-kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_the_real_cluster() {
    cluster::runs_on_the_real_cluster().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_and_files_over_http_on_the_real_cluster() {
    over_http::tasks_and_files_over_http_on_the_real_cluster().await;
}

/// A draft's record as the gateway stores it (a ConfigMap in its namespace).
fn draft_config_map(id: &str, state: &str, inputs: &[(&str, u64)]) -> Value {
    let inputs: Vec<Value> = inputs.iter().map(|(p, n)| json!({ "path": p, "size": n, "sha256": "sha256:00" })).collect();
    let draft = json!({ "id": id, "namespace": NS, "skill": "echo", "owner": "alice", "createdAtMs": 1, "state": state, "inputs": inputs });
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": format!("skill-draft-{NS}-{id}"), "namespace": GW_NS, "resourceVersion": "3" },
        "data": { "draft.json": draft.to_string() },
    })
}

#[tokio::test]
async fn uploads_and_reads_keep_the_job_store_limits() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let artifacts = Arc::new(HttpArtifacts::new("http://127.0.0.1:9/v1", b"0123456789abcdef0123456789abcdef"));
    let mut options = KubeOptions::new(NS, GW_NS, seal());
    // Shrunk so each edge is a few bytes away.
    options.limits =
        skill_operator::jobs::JobLimits { upload_chunk: 4, file_bytes: 6, job_bytes: 7, files: 2, read_chunk: 8, ..options.limits };
    let exec =
        Arc::new(KubeExecutor::new(Client::new(service, "default"), artifacts, Arc::new(BTreeMap::<String, String>::new()), options));
    let alice = Caller::named("alice");
    let id = skill_operator::gateway::executor::names::draft_id();

    // Refused before anything is asked of the API server.
    let deep = vec!["d"; 33].join("/");
    for (path, bytes, code) in [("b.txt", 5, "job-chunk-too-large"), ("../x", 1, "job-bad-path"), (deep.as_str(), 1, "job-path-too-deep")] {
        let err = exec.upload(&alice, &id, path, 0, vec![b'x'; bytes]).await.unwrap_err();
        assert_eq!(err.code, code, "{path}: {}", err.message);
        silent(&mut handle).await;
    }
    assert_eq!(exec.read(&alice, &id, ReadTarget::Stdout, 0, 9).await.unwrap_err().code, "job-read-too-large");
    silent(&mut handle).await;
    // Too large for one call: the refusals name the file route, which takes the whole file.
    let err = exec.upload(&alice, &id, "dir/b c.txt", 0, vec![b'x'; 5]).await.unwrap_err();
    assert!(err.message.contains(&format!("PUT it whole (up to 32 MiB) to /files/{NS}/{id}/dir/b%20c.txt")), "{}", err.message);
    let err = exec.read(&alice, &id, ReadTarget::File("out.bin".into()), 0, 9).await.unwrap_err();
    assert_eq!(err.code, "job-read-too-large");
    assert!(err.message.contains(&format!("GET the whole file (up to 32 MiB) from /files/{NS}/{id}/out.bin")), "{}", err.message);
    silent(&mut handle).await;

    // Refused against the draft's record (nothing staged).
    // (draft state, its inputs, upload path, offset, bytes, the refusal)
    type Case<'a> = (&'a str, &'a [(&'a str, u64)], &'a str, u64, usize, &'a str);
    let cases: [Case; 5] = [
        ("open", &[("a.txt", 4)], "a.txt", 2, 1, "job-wrong-offset"),
        ("open", &[("a.txt", 4)], "a.txt", 4, 3, "job-file-too-large"),
        ("open", &[("a.txt", 4)], "b.txt", 0, 4, "job-job-too-large"),
        ("open", &[("a.txt", 4), ("c.txt", 1)], "b.txt", 0, 1, "job-too-many-files"),
        ("starting", &[], "b.txt", 0, 1, "job-uploads-closed"),
    ];
    for (state, inputs, path, offset, bytes, code) in cases {
        let upload = tokio::spawn({
            let (exec, alice, id) = (exec.clone(), alice.clone(), id.clone());
            async move { exec.upload(&alice, &id, path, offset, vec![b'x'; bytes]).await }
        });
        let (req, reply) = next(&mut handle).await;
        assert_eq!(req.uri().path(), format!("{SJ_PATH}/{id}"));
        reply.send_response(status(404, "NotFound"));
        let (req, reply) = next(&mut handle).await;
        assert_eq!(req.uri().path(), format!("/api/v1/namespaces/{GW_NS}/configmaps/skill-draft-{NS}-{id}"));
        reply.send_response(ok(draft_config_map(&id, state, inputs)));
        let err = upload.await.unwrap().unwrap_err();
        assert_eq!(err.code, code, "{state} {path}@{offset}+{bytes}: {}", err.message);
        silent(&mut handle).await;
    }
}
