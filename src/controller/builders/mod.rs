//! Pure manifest builders for the Kubernetes controller.
//!
//! Everything here is plain data in, `k8s-openapi` objects out: no client, no
//! I/O, no clock. The reconciler validates its inputs with
//! [`JobParams::validate`] / [`NetPolParams::validate`], builds the objects and
//! applies them; the tests check the objects against the Pod Security
//! Standards and this project's own hardening rules ([`pod_security`]).
//!
//! Layout:
//! - [`job`]: the SkillJob's batch/v1 Job (fetch init container, upload native
//!   sidecar, `run` main container) and its deterministic name.
//! - [`network_policy`]: the per-job NetworkPolicy (deny all; egress only to
//!   the artifact endpoint, plus an egress proxy when hosts are granted) and
//!   the runner ServiceAccount.
//! - [`build_job`]: the dependency build Job of a prepared SkillPackage
//!   (`image deps` under the launcher in the base image) and its
//!   NetworkPolicy (the artifact endpoint and the package indexes only).
//! - [`cilium`]: the egress proxy's optional CiliumNetworkPolicy (`toFQDNs`
//!   from the union of the packages' allowed hosts, DNS through Cilium's DNS
//!   proxy, nothing else).
//! - [`pod_security`]: the "restricted" Pod Security Standard as a pure check
//!   (`restricted_violations`) plus this project's extra rules
//!   (`hardening_violations`).
//!
//! Shared here: the label keys, the validation error, and small validators
//! (DNS names, labels, resource quantities) the builders and checks share.

pub mod build_job;
pub mod cilium;
pub mod job;
pub mod network_policy;
pub mod pod_security;
pub mod probe;
pub mod warm;

pub use build_job::{build_build_job, BuildNetPolParams, BuildParams, IndexAddress};
pub use job::{build_job, job_name, pod_selector_labels, EnvGrant, JobParams, PackageDelivery, RunResources, PULL_POLICIES};
pub use network_policy::{build_network_policies, build_service_account, NetPolParams, Peer, RUNS_EGRESS_POLICY, RUNS_POLICY};
pub use pod_security::{hardening_violations, restricted_template_violations, restricted_violations};

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// `app.kubernetes.io/managed-by` value on every object we create.
pub const MANAGED_BY: &str = "skill-operator";
/// Standard label key for the managing tool.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The owning SkillJob's name. Informative only: SkillJob names may be up to
/// 253 characters but label values stop at 63, so long names are shortened
/// (see [`label_value`]). Never select on this label.
pub const LABEL_SKILLJOB: &str = "skill-operator.dev/skilljob";
/// The owning SkillJob's UID: what the NetworkPolicy and the controller
/// select on (always a valid label value, unique per SkillJob).
pub const LABEL_SKILLJOB_UID: &str = "skill-operator.dev/skilljob-uid";

/// On the pods of a run that reaches the network through the egress proxy
/// (value `"true"`): the controller watches these pods to record their
/// address for the proxy as soon as they have one.
pub const LABEL_EGRESS: &str = "skill-operator.dev/egress";

/// Label keys the builders set themselves; callers may not supply them.
pub const RESERVED_LABELS: [&str; 4] = [LABEL_MANAGED_BY, LABEL_SKILLJOB, LABEL_SKILLJOB_UID, LABEL_EGRESS];

/// Why a set of builder parameters was refused. One variant per rule, each
/// naming the offending field so the SkillJob status can say what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A required string parameter is empty.
    #[error("{field} must not be empty")]
    Missing { field: &'static str },
    /// A name that Kubernetes requires to be a DNS-1123 label/subdomain is not one.
    #[error("{field} {value:?} is not a valid {kind}")]
    InvalidName { field: &'static str, value: String, kind: &'static str },
    /// The SkillJob UID does not contain at least 12 hex digits.
    #[error("uid {0:?} must be a UUID (at least 12 hex digits)")]
    InvalidUid(String),
    /// The owner reference does not point at the SkillJob being built.
    #[error("owner reference must point at SkillJob {name:?} (uid {uid}); {problem}")]
    OwnerMismatch { name: String, uid: String, problem: String },
    /// The script path is absolute, empty, or escapes the package.
    #[error("script {0:?} must be a relative path inside the package without '.', '..' or empty segments")]
    InvalidScript(String),
    /// The interpreter is not an absolute path.
    #[error("interpreter {0:?} must be an absolute path")]
    InvalidInterpreter(String),
    /// An image reference is empty or contains whitespace.
    #[error("{field} {value:?} is not an image reference")]
    InvalidImage { field: &'static str, value: String },
    /// Too many arguments, too many bytes, or a NUL byte.
    #[error("args: {0}")]
    InvalidArgs(String),
    /// Timeout outside 1..=MAX_TIMEOUT_SECS.
    #[error("timeout {0}s must be between 1 and {max}s", max = job::MAX_TIMEOUT_SECS)]
    InvalidTimeout(u32),
    /// A resource quantity does not parse or is not positive.
    #[error("{field} {value:?} is not a positive Kubernetes quantity")]
    InvalidQuantity { field: &'static str, value: String },
    /// Env grant: bad name, reserved name or duplicate.
    #[error("env {name:?}: {problem}")]
    InvalidEnv { name: String, problem: &'static str },
    /// run-as uid/gid must be non-zero.
    #[error("{field} must be a non-zero id, got {value}")]
    RootId { field: &'static str, value: i64 },
    /// A label key or value is malformed, or the key is reserved.
    #[error("label {key:?}={value:?}: {problem}")]
    InvalidLabel { key: String, value: String, problem: &'static str },
    /// An endpoint URL is malformed.
    #[error("{field} {value:?}: {problem}")]
    InvalidUrl { field: &'static str, value: String, problem: &'static str },
    /// An endpoint host would need DNS, which the job's pod does not get.
    #[error("{field} host {host:?} needs DNS, which job pods do not get unless egress with DNS is granted: use an IP literal (the Service's ClusterIP) or add it to host_aliases")]
    NeedsDns { field: &'static str, host: String },
    /// The namespace's staged package is not a sha256 digest, or is given
    /// for a run whose image holds its package.
    #[error("staged_package {value:?}: {problem}")]
    InvalidStagedPackage { value: String, problem: &'static str },
    /// A NetworkPolicy peer has an empty selector (which would match everything).
    #[error("{field}: {problem}")]
    InvalidPeer { field: &'static str, problem: &'static str },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

// ----------------------------------------------------------------- names

/// RFC 1123 label: 1-63 chars of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: ≤ 253 chars, dot-separated labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn is_label_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// A label key: `[prefix/]name`, prefix a DNS subdomain, name ≤ 63 chars.
pub fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_label_name_part(name),
        None => is_label_name_part(s),
    }
}

/// A label value: empty, or ≤ 63 chars of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_label_name_part(s)
}

/// Turns any string into a valid label value: kept as is when valid,
/// otherwise invalid characters become `-`, the result is cut to 63 chars and
/// trimmed to alphanumeric ends. Lossy: for display, never for selection.
pub fn label_value(s: &str) -> String {
    if is_label_value(s) {
        return s.to_string();
    }
    let mapped: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' }).take(63).collect();
    mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

pub(crate) fn validate_labels(labels: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in labels {
        let bad = |problem| Err(Error::InvalidLabel { key: k.clone(), value: v.clone(), problem });
        if RESERVED_LABELS.contains(&k.as_str()) {
            return bad("key is reserved: the builders set it");
        }
        if !is_label_key(k) {
            return bad("key is not a valid label key");
        }
        if !is_label_value(v) {
            return bad("value is not a valid label value");
        }
    }
    Ok(())
}

pub(crate) fn require(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        Err(Error::Missing { field })
    } else {
        Ok(())
    }
}

pub(crate) fn require_subdomain(field: &'static str, value: &str) -> Result<()> {
    require(field, value)?;
    if is_dns1123_subdomain(value) {
        Ok(())
    } else {
        Err(Error::InvalidName { field, value: value.to_string(), kind: "DNS-1123 subdomain" })
    }
}

pub(crate) fn require_label_name(field: &'static str, value: &str) -> Result<()> {
    require(field, value)?;
    if is_dns1123_label(value) {
        Ok(())
    } else {
        Err(Error::InvalidName { field, value: value.to_string(), kind: "DNS-1123 label" })
    }
}

/// The lowercase hex digits of a UID, dashes removed; `None` unless the UID
/// is only hex digits and dashes with at least 12 digits.
pub(crate) fn uid_hex(uid: &str) -> Option<String> {
    if !uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return None;
    }
    let hex: String = uid.chars().filter(|c| *c != '-').map(|c| c.to_ascii_lowercase()).collect();
    (hex.len() >= 12).then_some(hex)
}

// ------------------------------------------------------------ quantities

/// A parsed resource quantity: `mantissa * 2^bin_exp * 10^dec_exp`, exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quantity {
    mantissa: i128,
    bin_exp: u32,
    dec_exp: i32,
}

/// Parses the Kubernetes quantity grammar: `[+-]digits[.digits][suffix]`,
/// suffix one of the binary (Ki..Ei), decimal (n u m "" k M G T P E) or
/// exponent (`e3`, `E-2`) forms. Returns `None` on anything else.
pub(crate) fn parse_quantity(s: &str) -> Option<Quantity> {
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => (1, s),
    };
    let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(num_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return None;
    }
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return None;
    }
    let mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    let mut dec_exp = -(frac_part.len() as i32);
    let mut bin_exp = 0;
    match suffix {
        "" => {}
        "Ki" => bin_exp = 10,
        "Mi" => bin_exp = 20,
        "Gi" => bin_exp = 30,
        "Ti" => bin_exp = 40,
        "Pi" => bin_exp = 50,
        "Ei" => bin_exp = 60,
        "n" => dec_exp -= 9,
        "u" => dec_exp -= 6,
        "m" => dec_exp -= 3,
        "k" => dec_exp += 3,
        "M" => dec_exp += 6,
        "G" => dec_exp += 9,
        "T" => dec_exp += 12,
        "P" => dec_exp += 15,
        "E" => dec_exp += 18,
        _ => {
            let exp = suffix.strip_prefix('e').or_else(|| suffix.strip_prefix('E'))?;
            let exp_digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if exp_digits.is_empty() || !exp_digits.bytes().all(|b| b.is_ascii_digit()) || exp_digits.len() > 3 {
                return None;
            }
            dec_exp += exp.parse::<i32>().ok()?;
        }
    }
    Some(Quantity { mantissa: sign * mantissa, bin_exp, dec_exp })
}

impl Quantity {
    pub(crate) fn is_positive(&self) -> bool {
        self.mantissa > 0
    }

    /// Exact comparison; `None` if the numbers are too far apart to compare
    /// without overflow (callers then fall back to string equality).
    pub(crate) fn cmp_exact(&self, other: &Quantity) -> Option<Ordering> {
        // a = ma * 2^ba * 10^da ; b = mb * 2^bb * 10^db. Scale both to the
        // smaller decimal exponent and binary exponent 0.
        let min_dec = self.dec_exp.min(other.dec_exp);
        let scale = |q: &Quantity| -> Option<i128> {
            let mut v = q.mantissa.checked_mul(1i128.checked_shl(q.bin_exp)?)?;
            for _ in 0..(q.dec_exp - min_dec) {
                v = v.checked_mul(10)?;
            }
            Some(v)
        };
        Some(scale(self)?.cmp(&scale(other)?))
    }
}

/// True when both strings are quantities with the same value ("1" == "1000m").
pub(crate) fn quantities_equal(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (parse_quantity(a), parse_quantity(b)) {
        (Some(x), Some(y)) => x.cmp_exact(&y) == Some(Ordering::Equal),
        _ => false,
    }
}

pub(crate) fn require_quantity(field: &'static str, value: &str) -> Result<()> {
    match parse_quantity(value) {
        Some(q) if q.is_positive() => Ok(()),
        _ => Err(Error::InvalidQuantity { field, value: value.to_string() }),
    }
}

// ------------------------------------------------------------------ URLs

/// Splits `scheme://[userinfo@]host[:port][/path]` into (scheme, host),
/// brackets stripped from IPv6 literals. Only http and https are accepted.
pub(crate) fn url_host(field: &'static str, url: &str) -> Result<(String, String)> {
    let bad = |problem| Err(Error::InvalidUrl { field, value: url.to_string(), problem });
    if url.is_empty() {
        return Err(Error::Missing { field });
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("must not contain whitespace or control characters");
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return bad("must be an absolute http(s) URL");
    };
    if scheme != "http" && scheme != "https" {
        return bad("scheme must be http or https");
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, tail)) if tail.is_empty() || tail.starts_with(':') => h,
            _ => return bad("malformed IPv6 literal"),
        }
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    if host.is_empty() {
        return bad("has no host");
    }
    Ok((scheme.to_string(), host.to_string()))
}

pub(crate) fn is_ip_literal(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_compare_by_value() {
        assert!(quantities_equal("1", "1000m"));
        assert!(quantities_equal("1Gi", "1024Mi"));
        assert!(quantities_equal("1k", "1000"));
        assert!(quantities_equal("1e3", "1k"));
        assert!(quantities_equal("0.5", "500m"));
        assert!(quantities_equal("1.5Gi", "1536Mi"));
        assert!(!quantities_equal("1Gi", "1G"));
        assert!(!quantities_equal("100m", "101m"));
        assert!(!quantities_equal("1Gi", "bogus"));
    }

    #[test]
    fn quantity_grammar() {
        for ok in ["1", "100m", "512Mi", "1Gi", "0.5", ".5", "1e3", "1E-2", "+2", "7Ei", "5n"] {
            assert!(parse_quantity(ok).is_some(), "{ok}");
        }
        for bad in ["", "Mi", "1.2.3", "1KiB", "1 Gi", "one", "1e", "1x", "-"] {
            assert!(parse_quantity(bad).is_none(), "{bad}");
        }
        assert!(!parse_quantity("0").unwrap().is_positive());
        assert!(!parse_quantity("-1").unwrap().is_positive());
    }

    #[test]
    fn names_and_labels() {
        assert!(is_dns1123_label("skilljob-0123456789ab"));
        assert!(!is_dns1123_label("Skill"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(is_label_key("skill-operator.dev/skilljob"));
        assert!(!is_label_key("/x"));
        assert!(is_label_value(""));
        assert!(!is_label_value("-x"));
        let long = format!("{}.x", "a".repeat(70));
        assert_eq!(label_value(&long).len(), 63);
        assert!(is_label_value(&label_value("weird name!!")));
        assert_eq!(label_value("weird name!!"), "weird-name");
    }

    #[test]
    fn urls() {
        assert_eq!(url_host("f", "http://10.0.0.1:8080/x").unwrap().1, "10.0.0.1");
        assert_eq!(url_host("f", "https://[fd00::1]:443").unwrap().1, "fd00::1");
        assert_eq!(url_host("f", "http://u:p@host.svc").unwrap().1, "host.svc");
        assert!(url_host("f", "ftp://x").is_err());
        assert!(url_host("f", "http://").is_err());
        assert!(url_host("f", "10.0.0.1:80").is_err());
        assert!(is_ip_literal("fd00::1") && is_ip_literal("10.1.2.3") && !is_ip_literal("a.b"));
    }

    #[test]
    fn uid_digits() {
        assert_eq!(uid_hex("0F1E2D3C-4B5A-6978-8796-a5b4c3d2e1f0").unwrap(), "0f1e2d3c4b5a69788796a5b4c3d2e1f0");
        assert!(uid_hex("short").is_none());
        assert!(uid_hex("0123456789a").is_none());
        assert!(uid_hex("0123456789ag").is_none());
    }
}
