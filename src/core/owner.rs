//! Who a run belongs to, proven: the gateway's seal on the SkillJobs it
//! writes.
//!
//! The gateway writes a SkillJob for a caller it authenticated and names
//! that caller in an annotation. Anyone allowed to create SkillJobs can
//! write the same annotation, so the annotation alone proves nothing. The
//! gateway therefore seals it: an HMAC, under a key derived from the
//! operator's token key (which the gateway and the controller hold, and
//! no tenant does), over the namespace, the SkillJob's name, the principal,
//! the spec and the time of sealing. The gateway lists a SkillJob as a
//! caller's, and the controller's audit names its requester, only when the
//! seal verifies; an annotation without one is a claim, never an owner.
//!
//! A seal copied onto another SkillJob fails (another name, namespace or
//! spec). Copied onto the same name and spec after the original was
//! deleted, it fails too: it is good only for a SkillJob created within
//! [`SEAL_WINDOW`] of its sealing, and the controller keeps a sealed
//! SkillJob's name taken (its finalizer held) until [`crate::core::confirm::TOKEN_TTL`]
//! after sealing, which is longer.

use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far apart the sealing and the SkillJob's creation (by the API
/// server's clock) may be: a request's time in flight, and the clocks of
/// two machines. Shorter than the time a sealed name stays taken.
pub const SEAL_WINDOW: Duration = Duration::from_secs(120);
const _: () = assert!(SEAL_WINDOW.as_secs() < crate::core::confirm::TOKEN_TTL.as_secs());

const VERSION: &str = "v1";

/// The seal's key, derived from the operator's token key under a label of
/// its own (a seal is never a token of another kind).
#[derive(Clone)]
pub struct OwnerSeal {
    key: [u8; 32],
}

impl std::fmt::Debug for OwnerSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnerSeal(..)")
    }
}

/// What a seal binds.
#[derive(Debug, Clone, Copy)]
pub struct OwnerClaim<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub principal: &'a str,
    /// The sha256 of the SkillJob spec's JSON ([`crate::core::package::digest`]).
    pub spec_digest: &'a str,
}

/// Why a seal does not prove its claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealRefusal {
    #[error("no owner seal")]
    Missing,
    #[error("the owner seal is not one the gateway writes")]
    Malformed,
    #[error("the owner seal was not made for this SkillJob, its principal and its spec")]
    Forged,
    #[error("the owner seal was made {0} s away from the SkillJob's creation, more than the {window} s a seal is good for", window = SEAL_WINDOW.as_secs())]
    OutOfWindow(i64),
}

impl OwnerSeal {
    pub fn new(token_key: &[u8]) -> OwnerSeal {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token_key).expect("HMAC takes keys of any length");
        mac.update(b"skill-operator owner seal");
        OwnerSeal { key: mac.finalize().into_bytes().into() }
    }

    fn mac(&self, claim: &OwnerClaim<'_>, sealed_at: i64) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        for part in [VERSION, claim.namespace, claim.name, claim.principal, claim.spec_digest, &sealed_at.to_string()] {
            // Length-prefixed, so no part can shift into the next.
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// The seal of `claim`, made at `sealed_at` (Unix seconds).
    pub fn seal(&self, claim: &OwnerClaim<'_>, sealed_at: i64) -> String {
        let tag = self.mac(claim, sealed_at).finalize().into_bytes();
        format!("{VERSION}.{sealed_at}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag))
    }

    /// When `seal` was made, if it proves `claim` for a SkillJob created at
    /// `created_at` (Unix seconds, the API server's).
    pub fn verify(&self, claim: &OwnerClaim<'_>, seal: Option<&str>, created_at: Option<i64>) -> Result<i64, SealRefusal> {
        let seal = seal.ok_or(SealRefusal::Missing)?;
        let mut parts = seal.splitn(3, '.');
        let (Some(VERSION), Some(at), Some(tag)) = (parts.next(), parts.next(), parts.next()) else { return Err(SealRefusal::Malformed) };
        let sealed_at: i64 = at.parse().map_err(|_| SealRefusal::Malformed)?;
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tag).map_err(|_| SealRefusal::Malformed)?;
        // verify_slice compares in constant time.
        self.mac(claim, sealed_at).verify_slice(&tag).map_err(|_| SealRefusal::Forged)?;
        let created_at = created_at.ok_or(SealRefusal::OutOfWindow(i64::MAX))?;
        let apart = created_at.saturating_sub(sealed_at);
        if apart.unsigned_abs() > SEAL_WINDOW.as_secs() {
            return Err(SealRefusal::OutOfWindow(apart));
        }
        Ok(sealed_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn claim<'a>(name: &'a str, principal: &'a str, spec: &'a str) -> OwnerClaim<'a> {
        OwnerClaim { namespace: "team", name, principal, spec_digest: spec }
    }

    #[test]
    fn a_seal_proves_exactly_its_claim_within_its_window() {
        let s = OwnerSeal::new(b"the operator's token key, 32 bytes+");
        let mine = claim("skj-1", "system:serviceaccount:team:alice", "sha256:aa");
        let seal = s.seal(&mine, NOW);
        assert_eq!(s.verify(&mine, Some(&seal), Some(NOW + 1)), Ok(NOW));
        assert_eq!(s.verify(&mine, Some(&seal), Some(NOW - 120)), Ok(NOW), "the edge of the window, before");
        assert_eq!(s.verify(&mine, Some(&seal), Some(NOW + 120)), Ok(NOW), "the edge of the window, after");
        assert_eq!(
            s.verify(&mine, Some(&seal), Some(NOW + 121)),
            Err(SealRefusal::OutOfWindow(121)),
            "recreated later under the same name"
        );
        assert_eq!(s.verify(&mine, Some(&seal), Some(NOW - 121)), Err(SealRefusal::OutOfWindow(-121)));
        assert!(s.verify(&mine, Some(&seal), None).is_err(), "no creation time, no proof");
        // Moved onto anything else: another principal (the forgery the attack made), name, namespace, spec.
        for other in [
            claim("skj-1", "system:serviceaccount:team:mallory", "sha256:aa"),
            claim("skj-2", "system:serviceaccount:team:alice", "sha256:aa"),
            claim("skj-1", "system:serviceaccount:team:alice", "sha256:bb"),
            OwnerClaim { namespace: "other", ..mine },
        ] {
            assert_eq!(s.verify(&other, Some(&seal), Some(NOW)), Err(SealRefusal::Forged), "{other:?}");
        }
        // Another key (another installation), no seal, or a seal of another shape.
        assert_eq!(OwnerSeal::new(b"another key").verify(&mine, Some(&seal), Some(NOW)), Err(SealRefusal::Forged));
        assert_eq!(s.verify(&mine, None, Some(NOW)), Err(SealRefusal::Missing));
        let moved = seal.replacen(&NOW.to_string(), &(NOW + 60).to_string(), 1);
        assert_eq!(s.verify(&mine, Some(&moved), Some(NOW + 60)), Err(SealRefusal::Forged), "the time is sealed too");
        for bad in ["", "v1", "v1.x.y", "v2.1.AAAA", "v1.1.!!!"] {
            assert!(matches!(s.verify(&mine, Some(bad), Some(NOW)), Err(SealRefusal::Malformed | SealRefusal::Forged)), "{bad}");
        }
        // Length-prefixed: shifting a character between parts changes the seal.
        let shifted = OwnerClaim { namespace: "tea", name: "mskj-1", ..mine };
        assert_eq!(s.verify(&shifted, Some(&seal), Some(NOW)), Err(SealRefusal::Forged));
    }
}
