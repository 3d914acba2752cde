//! The dependency build Job and its NetworkPolicy, and the run Job of a
//! prepared package (composed image, image volume): every restricted and
//! hardening field, what each container may touch, and what validation
//! refuses. Golden files and `kubernetes-validate` are in
//! builders_golden.rs and builders_schema.rs.

#[path = "builders/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::core::v1::PodSpec;
use skill_operator::controller::builders::build_job::{
    build_build_job, build_network_policy, deps_command, CONTAINER_BUILD, LABEL_BUILD, OUTPUT_DEPS_PREFIX, OUTPUT_REPORT,
};
use skill_operator::controller::builders::job::{SKILL_DIR, VOL_PACKAGE, VOL_PREPARED, VOL_TOKEN};
use skill_operator::controller::builders::{
    build_job, hardening_violations, restricted_template_violations, restricted_violations, Error, IndexAddress, PackageDelivery,
};

fn build_pod(p: &skill_operator::controller::builders::BuildParams) -> PodSpec {
    build_build_job(p).spec.unwrap().template.spec.unwrap()
}

fn mounts(c: &k8s_openapi::api::core::v1::Container) -> Vec<(String, String, bool)> {
    c.volume_mounts.iter().flatten().map(|m| (m.name.clone(), m.mount_path.clone(), m.read_only == Some(true))).collect()
}

// ------------------------------------------------------------ build Job

#[test]
fn build_params_are_valid_and_the_pod_is_restricted_and_hardened() {
    for p in [build_params(), build_params_full()] {
        p.validate().unwrap();
        let job = build_build_job(&p);
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(restricted_violations(pod), Vec::<String>::new());
        assert_eq!(restricted_template_violations(&job.spec.as_ref().unwrap().template), Vec::<String>::new());
        assert_eq!(hardening_violations(pod), Vec::<String>::new());
    }
}

#[test]
fn every_build_container_has_every_restricted_field() {
    let pod = build_pod(&build_params());
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.enable_service_links, Some(false));
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod.dns_policy.as_deref(), Some("None"), "no DNS: a tunnel");
    for c in all_containers(&pod) {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
        assert!(sc.run_as_user.unwrap() > 0 && sc.run_as_group.unwrap() > 0);
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.capabilities.as_ref().unwrap().drop, Some(vec!["ALL".to_string()]));
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.requests, r.limits, "{}: requests == limits", c.name);
    }
    let spec = build_build_job(&build_params()).spec.unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert!(spec.active_deadline_seconds.unwrap() > 300, "the deadline covers the launcher's 300 s plus pulls and uploads");
    assert!(spec.ttl_seconds_after_finished.is_some());
}

#[test]
fn the_build_gets_no_credential_and_cannot_write_the_package() {
    let pod = build_pod(&build_params());
    let build = container(&pod, CONTAINER_BUILD);
    let m = mounts(build);
    assert!(m.iter().all(|(n, _, _)| n != VOL_TOKEN), "the build container never sees the token: {m:?}");
    assert!(m.contains(&(VOL_PACKAGE.into(), "/package".into(), true)), "package read-only: {m:?}");
    assert!(build.env.iter().flatten().all(|e| e.value_from.is_none()), "no secret env");
    // Only fetch and upload hold the per-build token.
    for c in all_containers(&pod) {
        let has_token = mounts(c).iter().any(|(n, _, _)| n == VOL_TOKEN);
        assert_eq!(has_token, c.name != CONTAINER_BUILD, "{}", c.name);
    }
    assert_eq!(build.image.as_deref(), Some(BASE_PINNED), "the build runs in the pinned base");
}

#[test]
fn the_build_runs_image_deps_under_the_launcher_with_the_index_only() {
    let pod = build_pod(&build_params());
    let cmd = command(container(&pod, CONTAINER_BUILD));
    let split = cmd.iter().position(|a| *a == "--").unwrap();
    assert_eq!(&cmd[..3], ["/tools/skill-operator", "launch", "--timeout"]);
    let allowed: Vec<&str> = cmd[..split].windows(2).filter(|w| w[0] == "--allow-env").map(|w| w[1]).collect();
    assert_eq!(allowed, ["HOME", "TMPDIR", "PATH"], "nothing else of the container's environment reaches pip");
    let deps = &cmd[split + 1..];
    assert_eq!(&deps[..3], ["/tools/skill-operator", "image", "deps"]);
    assert!(deps.contains(&"--refuse-lifecycle-scripts"));
    assert!(deps.windows(2).any(|w| w == ["--index-url", "http://10.88.0.1:8999/simple"]));
    assert!(deps.windows(2).any(|w| w == ["--trusted-host", "10.88.0.1"]), "pip ignores a plain-HTTP index it does not trust");
    assert!(deps.windows(2).any(|w| w == ["--out", "/work/deps"]) && deps.windows(2).any(|w| w == ["--report", "/work/deps-report.json"]));
    // Where the controller reads them back: under work/ in the outputs.
    assert_eq!((OUTPUT_REPORT, OUTPUT_DEPS_PREFIX), ("work/deps-report.json", "work/deps/"));
    let full = deps_command(&build_params_full());
    assert!(!full.iter().any(|a| a == "--trusted-host"), "an HTTPS index needs no trust exception");
    assert!(full.windows(2).any(|w| w == ["--npm-registry", "https://npm.mirror.example/"]));
    let fetch = command(container(&pod, "fetch"));
    assert!(fetch.windows(2).any(|w| w == ["--job", BUILD_UID]), "files go under the build's own UID");
}

#[test]
fn build_validation_refuses_what_would_widen_it() {
    let bad = |f: &dyn Fn(&mut skill_operator::controller::builders::BuildParams)| {
        let mut p = build_params();
        f(&mut p);
        p.validate().unwrap_err()
    };
    assert!(matches!(bad(&|p| p.base_image = "127.0.0.1:5000/runtime:trixie".into()), Error::InvalidImage { field: "base_image", .. }));
    assert!(matches!(bad(&|p| p.pip_index_url = None), Error::Missing { .. }));
    assert!(matches!(bad(&|p| p.pip_index_url = Some("https://pypi.org/simple".into())), Error::NeedsDns { .. }), "no DNS in the pod");
    assert!(matches!(bad(&|p| p.owner.kind = "SkillJob".into()), Error::OwnerMismatch { .. }));
    assert!(matches!(bad(&|p| p.owner.name = "other".into()), Error::OwnerMismatch { .. }));
    assert!(matches!(bad(&|p| p.run_as_user = 0), Error::RootId { .. }));
    assert!(matches!(bad(&|p| p.timeout_secs = 301), Error::InvalidTimeout(301)));
    assert!(matches!(bad(&|p| p.build_uid = "build/../x".into()), Error::InvalidUid(_)));
    assert!(matches!(bad(&|p| p.name = "Build".into()), Error::InvalidName { .. }));
    assert!(matches!(bad(&|p| p.pip_index_url = Some("file:///etc".into())), Error::InvalidUrl { .. }));
}

#[test]
fn the_build_policy_allows_the_endpoint_and_the_indexes_only() {
    let p = build_netpol_params();
    p.validate().unwrap();
    let np = build_network_policy(&p);
    let spec = np.spec.unwrap();
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string(), "Egress".to_string()]));
    assert_eq!(spec.ingress, Some(vec![]));
    assert_eq!(spec.pod_selector.unwrap().match_labels, Some(BTreeMap::from([(LABEL_BUILD.to_string(), BUILD.to_string())])));
    let egress = spec.egress.unwrap();
    assert_eq!(egress.len(), 2);
    assert!(egress[0].to.as_ref().unwrap()[0].pod_selector.is_some(), "the artifact endpoint pods");
    let block = egress[1].to.as_ref().unwrap()[0].ip_block.as_ref().unwrap();
    assert_eq!((block.cidr.as_str(), block.except.is_none()), ("10.88.0.1/32", true));
    assert_eq!(serde_json::to_value(&egress[1].ports).unwrap(), serde_json::json!([{ "port": 8999, "protocol": "TCP" }]));
    assert_eq!(np.metadata.owner_references.unwrap()[0].kind, "Job", "the policy goes with its build");
}

#[test]
fn the_build_policy_refuses_to_open_more() {
    let bad = |f: &dyn Fn(&mut skill_operator::controller::builders::BuildNetPolParams)| {
        let mut p = build_netpol_params();
        f(&mut p);
        p.validate().is_err()
    };
    assert!(bad(&|p| p.indexes.clear()), "no index: nothing to allow, nothing to build");
    assert!(bad(&|p| p.indexes = vec![IndexAddress { ip: "0.0.0.0".parse().unwrap(), port: 443 }]), "0.0.0.0/32 is not an index");
    assert!(bad(&|p| p.indexes[0].port = 0));
    assert!(bad(&|p| p.artifact.pod_labels.clear()), "an empty selector would select every pod");
    assert!(bad(&|p| p.owner.kind = "SkillPackage".into()));
}

// ------------------------------------------------------- prepared runs

#[test]
fn a_prepared_run_starts_from_its_image_and_fetches_no_package() {
    let p = params_prepared();
    p.validate().unwrap();
    let job = build_job(&p);
    let pod = pod(&job);
    assert_eq!(restricted_violations(pod), Vec::<String>::new());
    assert_eq!(hardening_violations(pod), Vec::<String>::new());
    let run = container(pod, "run");
    assert_eq!(run.image.as_deref(), Some(PREPARED_IMAGE));
    assert_eq!(run.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let cmd = command(run);
    assert!(cmd.contains(&"/skill/scripts/report.py"), "{cmd:?}");
    assert!(cmd.windows(2).any(|w| w == ["--allow-env", "PYTHONPATH"]), "the image config's PYTHONPATH passes the launcher");
    assert!(run.env.iter().flatten().all(|e| e.name != "PYTHONPATH"), "the value is the image's, not the pod's");
    let fetch = command(container(pod, "fetch"));
    assert!(!fetch.contains(&"--package"), "{fetch:?}");
    assert!(fetch.contains(&"--work") && fetch.contains(&"--tools"), "inputs and the launcher are still fetched");
    assert!(pod.volumes.iter().flatten().all(|v| v.name != VOL_PACKAGE));
    assert!(all_containers(pod).iter().all(|c| mounts(c).iter().all(|(n, _, _)| n != VOL_PACKAGE)));
}

#[test]
fn an_image_volume_run_mounts_the_package_read_only_on_the_base() {
    let p = params_image_volume();
    p.validate().unwrap();
    let job = build_job(&p);
    let pod = pod(&job);
    assert_eq!(restricted_violations(pod), Vec::<String>::new(), "image volumes are allowed by restricted since 1.33");
    assert_eq!(hardening_violations(pod), Vec::<String>::new());
    let v = pod.volumes.iter().flatten().find(|v| v.name == VOL_PREPARED).unwrap();
    let image = v.image.as_ref().unwrap();
    assert_eq!((image.reference.as_deref(), image.pull_policy.as_deref()), (Some(PREPARED_IMAGE), Some("IfNotPresent")));
    let run = container(pod, "run");
    assert_eq!(run.image.as_deref(), Some(BASE_PINNED));
    let prepared: Vec<(String, Option<String>, Option<bool>)> = run
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name == VOL_PREPARED)
        .map(|m| (m.mount_path.clone(), m.sub_path.clone(), m.read_only))
        .collect();
    assert_eq!(
        prepared,
        vec![(SKILL_DIR.to_string(), Some("skill".to_string()), Some(true)), ("/deps".to_string(), Some("deps".to_string()), Some(true))]
    );
    assert!(run.env.iter().flatten().any(|e| e.name == "PYTHONPATH" && e.value.as_deref() == Some("/deps/python")));
    assert!(command(run).windows(2).any(|w| w == ["--allow-env", "PYTHONPATH"]));
    // Only the run container sees the volume.
    for c in all_containers(pod).into_iter().filter(|c| c.name != "run") {
        assert!(mounts(c).iter().all(|(n, _, _)| n != VOL_PREPARED), "{}", c.name);
    }
}

#[test]
fn prepared_runs_refuse_tags_and_foreign_environment() {
    let mut p = params_prepared();
    p.run_image = "127.0.0.1:5000/prepared:weather".into();
    assert!(matches!(p.validate(), Err(Error::InvalidImage { field: "run_image", .. })), "a prepared package runs by digest");
    let mut p = params_prepared();
    p.delivery = PackageDelivery::InImage { env: vec!["LD_PRELOAD".into()] };
    assert!(matches!(p.validate(), Err(Error::InvalidEnv { .. })));
    let mut p = params_image_volume();
    p.delivery =
        PackageDelivery::ImageVolume { reference: PREPARED_IMAGE.into(), deps: true, env: vec![("PYTHONPATH".into(), "/work".into())] };
    assert!(matches!(p.validate(), Err(Error::InvalidEnv { .. })), "PYTHONPATH=/work would import an input as code");
    let mut p = params_image_volume();
    p.delivery = PackageDelivery::ImageVolume { reference: "127.0.0.1:5000/prepared:x".into(), deps: false, env: vec![] };
    assert!(matches!(p.validate(), Err(Error::InvalidImage { field: "delivery.reference", .. })));
}

#[test]
fn an_image_volume_without_dependencies_mounts_only_the_skill() {
    let mut p = params_image_volume();
    p.delivery = PackageDelivery::ImageVolume { reference: PREPARED_IMAGE.into(), deps: false, env: vec![] };
    p.validate().unwrap();
    let job = build_job(&p);
    let run = container(pod(&job), "run");
    let paths: Vec<&str> = run.volume_mounts.iter().flatten().filter(|m| m.name == VOL_PREPARED).map(|m| m.mount_path.as_str()).collect();
    assert_eq!(paths, [SKILL_DIR]);
}
