//! Granted variables handed to a warm pod at its claim, sealed to that pod.
//!
//! A warm pod waits before any run asks for it, so it may hold no Secret
//! value (a cold run's pod gets them from the kubelet when it starts). At
//! the claim the values go to the one pod that runs the script, and nowhere
//! else in the clear:
//!
//! 1. The pod's launcher makes an X25519 key pair when it starts. The
//!    private half lives in its memory only; the public half
//!    ([`ClaimKey`]) goes into a file its upload sidecar reads and
//!    publishes at the artifact endpoint under the pod's warm uid, with the
//!    pod's own credential (write-once: `PUT .../claim-key`).
//! 2. The controller, claiming the pod for a run granted variables, reads
//!    that key (operator only), reads the values from the run's Secrets,
//!    and seals them ([`seal`]): a one-time X25519 key pair of its own,
//!    HKDF-SHA256 over the shared secret salted by both public keys,
//!    ChaCha20-Poly1305 with the run's SkillJob uid as associated data. The
//!    box ([`SealedEnv`]) travels in the claim and is stored with it.
//! 3. The launcher opens it ([`PodKey::open`], which consumes the key: one
//!    key, one claim) and gives the variables to the script.
//!
//! The endpoint, its store, and whoever reads a stored claim hold only the
//! box. It opens only with the private key of the pod it was sealed to,
//! which never left that pod's memory and is gone with it, and only for
//! the run it names. A box that does not open refuses the claim: nothing
//! runs without its variables.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::{aead, agreement, hkdf, rand};
use serde::{Deserialize, Serialize};

use crate::core::limits::KIB;

/// The most a run's variables may hold, names and values, as the sealed
/// JSON (`[["NAME","value"],...]`). Past it a run starts cold, and its
/// values reach its pod through the kubelet as before.
pub const SEALED_ENV_MAX_BYTES: usize = 32 * KIB as usize;
/// An X25519 public key in base64url without padding (32 bytes).
pub const CLAIM_KEY_CHARS: usize = 43;
/// The longest `sealed` field of a [`SealedEnv`]: the base64url of the
/// largest plaintext and its tag.
pub const SEALED_BOX_MAX_CHARS: usize = (SEALED_ENV_MAX_BYTES + TAG_LEN).div_ceil(3) * 4;
/// The most a [`SealedEnv`] adds to a claim's JSON.
pub const SEALED_CLAIM_MAX_BYTES: usize = SEALED_BOX_MAX_CHARS + CLAIM_KEY_CHARS + 64;
/// The most a [`ClaimKey`] document may be, as the endpoint reads it.
pub const CLAIM_KEY_MAX_BYTES: usize = 256;

const TAG_LEN: usize = 16;
/// The HKDF info: what the derived key is for (and this scheme's version).
const INFO: &[u8] = b"skill-operator claim env v1";

/// Why variables could not be sealed or opened. The messages end up in a
/// refused run's result or the controller's log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("the claim key {0}")]
    Key(String),
    #[error("the variables take {bytes} bytes sealed, more than the {max} a claim carries")]
    TooLarge { bytes: usize, max: usize },
    #[error("the variable {name:?} {problem}")]
    Var { name: String, problem: &'static str },
    #[error("the sealed variables {0}")]
    Malformed(String),
    #[error(
        "the sealed variables do not open with this pod's key: they were sealed to another pod or for another run, or changed on the way"
    )]
    DoesNotOpen,
    #[error("no randomness for a key ({0}); try again")]
    Random(&'static str),
}

/// A warm pod's public key, as published at the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimKey {
    /// X25519, base64url without padding.
    pub x25519: String,
}

impl ClaimKey {
    pub fn validate(&self) -> Result<(), SealError> {
        public_bytes(&self.x25519).map(|_| ())
    }
}

/// A run's variables sealed to its warm pod (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SealedEnv {
    /// The sealer's one-time X25519 public key, base64url without padding.
    pub key: String,
    /// ChaCha20-Poly1305 ciphertext and tag, base64url without padding.
    pub sealed: String,
}

impl SealedEnv {
    /// Its shape, without opening it: what the endpoint can check.
    pub fn validate(&self) -> Result<(), SealError> {
        public_bytes(&self.key).map_err(|e| SealError::Malformed(format!("carry a bad sealer's key: {e}")))?;
        if self.sealed.len() > SEALED_BOX_MAX_CHARS {
            return Err(SealError::TooLarge { bytes: self.sealed.len(), max: SEALED_BOX_MAX_CHARS });
        }
        let bytes = URL_SAFE_NO_PAD.decode(&self.sealed).map_err(|e| SealError::Malformed(format!("are not base64url: {e}")))?;
        if bytes.len() < TAG_LEN {
            return Err(SealError::Malformed(format!("are {} bytes, shorter than their tag", bytes.len())));
        }
        Ok(())
    }
}

fn public_bytes(text: &str) -> Result<[u8; 32], SealError> {
    if text.len() != CLAIM_KEY_CHARS {
        return Err(SealError::Key(format!("is {} characters, not the {CLAIM_KEY_CHARS} of an X25519 key in base64url", text.len())));
    }
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|e| SealError::Key(format!("is not base64url: {e}")))?;
    bytes.try_into().map_err(|_| SealError::Key("is not 32 bytes".into()))
}

/// The rules every sealed set of variables keeps, checked before sealing
/// and again after opening: identifiers, none reserved
/// ([`crate::core::env::is_reserved`]: the pod and its launcher set those),
/// each once, values without NUL (an environment cannot hold one).
pub fn check_vars(vars: &[(String, String)]) -> Result<(), SealError> {
    let mut seen = std::collections::HashSet::new();
    for (name, value) in vars {
        let problem = if !crate::core::env::is_identifier(name) {
            Some("is not a variable name ([A-Za-z_][A-Za-z0-9_]*, at most 128)")
        } else if crate::core::env::is_reserved(name) {
            Some("is reserved: the pod sets it, or it changes what a program loads")
        } else if !seen.insert(name.as_str()) {
            Some("is given twice")
        } else if value.contains('\0') {
            Some("holds a NUL byte, which no environment can carry")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(SealError::Var { name: name.clone(), problem });
        }
    }
    Ok(())
}

/// The key both ends derive from one agreement.
fn derive(shared: &[u8], sealer: &[u8; 32], pod: &[u8; 32]) -> aead::LessSafeKey {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(sealer);
    salt[32..].copy_from_slice(pod);
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(shared);
    // Expanding 32 bytes from SHA-256 cannot fail (the limit is 255 × 32).
    let okm = prk.expand(&[INFO], &aead::CHACHA20_POLY1305).expect("32 bytes of HKDF-SHA256 output");
    aead::LessSafeKey::new(aead::UnboundKey::from(okm))
}

/// Every key derived here seals exactly one message (the sealer's key pair
/// is made for it and dropped), so a fixed nonce is never reused with a key.
fn nonce() -> aead::Nonce {
    aead::Nonce::assume_unique_for_key([0u8; aead::NONCE_LEN])
}

/// `vars` as they are sealed, once they pass every rule of a seal: those
/// of [`check_vars`] and [`SEALED_ENV_MAX_BYTES`]. The controller checks a
/// run's values with it before it looks at any pod.
pub fn sealable(vars: &[(String, String)]) -> Result<Vec<u8>, SealError> {
    check_vars(vars)?;
    let plain = serde_json::to_vec(vars).map_err(|e| SealError::Malformed(e.to_string()))?;
    if plain.len() > SEALED_ENV_MAX_BYTES {
        return Err(SealError::TooLarge { bytes: plain.len(), max: SEALED_ENV_MAX_BYTES });
    }
    Ok(plain)
}

/// A fresh X25519 key pair (`whose`, for the error).
fn key_pair(whose: &'static str) -> Result<(agreement::EphemeralPrivateKey, [u8; 32]), SealError> {
    let private =
        agreement::EphemeralPrivateKey::generate(&agreement::X25519, &rand::SystemRandom::new()).map_err(|_| SealError::Random(whose))?;
    let public = private.compute_public_key().ok().and_then(|p| p.as_ref().try_into().ok()).ok_or(SealError::Random(whose))?;
    Ok((private, public))
}

/// Seals `vars` to the pod whose key is `pod`, for the run `skilljob_uid`.
pub fn seal(pod: &ClaimKey, skilljob_uid: &str, vars: &[(String, String)]) -> Result<SealedEnv, SealError> {
    seal_plain(pod, skilljob_uid, sealable(vars)?)
}

/// [`seal`] of bytes already checked.
fn seal_plain(pod: &ClaimKey, skilljob_uid: &str, mut plain: Vec<u8>) -> Result<SealedEnv, SealError> {
    let pod_public = public_bytes(&pod.x25519)?;
    let (mine, my_public) = key_pair("the sealer's")?;
    let peer = agreement::UnparsedPublicKey::new(&agreement::X25519, pod_public);
    let key = agreement::agree_ephemeral(mine, &peer, |shared| derive(shared, &my_public, &pod_public))
        .map_err(|_| SealError::Key("is not a usable X25519 public key".into()))?;
    key.seal_in_place_append_tag(nonce(), aead::Aad::from(skilljob_uid.as_bytes()), &mut plain)
        .map_err(|_| SealError::Malformed("cannot be sealed".into()))?;
    Ok(SealedEnv { key: URL_SAFE_NO_PAD.encode(my_public), sealed: URL_SAFE_NO_PAD.encode(&plain) })
}

/// A warm pod's key pair: made when its launcher starts, used for one claim.
pub struct PodKey {
    private: agreement::EphemeralPrivateKey,
    public: [u8; 32],
}

impl std::fmt::Debug for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodKey").field("public", &URL_SAFE_NO_PAD.encode(self.public)).finish_non_exhaustive()
    }
}

impl PodKey {
    pub fn generate() -> Result<Self, SealError> {
        let (private, public) = key_pair("the pod's")?;
        Ok(PodKey { private, public })
    }

    /// What the pod publishes.
    pub fn public(&self) -> ClaimKey {
        ClaimKey { x25519: URL_SAFE_NO_PAD.encode(self.public) }
    }

    /// Opens the variables sealed to this key for the run `skilljob_uid`,
    /// and checks them as [`seal`] did.
    pub fn open(self, sealed: &SealedEnv, skilljob_uid: &str) -> Result<Vec<(String, String)>, SealError> {
        sealed.validate()?;
        let sealer = public_bytes(&sealed.key).map_err(|e| SealError::Malformed(format!("carry a bad sealer's key: {e}")))?;
        let mut bytes = URL_SAFE_NO_PAD.decode(&sealed.sealed).map_err(|e| SealError::Malformed(format!("are not base64url: {e}")))?;
        let peer = agreement::UnparsedPublicKey::new(&agreement::X25519, sealer);
        let pod_public = self.public;
        let key = agreement::agree_ephemeral(self.private, &peer, |shared| derive(shared, &sealer, &pod_public))
            .map_err(|_| SealError::DoesNotOpen)?;
        let plain = key.open_in_place(nonce(), aead::Aad::from(skilljob_uid.as_bytes()), &mut bytes).map_err(|_| SealError::DoesNotOpen)?;
        let vars: Vec<(String, String)> =
            serde_json::from_slice(plain).map_err(|e| SealError::Malformed(format!("are not a list of [name, value]: {e}")))?;
        check_vars(&vars)?;
        Ok(vars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60";

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    #[test]
    fn variables_sealed_to_a_pod_open_there_for_that_run_only() {
        let want = vars(&[("API_KEY", "s3cret value\nwith a line"), ("REGION", "eu-west-1"), ("EMPTY", "")]);
        let pod = PodKey::generate().unwrap();
        let sealed = seal(&pod.public(), RUN, &want).unwrap();
        sealed.validate().unwrap();
        let json = serde_json::to_string(&sealed).unwrap();
        assert!(!json.contains("s3cret") && !json.contains("API_KEY") && !json.contains("eu-west-1"), "nothing in the clear: {json}");
        assert_eq!(pod.open(&sealed, RUN).unwrap(), want);

        // Another pod's key, another run, a changed byte: none opens.
        let other = PodKey::generate().unwrap();
        assert_eq!(other.open(&sealed, RUN), Err(SealError::DoesNotOpen));
        let pod = PodKey::generate().unwrap();
        let sealed = seal(&pod.public(), RUN, &want).unwrap();
        let pod_public = pod.public();
        assert_eq!(pod.open(&sealed, "another-run"), Err(SealError::DoesNotOpen));
        for at in [0, sealed.sealed.len() / 2, sealed.sealed.len() - 2] {
            let pod = PodKey::generate().unwrap();
            let mut tampered = seal(&pod.public(), RUN, &want).unwrap();
            let mut chars: Vec<char> = tampered.sealed.chars().collect();
            chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
            tampered.sealed = chars.into_iter().collect();
            assert_eq!(pod.open(&tampered, RUN), Err(SealError::DoesNotOpen), "a byte changed at {at}");
        }
        // The sealer's key swapped for another: the agreement differs.
        let pod = PodKey::generate().unwrap();
        let mut swapped = seal(&pod.public(), RUN, &want).unwrap();
        swapped.key = seal(&pod_public, RUN, &want).unwrap().key;
        assert_eq!(pod.open(&swapped, RUN), Err(SealError::DoesNotOpen));
        // Two seals of the same values differ (a key of their own each).
        let a = seal(&pod_public, RUN, &want).unwrap();
        let b = seal(&pod_public, RUN, &want).unwrap();
        assert_ne!((a.key, a.sealed), (b.key, b.sealed));
    }

    #[test]
    fn only_variables_a_pod_may_be_given_are_sealed_or_opened() {
        let pod = PodKey::generate().unwrap().public();
        for (name, value, problem) in [
            ("PATH", "/evil", "is reserved"),
            ("LD_PRELOAD", "/tmp/x.so", "is reserved"),
            ("HTTPS_PROXY", "http://evil", "is reserved"),
            ("1BAD", "x", "is not a variable name"),
            ("A=B", "x", "is not a variable name"),
            ("NUL", "a\0b", "holds a NUL byte"),
        ] {
            let err = seal(&pod, RUN, &vars(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(problem), "{name}: {err}");
        }
        let err = seal(&pod, RUN, &vars(&[("A", "1"), ("A", "2")])).unwrap_err();
        assert!(err.to_string().contains("given twice"), "{err}");

        // A pod refuses them too, should a sealer send them: sealed here by hand.
        let key = PodKey::generate().unwrap();
        let bad = seal_unchecked(&key.public(), RUN, &vars(&[("LD_PRELOAD", "/tmp/x.so")]));
        let err = key.open(&bad, RUN).unwrap_err();
        assert!(err.to_string().contains("is reserved"), "{err}");
    }

    /// [`seal`] without its checks: what a sealer that broke the rules would send.
    fn seal_unchecked(pod: &ClaimKey, uid: &str, vars: &[(String, String)]) -> SealedEnv {
        seal_plain(pod, uid, serde_json::to_vec(vars).unwrap()).unwrap()
    }

    #[test]
    fn the_size_cap_holds_at_its_edge() {
        let pod = PodKey::generate().unwrap();
        // `[["V","<value>"]]` is 10 bytes around the value.
        let fits = vars(&[("V", &"x".repeat(SEALED_ENV_MAX_BYTES - 10))]);
        let sealed = seal(&pod.public(), RUN, &fits).unwrap();
        assert!(sealed.sealed.len() <= SEALED_BOX_MAX_CHARS, "{} > {SEALED_BOX_MAX_CHARS}", sealed.sealed.len());
        assert!(serde_json::to_vec(&sealed).unwrap().len() <= SEALED_CLAIM_MAX_BYTES);
        assert_eq!(pod.open(&sealed, RUN).unwrap(), fits);
        let over = vars(&[("V", &"x".repeat(SEALED_ENV_MAX_BYTES - 9))]);
        let err = PodKey::generate().map(|k| seal(&k.public(), RUN, &over)).unwrap().unwrap_err();
        assert_eq!(err, SealError::TooLarge { bytes: SEALED_ENV_MAX_BYTES + 1, max: SEALED_ENV_MAX_BYTES });
        let long = SealedEnv { key: pod_key_text(), sealed: "A".repeat(SEALED_BOX_MAX_CHARS + 1) };
        assert!(matches!(long.validate(), Err(SealError::TooLarge { .. })));
    }

    fn pod_key_text() -> String {
        PodKey::generate().unwrap().public().x25519
    }

    #[test]
    fn malformed_keys_and_boxes_are_refused_by_shape() {
        for bad in ["", "short", &"A".repeat(44), &"*".repeat(43)] {
            assert!(ClaimKey { x25519: bad.to_string() }.validate().is_err(), "{bad:?}");
            let sealed = SealedEnv { key: bad.to_string(), sealed: "AAAAAAAAAAAAAAAAAAAAAA".into() };
            assert!(sealed.validate().is_err(), "{bad:?}");
        }
        assert!(ClaimKey { x25519: pod_key_text() }.validate().is_ok());
        for bad in ["AAAA", "not base64!", ""] {
            let sealed = SealedEnv { key: pod_key_text(), sealed: bad.into() };
            assert!(sealed.validate().is_err(), "{bad:?}");
        }
        let json = r#"{"key":"k","sealed":"s","extra":1}"#;
        assert!(serde_json::from_str::<SealedEnv>(json).is_err(), "unknown fields are refused");
    }
}
