//! The gateway's file route, `/files/{namespace}/{job}/{*path}`, through
//! the gateway's real router and auth gate (`tower::ServiceExt::oneshot`,
//! no socket), the real artifact endpoint in front of a real
//! `docker-registry` on loopback, and the real upload client putting a
//! run's outputs there.
//!
//! Two tower-test mocks stand in for the API server: one answers the
//! TokenReviews and SubjectAccessReviews (from a table, logging each review
//! so a test can say which permission a method asked for), the other the
//! executor's SkillJob and draft reads and writes, answered one by one by
//! the test (request sequencing: which calls, in which order, and none
//! after a refusal).

#[path = "oci/common.rs"]
mod oci_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::http::{header, Request as HttpRequest, StatusCode};
use axum::Router;
use http::{Method, Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tower::ServiceExt;

use skill_operator::artifacts::operator::HttpArtifacts;
use skill_operator::artifacts::server::{self, AppState, ServerConfig};
use skill_operator::audit::{Audit, SharedBuffer, Sink};
use skill_operator::core::grants::Grants;
use skill_operator::core::limits::FILE_ROUTE_BYTES;
use skill_operator::gateway::auth::{require_caller, AuthConfig, Authenticator};
use skill_operator::gateway::executor::names::{draft_id, run_name};
use skill_operator::gateway::executor::{KubeExecutor, KubeOptions};
use skill_operator::gateway::files::JobFiles;
use skill_operator::gateway::http::{router, Readiness};
use skill_operator::gateway::namespaces::{Backend, Namespaces, ServiceOptions};
use skill_operator::jobs::ReadTarget;
use skill_operator::mcp::executor::{Caller, Executor};
use skill_operator::mcp::snapshot::Snapshot;
use skill_operator::mcp::state::{Authorize, Execution};

use oci_common::TestRegistry;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Reply = tower_test::mock::SendResponse<Response<Body>>;

const NS: &str = "team";
const OTHER_NS: &str = "team-b";
const GW_NS: &str = "gw-system";
const KEY: &[u8] = b"gateway-files-test-key-0123456789abcdef";
const UID: &str = "5d6b7e1c-0000-4000-8000-000000000abc";
const ALICE: &str = "system:serviceaccount:team:alice";
/// May read the namespace's skills but nothing about its jobs.
const CAROL: &str = "system:serviceaccount:team:carol";

fn sj_path(ns: &str) -> String {
    format!("/apis/skill-operator.dev/v1alpha1/namespaces/{ns}/skilljobs")
}

/// One SubjectAccessReview the gateway sent: (user, namespace, verb, resource).
type Review = (String, String, String, String);

/// Answers the reviews: tokens `<name>-token` are `system:serviceaccount:team:<name>`;
/// every action is allowed except carol's on skilljobs.
async fn answer_reviews(mut handle: Handle, log: Arc<Mutex<Vec<Review>>>) {
    while let Some((request, send)) = handle.next_request().await {
        let path = request.uri().path().to_string();
        let body: Value = serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
        let answer = if path.ends_with("/tokenreviews") {
            let token = body["spec"]["token"].as_str().unwrap_or_default();
            let status = match token.strip_suffix("-token") {
                Some(name) => json!({ "authenticated": true, "user": {
                    "username": format!("system:serviceaccount:team:{name}"), "groups": ["system:authenticated"] } }),
                None => json!({ "authenticated": false, "error": "unknown token" }),
            };
            json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {}, "spec": {}, "status": status })
        } else {
            let spec = &body["spec"];
            let attrs = &spec["resourceAttributes"];
            let review: Review = (
                spec["user"].as_str().unwrap_or_default().into(),
                attrs["namespace"].as_str().unwrap_or_default().into(),
                attrs["verb"].as_str().unwrap_or_default().into(),
                attrs["resource"].as_str().unwrap_or_default().into(),
            );
            let allowed = !(review.0 == CAROL && review.3 == "skilljobs");
            log.lock().unwrap().push(review);
            json!({ "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {}, "spec": {},
                    "status": { "allowed": allowed, "reason": if allowed { "test" } else { "no RoleBinding" } } })
        };
        send.send_response(Response::builder().status(201).body(Body::from(serde_json::to_vec(&answer).unwrap())).unwrap());
    }
}

/// The namespaces as the gateway wires them, minus the catalog: file
/// route jobs from a [`KubeExecutor`] per namespace, actions authorized by
/// the real [`Authenticator`].
struct FilesBackend {
    client: Client,
    artifacts: Arc<HttpArtifacts>,
    auth: Authenticator,
}

impl FilesBackend {
    fn executor(&self, namespace: &str) -> Arc<KubeExecutor> {
        let bindings = Arc::new(BTreeMap::<String, String>::new());
        Arc::new(KubeExecutor::new(
            self.client.clone(),
            self.artifacts.clone(),
            bindings,
            KubeOptions::new(namespace, GW_NS, skill_operator::core::owner::OwnerSeal::new(KEY)),
        ))
    }
}

#[async_trait::async_trait]
impl Backend for FilesBackend {
    async fn snapshot(&self, _: &str) -> Snapshot {
        Snapshot::scan(&[], Grants::resolve(&|_| None, None), Default::default())
    }
    fn execution(&self, _: &str) -> Option<Execution> {
        None
    }
    fn authorizer(&self, namespace: &str) -> Option<Arc<dyn Authorize>> {
        Some(self.auth.namespace_authorizer(namespace))
    }
    fn files(&self, namespace: &str) -> Option<Arc<dyn JobFiles>> {
        Some(self.executor(namespace))
    }
}

struct Env {
    app: Router,
    api: Handle,
    reviews: Arc<Mutex<Vec<Review>>>,
    artifacts: Arc<HttpArtifacts>,
    endpoint: String,
    backend: Arc<FilesBackend>,
    /// The gateway's audit records (the route's and the entry gate's).
    audit: SharedBuffer,
    _registry: TestRegistry,
    _spool: tempfile::TempDir,
}

async fn env() -> Env {
    let registry = TestRegistry::start().await;
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::new(format!("{}/gw-files/jobs", registry.addr), KEY.to_vec());
    cfg.plain_http = true;
    cfg.spool_dir = Some(spool.path().into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(server::serve(listener, AppState::new(cfg).unwrap(), std::future::pending()));
    let artifacts = Arc::new(HttpArtifacts::new(&endpoint, KEY));

    let (auth_service, auth_handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let reviews: Arc<Mutex<Vec<Review>>> = Default::default();
    tokio::spawn(answer_reviews(auth_handle, reviews.clone()));
    let auth = Authenticator::new(Client::new(auth_service, "default"), AuthConfig::default());
    let audit = SharedBuffer::default();
    let audit_writer = Audit::new("gateway", vec![Sink::buffer(audit.clone())]);
    auth.set_audit(audit_writer.clone());
    let (api_service, api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let backend = Arc::new(FilesBackend { client: Client::new(api_service, "default"), artifacts: artifacts.clone(), auth: auth.clone() });
    let options = ServiceOptions {
        http: rmcp::transport::streamable_http_server::StreamableHttpServerConfig::default(),
        max_sessions: 4,
        max_namespaces: 8,
        rate_limits: Default::default(),
        audit: audit_writer.clone(),
    };
    let ready = Readiness::default();
    ready.set_ready();
    let gate = axum::middleware::from_fn_with_state(auth, require_caller);
    let app = router(
        Arc::new(Namespaces::new(backend.clone(), options)),
        ready,
        Arc::new(String::new),
        skill_operator::metrics_access::MetricsAccess::open(),
        gate,
    );
    Env { app, api, reviews, artifacts, endpoint, backend, audit, _registry: registry, _spool: spool }
}

async fn next(handle: &mut Handle) -> (Request<Body>, Reply) {
    tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("the gateway made no further API call")
        .expect("the client went away")
}

/// Nothing more is asked of the API server (within a moment).
async fn silent(handle: &mut Handle) {
    if let Ok(Some((req, _))) = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await {
        panic!("unexpected API call {} {}", req.method(), req.uri());
    }
}

fn ok(value: Value) -> Response<Body> {
    Response::builder().body(Body::from(serde_json::to_vec(&value).unwrap())).unwrap()
}

fn not_found() -> Response<Body> {
    let s = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found" });
    Response::builder().status(404).body(Body::from(serde_json::to_vec(&s).unwrap())).unwrap()
}

/// A run the gateway wrote for `owner` (sealed under the test's token key).
fn finished_run(name: &str, owner: &str, phase: &str) -> Value {
    let mut run = unsealed_run(name, owner, phase);
    let mut typed: skill_operator::api::job::SkillJob = serde_json::from_value(run.clone()).unwrap();
    typed.seal_owner(&skill_operator::core::owner::OwnerSeal::new(KEY), owner, 1_767_225_600);
    run["metadata"]["annotations"] = serde_json::to_value(typed.metadata.annotations).unwrap();
    run
}

/// The same SkillJob as anyone who may create SkillJobs could write it.
fn unsealed_run(name: &str, owner: &str, phase: &str) -> Value {
    let complete = phase != "Running";
    json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
        "metadata": { "name": name, "namespace": NS, "uid": UID, "resourceVersion": "5", "creationTimestamp": "2026-01-01T00:00:00Z",
                      "annotations": { "skill-operator.dev/requested-by": owner, "skill-operator.dev/skill": "echo" } },
        "spec": { "binding": "echo", "script": "scripts/echo.sh", "args": [], "inputs": [], "timeoutSeconds": 30 },
        "status": { "phase": phase, "conditions": [{ "type": "Complete", "status": if complete { "True" } else { "False" },
                    "reason": phase, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" }] },
    })
}

fn draft(ns: &str, id: &str, owner: &str, inputs: Value) -> Value {
    let record = json!({ "id": id, "namespace": ns, "skill": "echo", "owner": owner, "createdAtMs": 1, "state": "open", "inputs": inputs });
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": format!("skill-draft-{ns}-{id}"), "namespace": GW_NS, "resourceVersion": "3" },
        "data": { "draft.json": record.to_string() },
    })
}

fn request(method: Method, uri: &str, token: &str, body: AxumBody, length: Option<u64>) -> HttpRequest<AxumBody> {
    let mut r = HttpRequest::builder().method(method).uri(uri).header(header::AUTHORIZATION, format!("Bearer {token}"));
    if let Some(n) = length {
        r = r.header(header::CONTENT_LENGTH, n);
    }
    r.body(body).unwrap()
}

/// Send through the router while the test answers the API calls.
fn send(env: &Env, req: HttpRequest<AxumBody>) -> tokio::task::JoinHandle<(StatusCode, http::HeaderMap, Vec<u8>)> {
    let app = env.app.clone();
    tokio::spawn(async move {
        let response = app.oneshot(req).await.unwrap();
        let (parts, body) = response.into_parts();
        (parts.status, parts.headers, axum::body::to_bytes(body, usize::MAX).await.unwrap().to_vec())
    })
}

fn error_of(body: &[u8]) -> (String, String) {
    let v: Value = serde_json::from_slice(body).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)));
    (v["error"]["code"].as_str().unwrap_or_default().into(), v["error"]["message"].as_str().unwrap_or_default().into())
}

/// Bytes that are not all one value (a misplaced chunk would show).
fn pattern(n: u64) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// The caller's draft is looked up (no SkillJob of that name) and answered with `record`.
async fn answer_draft_lookup(api: &mut Handle, ns: &str, id: &str, record: Value) {
    let (req, reply) = next(api).await;
    assert_eq!((req.method(), req.uri().path().to_string()), (&Method::GET, format!("{}/{id}", sj_path(ns))));
    reply.send_response(not_found());
    let (req, reply) = next(api).await;
    assert_eq!(req.uri().path(), format!("/api/v1/namespaces/{GW_NS}/configmaps/skill-draft-{ns}-{id}"));
    reply.send_response(ok(record));
}

#[tokio::test]
async fn a_draft_takes_a_whole_file_up_to_the_route_limit_and_exactly_its_declared_length() {
    let mut env = env().await;
    let id = draft_id();
    let uri = format!("/files/{NS}/{id}/data/big.bin");

    // Exactly the limit: staged, recorded in the draft, digest as sent.
    let bytes = pattern(FILE_ROUTE_BYTES);
    let digest = skill_operator::core::package::digest(&bytes);
    let call = send(&env, request(Method::PUT, &uri, "alice-token", AxumBody::from(bytes.clone()), Some(FILE_ROUTE_BYTES)));
    answer_draft_lookup(&mut env.api, NS, &id, draft(NS, &id, ALICE, json!([]))).await;
    let (req, reply) = next(&mut env.api).await;
    assert_eq!(
        (req.method(), req.uri().path().to_string()),
        (&Method::PUT, format!("/api/v1/namespaces/{GW_NS}/configmaps/skill-draft-{NS}-{id}"))
    );
    let saved: Value = serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    let record: Value = serde_json::from_str(saved["data"]["draft.json"].as_str().unwrap()).unwrap();
    assert_eq!(record["inputs"], json!([{ "path": "data/big.bin", "size": FILE_ROUTE_BYTES, "sha256": digest }]));
    assert_eq!(saved["metadata"]["resourceVersion"], "3", "the write is guarded by the version read");
    reply.send_response(ok(saved));
    let (status, _, body) = call.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["file"]["sha256"], digest);
    assert_eq!(env.artifacts.input_file(NS, &id, "data/big.bin").await.unwrap(), bytes, "the endpoint holds the file as sent");
    let uploaded = env.audit.records().pop().expect("the upload is in the audit trail");
    assert_eq!((uploaded["event"].as_str(), uploaded["outcome"].as_str()), (Some("file.upload"), Some("ok")), "{uploaded}");
    assert_eq!((uploaded["namespace"].as_str(), uploaded["principal"]["name"].as_str()), (Some(NS), Some(ALICE)));
    assert_eq!((uploaded["job"].as_str(), uploaded["file"]["path"].as_str()), (Some(id.as_str()), Some("data/big.bin")));
    silent(&mut env.api).await;
    assert!(
        env.reviews.lock().unwrap().contains(&(ALICE.into(), NS.into(), "create".into(), "skilljobs".into())),
        "an upload is authorized as starting work: {:?}",
        env.reviews.lock().unwrap()
    );

    // One byte over: refused from the header, before the body or the cluster is read.
    let call =
        send(&env, request(Method::PUT, &uri, "alice-token", AxumBody::from(pattern(FILE_ROUTE_BYTES + 1)), Some(FILE_ROUTE_BYTES + 1)));
    let (status, _, body) = call.await.unwrap();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (code, message) = error_of(&body);
    assert_eq!(code, "file-too-large");
    assert!(message.contains("32 MiB") && message.contains(&(FILE_ROUTE_BYTES + 1).to_string()), "{message}");
    let refused = env.audit.records().pop().unwrap();
    assert_eq!((refused["outcome"].as_str(), refused["code"].as_str()), (Some("refused"), Some("http:413")), "{refused}");
    silent(&mut env.api).await;

    // No declared length: refused the same way.
    let chunks = futures::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"abc"))]);
    let (status, _, body) = send(&env, request(Method::PUT, &uri, "alice-token", AxumBody::from_stream(chunks), None)).await.unwrap();
    assert_eq!((status, error_of(&body).0.as_str()), (StatusCode::LENGTH_REQUIRED, "length-required"));
    silent(&mut env.api).await;

    // A body that lies about its length stores nothing and records nothing.
    for (sent, declared) in [(11u64, 10u64), (9, 10)] {
        let path = format!("lie-{sent}.txt");
        let call = send(
            &env,
            request(Method::PUT, &format!("/files/{NS}/{id}/{path}"), "alice-token", AxumBody::from(pattern(sent)), Some(declared)),
        );
        answer_draft_lookup(&mut env.api, NS, &id, draft(NS, &id, ALICE, json!([]))).await;
        let (status, _, body) = call.await.unwrap();
        let (code, message) = error_of(&body);
        assert_eq!((status, code.as_str()), (StatusCode::BAD_REQUEST, "body-length-mismatch"), "{sent} for {declared}: {message}");
        assert!(message.contains("nothing was stored"), "{message}");
        silent(&mut env.api).await;
        assert!(env.artifacts.input_file(NS, &id, &path).await.is_err(), "{sent} bytes for {declared}: the endpoint stored something");
    }
}

#[tokio::test]
async fn a_finished_runs_output_comes_down_whole_and_the_mcp_read_points_to_it() {
    let mut env = env().await;
    let job = run_name(NS, ALICE, "files-key");

    // The run's outputs, put by the real upload client with the job's own token.
    let work = tempfile::tempdir().unwrap();
    let big = pattern(2 * 1024 * 1024 + 7);
    std::fs::write(work.path().join("big.bin"), &big).unwrap();
    std::fs::write(work.path().join("small.txt"), b"small").unwrap();
    let result = tempfile::tempdir().unwrap();
    std::fs::write(result.path().join("result.json"), serde_json::to_vec(&skill_operator::api::outcome::LaunchResult::default()).unwrap())
        .unwrap();
    std::fs::write(result.path().join("stdout"), b"").unwrap();
    std::fs::write(result.path().join("stderr"), b"").unwrap();
    let token = skill_operator::core::token::job_token(KEY, NS, UID);
    let endpoint = skill_operator::artifacts::client::Endpoint::new(env.endpoint.clone(), NS, UID, token).unwrap();
    let mut opts = skill_operator::artifacts::client::UploadOptions::new(endpoint, work.path().into(), result.path().join("result.json"));
    opts.termination_log = None;
    skill_operator::artifacts::client::upload(&opts, &Default::default()).await.unwrap().expect("uploaded");

    let call = send(&env, request(Method::GET, &format!("/files/{NS}/{job}/big.bin"), "alice-token", AxumBody::empty(), None));
    let (req, reply) = next(&mut env.api).await;
    assert_eq!(req.uri().path(), format!("{}/{job}", sj_path(NS)));
    reply.send_response(ok(finished_run(&job, ALICE, "Succeeded")));
    let (status, headers, body) = call.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, big);
    assert_eq!(headers[header::CONTENT_LENGTH], big.len().to_string().as_str());
    assert_eq!(headers["x-content-digest"], skill_operator::core::package::digest(&big).as_str());
    let sent = env.audit.records().pop().expect("the download is in the audit trail");
    assert_eq!(
        (sent["event"].as_str(), sent["outcome"].as_str(), sent["job"].as_str()),
        (Some("file.download"), Some("ok"), Some(job.as_str()))
    );
    assert_eq!(sent["file"], json!({"path": "big.bin", "size": big.len(), "sha256": skill_operator::core::package::digest(&big)}));
    assert!(
        env.reviews.lock().unwrap().contains(&(ALICE.into(), NS.into(), "get".into(), "skilljobs".into())),
        "a download is authorized as reading jobs: {:?}",
        env.reviews.lock().unwrap()
    );

    // No such file, and a run still going: refused with the job tools' codes.
    for (path, phase, want, code) in [
        ("nope.bin", "Succeeded", StatusCode::NOT_FOUND, "job-no-such-file"),
        ("big.bin", "Running", StatusCode::CONFLICT, "job-still-running"),
    ] {
        let call = send(&env, request(Method::GET, &format!("/files/{NS}/{job}/{path}"), "alice-token", AxumBody::empty(), None));
        let (_, reply) = next(&mut env.api).await;
        reply.send_response(ok(finished_run(&job, ALICE, phase)));
        let (status, _, body) = call.await.unwrap();
        assert_eq!((status, error_of(&body).0.as_str()), (want, code), "{path} {phase}");
        let refused = env.audit.records().pop().unwrap();
        assert_eq!((refused["event"].as_str(), refused["outcome"].as_str()), (Some("file.download"), Some("refused")), "{refused}");
    }

    // skill_job_read of the big file names the route; of a small one, nothing.
    let exec = env.backend.executor(NS);
    let alice = Caller::named(ALICE);
    for (path, download) in [("big.bin", Some(format!("/files/{NS}/{job}/big.bin"))), ("small.txt", None)] {
        let read = tokio::spawn({
            let (exec, alice, job) = (exec.clone(), alice.clone(), job.clone());
            async move { exec.read(&alice, &job, ReadTarget::File(path.into()), 0, 1024).await }
        });
        let (_, reply) = next(&mut env.api).await;
        reply.send_response(ok(finished_run(&job, ALICE, "Succeeded")));
        let chunk = read.await.unwrap().unwrap();
        assert_eq!(chunk.download, download, "{path}");
    }
    // So does the job's output listing (skill_job_status, and a run's result).
    let status = tokio::spawn({
        let (exec, alice, job) = (exec.clone(), alice.clone(), job.clone());
        async move { exec.status(&alice, &job).await }
    });
    let (_, reply) = next(&mut env.api).await;
    reply.send_response(ok(finished_run(&job, ALICE, "Succeeded")));
    let listing = status.await.unwrap().unwrap().outputs.expect("a finished job lists its outputs");
    let downloads: Vec<(&str, Option<&str>)> = listing.files.iter().map(|f| (f.path.as_str(), f.download.as_deref())).collect();
    let route = format!("/files/{NS}/{job}/big.bin");
    assert_eq!(downloads, vec![("big.bin", Some(route.as_str())), ("small.txt", None)]);
    // A read over the chunk limit names the route too.
    let err = exec.read(&alice, &job, ReadTarget::File("big.bin".into()), 0, 256 * 1024 + 1).await.unwrap_err();
    assert_eq!(err.code, "job-read-too-large");
    assert!(err.message.contains(&format!("GET the whole file (up to 32 MiB) from /files/{NS}/{job}/big.bin")), "{}", err.message);
    silent(&mut env.api).await;
}

#[tokio::test]
async fn another_principal_or_another_namespace_finds_nothing() {
    let mut env = env().await;
    let job = run_name(NS, ALICE, "k");
    let id = draft_id();

    // bob, allowed everything, on alice's run and alice's draft: not found, and not told whose.
    let call = send(&env, request(Method::GET, &format!("/files/{NS}/{job}/out.txt"), "bob-token", AxumBody::empty(), None));
    let (_, reply) = next(&mut env.api).await;
    reply.send_response(ok(finished_run(&job, ALICE, "Succeeded")));
    let (req, reply) = next(&mut env.api).await;
    assert!(req.uri().path().ends_with(&format!("/configmaps/skill-draft-{NS}-{job}")), "{}", req.uri());
    reply.send_response(not_found());
    let (status, _, body) = call.await.unwrap();
    let (code, message) = error_of(&body);
    assert_eq!((status, code.as_str()), (StatusCode::NOT_FOUND, "job-not-found"));
    assert!(!message.contains("alice"), "{message}");

    // A run claiming bob that the gateway never sealed (anyone who may
    // create SkillJobs can write the annotation): not his either.
    let call = send(&env, request(Method::GET, &format!("/files/{NS}/{job}/out.txt"), "bob-token", AxumBody::empty(), None));
    let (_, reply) = next(&mut env.api).await;
    reply.send_response(ok(unsealed_run(&job, "system:serviceaccount:team:bob", "Succeeded")));
    let (_, reply) = next(&mut env.api).await;
    reply.send_response(not_found());
    let (status, _, body) = call.await.unwrap();
    assert_eq!((status, error_of(&body).0.as_str()), (StatusCode::NOT_FOUND, "job-not-found"), "a planted claim opens nothing");

    let call = send(&env, request(Method::PUT, &format!("/files/{NS}/{id}/in.txt"), "bob-token", AxumBody::from("x"), Some(1)));
    answer_draft_lookup(&mut env.api, NS, &id, draft(NS, &id, ALICE, json!([]))).await;
    let (status, _, body) = call.await.unwrap();
    assert_eq!((status, error_of(&body).0.as_str()), (StatusCode::NOT_FOUND, "job-not-found"));
    silent(&mut env.api).await;
    assert!(env.artifacts.input_file(NS, &id, "in.txt").await.is_err(), "bob's bytes reached alice's draft");

    // alice herself, on another namespace's path: that namespace holds neither.
    let call = send(&env, request(Method::GET, &format!("/files/{OTHER_NS}/{job}/out.txt"), "alice-token", AxumBody::empty(), None));
    let (req, reply) = next(&mut env.api).await;
    assert_eq!(req.uri().path(), format!("{}/{job}", sj_path(OTHER_NS)), "asked in the path's namespace");
    reply.send_response(not_found());
    let (req, reply) = next(&mut env.api).await;
    assert!(req.uri().path().ends_with(&format!("/configmaps/skill-draft-{OTHER_NS}-{job}")), "{}", req.uri());
    reply.send_response(not_found());
    assert_eq!(call.await.unwrap().0, StatusCode::NOT_FOUND);
    let call = send(&env, request(Method::PUT, &format!("/files/{OTHER_NS}/{id}/in.txt"), "alice-token", AxumBody::from("x"), Some(1)));
    let (_, reply) = next(&mut env.api).await;
    reply.send_response(not_found());
    let (req, reply) = next(&mut env.api).await;
    assert!(req.uri().path().ends_with(&format!("/configmaps/skill-draft-{OTHER_NS}-{id}")), "{}", req.uri());
    reply.send_response(not_found());
    assert_eq!(call.await.unwrap().0, StatusCode::NOT_FOUND);
    // A record claiming another namespace is not taken either (a forged or misfiled ConfigMap).
    let call = send(&env, request(Method::PUT, &format!("/files/{OTHER_NS}/{id}/in.txt"), "alice-token", AxumBody::from("x"), Some(1)));
    answer_draft_lookup(&mut env.api, OTHER_NS, &id, draft(NS, &id, ALICE, json!([]))).await;
    let (status, _, _) = call.await.unwrap();
    assert_ne!(status, StatusCode::OK);
    silent(&mut env.api).await;
    assert!(env.artifacts.input_file(OTHER_NS, &id, "in.txt").await.is_err());
}

#[tokio::test]
async fn each_method_needs_its_tools_permission() {
    let mut env = env().await;
    let id = draft_id();
    for (method, verb) in [(Method::GET, "get"), (Method::PUT, "create")] {
        let (status, _, body) =
            send(&env, request(method.clone(), &format!("/files/{NS}/{id}/in.txt"), "carol-token", AxumBody::from("x"), Some(1)))
                .await
                .unwrap();
        let (code, message) = error_of(&body);
        assert_eq!((status, code.as_str()), (StatusCode::FORBIDDEN, "forbidden"), "{method}: {message}");
        assert!(message.contains(verb) && message.contains("skilljobs"), "{method}: {message}");
        // Refused before the job is looked up.
        silent(&mut env.api).await;
    }
    let reviews = env.reviews.lock().unwrap().clone();
    let carol: Vec<(String, String)> = reviews.iter().filter(|r| r.0 == CAROL).map(|r| (r.2.clone(), r.3.clone())).collect();
    assert_eq!(
        carol,
        vec![("get".into(), "skillbindings".into()), ("get".into(), "skilljobs".into()), ("create".into(), "skilljobs".into())],
        "the entry gate, then each method's own permission"
    );
    // Without a token: 401 naming the namespace's metadata, as on /mcp.
    let unauthenticated = HttpRequest::get(format!("/files/{NS}/{id}/in.txt")).body(AxumBody::empty()).unwrap();
    let response = env.app.clone().oneshot(unauthenticated).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let challenge = response.headers()[header::WWW_AUTHENTICATE].to_str().unwrap().to_string();
    assert!(challenge.contains(&format!("/.well-known/oauth-protected-resource/mcp/{NS}")), "{challenge}");
    silent(&mut env.api).await;
    // Each refusal is in the trail: Carol's two by the route's own check, the tokenless one at the gate.
    let trail: Vec<(String, String, String)> = env
        .audit
        .records()
        .iter()
        .map(|r| {
            let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
            (s(&r["event"]), s(&r["code"]), s(&r["principal"]["name"]))
        })
        .collect();
    let want = |e: &str, c: &str, p: &str| (e.to_string(), c.to_string(), p.to_string());
    assert_eq!(
        trail,
        vec![want("file.download", "http:403", CAROL), want("file.upload", "http:403", CAROL), want("auth.refused", "unauthorized", "-"),]
    );
    assert_eq!(env.audit.records()[2]["namespace"], NS);
}
