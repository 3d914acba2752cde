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
use std::time::{Duration, Instant};

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
    fn modes_fail_closed() {
        assert_eq!(ConfirmMode::parse("ask"), ConfirmMode::Ask);
        assert_eq!(ConfirmMode::parse("auto"), ConfirmMode::Auto);
        assert_eq!(ConfirmMode::parse("refuse"), ConfirmMode::Refuse);
        assert_eq!(ConfirmMode::parse("AUTO"), ConfirmMode::Refuse);
        assert_eq!(ConfirmMode::parse("yes"), ConfirmMode::Refuse);
    }
}
