//! The proxy in the cluster: its jobs are the SkillJobs the controller
//! has sealed (`egress-proxy --watch-skilljobs`).
//!
//! The controller writes `status.egress` of every run that may reach the
//! network: the effective allowlist, and, once the run's pod has one, the
//! pod's address, with a seal, an HMAC over namespace, uid, address and
//! allowlist under a key derived from the operator key. The proxy watches
//! SkillJobs (get/list/watch, nothing else) and serves a job exactly while
//! its record is sealed, its phase is Pending or Running and it names a
//! pod address; any other record removes the job. So:
//! - a token copied to another pod is refused (the source address differs);
//! - a status written by anyone but the controller (someone granted
//!   `skilljobs/status`) does not verify and serves nothing;
//! - a finished run's address, which the cluster will give to another pod,
//!   stops counting the moment its phase is final.
//!
//! Why the controller records the address rather than the proxy watching
//! pods: a pod's labels and owner references are written by whoever creates
//! it, so a pod claiming to be a run's is easy to make; the controller
//! takes the address only when exactly one live pod carries the run's
//! labels, and the seal says it did.

use std::net::IpAddr;
use std::time::Duration;

use futures::StreamExt;
use hmac::{Hmac, Mac};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use sha2::Sha256;

use super::allowlist::Allowlist;
use super::config::JobBudget;
use super::identity::JobId;
use super::registry::{JobSpec, MemoryRegistry};
use crate::api::job::{JobEgress, SkillJob, SkillJobPhase};

/// Domain separation for the seal key.
const SEAL_CONTEXT: &[u8] = b"skill-operator egress-proxy seal v1";
/// Pause before the watch is started again after it ended.
const REWATCH: Duration = Duration::from_secs(2);

fn seal_mac(operator_key: &[u8], job: &JobId, pod_ip: &str, allowed: &[String]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length: new_from_slice cannot fail.
    let mut derive = <Hmac<Sha256> as Mac>::new_from_slice(operator_key).unwrap_or_else(|_| unreachable!());
    derive.update(SEAL_CONTEXT);
    let key = derive.finalize().into_bytes();
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap_or_else(|_| unreachable!());
    // Length-prefixed fields: no two records share a message.
    for field in [job.namespace.as_str(), job.uid.as_str(), pod_ip].into_iter().chain(allowed.iter().map(String::as_str)) {
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field.as_bytes());
    }
    mac
}

/// The seal the controller writes beside a run's pod address.
pub fn seal(operator_key: &[u8], job: &JobId, pod_ip: &str, allowed: &[String]) -> String {
    hex::encode(seal_mac(operator_key, job, pod_ip, allowed).finalize().into_bytes())
}

/// Whether a record was sealed by the holder of `operator_key` (constant time).
pub fn verify_seal(operator_key: &[u8], job: &JobId, pod_ip: &str, allowed: &[String], seal: &str) -> bool {
    let Ok(bytes) = hex::decode(seal) else { return false };
    seal_mac(operator_key, job, pod_ip, allowed).verify_slice(&bytes).is_ok()
}

/// Why a SkillJob is not served (for the debug log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotServed {
    #[error("the SkillJob has no network")]
    NoEgress,
    #[error("the run is over")]
    Finished,
    #[error("the run's pod has no address recorded yet")]
    NoAddress,
    #[error("the record's seal does not verify (not written by the controller)")]
    BadSeal,
    #[error("the recorded address or allowlist does not parse: {0}")]
    Invalid(String),
}

/// The proxy's entry for a SkillJob, or why it has none.
pub fn job_spec(operator_key: &[u8], sj: &SkillJob) -> Result<JobSpec, NotServed> {
    let (Some(namespace), Some(uid)) = (sj.namespace(), sj.uid()) else { return Err(NotServed::Invalid("no namespace or uid".into())) };
    let status = sj.status.as_ref().ok_or(NotServed::NoEgress)?;
    let egress: &JobEgress = status.egress.as_ref().filter(|e| !e.allowed.is_empty()).ok_or(NotServed::NoEgress)?;
    if !matches!(status.phase, Some(SkillJobPhase::Pending | SkillJobPhase::Running)) {
        return Err(NotServed::Finished);
    }
    let pod_ip = egress.pod_ip.as_deref().ok_or(NotServed::NoAddress)?;
    let job = JobId::new(namespace, uid);
    if !egress.seal.as_deref().is_some_and(|s| verify_seal(operator_key, &job, pod_ip, &egress.allowed, s)) {
        return Err(NotServed::BadSeal);
    }
    let source: IpAddr = pod_ip.parse().map_err(|_| NotServed::Invalid(format!("podIP {pod_ip:?}")))?;
    let allow = Allowlist::parse(egress.allowed.iter().map(String::as_str)).map_err(|e| NotServed::Invalid(e.to_string()))?;
    Ok(JobSpec { namespace: job.namespace, uid: job.uid, allow, source: Some(source), limits: JobBudget::default() })
}

/// Apply one SkillJob's current state to the registry.
pub fn apply(registry: &MemoryRegistry, operator_key: &[u8], sj: &SkillJob) {
    let (Some(ns), Some(uid)) = (sj.namespace(), sj.uid()) else { return };
    let id = JobId::new(ns, uid);
    match job_spec(operator_key, sj) {
        Ok(spec) => {
            let known = registry.job_spec(&id);
            if known.as_ref() != Some(&spec) {
                tracing::info!(target: "skill_operator::egress", job = %id, source = ?spec.source, allow = %spec.allow, "job served");
            }
            registry.upsert(spec);
        }
        Err(why) => {
            if registry.job_spec(&id).is_some() {
                tracing::info!(target: "skill_operator::egress", job = %id, %why, "job no longer served");
            } else if why == NotServed::BadSeal {
                tracing::warn!(target: "skill_operator::egress", job = %id, %why, "job refused");
            }
            registry.remove(&id);
        }
    }
}

/// Keep `registry` equal to the sealed SkillJobs until the task is dropped.
/// A watch that ends (API server restart, expired resource version) is
/// started again; its initial list replaces the registry as a whole, so a
/// SkillJob deleted meanwhile is not left behind.
pub async fn watch(api: Api<SkillJob>, config: watcher::Config, registry: MemoryRegistry, operator_key: Vec<u8>) {
    loop {
        let mut initial: Vec<JobSpec> = Vec::new();
        let mut events = watcher(api.clone(), config.clone()).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => initial.clear(),
                Ok(watcher::Event::InitApply(sj)) => initial.extend(job_spec(&operator_key, &sj).ok()),
                Ok(watcher::Event::InitDone) => {
                    let n = initial.len();
                    registry.replace_all(std::mem::take(&mut initial));
                    tracing::info!(target: "skill_operator::egress", jobs = n, "SkillJobs listed");
                }
                Ok(watcher::Event::Apply(sj)) => apply(&registry, &operator_key, &sj),
                Ok(watcher::Event::Delete(sj)) => {
                    if let (Some(ns), Some(uid)) = (sj.namespace(), sj.uid()) {
                        registry.remove(&JobId::new(ns, uid));
                    }
                }
                Err(e) => {
                    // The watcher retries by itself; say so once per error.
                    tracing::warn!(target: "skill_operator::egress", error = %e, "watching SkillJobs failed; retrying");
                    tokio::time::sleep(REWATCH).await;
                }
            }
        }
        tokio::time::sleep(REWATCH).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::job::{SkillJobSpec, SkillJobStatus};

    const KEY: &[u8] = &[9u8; 32];

    fn sj(phase: SkillJobPhase, egress: Option<JobEgress>) -> SkillJob {
        let mut sj = SkillJob::new(
            "run",
            SkillJobSpec { binding: "b".into(), script: "s".into(), args: vec![], inputs: vec![], timeout_seconds: None },
        );
        sj.metadata.namespace = Some("team".into());
        sj.metadata.uid = Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into());
        sj.status = Some(SkillJobStatus { phase: Some(phase), egress, ..Default::default() });
        sj
    }

    fn sealed(ip: &str, allowed: &[&str]) -> JobEgress {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        let job = JobId::new("team", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
        JobEgress { proposed: vec![], seal: Some(seal(KEY, &job, ip, &allowed)), allowed, pod_ip: Some(ip.into()) }
    }

    #[test]
    fn a_sealed_running_job_is_served_from_its_pod_address_only() {
        let spec = job_spec(KEY, &sj(SkillJobPhase::Running, Some(sealed("10.88.0.7", &["api.example.com:443"])))).unwrap();
        assert_eq!(spec.source, Some("10.88.0.7".parse().unwrap()));
        assert_eq!(spec.allow.to_string(), "api.example.com:443");
        assert!(job_spec(KEY, &sj(SkillJobPhase::Pending, Some(sealed("10.88.0.7", &["a.example.com"])))).is_ok());
    }

    #[test]
    fn anything_but_the_controllers_record_serves_nothing() {
        let mut widened = sealed("10.88.0.7", &["api.example.com:443"]);
        widened.allowed.push("evil.example:443".into());
        assert_eq!(job_spec(KEY, &sj(SkillJobPhase::Running, Some(widened))), Err(NotServed::BadSeal));
        let mut moved = sealed("10.88.0.7", &["api.example.com:443"]);
        moved.pod_ip = Some("10.88.0.8".into());
        assert_eq!(job_spec(KEY, &sj(SkillJobPhase::Running, Some(moved))), Err(NotServed::BadSeal));
        let mut unsealed = sealed("10.88.0.7", &["api.example.com:443"]);
        unsealed.seal = None;
        assert_eq!(job_spec(KEY, &sj(SkillJobPhase::Running, Some(unsealed))), Err(NotServed::BadSeal));
        // Another key (another operator) does not verify either.
        assert_eq!(
            job_spec(&[1u8; 32], &sj(SkillJobPhase::Running, Some(sealed("10.88.0.7", &["api.example.com:443"])))),
            Err(NotServed::BadSeal)
        );
        // No address yet, a finished run, no egress: not served.
        let mut waiting = sealed("10.88.0.7", &["api.example.com:443"]);
        waiting.pod_ip = None;
        assert_eq!(job_spec(KEY, &sj(SkillJobPhase::Pending, Some(waiting))), Err(NotServed::NoAddress));
        for phase in
            [SkillJobPhase::Succeeded, SkillJobPhase::Failed, SkillJobPhase::TimedOut, SkillJobPhase::Cancelled, SkillJobPhase::Locked]
        {
            assert_eq!(job_spec(KEY, &sj(phase, Some(sealed("10.88.0.7", &["a.example.com"])))), Err(NotServed::Finished), "{phase:?}");
        }
        assert_eq!(job_spec(KEY, &sj(SkillJobPhase::Running, Some(sealed("10.88.0.7", &[])))), Err(NotServed::NoEgress));
        assert_eq!(job_spec(KEY, &sj(SkillJobPhase::Running, None)), Err(NotServed::NoEgress));
    }

    #[test]
    fn the_registry_follows_the_records() {
        let registry = MemoryRegistry::new();
        let id = JobId::new("team", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
        apply(&registry, KEY, &sj(SkillJobPhase::Running, Some(sealed("10.88.0.7", &["a.example.com"]))));
        assert!(registry.job_spec(&id).is_some());
        apply(&registry, KEY, &sj(SkillJobPhase::Succeeded, Some(sealed("10.88.0.7", &["a.example.com"]))));
        assert!(registry.job_spec(&id).is_none(), "a finished run's address must stop counting");
    }

    #[test]
    fn seal_fields_cannot_shift() {
        let job = JobId::new("a", "b");
        // "x" + "yz" vs "xy" + "z": length prefixes keep them apart.
        assert_ne!(seal(KEY, &job, "1.2.3.4", &["x".into(), "yz".into()]), seal(KEY, &job, "1.2.3.4", &["xy".into(), "z".into()]));
        assert!(!verify_seal(KEY, &job, "1.2.3.4", &[], "not hex"));
    }
}
