//! Who may read a component's `/metrics`: a layer of its own behind the
//! NetworkPolicies.
//!
//! Where the CNI enforces them, the chart's policies keep run pods away from
//! every component but the artifact endpoint and the proxy. Where it does
//! not, or for the artifact endpoint's port, which every run pod must
//! reach, the policies are not enough: a metrics page names namespaces,
//! skills and counts an agent has no business reading. So every
//! component's `/metrics` asks the API server, as the kubelet's and
//! kube-state-metrics' secure endpoints do: a bearer token it verifies by
//! TokenReview, whose user it asks by SubjectAccessReview for `get` on the
//! non-resource URL `/metrics` (the chart's `metrics-reader` ClusterRole,
//! bound to the scrapers `metrics.readers` names). Answers are cached
//! briefly ([`crate::auth_cache`]): a scrape every 15 s costs the API server
//! nothing after the first.
//!
//! `--metrics-auth none` turns it off, for a process whose metrics port only
//! trusted peers reach (a test, a developer's machine).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use crate::auth_cache::{Cache, Fetched};

/// The path a scraper must be allowed to `get`.
pub const METRICS_PATH: &str = "/metrics";
/// How long a verified token and an allowed user are believed.
const ANSWER_TTL: Duration = Duration::from_secs(60);
/// How long a refused token or a denied user is (a fixed RBAC binding is seen within this).
const REFUSAL_TTL: Duration = Duration::from_secs(10);
/// Answers kept (tokens and users): scrapers are few, garbage tokens are bounded.
const CACHED: usize = 1024;
/// A review the API server has not answered in this long is an outage (503).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest bearer token looked at (a projected token is about 1 KiB).
const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// `--metrics-auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetricsAuth {
    /// A bearer token the API server verifies, whose user may `get` /metrics.
    #[default]
    Kubernetes,
    /// Anyone who reaches the port (only where nothing else can).
    None,
}

/// The flag every component with a `/metrics` takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct MetricsAccessArgs {
    /// Who may read /metrics: `kubernetes` (a bearer token the API server
    /// verifies, whose user may `get` the non-resource URL /metrics: the
    /// chart's metrics-reader role) or `none` (anyone who reaches the port).
    #[arg(long = "metrics-auth", value_enum, default_value_t = MetricsAuth::Kubernetes)]
    pub metrics_auth: MetricsAuth,
}

/// Why a scrape is refused; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricsRefusal {
    #[error("/metrics needs `Authorization: Bearer <token>` of a user allowed to get the non-resource URL /metrics (the chart's metrics-reader ClusterRole)")]
    NoToken,
    #[error("the bearer token is not valid for this cluster{0}")]
    BadToken(String),
    #[error("user {0} may not get /metrics: bind it to the chart's metrics-reader ClusterRole (values metrics.readers)")]
    Forbidden(String),
    #[error("the API server cannot check the scraper's token now ({0}); retry")]
    Unavailable(String),
}

impl MetricsRefusal {
    fn into_response(self) -> Response {
        let status = match self {
            MetricsRefusal::NoToken | MetricsRefusal::BadToken(_) => StatusCode::UNAUTHORIZED,
            MetricsRefusal::Forbidden(_) => StatusCode::FORBIDDEN,
            MetricsRefusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let code = match self {
            MetricsRefusal::NoToken | MetricsRefusal::BadToken(_) => "unauthorized",
            MetricsRefusal::Forbidden(_) => "forbidden",
            MetricsRefusal::Unavailable(_) => "unavailable",
        };
        let body = serde_json::json!({ "error": { "code": code, "message": self.to_string() } });
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"metrics\""));
        }
        response
    }
}

/// One component's metrics guard (cheap to clone).
#[derive(Clone)]
pub struct MetricsAccess(Option<Arc<Reviews>>);

impl std::fmt::Debug for MetricsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "MetricsAccess(kubernetes)" } else { "MetricsAccess(open)" })
    }
}

struct Reviews {
    client: kube::Client,
    /// Token hash → who it is.
    tokens: Cache<[u8; 32], Result<Identity, MetricsRefusal>>,
    /// Who → whether they may get /metrics.
    users: Cache<Identity, Result<(), MetricsRefusal>>,
}

/// A verified token's user and groups (a role may be bound to either).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Identity {
    user: String,
    groups: Vec<String>,
}

impl MetricsAccess {
    /// Anyone who reaches the port.
    pub fn open() -> MetricsAccess {
        MetricsAccess(None)
    }

    /// Checked against the API server `client` talks to.
    pub fn kubernetes(client: kube::Client) -> MetricsAccess {
        MetricsAccess(Some(Arc::new(Reviews { client, tokens: Cache::new(CACHED), users: Cache::new(CACHED) })))
    }

    /// What `args` ask for, with `client` (`None`: the process has none; one
    /// is made from the in-cluster config or KUBECONFIG when needed).
    pub async fn from_args(args: MetricsAccessArgs, client: Option<kube::Client>) -> anyhow::Result<MetricsAccess> {
        match args.metrics_auth {
            MetricsAuth::None => Ok(MetricsAccess::open()),
            MetricsAuth::Kubernetes => {
                let client = match client {
                    Some(client) => client,
                    None => kube::Client::try_default().await.map_err(|e| {
                        anyhow::anyhow!(
                            "--metrics-auth kubernetes checks scrapers with the API server, which cannot be reached ({e}); \
                             give the process a kubeconfig, or --metrics-auth none where only trusted peers reach its metrics port"
                        )
                    })?,
                };
                Ok(MetricsAccess::kubernetes(client))
            }
        }
    }

    /// Whether the request's bearer may read the metrics.
    pub async fn check(&self, authorization: Option<&HeaderValue>) -> Result<(), MetricsRefusal> {
        let Some(reviews) = &self.0 else { return Ok(()) };
        let token = authorization
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_BYTES)
            .ok_or(MetricsRefusal::NoToken)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let (who, _) = reviews.tokens.get_or_fetch(&key, || reviews.review_token(token)).await;
        let who = who?;
        reviews.users.get_or_fetch(&who, || reviews.review_access(&who)).await.0
    }
}

impl Reviews {
    async fn review_token(&self, token: &str) -> Fetched<Result<Identity, MetricsRefusal>> {
        let review = TokenReview { spec: TokenReviewSpec { token: token.to_string(), audiences: None }, ..TokenReview::default() };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review)).await {
            Err(_) => unavailable("a TokenReview took too long".into()),
            Ok(Err(e)) => unavailable(format!("TokenReview: {e}")),
            Ok(Ok(answer)) => {
                let status = answer.status.unwrap_or_default();
                let user = status.user.filter(|_| status.authenticated == Some(true));
                match user.and_then(|u| Some(Identity { user: u.username?, groups: u.groups.unwrap_or_default() })) {
                    Some(who) => Fetched { value: Ok(who), ttl: Some(ANSWER_TTL), refusal: false },
                    None => {
                        let why = status.error.filter(|e| !e.is_empty()).map(|e| format!(": {e}")).unwrap_or_default();
                        Fetched { value: Err(MetricsRefusal::BadToken(why)), ttl: Some(REFUSAL_TTL), refusal: true }
                    }
                }
            }
        }
    }

    async fn review_access(&self, who: &Identity) -> Fetched<Result<(), MetricsRefusal>> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.user.clone()),
                groups: Some(who.groups.clone()),
                non_resource_attributes: Some(NonResourceAttributes { path: Some(METRICS_PATH.into()), verb: Some("get".into()) }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review)).await {
            Err(_) => unavailable("a SubjectAccessReview took too long".into()),
            Ok(Err(e)) => unavailable(format!("SubjectAccessReview: {e}")),
            Ok(Ok(answer)) if answer.status.as_ref().is_some_and(|s| s.allowed) => {
                Fetched { value: Ok(()), ttl: Some(ANSWER_TTL), refusal: false }
            }
            Ok(Ok(_)) => Fetched { value: Err(MetricsRefusal::Forbidden(who.user.clone())), ttl: Some(REFUSAL_TTL), refusal: true },
        }
    }
}

/// An outage answer, never cached: the next scrape asks again.
fn unavailable<T>(why: String) -> Fetched<Result<T, MetricsRefusal>> {
    Fetched { value: Err(MetricsRefusal::Unavailable(why)), ttl: None, refusal: true }
}

/// The middleware in front of a `/metrics` route
/// (`axum::middleware::from_fn_with_state(access, metrics_access::guard)`).
pub async fn guard(State(access): State<MetricsAccess>, request: Request, next: Next) -> Response {
    match access.check(request.headers().get(header::AUTHORIZATION)).await {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            tracing::debug!(%refused, "a /metrics request was refused");
            refused.into_response()
        }
    }
}
