//! Who is calling the gateway and what they may do, asked of the Kubernetes
//! API server itself: bearer tokens are verified by a TokenReview, every
//! action is authorized by a SubjectAccessReview in the namespace of the
//! path. The gateway keeps no users, no keys and no policy of its own, so
//! whatever RBAC says about an agent's ServiceAccount (or an OIDC user) is
//! what the gateway does, and `kubectl auth can-i` predicts it.
//!
//! It fails closed: no token is 401, a refused token is 401, a denial is
//! 403 naming the missing verb and resource, and an API server that cannot
//! be asked is 503 (never a pass). The one relaxation is anonymous mode
//! (`--allow-anonymous`, for development clusters only, logged as a
//! warning): a request without a token is then served as `system:anonymous`
//! in the group `system:unauthenticated`, which is still asked about by
//! SubjectAccessReview, so it can do exactly what RBAC grants those names.
//!
//! # The entry gate
//!
//! Every request on a namespace's path (`/mcp/{namespace}`, and the file
//! route `/files/{namespace}/…`) needs, besides a valid token, `get` on
//! skillbindings in that namespace: the least any use of the namespace
//! needs, since every tool works on a bound skill. A caller without it is
//! answered 403 at the HTTP level, so `initialize` does not succeed for a
//! caller who may do nothing there (and a session is never opened for
//! them). The finer permissions (run, read, delete jobs) are checked per
//! tool call by [`NamespaceAuthorizer`]; the entry check's answer is
//! cached, so the second check of `get skillbindings` per `tools/list` is
//! a cache hit.
//!
//! Layout:
//! - this file: [`AuthConfig`] and its flags [`AuthArgs`], the permission
//!   each [`Action`] needs ([`permission`]);
//! - [`limits`]: every bound, defined once;
//! - [`authenticator`]: [`Authenticator`] (TokenReview, SubjectAccessReview,
//!   the [`Authorize`](crate::mcp::state::Authorize) seam per namespace);
//! - [`error`]: [`AuthError`] and its HTTP answers (401/403/503);
//! - [`routes`]: RFC 9728 protected-resource metadata and the
//!   [`require_caller`] middleware;
//! - the bounded, single-flight answer cache both reviews use is
//!   `crate::auth_cache` (shared with the artifact endpoint).

mod authenticator;
mod error;
pub mod limits;
mod routes;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use authenticator::{AuthStats, Authenticator, NamespaceAuthorizer};
pub use error::AuthError;

pub use routes::{
    metadata_routes, metadata_url, protected_resource_handler, protected_resource_metadata, require_caller, resource_url, METADATA_PREFIX,
};

use crate::mcp::state::Action;
use limits::{MAX_CACHE_ENTRIES, MAX_CACHE_TTL_SECS, MAX_LIST_FLAGS};

/// How long a verified token is trusted before it is reviewed again: also
/// how long a revoked token keeps working here.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(60);
/// How long a refused token stays refused without asking again.
pub const DEFAULT_NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// How long an allowed SubjectAccessReview is reused: also how long a
/// removed RoleBinding keeps working here.
pub const DEFAULT_DECISION_TTL: Duration = Duration::from_secs(30);
/// Answers kept per cache (tokens, decisions); one more evicts the oldest.
pub const DEFAULT_MAX_ENTRIES: usize = 10_000;
/// The `Retry-After` a 503 names, in seconds.
pub const RETRY_AFTER_SECS: u64 = 5;

/// The user an unauthenticated request is served as in anonymous mode
/// (the name and group the API server itself uses).
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The group of [`ANONYMOUS_USER`].
pub const ANONYMOUS_GROUP: &str = "system:unauthenticated";

/// The resource whose `get` lets a caller read a namespace's skills.
pub const SKILLBINDINGS: &str = "skillbindings";
/// The resource whose `create`/`get`/`delete` let a caller run, read and
/// delete jobs.
pub const SKILLJOBS: &str = "skilljobs";
/// The (cluster-scoped) resource whose `create` lets a caller search the
/// catalog: who may install a skill may look for one to install.
pub const SKILLPACKAGES: &str = "skillpackages";

/// The Kubernetes verb and resource (in [`crate::api::GROUP`]) an action
/// needs in the namespace it is done in: what the SubjectAccessReview asks
/// and what a 403 tells the caller to get granted.
pub fn permission(action: Action) -> (&'static str, &'static str) {
    match action {
        Action::ReadSkills => ("get", SKILLBINDINGS),
        Action::Run => ("create", SKILLJOBS),
        Action::ReadJobs => ("get", SKILLJOBS),
        Action::DeleteJobs => ("delete", SKILLJOBS),
        Action::SearchCatalog => ("create", SKILLPACKAGES),
    }
}

/// Whether `action` is asked about cluster-wide (a SubjectAccessReview
/// without a namespace) rather than in the path's namespace: the catalog
/// is the cluster's, and what it leads to (a SkillPackage) is
/// cluster-scoped.
pub fn cluster_wide(action: Action) -> bool {
    matches!(action, Action::SearchCatalog)
}

/// How the gateway authenticates and authorizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// TokenReview `spec.audiences`: a token must be meant for one of them.
    /// Empty: the API server's own audience (any token `kubectl create
    /// token` mints without `--audience`).
    pub audiences: Vec<String>,
    /// How long a verified token is cached.
    pub token_ttl: Duration,
    /// How long a refused token (and a denied action) is cached.
    pub negative_ttl: Duration,
    /// How long an allowed action is cached.
    pub decision_ttl: Duration,
    /// Bound of each cache.
    pub max_entries: usize,
    /// Serve requests without a token as `system:anonymous` (group
    /// `system:unauthenticated`), still authorized by SubjectAccessReview.
    /// Development clusters only.
    pub allow_anonymous: bool,
    /// RFC 9728 `authorization_servers`: issuers a client can get a token
    /// from (e.g. the cluster's OIDC issuer).
    pub authorization_servers: Vec<String>,
    /// The base URL clients reach the gateway at (`https://skills.example`);
    /// `None`: `http://` plus the request's `Host`.
    pub public_base: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            audiences: Vec::new(),
            token_ttl: DEFAULT_TOKEN_TTL,
            negative_ttl: DEFAULT_NEGATIVE_TTL,
            decision_ttl: DEFAULT_DECISION_TTL,
            max_entries: DEFAULT_MAX_ENTRIES,
            allow_anonymous: false,
            authorization_servers: Vec::new(),
            public_base: None,
        }
    }
}

/// A combination of flags that is refused as a whole (each flag's own
/// shape is checked by clap when it is parsed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthConfigError {
    #[error("{flag} is given {given} times; at most {MAX_LIST_FLAGS} are accepted")]
    TooMany { flag: &'static str, given: usize },
    #[error("--token-audience {0:?} is given twice; name each audience once")]
    DuplicateAudience(String),
}

/// The gateway's authentication flags (flattened into its command).
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// An audience tokens must be meant for (repeatable; TokenReview spec.audiences).
    /// Without one, tokens for the API server's own audience are accepted.
    #[arg(long = "token-audience", value_name = "AUDIENCE", value_parser = parse_audience)]
    pub token_audiences: Vec<String>,
    /// Seconds a verified token is trusted before it is reviewed again (a revoked token works that long; 0: review every request).
    #[arg(long = "auth-cache-ttl-secs", value_name = "SECS", default_value_t = DEFAULT_TOKEN_TTL.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=MAX_CACHE_TTL_SECS))]
    pub token_ttl_secs: u64,
    /// Seconds a refused token or a denied action stays refused without asking again.
    #[arg(long = "auth-negative-ttl-secs", value_name = "SECS", default_value_t = DEFAULT_NEGATIVE_TTL.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=MAX_CACHE_TTL_SECS))]
    pub negative_ttl_secs: u64,
    /// Seconds an allowed SubjectAccessReview is reused (a removed RoleBinding works that long).
    #[arg(long = "auth-decision-ttl-secs", value_name = "SECS", default_value_t = DEFAULT_DECISION_TTL.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=MAX_CACHE_TTL_SECS))]
    pub decision_ttl_secs: u64,
    /// Answers kept in each auth cache (tokens, decisions); the oldest goes first.
    #[arg(long = "auth-cache-entries", value_name = "N", default_value_t = DEFAULT_MAX_ENTRIES,
          value_parser = parse_entries)]
    pub max_entries: usize,
    /// Serve requests without a token as system:anonymous (group system:unauthenticated),
    /// still authorized by SubjectAccessReview: whatever RBAC grants those names, anyone
    /// who reaches the gateway can do. For development clusters only.
    #[arg(long)]
    pub allow_anonymous: bool,
    /// An OAuth authorization server (issuer URL, https) clients get tokens from,
    /// named in the protected-resource metadata (repeatable).
    #[arg(long = "authorization-server", value_name = "URL", value_parser = parse_issuer)]
    pub authorization_servers: Vec<String>,
    /// The URL clients reach the gateway at (`https://host[:port][/prefix]`),
    /// used in the protected-resource metadata; default: http:// and the request's Host.
    #[arg(long = "public-url", value_name = "URL", value_parser = parse_public_url)]
    pub public_url: Option<String>,
}

impl AuthArgs {
    pub fn into_config(self) -> Result<AuthConfig, AuthConfigError> {
        for (flag, given) in
            [("--token-audience", self.token_audiences.len()), ("--authorization-server", self.authorization_servers.len())]
        {
            if given > MAX_LIST_FLAGS {
                return Err(AuthConfigError::TooMany { flag, given });
            }
        }
        for (i, audience) in self.token_audiences.iter().enumerate() {
            if self.token_audiences[..i].contains(audience) {
                return Err(AuthConfigError::DuplicateAudience(audience.clone()));
            }
        }
        Ok(AuthConfig {
            audiences: self.token_audiences,
            token_ttl: Duration::from_secs(self.token_ttl_secs),
            negative_ttl: Duration::from_secs(self.negative_ttl_secs),
            decision_ttl: Duration::from_secs(self.decision_ttl_secs),
            max_entries: self.max_entries,
            allow_anonymous: self.allow_anonymous,
            authorization_servers: self.authorization_servers,
            public_base: self.public_url,
        })
    }
}

/// An audience is an opaque string to the API server; refuse only what
/// cannot be one (empty, spaces, control characters, absurd length).
fn parse_audience(value: &str) -> Result<String, String> {
    if value.is_empty() || value.len() > 253 || !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("an audience is 1 to 253 printable characters without spaces, e.g. skill-operator-gateway".into());
    }
    Ok(value.to_string())
}

fn parse_entries(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=MAX_CACHE_ENTRIES).contains(&n) => Ok(n),
        _ => Err(format!("expected a number from 1 to {MAX_CACHE_ENTRIES}")),
    }
}

/// An issuer identifier: an `https` URL with a host and no query or
/// fragment (RFC 8414 §2), kept as given.
fn parse_issuer(value: &str) -> Result<String, String> {
    let uri: ::http::Uri = value.parse().map_err(|err| format!("not a URL: {err}"))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none_or(str::is_empty) || uri.query().is_some() || value.contains('#') {
        return Err("an issuer is an https URL with a host and no query or fragment, e.g. https://oidc.example.com".into());
    }
    Ok(value.to_string())
}

/// The gateway's public base: `http(s)://authority[/prefix]`, without a
/// trailing slash (paths are appended to it).
fn parse_public_url(value: &str) -> Result<String, String> {
    let hint = "expected http(s)://host[:port][/prefix] without query or fragment, e.g. https://skills.example.com";
    let uri: ::http::Uri = value.parse().map_err(|err| format!("not a URL ({err}): {hint}"))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let authority_ok = uri.authority().is_some_and(|a| !a.host().is_empty() && !a.as_str().contains('@'));
    if !scheme_ok || !authority_ok || uri.query().is_some() || value.contains('#') {
        return Err(hint.into());
    }
    Ok(value.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod config_tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        auth: AuthArgs,
    }

    fn parse(args: &[&str]) -> Result<AuthConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("gateway").chain(args.iter().copied()))
            .map(|cli| cli.auth.into_config().expect("a valid combination"))
    }

    #[test]
    fn no_flags_are_the_defaults() {
        assert_eq!(parse(&[]).unwrap(), AuthConfig::default());
    }

    #[test]
    fn flags_fill_the_config() {
        let config = parse(&[
            "--token-audience=skills",
            "--token-audience",
            "other",
            "--auth-cache-ttl-secs=10",
            "--auth-negative-ttl-secs=2",
            "--auth-decision-ttl-secs=3",
            "--auth-cache-entries=100",
            "--allow-anonymous",
            "--authorization-server=https://oidc.example.com",
            "--public-url=https://skills.example.com/",
        ])
        .unwrap();
        assert_eq!(
            config,
            AuthConfig {
                audiences: vec!["skills".into(), "other".into()],
                token_ttl: Duration::from_secs(10),
                negative_ttl: Duration::from_secs(2),
                decision_ttl: Duration::from_secs(3),
                max_entries: 100,
                allow_anonymous: true,
                authorization_servers: vec!["https://oidc.example.com".into()],
                public_base: Some("https://skills.example.com".into()),
            }
        );
    }

    #[test]
    fn out_of_range_and_malformed_flags_are_refused() {
        for bad in [
            &["--auth-cache-ttl-secs=601"][..],
            &["--auth-negative-ttl-secs=601"],
            &["--token-audience="],
            &["--token-audience=a b"],
            &["--auth-decision-ttl-secs=-1"],
            &["--auth-cache-entries=0"],
            &["--auth-cache-entries=1000001"],
            &["--authorization-server=http://oidc.example.com"],
            &["--authorization-server=https://oidc.example.com?x=1"],
            &["--authorization-server=oidc.example.com"],
            &["--public-url=skills.example.com"],
            &["--public-url=ftp://skills.example.com"],
            &["--public-url=https://user@skills.example.com"],
            &["--public-url=https://skills.example.com/#x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        // The edges themselves are accepted.
        assert_eq!(parse(&["--auth-cache-ttl-secs=600"]).unwrap().token_ttl, Duration::from_secs(MAX_CACHE_TTL_SECS));
        assert_eq!(parse(&["--auth-cache-ttl-secs=0"]).unwrap().token_ttl, Duration::ZERO);
        assert_eq!(parse(&["--auth-cache-entries=1"]).unwrap().max_entries, 1);
        assert_eq!(parse(&["--auth-cache-entries=1000000"]).unwrap().max_entries, MAX_CACHE_ENTRIES);
    }

    #[test]
    fn too_many_or_repeated_list_flags_are_refused_by_name() {
        let args = |flag: &str, n: usize| -> Vec<String> { (0..n).map(|i| format!("{flag}=https://issuer{i}.example.com")).collect() };
        let combine = |argv: Vec<String>| {
            Cli::try_parse_from(std::iter::once("gateway".to_string()).chain(argv)).expect("each flag is well-formed").auth.into_config()
        };
        assert!(combine(args("--authorization-server", MAX_LIST_FLAGS)).is_ok());
        assert_eq!(
            combine(args("--authorization-server", MAX_LIST_FLAGS + 1)),
            Err(AuthConfigError::TooMany { flag: "--authorization-server", given: MAX_LIST_FLAGS + 1 })
        );
        let audiences: Vec<String> = (0..=MAX_LIST_FLAGS).map(|i| format!("--token-audience=a{i}")).collect();
        assert_eq!(combine(audiences.clone()), Err(AuthConfigError::TooMany { flag: "--token-audience", given: MAX_LIST_FLAGS + 1 }));
        assert!(combine(audiences[..MAX_LIST_FLAGS].to_vec()).is_ok());
        let twice = combine(vec!["--token-audience=x".into(), "--token-audience=x".into()]).unwrap_err();
        assert_eq!(twice, AuthConfigError::DuplicateAudience("x".into()));
        assert!(twice.to_string().contains("name each audience once"));
    }

    #[test]
    fn every_action_needs_its_own_permission_on_the_crd_plurals() {
        use kube::Resource;
        assert_eq!(SKILLBINDINGS, crate::api::SkillBinding::plural(&()));
        assert_eq!(SKILLJOBS, crate::api::SkillJob::plural(&()));
        assert_eq!(permission(Action::ReadSkills), ("get", "skillbindings"));
        assert_eq!(permission(Action::Run), ("create", "skilljobs"));
        assert_eq!(permission(Action::ReadJobs), ("get", "skilljobs"));
        assert_eq!(permission(Action::DeleteJobs), ("delete", "skilljobs"));
        assert_eq!(SKILLPACKAGES, crate::api::SkillPackage::plural(&()));
        assert_eq!(permission(Action::SearchCatalog), ("create", "skillpackages"));
        assert!(cluster_wide(Action::SearchCatalog));
        for namespaced in [Action::ReadSkills, Action::Run, Action::ReadJobs, Action::DeleteJobs] {
            assert!(!cluster_wide(namespaced), "{namespaced:?}");
        }
    }
}
