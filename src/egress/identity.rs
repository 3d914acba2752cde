//! Job credentials for the proxy.
//!
//! A job presents `Proxy-Authorization: Basic base64(job:<token>)`, which
//! clients send from `HTTPS_PROXY=http://job:<token>@<proxy>:<port>`. The
//! token names the job and proves it: `<namespace>.<uid>.<mac>`, where
//! `<mac>` is the artifact-token HMAC ([`crate::core::token::job_token`])
//! under a key derived from the operator key for this purpose alone. So:
//! - the proxy checks a token without any lookup, and only the operator
//!   can mint one;
//! - a proxy credential is never an artifact token (different key): the
//!   script's container gets the proxy credential in its environment, and
//!   that must not let it write the job's outputs;
//! - every character is URL-safe (`[a-z0-9.-]`), so it goes into a proxy
//!   URL as is.
//!
//! A correct token is necessary, not sufficient: the proxy also requires
//! the connection to come from the source address registered for that job
//! (see [`super::registry`]), so a token copied out of a pod is useless
//! elsewhere.

use std::fmt;

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::core::token::{job_token, verify_job_token};

/// The user name of every proxy credential.
pub const PROXY_USER: &str = "job";
/// Domain separation for the derived key.
const KEY_CONTEXT: &[u8] = b"skill-operator egress-proxy credential v1";

/// A job: the SkillJob's namespace and UID (or a standalone run's id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct JobId {
    pub namespace: String,
    pub uid: String,
}

impl JobId {
    pub fn new(namespace: impl Into<String>, uid: impl Into<String>) -> JobId {
        JobId { namespace: namespace.into(), uid: uid.into() }
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.uid)
    }
}

/// The key proxy credentials are derived with.
pub fn proxy_key(operator_key: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length: new_from_slice cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(operator_key).unwrap_or_else(|_| unreachable!());
    mac.update(KEY_CONTEXT);
    mac.finalize().into_bytes().to_vec()
}

/// The job's proxy token, `<namespace>.<uid>.<mac>`. The controller puts it
/// in the pod's proxy variables; see [`proxy_url`].
pub fn proxy_token(operator_key: &[u8], job: &JobId) -> String {
    format!("{}.{}.{}", job.namespace, job.uid, job_token(&proxy_key(operator_key), &job.namespace, &job.uid))
}

/// `http://job:<token>@<proxy>`: the value of `HTTPS_PROXY` and friends.
/// `proxy` is `host:port` (an IP: pods have no DNS).
pub fn proxy_url(proxy: &str, operator_key: &[u8], job: &JobId) -> String {
    format!("http://{PROXY_USER}:{}@{proxy}", proxy_token(operator_key, job))
}

/// Variables a run with egress gets the proxy URL in (curl, Python, Go,
/// Node with NODE_USE_ENV_PROXY, pip, npm).
pub const PROXY_URL_ENV: [&str; 7] =
    ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "PIP_PROXY", "npm_config_https_proxy", "npm_config_proxy"];

/// Every variable a run with egress gets, in order: the proxy URL in each of
/// [`PROXY_URL_ENV`], then what makes every client use it. One list for a
/// run's pod (set by the controller) and a warm pod's claimed run (set by
/// its launcher from the claim).
pub fn proxy_env(proxy_url: &str) -> Vec<(&'static str, String)> {
    let mut env: Vec<(&'static str, String)> = PROXY_URL_ENV.iter().map(|n| (*n, proxy_url.to_string())).collect();
    // Nothing bypasses the proxy; Node's built-in fetch reads the
    // variables only with NODE_USE_ENV_PROXY (Node >= 22.21 / 24).
    env.extend([("NO_PROXY", String::new()), ("no_proxy", String::new()), ("NODE_USE_ENV_PROXY", "1".to_string())]);
    env
}

/// Why a `Proxy-Authorization` value was refused (never says whether the job exists).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("Proxy-Authorization is not `Basic base64(job:<token>)`")]
    Malformed,
    #[error("the proxy user must be `job` (HTTPS_PROXY=http://job:<token>@host:port)")]
    User,
    #[error("the token is not `<namespace>.<uid>.<mac>`")]
    Token,
}

/// Parse a `Proxy-Authorization` value into the job it claims and its mac.
pub fn parse_authorization(value: &[u8]) -> Result<(JobId, String), CredentialError> {
    let text = std::str::from_utf8(value).map_err(|_| CredentialError::Malformed)?.trim();
    let (scheme, b64) = text.split_once(' ').ok_or(CredentialError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") || b64.len() > 1024 {
        return Err(CredentialError::Malformed);
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|_| CredentialError::Malformed)?;
    let decoded = String::from_utf8(decoded).map_err(|_| CredentialError::Malformed)?;
    let (user, token) = decoded.split_once(':').ok_or(CredentialError::Malformed)?;
    if user != PROXY_USER {
        return Err(CredentialError::User);
    }
    parse_token(token)
}

/// Split a token: namespace before the first dot, mac after the last.
pub fn parse_token(token: &str) -> Result<(JobId, String), CredentialError> {
    let (namespace, rest) = token.split_once('.').ok_or(CredentialError::Token)?;
    let (uid, mac) = rest.rsplit_once('.').ok_or(CredentialError::Token)?;
    if namespace.is_empty() || uid.is_empty() || mac.is_empty() {
        return Err(CredentialError::Token);
    }
    Ok((JobId::new(namespace, uid), mac.to_string()))
}

/// Check a mac for a job in constant time, given the derived key.
pub fn verify(proxy_key: &[u8], job: &JobId, mac: &str) -> bool {
    verify_job_token(proxy_key, &job.namespace, &job.uid, mac)
}

/// `Basic base64(job:<token>)` (for clients and tests).
pub fn authorization_value(token: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{PROXY_USER}:{token}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_bind_one_job() {
        let key = [7u8; 32];
        let job = JobId::new("team-a", "4f1c2a9e-0000-4000-8000-000000000001");
        let token = proxy_token(&key, &job);
        assert!(token.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-'), "{token}");
        let (parsed, mac) = parse_authorization(authorization_value(&token).as_bytes()).unwrap();
        assert_eq!(parsed, job);
        assert!(verify(&proxy_key(&key), &job, &mac));
        assert!(!verify(&proxy_key(&[8u8; 32]), &job, &mac));
        assert!(!verify(&proxy_key(&key), &JobId::new("team-a", "other"), &mac));
        // Not the artifact token.
        assert_ne!(mac, job_token(&key, &job.namespace, &job.uid));
        assert_eq!(proxy_url("10.0.0.5:3128", &key, &job), format!("http://job:{token}@10.0.0.5:3128"));
    }

    #[test]
    fn malformed_values_are_refused() {
        let b64 = |s: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s));
        assert_eq!(parse_authorization(b"Bearer abc"), Err(CredentialError::Malformed));
        assert_eq!(parse_authorization(b"Basic !!!"), Err(CredentialError::Malformed));
        assert_eq!(parse_authorization(b64("jobtoken").as_bytes()), Err(CredentialError::Malformed));
        assert_eq!(parse_authorization(b64("root:a.b.c").as_bytes()), Err(CredentialError::User));
        assert_eq!(parse_authorization(b64("job:abc").as_bytes()), Err(CredentialError::Token));
        assert_eq!(parse_authorization(b64("job:a..c").as_bytes()), Err(CredentialError::Token));
        assert_eq!(parse_authorization(b64("job:a.b.").as_bytes()), Err(CredentialError::Token));
        assert!(parse_authorization(b64("job:a.b.c").as_bytes()).is_ok());
        // A uid with dots still splits (namespace: first dot; mac: last).
        assert_eq!(parse_token("ns.u.i.d.mac").unwrap().0, JobId::new("ns", "u.i.d"));
    }
}
