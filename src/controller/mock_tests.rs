//! Request sequencing against kube's tower-test mock API server: the
//! SkillJob reconciler must make exactly the expected calls, in order, and
//! a restarted controller must not create a second Job. (No cluster runs
//! here; the real API server path is the gated envtest suite.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::batch::v1::Job;
use kube::client::Body;
use kube::ResourceExt as _;
use kube::{Client, Resource};
use serde_json::{json, Value};

use super::context::{Context, FetchedPackage, OperatorConfig, PackageResolver};
use super::metrics::Metrics;
use super::skilljob;
use crate::api::job::{SkillJob, SkillJobSpec};
use kube::runtime::controller::Action;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Answers every fetch with a fixed archive (the registry is not the subject here).
struct NoPackages;
impl PackageResolver for NoPackages {
    fn fetch<'a>(
        &'a self,
        _: &'a crate::api::package::OciSource,
    ) -> futures::future::BoxFuture<'a, Result<FetchedPackage, super::context::ResolveError>> {
        Box::pin(async { Ok(FetchedPackage { digest: PACKAGE_DIGEST.into(), archive: vec![1, 2, 3] }) })
    }
}

fn context() -> (Arc<Context>, Handle) {
    context_with(Arc::new(super::context::NoArtifacts))
}

fn context_with(artifacts: Arc<dyn super::context::ArtifactStore>) -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let config = OperatorConfig {
        operator_image: "registry.example/skill-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000".into(),
        operator_image_pull_policy: None,
        artifact_endpoint: "http://10.96.0.10:8443".into(),
        artifact_port: 8443,
        operator_namespace: "skill-system".into(),
        operator_pod_labels: BTreeMap::from([("app.kubernetes.io/name".to_string(), "skill-operator".to_string())]),
        label_namespaces: false,
        token_key: b"test-key".to_vec(),
        host_aliases: Default::default(),
        reconcile_concurrency: 32,
        prepare: Default::default(),
        selector: None,
        egress_proxy: None,
        network_policy: Default::default(),
        leader_election: None,
        warm_budget: crate::core::limits::WARM_NAMESPACE_DEFAULT_BUDGET,
        release_startup_code: false,
        watch_timeout: super::api_client::DEFAULT_WATCH_TIMEOUT_SECS,
    };
    (Arc::new(Context::new(client, Arc::new(Metrics::default()), config, Arc::new(NoPackages), artifacts)), handle)
}

const UID: &str = "0f0e0d0c-0b0a-0908-0706-050403020100";
/// The package every run here pins (the Job builder takes only sha256 digests).
const PACKAGE_DIGEST: &str = "sha256:abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabca";

fn skilljob() -> SkillJob {
    let mut j = SkillJob::new(
        "report",
        SkillJobSpec {
            binding: "weather".into(),
            script: "scripts/forecast.py".into(),
            args: vec!["; rm -rf /".into()],
            inputs: vec![],
            timeout_seconds: None,
        },
    );
    j.metadata.namespace = Some("team".into());
    j.metadata.uid = Some(UID.into());
    j.metadata.generation = Some(1);
    j.metadata.resource_version = Some("41".into());
    j.metadata.finalizers = Some(vec![skilljob::FINALIZER.into()]);
    j
}

/// A SkillJob whose Job the controller has already created.
fn started_skilljob() -> SkillJob {
    let mut sj = skilljob();
    sj.status = Some(crate::api::job::SkillJobStatus { job_name: Some(super::builders::job::job_name(UID)), ..Default::default() });
    sj
}

fn ready(kind: &str) -> Value {
    json!([{ "type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" }])
        .as_array()
        .map(
            |_| json!([{ "type": "Ready", "status": "True", "reason": kind, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" }]),
        )
        .unwrap_or_default()
}

fn binding() -> Value {
    json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
        "metadata": { "name": "weather", "namespace": "team" },
        "spec": { "package": "weather-1", "env": [], "egress": false },
        "status": { "skillName": "weather", "effectiveEnv": [], "ignoredEnv": [], "conditions": ready("Bound") }
    })
}

fn package() -> Value {
    json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage",
        "metadata": { "name": "weather-1" },
        "spec": { "source": { "oci": { "reference": format!("r/weather@{PACKAGE_DIGEST}") } },
                  "runtime": { "interpreter": "python", "image": "python@sha256:1111111111111111111111111111111111111111111111111111111111111111", "allowedScripts": ["scripts/forecast.py"], "timeoutSeconds": 60 } },
        "status": { "digest": PACKAGE_DIGEST, "skillName": "weather", "files": 2, "bytes": 10, "requirements": "unknown",
                    "scripts": [{ "script": "scripts/forecast.py", "interpreter": "python", "env": [], "timeoutSeconds": 30, "allowed": true }],
                    "problems": [], "conditions": ready("Ready") }
    })
}

fn not_found() -> Response<Body> {
    let status =
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found" });
    Response::builder().status(404).body(Body::from(serde_json::to_vec(&status).unwrap())).unwrap()
}

/// Answer a status patch with the object it would produce, one version
/// after the one the write was guarded by.
fn patched(mut body: Value) -> Response<Body> {
    if body.get("spec").is_none() {
        let guard: u64 = body["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).unwrap_or(0);
        let version = (guard + 1).to_string();
        body["metadata"] = json!({ "name": "report", "namespace": "team", "uid": UID, "resourceVersion": version });
        body["spec"] = json!({ "binding": "weather", "script": "scripts/forecast.py" });
    }
    ok(body)
}

fn ok(value: Value) -> Response<Body> {
    Response::builder().body(Body::from(serde_json::to_vec(&value).unwrap())).unwrap()
}

async fn body_json(request: Request<Body>) -> Value {
    let bytes = request.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// Expect one request: method and path prefix; answer it.
async fn expect(handle: &mut Handle, method: &str, path: &str, answer: impl FnOnce(Value) -> Response<Body>) -> Value {
    let (request, send) = tokio::time::timeout(Duration::from_secs(2), handle.next_request())
        .await
        .expect("the reconciler stopped calling the API")
        .expect("service closed");
    assert_eq!(request.method().as_str(), method, "unexpected call {} {}", request.method(), request.uri());
    assert!(request.uri().path().starts_with(path), "expected {method} {path}, got {}", request.uri());
    let body = body_json(request).await;
    send.send_response(answer(body.clone()));
    body
}

/// The namespace's run policy applied (server-side, forced): no cache
/// here, and the mock context has no egress proxy, so one policy.
async fn expect_run_policies(handle: &mut Handle) -> Value {
    expect(handle, "PATCH", "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies/skill-operator-runs", ok).await
}

/// Admission reads the namespace, which enforces `restricted`.
pub(super) async fn expect_restricted_namespace(handle: &mut Handle) {
    expect(handle, "GET", "/api/v1/namespaces/team", |_| {
        ok(json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "team", "labels": { "pod-security.kubernetes.io/enforce": "restricted" } } }))
    })
    .await;
}

/// Admission reads the binding, then its package.
async fn expect_admission_reads(handle: &mut Handle) {
    expect(handle, "GET", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skillbindings/weather", |_| ok(binding())).await;
    expect(handle, "GET", "/apis/skill-operator.dev/v1alpha1/skillpackages/weather-1", |_| ok(package())).await;
}

/// The first start of the term lists the SkillJobs' versions (the start
/// guard's view of the API server); this answers with `versions`, by UID.
pub(super) async fn expect_term_list(handle: &mut Handle, versions: &[(&str, &str)]) {
    let items: Vec<Value> = versions
        .iter()
        .map(|(uid, version)| json!({ "metadata": { "name": "any", "namespace": "team", "uid": uid, "resourceVersion": version } }))
        .collect();
    let list = json!({ "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": { "resourceVersion": "60" }, "items": items });
    expect(handle, "GET", "/apis/skill-operator.dev/v1alpha1/skilljobs", |_| ok(list)).await;
}

/// A start the guard cannot vouch for reads the SkillJob from the API
/// server; this answers with `copy`.
pub(super) async fn expect_skilljob_read(handle: &mut Handle, copy: SkillJob) {
    expect(
        handle,
        "GET",
        "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report",
        |_| ok(serde_json::to_value(copy).unwrap()),
    )
    .await;
}

/// The API server's copy of [`skilljob`], one write (the gateway's
/// inputs-staged annotation, say) ahead of the cached one.
pub(super) fn newer_unstarted_copy() -> SkillJob {
    let mut copy = skilljob();
    copy.metadata.resource_version = Some("42".into());
    copy
}

/// The reconciler makes no further call: the next thing the mock sees is
/// the client going away (the reconcile returned and dropped its context),
/// not a request. No fixed wait: the deadline only bounds a hang.
async fn no_more_calls(handle: &mut Handle) {
    match tokio::time::timeout(Duration::from_secs(10), handle.next_request()).await {
        Ok(None) => {}
        Ok(Some((request, _))) => panic!("unexpected extra call {} {}", request.method(), request.uri()),
        Err(_) => panic!("the client was not dropped within 10 s: the reconcile is stuck"),
    }
}

/// Expect `n` requests in any order (the reconciler sends them together);
/// answer each and return (method, path) of all.
async fn expect_unordered(handle: &mut Handle, n: usize, answer: impl Fn(&str, &str) -> Response<Body>) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let (request, send) = tokio::time::timeout(Duration::from_secs(2), handle.next_request())
            .await
            .expect("the reconciler stopped calling the API")
            .expect("service closed");
        let (method, path) = (request.method().to_string(), request.uri().path().to_string());
        send.send_response(answer(&method, &path));
        seen.push((method, path));
    }
    seen.sort();
    seen
}

#[tokio::test]
async fn first_reconcile_admits_and_creates_children_then_the_job() {
    let (ctx, mut handle) = context();
    let job = Arc::new(skilljob());
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        // No Job recorded yet: no GET of it; a Job that exists would answer the POST with 409.
        expect_admission_reads(&mut handle).await;
        expect_restricted_namespace(&mut handle).await;
        // The API server's copy at the term's start is the cached one: no read of it.
        expect_term_list(&mut handle, &[(UID, "41")]).await;
        let sa = expect(&mut handle, "PATCH", "/api/v1/namespaces/team/serviceaccounts/skill-operator-run", ok).await;
        assert_eq!(sa["automountServiceAccountToken"], false);
        // No Secret: the pod's own projected token is its credential.
        let policy = expect_run_policies(&mut handle).await;
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        let created = expect(&mut handle, "POST", "/apis/batch/v1/namespaces/team/jobs", ok).await;
        let job: Job = serde_json::from_value(created).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some(name.as_str()));
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert!(super::builders::pod_security::restricted_violations(&pod).is_empty());
        let run = pod.containers.iter().find(|c| c.name == "run").unwrap();
        assert!(run.command.iter().chain(run.args.iter()).flatten().any(|a| a == "; rm -rf /"), "args travel as one argv entry");
        // The pod fetches the namespace's copy of the pinned package, and the
        // Job names it so the sweep of staged packages keeps it.
        let fetch = pod.init_containers.as_ref().unwrap().iter().find(|c| c.name == "fetch").unwrap();
        let argv: Vec<&str> = fetch.command.iter().chain(fetch.args.iter()).flatten().map(String::as_str).collect();
        assert!(argv.windows(2).any(|w| w == ["--staged-package", PACKAGE_DIGEST]), "{argv:?}");
        assert_eq!(job.metadata.annotations.unwrap()[super::builders::job::ANNOTATION_PACKAGE_DIGEST], PACKAGE_DIGEST);
        // No Event: the status alone says it.
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Pending");
        assert_eq!(status["status"]["jobName"], json!(name));
        // Guarded by the version of the copy it was derived from.
        assert_eq!(status["metadata"]["resourceVersion"], "41");
    });
    skilljob::reconcile(job, ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

/// A first start whose cached copy (41) the term's list vouches for: no
/// read of it; the namespace's children, the Job, and the status write,
/// answered by `status`.
async fn expect_vouched_first_start(handle: &mut Handle, status: fn(Value) -> Response<Body>) {
    expect_admission_reads(handle).await;
    expect_restricted_namespace(handle).await;
    expect_term_list(handle, &[(UID, "41")]).await;
    expect(handle, "PATCH", "/api/v1/namespaces/team/serviceaccounts/skill-operator-run", ok).await;
    expect_run_policies(handle).await;
    expect(handle, "POST", "/apis/batch/v1/namespaces/team/jobs", ok).await;
    expect(handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", status).await;
}

/// Two runs of one package in a namespace: one staging, never one per run.
#[tokio::test]
async fn a_namespace_stages_a_package_once_for_its_runs() {
    let artifacts = Arc::new(StoredOutputs::default());
    let (ctx, mut handle) = context_with(artifacts.clone());
    const SECOND: &str = "1f0e0d0c-0b0a-0908-0706-050403020100";
    let second = || {
        let mut sj = skilljob();
        sj.metadata.uid = Some(SECOND.into());
        sj
    };
    let server = tokio::spawn(async move {
        expect_vouched_first_start(&mut handle, patched).await;
        // The second run: the namespace's children and its package are remembered.
        // Made after the term's list, and never written: believed as cached.
        expect_admission_reads(&mut handle).await;
        let created = expect(&mut handle, "POST", "/apis/batch/v1/namespaces/team/jobs", ok).await;
        assert_eq!(created["metadata"]["annotations"][super::builders::job::ANNOTATION_PACKAGE_DIGEST], PACKAGE_DIGEST);
        expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
    });
    skilljob::reconcile(Arc::new(skilljob()), ctx.clone()).await.expect("first reconcile");
    skilljob::reconcile(Arc::new(second()), ctx).await.expect("second reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert_eq!(artifacts.staged.lock().unwrap().clone(), vec![format!("namespace team {PACKAGE_DIGEST}")]);
}

/// The cached copy predates the run's recorded start (and its verdict,
/// after which the Job was deleted): a Job created from it would run the
/// script a second time.
/// The API server's copy of [`skilljob`] once its run has its verdict.
fn finished_copy() -> SkillJob {
    let mut finished = newer_unstarted_copy();
    finished.status = Some(crate::api::job::SkillJobStatus {
        phase: Some(crate::api::job::SkillJobPhase::Failed),
        job_name: Some(super::builders::job::job_name(UID)),
        ..Default::default()
    });
    finished
}

/// The reads of a first start whose cached copy (41) the term's list does
/// not vouch for (it holds 42): admission's, the namespace, the list, and
/// the API server's copy, answered with `copy`.
async fn expect_unvouched_start_reads(handle: &mut Handle, copy: SkillJob) {
    expect_admission_reads(handle).await;
    expect_restricted_namespace(handle).await;
    expect_term_list(handle, &[(UID, "42")]).await;
    expect_skilljob_read(handle, copy).await;
}

#[tokio::test]
async fn a_cached_copy_behind_a_finished_run_creates_nothing() {
    let (ctx, mut handle) = context();
    let server = tokio::spawn(async move {
        // The list holds a newer copy: the cached one may predate a start.
        expect_unvouched_start_reads(&mut handle, finished_copy()).await;
        // No ServiceAccount, Secret, NetworkPolicy, Job or status write.
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(skilljob()), ctx).await.expect("reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(1)), "looked at again once the cache has caught up");
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

/// A copy the term's list holds a newer version of (the gateway annotated
/// it, say) is read again, and the run starts from the API server's copy:
/// its version guards the status write.
#[tokio::test]
async fn a_copy_older_than_the_term_s_list_is_read_and_the_newer_one_guards_the_write() {
    let (ctx, mut handle) = context();
    let server = tokio::spawn(async move {
        expect_unvouched_start_reads(&mut handle, newer_unstarted_copy()).await;
        expect(&mut handle, "PATCH", "/api/v1/namespaces/team/serviceaccounts/skill-operator-run", ok).await;
        expect_run_policies(&mut handle).await;
        expect(&mut handle, "POST", "/apis/batch/v1/namespaces/team/jobs", ok).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["metadata"]["resourceVersion"], "42", "guarded by the API server's copy, not the cached one");
    });
    skilljob::reconcile(Arc::new(skilljob()), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

/// The attack on the guard: this controller started the run and wrote so
/// (version 42), the run ended and its Job went, and a reconcile is handed
/// the cache's copy from before that write (41) with no Job in sight. The
/// copy the term's list vouched for is no longer enough: it is read again,
/// and no second Job is made.
#[tokio::test]
async fn a_cached_copy_behind_this_controller_s_own_write_creates_nothing() {
    a_stale_look_after_the_start_is_read_again(true).await;
}

/// A status write whose answer is lost may have been applied: until the
/// cache shows a later copy, the cached one is read again before a start.
#[tokio::test]
async fn a_status_write_with_a_lost_answer_leaves_the_cached_copy_unbelieved() {
    a_stale_look_after_the_start_is_read_again(false).await;
}

/// Starts the run from a copy the term's list vouches for, its status
/// write answered (or not: a 500), then hands the reconciler that same
/// copy again: the API server's copy (the verdict recorded) must be read,
/// and nothing made.
async fn a_stale_look_after_the_start_is_read_again(write_answered: bool) {
    let (ctx, mut handle) = context();
    let server = tokio::spawn(async move {
        expect_vouched_first_start(&mut handle, if write_answered { patched } else { lost_answer }).await;
        // The same cached copy again.
        expect_admission_reads(&mut handle).await;
        expect_skilljob_read(&mut handle, finished_copy()).await;
        no_more_calls(&mut handle).await;
    });
    let first = skilljob::reconcile(Arc::new(skilljob()), ctx.clone()).await;
    assert_eq!(first.is_ok(), write_answered, "{first:?}");
    let action = skilljob::reconcile(Arc::new(skilljob()), ctx).await.expect("the stale look");
    assert_eq!(action, Action::requeue(Duration::from_secs(1)), "looked at again once the cache has caught up");
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

/// A write the API server may or may not have applied (its answer says it failed).
fn lost_answer(_: Value) -> Response<Body> {
    let lost = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500,
                       "message": "etcdserver: request timed out" });
    Response::builder().status(500).body(Body::from(serde_json::to_vec(&lost).unwrap())).unwrap()
}

/// A status derived from an old copy is written only over that copy: the
/// API server refuses it (409), nothing else follows, and the error policy
/// looks again soon without counting a failure of anything.
#[tokio::test]
async fn a_status_write_from_an_old_copy_is_refused_and_retried() {
    let (ctx, mut handle) = context();
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| not_found()).await;
        let status = expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", |_| {
            let conflict = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
                                   "message": "the object has been modified; please apply your changes to the latest version and try again" });
            Response::builder().status(409).body(Body::from(serde_json::to_vec(&conflict).unwrap())).unwrap()
        })
        .await;
        assert_eq!(status["metadata"]["resourceVersion"], "41", "the write names the copy it was derived from");
        // No Event for a verdict that was not recorded.
        no_more_calls(&mut handle).await;
    });
    let error = skilljob::reconcile(Arc::new(started_skilljob()), ctx).await.expect_err("the write was refused");
    assert!(error.is_stale(), "{error}");
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_restarted_controller_finds_its_job_and_creates_none() {
    let (ctx, mut handle) = context();
    let sj = started_skilljob();
    let name = super::builders::job::job_name(UID);
    let owner = sj.controller_owner_ref(&()).unwrap();
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| {
            ok(json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": name, "namespace": "team", "ownerReferences": [owner] },
                       "status": { "active": 1 } }))
        })
        .await;
        // Without a cache the namespace's run policy is applied (a no-op when it is there).
        expect_run_policies(&mut handle).await;
        // A running Job has no exit to read: no pod LIST.
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Running");
        // No POST of a Job may follow.
        no_more_calls(&mut handle).await;
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_deleted_job_fails_the_skilljob_visibly_and_is_not_rerun() {
    let (ctx, mut handle) = context();
    let sj = started_skilljob();
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| not_found()).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Failed");
        assert!(status["status"]["message"].as_str().unwrap().contains("not re-run"));
        expect(&mut handle, "POST", "/apis/events.k8s.io/v1/namespaces/team/events", ok).await;
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_job_refused_by_the_fence_fails_without_creating_anything() {
    let (ctx, mut handle) = context();
    let mut sj = skilljob();
    sj.spec.script = "scripts/undeclared.py".into();
    let server = tokio::spawn(async move {
        expect_admission_reads(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Failed");
        assert!(status["status"]["message"].as_str().unwrap().contains("must be declared"));
        expect(&mut handle, "POST", "/apis/events.k8s.io/v1/namespaces/team/events", ok).await;
        no_more_calls(&mut handle).await;
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

/// Answers outputs with what an upload sidecar would have stored, and
/// announces `announced`, then breaks its stream.
#[derive(Default)]
struct StoredOutputs {
    announced: Vec<crate::artifacts::OutputsStored>,
    /// The endpoint is down: reading the outputs finds it unreachable.
    down: bool,
    /// What was staged where.
    staged: std::sync::Mutex<Vec<String>>,
}
impl super::context::ArtifactStore for StoredOutputs {
    fn stage_package<'a>(
        &'a self,
        ns: &'a str,
        uid: &'a str,
        _: Vec<u8>,
    ) -> futures::future::BoxFuture<'a, Result<(), super::context::ArtifactError>> {
        self.staged.lock().unwrap().push(format!("job {ns}/{uid}"));
        Box::pin(async { Ok(()) })
    }
    fn stage_namespace_package<'a>(
        &'a self,
        ns: &'a str,
        digest: &'a str,
        _: Vec<u8>,
    ) -> futures::future::BoxFuture<'a, Result<(), super::context::ArtifactError>> {
        self.staged.lock().unwrap().push(format!("namespace {ns} {digest}"));
        Box::pin(async { Ok(()) })
    }
    fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> futures::future::BoxFuture<'a, Result<(), super::context::ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
    fn outputs<'a>(
        &'a self,
        ns: &'a str,
        uid: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, super::context::ArtifactError>> {
        let down = self.down;
        Box::pin(async move {
            if down {
                return Err(super::context::ArtifactError::Unreachable { what: "outputs".into(), detail: "connection refused".into() });
            }
            let file = |path: &str, size: u64| json!({ "path": path, "size": size, "digest": format!("sha256:{}", "a".repeat(64)) });
            Ok(Some(serde_json::from_value(json!({
                "schemaVersion": 1, "namespace": ns, "uid": uid, "complete": true,
                "files": [file("result/result.json", 200), file("result/stderr", 0), file("result/stdout", 1048576), file("work/report.txt", 42),
                          { "path": "work/data.csv", "size": 7, "digest": format!("sha256:{}", "b".repeat(64)) }],
                "skipped": []
            })).unwrap()))
        })
    }
    fn output_file<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Vec<u8>, super::context::ArtifactError>> {
        Box::pin(async {
            Ok(serde_json::to_vec(&json!({ "exitCode": 0, "signal": null, "timedOut": false, "durationMs": 10, "stdoutBytes": 2621440,
                                           "stderrBytes": 0, "stdoutTruncated": true, "stderrTruncated": false }))
            .unwrap())
        })
    }
    fn follow_stored(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<crate::artifacts::operator::StoredStream, super::context::ArtifactError>> {
        let events = self.announced.clone();
        Box::pin(async move {
            use futures::StreamExt;
            // Then the stream breaks: the follower must keep going (it follows again).
            let broken = super::context::ArtifactError::Unreachable { what: "follow".into(), detail: "reset".into() };
            Ok(futures::stream::iter(events.into_iter().map(Ok).chain([Err(broken)])).boxed())
        })
    }
}

/// A recorded Job found Complete: its GET, the namespace's run policy
/// applied (no cache here), and its pods listed (none left).
async fn expect_reads_of_a_completed_job(
    handle: &mut Handle,
    name: &str,
    owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) {
    expect(handle, "GET", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| {
        ok(json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": name, "namespace": "team", "ownerReferences": [owner] },
                   "status": { "conditions": [{ "type": "Complete", "status": "True" }], "completionTime": "2026-01-01T00:00:10Z" } }))
    })
    .await;
    expect_run_policies(handle).await;
    expect(handle, "GET", "/api/v1/namespaces/team/pods", |_| {
        ok(json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [] }))
    })
    .await;
}

/// The Job has ended but the endpoint that holds its outputs is down: what
/// was stored cannot be known, so no verdict is given (an "outputs not
/// stored" Failed would be a lie if they were); the run stays Running, says
/// which component it waits for, and nothing is deleted.
#[tokio::test]
async fn a_run_whose_outputs_cannot_be_read_while_the_endpoint_is_down_waits_and_says_so() {
    let (plain, mut handle) = context();
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs { down: true, ..Default::default() }), ..(*plain).clone() });
    drop(plain);
    let mut sj = started_skilljob();
    sj.status.as_mut().unwrap().phase = Some(crate::api::job::SkillJobPhase::Running);
    let name = super::builders::job::job_name(UID);
    let owner = sj.controller_owner_ref(&()).unwrap();
    let server = tokio::spawn(async move {
        expect_reads_of_a_completed_job(&mut handle, &name, owner).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        let s = &status["status"];
        assert_eq!(s["phase"], "Running", "no verdict, and not taken back to Pending");
        assert!(s["message"].as_str().unwrap().contains("the artifact endpoint cannot be reached"), "{s}");
        let complete = s["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Complete").unwrap();
        assert_eq!((complete["status"].as_str(), complete["reason"].as_str()), (Some("False"), Some("ArtifactEndpointUnavailable")));
        // Nothing of the run is deleted while its outputs are unread.
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(sj), ctx).await.expect("a component outage is a wait, not a failed reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_finished_run_reports_streams_and_outputs_from_the_artifact_endpoint() {
    let (plain, mut handle) = context();
    let trail = crate::audit::SharedBuffer::default();
    let audit = crate::audit::Audit::new("controller", vec![crate::audit::Sink::buffer(trail.clone())]);
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs::default()), audit, ..(*plain).clone() });
    drop(plain);
    let mut sj = started_skilljob();
    sj.spec.inputs = vec![crate::api::job::InputFile { path: "data.csv".into(), digest: format!("sha256:{}", "b".repeat(64)), size: 7 }];
    seal_for(&mut sj, "system:serviceaccount:team:agent");
    let name = super::builders::job::job_name(UID);
    let owner = sj.controller_owner_ref(&()).unwrap();
    let server = tokio::spawn(async move {
        expect_reads_of_a_completed_job(&mut handle, &name, owner).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        let s = &status["status"];
        assert_eq!(s["phase"], "Succeeded");
        assert_eq!(s["exitCode"], 0);
        assert_eq!(s["stdout"]["size"], 2621440, "the bytes the script wrote, from result.json");
        assert_eq!(s["stdout"]["truncated"], true);
        // data.csv is an input the script left as it was: not an output.
        assert_eq!(s["outputs"], json!([{ "path": "report.txt", "size": 42, "digest": format!("sha256:{}", "a".repeat(64)) }]));
        // The result is recorded: the Job goes (its pod with it); the
        // SkillJob keeps the result. Nothing else of the run is left to delete.
        let deleted =
            expect_unordered(&mut handle, 1, |_, _| ok(json!({ "kind": "Status", "apiVersion": "v1", "status": "Success" }))).await;
        assert_eq!(deleted, vec![("DELETE".to_string(), format!("/apis/batch/v1/namespaces/team/jobs/{name}"))]);
        no_more_calls(&mut handle).await;
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    // The verdict is in the audit trail once, with who asked and what ran (arguments by digest).
    let records = trail.records();
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert_eq!(
        (r["event"].as_str(), r["source"].as_str(), r["state"].as_str()),
        (Some("run.verdict"), Some("controller"), Some("Succeeded"))
    );
    assert_eq!((r["namespace"].as_str(), r["job"].as_str(), r["skilljobUid"].as_str()), (Some("team"), Some("report"), Some(UID)));
    assert_eq!(r["principal"]["name"], "system:serviceaccount:team:agent");
    assert_eq!((r["script"].as_str(), r["exitCode"].as_i64()), (Some("scripts/forecast.py"), Some(0)));
    assert_eq!(r["argsDigest"], crate::audit::digest_json(&["; rm -rf /"]));
    assert!(!r.to_string().contains("rm -rf"), "arguments by digest only: {r}");
    assert_eq!(r["inputs"][0]["path"], "data.csv");
}

/// `sj` as the gateway writes it for `principal`: created now, named in its
/// annotation and sealed under the context's token key.
fn seal_for(sj: &mut SkillJob, principal: &str) {
    use crate::core::owner::{OwnerClaim, OwnerSeal};
    let now = k8s_openapi::jiff::Timestamp::now();
    sj.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    let claim = OwnerClaim { namespace: "team", name: &sj.name_any(), principal, spec_digest: &sj.spec_digest() };
    let seal = OwnerSeal::new(b"test-key").seal(&claim, now.as_second());
    sj.annotations_mut().insert(skilljob::REQUESTED_BY_ANNOTATION.into(), principal.into());
    sj.annotations_mut().insert(skilljob::OWNER_SEAL_ANNOTATION.into(), seal);
}

/// A cache holding `job`, as the controller's Job reflector would.
fn job_cache(
    job: Job,
) -> (kube::runtime::reflector::Store<Job>, kube::runtime::reflector::Store<k8s_openapi::api::networking::v1::NetworkPolicy>) {
    let (jobs, mut writer) = kube::runtime::reflector::store::<Job>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(job));
    let (policies, _) = kube::runtime::reflector::store();
    (jobs, policies)
}

fn job_created(age_secs: i64) -> Job {
    let name = super::builders::job::job_name(UID);
    let created = k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second() - age_secs).unwrap();
    serde_json::from_value(json!({ "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "namespace": "team", "creationTimestamp": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created) } }))
    .unwrap()
}

#[tokio::test]
async fn a_job_event_overtaking_our_status_write_writes_nothing() {
    // The Job is in the cache but this copy of the SkillJob predates the
    // status write that recorded it: writing now would erase that write.
    let (ctx, mut handle) = context();
    let (jobs, policies) = job_cache(job_created(1));
    ctx.lookups.set_child_stores(jobs, policies);
    let server = tokio::spawn(async move { no_more_calls(&mut handle).await });
    let action = skilljob::reconcile(Arc::new(skilljob()), ctx).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(2)));
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn an_old_unrecorded_job_gets_its_status_rebuilt() {
    // A controller stopped between creating the Job and recording it: the
    // next one records it, skill and namespace check included, and creates nothing.
    let (ctx, mut handle) = context();
    let (jobs, policies) = job_cache(job_created(600));
    ctx.lookups.set_child_stores(jobs, policies);
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skillbindings/weather", |_| ok(binding())).await;
        expect_restricted_namespace(&mut handle).await;
        expect_run_policies(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["jobName"], json!(super::builders::job::job_name(UID)));
        assert_eq!(status["status"]["skill"], "weather");
        assert!(status["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "NamespaceRestricted" && c["status"] == "True"));
        no_more_calls(&mut handle).await;
    });
    skilljob::reconcile(Arc::new(skilljob()), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

/// A SkillJob created `age_secs` ago naming one input nothing staged.
fn skilljob_naming_an_unstaged_input(age_secs: i64) -> SkillJob {
    let mut sj = skilljob();
    let created = k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second() - age_secs).unwrap();
    sj.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created));
    sj.spec.inputs = vec![crate::api::job::InputFile { path: "data.csv".into(), digest: format!("sha256:{}", "d".repeat(64)), size: 12 }];
    sj
}

#[tokio::test]
async fn a_skilljob_whose_inputs_are_not_staged_waits_and_creates_nothing() {
    let (ctx, mut handle) = context();
    let sj = skilljob_naming_an_unstaged_input(0);
    let server = tokio::spawn(async move {
        expect_admission_reads(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Pending");
        let message = status["status"]["message"].as_str().unwrap();
        assert!(message.contains("data.csv is not staged"), "{message}");
        // No Secret, NetworkPolicy or Job before the inputs are there.
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    // Staging annotates the SkillJob, which wakes it; this is only the fallback poll.
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(30)));
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_skilljob_whose_inputs_never_come_fails_after_the_wait() {
    let (ctx, mut handle) = context();
    let sj = skilljob_naming_an_unstaged_input(super::decide::INPUTS_WAIT_SECS + 1);
    let server = tokio::spawn(async move {
        expect_admission_reads(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Failed");
        assert!(status["status"]["message"].as_str().unwrap().contains("were not staged within 600 s"));
        expect(&mut handle, "POST", "/apis/events.k8s.io/v1/namespaces/team/events", ok).await;
        no_more_calls(&mut handle).await;
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

fn ago(secs: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second() - secs).unwrap(),
    )
}

fn pods(phase: &str) -> Response<Body> {
    ok(json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
        { "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "p", "namespace": "team" }, "status": { "phase": phase } }
    ] }))
}

fn no_pods() -> Response<Body> {
    ok(json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [] }))
}

fn deleted() -> Response<Body> {
    ok(json!({ "kind": "Status", "apiVersion": "v1", "status": "Success" }))
}

#[tokio::test]
async fn a_pod_alive_long_after_the_deadline_locks_the_run() {
    let (ctx, mut handle) = context();
    let sj = started_skilljob();
    let name = super::builders::job::job_name(UID);
    let failed_at = ago(130);
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| {
            ok(json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": name, "namespace": "team" },
                       "status": { "conditions": [{ "type": "Failed", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime": failed_at }] } }))
        })
        .await;
        expect_run_policies(&mut handle).await;
        expect(&mut handle, "GET", "/api/v1/namespaces/team/pods", |_| pods("Running")).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Locked");
        assert!(status["status"]["message"].as_str().unwrap().contains("withheld"));
        expect(&mut handle, "POST", "/apis/events.k8s.io/v1/namespaces/team/events", ok).await;
        no_more_calls(&mut handle).await;
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_pod_just_past_the_deadline_is_waited_for_not_locked() {
    let (ctx, mut handle) = context();
    let sj = started_skilljob();
    let name = super::builders::job::job_name(UID);
    let failed_at = ago(20);
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| {
            ok(json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": name, "namespace": "team" },
                       "status": { "conditions": [{ "type": "Failed", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime": failed_at }] } }))
        })
        .await;
        expect_run_policies(&mut handle).await;
        expect(&mut handle, "GET", "/api/v1/namespaces/team/pods", |_| pods("Running")).await;
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(2)));
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn deleting_a_running_skilljob_waits_for_its_pod_without_failing() {
    // Issue 8: waiting for a stopping pod was logged as WARN and counted as a failed reconcile.
    let (ctx, mut handle) = context();
    let mut sj = started_skilljob();
    sj.metadata.deletion_timestamp = Some(ago(1));
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        expect(&mut handle, "DELETE", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| deleted()).await;
        expect(&mut handle, "GET", "/api/v1/namespaces/team/pods", |_| pods("Running")).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Cancelled");
        no_more_calls(&mut handle).await;
    });
    // Ok, not Err: error_policy (the WARN log and the failure counter) never sees it.
    let action = skilljob::reconcile(Arc::new(sj), ctx).await.expect("a wait is not an error");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(2)));
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

/// A confirmation token names its SkillJob for its whole life: a SkillJob
/// the gateway sealed keeps its finalizer (its pod stopped, its files gone)
/// until the token has expired, so a replayed token finds it and cannot
/// make it again. In a namespace being deleted nothing can be made, and it
/// lets go at once.
#[tokio::test]
async fn a_deleted_sealed_skilljob_keeps_its_name_for_its_tokens_life_unless_its_namespace_goes() {
    for terminating in [false, true] {
        let (ctx, mut handle) = context();
        if terminating {
            let (store, mut writer) = kube::runtime::reflector::store();
            let ns: kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace> = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "team", "deletionTimestamp": ago(1) }
            }))
            .unwrap();
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(ns));
            ctx.lookups.set_namespace_store(store);
        }
        let mut sj = started_skilljob();
        seal_for(&mut sj, "system:serviceaccount:team:agent");
        sj.metadata.deletion_timestamp = Some(ago(1));
        let name = super::builders::job::job_name(UID);
        let server = tokio::spawn(async move {
            expect(&mut handle, "DELETE", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| deleted()).await;
            expect(&mut handle, "GET", "/api/v1/namespaces/team/pods", |_| no_pods()).await;
            if terminating {
                // The finalizer's clean-up: the pod is checked gone again, the finalizer removed.
                expect(&mut handle, "DELETE", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| deleted()).await;
                expect(&mut handle, "GET", "/api/v1/namespaces/team/pods", |_| no_pods()).await;
                let patch = expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report", |_| {
                    ok(serde_json::to_value(started_skilljob()).unwrap())
                })
                .await;
                assert!(patch.to_string().contains("/metadata/finalizers"), "{patch}");
            }
            no_more_calls(&mut handle).await;
        });
        let action = skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
        if !terminating {
            let held = crate::core::confirm::TOKEN_TTL.as_secs();
            let want =
                (held - 5..=held + 1).map(|s| kube::runtime::controller::Action::requeue(Duration::from_secs(s))).collect::<Vec<_>>();
            assert!(want.contains(&action), "held until the token expires: {action:?}");
        }
        tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn the_cancel_annotation_stops_the_run_and_records_cancelled() {
    let (ctx, mut handle) = context();
    let mut sj = started_skilljob();
    sj.metadata.annotations = Some(BTreeMap::from([(skilljob::CANCEL_ANNOTATION.to_string(), "caller".to_string())]));
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        expect(&mut handle, "DELETE", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| deleted()).await;
        expect(&mut handle, "GET", "/api/v1/namespaces/team/pods", |_| no_pods()).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Cancelled");
        let complete = status["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Complete").cloned().unwrap();
        assert_eq!(complete["status"], "True");
        // The Job was deleted to stop the run: no second DELETE.
        no_more_calls(&mut handle).await;
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
}

#[path = "prepare_mock_tests.rs"]
mod prepare;

const JOB_UID: &str = "1f1e1d1c-1b1a-1918-1716-151413121110";

/// The run's Job as the Job controller shows it while its pod is active.
fn running_job() -> Job {
    let name = super::builders::job::job_name(UID);
    let owner = started_skilljob().controller_owner_ref(&()).unwrap();
    serde_json::from_value(json!({ "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "namespace": "team", "uid": JOB_UID, "ownerReferences": [owner] },
        "status": { "active": 1 } }))
    .unwrap()
}

/// The run's pod, controlled by the Job with `owner_uid`, whose run
/// container has exited 0 while the upload sidecar is still up.
fn pod_after_the_script(owner_uid: &str) -> k8s_openapi::api::core::v1::Pod {
    let name = super::builders::job::job_name(UID);
    serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": format!("{name}-abcde"), "namespace": "team",
                      "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": owner_uid, "controller": true }] },
        "status": { "phase": "Running",
            "initContainerStatuses": [
                { "name": "fetch", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                  "state": { "terminated": { "exitCode": 0 } } },
                { "name": "upload", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": { "running": {} } }],
            "containerStatuses": [
                { "name": "run", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                  "state": { "terminated": { "exitCode": 0, "finishedAt": "2026-01-01T00:00:05Z" } } }] } }))
    .unwrap()
}

/// Caches as the controller's reflectors hold them: the running Job and `pod`.
fn caches_with(ctx: &Context, pod: k8s_openapi::api::core::v1::Pod) {
    let (jobs, policies) = job_cache(running_job());
    ctx.lookups.set_child_stores(jobs, policies);
    let (pods, mut writer) = kube::runtime::reflector::store();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod));
    ctx.lookups.set_pod_store(pods);
}

#[tokio::test]
async fn a_run_whose_script_ended_and_outputs_are_stored_is_recorded_before_its_job_completes() {
    // The Job still says active (the sidecar is up, the Job controller has
    // not caught up): the verdict comes from the run container's end and
    // the stored outputs, and the run's children go at once.
    let (plain, mut handle) = context();
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs::default()), ..(*plain).clone() });
    drop(plain);
    caches_with(&ctx, pod_after_the_script(JOB_UID));
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        expect_run_policies(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        let s = &status["status"];
        assert_eq!(s["phase"], "Succeeded", "{s}");
        assert_eq!(s["exitCode"], 0);
        assert_eq!(s["finishedAt"], "2026-01-01T00:00:05Z", "when the run container ended, not when the Job did");
        assert_eq!(s["stdout"]["size"], 2621440);
        let deleted = expect_unordered(&mut handle, 1, |_, _| deleted()).await;
        assert!(deleted.contains(&("DELETE".to_string(), format!("/apis/batch/v1/namespaces/team/jobs/{name}"))), "{deleted:?}");
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(started_skilljob()), ctx).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::await_change());
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_run_whose_outputs_are_not_stored_yet_is_looked_at_again_soon_and_not_recorded() {
    // The script has ended but the sidecar has not stored anything yet (or
    // withheld a cancelled result): no verdict from the pod alone.
    let (ctx, mut handle) = context();
    caches_with(&ctx, pod_after_the_script(JOB_UID));
    let server = tokio::spawn(async move {
        expect_run_policies(&mut handle).await;
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(started_skilljob()), ctx).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_millis(250)));
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_look_alike_pod_does_not_end_a_run() {
    // Same labels and name, but not controlled by the run's Job: it says
    // nothing about the run, which stays Running until its own pod ends.
    let (plain, mut handle) = context();
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs::default()), ..(*plain).clone() });
    drop(plain);
    caches_with(&ctx, pod_after_the_script("99999999-9999-9999-9999-999999999999"));
    let server = tokio::spawn(async move {
        expect_run_policies(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Running");
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(started_skilljob()), ctx).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(10)));
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

/// The run's pod while its run container still shows as running: the
/// kubelet has not reported the script's end yet (it does at its next relist).
fn pod_still_running(owner_uid: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = pod_after_the_script(owner_uid);
    let statuses = pod.status.as_mut().unwrap().container_statuses.as_mut().unwrap();
    statuses[0].state = Some(k8s_openapi::api::core::v1::ContainerState { running: Some(Default::default()), ..Default::default() });
    pod
}

#[tokio::test]
async fn a_run_whose_stored_result_was_announced_is_recorded_before_its_pod_reports_the_end() {
    // The endpoint announced the stored outputs (the launcher writes its
    // result only once nothing of the script runs): the verdict needs no
    // container end from the kubelet.
    let (plain, mut handle) = context();
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs::default()), ..(*plain).clone() });
    drop(plain);
    caches_with(&ctx, pod_still_running(JOB_UID));
    ctx.stored.mark("team", UID);
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        expect_run_policies(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        let s = &status["status"];
        assert_eq!(s["phase"], "Succeeded", "{s}");
        assert_eq!(s["stdout"]["size"], 2621440);
        let deleted = expect_unordered(&mut handle, 1, |_, _| deleted()).await;
        assert!(deleted.contains(&("DELETE".to_string(), format!("/apis/batch/v1/namespaces/team/jobs/{name}"))), "{deleted:?}");
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(started_skilljob()), ctx.clone()).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::await_change());
    assert!(!ctx.stored.take("team", UID), "the mark outlived the verdict");
    drop(ctx);
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn an_announcement_whose_outputs_cannot_be_read_back_decides_nothing() {
    // Marked, but the store has no outputs for the job (a stale or forged
    // announcement): the run stays Running until its pod's end says more.
    let (ctx, mut handle) = context();
    caches_with(&ctx, pod_still_running(JOB_UID));
    ctx.stored.mark("team", UID);
    let server = tokio::spawn(async move {
        expect_run_policies(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Running");
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(started_skilljob()), ctx).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(10)));
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

#[tokio::test]
async fn an_unannounced_running_pod_is_not_recorded_even_with_outputs_stored() {
    // Outputs in the store (the sidecar of a run that is still going could
    // not have stored them, but a reconcile must not go looking on every
    // event): without the announcement or the container's end, Running.
    let (plain, mut handle) = context();
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs::default()), ..(*plain).clone() });
    drop(plain);
    caches_with(&ctx, pod_still_running(JOB_UID));
    let server = tokio::spawn(async move {
        expect_run_policies(&mut handle).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Running");
        no_more_calls(&mut handle).await;
    });
    let action = skilljob::reconcile(Arc::new(started_skilljob()), ctx).await.expect("reconcile");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(10)));
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
}

/// The same first 12 hex digits as [`UID`], so the same Job name.
const LOOK_ALIKE_UID: &str = "0f0e0d0c-0b0a-4999-8999-999999999999";

#[tokio::test]
async fn announced_runs_wake_their_own_skilljob_only() {
    use futures::StreamExt;
    let (plain, _handle) = context();
    let stored = |ns: &str, uid: &str| crate::artifacts::OutputsStored { namespace: ns.into(), uid: uid.into() };
    let announced = vec![
        // Another namespace's job of the same UID, and a UID we have no Job for: nothing.
        stored("elsewhere", UID),
        stored("team", "99999999-9999-9999-9999-999999999999"),
        // Another job whose UID starts like this run's: its Job name would
        // be the same, but the Job's owner is not it.
        stored("team", LOOK_ALIKE_UID),
        stored("team", UID),
    ];
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs { announced, ..Default::default() }), ..(*plain).clone() });
    drop(plain);
    caches_with(&ctx, pod_still_running(JOB_UID));
    let mut wakes = Box::pin(skilljob::follow_stored(ctx.clone()));
    let first = tokio::time::timeout(Duration::from_secs(5), wakes.next()).await.expect("a wake-up").expect("the stream goes on");
    assert_eq!((first.name.as_str(), first.namespace.as_deref()), ("report", Some("team")));
    assert!(ctx.stored.take("team", UID), "the reconcile is not told why it woke");
    assert!(!ctx.stored.take("elsewhere", UID));
    assert!(!ctx.stored.take("team", LOOK_ALIKE_UID), "a job named like this run's woke it");
    // After the break it follows again and hears the same announcements.
    let again = tokio::time::timeout(Duration::from_secs(5), wakes.next()).await.expect("followed again").expect("the stream goes on");
    assert_eq!(again.name, "report");
}

/// A claimed warm pod of the run [`UID`] in the pod cache, owned by `owner_uid`'s SkillJob.
fn claimed_warm_pod(name: &str, owner_uid: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "team",
            "labels": {
                "app.kubernetes.io/managed-by": "skill-operator",
                "skill-operator.dev/skilljob-uid": UID,
                "skill-operator.dev/warm-pool": "0123456789abcdef0123",
                "skill-operator.dev/warm-state": "claimed",
            },
            "ownerReferences": [{ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob", "name": "report", "uid": owner_uid, "controller": true }],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn an_announced_run_on_a_warm_pod_wakes_its_skilljob_through_the_claimed_pod() {
    use futures::StreamExt;
    let (plain, _handle) = context();
    let stored = |uid: &str| crate::artifacts::OutputsStored { namespace: "team".into(), uid: uid.into() };
    // The look-alike's pod carries this run's label but is owned by another SkillJob.
    let announced = vec![stored(LOOK_ALIKE_UID), stored(UID)];
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs { announced, ..Default::default() }), ..(*plain).clone() });
    drop(plain);
    // No Job at all: a warm run has none.
    let (jobs, policies) = job_cache(running_job());
    drop(jobs);
    let (no_jobs, _) = kube::runtime::reflector::store();
    ctx.lookups.set_child_stores(no_jobs, policies);
    let (pods, mut writer) = kube::runtime::reflector::store();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(claimed_warm_pod("skillwarm-a", UID)));
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(claimed_warm_pod("skillwarm-b", "another-skilljob")));
    ctx.lookups.set_pod_store(pods);
    let mut wakes = Box::pin(skilljob::follow_stored(ctx.clone()));
    let first = tokio::time::timeout(Duration::from_secs(5), wakes.next()).await.expect("a wake-up").expect("the stream goes on");
    assert_eq!((first.name.as_str(), first.namespace.as_deref()), ("report", Some("team")));
    assert!(ctx.stored.take("team", UID), "the reconcile is not told why it woke");
    assert!(!ctx.stored.take("team", LOOK_ALIKE_UID));
}
