//! The console's JSON API (`/ui/api/…`) through its real router, the
//! real `require_caller` gate and the real [`Authenticator`], called with
//! `tower::ServiceExt::oneshot` (no socket). Skills come from a real skill
//! tree on disk, runs go through the real `skill_run` gate into a real
//! [`KubeExecutor`].
//!
//! Two tower-test mocks stand in for the API server (request
//! sequencing): one answers TokenReviews and SubjectAccessReviews from a
//! table and logs each review, so a test can say which permission a route
//! asked for; the other gets the executor's SkillJob and draft calls,
//! answered one by one by the test, so a refused route is seen to make
//! none. The job feed of the events stream is a channel the test writes
//! to (the real SkillJob watch is exercised by the browser suite,
//! tests/console/run.sh, against a real cluster).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::http::{header, Request as HttpRequest, StatusCode};
use axum::Router;
use futures::stream::BoxStream;
use futures::StreamExt;
use http::{Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tower::ServiceExt;

use skill_operator::artifacts::operator::HttpArtifacts;
use skill_operator::core::confirm::{ConfirmMode, SignedConfirmations, TOKEN_TTL};
use skill_operator::core::declaration::Interpreter;
use skill_operator::core::grants::Grants;
use skill_operator::gateway::auth::{AuthConfig, Authenticator};
use skill_operator::gateway::executor::{KubeExecutor, KubeOptions};
use skill_operator::gateway::http::Readiness;
use skill_operator::gateway::namespaces::{Backend, Namespaces, ServiceOptions};
use skill_operator::gateway::ui::headers::CONTENT_SECURITY_POLICY;
use skill_operator::gateway::ui::{self, Console, Directory, JobChange};
use skill_operator::jobs::{JobRecord, JobState};
use skill_operator::mcp::executor::Caller;
use skill_operator::mcp::snapshot::Snapshot;
use skill_operator::mcp::state::{Authorize, Execution};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const TEAM: &str = "team";
const TEAM_B: &str = "team-b";
const TEAM_C: &str = "team-c";
const GW_NS: &str = "gw-system";
const KEY: &[u8] = b"console-api-test-key-0123456789abcdef";

/// One SubjectAccessReview the gateway sent: (user, namespace, verb, resource).
type Review = (String, String, String, String);

fn user(name: &str) -> String {
    format!("system:serviceaccount:team:{name}")
}

/// Who may do what: alice everything in team and team-c (not team-b);
/// carol may read team's skills and nothing about its jobs; dave nothing.
fn allowed(review: &Review) -> bool {
    let (who, ns, _verb, resource) = review;
    if *who == user("alice") {
        return ns == TEAM || ns == TEAM_C;
    }
    if *who == user("carol") {
        return ns == TEAM && resource == "skillbindings";
    }
    false
}

/// Tokens `<name>-token` are `system:serviceaccount:team:<name>`.
async fn answer_reviews(mut handle: Handle, log: Arc<Mutex<Vec<Review>>>) {
    while let Some((request, send)) = handle.next_request().await {
        let path = request.uri().path().to_string();
        let body: Value = serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
        let answer = if path.ends_with("/tokenreviews") {
            let token = body["spec"]["token"].as_str().unwrap_or_default();
            let status = match token.strip_suffix("-token") {
                Some(name) => json!({ "authenticated": true, "user": { "username": user(name), "groups": ["system:authenticated"] } }),
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
            let ok = allowed(&review);
            log.lock().unwrap().push(review);
            json!({ "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {}, "spec": {},
                    "status": { "allowed": ok, "reason": if ok { "test" } else { "no RoleBinding" } } })
        };
        send.send_response(Response::builder().status(201).body(Body::from(serde_json::to_vec(&answer).unwrap())).unwrap());
    }
}

/// The namespaces as the gateway wires them: one skill tree for all,
/// runs by a [`KubeExecutor`] on the mock API, tokens and actions by the
/// real [`Authenticator`].
struct ConsoleBackend {
    root: tempfile::TempDir,
    client: Client,
    auth: Authenticator,
    confirmations: Arc<SignedConfirmations>,
}

#[async_trait::async_trait]
impl Backend for ConsoleBackend {
    async fn snapshot(&self, _: &str) -> Snapshot {
        Snapshot::scan(&[self.root.path().to_path_buf()], Grants::resolve(&|_| None, None), [Interpreter::Bash].into())
    }
    fn execution(&self, namespace: &str) -> Option<Execution> {
        let artifacts = Arc::new(HttpArtifacts::new("http://127.0.0.1:9/v1", KEY));
        let bindings = Arc::new(std::collections::BTreeMap::from([("echo".to_string(), "echo".to_string())]));
        let executor = Arc::new(KubeExecutor::new(
            self.client.clone(),
            artifacts,
            bindings,
            KubeOptions::new(namespace, GW_NS, skill_operator::core::owner::OwnerSeal::new(KEY)),
        ));
        Some(
            Execution::new(executor.clone(), ConfirmMode::Ask)
                .with_confirmations(self.confirmations.clone(), namespace)
                .with_tasks(executor),
        )
    }
    fn authorizer(&self, namespace: &str) -> Option<Arc<dyn Authorize>> {
        Some(self.auth.namespace_authorizer(namespace))
    }
}

/// Bound namespaces, and a job feed the test writes to.
struct Feed {
    changes: Mutex<Option<futures::channel::mpsc::UnboundedReceiver<JobChange>>>,
    asked: Mutex<Vec<(String, String)>>,
}

impl Directory for Feed {
    fn bound_namespaces(&self) -> BTreeSet<String> {
        [TEAM, TEAM_B, TEAM_C].into_iter().map(String::from).collect()
    }
    fn job_changes(&self, namespace: &str, caller: &Caller) -> Option<BoxStream<'static, JobChange>> {
        self.asked.lock().unwrap().push((namespace.to_string(), caller.principal.clone()));
        self.changes.lock().unwrap().take().map(|rx| rx.boxed())
    }
}

struct Env {
    app: Router,
    api: Handle,
    reviews: Arc<Mutex<Vec<Review>>>,
    feed: futures::channel::mpsc::UnboundedSender<JobChange>,
    directory: Arc<Feed>,
}

fn skill_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let skill = dir.path().join("echo");
    std::fs::create_dir_all(skill.join("scripts")).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: echo\ndescription: 'Echo <img src=x onerror=\"alert(1)\">'\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/echo.sh\n      interpreter: bash\n---\n# Echo\n<script>alert(2)</script>\n",
    )
    .unwrap();
    std::fs::write(skill.join("scripts/echo.sh"), "#!/bin/bash\necho \"$@\"\n").unwrap();
    dir
}

fn env() -> Env {
    env_with_hosts(Vec::new())
}

fn env_with_hosts(hosts: Vec<String>) -> Env {
    let (auth_service, auth_handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let reviews: Arc<Mutex<Vec<Review>>> = Default::default();
    tokio::spawn(answer_reviews(auth_handle, reviews.clone()));
    let auth = Authenticator::new(Client::new(auth_service, "default"), AuthConfig::default());
    let (api_service, api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let backend = Arc::new(ConsoleBackend {
        root: skill_tree(),
        client: Client::new(api_service, "default"),
        auth: auth.clone(),
        confirmations: Arc::new(SignedConfirmations::new(KEY, TOKEN_TTL)),
    });
    let options = ServiceOptions {
        http: rmcp::transport::streamable_http_server::StreamableHttpServerConfig::default(),
        max_sessions: 4,
        max_namespaces: 8,
        rate_limits: Default::default(),
        audit: Default::default(),
    };
    let ready = Readiness::default();
    ready.set_ready();
    let (feed, rx) = futures::channel::mpsc::unbounded();
    let directory = Arc::new(Feed { changes: Mutex::new(Some(rx)), asked: Mutex::default() });
    let console = Console::new(Arc::new(Namespaces::new(backend, options)), ready, auth, directory.clone()).with_allowed_hosts(hosts);
    Env { app: ui::routes(console), api, reviews, feed, directory }
}

fn get(uri: &str, token: Option<&str>) -> HttpRequest<AxumBody> {
    let mut r = HttpRequest::get(uri);
    if let Some(t) = token {
        r = r.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    r.body(AxumBody::empty()).unwrap()
}

fn post(uri: &str, token: &str, body: Value) -> HttpRequest<AxumBody> {
    HttpRequest::post(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(AxumBody::from(body.to_string()))
        .unwrap()
}

async fn send(app: &Router, req: HttpRequest<AxumBody>) -> (StatusCode, http::HeaderMap, Value) {
    let response = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (parts.status, parts.headers, value)
}

/// Nothing more is asked of the API server (within a moment).
async fn silent(handle: &mut Handle) {
    if let Ok(Some((req, _))) = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await {
        panic!("unexpected API call {} {}", req.method(), req.uri());
    }
}

/// The next event of a stream (within a moment).
async fn next(body: &mut axum::body::BodyDataStream) -> String {
    let chunk = tokio::time::timeout(Duration::from_secs(5), body.next()).await.expect("an event").expect("the stream goes on");
    String::from_utf8(chunk.expect("a chunk").to_vec()).expect("UTF-8")
}

fn ok(value: Value) -> Response<Body> {
    Response::builder().body(Body::from(serde_json::to_vec(&value).unwrap())).unwrap()
}

/// Every namespaced route, with the MCP tool it is.
fn namespaced(ns: &str) -> Vec<(String, &'static str)> {
    vec![
        (format!("/ui/api/ns/{ns}/skills"), "skill_list"),
        (format!("/ui/api/ns/{ns}/skills/echo"), "skill_load"),
        (format!("/ui/api/ns/{ns}/skills/echo/file?path=scripts/echo.sh"), "skill_file"),
        (format!("/ui/api/ns/{ns}/jobs"), "skill_job_list"),
        (format!("/ui/api/ns/{ns}/jobs/skj-0123456789abcdef0123456789abcdef"), "skill_job_status"),
        (format!("/ui/api/ns/{ns}/events"), "events"),
    ]
}

#[tokio::test]
async fn without_a_valid_token_every_data_route_is_401_with_the_policy() {
    let mut env = env();
    let mut routes: Vec<String> = vec!["/ui/api/me".into(), "/ui/api/namespaces".into()];
    routes.extend(namespaced(TEAM).into_iter().map(|(r, _)| r));
    for route in &routes {
        for token in [None, Some("not-a-known-one")] {
            let (status, headers, body) = send(&env.app, get(route, token)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{route} {token:?}: {body}");
            assert_eq!(body["error"]["code"], "unauthorized", "{route}");
            assert_eq!(headers[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY, "{route}");
            assert_eq!(headers[header::CACHE_CONTROL], "no-store", "{route}");
        }
    }
    let (status, _, _) = send(&env.app, post(&format!("/ui/api/ns/{TEAM}/run"), "nobody", json!({}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Nothing was asked about access for a caller nobody knows.
    assert!(env.reviews.lock().unwrap().is_empty());
    silent(&mut env.api).await;
    // The page itself and its configuration are open (they hold no data).
    let (status, _, config) = send(&env.app, get("/ui/api/config", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(config["authorizationServers"], json!([]));
}

#[tokio::test]
async fn the_namespace_list_is_what_the_caller_may_read() {
    let env = env();
    let (status, _, body) = send(&env.app, get("/ui/api/namespaces", Some("alice-token"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["namespaces"], json!([TEAM, TEAM_C]), "team-b is bound but alice may not read it");
    assert_eq!(body["user"], user("alice"));
    let (_, _, body) = send(&env.app, get("/ui/api/namespaces", Some("carol-token"))).await;
    assert_eq!(body["namespaces"], json!([TEAM]));
    let (_, _, body) = send(&env.app, get("/ui/api/namespaces", Some("dave-token"))).await;
    assert_eq!(body["namespaces"], json!([]));
    // Each bound namespace was asked about as `get skillbindings`, as the caller.
    let reviews = env.reviews.lock().unwrap().clone();
    for ns in [TEAM, TEAM_B, TEAM_C] {
        let asked = (user("dave"), ns.to_string(), "get".to_string(), "skillbindings".to_string());
        assert!(reviews.contains(&asked), "{ns} was not reviewed for dave: {reviews:?}");
    }
    let (_, _, me) = send(&env.app, get("/ui/api/me", Some("carol-token"))).await;
    assert_eq!(me["user"], user("carol"));
}

#[tokio::test]
async fn a_namespace_without_rights_is_403_on_every_route_and_asks_nothing_of_its_jobs() {
    let mut env = env();
    for (caller, ns) in [("dave-token", TEAM), ("alice-token", TEAM_B)] {
        for (route, tool) in namespaced(ns) {
            let (status, _, body) = send(&env.app, get(&route, Some(caller))).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{caller} {tool}: {body}");
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(&format!("may not get skillbindings.skill-operator.dev in namespace {ns}")), "{message}");
        }
        let (status, _, _) =
            send(&env.app, post(&format!("/ui/api/ns/{ns}/run"), caller, json!({"skill": "echo", "script": "scripts/echo.sh"}))).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    silent(&mut env.api).await;
    assert!(env.directory.asked.lock().unwrap().is_empty(), "no watch was opened for a refused stream");
}

#[tokio::test]
async fn reading_skills_is_not_reading_jobs_or_running() {
    let mut env = env();
    // carol: skills yes.
    let (status, _, skills) = send(&env.app, get(&format!("/ui/api/ns/{TEAM}/skills"), Some("carol-token"))).await;
    assert_eq!(status, StatusCode::OK, "{skills}");
    assert_eq!(skills["skills"][0]["name"], "echo");
    // Markup in a description is data: the API hands it over as it is, the page shows it as text.
    assert_eq!(skills["skills"][0]["description"], "Echo <img src=x onerror=\"alert(1)\">");
    let (status, _, loaded) = send(&env.app, get(&format!("/ui/api/ns/{TEAM}/skills/echo"), Some("carol-token"))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(loaded["body"].as_str().unwrap().contains("<script>alert(2)</script>"));
    let (status, _, file) =
        send(&env.app, get(&format!("/ui/api/ns/{TEAM}/skills/echo/file?path=scripts/echo.sh"), Some("carol-token"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(file["content"], "#!/bin/bash\necho \"$@\"\n");
    // A path outside the skill, or not one of its files, is refused by skill_file's own checks.
    for bad in ["../../etc/passwd", "%2Fetc%2Fpasswd", "nothing.txt"] {
        let (status, _, body) = send(&env.app, get(&format!("/ui/api/ns/{TEAM}/skills/echo/file?path={bad}"), Some("carol-token"))).await;
        assert!(status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST, "{bad}: {status} {body}");
        assert!(!body.to_string().contains("root:"), "{bad}");
    }
    let (status, _, body) = send(&env.app, get(&format!("/ui/api/ns/{TEAM}/skills/nope"), Some("carol-token"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // carol: jobs, a job, the events and a run all need the skilljobs verbs she lacks.
    for (route, verb) in [
        (format!("/ui/api/ns/{TEAM}/jobs"), "get"),
        (format!("/ui/api/ns/{TEAM}/jobs/skj-0123456789abcdef0123456789abcdef"), "get"),
        (format!("/ui/api/ns/{TEAM}/events"), "get"),
    ] {
        let (status, _, body) = send(&env.app, get(&route, Some("carol-token"))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{route}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(&format!("may not {verb} skilljobs")), "{body}");
    }
    let run = json!({ "skill": "echo", "script": "scripts/echo.sh", "args": ["hi"] });
    let (status, _, body) = send(&env.app, post(&format!("/ui/api/ns/{TEAM}/run"), "carol-token", run)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("may not create skilljobs"), "{body}");
    // None of it reached the executor.
    silent(&mut env.api).await;
    assert!(env.directory.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_job_list_is_the_callers_own() {
    let mut env = env();
    let app = env.app.clone();
    let listing = tokio::spawn(async move { send(&app, get(&format!("/ui/api/ns/{TEAM}/jobs"), Some("alice-token"))).await });
    let (request, reply) = tokio::time::timeout(Duration::from_secs(5), env.api.next_request()).await.unwrap().unwrap();
    assert!(request.uri().path().ends_with(&format!("/namespaces/{TEAM}/skilljobs")), "{}", request.uri());
    let query = request.uri().query().unwrap_or_default().to_string();
    assert!(query.contains("labelSelector=skill-operator.dev%2Frequested-by-hash"), "listed by the owner label: {query}");
    reply.send_response(ok(json!({ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJobList", "metadata": {}, "items": [] })));
    let (request, reply) = tokio::time::timeout(Duration::from_secs(5), env.api.next_request()).await.unwrap().unwrap();
    assert!(request.uri().path().ends_with(&format!("/namespaces/{GW_NS}/configmaps")), "{}", request.uri());
    reply.send_response(ok(json!({ "apiVersion": "v1", "kind": "ConfigMapList", "metadata": {}, "items": [] })));
    let (status, _, body) = listing.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["jobs"], json!([]));
}

#[tokio::test]
async fn a_run_goes_through_the_preview_and_confirm_gate() {
    let mut env = env();
    let uri = format!("/ui/api/ns/{TEAM}/run");
    let call = json!({ "skill": "echo", "script": "scripts/echo.sh", "args": ["<b>hi</b>"] });
    // The first call starts nothing: a preview and a token.
    let (status, _, preview) = send(&env.app, post(&uri, "alice-token", call.clone())).await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    assert_eq!(preview["status"], "confirmation-required");
    assert_eq!(preview["preview"]["command"]["sandbox"], "pod");
    let token = preview["token"].as_str().unwrap().to_string();
    silent(&mut env.api).await;
    // The token confirms only that call: other arguments, another
    // namespace, or another caller are refused, and nothing is created.
    let mut other_args = call.clone();
    other_args["args"] = json!(["something else"]);
    other_args["confirm"] = json!(token);
    let (status, _, body) = send(&env.app, post(&uri, "alice-token", other_args)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let mut confirmed = call.clone();
    confirmed["confirm"] = json!(token);
    let (status, _, body) = send(&env.app, post(&format!("/ui/api/ns/{TEAM_C}/run"), "alice-token", confirmed.clone())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a team token on team-c: {body}");
    silent(&mut env.api).await;
    // Not JSON, or not the tool's arguments: refused before the gate.
    let bad = HttpRequest::post(&uri)
        .header(header::AUTHORIZATION, "Bearer alice-token")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(AxumBody::from(call.to_string()))
        .unwrap();
    assert_eq!(send(&env.app, bad).await.0, StatusCode::BAD_REQUEST);
    let (status, _, body) =
        send(&env.app, post(&uri, "alice-token", json!({ "skill": "echo", "script": "scripts/echo.sh", "shell": true }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid-arguments");
    let (status, _, body) = send(&env.app, post(&uri, "alice-token", json!({ "skill": "echo", "script": "scripts/other.sh" }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "not-declared");
    silent(&mut env.api).await;
    // The exact call with its token reaches the executor: its first call is about SkillJobs in team.
    let app = env.app.clone();
    let uri2 = uri.clone();
    let running = tokio::spawn(async move { send(&app, post(&uri2, "alice-token", confirmed)).await });
    let (request, reply) = tokio::time::timeout(Duration::from_secs(5), env.api.next_request()).await.unwrap().unwrap();
    assert!(request.uri().path().contains(&format!("/namespaces/{TEAM}/skilljobs")), "{} {}", request.method(), request.uri());
    drop(reply);
    let (status, _, _) = running.await.unwrap();
    assert_ne!(status, StatusCode::OK, "the API call failed, so the run did not start");
}

#[tokio::test]
async fn the_event_stream_says_hello_then_the_callers_job_changes() {
    let env = env();
    let response = env.app.clone().oneshot(get(&format!("/ui/api/ns/{TEAM}/events"), Some("alice-token"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    assert_eq!(response.headers()[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
    assert_eq!(env.directory.asked.lock().unwrap().clone(), vec![(TEAM.to_string(), user("alice"))], "the watch is the caller's");
    let mut body = response.into_body().into_data_stream();
    let hello = next(&mut body).await;
    assert!(hello.starts_with("event: hello\ndata: {"), "{hello}");
    assert!(hello.contains("\"lifetimeSecs\":60"), "a stream lives as long as a token review: {hello}");
    let record = JobRecord {
        id: "skj-0123456789abcdef0123456789abcdef".into(),
        skill: "echo".into(),
        owner: user("alice"),
        created_at_ms: 1,
        state: JobState::Running,
        inputs: vec![],
        run: None,
    };
    env.feed.unbounded_send(JobChange::Changed(Box::new(record))).unwrap();
    let job = next(&mut body).await;
    assert!(job.starts_with("event: job\ndata: {") && job.contains("\"state\":\"running\""), "{job}");
    env.feed.unbounded_send(JobChange::Gone("skj-0123456789abcdef0123456789abcdef".into())).unwrap();
    assert_eq!(next(&mut body).await, "event: gone\ndata: {\"id\":\"skj-0123456789abcdef0123456789abcdef\"}\n\n");
}

#[tokio::test]
async fn a_host_name_the_gateway_does_not_serve_is_refused_before_anything_else() {
    let env = env_with_hosts(vec!["localhost".into(), "gw.skills.svc".into()]);
    let with_host = |host: &str, uri: &str| {
        HttpRequest::get(uri)
            .header(header::HOST, host)
            .header(header::AUTHORIZATION, "Bearer alice-token")
            .body(AxumBody::empty())
            .unwrap()
    };
    // A rebound name: the page and the API alike, with the policy on the refusal.
    for uri in ["/ui/", "/ui/api/namespaces", &format!("/ui/api/ns/{TEAM}/skills")] {
        let (status, headers, body) = send(&env.app, with_host("evil.example", uri)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{uri}: {body}");
        assert_eq!(body["error"]["code"], "host-not-allowed", "{uri}");
        assert_eq!(headers[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
    }
    assert!(env.reviews.lock().unwrap().is_empty(), "a refused host asked nothing of the API server");
    let (status, _, body) = send(&env.app, with_host("gw.skills.svc:8090", "/ui/api/namespaces")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(send(&env.app, with_host("localhost:8090", "/ui/")).await.0, StatusCode::OK);
}
