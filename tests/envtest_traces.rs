//! Gated suite (`KUBEBUILDER_ASSETS`): the controller continues the trace a
//! SkillJob's `skill-operator.dev/traceparent` names. A real API server,
//! the controller in this process with the process's real subscriber and
//! OTLP exporter (`telemetry::init`, as `skill-operator controller` sets it
//! up), and a collector of the tests on loopback: the reconciles and the
//! run's own span arrive as children of the annotated span, in its trace;
//! a SkillJob without the annotation starts traces of its own.

#[path = "traces/collector.rs"]
mod collector;
#[path = "envtest/harness.rs"]
mod harness;

use kube::api::{Api, PostParams};
use serde_json::json;

use skill_operator::api::SkillJob;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_continues_the_trace_on_the_skilljob() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the controller's traces", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let collector = collector::Collector::start().await;
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint());
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "100");
    // The API server's teardown makes kube's client log loudly; only this crate's logs are of interest here.
    std::env::set_var("SKILL_OPERATOR_LOG", "skill_operator=warn");
    let telemetry = skill_operator::telemetry::init(Some("skill-operator-controller"));
    assert!(telemetry.enabled());

    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::install_crds(&client).await;
    harness::create_namespace(&client, "team", true).await;
    let _controller = harness::spawn_controller(client.clone());

    harness::csv_stats_bound(&client).await;

    // Refused by the fence (a script the package does not allow): it ends
    // Failed at once, without a pod, which this API server has no node for.
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), "team");
    let traced = |name: &str, traceparent: Option<String>| {
        let mut annotations = serde_json::Map::new();
        if let Some(tp) = traceparent {
            annotations.insert(skill_operator::telemetry::TRACEPARENT_ANNOTATION.into(), tp.into());
        }
        serde_json::from_value::<SkillJob>(json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
            "metadata": { "name": name, "namespace": "team", "annotations": annotations },
            "spec": { "binding": "csv-stats", "script": "scripts/other.py" }
        }))
        .unwrap()
    };
    let sj = skilljobs.create(&PostParams::default(), &traced("traced", Some(format!("00-{TRACE}-{PARENT}-01")))).await.unwrap();
    skilljobs.create(&PostParams::default(), &traced("untraced", None)).await.unwrap();
    for name in ["traced", "untraced"] {
        harness::wait_for(
            || async { (skilljobs.get(name).await.ok()?.status?.phase? == skill_operator::api::job::SkillJobPhase::Failed).then_some(()) },
            "the SkillJob to be Failed",
        )
        .await;
    }

    let spans = collector
        .wait_for("the run's span and the reconciles of both SkillJobs", |s| {
            s.iter().any(|s| s.name == "skilljob")
                && s.iter().any(|s| s.name == "reconcile SkillJob" && s.attributes.get("name").is_some_and(|n| n == "untraced"))
        })
        .await;
    let run = spans.iter().find(|s| s.name == "skilljob").unwrap();
    assert_eq!((run.trace_id.as_str(), run.parent.as_str()), (TRACE, PARENT), "{run:#?}");
    assert_eq!(run.attributes.get("skilljob.phase").map(String::as_str), Some("Failed"));
    assert_eq!(run.attributes.get("skilljob.uid"), sj.metadata.uid.as_ref());
    assert_eq!(run.status, 2, "a run that did not succeed is an error span");
    assert_eq!(run.service, "skill-operator-controller");
    let reconciles: Vec<_> = spans.iter().filter(|s| s.name == "reconcile SkillJob").collect();
    let of = |name: &str| reconciles.iter().filter(|s| s.attributes.get("name").is_some_and(|n| n == name)).collect::<Vec<_>>();
    assert!(!of("traced").is_empty());
    assert!(of("traced").iter().any(|s| s.trace_id == TRACE && s.parent == PARENT), "{reconciles:#?}");
    assert!(of("untraced").iter().all(|s| s.trace_id != TRACE && s.parent.is_empty()), "{reconciles:#?}");
    assert!(spans.iter().filter(|s| s.name == "skilljob").count() == 1, "only the annotated run records its span");
    drop(telemetry);
}
