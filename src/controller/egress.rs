//! Who decides what a run may reach, in the cluster (pure functions; the
//! reconcilers apply them):
//!
//! - the skill's `mcp-host.egress` is its author's *proposal*, shown and
//!   never trusted;
//! - the admin *allows* hosts on the SkillPackage's runtime profile
//!   (`runtime.allowedEgress`);
//! - a SkillBinding turns the network on for its runs (`egress: true`) and
//!   may *narrow* the allowed list (`egressHosts`), never widen it
//!   ([`crate::egress::effective`]).
//!
//! Effective = allowed ∩ narrowing, empty unless the binding says
//! `egress: true` and the skill proposes something. Empty means no
//! network at all: no proxy variables, no proxy rule in the NetworkPolicy.
//!
//! Also here: the note a failed or timed-out run with egress gets, and the
//! `NetworkPolicyEnforced` condition (NetworkPolicy is only as good as the
//! CNI that enforces it, which the API server cannot tell us).

use std::sync::atomic::{AtomicU8, Ordering};

use crate::api::binding::SkillBinding;
use crate::api::package::{RuntimeProfile, SkillPackage};
use crate::egress::allowlist::{Allowlist, Entry};
use crate::egress::effective;

/// The profile's allowed hosts, parsed; `Err` names the entry that does not parse.
pub fn allowed(profile: Option<&RuntimeProfile>) -> Result<Allowlist, String> {
    let Some(profile) = profile else { return Ok(Allowlist::default()) };
    Allowlist::parse(profile.allowed_egress.iter().map(String::as_str)).map_err(|e| format!("runtime.allowedEgress: {e}"))
}

/// Text form of an allowlist, one `host:ports` per entry.
pub fn texts(list: &Allowlist) -> Vec<String> {
    list.entries().iter().map(Entry::to_string).collect()
}

/// The proposed hosts (or ports) the profile does not allow, each saying why.
pub fn not_allowed(proposed: &[String], allowed: &Allowlist) -> Vec<String> {
    let mut out = Vec::new();
    let mut entries = Vec::new();
    for text in proposed {
        match Entry::parse(text) {
            Ok(e) => entries.push(e),
            Err(e) => out.push(format!("{text}: not a host pattern ({e})")),
        }
    }
    let narrowed = effective(allowed, Some(&entries));
    out.extend(narrowed.dropped.iter().map(|d| d.to_string().replace("; dropped", "")));
    out
}

/// What a binding's runs may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BindingEgress {
    /// Allowed ∩ narrowing (empty without `egress: true`).
    pub effective: Allowlist,
    /// Narrowing entries dropped, with why.
    pub dropped: Vec<String>,
}

/// The binding's effective allowlist from its package's profile.
pub fn binding_egress(binding: &SkillBinding, package: &SkillPackage) -> BindingEgress {
    // A profile entry that does not parse leaves the package not Ready;
    // until then the list is treated as empty (fail closed).
    let allowed = allowed(package.spec.runtime.as_ref()).unwrap_or_default();
    let mut dropped = Vec::new();
    let narrowing = binding.spec.egress_hosts.as_ref().map(|hosts| {
        hosts
            .iter()
            .filter_map(|text| match Entry::parse(text) {
                Ok(e) => Some(e),
                Err(e) => {
                    dropped.push(format!("{text}: {e}; dropped"));
                    None
                }
            })
            .collect::<Vec<_>>()
    });
    let narrowed = effective(&allowed, narrowing.as_deref());
    dropped.extend(narrowed.dropped.iter().map(ToString::to_string));
    if !binding.spec.egress {
        return BindingEgress { effective: Allowlist::default(), dropped };
    }
    BindingEgress { effective: narrowed.allowlist, dropped }
}

/// The note a run that had (or wanted) egress gets when it fails or times
/// out: the allowed hosts, and that a refused connection may be the allowlist.
pub fn failure_note(allowed: &[String], proposed: &[String]) -> Option<String> {
    if !allowed.is_empty() {
        Some(format!(
            "this run reached the network only through the egress proxy, allowed: {}; a refused connection (HTTP 403 from the proxy, with its reason) may be the allowlist",
            allowed.join(", ")
        ))
    } else if !proposed.is_empty() {
        Some(format!(
            "this run had no network (the skill proposes {} but nothing is allowed: runtime.allowedEgress and the binding's egress); a failure reaching it looks like a connection error from inside",
            proposed.join(", ")
        ))
    } else {
        None
    }
}

/// Whether the cluster's CNI enforces NetworkPolicy (`--network-policy`):
/// the API server admits policies either way, so the admin says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NetworkPolicyEnforcement {
    /// The CNI enforces NetworkPolicy (Calico, Cilium, ...).
    Enforced,
    /// It does not (e.g. flannel or a bare bridge): policies are written but nothing stops a pod.
    NotEnforced,
    /// Not stated: every SkillJob says so.
    #[default]
    Unknown,
}

/// The condition every SkillJob carries: (status, reason, message).
pub fn enforcement_condition(e: NetworkPolicyEnforcement) -> (Option<bool>, &'static str, &'static str) {
    match e {
        NetworkPolicyEnforcement::Enforced => (Some(true), "Enforced", "the cluster's CNI enforces NetworkPolicy (as the admin states)"),
        NetworkPolicyEnforcement::NotEnforced => (
            Some(false),
            "NotEnforced",
            "the cluster's CNI does not enforce NetworkPolicy: this run's pod is not kept from other peers; only the egress proxy's refusals hold",
        ),
        NetworkPolicyEnforcement::Unknown => (
            None,
            "Unknown",
            "whether the cluster's CNI enforces NetworkPolicy was not stated (--network-policy): without a CNI that enforces it the run's policy is not applied",
        ),
    }
}

/// A package named `name` whose Python runtime profile allows `allowed`
/// (the controller's egress tests).
/// What the NetworkPolicy probe found ([`super::netpol_probe`]), shared by every reconcile.
#[derive(Debug, Default)]
pub struct Observed(AtomicU8);

impl Observed {
    pub fn get(&self) -> NetworkPolicyEnforcement {
        match self.0.load(Ordering::Relaxed) {
            1 => NetworkPolicyEnforcement::Enforced,
            2 => NetworkPolicyEnforcement::NotEnforced,
            _ => NetworkPolicyEnforcement::Unknown,
        }
    }

    pub(crate) fn set(&self, found: NetworkPolicyEnforcement) {
        let v = match found {
            NetworkPolicyEnforcement::Enforced => 1,
            NetworkPolicyEnforcement::NotEnforced => 2,
            NetworkPolicyEnforcement::Unknown => 0,
        };
        self.0.store(v, Ordering::Relaxed);
    }
}

/// The SkillJob condition from what the admin states and what the probe found:
/// a finding beats a statement (an admin who says `enforced` on a cluster
/// that does not enforce is told so on every run).
pub fn combined(stated: NetworkPolicyEnforcement, observed: NetworkPolicyEnforcement) -> (Option<bool>, &'static str, &'static str) {
    match (stated, observed) {
        (_, NetworkPolicyEnforcement::NotEnforced) => (
            Some(false),
            "ProbeNotEnforced",
            "a probe pod under a deny-all NetworkPolicy reached the artifact endpoint: this cluster's CNI does not enforce NetworkPolicy, so this run's pod is not kept from other peers; only the egress proxy's refusals and the missing DNS hold",
        ),
        (NetworkPolicyEnforcement::Unknown, NetworkPolicyEnforcement::Enforced) => {
            (Some(true), "ProbeEnforced", "a probe pod under a deny-all NetworkPolicy was refused: the cluster's CNI enforces NetworkPolicy")
        }
        (stated, _) => enforcement_condition(stated),
    }
}

#[cfg(test)]
pub(super) fn package_allowing(name: &str, allowed: &[&str]) -> SkillPackage {
    use crate::api::package::{OciSource, PackageSource, RunResources, SkillPackageSpec};
    let profile = RuntimeProfile {
        interpreter: crate::core::declaration::Interpreter::Python,
        image: Some("python@sha256:0".into()),
        interpreter_path: None,
        allowed_scripts: vec![],
        allowed_egress: allowed.iter().map(|s| s.to_string()).collect(),
        timeout_seconds: None,
        resources: RunResources::default(),
        prepare: false,
        image_mode: None,
        dependencies: None,
    };
    let source = PackageSource { oci: OciSource { reference: "r/x:1".into(), pull_secret: None, insecure: false } };
    SkillPackage::new(name, SkillPackageSpec { source, runtime: Some(profile) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::binding::SkillBindingSpec;

    fn package(allowed: &[&str]) -> SkillPackage {
        package_allowing("p", allowed)
    }

    fn binding(egress: bool, hosts: Option<&[&str]>) -> SkillBinding {
        SkillBinding::new(
            "b",
            SkillBindingSpec {
                package: "p".into(),
                env: vec![],
                egress,
                egress_hosts: hosts.map(|h| h.iter().map(|s| s.to_string()).collect()),
                warm: None,
            },
        )
    }

    #[test]
    fn a_binding_narrows_and_never_widens() {
        let p = package(&["api.example.com", "*.files.example.org:443,8443"]);
        let all = binding_egress(&binding(true, None), &p);
        assert_eq!(texts(&all.effective), ["api.example.com:443", "*.files.example.org:443,8443"]);
        assert!(all.dropped.is_empty());

        let narrowed = binding_egress(&binding(true, Some(&["a.files.example.org:8443,9000", "evil.example", "api.example.com:80"])), &p);
        assert_eq!(texts(&narrowed.effective), ["a.files.example.org:8443"]);
        assert_eq!(narrowed.dropped.len(), 3, "{:?}", narrowed.dropped);
        assert!(narrowed.dropped.iter().any(|d| d.contains("evil.example")), "{:?}", narrowed.dropped);
        assert!(narrowed.dropped.iter().any(|d| d.contains("9000")), "{:?}", narrowed.dropped);

        // A wildcard under an exact allowed host would widen: dropped.
        let wider = binding_egress(&binding(true, Some(&["*.example.com"])), &p);
        assert!(wider.effective.is_empty(), "{}", wider.effective);
        // Unparseable narrowing is dropped and said, never taken as "all".
        let junk = binding_egress(&binding(true, Some(&["0x7f.1"])), &p);
        assert!(junk.effective.is_empty());
        assert_eq!(junk.dropped.len(), 1);
        // Empty narrowing: nothing.
        assert!(binding_egress(&binding(true, Some(&[])), &p).effective.is_empty());
    }

    #[test]
    fn empty_or_absent_means_no_network() {
        // egress: false grants nothing whatever the profile allows.
        assert!(binding_egress(&binding(false, None), &package(&["api.example.com"])).effective.is_empty());
        // An empty profile list never turns into "everything".
        assert!(binding_egress(&binding(true, None), &package(&[])).effective.is_empty());
        assert!(binding_egress(&binding(true, Some(&["api.example.com"])), &package(&[])).effective.is_empty());
        // A profile entry that does not parse: nothing (and the package says why).
        assert!(binding_egress(&binding(true, None), &package(&["*"])).effective.is_empty());
        assert!(allowed(package(&["*"]).spec.runtime.as_ref()).unwrap_err().contains("runtime.allowedEgress"));
    }

    #[test]
    fn proposals_the_profile_does_not_allow_are_named() {
        let allowed = Allowlist::parse(["api.example.com"]).unwrap();
        let proposed = vec!["api.example.com".to_string(), "cdn.example.net".into(), "api.example.com:8443".into(), "http://x".into()];
        let missing = not_allowed(&proposed, &allowed);
        assert_eq!(missing.len(), 3, "{missing:?}");
        assert!(missing.iter().any(|m| m.starts_with("cdn.example.net")), "{missing:?}");
        assert!(missing.iter().any(|m| m.contains("8443")), "{missing:?}");
        assert!(missing.iter().any(|m| m.starts_with("http://x")), "{missing:?}");
    }

    #[test]
    fn failure_notes() {
        let note = failure_note(&["api.example.com:443".into()], &["api.example.com".into()]).unwrap();
        assert!(note.contains("api.example.com:443") && note.contains("403"), "{note}");
        let none = failure_note(&[], &["api.example.com".into()]).unwrap();
        assert!(none.contains("no network"), "{none}");
        assert_eq!(failure_note(&[], &[]), None);
    }
}
