//! The Pod Security Standards "restricted" profile as a pure check, plus this
//! project's extra hardening rules.
//!
//! [`restricted_violations`] follows the upstream pod-security-admission
//! checks (`k8s.io/pod-security-admission/policy`) at policy version v1.34:
//! every baseline control and every restricted control, over
//! `initContainers`, `containers` and `ephemeralContainers`:
//!
//! | check id | rule |
//! |---|---|
//! | `hostProcess` | pod/container `windowsOptions.hostProcess` unset or false |
//! | `hostNamespaces` | `hostNetwork`, `hostPID`, `hostIPC` unset or false |
//! | `privileged` | `securityContext.privileged` unset or false |
//! | `capabilities` | `drop` includes `ALL`; `add` only `NET_BIND_SERVICE` (restricted overrides baseline's default set) |
//! | `volumes` | only configMap, csi, downwardAPI, emptyDir, ephemeral, image, persistentVolumeClaim, projected, secret (so no hostPath) |
//! | `hostPorts` | `ports[*].hostPort` unset or 0 |
//! | `hostProbesAndLifecycle` | probes' and lifecycle handlers' `httpGet.host` / `tcpSocket.host` empty (new in v1.34) |
//! | `appArmor` | `appArmorProfile.type` RuntimeDefault or Localhost when set (annotations: [`restricted_template_violations`]) |
//! | `seLinux` | type empty, container_t, container_init_t, container_kvm_t or container_engine_t; user and role empty |
//! | `procMount` | unset or `Default` |
//! | `seccomp` | pod or every container sets RuntimeDefault/Localhost, nothing sets anything else |
//! | `sysctls` | only the safe set (v1.32 additions included) |
//! | `runAsNonRoot` | pod true (containers may leave it unset) or every container true; nothing sets false |
//! | `runAsUser` | pod and containers never 0 |
//! | `allowPrivilegeEscalation` | every container sets it to false explicitly |
//!
//! As upstream, pods with `spec.os.name: windows` are exempt from the
//! seccomp, capabilities and allowPrivilegeEscalation checks. Later policy
//! versions only relax these rules (v1.35: user-namespace pods
//! (`hostUsers: false`) may run as uid 0; v1.37: two more safe sysctls), so a
//! pod passing this check passes every version from v1.34 on. The 1.0-1.18
//! seccomp annotations are not checked (ignored since v1.19).
//!
//! [`hardening_violations`] adds this project's rules, none of which are in
//! the PSS: read-only root filesystems, no service account token for the
//! API server (not automounted, and a projected one only with an audience
//! of its own), no service links, no shared process
//! namespace, and requests == limits for cpu, memory and ephemeral-storage on
//! every init and regular container (ephemeral containers may not have
//! resources).
//!
//! Messages read `<check>: <where>: <what>`, where `<where>` is `pod` or
//! `initContainers[0] "fetch"`, and name the field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EphemeralContainer, Lifecycle, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecurityContext, Volume,
};

use super::quantities_equal;

/// Capabilities the restricted profile lets a container add.
pub const ALLOWED_ADD_CAPABILITIES: [&str; 1] = ["NET_BIND_SERVICE"];
/// SELinux types allowed since policy v1.31.
pub const ALLOWED_SELINUX_TYPES: [&str; 5] = ["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];
/// The safe sysctls at policy v1.34 (sets of 1.0, 1.27, 1.29 and 1.32).
pub const SAFE_SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];
/// Resources that must have requests == limits.
pub const GUARANTEED_RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// A uniform view of Container and EphemeralContainer.
struct View<'a> {
    list: &'static str,
    index: usize,
    name: &'a str,
    sc: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
    probes: [(&'static str, Option<&'a Probe>); 3],
    lifecycle: Option<&'a Lifecycle>,
    resources: Option<&'a ResourceRequirements>,
}

impl View<'_> {
    fn at(&self) -> String {
        format!("{}[{}] {:?}", self.list, self.index, self.name)
    }
}

fn view<'a>(list: &'static str, index: usize, c: &'a Container) -> View<'a> {
    View {
        list,
        index,
        name: &c.name,
        sc: c.security_context.as_ref(),
        ports: c.ports.as_deref().unwrap_or(&[]),
        probes: [
            ("livenessProbe", c.liveness_probe.as_ref()),
            ("readinessProbe", c.readiness_probe.as_ref()),
            ("startupProbe", c.startup_probe.as_ref()),
        ],
        lifecycle: c.lifecycle.as_ref(),
        resources: c.resources.as_ref(),
    }
}

fn ephemeral_view(index: usize, c: &EphemeralContainer) -> View<'_> {
    View {
        list: "ephemeralContainers",
        index,
        name: &c.name,
        sc: c.security_context.as_ref(),
        ports: c.ports.as_deref().unwrap_or(&[]),
        probes: [
            ("livenessProbe", c.liveness_probe.as_ref()),
            ("readinessProbe", c.readiness_probe.as_ref()),
            ("startupProbe", c.startup_probe.as_ref()),
        ],
        lifecycle: c.lifecycle.as_ref(),
        resources: c.resources.as_ref(),
    }
}

/// initContainers, containers, ephemeralContainers: the upstream visiting order.
fn containers(spec: &PodSpec) -> Vec<View<'_>> {
    let mut out = Vec::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        out.push(view("initContainers", i, c));
    }
    for (i, c) in spec.containers.iter().enumerate() {
        out.push(view("containers", i, c));
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        out.push(ephemeral_view(i, c));
    }
    out
}

fn is_windows(spec: &PodSpec) -> bool {
    spec.os.as_ref().is_some_and(|os| os.name == "windows")
}

type Check = fn(&PodSpec, &mut Vec<String>);

/// The restricted profile's checks, in the table's order.
const RESTRICTED_CHECKS: [(&str, Check); 15] = [
    ("hostProcess", check_host_process),
    ("hostNamespaces", check_host_namespaces),
    ("privileged", check_privileged),
    ("capabilities", check_capabilities),
    ("volumes", check_volumes),
    ("hostPorts", check_host_ports),
    ("hostProbesAndLifecycle", check_host_probes),
    ("appArmor", check_app_armor),
    ("seLinux", check_se_linux),
    ("procMount", check_proc_mount),
    ("seccomp", check_seccomp),
    ("sysctls", check_sysctls),
    ("runAsNonRoot", check_run_as_non_root),
    ("runAsUser", check_run_as_user),
    ("allowPrivilegeEscalation", check_allow_privilege_escalation),
];

/// Every way `spec` breaks the restricted Pod Security Standard (v1.34
/// policy); empty when it complies.
pub fn restricted_violations(spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (id, check) in RESTRICTED_CHECKS {
        let mut found = Vec::new();
        check(spec, &mut found);
        out.extend(found.into_iter().map(|m| format!("{id}: {m}")));
    }
    out
}

/// [`restricted_violations`] plus the checks that need the pod's metadata
/// (the deprecated AppArmor annotations).
pub fn restricted_template_violations(template: &PodTemplateSpec) -> Vec<String> {
    let mut out = Vec::new();
    let annotations = template.metadata.as_ref().and_then(|m| m.annotations.as_ref());
    for (key, value) in annotations.into_iter().flatten() {
        if key.starts_with(APPARMOR_ANNOTATION_PREFIX)
            && !(value.is_empty() || value == "runtime/default" || value.starts_with("localhost/"))
        {
            out.push(format!("appArmor: pod: metadata.annotations[{key:?}] is {value:?}, must be runtime/default or localhost/*"));
        }
    }
    if let Some(spec) = &template.spec {
        out.extend(restricted_violations(spec));
    }
    out
}

fn check_host_process(spec: &PodSpec, out: &mut Vec<String>) {
    let pod = spec.security_context.as_ref().and_then(|s| s.windows_options.as_ref()).and_then(|w| w.host_process);
    if pod == Some(true) {
        out.push("pod: spec.securityContext.windowsOptions.hostProcess must not be true".into());
    }
    for c in containers(spec) {
        if c.sc.and_then(|s| s.windows_options.as_ref()).and_then(|w| w.host_process) == Some(true) {
            out.push(format!("{}: securityContext.windowsOptions.hostProcess must not be true", c.at()));
        }
    }
}

fn check_host_namespaces(spec: &PodSpec, out: &mut Vec<String>) {
    for (field, value) in [("hostNetwork", spec.host_network), ("hostPID", spec.host_pid), ("hostIPC", spec.host_ipc)] {
        if value == Some(true) {
            out.push(format!("pod: spec.{field} must not be true"));
        }
    }
}

fn check_privileged(spec: &PodSpec, out: &mut Vec<String>) {
    for c in containers(spec) {
        if c.sc.and_then(|s| s.privileged) == Some(true) {
            out.push(format!("{}: securityContext.privileged must not be true", c.at()));
        }
    }
}

fn check_capabilities(spec: &PodSpec, out: &mut Vec<String>) {
    if is_windows(spec) {
        return;
    }
    for c in containers(spec) {
        let caps = c.sc.and_then(|s| s.capabilities.as_ref());
        let drops_all = caps.and_then(|k| k.drop.as_ref()).is_some_and(|d| d.iter().any(|x| x == "ALL"));
        if !drops_all {
            out.push(format!(r#"{}: securityContext.capabilities.drop must include "ALL""#, c.at()));
        }
        let added: Vec<&str> = caps
            .and_then(|k| k.add.as_ref())
            .into_iter()
            .flatten()
            .map(String::as_str)
            .filter(|a| !ALLOWED_ADD_CAPABILITIES.contains(a))
            .collect();
        if !added.is_empty() {
            out.push(format!("{}: securityContext.capabilities.add must not include {added:?} (only NET_BIND_SERVICE)", c.at()));
        }
    }
}

/// The type of a volume the restricted profile refuses, or `None` if allowed.
fn forbidden_volume_type(v: &Volume) -> Option<&'static str> {
    let allowed = v.config_map.is_some()
        || v.csi.is_some()
        || v.downward_api.is_some()
        || v.empty_dir.is_some()
        || v.ephemeral.is_some()
        || v.image.is_some()
        || v.persistent_volume_claim.is_some()
        || v.projected.is_some()
        || v.secret.is_some();
    if allowed {
        return None;
    }
    let known: [(&'static str, bool); 21] = [
        ("hostPath", v.host_path.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("nfs", v.nfs.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("rbd", v.rbd.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("cinder", v.cinder.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("flocker", v.flocker.is_some()),
        ("fc", v.fc.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
    ];
    Some(known.iter().find(|(_, set)| *set).map_or("unknown", |(name, _)| name))
}

fn check_volumes(spec: &PodSpec, out: &mut Vec<String>) {
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if let Some(kind) = forbidden_volume_type(v) {
            out.push(format!("pod: spec.volumes[{i}] {:?} uses restricted volume type {kind}", v.name));
        }
    }
}

fn check_host_ports(spec: &PodSpec, out: &mut Vec<String>) {
    for c in containers(spec) {
        for (i, port) in c.ports.iter().enumerate() {
            if let Some(host_port) = port.host_port.filter(|p| *p != 0) {
                out.push(format!("{}: ports[{i}].hostPort must be unset or 0, is {host_port}", c.at()));
            }
        }
    }
}

fn check_host_probes(spec: &PodSpec, out: &mut Vec<String>) {
    /// The non-empty `host` of an httpGet and a tcpSocket handler, named by field.
    fn hosts<'a>(
        field: &str,
        http: Option<&'a k8s_openapi::api::core::v1::HTTPGetAction>,
        tcp: Option<&'a k8s_openapi::api::core::v1::TCPSocketAction>,
        found: &mut Vec<(String, &'a str)>,
    ) {
        if let Some(h) = http.and_then(|a| a.host.as_deref()).filter(|h| !h.is_empty()) {
            found.push((format!("{field}.httpGet.host"), h));
        }
        if let Some(h) = tcp.and_then(|a| a.host.as_deref()).filter(|h| !h.is_empty()) {
            found.push((format!("{field}.tcpSocket.host"), h));
        }
    }
    for c in containers(spec) {
        let mut found: Vec<(String, &str)> = Vec::new();
        for (field, probe) in c.probes {
            if let Some(p) = probe {
                hosts(field, p.http_get.as_ref(), p.tcp_socket.as_ref(), &mut found);
            }
        }
        if let Some(lc) = c.lifecycle {
            for (field, handler) in [("lifecycle.postStart", lc.post_start.as_ref()), ("lifecycle.preStop", lc.pre_stop.as_ref())] {
                if let Some(hd) = handler {
                    hosts(field, hd.http_get.as_ref(), hd.tcp_socket.as_ref(), &mut found);
                }
            }
        }
        for (field, host) in found {
            out.push(format!("{}: {field} must be empty, is {host:?}", c.at()));
        }
    }
}

fn app_armor_ok(t: &str) -> bool {
    t == "RuntimeDefault" || t == "Localhost"
}

fn check_app_armor(spec: &PodSpec, out: &mut Vec<String>) {
    if let Some(p) = spec.security_context.as_ref().and_then(|s| s.app_armor_profile.as_ref()) {
        if !app_armor_ok(&p.type_) {
            out.push(format!("pod: spec.securityContext.appArmorProfile.type must be RuntimeDefault or Localhost, is {:?}", p.type_));
        }
    }
    for c in containers(spec) {
        if let Some(p) = c.sc.and_then(|s| s.app_armor_profile.as_ref()) {
            if !app_armor_ok(&p.type_) {
                out.push(format!("{}: securityContext.appArmorProfile.type must be RuntimeDefault or Localhost, is {:?}", c.at(), p.type_));
            }
        }
    }
}

fn check_se_linux(spec: &PodSpec, out: &mut Vec<String>) {
    let mut judge = |at: String, prefix: &str, o: &k8s_openapi::api::core::v1::SELinuxOptions| {
        let t = o.type_.as_deref().unwrap_or("");
        if !ALLOWED_SELINUX_TYPES.contains(&t) {
            out.push(format!("{at}: {prefix}seLinuxOptions.type {t:?} is not allowed"));
        }
        if o.user.as_deref().is_some_and(|u| !u.is_empty()) {
            out.push(format!("{at}: {prefix}seLinuxOptions.user must not be set"));
        }
        if o.role.as_deref().is_some_and(|r| !r.is_empty()) {
            out.push(format!("{at}: {prefix}seLinuxOptions.role must not be set"));
        }
    };
    if let Some(o) = spec.security_context.as_ref().and_then(|s| s.se_linux_options.as_ref()) {
        judge("pod".into(), "spec.securityContext.", o);
    }
    for c in containers(spec) {
        if let Some(o) = c.sc.and_then(|s| s.se_linux_options.as_ref()) {
            judge(c.at(), "securityContext.", o);
        }
    }
}

fn check_proc_mount(spec: &PodSpec, out: &mut Vec<String>) {
    for c in containers(spec) {
        if let Some(pm) = c.sc.and_then(|s| s.proc_mount.as_deref()).filter(|pm| *pm != "Default") {
            out.push(format!("{}: securityContext.procMount must be unset or Default, is {pm:?}", c.at()));
        }
    }
}

fn seccomp_ok(t: &str) -> bool {
    t == "RuntimeDefault" || t == "Localhost"
}

fn check_seccomp(spec: &PodSpec, out: &mut Vec<String>) {
    if is_windows(spec) {
        return;
    }
    let pod = spec.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref());
    let pod_ok = match pod {
        Some(p) if seccomp_ok(&p.type_) => true,
        Some(p) => {
            out.push(format!("pod: spec.securityContext.seccompProfile.type must be RuntimeDefault or Localhost, is {:?}", p.type_));
            false
        }
        None => false,
    };
    for c in containers(spec) {
        match c.sc.and_then(|s| s.seccomp_profile.as_ref()) {
            Some(p) if !seccomp_ok(&p.type_) => {
                out.push(format!("{}: securityContext.seccompProfile.type must be RuntimeDefault or Localhost, is {:?}", c.at(), p.type_))
            }
            Some(_) => {}
            None if !pod_ok => out.push(format!(
                "{}: securityContext.seccompProfile.type must be RuntimeDefault or Localhost (unset, and the pod sets no valid profile)",
                c.at()
            )),
            None => {}
        }
    }
}

fn check_sysctls(spec: &PodSpec, out: &mut Vec<String>) {
    let sysctls = spec.security_context.as_ref().and_then(|s| s.sysctls.as_ref());
    for (i, s) in sysctls.into_iter().flatten().enumerate() {
        if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
            out.push(format!("pod: spec.securityContext.sysctls[{i}] {:?} is not a safe sysctl", s.name));
        }
    }
}

fn check_run_as_non_root(spec: &PodSpec, out: &mut Vec<String>) {
    let pod = spec.security_context.as_ref().and_then(|s| s.run_as_non_root);
    if pod == Some(false) {
        out.push("pod: spec.securityContext.runAsNonRoot must not be false".into());
    }
    for c in containers(spec) {
        match c.sc.and_then(|s| s.run_as_non_root) {
            Some(false) => out.push(format!("{}: securityContext.runAsNonRoot must not be false", c.at())),
            None if pod != Some(true) => {
                out.push(format!("{}: securityContext.runAsNonRoot must be true (unset, and the pod does not set it)", c.at()))
            }
            _ => {}
        }
    }
}

fn check_run_as_user(spec: &PodSpec, out: &mut Vec<String>) {
    if spec.security_context.as_ref().and_then(|s| s.run_as_user) == Some(0) {
        out.push("pod: spec.securityContext.runAsUser must not be 0".into());
    }
    for c in containers(spec) {
        if c.sc.and_then(|s| s.run_as_user) == Some(0) {
            out.push(format!("{}: securityContext.runAsUser must not be 0", c.at()));
        }
    }
}

fn check_allow_privilege_escalation(spec: &PodSpec, out: &mut Vec<String>) {
    if is_windows(spec) {
        return;
    }
    for c in containers(spec) {
        match c.sc.and_then(|s| s.allow_privilege_escalation) {
            Some(false) => {}
            Some(true) => out.push(format!("{}: securityContext.allowPrivilegeEscalation must be false, is true", c.at())),
            None => out.push(format!("{}: securityContext.allowPrivilegeEscalation must be set to false", c.at())),
        }
    }
}

/// This project's rules beyond the PSS (see the module docs); empty when `spec` complies.
pub fn hardening_violations(spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    if spec.automount_service_account_token != Some(false) {
        out.push("serviceAccountToken: pod: spec.automountServiceAccountToken must be false".into());
    }
    // A projected token with an audience of its own is good for that
    // audience alone; without one it is good for the API server.
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let for_the_api_server = v.projected.as_ref().and_then(|p| p.sources.as_ref()).is_some_and(|s| {
            s.iter().filter_map(|src| src.service_account_token.as_ref()).any(|t| t.audience.as_deref().is_none_or(str::is_empty))
        });
        if for_the_api_server {
            out.push(format!(
                "serviceAccountToken: pod: spec.volumes[{i}] {:?} projects a serviceAccountToken without an audience of its own (the API server's)",
                v.name
            ));
        }
    }
    if spec.enable_service_links != Some(false) {
        out.push("serviceLinks: pod: spec.enableServiceLinks must be false".into());
    }
    if spec.share_process_namespace == Some(true) {
        out.push("shareProcessNamespace: pod: spec.shareProcessNamespace must not be true".into());
    }
    for c in containers(spec) {
        if c.sc.and_then(|s| s.read_only_root_filesystem) != Some(true) {
            out.push(format!("readOnlyRootFilesystem: {}: securityContext.readOnlyRootFilesystem must be true", c.at()));
        }
        if c.list == "ephemeralContainers" {
            continue; // the API forbids resources on ephemeral containers
        }
        let empty = BTreeMap::new();
        let requests = c.resources.and_then(|r| r.requests.as_ref()).unwrap_or(&empty);
        let limits = c.resources.and_then(|r| r.limits.as_ref()).unwrap_or(&empty);
        for name in GUARANTEED_RESOURCES {
            match (requests.get(name), limits.get(name)) {
                (Some(r), Some(l)) if quantities_equal(&r.0, &l.0) => {}
                (Some(r), Some(l)) => out.push(format!(
                    "resources: {}: resources.requests[{name:?}] ({}) must equal resources.limits[{name:?}] ({})",
                    c.at(),
                    r.0,
                    l.0
                )),
                (None, _) => out.push(format!("resources: {}: resources.requests[{name:?}] must be set", c.at())),
                (_, None) => out.push(format!("resources: {}: resources.limits[{name:?}] must be set", c.at())),
            }
        }
    }
    out
}
