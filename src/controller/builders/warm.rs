//! A warm run pod: a run's pod started before its run, waiting for one.
//!
//! Pod shape (a run Job's pod, three commands changed):
//!
//! ```text
//! initContainers:
//!   fetch   skill-operator fetch … --job WARM_UID --staged-package DIGEST --no-inputs --package /package …
//!           the package and the launcher, no inputs (there is no run yet)
//!   upload  skill-operator upload … --job WARM_UID --claim-dir /claim --claim-key /claim-key/key.json …
//!           (native sidecar) publishes the launcher's public key, waits for its claim at the artifact
//!           endpoint, then brings the claimed run's inputs into /work, writes /claim/claim.json and
//!           uploads the run's outputs under the SkillJob's uid
//! containers:
//!   run     /tools/skill-operator launch --claim-dir /claim --claim-key /claim-key/key.json --package-dir /package --empty-dir /tmp …
//!           makes the pod's key pair (the public half to /claim-key), waits for /claim/claim.json,
//!           checks that nothing was left in the pod before the claim (another process, a file in
//!           /tmp or /work; the verdict channel still held), opens the run's sealed variables, then runs the claimed script
//! ```
//!
//! Everything else is the run pod's, built by the same functions: restricted
//! security on every container, the same volumes and sizes, no
//! ServiceAccount token, no DNS, the token projected for this pod's own
//! identity (`warm-<32 hex>`, [`crate::artifacts::is_warm_uid`]) and good for
//! the artifact endpoint alone. Its labels put it under the namespace's run
//! NetworkPolicy from its first moment (managed-by, and the SkillJob-UID
//! label holding its warm uid): before a claim it reaches the artifact
//! endpoint and nothing else. It never gets the egress label or a
//! granted variable while it waits: a run's egress grant is bound at its
//! claim, and its variables come sealed to the launcher's key in the claim
//! (`crate::artifacts::sealed`).
//!
//! A claim (the controller's) relabels it for the run's SkillJob, which
//! then owns it; the pool's labels say which pool it belongs to
//! ([`LABEL_WARM_POOL`], the key of its shape) and whether it is still
//! waiting ([`LABEL_WARM_STATE`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::job::{
    controller_owner, empty_dir, fetch_container, mount, run_container, run_pod_spec, upload_container, volumes, JobParams,
    PackageDelivery, ANNOTATION_PACKAGE_DIGEST, CONTAINER_RUN, DEADLINE_SLACK_SECS, LAUNCHER, MAX_TIMEOUT_SECS, TMP_DIR,
};
use super::{Error, Result, LABEL_MANAGED_BY, LABEL_SKILLJOB_UID, MANAGED_BY};

/// The pool a warm pod belongs to: the key of its shape ([`crate::controller::warm`]).
pub const LABEL_WARM_POOL: &str = "skill-operator.dev/warm-pool";
/// The UID of the SkillBinding whose pool made it.
pub const LABEL_WARM_BINDING: &str = "skill-operator.dev/warm-binding";
/// [`WARM_IDLE`] until a run claims it, then [`WARM_CLAIMED`].
pub const LABEL_WARM_STATE: &str = "skill-operator.dev/warm-state";
pub const WARM_IDLE: &str = "idle";
pub const WARM_CLAIMED: &str = "claimed";
/// Where the claim reaches the run container (written by the sidecar).
pub const CLAIM_DIR: &str = "/claim";
pub const VOL_CLAIM: &str = "claim";
pub const SIZE_CLAIM: &str = "1Mi";
/// Where the launcher leaves the pod's public key for the sidecar (the one
/// volume the run container writes that the sidecar reads).
pub const CLAIM_KEY_DIR: &str = "/claim-key";
pub const CLAIM_KEY_FILE: &str = "/claim-key/key.json";
pub const VOL_CLAIM_KEY: &str = "claim-key";
pub const SIZE_CLAIM_KEY: &str = "64Ki";
/// Pod names: this and the warm uid's 32 hex digits.
pub const WARM_POD_PREFIX: &str = "skillwarm-";

/// The pod of the warm uid `warm-<32 hex>`.
pub fn warm_pod_name(warm_uid: &str) -> String {
    format!("{WARM_POD_PREFIX}{}", warm_uid.trim_start_matches("warm-"))
}

/// The warm uid of a warm pod's name (the inverse of [`warm_pod_name`]).
pub fn warm_uid_of(pod_name: &str) -> Option<String> {
    let uid = format!("warm-{}", pod_name.strip_prefix(WARM_POD_PREFIX)?);
    crate::artifacts::is_warm_uid(&uid).then_some(uid)
}

/// Everything [`build_warm_pod`] needs.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmPodParams {
    /// The shape, as a run of this pool would have it. Its run fields
    /// (script, args, env) are not used; `skilljob_uid` is the warm uid.
    pub shape: JobParams,
    /// `warm-<32 hex>`: the pod's identity at the artifact endpoint.
    pub warm_uid: String,
    /// The pool's key ([`LABEL_WARM_POOL`]).
    pub pool: String,
    /// The SkillBinding whose pool it is (owner; deleting it drains the pool).
    pub binding: OwnerReference,
    /// How long it may wait for a run before it is stopped anyway.
    pub idle_timeout_secs: u32,
}

impl WarmPodParams {
    pub fn validate(&self) -> Result<()> {
        if !crate::artifacts::is_warm_uid(&self.warm_uid) || self.shape.skilljob_uid != self.warm_uid {
            return Err(Error::InvalidUid(self.warm_uid.clone()));
        }
        if self.pool.is_empty() || self.pool.len() > 63 || !self.pool.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::InvalidName { field: "pool", value: self.pool.clone(), kind: "pool key (hex)" });
        }
        if self.binding.kind != "SkillBinding" || self.binding.uid.is_empty() || self.binding.name.is_empty() {
            return Err(Error::OwnerMismatch {
                name: self.binding.name.clone(),
                uid: self.binding.uid.clone(),
                problem: format!("owner is {} {:?}; a warm pod is owned by its SkillBinding", self.binding.kind, self.binding.name),
            });
        }
        if !self.shape.env.is_empty() || self.shape.egress_proxy.is_some() {
            return Err(Error::InvalidEnv {
                name: "(warm pod)".into(),
                problem: "a warm pod gets no granted variable and no egress: a run needing them starts cold",
            });
        }
        self.shape.validate_shape()
    }
}

fn command_of(container: &Container) -> Vec<String> {
    container.command.clone().unwrap_or_default()
}

/// Builds the pod. Never fails; see [`WarmPodParams::validate`].
pub fn build_warm_pod(w: &WarmPodParams) -> Pod {
    let p = &w.shape;
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_SKILLJOB_UID.to_string(), w.warm_uid.clone()),
        (LABEL_WARM_POOL.to_string(), w.pool.clone()),
        (LABEL_WARM_BINDING.to_string(), w.binding.uid.clone()),
        (LABEL_WARM_STATE.to_string(), WARM_IDLE.to_string()),
    ]);
    let mut annotations = BTreeMap::from([("kubectl.kubernetes.io/default-container".to_string(), CONTAINER_RUN.to_string())]);
    if let Some(digest) = &p.staged_package {
        annotations.insert(ANNOTATION_PACKAGE_DIGEST.to_string(), digest.clone());
    }

    let mut fetch = fetch_container(p);
    let mut cmd = command_of(&fetch);
    cmd.push("--no-inputs".into());
    fetch.command = Some(cmd);

    let mut upload = upload_container(p);
    let mut cmd = command_of(&upload);
    cmd.extend(["--claim-dir".to_string(), CLAIM_DIR.to_string(), "--claim-key".to_string(), CLAIM_KEY_FILE.to_string()]);
    upload.command = Some(cmd);
    // It writes the claimed run's inputs into /work, and the claim for `run`.
    for m in upload.volume_mounts.iter_mut().flatten() {
        if m.name == super::job::VOL_WORK {
            m.read_only = Some(false);
        }
    }
    upload
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .extend([mount(VOL_CLAIM, CLAIM_DIR, false), mount(VOL_CLAIM_KEY, CLAIM_KEY_DIR, true)]);

    let mut run = run_container(p);
    run.command = Some(launch_command(p, &run));
    run.volume_mounts.get_or_insert_with(Vec::new).extend([mount(VOL_CLAIM, CLAIM_DIR, true), mount(VOL_CLAIM_KEY, CLAIM_KEY_DIR, false)]);

    let mut vols = volumes(p);
    vols.push(empty_dir(VOL_CLAIM, SIZE_CLAIM));
    vols.push(empty_dir(VOL_CLAIM_KEY, SIZE_CLAIM_KEY));
    let mut spec = run_pod_spec(p, vec![fetch, upload], vec![run], vols);
    // A backstop: the pool stops a pod idle past its timeout itself.
    spec.active_deadline_seconds = Some(i64::from(w.idle_timeout_secs) + i64::from(MAX_TIMEOUT_SECS) + DEADLINE_SLACK_SECS);
    Pod {
        metadata: ObjectMeta {
            name: Some(warm_pod_name(&w.warm_uid)),
            namespace: Some(p.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![controller_owner(&w.binding)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The run container's launcher in claim mode: the run's own command comes
/// with the claim; what the pod sets (`--allow-env`) stays as a run's.
fn launch_command(p: &JobParams, run: &Container) -> Vec<String> {
    let root = match p.delivery {
        PackageDelivery::Fetched => super::job::PACKAGE_DIR,
        _ => super::job::SKILL_DIR,
    };
    let mut command: Vec<String> = [
        LAUNCHER,
        "launch",
        "--timeout",
        &MAX_TIMEOUT_SECS.to_string(),
        "--claim-dir",
        CLAIM_DIR,
        "--claim-key",
        CLAIM_KEY_FILE,
        "--package-dir",
        root,
        "--empty-dir",
        TMP_DIR,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Keep the `--allow-env` list the run's builder made (it names what the pod and image set).
    let old = command_of(run);
    let mut it = old.iter();
    while let Some(arg) = it.next() {
        if arg == "--allow-env" {
            if let Some(name) = it.next() {
                command.extend(["--allow-env".to_string(), name.clone()]);
            }
        }
        if arg == "--" {
            break;
        }
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::builders::job::{EnvGrant, CONTAINER_FETCH, CONTAINER_UPLOAD};

    const WARM: &str = "warm-0123456789abcdef0123456789abcdef";

    fn params() -> WarmPodParams {
        WarmPodParams {
            shape: JobParams {
                skilljob_name: "csv-stats".into(),
                namespace: "team".into(),
                skilljob_uid: WARM.into(),
                run_image: "registry.local/python@sha256:aa".into(),
                operator_image: "registry.local/skill-operator@sha256:bb".into(),
                timeout_secs: MAX_TIMEOUT_SECS,
                artifact_endpoint: "http://10.0.0.50:8080".into(),
                service_account: "skill-runner".into(),
                staged_package: Some(format!("sha256:{}", "c".repeat(64))),
                ..JobParams::default()
            },
            warm_uid: WARM.into(),
            pool: "0123456789abcdef0123".into(),
            binding: OwnerReference {
                api_version: "skill-operator.dev/v1alpha1".into(),
                kind: "SkillBinding".into(),
                name: "csv-stats".into(),
                uid: "b-uid".into(),
                ..Default::default()
            },
            idle_timeout_secs: 600,
        }
    }

    fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
        let spec = pod.spec.as_ref().unwrap();
        spec.init_containers.iter().flatten().chain(spec.containers.iter()).find(|c| c.name == name).unwrap()
    }

    fn mount_of(c: &Container, name: &str) -> Option<bool> {
        c.volume_mounts.iter().flatten().find(|m| m.name == name).map(|m| m.read_only == Some(true))
    }

    #[test]
    fn a_warm_pod_waits_for_its_claim_under_the_run_policy_with_nothing_of_a_run() {
        let w = params();
        w.validate().unwrap();
        let pod = build_warm_pod(&w);
        assert_eq!(pod.metadata.name.as_deref(), Some("skillwarm-0123456789abcdef0123456789abcdef"));
        assert_eq!(warm_uid_of(pod.metadata.name.as_deref().unwrap()).as_deref(), Some(WARM));
        let labels = pod.metadata.labels.clone().unwrap();
        // Selected by the namespace's run policy from its first moment; never by the egress one.
        assert_eq!(labels.get(LABEL_SKILLJOB_UID).map(String::as_str), Some(WARM));
        assert_eq!(labels.get(LABEL_MANAGED_BY).map(String::as_str), Some(MANAGED_BY));
        assert!(!labels.contains_key(super::super::LABEL_EGRESS));
        assert_eq!(labels.get(LABEL_WARM_STATE).map(String::as_str), Some(WARM_IDLE));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("SkillBinding", Some(true)));
        // The staged copy it fetches stays while it lives (the sweep reads this).
        assert!(pod.metadata.annotations.as_ref().unwrap().contains_key(ANNOTATION_PACKAGE_DIGEST));

        let fetch = container(&pod, CONTAINER_FETCH).command.clone().unwrap();
        assert!(fetch.contains(&"--no-inputs".to_string()) && fetch.contains(&"--staged-package".to_string()), "{fetch:?}");
        let upload = container(&pod, CONTAINER_UPLOAD);
        assert!(upload.command.as_ref().unwrap().windows(2).any(|w| w == ["--claim-dir", CLAIM_DIR]));
        assert_eq!(mount_of(upload, VOL_CLAIM), Some(false));
        assert_eq!(mount_of(upload, super::super::job::VOL_WORK), Some(false), "the sidecar brings the inputs");
        let run = container(&pod, CONTAINER_RUN);
        let cmd = run.command.clone().unwrap();
        assert!(!cmd.contains(&"--".to_string()), "the run's command comes with the claim: {cmd:?}");
        assert!(cmd.windows(2).any(|w| w == ["--claim-dir", CLAIM_DIR]) && cmd.windows(2).any(|w| w == ["--empty-dir", TMP_DIR]));
        assert_eq!(mount_of(run, VOL_CLAIM), Some(true), "the script cannot rewrite its claim");
        // The key pair is the launcher's: it writes the public half, the sidecar reads it.
        assert!(cmd.windows(2).any(|w| w == ["--claim-key", CLAIM_KEY_FILE]), "{cmd:?}");
        assert!(upload.command.as_ref().unwrap().windows(2).any(|w| w == ["--claim-key", CLAIM_KEY_FILE]));
        assert_eq!((mount_of(run, VOL_CLAIM_KEY), mount_of(upload, VOL_CLAIM_KEY)), (Some(false), Some(true)));
        assert!(CLAIM_KEY_FILE.starts_with(&format!("{CLAIM_KEY_DIR}/")));
        let vols = pod.spec.as_ref().unwrap().volumes.clone().unwrap_or_default();
        let key_vol = vols.iter().find(|v| v.name == VOL_CLAIM_KEY).and_then(|v| v.empty_dir.clone()).expect("an emptyDir for the key");
        assert_eq!(key_vol.size_limit.map(|q| q.0).as_deref(), Some(SIZE_CLAIM_KEY));
        assert_eq!(mount_of(run, super::super::job::VOL_PACKAGE), Some(true));
        assert_eq!(mount_of(run, super::super::job::VOL_TOKEN), None, "no token in the script's container");
        let env: Vec<_> = run.env.iter().flatten().map(|e| e.name.clone()).collect();
        assert!(!env.iter().any(|n| n.to_ascii_lowercase().contains("proxy")), "{env:?}");
        assert!(run.env.iter().flatten().all(|e| e.value_from.is_none()), "no Secret reaches a waiting pod");
        // Claimed at most at its idle timeout, it still has a whole run's time.
        let deadline = pod.spec.as_ref().unwrap().active_deadline_seconds.unwrap();
        assert_eq!(deadline, 600 + i64::from(MAX_TIMEOUT_SECS) + DEADLINE_SLACK_SECS);
    }

    #[test]
    fn a_warm_pod_is_refused_a_grant_egress_another_identity_or_owner() {
        let mut w = params();
        w.shape.env = vec![EnvGrant::from(("API_KEY", "keys", "api"))];
        assert!(w.validate().is_err(), "a granted variable would sit in a pod before its run");
        let mut w = params();
        w.shape.egress_proxy = Some("http://10.0.0.51:3128".into());
        assert!(w.validate().is_err(), "a waiting pod gets no network");
        let mut w = params();
        w.warm_uid = "0123456789abcdef0123456789abcdef".into();
        assert!(w.validate().is_err(), "not a warm uid");
        let mut w = params();
        w.shape.skilljob_uid = "warm-ffffffffffffffffffffffffffffffff".into();
        assert!(w.validate().is_err(), "the token's audience must be the pod's own identity");
        let mut w = params();
        w.binding.kind = "SkillJob".into();
        assert!(w.validate().is_err());
        let mut w = params();
        w.pool = "not hex!".into();
        assert!(w.validate().is_err());
    }
}
