//! Per-job tokens for the artifact endpoint.
//!
//! A token is an HMAC of the job's namespace and UID under the operator's
//! key: the endpoint checks it without any lookup, a token is good for one
//! job only, and nothing but the operator can mint one. The pod receives it
//! in a Secret mounted only into its fetch and upload containers.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The token for one job.
pub fn job_token(key: &[u8], namespace: &str, uid: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(namespace.as_bytes());
    mac.update(b"/");
    mac.update(uid.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Check a presented token in constant time.
pub fn verify_job_token(key: &[u8], namespace: &str, uid: &str, presented: &str) -> bool {
    let Ok(bytes) = hex::decode(presented.trim()) else { return false };
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(namespace.as_bytes());
    mac.update(b"/");
    mac.update(uid.as_bytes());
    mac.verify_slice(&bytes).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_bound_to_one_job_and_one_key() {
        let t = job_token(b"key", "team", "uid-1");
        assert!(verify_job_token(b"key", "team", "uid-1", &t));
        assert!(!verify_job_token(b"key", "team", "uid-2", &t));
        assert!(!verify_job_token(b"key", "other", "uid-1", &t));
        assert!(!verify_job_token(b"other-key", "team", "uid-1", &t));
        assert!(!verify_job_token(b"key", "team", "uid-1", "not hex"));
        assert!(!verify_job_token(b"key", "team", "uid-1", &t[..10]));
    }
}
