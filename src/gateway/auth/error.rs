//! [`AuthError`]: why a request was not let in, and the HTTP answer for it.
//!
//! The answers follow RFC 6750 §3 and the MCP authorization spec: a request
//! without credentials (or with another scheme) gets 401 and a
//! `WWW-Authenticate: Bearer resource_metadata="…"` challenge naming the
//! RFC 9728 metadata, so a client knows where to get a token; a refused
//! token adds `error="invalid_token"`; a malformed one is 400
//! `invalid_request`. A denial is 403 with a JSON body saying which verb on
//! which resource in which namespace to grant. When the API server cannot
//! be asked, 503 with `Retry-After`: failing closed, never a pass.
//!
//! Every body is `{"error":{"code":…,"message":…}}`, the codes being the
//! MCP layer's ([`crate::mcp::error::codes`]), so a client reads the same
//! code whether HTTP or a tool call refused it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::RETRY_AFTER_SECS;
use crate::mcp::error::codes;

/// The code of a 404 for a path that names no valid namespace.
pub(super) const NOT_FOUND: &str = "not-found";

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error(
        "this endpoint needs a Kubernetes bearer token: send `Authorization: Bearer <token>` \
         (e.g. the output of `kubectl create token <serviceaccount> -n <namespace>`)"
    )]
    MissingToken,
    #[error("the Authorization header uses the {0:?} scheme; this endpoint takes only `Authorization: Bearer <token>`")]
    UnsupportedScheme(String),
    #[error("malformed bearer credentials: {0}; send `Authorization: Bearer <token>` with the token as printed by `kubectl create token`")]
    MalformedHeader(String),
    #[error("the Kubernetes API server refused the token: {0}")]
    InvalidToken(String),
    #[error("{}", forbidden_message(.user, .verb, .resource, .namespace, .reason))]
    Forbidden { user: String, verb: String, resource: String, namespace: String, reason: String },
    /// The detail is for the gateway's log, not for the caller.
    #[error("cannot ask the Kubernetes API server: {0}")]
    Unavailable(String),
    #[error("no namespace {0:?} here: the path must name a Kubernetes namespace (lower-case letters, digits and '-', at most 63)")]
    NoSuchNamespace(String),
}

impl AuthError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            AuthError::MissingToken | AuthError::UnsupportedScheme(_) | AuthError::InvalidToken(_) => StatusCode::UNAUTHORIZED,
            AuthError::MalformedHeader(_) => StatusCode::BAD_REQUEST,
            AuthError::Forbidden { .. } => StatusCode::FORBIDDEN,
            AuthError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AuthError::NoSuchNamespace(_) => StatusCode::NOT_FOUND,
        }
    }

    /// The stable code a client reads (the same as a tool call's).
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::MissingToken | AuthError::UnsupportedScheme(_) | AuthError::MalformedHeader(_) | AuthError::InvalidToken(_) => {
                codes::UNAUTHORIZED
            }
            AuthError::Forbidden { .. } => codes::FORBIDDEN,
            AuthError::Unavailable(_) => codes::BACKEND,
            AuthError::NoSuchNamespace(_) => NOT_FOUND,
        }
    }

    /// What the caller is told. The same as [`Display`](std::fmt::Display)
    /// except for [`AuthError::Unavailable`], whose detail (the API
    /// server's error, the gateway's own RBAC) is for the operator's log.
    pub fn public_message(&self) -> String {
        match self {
            AuthError::Unavailable(_) => format!(
                "the gateway cannot check credentials right now (the Kubernetes API server did not answer); retry in {RETRY_AFTER_SECS} s"
            ),
            other => other.to_string(),
        }
    }

    /// The HTTP answer. `metadata_url` is this resource's RFC 9728
    /// metadata document, named in every 401 challenge.
    pub fn into_response(self, metadata_url: &str) -> Response {
        let status = self.status();
        let body = json!({ "error": { "code": self.code(), "message": self.public_message() } });
        let mut response = (status, axum::Json(body)).into_response();
        let challenge = match &self {
            AuthError::MissingToken | AuthError::UnsupportedScheme(_) => Some(challenge(metadata_url, None)),
            AuthError::InvalidToken(_) => Some(challenge(metadata_url, Some("invalid_token"))),
            AuthError::MalformedHeader(_) => Some(challenge(metadata_url, Some("invalid_request"))),
            _ => None,
        };
        let headers = response.headers_mut();
        if let Some(value) = challenge {
            headers.insert(header::WWW_AUTHENTICATE, value);
        }
        if matches!(self, AuthError::Unavailable(_)) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}

/// `Bearer resource_metadata="<url>"[, error="<code>"]`.
fn challenge(metadata_url: &str, error: Option<&str>) -> HeaderValue {
    // The URL is built from validated parts; quoting is still escaped so a
    // surprise can never end the quoted-string early.
    let quoted: String = metadata_url.chars().flat_map(|c| if matches!(c, '"' | '\\') { vec!['\\', c] } else { vec![c] }).collect();
    let mut value = format!("Bearer resource_metadata=\"{quoted}\"");
    if let Some(error) = error {
        value.push_str(&format!(", error=\"{error}\""));
    }
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

fn forbidden_message(user: &str, verb: &str, resource: &str, namespace: &str, reason: &str) -> String {
    let group = crate::api::GROUP;
    // A ServiceAccount is bound by its own flag, anyone else by user name.
    let subject = match user.strip_prefix("system:serviceaccount:") {
        Some(sa) => format!("--serviceaccount={sa}"),
        None => format!("--user={user}"),
    };
    let role = format!("skill-{verb}-{resource}");
    let why = if reason.is_empty() { String::new() } else { format!(" ({reason})") };
    // No namespace: the permission is asked cluster-wide, so only a
    // ClusterRole bound by a ClusterRoleBinding grants it.
    if namespace.is_empty() {
        return format!(
            "{user} may not {verb} {resource}.{group} cluster-wide{why}. To allow it, an administrator can run: \
             kubectl create clusterrole {role} --verb={verb} --resource={resource}.{group} && \
             kubectl create clusterrolebinding {role} --clusterrole={role} {subject}"
        );
    }
    format!(
        "{user} may not {verb} {resource}.{group} in namespace {namespace}{why}. To allow it, an administrator can run: \
         kubectl create role {role} -n {namespace} --verb={verb} --resource={resource}.{group} && \
         kubectl create rolebinding {role} -n {namespace} --role={role} {subject}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_names_the_verb_resource_namespace_and_the_rbac_to_add() {
        let err = AuthError::Forbidden {
            user: "system:serviceaccount:team:agent".into(),
            verb: "create".into(),
            resource: "skilljobs".into(),
            namespace: "team".into(),
            reason: String::new(),
        };
        assert_eq!(
            err.to_string(),
            "system:serviceaccount:team:agent may not create skilljobs.skill-operator.dev in namespace team. To allow it, \
             an administrator can run: kubectl create role skill-create-skilljobs -n team --verb=create \
             --resource=skilljobs.skill-operator.dev && kubectl create rolebinding skill-create-skilljobs -n team \
             --role=skill-create-skilljobs --serviceaccount=team:agent"
        );
        let user = AuthError::Forbidden {
            user: "alice@example.com".into(),
            verb: "get".into(),
            resource: "skillbindings".into(),
            namespace: "a".into(),
            reason: "no RBAC policy matched".into(),
        };
        let message = user.to_string();
        assert!(
            message.starts_with("alice@example.com may not get skillbindings.skill-operator.dev in namespace a (no RBAC policy matched).")
        );
        assert!(message.ends_with("--user=alice@example.com"), "{message}");
    }

    #[test]
    fn a_cluster_wide_denial_names_the_cluster_role_to_add() {
        let err = AuthError::Forbidden {
            user: "system:serviceaccount:team:agent".into(),
            verb: "create".into(),
            resource: "skillpackages".into(),
            namespace: String::new(),
            reason: String::new(),
        };
        assert_eq!(
            err.to_string(),
            "system:serviceaccount:team:agent may not create skillpackages.skill-operator.dev cluster-wide. To allow it, \
             an administrator can run: kubectl create clusterrole skill-create-skillpackages --verb=create \
             --resource=skillpackages.skill-operator.dev && kubectl create clusterrolebinding skill-create-skillpackages \
             --clusterrole=skill-create-skillpackages --serviceaccount=team:agent"
        );
    }

    #[test]
    fn unavailable_keeps_its_detail_out_of_the_answer() {
        let err = AuthError::Unavailable("tokenreviews.authentication.k8s.io is forbidden: User gw cannot create".into());
        assert!(err.to_string().contains("is forbidden"));
        assert!(!err.public_message().contains("forbidden"));
        assert!(err.public_message().contains("retry in 5 s"));
    }

    #[test]
    fn the_challenge_escapes_quotes() {
        assert_eq!(
            challenge("http://h/x\"y", Some("invalid_token")),
            "Bearer resource_metadata=\"http://h/x\\\"y\", error=\"invalid_token\""
        );
    }
}
