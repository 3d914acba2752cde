//! Run pods' projected ServiceAccount tokens, verified by TokenReview.
//!
//! In the cluster a run pod's `fetch` and `upload` present a token the
//! kubelet projected for the pod's ServiceAccount ([`RUN_SERVICE_ACCOUNT`])
//! with one job's audience ([`pod_token_audience`]). The endpoint cannot
//! check such a token itself (the API server's signing keys are not ours),
//! so it asks the API server, and accepts only what names exactly one job:
//!
//! - the API server authenticated the token *for that job's audience*, so a
//!   token minted for one run (or for the API server itself) is refused on
//!   every other job's routes;
//! - the token is the run ServiceAccount's, in the job's namespace;
//! - the token is bound to a pod: the API server refuses a bound token once
//!   its pod is gone, so deleting the pod revokes it. An unbound token
//!   (`kubectl create token`) would outlive the run and is refused.
//!
//! Answers are cached ([`crate::auth_cache`]) by the SHA-256 of the token and
//! the audience, never by the token's text: a granted token for
//! [`REVIEW_TTL`] (never past its own expiry), a refusal for
//! [`REFUSAL_TTL`]. A failure to ask is never cached and never a pass: it is
//! a 503 the pod-side client retries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use crate::artifacts::{pod_token_audience, RUN_SERVICE_ACCOUNT};
use crate::auth_cache::{Cache, Fetched, Source};

/// How long a granted token is trusted before it is reviewed again: also
/// how long a deleted pod's token keeps working here.
pub const REVIEW_TTL: Duration = Duration::from_secs(30);
/// How long a refused token stays refused without asking again.
pub const REFUSAL_TTL: Duration = Duration::from_secs(5);
/// How long one TokenReview may take before the request is answered 503.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Answers kept (and refusals kept, each bounded on its own).
pub const MAX_CACHE_ENTRIES: usize = 10_000;
/// The longest API server text (a refusal's reason) passed on to a pod.
pub const MAX_REASON_CHARS: usize = 256;

/// The extra the API server sets on a pod-bound ServiceAccount token's user.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// See [`EXTRA_POD_NAME`].
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// Why a pod token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodTokenError {
    #[error("the API server did not accept the ServiceAccount token ({0}); the pod's projected token may have expired or its pod be gone")]
    NotAuthenticated(String),
    #[error(
        "the ServiceAccount token is not meant for job {audience:?} (the API server matched the audiences {matched:?}); \
         a run pod's token must be projected with that job's audience"
    )]
    WrongAudience { audience: String, matched: Vec<String> },
    #[error("the ServiceAccount token is {actual:?}'s; only {expected:?} may act for this job")]
    WrongAccount { expected: String, actual: String },
    #[error(
        "the ServiceAccount token is not bound to a pod; only a run pod's projected token is accepted, not one from `kubectl create token`"
    )]
    Unbound,
    #[error("cannot verify the ServiceAccount token: {0}; retry shortly")]
    Unavailable(String),
}

/// How often the API server was asked (concurrent requests sharing one
/// review count it once) and how often the cache answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodTokenStats {
    pub reviews: u64,
    pub cache_hits: u64,
}

/// Verifies run pods' tokens against the API server. Cheap to clone: every
/// clone shares the client, the cache and the counters.
#[derive(Clone)]
pub struct PodTokens {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    /// SHA-256 of audience and token → accepted, or why not.
    cache: Cache<[u8; 32], Result<(), PodTokenError>>,
    reviews: AtomicU64,
    hits: AtomicU64,
}

impl std::fmt::Debug for PodTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodTokens").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl PodTokens {
    /// A verifier asking the API server `client` talks to; the client's own
    /// identity needs `create` on `tokenreviews.authentication.k8s.io`.
    pub fn new(client: kube::Client) -> Self {
        PodTokens {
            inner: Arc::new(Inner { client, cache: Cache::new(MAX_CACHE_ENTRIES), reviews: AtomicU64::new(0), hits: AtomicU64::new(0) }),
        }
    }

    pub fn stats(&self) -> PodTokenStats {
        PodTokenStats { reviews: self.inner.reviews.load(Ordering::Relaxed), cache_hits: self.inner.hits.load(Ordering::Relaxed) }
    }

    /// Whether `token` is a pod token of job `ns/uid` (names already checked).
    pub async fn verify(&self, ns: &str, uid: &str, token: &str) -> Result<(), PodTokenError> {
        let audience = pod_token_audience(ns, uid);
        let key = cache_key(&audience, token);
        let (verdict, source) = self.inner.cache.get_or_fetch(&key, || self.review(ns, uid, &audience, token)).await;
        if source == Source::Cache {
            self.inner.hits.fetch_add(1, Ordering::Relaxed);
        }
        match &verdict {
            Ok(()) => tracing::debug!(namespace = ns, job = uid, cached = source == Source::Cache, "pod token accepted"),
            Err(err) => tracing::debug!(namespace = ns, job = uid, cached = source == Source::Cache, error = %err, "pod token refused"),
        }
        verdict
    }

    async fn review(&self, ns: &str, uid: &str, audience: &str, token: &str) -> Fetched<Result<(), PodTokenError>> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), audiences: Some(vec![audience.to_string()]) },
            ..TokenReview::default()
        };
        self.inner.reviews.fetch_add(1, Ordering::Relaxed);
        let api: Api<TokenReview> = Api::all(self.inner.client.clone());
        let unavailable = |detail: String| Fetched { value: Err(PodTokenError::Unavailable(detail)), ttl: None, refusal: true };
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review)).await {
            Err(_) => unavailable(format!("a TokenReview took longer than {} s", REVIEW_TIMEOUT.as_secs())),
            Ok(Err(err)) => unavailable(api_failure(&err)),
            Ok(Ok(answer)) => match verdict(&answer.status.unwrap_or_default(), ns, uid, token) {
                Ok(()) => Fetched { value: Ok(()), ttl: Some(granted_ttl(token, unix_now())), refusal: false },
                Err(err) => Fetched { value: Err(err), ttl: Some(REFUSAL_TTL), refusal: true },
            },
        }
    }
}

/// Whether a TokenReview's answer makes `token` a pod token of job `ns/uid`.
pub fn verdict(status: &TokenReviewStatus, ns: &str, uid: &str, token: &str) -> Result<(), PodTokenError> {
    if status.authenticated != Some(true) {
        let why = status
            .error
            .as_deref()
            .filter(|e| !e.trim().is_empty())
            .map(|e| truncate(&e.replace(token, "<token>")))
            .unwrap_or_else(|| "expired, revoked, or not issued by this cluster".into());
        return Err(PodTokenError::NotAuthenticated(why));
    }
    // The API server answers the audiences the token matched: ours must be
    // among them, or the token was checked against someone else's.
    let audience = pod_token_audience(ns, uid);
    let matched = status.audiences.clone().unwrap_or_default();
    if !matched.contains(&audience) {
        return Err(PodTokenError::WrongAudience { audience, matched });
    }
    let user = status.user.clone().unwrap_or_default();
    let expected = format!("system:serviceaccount:{ns}:{RUN_SERVICE_ACCOUNT}");
    let actual = user.username.unwrap_or_default();
    if actual != expected {
        return Err(PodTokenError::WrongAccount { expected, actual });
    }
    let extra = user.extra.unwrap_or_default();
    let present = |key: &str| extra.get(key).is_some_and(|values| values.iter().any(|v| !v.is_empty()));
    if !(present(EXTRA_POD_NAME) && present(EXTRA_POD_UID)) {
        return Err(PodTokenError::Unbound);
    }
    Ok(())
}

/// Whether `token` has a JWT's shape (three base64url parts): worth a
/// TokenReview. Anything else is refused without asking.
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = 0;
    for part in token.split('.') {
        parts += 1;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return false;
        }
    }
    parts == 3
}

/// SHA-256 over the audience and the token, NUL-separated (neither holds a NUL).
fn cache_key(audience: &str, token: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(audience.as_bytes());
    hash.update([0]);
    hash.update(token.as_bytes());
    hash.finalize().into()
}

/// How long a granted token is reused: [`REVIEW_TTL`], cut to the token's
/// own `exp` when its payload names one. Reading the payload unverified is
/// safe here: the API server has just verified the signature over it.
fn granted_ttl(token: &str, now_unix: i64) -> Duration {
    let exp = token
        .split('.')
        .nth(1)
        .and_then(|payload| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok())
        .and_then(|json| serde_json::from_slice::<serde_json::Value>(&json).ok())
        .and_then(|claims| claims.get("exp").and_then(serde_json::Value::as_i64));
    match exp {
        Some(exp) => REVIEW_TTL.min(Duration::from_secs(exp.saturating_sub(now_unix).max(0) as u64)),
        None => REVIEW_TTL,
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn api_failure(err: &kube::Error) -> String {
    crate::auth_cache::review_failure("the artifact endpoint", "tokenreviews.authentication.k8s.io", err)
}

fn truncate(text: &str) -> String {
    crate::auth_cache::truncate_chars(text, MAX_REASON_CHARS)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::authentication::v1::UserInfo;

    use super::*;

    const NS: &str = "team";
    const UID: &str = "0b5c3a4e-1111-2222-3333-444455556666";

    fn bound_extra() -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([(EXTRA_POD_NAME.to_string(), vec!["run-abc".to_string()]), (EXTRA_POD_UID.to_string(), vec!["5f0e…".to_string()])])
    }

    /// What the API server answers for a run pod's own token.
    fn granted() -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(vec![pod_token_audience(NS, UID)]),
            user: Some(UserInfo {
                username: Some(format!("system:serviceaccount:{NS}:{RUN_SERVICE_ACCOUNT}")),
                extra: Some(bound_extra()),
                ..UserInfo::default()
            }),
            error: None,
        }
    }

    #[test]
    fn a_run_pods_own_token_is_accepted() {
        assert_eq!(verdict(&granted(), NS, UID, "t"), Ok(()));
    }

    #[test]
    fn an_unauthenticated_token_is_refused_without_echoing_it() {
        let status = TokenReviewStatus {
            authenticated: Some(false),
            error: Some("invalid bearer token secret-text".into()),
            ..TokenReviewStatus::default()
        };
        let err = verdict(&status, NS, UID, "secret-text").unwrap_err();
        assert!(matches!(&err, PodTokenError::NotAuthenticated(why) if why == "invalid bearer token <token>"), "{err}");
        assert!(matches!(verdict(&TokenReviewStatus::default(), NS, UID, "t"), Err(PodTokenError::NotAuthenticated(_))));
    }

    #[test]
    fn another_jobs_audience_or_none_is_refused() {
        let other = TokenReviewStatus { audiences: Some(vec![pod_token_audience(NS, "other-job")]), ..granted() };
        let err = verdict(&other, NS, UID, "t").unwrap_err();
        assert!(matches!(&err, PodTokenError::WrongAudience { audience, .. } if *audience == pod_token_audience(NS, UID)), "{err}");
        let none = TokenReviewStatus { audiences: None, ..granted() };
        assert!(matches!(verdict(&none, NS, UID, "t"), Err(PodTokenError::WrongAudience { .. })));
    }

    #[test]
    fn another_service_account_is_refused() {
        let mut status = granted();
        status.user.as_mut().unwrap().username = Some(format!("system:serviceaccount:{NS}:default"));
        let err = verdict(&status, NS, UID, "t").unwrap_err();
        assert!(matches!(&err, PodTokenError::WrongAccount { actual, .. } if actual.ends_with(":default")), "{err}");
    }

    #[test]
    fn the_run_service_account_of_another_namespace_is_refused() {
        let mut status = granted();
        status.user.as_mut().unwrap().username = Some(format!("system:serviceaccount:elsewhere:{RUN_SERVICE_ACCOUNT}"));
        assert!(matches!(verdict(&status, NS, UID, "t"), Err(PodTokenError::WrongAccount { .. })));
    }

    #[test]
    fn a_token_bound_to_no_pod_is_refused() {
        for missing in [EXTRA_POD_NAME, EXTRA_POD_UID] {
            let mut status = granted();
            let mut extra = bound_extra();
            extra.remove(missing);
            status.user.as_mut().unwrap().extra = Some(extra);
            assert_eq!(verdict(&status, NS, UID, "t"), Err(PodTokenError::Unbound), "without {missing}");
        }
        let mut status = granted();
        status.user.as_mut().unwrap().extra = None;
        assert_eq!(verdict(&status, NS, UID, "t"), Err(PodTokenError::Unbound));
        let mut empty = bound_extra();
        empty.insert(EXTRA_POD_UID.to_string(), vec![String::new()]);
        status.user.as_mut().unwrap().extra = Some(empty);
        assert_eq!(verdict(&status, NS, UID, "t"), Err(PodTokenError::Unbound));
    }

    #[test]
    fn only_jwt_shapes_are_reviewed() {
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjF9.c2ln-_x"));
        for not in ["", "abc", "a.b", "a.b.c.d", "a..c", "a.b.c d", "a.b.c=", "0123abcd"] {
            assert!(!looks_like_jwt(not), "{not:?}");
        }
    }

    #[test]
    fn a_granted_token_is_kept_no_longer_than_it_lives() {
        let jwt = |claims: &str| format!("e30.{}.sig", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims));
        assert_eq!(granted_ttl(&jwt(r#"{"exp":1010}"#), 1000), Duration::from_secs(10));
        assert_eq!(granted_ttl(&jwt(r#"{"exp":5000}"#), 1000), REVIEW_TTL);
        assert_eq!(granted_ttl(&jwt(r#"{"exp":900}"#), 1000), Duration::ZERO);
        assert_eq!(granted_ttl(&jwt(r#"{"sub":"x"}"#), 1000), REVIEW_TTL);
        assert_eq!(granted_ttl("not-a-jwt", 1000), REVIEW_TTL);
    }

    #[test]
    fn the_cache_key_separates_audiences() {
        assert_ne!(cache_key(&pod_token_audience(NS, "a"), "t"), cache_key(&pod_token_audience(NS, "b"), "t"));
        assert_ne!(cache_key("ab", "c"), cache_key("a", "bc"));
    }
}
