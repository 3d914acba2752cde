//! restricted_violations and hardening_violations: a compliant pod (the
//! builder's, plus a compliant ephemeral container) broken one rule at a
//! time, on a main container, an init container, the native sidecar and an
//! ephemeral container.

#[path = "builders/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, ContainerPort, EphemeralContainer, HTTPGetAction, HostPathVolumeSource, Lifecycle, LifecycleHandler,
    NFSVolumeSource, PodOS, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, SELinuxOptions, SeccompProfile, SecurityContext,
    ServiceAccountTokenProjection, Sysctl, TCPSocketAction, Volume, VolumeProjection, WindowsSecurityContextOptions,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use skill_operator::controller::builders::{build_job, hardening_violations, restricted_template_violations, restricted_violations};

#[derive(Clone, Copy, Debug)]
enum Target {
    Run,
    Fetch,
    Upload,
    Ephemeral,
}

const TARGETS: [Target; 4] = [Target::Run, Target::Fetch, Target::Upload, Target::Ephemeral];

impl Target {
    fn at(self) -> &'static str {
        match self {
            Target::Run => r#"containers[0] "run""#,
            Target::Fetch => r#"initContainers[0] "fetch""#,
            Target::Upload => r#"initContainers[1] "upload""#,
            Target::Ephemeral => r#"ephemeralContainers[0] "debug""#,
        }
    }

    fn sc(self, spec: &mut PodSpec) -> &mut SecurityContext {
        let slot = match self {
            Target::Run => &mut spec.containers[0].security_context,
            Target::Fetch => &mut spec.init_containers.as_mut().unwrap()[0].security_context,
            Target::Upload => &mut spec.init_containers.as_mut().unwrap()[1].security_context,
            Target::Ephemeral => &mut spec.ephemeral_containers.as_mut().unwrap()[0].security_context,
        };
        slot.get_or_insert_with(Default::default)
    }

    fn probes(self, spec: &mut PodSpec) -> (&mut Option<Probe>, &mut Option<Lifecycle>, &mut Option<Vec<ContainerPort>>) {
        match self {
            Target::Ephemeral => {
                let c = &mut spec.ephemeral_containers.as_mut().unwrap()[0];
                (&mut c.readiness_probe, &mut c.lifecycle, &mut c.ports)
            }
            _ => {
                let c = match self {
                    Target::Run => &mut spec.containers[0],
                    Target::Fetch => &mut spec.init_containers.as_mut().unwrap()[0],
                    _ => &mut spec.init_containers.as_mut().unwrap()[1],
                };
                (&mut c.readiness_probe, &mut c.lifecycle, &mut c.ports)
            }
        }
    }
}

/// The builder's pod plus a compliant ephemeral container.
fn compliant() -> PodSpec {
    let mut spec = pod(&build_job(&params())).clone();
    let run = spec.containers[0].clone();
    spec.ephemeral_containers = Some(vec![EphemeralContainer {
        name: "debug".into(),
        image: Some("busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000".into()),
        command: Some(vec!["sleep".into(), "600".into()]),
        security_context: run.security_context.clone(),
        target_container_name: Some("run".into()),
        ..Default::default()
    }]);
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
    assert_eq!(hardening_violations(&spec), Vec::<String>::new());
    spec
}

/// Asserts that `spec` breaks exactly check `id`, with every message naming
/// `at` and `field`.
fn assert_only(spec: &PodSpec, id: &str, at: &str, field: &str) {
    let v = restricted_violations(spec);
    assert!(!v.is_empty(), "expected a {id} violation at {at}");
    for m in &v {
        assert!(m.starts_with(&format!("{id}: ")), "unexpected violation {m:?} (expected only {id})");
        assert!(m.contains(at), "{m:?} does not name {at}");
        assert!(m.contains(field), "{m:?} does not name {field}");
    }
}

fn assert_hardening(spec: &PodSpec, id: &str, at: &str, field: &str) {
    let v = hardening_violations(spec);
    assert!(!v.is_empty(), "expected a {id} hardening violation at {at}");
    for m in &v {
        assert!(m.starts_with(&format!("{id}: ")), "unexpected violation {m:?} (expected only {id})");
        assert!(m.contains(at) && m.contains(field), "{m:?} does not name {at} / {field}");
    }
}

// ------------------------------------------------------------ baseline

#[test]
fn privileged_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).privileged = Some(true);
        assert_only(&spec, "privileged", t.at(), "securityContext.privileged");
    }
}

#[test]
fn host_process_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).windows_options = Some(WindowsSecurityContextOptions { host_process: Some(true), ..Default::default() });
        assert_only(&spec, "hostProcess", t.at(), "windowsOptions.hostProcess");
    }
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().windows_options =
        Some(WindowsSecurityContextOptions { host_process: Some(true), ..Default::default() });
    assert_only(&spec, "hostProcess", "pod", "spec.securityContext.windowsOptions.hostProcess");
}

#[test]
fn host_network_is_refused() {
    let mut spec = compliant();
    spec.host_network = Some(true);
    assert_only(&spec, "hostNamespaces", "pod", "spec.hostNetwork");
}

#[test]
fn host_pid_is_refused() {
    let mut spec = compliant();
    spec.host_pid = Some(true);
    assert_only(&spec, "hostNamespaces", "pod", "spec.hostPID");
}

#[test]
fn host_ipc_is_refused() {
    let mut spec = compliant();
    spec.host_ipc = Some(true);
    assert_only(&spec, "hostNamespaces", "pod", "spec.hostIPC");
}

#[test]
fn host_path_volume_is_refused() {
    let mut spec = compliant();
    spec.volumes.as_mut().unwrap().push(Volume {
        name: "root".into(),
        host_path: Some(HostPathVolumeSource { path: "/".into(), type_: None }),
        ..Default::default()
    });
    assert_only(&spec, "volumes", "spec.volumes[6] \"root\"", "hostPath");
}

#[test]
fn non_core_volume_types_are_refused() {
    let mut spec = compliant();
    spec.volumes.as_mut().unwrap().push(Volume {
        name: "share".into(),
        nfs: Some(NFSVolumeSource { server: "nfs".into(), path: "/".into(), read_only: None }),
        ..Default::default()
    });
    assert_only(&spec, "volumes", "\"share\"", "nfs");
    let mut spec = compliant();
    spec.volumes.as_mut().unwrap().push(Volume { name: "nothing".into(), ..Default::default() });
    assert_only(&spec, "volumes", "\"nothing\"", "unknown");
}

#[test]
fn allowed_volume_types_pass() {
    let mut spec = compliant();
    spec.volumes.as_mut().unwrap().push(Volume { name: "img".into(), image: Some(Default::default()), ..Default::default() });
    spec.volumes.as_mut().unwrap().push(Volume { name: "cm".into(), config_map: Some(Default::default()), ..Default::default() });
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn host_port_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        *t.probes(&mut spec).2 = Some(vec![ContainerPort { container_port: 8080, host_port: Some(80), ..Default::default() }]);
        assert_only(&spec, "hostPorts", t.at(), "ports[0].hostPort");
    }
    let mut spec = compliant();
    *Target::Run.probes(&mut spec).2 = Some(vec![ContainerPort { container_port: 8080, host_port: Some(0), ..Default::default() }]);
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn probe_host_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        *t.probes(&mut spec).0 = Some(Probe {
            http_get: Some(HTTPGetAction { host: Some("169.254.169.254".into()), port: IntOrString::Int(80), ..Default::default() }),
            ..Default::default()
        });
        assert_only(&spec, "hostProbesAndLifecycle", t.at(), "readinessProbe.httpGet.host");
    }
}

#[test]
fn lifecycle_host_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        *t.probes(&mut spec).1 = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                tcp_socket: Some(TCPSocketAction { host: Some("10.0.0.1".into()), port: IntOrString::Int(22) }),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_only(&spec, "hostProbesAndLifecycle", t.at(), "lifecycle.preStop.tcpSocket.host");
    }
}

#[test]
fn app_armor_unconfined_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).app_armor_profile = Some(AppArmorProfile { type_: "Unconfined".into(), localhost_profile: None });
        assert_only(&spec, "appArmor", t.at(), "securityContext.appArmorProfile.type");
    }
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().app_armor_profile =
        Some(AppArmorProfile { type_: "Unconfined".into(), localhost_profile: None });
    assert_only(&spec, "appArmor", "pod", "spec.securityContext.appArmorProfile.type");
    let mut spec = compliant();
    Target::Run.sc(&mut spec).app_armor_profile = Some(AppArmorProfile { type_: "RuntimeDefault".into(), localhost_profile: None });
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn app_armor_annotation_unconfined_is_refused() {
    let template = |value: &str| PodTemplateSpec {
        metadata: Some(ObjectMeta {
            annotations: Some(BTreeMap::from([("container.apparmor.security.beta.kubernetes.io/run".to_string(), value.to_string())])),
            ..Default::default()
        }),
        spec: Some(compliant()),
    };
    let v = restricted_template_violations(&template("unconfined"));
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("appArmor: pod: metadata.annotations"), "{v:?}");
    assert!(restricted_template_violations(&template("runtime/default")).is_empty());
    assert!(restricted_template_violations(&template("localhost/my-profile")).is_empty());
}

#[test]
fn se_linux_custom_type_user_role_are_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).se_linux_options = Some(SELinuxOptions { type_: Some("spc_t".into()), ..Default::default() });
        assert_only(&spec, "seLinux", t.at(), "seLinuxOptions.type");
        let mut spec = compliant();
        t.sc(&mut spec).se_linux_options = Some(SELinuxOptions { user: Some("system_u".into()), ..Default::default() });
        assert_only(&spec, "seLinux", t.at(), "seLinuxOptions.user");
        let mut spec = compliant();
        t.sc(&mut spec).se_linux_options = Some(SELinuxOptions { role: Some("sysadm_r".into()), ..Default::default() });
        assert_only(&spec, "seLinux", t.at(), "seLinuxOptions.role");
    }
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().se_linux_options =
        Some(SELinuxOptions { type_: Some("unconfined_t".into()), ..Default::default() });
    assert_only(&spec, "seLinux", "pod", "spec.securityContext.seLinuxOptions.type");
    let mut spec = compliant();
    Target::Run.sc(&mut spec).se_linux_options =
        Some(SELinuxOptions { type_: Some("container_engine_t".into()), level: Some("s0:c1,c2".into()), ..Default::default() });
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn unmasked_proc_mount_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).proc_mount = Some("Unmasked".into());
        assert_only(&spec, "procMount", t.at(), "securityContext.procMount");
    }
    let mut spec = compliant();
    Target::Run.sc(&mut spec).proc_mount = Some("Default".into());
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn unsafe_sysctl_is_refused() {
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().sysctls = Some(vec![
        Sysctl { name: "net.ipv4.tcp_keepalive_time".into(), value: "60".into() },
        Sysctl { name: "kernel.msgmax".into(), value: "65536".into() },
    ]);
    assert_only(&spec, "sysctls", "pod", "spec.securityContext.sysctls[1] \"kernel.msgmax\"");
}

#[test]
fn safe_sysctls_pass() {
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().sysctls = Some(
        skill_operator::controller::builders::pod_security::SAFE_SYSCTLS
            .iter()
            .map(|n| Sysctl { name: n.to_string(), value: "1".into() })
            .collect(),
    );
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

// ----------------------------------------------------------- restricted

#[test]
fn missing_drop_all_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).capabilities = Some(Capabilities { drop: Some(vec!["NET_RAW".into()]), add: None });
        assert_only(&spec, "capabilities", t.at(), "capabilities.drop");
        let mut spec = compliant();
        t.sc(&mut spec).capabilities = None;
        assert_only(&spec, "capabilities", t.at(), "capabilities.drop");
    }
}

#[test]
fn added_sys_admin_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).capabilities.as_mut().unwrap().add = Some(vec!["SYS_ADMIN".into()]);
        assert_only(&spec, "capabilities", t.at(), "capabilities.add");
    }
}

#[test]
fn baseline_default_capability_is_still_refused_by_restricted() {
    let mut spec = compliant();
    Target::Run.sc(&mut spec).capabilities.as_mut().unwrap().add = Some(vec!["CHOWN".into()]);
    assert_only(&spec, "capabilities", Target::Run.at(), "\"CHOWN\"");
}

#[test]
fn net_bind_service_may_be_added() {
    let mut spec = compliant();
    Target::Run.sc(&mut spec).capabilities.as_mut().unwrap().add = Some(vec!["NET_BIND_SERVICE".into()]);
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn run_as_user_zero_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).run_as_user = Some(0);
        assert_only(&spec, "runAsUser", t.at(), "securityContext.runAsUser");
    }
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().run_as_user = Some(0);
    assert_only(&spec, "runAsUser", "pod", "spec.securityContext.runAsUser");
}

#[test]
fn run_as_non_root_false_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).run_as_non_root = Some(false);
        assert_only(&spec, "runAsNonRoot", t.at(), "securityContext.runAsNonRoot");
    }
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().run_as_non_root = Some(false);
    assert_only(&spec, "runAsNonRoot", "pod", "spec.securityContext.runAsNonRoot");
}

#[test]
fn run_as_non_root_unset_everywhere_is_refused() {
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().run_as_non_root = None;
    Target::Fetch.sc(&mut spec).run_as_non_root = None;
    // Only fetch lacks it now: the others still set it themselves.
    assert_only(&spec, "runAsNonRoot", Target::Fetch.at(), "securityContext.runAsNonRoot");
}

#[test]
fn run_as_non_root_at_pod_level_covers_containers() {
    let mut spec = compliant();
    for t in TARGETS {
        t.sc(&mut spec).run_as_non_root = None;
    }
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn missing_seccomp_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        spec.security_context.as_mut().unwrap().seccomp_profile = None;
        t.sc(&mut spec).seccomp_profile = None;
        assert_only(&spec, "seccomp", t.at(), "securityContext.seccompProfile.type");
    }
}

#[test]
fn pod_level_seccomp_covers_containers() {
    let mut spec = compliant();
    for t in TARGETS {
        t.sc(&mut spec).seccomp_profile = None;
    }
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn unconfined_seccomp_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).seccomp_profile = Some(SeccompProfile { type_: "Unconfined".into(), localhost_profile: None });
        assert_only(&spec, "seccomp", t.at(), "securityContext.seccompProfile.type");
    }
    let mut spec = compliant();
    spec.security_context.as_mut().unwrap().seccomp_profile = Some(SeccompProfile { type_: "Unconfined".into(), localhost_profile: None });
    // Every container sets its own RuntimeDefault, so only the pod is named.
    assert_only(&spec, "seccomp", "pod", "spec.securityContext.seccompProfile.type");
}

#[test]
fn localhost_seccomp_passes() {
    let mut spec = compliant();
    Target::Run.sc(&mut spec).seccomp_profile =
        Some(SeccompProfile { type_: "Localhost".into(), localhost_profile: Some("profiles/skill.json".into()) });
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
}

#[test]
fn allow_privilege_escalation_missing_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).allow_privilege_escalation = None;
        assert_only(&spec, "allowPrivilegeEscalation", t.at(), "securityContext.allowPrivilegeEscalation");
    }
}

#[test]
fn allow_privilege_escalation_true_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).allow_privilege_escalation = Some(true);
        assert_only(&spec, "allowPrivilegeEscalation", t.at(), "securityContext.allowPrivilegeEscalation");
    }
}

#[test]
fn missing_security_context_breaks_every_container_rule() {
    let mut spec = compliant();
    spec.security_context = None;
    spec.init_containers.as_mut().unwrap()[0].security_context = None;
    let v = restricted_violations(&spec);
    let fetch: Vec<&str> = v.iter().filter(|m| m.contains(Target::Fetch.at())).map(|m| m.split(':').next().unwrap()).collect();
    assert_eq!(fetch, ["capabilities", "seccomp", "runAsNonRoot", "allowPrivilegeEscalation"], "{v:#?}");
}

#[test]
fn windows_pods_are_exempt_from_linux_only_rules() {
    let mut spec = compliant();
    spec.os = Some(PodOS { name: "windows".into() });
    spec.security_context.as_mut().unwrap().seccomp_profile = None;
    for t in TARGETS {
        let sc = t.sc(&mut spec);
        sc.seccomp_profile = None;
        sc.capabilities = None;
        sc.allow_privilege_escalation = None;
    }
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
    // ...but not from the others.
    Target::Run.sc(&mut spec).run_as_user = Some(0);
    assert_only(&spec, "runAsUser", Target::Run.at(), "runAsUser");
}

#[test]
fn a_bare_pod_breaks_the_expected_rules() {
    let spec = PodSpec {
        containers: vec![k8s_openapi::api::core::v1::Container { name: "c".into(), ..Default::default() }],
        ..Default::default()
    };
    assert_eq!(ids(&restricted_violations(&spec)), ["capabilities", "seccomp", "runAsNonRoot", "allowPrivilegeEscalation"]);
    assert_eq!(
        ids(&hardening_violations(&spec)),
        ["serviceAccountToken", "serviceLinks", "readOnlyRootFilesystem", "resources", "resources", "resources"]
    );
}

// ------------------------------------------------------------ hardening

#[test]
fn writable_root_filesystem_is_refused() {
    for t in TARGETS {
        let mut spec = compliant();
        t.sc(&mut spec).read_only_root_filesystem = Some(false);
        assert_hardening(&spec, "readOnlyRootFilesystem", t.at(), "securityContext.readOnlyRootFilesystem");
        let mut spec = compliant();
        t.sc(&mut spec).read_only_root_filesystem = None;
        assert_hardening(&spec, "readOnlyRootFilesystem", t.at(), "securityContext.readOnlyRootFilesystem");
        assert!(restricted_violations(&spec).is_empty(), "not a PSS rule");
    }
}

#[test]
fn automounted_service_account_token_is_refused() {
    for value in [None, Some(true)] {
        let mut spec = compliant();
        spec.automount_service_account_token = value;
        assert_hardening(&spec, "serviceAccountToken", "pod", "spec.automountServiceAccountToken");
    }
}

#[test]
fn projected_service_account_token_is_refused() {
    let mut spec = compliant();
    spec.volumes.as_mut().unwrap().push(Volume {
        name: "sa".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection { path: "token".into(), ..Default::default() }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(restricted_violations(&spec).is_empty(), "projected volumes are PSS-restricted-allowed");
    assert_hardening(&spec, "serviceAccountToken", "pod", "spec.volumes[6] \"sa\"");
}

#[test]
fn service_links_are_refused() {
    for value in [None, Some(true)] {
        let mut spec = compliant();
        spec.enable_service_links = value;
        assert_hardening(&spec, "serviceLinks", "pod", "spec.enableServiceLinks");
    }
}

#[test]
fn shared_process_namespace_is_refused() {
    let mut spec = compliant();
    spec.share_process_namespace = Some(true);
    assert_hardening(&spec, "shareProcessNamespace", "pod", "spec.shareProcessNamespace");
}

#[test]
fn requests_below_limits_are_refused() {
    let mut spec = compliant();
    let r = spec.init_containers.as_mut().unwrap()[1].resources.as_mut().unwrap();
    r.requests.as_mut().unwrap().insert("memory".into(), Quantity("64Mi".into()));
    assert_hardening(&spec, "resources", Target::Upload.at(), "resources.requests[\"memory\"] (64Mi)");
}

#[test]
fn missing_limits_are_refused() {
    for resource in ["cpu", "memory", "ephemeral-storage"] {
        let mut spec = compliant();
        spec.containers[0].resources.as_mut().unwrap().limits.as_mut().unwrap().remove(resource);
        assert_hardening(&spec, "resources", Target::Run.at(), &format!("resources.limits[{resource:?}]"));
        let mut spec = compliant();
        spec.init_containers.as_mut().unwrap()[0].resources.as_mut().unwrap().requests.as_mut().unwrap().remove(resource);
        assert_hardening(&spec, "resources", Target::Fetch.at(), &format!("resources.requests[{resource:?}]"));
    }
}

#[test]
fn equal_quantities_in_different_notation_pass() {
    let mut spec = compliant();
    let r = spec.containers[0].resources.as_mut().unwrap();
    r.requests.as_mut().unwrap().insert("cpu".into(), Quantity("1000m".into()));
    r.limits.as_mut().unwrap().insert("memory".into(), Quantity("0.5Gi".into()));
    assert_eq!(hardening_violations(&spec), Vec::<String>::new());
}

#[test]
fn ephemeral_containers_need_no_resources() {
    let spec = compliant();
    assert!(spec.ephemeral_containers.as_ref().unwrap()[0].resources.is_none());
    assert_eq!(hardening_violations(&spec), Vec::<String>::new());
}
