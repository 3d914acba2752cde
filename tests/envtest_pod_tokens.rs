//! Gated suite: the artifact endpoint accepting run pods' projected
//! ServiceAccount tokens (`artifacts --pod-tokens`), verified by TokenReview
//! on a real API server (`KUBEBUILDER_ASSETS`, as tests/envtest.rs). Without
//! the assets it prints SKIPPED and checks nothing.
//!
//! Tokens are minted with the TokenRequest API for Pod objects that no
//! kubelet runs (the API server binds a token to a pod object, not to a
//! running container). The endpoint runs in-process on its built-in store.
//!
//! What it tries to break: a job's token used on another job's routes or for
//! an action its role lacks, tokens of the wrong ServiceAccount, of the run
//! account in another namespace, of no pod, of a deleted pod, with the API
//! server's own audience; an endpoint without `--pod-tokens`; an API server
//! that cannot be reached (503, never a pass); and the cache (one review for
//! many requests with one token).

#[path = "envtest/harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::path::Path;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use serde_json::json;

use skill_operator::artifacts::client::{self, Endpoint, UploadOptions};
use skill_operator::artifacts::server::pod_tokens::PodTokens;
use skill_operator::artifacts::server::{self, AppState, ServerConfig};
use skill_operator::artifacts::{self, pod_token_audience, ErrorBody, POD_TOKEN_EXPIRATION_SECS, RUN_SERVICE_ACCOUNT};
use skill_operator::core::package;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef-pod-tokens";
const NS: &str = "team-a";
const OTHER_NS: &str = "team-b";
/// Another ServiceAccount of [`NS`], as a script's own pod might use.
const OTHER_SA: &str = "builder";
const U: &str = "job-u-0001";
const V: &str = "job-v-0002";

struct ArtifactEndpoint {
    addr: SocketAddr,
    http: reqwest::Client,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

async fn start_endpoint(pod_tokens: Option<PodTokens>) -> ArtifactEndpoint {
    let (store, spool) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut cfg = ServerConfig::with_store(store.path(), KEY.to_vec());
    cfg.seed_samples = false;
    cfg.spool_dir = Some(spool.path().into());
    cfg.pod_tokens = pod_tokens;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    cfg.use_store(addr);
    let state = AppState::new(cfg).unwrap();
    tokio::spawn(server::serve(listener, state, std::future::pending()));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    ArtifactEndpoint { addr, http, _dirs: (store, spool) }
}

/// An answer: status, error code and message (empty for a success).
#[derive(Debug)]
struct Answer {
    status: u16,
    code: String,
    message: String,
}

impl ArtifactEndpoint {
    fn base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    async fn send(&self, method: reqwest::Method, ns: &str, uid: &str, tail: &str, auth: &str, body: Vec<u8>) -> Answer {
        let url = format!("{}/jobs/{ns}/{uid}/{tail}", self.base());
        let resp = self.http.request(method, url).header("authorization", auth).body(body).send().await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) if status >= 400 => Answer { status, code: e.error.code, message: e.error.message },
            _ => Answer { status, code: String::new(), message: String::new() },
        }
    }

    async fn get_package(&self, ns: &str, uid: &str, auth: &str) -> Answer {
        self.send(reqwest::Method::GET, ns, uid, "package", auth, Vec::new()).await
    }

    async fn stage_package(&self, ns: &str, uid: &str) {
        let pkg = package::build_from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills/csv-stats")).unwrap();
        let staged = self.send(reqwest::Method::PUT, ns, uid, "package", &artifacts::operator_bearer(KEY), pkg).await;
        assert_eq!(staged.status, 200, "staging {ns}/{uid}'s package: {staged:?}");
    }
}

fn named(ns: &str, uid: &str, token: &str) -> String {
    artifacts::job_bearer(ns, uid, token)
}

fn bare(token: &str) -> String {
    format!("Bearer {token}")
}

#[track_caller]
fn refused(answer: &Answer, status: u16, says: &str, what: &str) {
    assert_eq!(answer.status, status, "{what}: {answer:?}");
    assert!(answer.message.contains(says), "{what}: the message should say {says:?}: {answer:?}");
}

async fn service_account(client: &Client, ns: &str, name: &str) {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    harness::create(&api, json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": name, "namespace": ns } })).await;
}

/// A Pod object running as `sa` (never scheduled: there is no kubelet).
async fn pod(client: &Client, ns: &str, name: &str, sa: &str) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    harness::create(
        &api,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": ns },
            "spec": {
                "serviceAccountName": sa,
                "automountServiceAccountToken": false,
                "containers": [{ "name": "run", "image": "registry.local/run@sha256:0000000000000000000000000000000000000000000000000000000000000000" }]
            }
        }),
    )
    .await
}

/// A token of `sa` in `ns` for `audiences` (empty: the API server's own),
/// bound to `bound` when given, as the kubelet would project it.
async fn mint(client: &Client, ns: &str, sa: &str, audiences: &[String], bound: Option<&Pod>) -> String {
    let bound_object_ref = bound.map(
        |p| json!({ "apiVersion": "v1", "kind": "Pod", "name": p.metadata.name.clone().unwrap(), "uid": p.metadata.uid.clone().unwrap() }),
    );
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": { "audiences": audiences, "boundObjectRef": bound_object_ref, "expirationSeconds": POD_TOKEN_EXPIRATION_SECS }
    }))
    .unwrap();
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let answer = api.create_token_request(sa, &PostParams::default(), &request).await.expect("the API server minted the token");
    answer.status.and_then(|s| s.token).expect("the TokenRequest answered a token")
}

/// A client of an API server that is not there (nothing listens on port 1).
fn unreachable_client() -> Client {
    let mut config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    config.connect_timeout = Some(std::time::Duration::from_secs(2));
    Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_tokens_on_a_real_api_server() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the pod token suite", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    skill_operator::tls::install_crypto_provider();
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    for ns in [NS, OTHER_NS] {
        harness::create_namespace(&client, ns, false).await;
        service_account(&client, ns, RUN_SERVICE_ACCOUNT).await;
    }
    service_account(&client, NS, OTHER_SA).await;
    let run_pod = pod(&client, NS, "run-u", RUN_SERVICE_ACCOUNT).await;
    let audience_u = vec![pod_token_audience(NS, U)];
    let token_u = mint(&client, NS, RUN_SERVICE_ACCOUNT, &audience_u, Some(&run_pod)).await;
    assert!(token_u.len() > 1024, "a projected token is over the old client bound of 1 KiB (it is {} bytes)", token_u.len());

    let pod_tokens = PodTokens::new(client.clone());
    let ep = start_endpoint(Some(pod_tokens.clone())).await;
    ep.stage_package(NS, U).await;
    ep.stage_package(NS, V).await;

    // The job's own pod token: its package, in both credential forms.
    let got = ep.get_package(NS, U, &named(NS, U, &token_u)).await;
    assert_eq!(got.status, 200, "U's pod token fetching U's package: {got:?}");
    let got = ep.get_package(NS, U, &bare(&token_u)).await;
    assert_eq!(got.status, 200, "U's pod token as a bare bearer: {got:?}");

    // Its outputs, by the pod-side client reading the token from a file.
    let pod_dir = tempfile::tempdir().unwrap();
    let (work, result, token_file) = (pod_dir.path().join("work"), pod_dir.path().join("result"), pod_dir.path().join("token"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&result).unwrap();
    std::fs::write(work.join("out.txt"), b"done").unwrap();
    std::fs::write(result.join("result.json"), b"{}").unwrap();
    std::fs::write(&token_file, format!("{token_u}\n")).unwrap();
    let endpoint = Endpoint::with_token_file(ep.base(), NS, U, &token_file).unwrap();
    let mut upload = UploadOptions::new(endpoint, work, result.join("result.json"));
    upload.patience = std::time::Duration::ZERO;
    let report = client::upload(&upload, &skill_operator::shutdown::Shutdown::new()).await;
    let report = report.expect("U's pod token uploads U's outputs").expect("the result file is there");
    assert!(report.manifest.files.iter().any(|f| f.path == "work/out.txt"), "{:?}", report.manifest.files);

    // Another job's routes: named as U (genuine, wrong job: 403), named as
    // V or bare (the API server refuses V's audience: 401).
    refused(&ep.get_package(NS, V, &named(NS, U, &token_u)).await, 403, "this token belongs to another job", "U's token on V's route");
    refused(
        &ep.get_package(NS, V, &named(NS, V, &token_u)).await,
        401,
        "did not accept the ServiceAccount token",
        "U's token named as V's",
    );
    refused(&ep.get_package(NS, V, &bare(&token_u)).await, 401, "did not accept the ServiceAccount token", "U's token bare on V's route");
    let upload_v = ep.send(reqwest::Method::PUT, NS, V, "outputs", &named(NS, U, &token_u), b"not a tar".to_vec()).await;
    refused(&upload_v, 403, "this token belongs to another job", "U's token writing V's outputs");

    // Its own job, beyond its role.
    let restage = ep.send(reqwest::Method::PUT, NS, U, "package", &named(NS, U, &token_u), b"x".to_vec()).await;
    refused(&restage, 403, "nothing else", "U's pod token writing U's package");
    let outputs = ep.send(reqwest::Method::GET, NS, U, "outputs", &named(NS, U, &token_u), Vec::new()).await;
    refused(&outputs, 403, "nothing else", "U's pod token reading U's outputs");

    // Tokens that are genuine but not a run pod's of this job.
    let builder_pod = pod(&client, NS, "builder", OTHER_SA).await;
    let other_sa = mint(&client, NS, OTHER_SA, &audience_u, Some(&builder_pod)).await;
    refused(
        &ep.get_package(NS, U, &named(NS, U, &other_sa)).await,
        401,
        &format!("\"system:serviceaccount:{NS}:{OTHER_SA}\"'s"),
        "another ServiceAccount's token",
    );
    let elsewhere_pod = pod(&client, OTHER_NS, "run-elsewhere", RUN_SERVICE_ACCOUNT).await;
    let elsewhere = mint(&client, OTHER_NS, RUN_SERVICE_ACCOUNT, &audience_u, Some(&elsewhere_pod)).await;
    refused(
        &ep.get_package(NS, U, &named(NS, U, &elsewhere)).await,
        401,
        &format!("\"system:serviceaccount:{OTHER_NS}:{RUN_SERVICE_ACCOUNT}\"'s"),
        "the run ServiceAccount's token of another namespace",
    );
    let unbound = mint(&client, NS, RUN_SERVICE_ACCOUNT, &audience_u, None).await;
    refused(&ep.get_package(NS, U, &named(NS, U, &unbound)).await, 401, "not bound to a pod", "a token bound to no pod");
    let own_audience = mint(&client, NS, RUN_SERVICE_ACCOUNT, &[], Some(&run_pod)).await;
    refused(
        &ep.get_package(NS, U, &named(NS, U, &own_audience)).await,
        401,
        "did not accept the ServiceAccount token",
        "a token with the API server's audience",
    );

    // A pod deleted before its token was first used: the token dies with it.
    let doomed = pod(&client, NS, "run-doomed", RUN_SERVICE_ACCOUNT).await;
    let orphan = mint(&client, NS, RUN_SERVICE_ACCOUNT, &audience_u, Some(&doomed)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("run-doomed", &DeleteParams::default().grace_period(0)).await.unwrap();
    harness::wait_for(|| async { pods.get_opt("run-doomed").await.ok()?.is_none().then_some(()) }, "the doomed pod to be gone").await;
    refused(&ep.get_package(NS, U, &named(NS, U, &orphan)).await, 401, "did not accept the ServiceAccount token", "a deleted pod's token");

    // Not a JWT at all: refused without asking the API server.
    let before = pod_tokens.stats().reviews;
    refused(&ep.get_package(NS, U, &named(NS, U, "not-a-token")).await, 401, "invalid job token", "garbage");
    assert_eq!(pod_tokens.stats().reviews, before, "garbage was sent to the API server");

    // The same valid token on an endpoint without --pod-tokens.
    let plain = start_endpoint(None).await;
    plain.stage_package(NS, U).await;
    refused(
        &plain.get_package(NS, U, &named(NS, U, &token_u)).await,
        401,
        "this endpoint does not accept ServiceAccount tokens; start it with --pod-tokens",
        "an endpoint without --pod-tokens",
    );

    // An API server that cannot be asked: 503, which the pods retry.
    let cut_off = start_endpoint(Some(PodTokens::new(unreachable_client()))).await;
    cut_off.stage_package(NS, U).await;
    let answer = cut_off.get_package(NS, U, &named(NS, U, &token_u)).await;
    refused(&answer, 503, "creating a tokenreviews.authentication.k8s.io failed", "an unreachable API server");
    assert_eq!(answer.code, "unavailable", "{answer:?}");
    let again = cut_off.get_package(NS, U, &named(NS, U, &token_u)).await;
    assert_eq!(again.status, 503, "a failure to ask is not cached as a pass: {again:?}");

    // The cache: many requests with one token, at once and after, cost one review.
    let counted = PodTokens::new(client.clone());
    let cached = start_endpoint(Some(counted.clone())).await;
    cached.stage_package(NS, U).await;
    let auth = named(NS, U, &token_u);
    let burst = futures::future::join_all((0..8).map(|_| cached.get_package(NS, U, &auth))).await;
    assert!(burst.iter().all(|a| a.status == 200), "{burst:?}");
    for _ in 0..8 {
        assert_eq!(cached.get_package(NS, U, &auth).await.status, 200);
    }
    let stats = counted.stats();
    assert_eq!(stats.reviews, 1, "16 requests with one token: {stats:?}");
    assert!(stats.cache_hits >= 8, "{stats:?}");
    // The same token on V's route is another audience: another review.
    refused(&cached.get_package(NS, V, &named(NS, V, &token_u)).await, 401, "did not accept", "U's token named as V's");
    assert_eq!(counted.stats().reviews, 2);
}
