//! Request sequencing against kube's tower-test mock API server
//! (`mock::pair`): which TokenReviews and SubjectAccessReviews the gateway
//! sends, with exactly which bodies, and how often (caches, single-flight,
//! failures never cached). The mock stands in for the API server only to
//! see and order those requests; what a real API server answers is the
//! gated suite `tests/gateway_auth.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::extract::Extension;
use axum::http::{header, HeaderMap, HeaderValue, Request as HttpRequest, StatusCode};
use axum::routing::any;
use axum::Router;
use http::{Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;
use crate::mcp::executor::Caller;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Send = tower_test::mock::SendResponse<Response<Body>>;

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

fn authenticator(config: AuthConfig) -> (Authenticator, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Authenticator::new(Client::new(service, "default"), config), handle)
}

/// The next request the gateway sends: its path, its JSON body and where
/// to send the answer. Fails when none comes.
async fn next(handle: &mut Handle) -> (String, Value, Send) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request to the API server")
        .expect("the client is alive");
    assert_eq!(request.method(), http::Method::POST);
    let path = request.uri().path().to_string();
    let bytes = request.into_body().collect_bytes().await.expect("a body");
    (path, serde_json::from_slice(&bytes).expect("a JSON body"), send)
}

/// Nothing more was sent (time is paused: an idle runtime jumps ahead).
async fn assert_no_request(handle: &mut Handle) {
    if let Ok(Some((request, _))) = tokio::time::timeout(Duration::from_secs(1), handle.next_request()).await {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
}

fn reply(status: u16, body: Value) -> Response<Body> {
    Response::builder().status(status).body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap()
}

fn api_status(code: u16, message: &str) -> Response<Body> {
    reply(code, json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code }))
}

fn token_review_body(token: &str, audiences: Option<&[&str]>) -> Value {
    let mut spec = json!({ "token": token });
    if let Some(audiences) = audiences {
        spec["audiences"] = json!(audiences);
    }
    json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {}, "spec": spec })
}

fn authenticated(user: &Caller, audiences: &[&str]) -> Response<Body> {
    let mut status = json!({
        "authenticated": true,
        "user": { "username": user.principal, "uid": user.uid, "groups": user.groups, "extra": user.extra },
    });
    if !audiences.is_empty() {
        status["audiences"] = json!(audiences);
    }
    reply(201, json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {}, "spec": {}, "status": status }))
}

fn refused(error: &str) -> Response<Body> {
    reply(
        201,
        json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {}, "spec": {},
                "status": { "authenticated": false, "error": error } }),
    )
}

fn access(allowed: bool, reason: &str) -> Response<Body> {
    reply(
        201,
        json!({ "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {}, "spec": {},
                "status": { "allowed": allowed, "reason": reason } }),
    )
}

fn agent() -> Caller {
    Caller {
        principal: "system:serviceaccount:team:agent".into(),
        uid: Some("5d6b7e1c-0000-4000-8000-000000000001".into()),
        groups: vec!["system:serviceaccounts".into(), "system:serviceaccounts:team".into(), "system:authenticated".into()],
        extra: BTreeMap::from([
            ("authentication.kubernetes.io/credential-id".to_string(), vec!["JTI=abc".to_string()]),
            ("authentication.kubernetes.io/pod-name".to_string(), vec!["agent-0".to_string()]),
        ]),
    }
}

fn bearer(token: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("Bearer {token}")).unwrap()
}

/// The SubjectAccessReview body the gateway must send for `caller`.
fn access_review_body(caller: &Caller, namespace: &str, verb: &str, resource: &str) -> Value {
    let mut spec = json!({
        "user": caller.principal,
        "groups": caller.groups,
        "extra": caller.extra,
        "resourceAttributes": { "group": "skill-operator.dev", "namespace": namespace, "verb": verb, "resource": resource },
    });
    if let Some(uid) = &caller.uid {
        spec["uid"] = json!(uid);
    }
    json!({ "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {}, "spec": spec })
}

#[tokio::test(start_paused = true)]
async fn one_token_review_per_token_within_its_ttl() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    let header = bearer("token-one");
    let (first, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        let (path, body, send) = next(&mut handle).await;
        assert_eq!(path, TOKEN_REVIEWS);
        assert_eq!(body, token_review_body("token-one", None));
        send.send_response(authenticated(&agent(), &[]));
    });
    assert_eq!(first, Ok(agent()), "every attribute of the user is carried: name, uid, groups, extra");
    // Within the TTL: the same caller, and nothing sent.
    tokio::time::advance(DEFAULT_TOKEN_TTL - Duration::from_secs(1)).await;
    assert_eq!(auth.authenticate(Some(&header)).await, Ok(agent()));
    assert_no_request(&mut handle).await;
    // Another token is its own review.
    let other = bearer("token-two");
    let (second, ()) = tokio::join!(auth.authenticate(Some(&other)), async {
        let (_, body, send) = next(&mut handle).await;
        assert_eq!(body, token_review_body("token-two", None));
        send.send_response(authenticated(&Caller::named("bob"), &[]));
    });
    assert_eq!(second.map(|c| c.principal), Ok("bob".to_string()));
    // After the TTL the first token is reviewed again (a revocation bites).
    tokio::time::advance(Duration::from_secs(1)).await;
    let (again, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        let (_, body, send) = next(&mut handle).await;
        assert_eq!(body, token_review_body("token-one", None));
        send.send_response(refused("token has been invalidated"));
    });
    assert!(matches!(again, Err(AuthError::InvalidToken(ref m)) if m.contains("token has been invalidated")), "{again:?}");
    assert_eq!(auth.stats(), AuthStats { token_reviews: 3, token_cache_hits: 1, access_reviews: 0, access_cache_hits: 0 });
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_requests_with_one_new_token_make_one_review() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    let requests: Vec<_> = (0..100)
        .map(|_| {
            let auth = auth.clone();
            tokio::spawn(async move { auth.authenticate(Some(&bearer("burst-token"))).await })
        })
        .collect();
    let (_, body, send) = next(&mut handle).await;
    assert_eq!(body, token_review_body("burst-token", None));
    // Answer only once all hundred wait on this one review, so none of
    // them can have been served by the cache instead.
    let mut spins = 0;
    while auth.token_waiters("burst-token") < 100 {
        spins += 1;
        assert!(spins < 100_000, "only {} requests wait on the review: the others are not sharing it", auth.token_waiters("burst-token"));
        tokio::task::yield_now().await;
    }
    send.send_response(authenticated(&agent(), &[]));
    for request in requests {
        assert_eq!(request.await.unwrap(), Ok(agent()));
    }
    assert_no_request(&mut handle).await;
    assert_eq!(auth.stats().token_reviews, 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_token_stays_refused_for_the_negative_ttl_only() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    let header = bearer("garbage");
    let (first, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(refused("invalid bearer token"));
    });
    let Err(AuthError::InvalidToken(message)) = first else { panic!("{first:?}") };
    assert!(message.contains("kubectl create token"), "{message}");
    tokio::time::advance(DEFAULT_NEGATIVE_TTL - Duration::from_millis(1)).await;
    assert_eq!(auth.authenticate(Some(&header)).await, Err(AuthError::InvalidToken(message)));
    assert_no_request(&mut handle).await;
    // The negative TTL is much shorter than the positive one: a token the
    // API server starts accepting works again within seconds.
    tokio::time::advance(Duration::from_millis(1)).await;
    let (later, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(authenticated(&agent(), &[]));
    });
    assert_eq!(later, Ok(agent()));
}

#[tokio::test(start_paused = true)]
async fn audiences_are_asked_for_and_the_answer_must_match_one() {
    let config = AuthConfig { audiences: vec!["skill-gateway".into(), "other".into()], ..AuthConfig::default() };
    let (auth, mut handle) = authenticator(config);
    let (wrong_token, right_token) = (bearer("t-wrong"), bearer("t-right"));
    let (wrong, ()) = tokio::join!(auth.authenticate(Some(&wrong_token)), async {
        let (_, body, send) = next(&mut handle).await;
        assert_eq!(body, token_review_body("t-wrong", Some(&["skill-gateway", "other"])));
        // An API server that did not check audiences answers none.
        send.send_response(authenticated(&agent(), &[]));
    });
    assert!(
        matches!(&wrong, Err(AuthError::InvalidToken(m)) if m.contains("not meant for this gateway") && m.contains("--audience=skill-gateway")),
        "{wrong:?}"
    );
    let (right, ()) = tokio::join!(auth.authenticate(Some(&right_token)), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(authenticated(&agent(), &["other"]));
    });
    assert_eq!(right, Ok(agent()));
}

#[tokio::test(start_paused = true)]
async fn every_action_is_one_access_review_with_the_whole_caller() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    let caller = agent();
    for (action, verb, resource) in [
        (Action::ReadSkills, "get", "skillbindings"),
        (Action::Run, "create", "skilljobs"),
        (Action::ReadJobs, "get", "skilljobs"),
        (Action::DeleteJobs, "delete", "skilljobs"),
    ] {
        let (decision, ()) = tokio::join!(auth.authorize_action(&caller, "team", action), async {
            let (path, body, send) = next(&mut handle).await;
            assert_eq!(path, ACCESS_REVIEWS);
            assert_eq!(body, access_review_body(&caller, "team", verb, resource), "{action:?}");
            send.send_response(access(true, "RBAC: allowed by RoleBinding"));
        });
        assert_eq!(decision, Ok(()));
    }
    // Each answer is reused within the decision TTL...
    for action in [Action::ReadSkills, Action::Run, Action::ReadJobs, Action::DeleteJobs] {
        assert_eq!(auth.authorize_action(&caller, "team", action).await, Ok(()));
    }
    assert_no_request(&mut handle).await;
    // ...but never for another namespace, or a caller differing in any
    // attribute (here: one group fewer, or no uid).
    let fewer_groups = Caller { groups: caller.groups[1..].to_vec(), ..caller.clone() };
    let no_uid = Caller { uid: None, ..caller.clone() };
    for (who, namespace) in [(&caller, "elsewhere"), (&fewer_groups, "team"), (&no_uid, "team")] {
        let (decision, ()) = tokio::join!(auth.authorize_action(who, namespace, Action::Run), async {
            let (_, body, send) = next(&mut handle).await;
            assert_eq!(body, access_review_body(who, namespace, "create", "skilljobs"));
            send.send_response(access(false, ""));
        });
        assert!(matches!(decision, Err(AuthError::Forbidden { .. })), "{decision:?}");
    }
    // After the TTL the allowed answer is asked again (a removed RoleBinding bites).
    tokio::time::advance(DEFAULT_DECISION_TTL).await;
    let (again, ()) = tokio::join!(auth.authorize_action(&caller, "team", Action::Run), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(access(false, "no RBAC policy matched"));
    });
    assert!(matches!(again, Err(AuthError::Forbidden { ref reason, .. }) if reason == "no RBAC policy matched"), "{again:?}");
    assert_eq!(auth.stats().access_reviews, 8);
    assert_eq!(auth.stats().access_cache_hits, 4);
}

#[tokio::test(start_paused = true)]
async fn searching_the_catalog_is_asked_cluster_wide_from_any_namespace() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    let caller = agent();
    let mut cluster_wide = access_review_body(&caller, "", "create", "skillpackages");
    cluster_wide["spec"]["resourceAttributes"].as_object_mut().unwrap().remove("namespace");
    let team = auth.namespace_authorizer("team");
    let (denied, ()) = tokio::join!(team.authorize(&caller, Action::SearchCatalog), async {
        let (path, body, send) = next(&mut handle).await;
        assert_eq!(path, ACCESS_REVIEWS);
        assert_eq!(body, cluster_wide, "no namespace: the review is cluster-wide");
        send.send_response(access(false, ""));
    });
    let err = denied.unwrap_err();
    assert_eq!(err.code, crate::mcp::error::codes::FORBIDDEN);
    assert!(err.message.contains("may not create skillpackages.skill-operator.dev cluster-wide"), "{}", err.message);
    assert!(err.message.contains("kubectl create clusterrole skill-create-skillpackages"), "{}", err.message);
    // One answer for every namespace's path: it is the same question.
    assert!(auth.namespace_authorizer("elsewhere").authorize(&caller, Action::SearchCatalog).await.is_err());
    assert_no_request(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn a_denial_names_the_verb_and_resource_and_is_kept_briefly() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    let authorizer = auth.namespace_authorizer("team");
    let agent = agent();
    let (denied, ()) = tokio::join!(authorizer.authorize(&agent, Action::DeleteJobs), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(access(false, ""));
    });
    let err = denied.unwrap_err();
    assert_eq!(err.code, crate::mcp::error::codes::FORBIDDEN);
    assert!(err.message.contains("may not delete skilljobs.skill-operator.dev in namespace team"), "{}", err.message);
    assert!(err.message.contains("--verb=delete --resource=skilljobs.skill-operator.dev"), "{}", err.message);
    assert!(authorizer.authorize(&agent, Action::DeleteJobs).await.is_err());
    assert_no_request(&mut handle).await;
    tokio::time::advance(DEFAULT_NEGATIVE_TTL).await;
    let (granted, ()) = tokio::join!(authorizer.authorize(&agent, Action::DeleteJobs), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(access(true, ""));
    });
    assert!(granted.is_ok());
}

#[tokio::test(start_paused = true)]
async fn an_api_server_that_cannot_answer_is_503_and_never_cached() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    let header = bearer("t");
    // A server error, then the gateway's own missing RBAC, then a broken
    // connection, then no answer at all: each is Unavailable, and each
    // next request asks again.
    let (server_error, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(api_status(500, "etcd leader changed"));
    });
    assert!(matches!(&server_error, Err(AuthError::Unavailable(d)) if d.contains("HTTP 500")), "{server_error:?}");
    let (own_rbac, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(api_status(403, "tokenreviews.authentication.k8s.io is forbidden"));
    });
    assert!(matches!(&own_rbac, Err(AuthError::Unavailable(d)) if d.contains("grant its ServiceAccount `create`")), "{own_rbac:?}");
    let (broken, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_error(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
    });
    assert!(matches!(broken, Err(AuthError::Unavailable(_))), "{broken:?}");
    let (silent, ()) = tokio::join!(auth.authenticate(Some(&header)), async {
        // Hold the answer back past the review timeout.
        let (_, _, send) = next(&mut handle).await;
        tokio::time::sleep(limits::REVIEW_TIMEOUT + Duration::from_secs(1)).await;
        drop(send);
    });
    assert!(matches!(&silent, Err(AuthError::Unavailable(d)) if d.contains("longer than 10 s")), "{silent:?}");
    // Access reviews fail closed the same way.
    let agent = agent();
    let (sar, ()) = tokio::join!(auth.authorize_action(&agent, "team", Action::Run), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(api_status(503, "unavailable"));
    });
    assert!(matches!(sar, Err(AuthError::Unavailable(_))), "{sar:?}");
    let (sar_again, ()) = tokio::join!(auth.authorize_action(&agent, "team", Action::Run), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(access(true, ""));
    });
    assert_eq!(sar_again, Ok(()));
    assert_eq!(auth.stats().token_reviews, 4);
}

// ------------------------------------------------------------ middleware

/// A handler that shows what the middleware let through.
async fn echo(Extension(caller): Extension<Caller>, headers: HeaderMap) -> axum::Json<Value> {
    axum::Json(json!({
        "principal": caller.principal, "uid": caller.uid, "groups": caller.groups, "extra": caller.extra,
        "authorization_forwarded": headers.contains_key(header::AUTHORIZATION),
    }))
}

fn app(auth: &Authenticator) -> Router {
    Router::new()
        .route("/mcp/{namespace}", any(echo))
        .route("/files/{namespace}/{*rest}", any(echo))
        .route_layer(axum::middleware::from_fn_with_state(auth.clone(), require_caller))
        .merge(metadata_routes(auth.clone()))
}

fn get(path: &str, authorization: Option<&str>) -> HttpRequest<AxumBody> {
    let mut request = HttpRequest::builder().uri(path).header(header::HOST, "gw.test:8090");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    request.body(AxumBody::empty()).unwrap()
}

async fn json_body(response: axum::response::Response) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

const CHALLENGE: &str = "Bearer resource_metadata=\"http://gw.test:8090/.well-known/oauth-protected-resource/mcp/team\"";

#[tokio::test(start_paused = true)]
async fn no_token_is_401_with_the_metadata_challenge_and_asks_nothing() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    for path in ["/mcp/team", "/files/team/jobs/x/outputs/a.txt"] {
        let response = app(&auth).oneshot(get(path, None)).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], CHALLENGE);
        assert_eq!(json_body(response).await["error"]["code"], "unauthorized");
    }
    // Another scheme is the same challenge; a malformed bearer is 400.
    let basic = app(&auth).oneshot(get("/mcp/team", Some("Basic dXNlcjpwdw=="))).await.unwrap();
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(basic.headers()[header::WWW_AUTHENTICATE], CHALLENGE);
    let empty = app(&auth).oneshot(get("/mcp/team", Some("Bearer "))).await.unwrap();
    assert_eq!(empty.status(), StatusCode::BAD_REQUEST);
    // A path that cannot be a namespace is 404 before any review.
    let bad = app(&auth).oneshot(get("/mcp/Not_A_Namespace", Some("Bearer t"))).await.unwrap();
    assert_eq!(bad.status(), StatusCode::NOT_FOUND);
    assert_no_request(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn the_middleware_answers_401_403_503_or_passes_the_caller() {
    let (auth, mut handle) = authenticator(AuthConfig::default());
    // A refused token.
    let (response, ()) = tokio::join!(app(&auth).oneshot(get("/mcp/team", Some("Bearer garbage"))), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(refused("invalid bearer token"));
    });
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()[header::WWW_AUTHENTICATE], format!("{CHALLENGE}, error=\"invalid_token\""));
    // A valid token without `get skillbindings` in the namespace: 403 at
    // the HTTP level (initialize never succeeds for them).
    let (response, ()) = tokio::join!(app(&auth).oneshot(get("/mcp/team", Some("Bearer denied"))), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(authenticated(&Caller::named("mallory"), &[]));
        let (path, body, send) = next(&mut handle).await;
        assert_eq!(path, ACCESS_REVIEWS);
        assert_eq!(body, access_review_body(&Caller::named("mallory"), "team", "get", "skillbindings"));
        send.send_response(access(false, ""));
    });
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(!response.headers().contains_key(header::WWW_AUTHENTICATE));
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], "forbidden");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("mallory may not get skillbindings.skill-operator.dev in namespace team."), "{message}");
    // An allowed caller reaches the handler with every attribute, and
    // without the credential.
    let (response, ()) = tokio::join!(app(&auth).oneshot(get("/mcp/team", Some("Bearer good"))), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(authenticated(&agent(), &[]));
        let (_, body, send) = next(&mut handle).await;
        assert_eq!(body, access_review_body(&agent(), "team", "get", "skillbindings"));
        send.send_response(access(true, ""));
    });
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let caller = agent();
    assert_eq!(
        json_body(response).await,
        json!({ "principal": caller.principal, "uid": caller.uid, "groups": caller.groups, "extra": caller.extra, "authorization_forwarded": false })
    );
    // The same caller again: both answers come from the caches.
    let response = app(&auth).oneshot(get("/mcp/team", Some("Bearer good"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_no_request(&mut handle).await;
    // An API server that cannot answer: 503 with Retry-After, never a pass.
    let (response, ()) = tokio::join!(app(&auth).oneshot(get("/mcp/team", Some("Bearer new"))), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(api_status(500, "internal error"));
    });
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "5");
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], "backend-unavailable");
    assert!(!body["error"]["message"].as_str().unwrap().contains("internal error"), "the API server's detail stays in the log");
}

#[tokio::test(start_paused = true)]
async fn anonymous_mode_is_off_unless_enabled_and_still_asks_rbac() {
    // Off (the default): covered above, no token is 401. On:
    let (auth, mut handle) = authenticator(AuthConfig { allow_anonymous: true, ..AuthConfig::default() });
    let anonymous = Caller { groups: vec![ANONYMOUS_GROUP.into()], ..Caller::named(ANONYMOUS_USER) };
    let (response, ()) = tokio::join!(app(&auth).oneshot(get("/mcp/team", None)), async {
        let (path, body, send) = next(&mut handle).await;
        assert_eq!(path, ACCESS_REVIEWS, "no TokenReview for a request without a token");
        assert_eq!(body, access_review_body(&anonymous, "team", "get", "skillbindings"));
        send.send_response(access(false, ""));
    });
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN, "anonymous is only what RBAC grants system:anonymous");
    let (response, ()) = tokio::join!(app(&auth).oneshot(get("/mcp/open", None)), async {
        let (_, _, send) = next(&mut handle).await;
        send.send_response(access(true, ""));
    });
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(json_body(response).await["principal"], "system:anonymous");
    // A token is still verified in anonymous mode: a bad one is 401, not anonymous.
    let (response, ()) = tokio::join!(app(&auth).oneshot(get("/mcp/open", Some("Bearer garbage"))), async {
        let (path, _, send) = next(&mut handle).await;
        assert_eq!(path, TOKEN_REVIEWS);
        send.send_response(refused("invalid bearer token"));
    });
    assert_eq!(response.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_route_without_a_namespace_refuses_rather_than_passes() {
    let (auth, _handle) = authenticator(AuthConfig { allow_anonymous: true, ..AuthConfig::default() });
    let app =
        Router::new().route("/other", any(|| async { "reached" })).route_layer(axum::middleware::from_fn_with_state(auth, require_caller));
    let response = app.oneshot(get("/other", Some("Bearer t"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn the_metadata_is_served_per_namespace() {
    let config = AuthConfig { authorization_servers: vec!["https://oidc.example.com".into()], ..AuthConfig::default() };
    let (auth, _handle) = authenticator(config);
    let response = app(&auth).oneshot(get("/.well-known/oauth-protected-resource/mcp/team", None)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let doc = json_body(response).await;
    assert_eq!(doc["resource"], "http://gw.test:8090/mcp/team");
    assert_eq!(doc["authorization_servers"], json!(["https://oidc.example.com"]));
    assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
    let bad = app(&auth).oneshot(get("/.well-known/oauth-protected-resource/mcp/UPPER", None)).await.unwrap();
    assert_eq!(bad.status(), StatusCode::NOT_FOUND);
    let no_host = HttpRequest::builder().uri("/.well-known/oauth-protected-resource/mcp/team").body(AxumBody::empty()).unwrap();
    assert_eq!(app(&auth).oneshot(no_host).await.unwrap().status(), StatusCode::BAD_REQUEST);
}
