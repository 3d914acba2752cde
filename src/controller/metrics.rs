//! Prometheus metrics: reconciles, failures by error, durations, Jobs
//! created, and SkillJobs by the final phase they reach (with the time from
//! creation to it). The chart's dashboard and alerts read these names
//! (tests/metrics_names.rs holds the two together).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub kind: String,
    pub error: String,
}

/// The operator's metrics and the registry that exposes them.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<KindLabel, Counter>,
    pub failures: Family<ErrorLabel, Counter>,
    pub duration: Family<KindLabel, Histogram>,
    pub jobs_created: Counter,
    /// SkillJobs that reached a final phase, by that phase (counted when the
    /// controller writes it, so once per SkillJob).
    pub skilljobs_finished: Family<PhaseLabel, Counter>,
    /// From a SkillJob's creation to its final phase, by that phase.
    pub skilljob_duration: Family<PhaseLabel, Histogram>,
    /// The egress proxy's CiliumNetworkPolicy: 1 on the state the last
    /// attempt left, 0 on the others (no series while the policy is off).
    pub cilium_policy: Family<StateLabel, Gauge>,
    /// Host entries in the applied CiliumNetworkPolicy.
    pub cilium_policy_hosts: Gauge,
    /// The metrics endpoint's own listener ([`crate::listener`]).
    pub listener: crate::listener::ListenerMetrics,
    /// 1 while this replica leads (always, without leader election), 0 on a standby.
    pub leading: Gauge,
    /// Warm run pods, by state (`waiting`: ready for a claim; `starting`).
    pub warm_pods: Family<StateLabel, Gauge>,
    /// Runs that claimed a warm pod.
    pub warm_hits: Counter,
    /// Runs of a binding with a pool that started cold, by why (`empty`, `env`, `egress`, `shape`).
    pub warm_misses: Family<KindLabel, Counter>,
    /// From a run's admission to its claim written (the claim's own cost).
    pub warm_claim_seconds: Histogram,
    /// What the NetworkPolicy probe found: 1 enforced, 0 not enforced, -1 unknown (or not probed).
    pub network_policy_enforced: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("skill_operator");
        let reconciles = Family::<KindLabel, Counter>::default();
        let failures = Family::<ErrorLabel, Counter>::default();
        let duration = Family::<KindLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0])
        });
        let jobs_created = Counter::default();
        let skilljobs_finished = Family::<PhaseLabel, Counter>::default();
        // A warm run is well under a second, a cold one a few, the longest
        // allowed 300 s (plus the stop and the upload).
        let skilljob_duration = Family::<PhaseLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0])
        });
        registry.register("reconciles", "Reconciles by kind", reconciles.clone());
        crate::audit::register_metrics(&mut registry);
        registry.register("reconcile_failures", "Failed reconciles by kind and error", failures.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration by kind", duration.clone());
        registry.register("jobs_created", "Kubernetes Jobs created for SkillJobs", jobs_created.clone());
        registry.register("skilljobs_finished", "SkillJobs that reached a final phase, by phase", skilljobs_finished.clone());
        registry.register(
            "skilljob_duration_seconds",
            "From a SkillJob's creation to its final phase, by phase",
            skilljob_duration.clone(),
        );
        let cilium_policy = Family::<StateLabel, Gauge>::default();
        let cilium_policy_hosts = Gauge::default();
        registry.register(
            "egress_cilium_policy",
            "The egress proxy's CiliumNetworkPolicy: 1 on the current state (applied, crd_missing, namespace_missing, invalid, failed)",
            cilium_policy.clone(),
        );
        registry.register("egress_cilium_policy_hosts", "Host entries in the applied CiliumNetworkPolicy", cilium_policy_hosts.clone());
        let listener = crate::listener::ListenerMetrics::default();
        listener.register(&mut registry);
        let leading = Gauge::default();
        registry.register("controller_leading", "1 while this controller replica leads and writes, 0 on a standby", leading.clone());
        let warm_pods = Family::<StateLabel, Gauge>::default();
        let warm_hits = Counter::default();
        let warm_misses = Family::<KindLabel, Counter>::default();
        let warm_claim_seconds = Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]);
        registry.register("warm_pods", "Warm run pods by state (waiting, starting)", warm_pods.clone());
        registry.register("warm_hits", "Runs that claimed a warm pod", warm_hits.clone());
        registry.register("warm_misses", "Runs of a binding with a warm pool that started cold, by why", warm_misses.clone());
        registry.register("warm_claim_seconds", "From a run's admission to its warm pod claimed", warm_claim_seconds.clone());
        let network_policy_enforced = Gauge::default();
        network_policy_enforced.set(-1);
        registry.register(
            "network_policy_enforced",
            "Whether the NetworkPolicy probe found the CNI enforcing policies: 1 yes, 0 no, -1 unknown or not probed",
            network_policy_enforced.clone(),
        );
        Metrics {
            network_policy_enforced,
            warm_pods,
            warm_hits,
            warm_misses,
            warm_claim_seconds,
            leading,
            registry,
            reconciles,
            failures,
            duration,
            jobs_created,
            skilljobs_finished,
            skilljob_duration,
            cilium_policy,
            cilium_policy_hosts,
            listener,
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, kind: &str, took: Duration) {
        let label = KindLabel { kind: kind.into() };
        self.reconciles.get_or_create(&label).inc();
        self.duration.get_or_create(&label).observe(took.as_secs_f64());
    }

    pub fn failed(&self, kind: &str, error: &str) {
        self.failures.get_or_create(&ErrorLabel { kind: kind.into(), error: error.into() }).inc();
    }

    /// A SkillJob reached `phase` (a final one), `age` after its creation.
    pub fn skilljob_finished(&self, phase: crate::api::job::SkillJobPhase, age: Option<Duration>) {
        let label = PhaseLabel { phase: format!("{phase:?}") };
        self.skilljobs_finished.get_or_create(&label).inc();
        if let Some(age) = age {
            self.skilljob_duration.get_or_create(&label).observe(age.as_secs_f64());
        }
    }

    /// Record what the last CiliumNetworkPolicy attempt left.
    pub fn cilium_state(&self, state: super::cilium::state::PolicyState, hosts: usize) {
        for s in super::cilium::state::PolicyState::ALL {
            self.cilium_policy.get_or_create(&StateLabel { state: s.label().into() }).set(i64::from(s == state));
        }
        self.cilium_policy_hosts.set(i64::try_from(hosts).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_labels() {
        let m = Metrics::default();
        m.reconciled("SkillJob", Duration::from_millis(3));
        m.failed("SkillJob", "kube");
        m.jobs_created.inc();
        let text = m.render();
        assert!(text.contains(r#"skill_operator_reconciles_total{kind="SkillJob"} 1"#), "{text}");
        assert!(text.contains(r#"skill_operator_reconcile_failures_total{kind="SkillJob",error="kube"} 1"#), "{text}");
        assert!(text.contains("skill_operator_jobs_created_total 1"), "{text}");
    }

    #[test]
    fn a_final_phase_is_counted_with_its_age() {
        let m = Metrics::default();
        m.skilljob_finished(crate::api::job::SkillJobPhase::Succeeded, Some(Duration::from_millis(2_500)));
        m.skilljob_finished(crate::api::job::SkillJobPhase::TimedOut, None);
        let text = m.render();
        assert!(text.contains(r#"skill_operator_skilljobs_finished_total{phase="Succeeded"} 1"#), "{text}");
        assert!(text.contains(r#"skill_operator_skilljobs_finished_total{phase="TimedOut"} 1"#), "{text}");
        assert!(text.contains(r#"skill_operator_skilljob_duration_seconds_bucket{le="3.0",phase="Succeeded"} 1"#), "{text}");
        assert!(text.contains(r#"skill_operator_skilljob_duration_seconds_bucket{le="2.0",phase="Succeeded"} 0"#), "{text}");
    }
}
