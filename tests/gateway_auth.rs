//! The gateway's authentication against a real Kubernetes API server,
//! through the real `require_caller` middleware served by axum on
//! 127.0.0.1 and called over HTTP.
//!
//! Gated on `KUBECONFIG` (prints SKIPPED without it): in a fresh namespace
//! `gw-auth-<random>` it creates a ServiceAccount allowed by a Role (get
//! skillbindings, create/get skilljobs) and one allowed nothing, mints
//! their tokens with the TokenRequest API, and checks what the gateway
//! makes of them: the allowed caller reaches the handler with the user,
//! uid, groups and extra the API server named; the denied one is 403
//! naming the verb; a garbage token and no token are 401. The namespace is
//! deleted afterwards, pass or fail. The identity in KUBECONFIG needs to
//! create namespaces, RBAC objects, tokens, tokenreviews and
//! subjectaccessreviews.
//!
//! One test needs no cluster: an API server that cannot be reached makes
//! the gateway answer 503, never a pass.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use axum::extract::Extension;
use axum::http::HeaderMap;
use axum::routing::any;
use axum::Router;
use futures::FutureExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use skill_operator::gateway::auth::{self, AuthConfig, Authenticator};
use skill_operator::mcp::executor::Caller;
use skill_operator::mcp::state::Action;

const ALLOWED: &str = "gw-auth-allowed";
const DENIED: &str = "gw-auth-denied";
const AUDIENCE: &str = "gw-auth-test";

/// Shows what the middleware let through.
async fn echo(Extension(caller): Extension<Caller>, headers: HeaderMap) -> axum::Json<Value> {
    axum::Json(json!({
        "principal": caller.principal, "uid": caller.uid, "groups": caller.groups, "extra": caller.extra,
        "authorization_forwarded": headers.contains_key("authorization"),
    }))
}

/// The gateway's auth in front of a dummy handler, on a loopback port.
async fn serve(authenticator: Authenticator) -> SocketAddr {
    let app = Router::new()
        .route("/mcp/{namespace}", any(echo))
        .route("/files/{namespace}/{*rest}", any(echo))
        .route_layer(axum::middleware::from_fn_with_state(authenticator.clone(), auth::require_caller))
        .merge(auth::metadata_routes(authenticator));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().expect("an HTTP client")
}

async fn get(url: &str, token: Option<&str>) -> (u16, HeaderMap, Value) {
    let mut request = http().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("the gateway answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("a body");
    (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test]
async fn an_api_server_that_cannot_be_reached_is_503_not_a_pass() {
    // A port nobody listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a loopback port");
    let config = kube::Config::new(format!("http://{closed}").parse().expect("a URL"));
    let client = Client::try_from(config).expect("a client");
    let addr = serve(Authenticator::new(client, AuthConfig::default())).await;
    let (status, headers, body) = get(&format!("http://{addr}/mcp/team"), Some("some-token")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(headers["retry-after"], "5");
    assert_eq!(body["error"]["code"], "backend-unavailable");
    // Without a token nothing needs asking: still the 401 challenge.
    let (status, _, _) = get(&format!("http://{addr}/mcp/team"), None).await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_token_and_access_reviews_through_the_middleware() {
    let what = "gateway auth against the real API server";
    if std::env::var_os("KUBECONFIG").is_none() {
        skill_operator::gated::skip(what, "KUBECONFIG is not set");
        return;
    }
    let client = match Client::try_default().await {
        Ok(client) => client,
        Err(err) => {
            skill_operator::gated::skip(what, &format!("KUBECONFIG gives no client: {err}"));
            return;
        }
    };
    let ns = format!("gw-auth-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap();
    namespaces.create(&PostParams::default(), &namespace).await.expect("create the test namespace");
    let outcome = AssertUnwindSafe(scenario(client.clone(), &ns)).catch_unwind().await;
    if let Err(err) = namespaces.delete(&ns, &DeleteParams::background()).await {
        eprintln!("could not delete namespace {ns}: {err}");
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn scenario(client: Client, ns: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let mut uids = BTreeMap::new();
    for name in [ALLOWED, DENIED] {
        let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
        let created = accounts.create(&PostParams::default(), &sa).await.expect("create a ServiceAccount");
        uids.insert(name, created.metadata.uid.expect("a uid"));
    }
    let group = skill_operator::api::GROUP;
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "gw-auth-agent" },
        "rules": [
            { "apiGroups": [group], "resources": ["skillbindings"], "verbs": ["get"] },
            { "apiGroups": [group], "resources": ["skilljobs"], "verbs": ["create", "get"] },
        ],
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), ns).create(&PostParams::default(), &role).await.expect("create the Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "gw-auth-agent" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gw-auth-agent" },
        "subjects": [{ "kind": "ServiceAccount", "name": ALLOWED, "namespace": ns }],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns).create(&PostParams::default(), &binding).await.expect("create the RoleBinding");
    wait_for_rbac(&client, ns).await;

    let mint = |name: &'static str, audiences: Vec<String>| {
        let accounts = accounts.clone();
        async move {
            let request: TokenRequest =
                serde_json::from_value(json!({ "spec": { "audiences": audiences, "expirationSeconds": 600 } })).unwrap();
            let answer = accounts.create_token_request(name, &PostParams::default(), &request).await.expect("a token");
            let answer = serde_json::to_value(answer).unwrap();
            answer["status"]["token"].as_str().expect("a token in the answer").to_string()
        }
    };
    let allowed_token = mint(ALLOWED, vec![]).await;
    let denied_token = mint(DENIED, vec![]).await;
    let audience_token = mint(ALLOWED, vec![AUDIENCE.to_string()]).await;

    let authenticator = Authenticator::new(client.clone(), AuthConfig::default());
    let addr = serve(authenticator.clone()).await;
    let endpoint = format!("http://{addr}/mcp/{ns}");

    // Allowed: the handler sees who the API server says the token is.
    let (status, _, body) = get(&endpoint, Some(&allowed_token)).await;
    assert_eq!(status, 200, "{body}");
    let user = format!("system:serviceaccount:{ns}:{ALLOWED}");
    assert_eq!(body["principal"], user.as_str());
    assert_eq!(body["uid"], uids[ALLOWED].as_str(), "the ServiceAccount's uid");
    let groups: Vec<&str> = body["groups"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for expected in ["system:serviceaccounts", &format!("system:serviceaccounts:{ns}"), "system:authenticated"] {
        assert!(groups.contains(&expected), "{groups:?} lacks {expected}");
    }
    assert!(body["extra"].is_object(), "{body}");
    assert_eq!(body["authorization_forwarded"], false);
    // The file route is gated the same way.
    let (status, _, _) = get(&format!("http://{addr}/files/{ns}/jobs/x/outputs/a.txt"), Some(&allowed_token)).await;
    assert_eq!(status, 200);
    // Both answers were cached: one TokenReview, one review of `get skillbindings`.
    let stats = authenticator.stats();
    assert_eq!((stats.token_reviews, stats.access_reviews), (1, 1), "{stats:?}");

    // Denied: a valid token, no permission in the namespace.
    let (status, _, body) = get(&endpoint, Some(&denied_token)).await;
    assert_eq!(status, 403, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("may not get skillbindings.{group} in namespace {ns}")), "{message}");
    assert!(message.contains(&format!("--serviceaccount={ns}:{DENIED}")), "{message}");
    // Allowed here is not allowed elsewhere.
    let (status, _, _) = get(&format!("http://{addr}/mcp/default"), Some(&allowed_token)).await;
    assert_eq!(status, 403);

    // A garbage token, and none at all.
    let (status, headers, _) = get(&endpoint, Some("not-a-token")).await;
    assert_eq!(status, 401);
    assert!(headers["www-authenticate"].to_str().unwrap().ends_with(", error=\"invalid_token\""));
    let (status, headers, _) = get(&endpoint, None).await;
    assert_eq!(status, 401);
    let metadata = format!("http://{addr}/.well-known/oauth-protected-resource/mcp/{ns}");
    assert_eq!(headers["www-authenticate"], format!("Bearer resource_metadata=\"{metadata}\"").as_str());
    let (status, _, doc) = get(&metadata, None).await;
    assert_eq!(status, 200);
    assert_eq!(doc["resource"], endpoint.as_str());

    // A token for another audience is not the API server's, and the reverse.
    let (status, _, _) = get(&endpoint, Some(&audience_token)).await;
    assert_eq!(status, 401, "a token minted for {AUDIENCE} is refused where no audience is configured");
    let for_audience = Authenticator::new(client.clone(), AuthConfig { audiences: vec![AUDIENCE.into()], ..AuthConfig::default() });
    let audience_addr = serve(for_audience).await;
    let (status, _, body) = get(&format!("http://{audience_addr}/mcp/{ns}"), Some(&audience_token)).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, _) = get(&format!("http://{audience_addr}/mcp/{ns}"), Some(&allowed_token)).await;
    assert_eq!(status, 401, "a token for the API server is refused where {AUDIENCE} is required");

    // Per tool call: the allowed caller may run and read jobs, not delete them.
    let caller = authenticator.authenticate(Some(&format!("Bearer {allowed_token}").parse().unwrap())).await.expect("verified");
    let authorizer = authenticator.namespace_authorizer(ns);
    for action in [Action::ReadSkills, Action::Run, Action::ReadJobs] {
        assert!(authorizer.authorize(&caller, action).await.is_ok(), "{action:?}");
    }
    let err = authorizer.authorize(&caller, Action::DeleteJobs).await.unwrap_err();
    assert_eq!(err.code, "forbidden");
    assert!(err.message.contains(&format!("may not delete skilljobs.{group} in namespace {ns}")), "{}", err.message);
}

/// A new RoleBinding reaches the API server's authorizer through its
/// informer, a moment after the create returns, and there is nothing to
/// watch for it: ask until it answers yes (bounded), so the gateway's
/// negative cache never sees the gap.
async fn wait_for_rbac(client: &Client, ns: &str) {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:{ALLOWED}")),
            groups: Some(vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}"), "system:authenticated".into()]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(skill_operator::api::GROUP.into()),
                namespace: Some(ns.into()),
                verb: Some("create".into()),
                resource: Some("skilljobs".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = reviews.create(&PostParams::default(), &review).await.expect("a SubjectAccessReview");
        if answer.status.is_some_and(|s| s.allowed) {
            return;
        }
        assert!(Instant::now() < deadline, "the RoleBinding in {ns} did not take effect within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
