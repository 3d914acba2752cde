//! [`Authenticator`]: bearer tokens by TokenReview, actions by
//! SubjectAccessReview, both answers cached briefly.
//!
//! Caching is what makes asking the API server on every request
//! affordable; its TTLs are also how long a revocation takes to bite, so
//! they are short (60 s for a token, 30 s for an allowed action) and capped
//! ([`MAX_CACHE_TTL_SECS`](super::MAX_CACHE_TTL_SECS)). Refusals are kept
//! only a few seconds, so a caller who was just granted access retries
//! soon. A failure to ask is never cached and never a pass.
//!
//! Tokens are cached by their SHA-256, never by their text: a heap dump or
//! a debug print of the cache holds no credential.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::HeaderValue;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use super::limits::{MAX_REASON_CHARS, MAX_TOKEN_BYTES, REVIEW_TIMEOUT};
use super::{cluster_wide, permission, AuthConfig, AuthError, ANONYMOUS_GROUP, ANONYMOUS_USER};
use crate::auth_cache::{Cache, Fetched, Source};
use crate::mcp::error::ToolError;
use crate::mcp::executor::Caller;
use crate::mcp::state::{Action, Authorize};

/// Verifies tokens and authorizes actions against the API server. Cheap to
/// clone: every clone shares the client and the caches.
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    config: AuthConfig,
    /// SHA-256 of a token → who it is, or why it was refused.
    tokens: Cache<[u8; 32], Result<Caller, AuthError>>,
    decisions: Cache<DecisionKey, Result<(), AuthError>>,
    counters: Counters,
    /// Where refused requests are recorded ([`Authenticator::set_audit`]; off until set).
    audit: std::sync::OnceLock<crate::audit::Audit>,
}

/// Everything a SubjectAccessReview's answer depends on: two callers that
/// differ in any attribute, or one caller asking about another namespace,
/// verb or resource, never share an answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DecisionKey {
    caller: Caller,
    namespace: String,
    verb: String,
    resource: String,
}

#[derive(Default)]
struct Counters {
    token_reviews: AtomicU64,
    token_hits: AtomicU64,
    access_reviews: AtomicU64,
    access_hits: AtomicU64,
}

/// How often the API server was asked (reviews sent; concurrent requests
/// sharing one review count it once) and how often the caches answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuthStats {
    pub token_reviews: u64,
    pub token_cache_hits: u64,
    pub access_reviews: u64,
    pub access_cache_hits: u64,
}

impl Authenticator {
    /// An authenticator asking the API server `client` talks to. The client's
    /// own identity needs `create` on `tokenreviews.authentication.k8s.io`
    /// and `subjectaccessreviews.authorization.k8s.io`.
    pub fn new(client: kube::Client, config: AuthConfig) -> Self {
        if config.allow_anonymous {
            tracing::warn!(
                "anonymous mode: requests without a token are served as {ANONYMOUS_USER} (group {ANONYMOUS_GROUP}); \
                 whatever RBAC grants those names, anyone who reaches the gateway can do; for development clusters only"
            );
        }
        let max = config.max_entries;
        Authenticator {
            inner: Arc::new(Inner {
                client,
                config,
                tokens: Cache::new(max),
                decisions: Cache::new(max),
                counters: Counters::default(),
                audit: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Records every request this authenticator refuses (`auth.refused`) to `audit`; the first call wins.
    pub fn set_audit(&self, audit: crate::audit::Audit) {
        let _ = self.inner.audit.set(audit);
    }

    /// The `auth.refused` record of a request refused at the entry gate.
    pub(super) fn audit_refusal(&self, err: &AuthError, namespace: &str, caller: Option<&Caller>) {
        let Some(audit) = self.inner.audit.get().filter(|a| a.enabled()) else { return };
        let outcome = if matches!(err, AuthError::Unavailable(_)) { crate::audit::Outcome::Failed } else { crate::audit::Outcome::Refused };
        let mut record = crate::audit::Record::new(crate::audit::Event::AuthRefused, outcome)
            .namespace(namespace)
            .code(err.code())
            .reason(err.public_message());
        if let Some(caller) = caller {
            record = record.caller(caller);
        }
        audit.record(record);
    }

    pub fn config(&self) -> &AuthConfig {
        &self.inner.config
    }

    /// Who the request's `Authorization` header says is calling. Only
    /// `Bearer <token>` is accepted, and the token is whatever the API server
    /// says it is; in anonymous mode a request without the header is
    /// [`ANONYMOUS_USER`] (one with a token is still verified).
    pub async fn authenticate(&self, authorization: Option<&HeaderValue>) -> Result<Caller, AuthError> {
        let token = match bearer_token(authorization) {
            Err(AuthError::MissingToken) if self.inner.config.allow_anonymous => return Ok(anonymous()),
            other => other?,
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let (verdict, source) = self.inner.tokens.get_or_fetch(&key, || self.review_token(token)).await;
        if source == Source::Cache {
            self.inner.counters.token_hits.fetch_add(1, Ordering::Relaxed);
        }
        match &verdict {
            Ok(caller) => tracing::debug!(user = %caller.principal, cached = source == Source::Cache, "token verified"),
            Err(err) => tracing::debug!(cached = source == Source::Cache, error = %err, "token refused"),
        }
        verdict
    }

    /// Whether `caller` may do `action` in `namespace` (the permission
    /// [`permission`] names), by SubjectAccessReview; a [`cluster_wide`]
    /// action is asked without a namespace.
    pub async fn authorize_action(&self, caller: &Caller, namespace: &str, action: Action) -> Result<(), AuthError> {
        let (verb, resource) = permission(action);
        let namespace = if cluster_wide(action) { "" } else { namespace };
        self.authorize(caller, namespace, verb, resource).await
    }

    /// Whether `caller` may `verb` the `resource` (of the skill-operator.dev
    /// group) in `namespace` (`""`: cluster-wide), by SubjectAccessReview.
    /// The anonymous caller is asked about like any other.
    pub async fn authorize(&self, caller: &Caller, namespace: &str, verb: &str, resource: &str) -> Result<(), AuthError> {
        let key = DecisionKey { caller: caller.clone(), namespace: namespace.into(), verb: verb.into(), resource: resource.into() };
        let (decision, source) = self.inner.decisions.get_or_fetch(&key, || self.review_access(&key)).await;
        if source == Source::Cache {
            self.inner.counters.access_hits.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(user = %caller.principal, namespace, verb, resource, allowed = decision.is_ok(), cached = source == Source::Cache, "access decided");
        decision
    }

    /// The [`Authorize`] seam for one namespace's MCP server: each action
    /// is the SubjectAccessReview [`permission`] names, in `namespace`.
    pub fn namespace_authorizer(&self, namespace: impl Into<String>) -> Arc<dyn Authorize> {
        Arc::new(NamespaceAuthorizer { authenticator: self.clone(), namespace: namespace.into() })
    }

    /// Requests waiting on the TokenReview in progress for `token`.
    #[cfg(test)]
    pub(super) fn token_waiters(&self, token: &str) -> usize {
        self.inner.tokens.waiters(&Sha256::digest(token.as_bytes()).into())
    }

    pub fn stats(&self) -> AuthStats {
        let c = &self.inner.counters;
        AuthStats {
            token_reviews: c.token_reviews.load(Ordering::Relaxed),
            token_cache_hits: c.token_hits.load(Ordering::Relaxed),
            access_reviews: c.access_reviews.load(Ordering::Relaxed),
            access_cache_hits: c.access_hits.load(Ordering::Relaxed),
        }
    }

    async fn review_token(&self, token: &str) -> Fetched<Result<Caller, AuthError>> {
        let config = &self.inner.config;
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), audiences: (!config.audiences.is_empty()).then(|| config.audiences.clone()) },
            ..TokenReview::default()
        };
        self.inner.counters.token_reviews.fetch_add(1, Ordering::Relaxed);
        let api: Api<TokenReview> = Api::all(self.inner.client.clone());
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review)).await {
            Err(_) => unavailable(format!("a TokenReview took longer than {} s", REVIEW_TIMEOUT.as_secs())),
            Ok(Err(err)) => unavailable(api_failure("tokenreviews.authentication.k8s.io", &err)),
            Ok(Ok(answer)) => match token_verdict(config, answer.status.unwrap_or_default(), token) {
                Ok(caller) => Fetched { value: Ok(caller), ttl: Some(config.token_ttl), refusal: false },
                Err(err) => Fetched { value: Err(err), ttl: Some(config.negative_ttl), refusal: true },
            },
        }
    }

    async fn review_access(&self, key: &DecisionKey) -> Fetched<Result<(), AuthError>> {
        let config = &self.inner.config;
        let caller = &key.caller;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(caller.principal.clone()),
                uid: caller.uid.clone(),
                groups: Some(caller.groups.clone()),
                extra: Some(caller.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(crate::api::GROUP.to_string()),
                    // Empty: cluster-wide, as the API server reads it.
                    namespace: Some(key.namespace.clone()).filter(|n| !n.is_empty()),
                    verb: Some(key.verb.clone()),
                    resource: Some(key.resource.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        self.inner.counters.access_reviews.fetch_add(1, Ordering::Relaxed);
        let api: Api<SubjectAccessReview> = Api::all(self.inner.client.clone());
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review)).await {
            Err(_) => unavailable(format!("a SubjectAccessReview took longer than {} s", REVIEW_TIMEOUT.as_secs())),
            Ok(Err(err)) => unavailable(api_failure("subjectaccessreviews.authorization.k8s.io", &err)),
            Ok(Ok(answer)) => {
                let status = answer.status.unwrap_or_default();
                if status.allowed {
                    return Fetched { value: Ok(()), ttl: Some(config.decision_ttl), refusal: false };
                }
                // An evaluation error (an authorizer that could not decide)
                // is a denial too: it says why.
                let reason =
                    [status.reason, status.evaluation_error].into_iter().flatten().filter(|s| !s.is_empty()).collect::<Vec<_>>().join("; ");
                let denied = AuthError::Forbidden {
                    user: caller.principal.clone(),
                    verb: key.verb.clone(),
                    resource: key.resource.clone(),
                    namespace: key.namespace.clone(),
                    reason: truncate(&reason),
                };
                Fetched { value: Err(denied), ttl: Some(config.negative_ttl), refusal: true }
            }
        }
    }
}

/// The [`Authorize`] seam of one namespace (see
/// [`Authenticator::namespace_authorizer`]).
pub struct NamespaceAuthorizer {
    authenticator: Authenticator,
    namespace: String,
}

#[async_trait::async_trait]
impl Authorize for NamespaceAuthorizer {
    async fn authorize(&self, caller: &Caller, action: Action) -> Result<(), ToolError> {
        self.authenticator.authorize_action(caller, &self.namespace, action).await.map_err(|err| {
            if let AuthError::Unavailable(detail) = &err {
                tracing::warn!(user = %caller.principal, namespace = %self.namespace, %detail, "cannot authorize a tool call");
            }
            ToolError::from(err)
        })
    }
}

impl From<AuthError> for ToolError {
    fn from(err: AuthError) -> Self {
        ToolError::new(err.code(), err.public_message())
    }
}

/// The caller every tokenless request is in anonymous mode.
pub(crate) fn anonymous() -> Caller {
    Caller { groups: vec![ANONYMOUS_GROUP.to_string()], ..Caller::named(ANONYMOUS_USER) }
}

/// The token of an `Authorization: Bearer <token>` header (RFC 6750 §2.1;
/// the scheme is case-insensitive).
fn bearer_token(header: Option<&HeaderValue>) -> Result<&str, AuthError> {
    let header = header.ok_or(AuthError::MissingToken)?;
    if header.len() > MAX_TOKEN_BYTES + "Bearer ".len() {
        return Err(AuthError::MalformedHeader(format!("the header is {} bytes; a token may be at most {MAX_TOKEN_BYTES}", header.len())));
    }
    let value =
        header.to_str().map_err(|_| AuthError::MalformedHeader("the header holds bytes that are not printable ASCII".into()))?.trim();
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        // A client that forgot the scheme sends the bare token here: name
        // the scheme only when it looks like one, never echo a credential.
        let looks_like_scheme = !scheme.is_empty() && scheme.len() <= 16 && scheme.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-');
        return Err(AuthError::UnsupportedScheme(if looks_like_scheme { scheme.to_string() } else { "unknown".into() }));
    }
    let token = token.trim_start();
    if token.is_empty() {
        return Err(AuthError::MalformedHeader("the token after `Bearer` is empty".into()));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AuthError::MalformedHeader(format!("the token is {} bytes; at most {MAX_TOKEN_BYTES} are accepted", token.len())));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AuthError::MalformedHeader("the token contains spaces or control characters".into()));
    }
    Ok(token)
}

/// Who a TokenReview says the token is, or why it is refused.
fn token_verdict(config: &AuthConfig, status: TokenReviewStatus, token: &str) -> Result<Caller, AuthError> {
    let mint = match config.audiences.first() {
        Some(audience) => format!("`kubectl create token <serviceaccount> -n <namespace> --audience={audience}`"),
        None => "`kubectl create token <serviceaccount> -n <namespace>`".to_string(),
    };
    if status.authenticated != Some(true) {
        let why = status
            .error
            .filter(|e| !e.trim().is_empty())
            .map(|e| truncate(&e.replace(token, "<token>")))
            .unwrap_or_else(|| "the token is not valid (expired, revoked, or not issued by this cluster)".into());
        return Err(AuthError::InvalidToken(format!("{why}; get a fresh token, e.g. {mint}")));
    }
    // An audience-aware API server answers the audiences the token matched;
    // none (or none of ours) means it was not checked against them, or the
    // token is for someone else: refuse rather than trust a token minted for
    // another service.
    if !config.audiences.is_empty() {
        let matched = status.audiences.unwrap_or_default();
        if !matched.iter().any(|a| config.audiences.contains(a)) {
            return Err(AuthError::InvalidToken(format!(
                "the token is not meant for this gateway (it needs one of the audiences {:?}, the API server matched {matched:?}); get one with {mint}",
                config.audiences
            )));
        }
    }
    let user = status.user.unwrap_or_default();
    let principal = user.username.filter(|u| !u.is_empty()).ok_or_else(|| {
        AuthError::InvalidToken("the API server accepted the token but named no user; use a ServiceAccount or user token".into())
    })?;
    Ok(Caller {
        principal,
        uid: user.uid.filter(|u| !u.is_empty()),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })
}

fn unavailable<V>(detail: String) -> Fetched<Result<V, AuthError>> {
    Fetched { value: Err(AuthError::Unavailable(detail)), ttl: None, refusal: true }
}

fn api_failure(resource: &str, err: &kube::Error) -> String {
    crate::auth_cache::review_failure("the gateway", resource, err)
}

fn truncate(text: &str) -> String {
    crate::auth_cache::truncate_chars(text, MAX_REASON_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        assert_eq!(bearer_token(Some(&header("Bearer abc.def"))), Ok("abc.def"));
        assert_eq!(bearer_token(Some(&header("bearer abc"))), Ok("abc"));
        assert_eq!(bearer_token(Some(&header("BEARER   abc  "))), Ok("abc"));
        assert_eq!(bearer_token(None), Err(AuthError::MissingToken));
        assert_eq!(bearer_token(Some(&header("Basic dXNlcjpwdw=="))), Err(AuthError::UnsupportedScheme("Basic".into())));
        // A bare token is not echoed back as a scheme.
        assert_eq!(bearer_token(Some(&header("eyJhbGciOiJSUzI1NiJ9.e30.sig"))), Err(AuthError::UnsupportedScheme("unknown".into())));
        for bad in ["Bearer", "Bearer ", "Bearer a b", "Bearer a\tb"] {
            assert!(matches!(bearer_token(Some(&header(bad))), Err(AuthError::MalformedHeader(_))), "{bad:?}");
        }
        let non_ascii = HeaderValue::from_bytes("Bearer tökén".as_bytes()).unwrap();
        assert!(matches!(bearer_token(Some(&non_ascii)), Err(AuthError::MalformedHeader(_))));
        let at_cap = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES));
        assert_eq!(bearer_token(Some(&header(&at_cap))).map(str::len), Ok(MAX_TOKEN_BYTES));
        let over = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert!(matches!(bearer_token(Some(&header(&over))), Err(AuthError::MalformedHeader(m)) if m.contains("16384")));
    }

    #[test]
    fn a_refusal_never_echoes_the_token() {
        let status = TokenReviewStatus {
            authenticated: Some(false),
            error: Some("invalid bearer token secret-token-text".into()),
            ..TokenReviewStatus::default()
        };
        let err = token_verdict(&AuthConfig::default(), status, "secret-token-text").unwrap_err();
        assert!(!err.to_string().contains("secret-token-text"), "{err}");
        assert!(err.to_string().contains("invalid bearer token <token>"), "{err}");
    }

    #[test]
    fn reasons_are_capped() {
        assert_eq!(truncate(&"é".repeat(MAX_REASON_CHARS + 5)).chars().count(), MAX_REASON_CHARS + 1);
        assert_eq!(truncate("short"), "short");
    }
}
