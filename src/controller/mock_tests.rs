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
use kube::{Client, Resource};
use serde_json::{json, Value};

use super::context::{Context, FetchedPackage, OperatorConfig, PackageResolver};
use super::metrics::Metrics;
use super::skilljob;
use crate::api::job::{SkillJob, SkillJobSpec};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Answers every fetch with a fixed archive (the registry is not the subject here).
struct NoPackages;
impl PackageResolver for NoPackages {
    fn fetch<'a>(
        &'a self,
        _: &'a crate::api::package::OciSource,
    ) -> futures::future::BoxFuture<'a, Result<FetchedPackage, super::context::ResolveError>> {
        Box::pin(async { Ok(FetchedPackage { digest: "sha256:abc".into(), archive: vec![1, 2, 3] }) })
    }
}

fn context() -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let config = OperatorConfig {
        operator_image: "registry.example/skill-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000".into(),
        artifact_endpoint: "http://10.96.0.10:8443".into(),
        operator_namespace: "skill-system".into(),
        operator_pod_labels: BTreeMap::from([("app.kubernetes.io/name".to_string(), "skill-operator".to_string())]),
        label_namespaces: false,
        token_key: b"test-key".to_vec(),
        host_aliases: Default::default(),
        reconcile_concurrency: 32,
    };
    (
        Arc::new(Context::new(client, Arc::new(Metrics::default()), config, Arc::new(NoPackages), Arc::new(super::context::NoArtifacts))),
        handle,
    )
}

const UID: &str = "0f0e0d0c-0b0a-0908-0706-050403020100";

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
        "spec": { "source": { "oci": { "reference": "r/weather@sha256:abc" } },
                  "runtime": { "interpreter": "python", "image": "python@sha256:1111111111111111111111111111111111111111111111111111111111111111", "allowedScripts": ["scripts/forecast.py"], "timeoutSeconds": 60 } },
        "status": { "digest": "sha256:abc", "skillName": "weather", "files": 2, "bytes": 10, "requirements": "unknown",
                    "scripts": [{ "script": "scripts/forecast.py", "interpreter": "python", "env": [], "timeoutSeconds": 30, "allowed": true }],
                    "problems": [], "conditions": ready("Ready") }
    })
}

fn not_found() -> Response<Body> {
    let status =
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found" });
    Response::builder().status(404).body(Body::from(serde_json::to_vec(&status).unwrap())).unwrap()
}

/// Answer a status patch with the object it would produce.
fn patched(mut body: Value) -> Response<Body> {
    if body.get("metadata").is_none() {
        body["metadata"] = json!({ "name": "report", "namespace": "team", "uid": UID });
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

/// Admission reads the binding, then its package.
async fn expect_admission_reads(handle: &mut Handle) {
    expect(handle, "GET", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skillbindings/weather", |_| ok(binding())).await;
    expect(handle, "GET", "/apis/skill-operator.dev/v1alpha1/skillpackages/weather-1", |_| ok(package())).await;
}

/// The reconciler makes no further call (the mock closes when the client is dropped).
async fn no_more_calls(handle: &mut Handle) {
    if let Ok(Some((request, _))) = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await {
        panic!("unexpected extra call {} {}", request.method(), request.uri());
    }
}

#[tokio::test]
async fn first_reconcile_admits_and_creates_children_then_the_job() {
    let (ctx, mut handle) = context();
    let job = Arc::new(skilljob());
    let name = super::builders::job::job_name(UID);
    let server = tokio::spawn(async move {
        // No Job recorded yet: no GET of it; a Job that exists would answer the POST with 409.
        expect_admission_reads(&mut handle).await;
        expect(&mut handle, "GET", "/api/v1/namespaces/team", |_| {
            ok(json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "team", "labels": { "pod-security.kubernetes.io/enforce": "restricted" } } }))
        })
        .await;
        let sa = expect(&mut handle, "PATCH", "/api/v1/namespaces/team/serviceaccounts/skill-operator-run", ok).await;
        assert_eq!(sa["automountServiceAccountToken"], false);
        let secret = expect(&mut handle, "POST", "/api/v1/namespaces/team/secrets", ok).await;
        assert_eq!(secret["stringData"]["token"], crate::core::token::job_token(b"test-key", "team", UID));
        let policy = expect(&mut handle, "POST", "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies", ok).await;
        assert_eq!(policy["metadata"]["name"], json!(name));
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        let created = expect(&mut handle, "POST", "/apis/batch/v1/namespaces/team/jobs", ok).await;
        let job: Job = serde_json::from_value(created).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some(name.as_str()));
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert!(super::builders::pod_security::restricted_violations(&pod).is_empty());
        let run = pod.containers.iter().find(|c| c.name == "run").unwrap();
        assert!(run.command.iter().chain(run.args.iter()).flatten().any(|a| a == "; rm -rf /"), "args travel as one argv entry");
        // Event, then the status.
        expect(&mut handle, "POST", "/apis/events.k8s.io/v1/namespaces/team/events", ok).await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        assert_eq!(status["status"]["phase"], "Pending");
        assert_eq!(status["status"]["jobName"], json!(name));
    });
    skilljob::reconcile(job, ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
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
        // Without a cache the NetworkPolicy is re-created (409 when it exists).
        expect(&mut handle, "POST", "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies", ok).await;
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

/// Answers outputs with what an upload sidecar would have stored.
struct StoredOutputs;
impl super::context::ArtifactStore for StoredOutputs {
    fn stage_package<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: Vec<u8>,
    ) -> futures::future::BoxFuture<'a, Result<(), super::context::ArtifactError>> {
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
        Box::pin(async move {
            let file = |path: &str, size: u64| json!({ "path": path, "size": size, "digest": format!("sha256:{}", "a".repeat(64)) });
            Ok(Some(serde_json::from_value(json!({
                "schemaVersion": 1, "namespace": ns, "uid": uid, "complete": true,
                "files": [file("result/result.json", 200), file("result/stderr", 0), file("result/stdout", 1048576), file("work/report.txt", 42)],
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
}

#[tokio::test]
async fn a_finished_run_reports_streams_and_outputs_from_the_artifact_endpoint() {
    let (ctx, mut handle) = context();
    let ctx = Arc::new(Context { artifacts: Arc::new(StoredOutputs), ..(*ctx).clone() });
    let sj = started_skilljob();
    let name = super::builders::job::job_name(UID);
    let owner = sj.controller_owner_ref(&()).unwrap();
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/team/jobs/{name}"), |_| {
            ok(json!({ "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": name, "namespace": "team", "ownerReferences": [owner] },
                       "status": { "conditions": [{ "type": "Complete", "status": "True" }], "completionTime": "2026-01-01T00:00:10Z" } }))
        })
        .await;
        expect(&mut handle, "POST", "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies", ok).await;
        expect(&mut handle, "GET", "/api/v1/namespaces/team/pods", |_| {
            ok(json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [] }))
        })
        .await;
        let status =
            expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
        let s = &status["status"];
        assert_eq!(s["phase"], "Succeeded");
        assert_eq!(s["exitCode"], 0);
        assert_eq!(s["stdout"]["size"], 2621440, "the bytes the script wrote, from result.json");
        assert_eq!(s["stdout"]["truncated"], true);
        assert_eq!(s["outputs"], json!([{ "path": "report.txt", "size": 42, "digest": format!("sha256:{}", "a".repeat(64)) }]));
    });
    skilljob::reconcile(Arc::new(sj), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
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
        expect(&mut handle, "GET", "/api/v1/namespaces/team", |_| {
            ok(json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": "team", "labels": { "pod-security.kubernetes.io/enforce": "restricted" } } }))
        })
        .await;
        expect(&mut handle, "POST", "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies", ok).await;
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
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(5)));
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
