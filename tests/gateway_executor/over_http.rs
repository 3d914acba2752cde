//! The gated real-cluster test of the gateway's HTTP face: MCP Tasks and
//! the file route, through the gateway's own router and auth gate served
//! on loopback, with real ServiceAccount tokens (TokenRequest) checked by
//! real TokenReviews and SubjectAccessReviews, real SkillJobs run by the
//! in-process controller in real pods ([`super::cluster::setup_named`], names
//! `gwfiles-…`).
//!
//! The client is raw JSON-RPC over HTTP (reqwest; this crate's rmcp has no
//! client), in the 2025-11-25 session era, declaring the tasks extension.
//! The namespaces' skills come from the test skill's directory rather than
//! the package cache (the catalog has its own suite): what is under test
//! is what happens to a call once it is served.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use skill_operator::api::{SkillJob, SkillJobPhase};
use skill_operator::artifacts::operator::HttpArtifacts;
use skill_operator::core::confirm::ConfirmMode;
use skill_operator::core::declaration::Interpreter;
use skill_operator::core::grants::Grants;
use skill_operator::gateway::auth::{require_caller, AuthConfig, Authenticator};
use skill_operator::gateway::executor::{KubeExecutor, KubeOptions};
use skill_operator::gateway::files::JobFiles;
use skill_operator::gateway::http::{router, Readiness};
use skill_operator::gateway::namespaces::{Backend, Namespaces, ServiceOptions};
use skill_operator::jobs::JobState;
use skill_operator::mcp::executor::{Caller, Executor, RunControl};
use skill_operator::mcp::snapshot::Snapshot;
use skill_operator::mcp::state::{Authorize, Execution};

use super::cluster::{plan, pod_story, script_running, setup_named, wait_for, Names, ECHO_SH, SKILL, SKILL_MD};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const ERA: &str = "2025-11-25";

/// Every namespace served from the test skill's directory, run as
/// SkillJobs (confirmation `auto`: the preview round trip is `serve`'s
/// suite's subject), authorized by the real API server.
struct ClusterHttp {
    client: Client,
    artifacts: Arc<HttpArtifacts>,
    bindings: Arc<BTreeMap<String, String>>,
    auth: Authenticator,
    gateway_namespace: String,
    skills: PathBuf,
}

impl ClusterHttp {
    fn executor(&self, namespace: &str) -> Arc<KubeExecutor> {
        let options =
            KubeOptions::new(namespace, self.gateway_namespace.clone(), skill_operator::core::owner::OwnerSeal::new(super::cluster::KEY));
        Arc::new(KubeExecutor::new(self.client.clone(), self.artifacts.clone(), self.bindings.clone(), options))
    }
}

#[async_trait::async_trait]
impl Backend for ClusterHttp {
    async fn snapshot(&self, _: &str) -> Snapshot {
        Snapshot::scan(std::slice::from_ref(&self.skills), Grants::resolve(&|_| None, None), Interpreter::ALL.into())
    }
    fn execution(&self, namespace: &str) -> Option<Execution> {
        let executor = self.executor(namespace);
        Some(Execution::new(executor.clone(), ConfirmMode::Auto).with_tasks(executor))
    }
    fn authorizer(&self, namespace: &str) -> Option<Arc<dyn Authorize>> {
        Some(self.auth.namespace_authorizer(namespace))
    }
    fn files(&self, namespace: &str) -> Option<Arc<dyn JobFiles>> {
        Some(self.executor(namespace))
    }
}

/// One MCP session over HTTP (2025-11-25), as one caller, on one namespace.
struct Session {
    http: reqwest::Client,
    url: String,
    token: String,
    id: String,
    next: u64,
}

/// The JSON-RPC answer to request `id` in a response body (JSON or SSE).
fn answer_in(body: &str, id: u64) -> Value {
    let messages: Vec<Value> = if body.trim_start().starts_with('{') {
        vec![serde_json::from_str(body).unwrap()]
    } else {
        body.lines().filter_map(|l| l.strip_prefix("data:")).filter_map(|d| serde_json::from_str(d.trim()).ok()).collect()
    };
    messages.into_iter().find(|m| m["id"] == json!(id)).unwrap_or_else(|| panic!("no answer to request {id} in {body}"))
}

impl Session {
    async fn open(base: &str, namespace: &str, token: &str, tasks: bool) -> Session {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let url = format!("{base}/mcp/{namespace}");
        let capabilities = if tasks { json!({ "extensions": { TASKS: {} } }) } else { json!({}) };
        let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize",
                           "params": { "protocolVersion": ERA, "capabilities": capabilities, "clientInfo": { "name": "gwfiles", "version": "0" } } });
        let response =
            http.post(&url).bearer_auth(token).header("accept", "application/json, text/event-stream").json(&init).send().await.unwrap();
        assert_eq!(response.status(), 200, "initialize on {url}");
        let id = response.headers()["mcp-session-id"].to_str().unwrap().to_string();
        let body = response.text().await.unwrap();
        let init = answer_in(&body, 0);
        if tasks {
            assert!(init["result"]["capabilities"]["extensions"].get(TASKS).is_some(), "the gateway offers tasks: {init}");
        }
        let mut session = Session { http, url, token: token.into(), id, next: 1 };
        let status = session.post(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await.status();
        assert!(status.is_success(), "{status}");
        session
    }

    async fn post(&mut self, message: Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", ERA)
            .json(&message)
            .send()
            .await
            .unwrap()
    }

    /// A request's JSON-RPC answer (`result` or `error`).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let response = self.post(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await;
        assert_eq!(response.status(), 200, "{method}");
        answer_in(&response.text().await.unwrap(), id)
    }

    async fn task_get(&mut self, task: &str) -> Value {
        self.call("tasks/get", json!({ "taskId": task })).await
    }
}

/// A ServiceAccount's token for the API server's audience.
async fn token(client: &Client, namespace: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    accounts.create(&PostParams::default(), &sa).await.expect("create a ServiceAccount");
    let request: TokenRequest = serde_json::from_value(json!({ "spec": { "audiences": [], "expirationSeconds": 1200 } })).unwrap();
    let answer = accounts.create_token_request(name, &PostParams::default(), &request).await.expect("a token");
    serde_json::to_value(answer).unwrap()["status"]["token"].as_str().expect("a token in the answer").to_string()
}

/// What an agent needs on the gateway in `namespace`, granted to `subjects` (ServiceAccounts of `sa_namespace`).
async fn grant(client: &Client, namespace: &str, sa_namespace: &str, subjects: &[&str]) {
    let group = skill_operator::api::GROUP;
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "gwfiles-agent" },
        "rules": [
            { "apiGroups": [group], "resources": ["skillbindings"], "verbs": ["get"] },
            { "apiGroups": [group], "resources": ["skilljobs"], "verbs": ["create", "get", "delete"] },
        ],
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), namespace).create(&PostParams::default(), &role).await.expect("create the Role");
    let subjects: Vec<Value> = subjects.iter().map(|s| json!({ "kind": "ServiceAccount", "name": s, "namespace": sa_namespace })).collect();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "gwfiles-agent" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gwfiles-agent" },
        "subjects": subjects,
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the RoleBinding");
}

/// A new RoleBinding reaches the authorizer a moment after it is created,
/// with nothing to watch for: ask until it answers yes (bounded), so the
/// gateway's negative cache never sees the gap.
async fn wait_allowed(client: &Client, user: &str, sa_namespace: &str, namespace: &str) {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{sa_namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(skill_operator::api::GROUP.into()),
                namespace: Some(namespace.into()),
                verb: Some("delete".into()),
                resource: Some("skilljobs".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    wait_for(
        || async { reviews.create(&PostParams::default(), &review).await.ok()?.status.filter(|s| s.allowed).map(|_| ()) },
        30,
        "the RoleBinding to take effect",
    )
    .await;
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 253) as u8).collect()
}

pub(crate) async fn tasks_and_files_over_http_on_the_real_cluster() {
    let Some(setup) = setup_named("MCP tasks and the file route through the gateway on a real cluster", "gwfiles").await else { return };
    let n: Names = setup.names.clone();
    let client = setup.client.clone();

    // Two agents in namespace A; alice is allowed in B too.
    let alice_token = token(&client, &n.a, "alice").await;
    let mallory_token = token(&client, &n.a, "mallory").await;
    grant(&client, &n.a, &n.a, &["alice", "mallory"]).await;
    grant(&client, &n.b, &n.a, &["alice"]).await;
    let alice = format!("system:serviceaccount:{}:alice", n.a);
    let mallory = format!("system:serviceaccount:{}:mallory", n.a);
    wait_allowed(&client, &alice, &n.a, &n.a).await;
    wait_allowed(&client, &mallory, &n.a, &n.a).await;
    wait_allowed(&client, &alice, &n.a, &n.b).await;

    // The gateway: its router and gate, on loopback.
    let skills = tempfile::tempdir().unwrap();
    let dir = skills.path().join(SKILL);
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(dir.join("SKILL.md"), SKILL_MD).unwrap();
    std::fs::write(dir.join("scripts/echo.sh"), ECHO_SH).unwrap();
    let auth = Authenticator::new(client.clone(), AuthConfig::default());
    let backend = Arc::new(ClusterHttp {
        client: client.clone(),
        artifacts: setup.artifacts.clone(),
        bindings: setup.bindings.clone(),
        auth: auth.clone(),
        gateway_namespace: n.gw.clone(),
        skills: skills.path().to_path_buf(),
    });
    let http = rmcp::transport::streamable_http_server::StreamableHttpServerConfig::default()
        .with_allowed_hosts(vec!["127.0.0.1".to_string(), "localhost".to_string()]);
    let namespaces = Arc::new(Namespaces::new(
        backend.clone(),
        ServiceOptions { http, max_sessions: 16, max_namespaces: 8, rate_limits: Default::default(), audit: Default::default() },
    ));
    let ready = Readiness::default();
    ready.set_ready();
    let gate = axum::middleware::from_fn_with_state(auth, require_caller);
    let app = router(namespaces, ready, Arc::new(String::new), skill_operator::metrics_access::MetricsAccess::open(), gate);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // ---- MCP Tasks ----
    let mut a = Session::open(&base, &n.a, &alice_token, true).await;
    let created = a
        .call("tools/call", json!({ "name": "skill_run", "arguments": { "skill": SKILL, "script": "scripts/echo.sh", "args": ["sleep"] } }))
        .await;
    let result = &created["result"];
    assert_eq!(result["resultType"], "task", "a task client gets a CreateTaskResult: {created}");
    assert_eq!(result["status"], "working", "{created}");
    let task = result["taskId"].as_str().expect("a task id").to_string();
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), &n.a);
    let sj = skilljobs.get(&task).await.expect("the task is a SkillJob of that name");
    assert_eq!(sj.metadata.annotations.as_ref().unwrap()["skill-operator.dev/requested-by"], alice, "the audit trail names the caller");

    // tasks/get reads the SkillJob while its pod runs the script.
    script_running(&client, &n, &task).await;
    let got = a.task_get(&task).await;
    assert_eq!((got["result"]["taskId"].as_str(), got["result"]["status"].as_str()), (Some(task.as_str()), Some("working")), "{got}");

    // The task id is nothing on namespace B's path, nor for another caller in A.
    let mut b = Session::open(&base, &n.b, &alice_token, true).await;
    let mut m = Session::open(&base, &n.a, &mallory_token, true).await;
    for (who, session) in [("alice on B", &mut b), ("mallory on A", &mut m)] {
        for method in ["tasks/get", "tasks/cancel"] {
            let refused = session.call(method, json!({ "taskId": task })).await;
            let message = refused["error"]["message"].as_str().unwrap_or_else(|| panic!("{who} {method}: {refused}"));
            assert!(message.contains("unknown task"), "{who} {method}: {refused}");
            assert!(!message.contains("alice"), "{who} {method} names the owner: {refused}");
        }
    }
    assert_eq!(a.task_get(&task).await["result"]["status"], "working", "the refused cancels touched nothing");

    // tasks/cancel: the pod goes, the phase is Cancelled, tasks/get says so.
    let cancelled = a.call("tasks/cancel", json!({ "taskId": task })).await;
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    // Polled as a task client polls (the same bounded probe as `wait_for`).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let done = loop {
        let got = a.task_get(&task).await;
        if got["result"]["status"] != "working" {
            break got;
        }
        assert!(tokio::time::Instant::now() < deadline, "the cancelled task did not settle within 120 s: {got}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(done["result"]["status"], "cancelled", "{done}");
    let sj = skilljobs.get(&task).await.unwrap();
    assert_eq!(sj.status.as_ref().and_then(|s| s.phase), Some(SkillJobPhase::Cancelled));
    let selector = format!("skill-operator.dev/skilljob-uid={}", sj.metadata.uid.unwrap());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &n.a);
    wait_for(
        || async { pods.list(&ListParams::default().labels(&selector)).await.ok().filter(|l| l.items.is_empty()).map(|_| ()) },
        60,
        "the cancelled task's pod to go",
    )
    .await;

    // ---- the file route ----
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let draft = a.call("tools/call", json!({ "name": "skill_job_create", "arguments": { "skill": SKILL } })).await;
    let draft_id = draft["result"]["structuredContent"]["id"]
        .as_str()
        .or_else(|| draft["result"]["structuredContent"]["job"]["id"].as_str())
        .unwrap_or_else(|| panic!("a job id: {draft}"))
        .to_string();
    let big = pattern(3 * 1024 * 1024 + 5);
    let put = |token: &str, ns: &str, bytes: Vec<u8>| {
        http.put(format!("{base}/files/{ns}/{draft_id}/big.in")).bearer_auth(token).body(bytes).send()
    };
    assert_eq!(put(&mallory_token, &n.a, b"x".to_vec()).await.unwrap().status(), 404, "mallory uploads to alice's draft");
    assert_eq!(put(&alice_token, &n.b, b"x".to_vec()).await.unwrap().status(), 404, "A's draft through B's path");
    let response = put(&alice_token, &n.a, big.clone()).await.unwrap();
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let staged: Value = response.json().await.unwrap();
    assert_eq!(staged["file"]["sha256"], skill_operator::core::package::digest(&big));
    // Run it (the executor directly: the confirmed inputs are the draft's).
    let exec = backend.executor(&n.a);
    let owner = Caller::named(alice.clone());
    let record = exec.get(&owner, &draft_id).await.unwrap();
    let confirmed: Vec<(String, String)> = record.inputs.iter().map(|f| (f.path.clone(), f.sha256.clone())).collect();
    let ran = tokio::time::timeout(
        Duration::from_secs(300),
        exec.run(&owner, &draft_id, plan(&["copy"]), confirmed, RunControl { key: "gwfiles-copy".into(), ..Default::default() }),
    )
    .await
    .expect("the run ended within 300 s")
    .expect("a report");
    if ran.record.state != JobState::Succeeded {
        panic!("the run ended {:?}: {:?}{}", ran.record.state, ran.record, pod_story(&client, n.a.as_str()).await);
    }
    // Down again, whole, to its owner only.
    let get = |token: &str, ns: &str| http.get(format!("{base}/files/{ns}/{draft_id}/big.out")).bearer_auth(token).send();
    let response = get(&alice_token, &n.a).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-content-digest"], skill_operator::core::package::digest(&big).as_str());
    assert_eq!(response.bytes().await.unwrap().as_ref(), big.as_slice(), "the script's copy of the uploaded file");
    assert_eq!(get(&mallory_token, &n.a).await.unwrap().status(), 404);
    assert_eq!(get(&alice_token, &n.b).await.unwrap().status(), 404);
    // And skill_job_read over MCP points to the route for it.
    let read =
        a.call("tools/call", json!({ "name": "skill_job_read", "arguments": { "job": draft_id, "path": "big.out", "limit": 16 } })).await;
    let download = read["result"]["structuredContent"]["download"].as_str().unwrap_or_else(|| panic!("a download URL: {read}"));
    assert_eq!(download, format!("/files/{}/{draft_id}/big.out", n.a));
    let status = a.call("tools/call", json!({ "name": "skill_job_status", "arguments": { "job": draft_id } })).await;
    let files = status["result"]["structuredContent"]["outputs"]["files"].as_array().unwrap_or_else(|| panic!("outputs: {status}"));
    let out = files.iter().find(|f| f["path"] == "big.out").unwrap_or_else(|| panic!("big.out listed: {status}"));
    assert_eq!(out["download"], download, "the listing names the route for a file over one call's worth");

    server.abort();
    setup.teardown().await;
}
