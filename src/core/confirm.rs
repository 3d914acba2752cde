//! Confirmation: `skill_run` starts nothing until the caller has seen the
//! exact call and confirmed it.
//!
//! The first call returns a dry-run preview and a single-use token bound to
//! a digest of the exact call (skill, script, argv, input digests, job). The
//! repeat with the same arguments and that token runs once. A changed call,
//! a reused token, an unknown token and an expired token are refused with
//! distinct errors. The gate is general because the server cannot know
//! whether a script mutates anything, and a script's own "read-only" claim
//! was written by the same author as the script.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// How long a token stays valid.
pub const TOKEN_TTL: Duration = Duration::from_secs(600);

/// The operator's confirmation mode. An unknown value means `refuse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ConfirmMode {
    /// Preview first; run on the repeat with the token (or an elicitation answer).
    Ask,
    /// Run on the first call (the operator has accepted every declared, granted script).
    Auto,
    /// Never run; previews only.
    Refuse,
}

impl ConfirmMode {
    pub fn parse(text: &str) -> ConfirmMode {
        match text.trim() {
            "ask" | "ask-user" | "" => ConfirmMode::Ask,
            "auto" => ConfirmMode::Auto,
            _ => ConfirmMode::Refuse,
        }
    }
}

/// Why a confirmation token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfirmError {
    #[error("unknown confirmation token: call again without `confirm` to get a fresh preview and token")]
    Unknown,
    #[error("the confirmation token expired; call again without `confirm` to get a fresh preview and token")]
    Expired,
    #[error("the confirmation token was already used; each token runs one call once")]
    Reused,
    #[error("the call changed since the preview (skill, script, arguments or inputs differ); the token confirms only the previewed call")]
    CallChanged,
}

impl ConfirmError {
    pub fn code(&self) -> &'static str {
        match self {
            ConfirmError::Unknown => "token-unknown",
            ConfirmError::Expired => "token-expired",
            ConfirmError::Reused => "token-reused",
            ConfirmError::CallChanged => "call-changed",
        }
    }
}

/// A digest of the exact call a token confirms.
pub fn call_digest(call: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(call).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

/// Where tokens are issued and redeemed: one process's memory
/// ([`Confirmations`]), or a key every replica shares ([`SignedConfirmations`]).
pub trait ConfirmStore: Send + Sync {
    /// A token for the call with digest `call`.
    fn issue(&self, call: &str) -> String;
    /// Accept `token` for the call with digest `call`. The answer is a key
    /// unique to the confirmation: whoever starts the run must start at most
    /// one per key (a store that cannot remember uses, the signed one,
    /// relies on that to keep "runs once" true).
    fn redeem(&self, token: &str, call: &str) -> Result<String, ConfirmError>;
}

struct Issued {
    call: String,
    expires: Instant,
    used: bool,
}

/// Issued tokens. In memory on purpose: a restart invalidates every
/// outstanding preview, which fails closed.
pub struct Confirmations {
    ttl: Duration,
    issued: Mutex<HashMap<String, Issued>>,
}

impl Default for Confirmations {
    fn default() -> Self {
        Confirmations::new(TOKEN_TTL)
    }
}

impl Confirmations {
    pub fn new(ttl: Duration) -> Self {
        Confirmations { ttl, issued: Mutex::new(HashMap::new()) }
    }

    /// Issue a token for the call with digest `call`.
    pub fn issue(&self, call: &str, now: Instant) -> String {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        // Forget tokens long past expiry (kept a while so reuse is reported as reuse).
        issued.retain(|_, t| t.expires + self.ttl > now);
        issued.insert(token.clone(), Issued { call: call.to_string(), expires: now + self.ttl, used: false });
        token
    }

    /// Accept `token` for the call with digest `call`, once.
    pub fn redeem(&self, token: &str, call: &str, now: Instant) -> Result<(), ConfirmError> {
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        let entry = issued.get_mut(token).ok_or(ConfirmError::Unknown)?;
        if entry.used {
            return Err(ConfirmError::Reused);
        }
        if now >= entry.expires {
            return Err(ConfirmError::Expired);
        }
        if entry.call != call {
            return Err(ConfirmError::CallChanged);
        }
        entry.used = true;
        Ok(())
    }
}

impl ConfirmStore for Confirmations {
    fn issue(&self, call: &str) -> String {
        Confirmations::issue(self, call, Instant::now())
    }
    fn redeem(&self, token: &str, call: &str) -> Result<String, ConfirmError> {
        Confirmations::redeem(self, token, call, Instant::now()).map(|()| token.to_string())
    }
}

/// Tokens any replica can check: the nonce, expiry and a prefix of the
/// call digest, sealed with HMAC-SHA256 under a key the replicas share.
/// Nothing is stored, so a token cannot be marked used here: the key
/// [`ConfirmStore::redeem`] returns is the nonce, and the gateway names the
/// SkillJob after it (the API server refuses a second one of that name).
pub struct SignedConfirmations {
    key: Vec<u8>,
    ttl: Duration,
}

const SIGNED_NONCE: usize = 16;
const SIGNED_PREFIX: usize = 8;
const SIGNED_MAC: usize = 32;
const SIGNED_LEN: usize = SIGNED_NONCE + 8 + SIGNED_PREFIX + SIGNED_MAC;

impl SignedConfirmations {
    pub fn new(key: &[u8], ttl: Duration) -> Self {
        SignedConfirmations { key: key.to_vec(), ttl }
    }

    /// The MAC state over everything a token binds.
    fn mac(&self, nonce: &[u8], expiry: u64, call: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(b"skill-operator confirmation v1\0");
        mac.update(nonce);
        mac.update(&expiry.to_be_bytes());
        mac.update(call.as_bytes());
        mac
    }

    fn prefix(call: &str) -> [u8; SIGNED_PREFIX] {
        let mut out = [0u8; SIGNED_PREFIX];
        out.copy_from_slice(&Sha256::digest(call.as_bytes())[..SIGNED_PREFIX]);
        out
    }

    fn issue_at(&self, call: &str, now: SystemTime) -> String {
        let nonce: [u8; SIGNED_NONCE] = *uuid::Uuid::new_v4().as_bytes();
        let expiry = (now + self.ttl).duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut raw = Vec::with_capacity(SIGNED_LEN);
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&expiry.to_be_bytes());
        raw.extend_from_slice(&Self::prefix(call));
        raw.extend_from_slice(&self.mac(&nonce, expiry, call).finalize().into_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    }

    fn redeem_at(&self, token: &str, call: &str, now: SystemTime) -> Result<String, ConfirmError> {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.as_bytes()).map_err(|_| ConfirmError::Unknown)?;
        if raw.len() != SIGNED_LEN {
            return Err(ConfirmError::Unknown);
        }
        let (nonce, rest) = raw.split_at(SIGNED_NONCE);
        let (expiry, rest) = rest.split_at(8);
        let (prefix, mac) = rest.split_at(SIGNED_PREFIX);
        let expiry = u64::from_be_bytes(expiry.try_into().map_err(|_| ConfirmError::Unknown)?);
        // verify_slice compares in constant time.
        if self.mac(nonce, expiry, call).verify_slice(mac).is_err() {
            // Sealed for another call (its digest prefix differs), or not ours at all.
            return Err(if prefix != Self::prefix(call) { ConfirmError::CallChanged } else { ConfirmError::Unknown });
        }
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if now >= expiry {
            return Err(ConfirmError::Expired);
        }
        Ok(hex::encode(nonce))
    }
}

impl ConfirmStore for SignedConfirmations {
    fn issue(&self, call: &str) -> String {
        self.issue_at(call, SystemTime::now())
    }
    fn redeem(&self, token: &str, call: &str) -> Result<String, ConfirmError> {
        self.redeem_at(token, call, SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_runs_the_previewed_call_once() {
        let c = Confirmations::default();
        let now = Instant::now();
        let call = call_digest(&("s", "a.py", ["x"]));
        let token = c.issue(&call, now);
        assert_eq!(c.redeem(&token, &call, now), Ok(()));
        assert_eq!(c.redeem(&token, &call, now), Err(ConfirmError::Reused));
    }

    #[test]
    fn changed_call_unknown_and_expired_are_distinct() {
        let c = Confirmations::new(Duration::from_secs(10));
        let now = Instant::now();
        let call = call_digest(&("s", "a.py", ["x"]));
        let token = c.issue(&call, now);
        let changed = call_digest(&("s", "a.py", ["y"]));
        assert_eq!(c.redeem(&token, &changed, now), Err(ConfirmError::CallChanged));
        assert_eq!(c.redeem("nope", &call, now), Err(ConfirmError::Unknown));
        assert_eq!(c.redeem(&token, &call, now + Duration::from_secs(10)), Err(ConfirmError::Expired));
        // Just inside the TTL still works (the changed attempt did not consume it).
        let fresh = c.issue(&call, now);
        assert_eq!(c.redeem(&fresh, &call, now + Duration::from_secs(9)), Ok(()));
    }

    #[test]
    fn signed_tokens_check_call_key_and_expiry_without_state() {
        let a = SignedConfirmations::new(b"key-a", Duration::from_secs(10));
        let now = SystemTime::now();
        let call = call_digest(&("ns", "alice", "s", "a.py", ["x"]));
        let token = a.issue_at(&call, now);
        // Another replica with the same key accepts it; the key is stable per token.
        let replica = SignedConfirmations::new(b"key-a", Duration::from_secs(10));
        let key = replica.redeem_at(&token, &call, now).unwrap();
        assert_eq!(a.redeem_at(&token, &call, now).unwrap(), key, "one token, one key: the run is named after it");
        assert_ne!(a.redeem_at(&a.issue_at(&call, now), &call, now).unwrap(), key, "a fresh token is a new key");
        // Another call (another principal or namespace is another digest), another key, tampering, expiry.
        let other = call_digest(&("ns", "mallory", "s", "a.py", ["x"]));
        assert_eq!(a.redeem_at(&token, &other, now), Err(ConfirmError::CallChanged));
        assert_eq!(SignedConfirmations::new(b"key-b", Duration::from_secs(10)).redeem_at(&token, &call, now), Err(ConfirmError::Unknown));
        let mut raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&token).unwrap();
        raw[SIGNED_NONCE] ^= 1; // a later expiry
        let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&raw);
        assert_eq!(a.redeem_at(&forged, &call, now), Err(ConfirmError::Unknown));
        assert_eq!(a.redeem_at(&token, &call, now + Duration::from_secs(10)), Err(ConfirmError::Expired));
        assert_eq!(a.redeem_at(&token, &call, now + Duration::from_secs(9)).as_deref(), Ok(key.as_str()));
        for junk in ["", "nope", "!!!!", &"A".repeat(SIGNED_LEN * 2)] {
            assert_eq!(a.redeem_at(junk, &call, now), Err(ConfirmError::Unknown), "{junk:?}");
        }
    }

    #[test]
    fn modes_fail_closed() {
        assert_eq!(ConfirmMode::parse("ask"), ConfirmMode::Ask);
        assert_eq!(ConfirmMode::parse("auto"), ConfirmMode::Auto);
        assert_eq!(ConfirmMode::parse("refuse"), ConfirmMode::Refuse);
        assert_eq!(ConfirmMode::parse("AUTO"), ConfirmMode::Refuse);
        assert_eq!(ConfirmMode::parse("yes"), ConfirmMode::Refuse);
    }
}
