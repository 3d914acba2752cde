//! The chart's dashboard and alerts (charts/skill-operator/files/monitoring)
//! name only series the operator's components export: the names are read
//! from the real expositions of the controller, the gateway and the egress
//! proxy, so a renamed or dropped metric fails here, not silently on a
//! Grafana panel or an alert that can never fire.

use std::collections::BTreeSet;
use std::path::Path;

use skill_operator::api::job::SkillJobPhase;
use skill_operator::controller::cilium::state::PolicyState;
use skill_operator::controller::metrics::Metrics;
use skill_operator::egress::metrics::{DirectionLabel, OutcomeLabels, ProxyMetrics};
use skill_operator::gateway::auth::AuthStats;
use skill_operator::listener::ListenerMetrics;

const MONITORING: &str = "charts/skill-operator/files/monitoring";

/// The series names an OpenMetrics exposition can carry, from its `# TYPE`
/// lines (a counter `x` is sampled as `x_total`, a histogram as `x_bucket`,
/// `x_sum` and `x_count`).
fn series(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else { continue };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    out
}

/// Every exposition an operator installation serves on `/metrics`, with one
/// sample in every labelled family (an empty family is not exposed at all).
fn exported() -> BTreeSet<String> {
    let metrics = Metrics::default();
    metrics.reconciled("SkillJob", std::time::Duration::from_millis(3));
    metrics.failed("SkillJob", "kube");
    metrics.skilljob_finished(SkillJobPhase::Succeeded, Some(std::time::Duration::from_secs(2)));
    metrics.cilium_state(PolicyState::Applied, 1);
    let controller = metrics.render();
    let gateway = ListenerMetrics::default().render_after(&skill_operator::gateway::metrics::render_stats(AuthStats::default()));
    let mut egress = String::new();
    let proxy = ProxyMetrics::default();
    proxy.requests.get_or_create(&OutcomeLabels { verdict: "refused".into(), reason: "host_not_allowed".into() }).inc();
    proxy.bytes.get_or_create(&DirectionLabel { direction: "up".into() }).inc();
    proxy.zero_copy_bytes.get_or_create(&DirectionLabel { direction: "up".into() }).inc();
    let registry = skill_operator::egress::metrics_registry(&proxy, &ListenerMetrics::default());
    prometheus_client::encoding::text::encode(&mut egress, &registry).unwrap();
    [controller, gateway, egress].iter().flat_map(|e| series(e)).collect()
}

/// The `skill_operator_…` names `text` mentions.
fn named(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("skill_operator_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MONITORING).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_dashboard_and_the_alerts_name_only_exported_series() {
    let exported = exported();
    // The figures the issue asks a platform team to see are among them.
    for must in [
        "skill_operator_skilljobs_finished_total",
        "skill_operator_skilljob_duration_seconds_bucket",
        "skill_operator_reconcile_failures_total",
        "skill_operator_gateway_rate_limited_total",
        "skill_operator_egress_requests_total",
        "skill_operator_egress_bytes_total",
        "skill_operator_audit_write_failures_total",
        "skill_operator_gateway_audit_write_failures_total",
    ] {
        assert!(exported.contains(must), "{must} is not exported: {exported:?}");
    }
    for file in ["dashboard.json", "alerts.yaml"] {
        let names = named(&read(file));
        assert!(!names.is_empty(), "{file} names no series");
        let unknown: Vec<&String> = names.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(unknown.is_empty(), "{file} names series nothing exports: {unknown:?}\nexported: {exported:?}");
    }
}

#[test]
fn a_name_nothing_exports_is_caught() {
    let exported = exported();
    let names = named(r#"rate(skill_operator_skilljobs_finished_total[5m]) / skill_operator_runs_total"#);
    assert_eq!(names.len(), 2);
    let unknown: Vec<&String> = names.iter().filter(|n| !exported.contains(*n)).collect();
    assert_eq!(unknown, vec!["skill_operator_runs_total"]);
}
