//! Names, labels and annotations of the objects the gateway writes.
//!
//! A run's SkillJob is named from the confirmation key (with the namespace
//! and the caller folded in): the same confirmed call, retried, names the
//! same SkillJob, so the API server's AlreadyExists is what stops a second
//! run; and since the key is secret to the caller who confirmed, the name
//! (which is also the job id and the task id) cannot be guessed by anyone
//! else. 128 bits of a SHA-256 are kept: DNS-1123 (lowercase hex), short.

use sha2::{Digest, Sha256};

/// Every job id the gateway hands out: `skj-` and 32 lowercase hex digits.
pub const ID_PREFIX: &str = "skj-";
const ID_HEX: usize = 32;

/// Label on every SkillJob and draft the gateway writes: a hash of the
/// caller's principal, so a caller's jobs are listed by selector. The
/// annotation [`crate::controller::skilljob::REQUESTED_BY_ANNOTATION`]
/// holds the principal itself and is what ownership is decided on (the
/// label only narrows the list).
pub const LABEL_OWNER: &str = "skill-operator.dev/requested-by-hash";
/// Label naming the writer (`app.kubernetes.io/created-by`).
pub const LABEL_CREATED_BY: &str = "app.kubernetes.io/created-by";
pub const CREATED_BY: &str = "skill-operator-gateway";
/// The skill a SkillJob runs, as the caller named it (the binding's status
/// says it too, but only once the controller has admitted the run).
pub const ANNOTATION_SKILL: &str = "skill-operator.dev/skill";
/// Label on a draft's record naming the namespace the draft belongs to.
pub const LABEL_DRAFT_NAMESPACE: &str = "skill-operator.dev/draft-namespace";

fn hex_of(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        // Length-prefixed, so ("ab","c") and ("a","bc") differ.
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The SkillJob (and job, and task) name of the run confirmed under `key`.
pub fn run_name(namespace: &str, principal: &str, key: &str) -> String {
    let hex = hex_of(&["skill-operator gateway run", namespace, principal, key]);
    format!("{ID_PREFIX}{}", &hex[..ID_HEX])
}

/// A fresh, random job id (a draft's; its SkillJob takes the same name).
pub fn draft_id() -> String {
    format!("{ID_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Whether `id` is shaped like an id this gateway hands out. Anything else
/// is answered "no such job" without asking the API server.
pub fn is_job_id(id: &str) -> bool {
    id.strip_prefix(ID_PREFIX).is_some_and(|hex| hex.len() == ID_HEX && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The [`LABEL_OWNER`] value of a principal (a label value: 63 characters at most).
pub fn owner_label(principal: &str) -> String {
    hex_of(&["skill-operator owner", principal])[..40].to_string()
}

/// The name of a draft's record in the gateway's namespace.
pub fn draft_record_name(namespace: &str, id: &str) -> String {
    format!("skill-draft-{namespace}-{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_are_deterministic_dns_labels_bound_to_namespace_and_caller() {
        let a = run_name("team", "alice", "k1");
        assert_eq!(a, run_name("team", "alice", "k1"), "a retried call names the same SkillJob");
        assert!(is_job_id(&a) && a.len() <= 63, "{a}");
        assert!(a.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        assert_ne!(a, run_name("team", "alice", "k2"));
        assert_ne!(a, run_name("other", "alice", "k1"));
        assert_ne!(a, run_name("team", "bob", "k1"));
        // Length-prefixing: shifting a character between parts changes the name.
        assert_ne!(run_name("ab", "c", "k"), run_name("a", "bc", "k"));
    }

    #[test]
    fn only_gateway_ids_are_job_ids() {
        assert!(is_job_id(&draft_id()));
        for bad in ["", "skj-", "skj-ABCDEF0123456789abcdef0123456789", "stats", "skj-0123", "x-0123456789abcdef0123456789abcdef"] {
            assert!(!is_job_id(bad), "{bad}");
        }
        assert!(owner_label("system:serviceaccount:team:agent").len() <= 63);
    }
}
