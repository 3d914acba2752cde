//! Who is calling: a job's own token or the operator credential, checked per route.

use super::super::{check_namespace, check_uid, OPERATOR_SUBJECT};
use super::pod_tokens::{looks_like_jwt, PodTokenError};
use crate::core::paths::RelPath;
use crate::core::token::verify_job_token;
use axum::http::{header, HeaderMap};

use super::super::ErrorCode;
use super::*;

// -- authentication -----------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    /// The route's own job.
    Job,
    Operator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Package and inputs, read.
    ReadStaged,
    /// Package and inputs, write.
    Stage,
    WriteOutputs,
    ReadOutputs,
    Delete,
    /// A warm pod's claim, write (the operator hands a run to the pod).
    Claim,
    /// A warm pod's claim, read (the pod itself waits for it).
    ReadClaim,
    /// A warm pod's public key, write (the pod itself publishes it).
    PublishKey,
    /// A warm pod's public key, read (the operator seals a run's variables to it).
    ReadKey,
}

/// Route names, then credential, then role.
pub(super) async fn admit(state: &AppState, headers: &HeaderMap, ns: &str, uid: &str, access: Access) -> Result<(), ApiError> {
    check_namespace(ns).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    check_uid(uid).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    let caller = authenticate(state, headers, ns, uid).await?;
    let ok = match (caller, access) {
        (Caller::Job, Access::ReadStaged | Access::WriteOutputs | Access::ReadClaim | Access::PublishKey) => true,
        (Caller::Job, _) => false,
        (Caller::Operator, Access::WriteOutputs | Access::ReadClaim | Access::PublishKey) => false,
        (Caller::Operator, _) => true,
    };
    match (ok, caller, access) {
        (true, _, _) => Ok(()),
        (false, Caller::Job, Access::Claim) => Err(ApiError::new(ErrorCode::Forbidden, "only the operator claims a warm pod for a run")),
        (false, Caller::Job, Access::ReadKey) => {
            Err(ApiError::new(ErrorCode::Forbidden, "a warm pod's key is read by the operator, which seals a run's variables to it"))
        }
        (false, Caller::Job, _) => Err(ApiError::new(
            ErrorCode::Forbidden,
            "a job token may read its package, inputs and claim and write its outputs, nothing else",
        )),
        (false, _, Access::ReadClaim) => Err(ApiError::new(ErrorCode::Forbidden, "a warm pod's claim is read by the pod itself")),
        (false, _, Access::PublishKey) => Err(ApiError::new(ErrorCode::Forbidden, "a warm pod's key is published by the pod itself")),
        (false, _, _) => Err(ApiError::new(ErrorCode::Forbidden, "only the job itself writes its outputs")),
    }
}

/// Who the credential is, for the route of job `ns/uid` (both empty on
/// routes of no job: only the operator credential can pass there). A job
/// credential is its HMAC job token or, with `--pod-tokens`, its pod's
/// projected ServiceAccount token (asked of the API server).
pub(super) async fn authenticate(state: &AppState, headers: &HeaderMap, ns: &str, uid: &str) -> Result<Caller, ApiError> {
    let key = &state.0.key;
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("missing Authorization: Bearer credential"))?
        .to_str()
        .map_err(|_| unauthorized("malformed Authorization header"))?;
    let (scheme, cred) = value.split_once(' ').ok_or_else(|| unauthorized("malformed Authorization header"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthorized("use Authorization: Bearer"));
    }
    let cred = cred.trim();
    if let Some(rest) = cred.strip_prefix("job:") {
        let mut parts = rest.splitn(3, ':');
        let (Some(tns), Some(tuid), Some(token)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(unauthorized("malformed job credential; expected job:<namespace>:<uid>:<token>"));
        };
        if check_namespace(tns).is_err() || check_uid(tuid).is_err() {
            return Err(unauthorized("invalid job token"));
        }
        if !verify_job_token(key, tns, tuid, token) {
            if !looks_like_jwt(token) {
                return Err(unauthorized("invalid job token"));
            }
            // Reviewed for the job it names: a token of another job is then
            // genuine, and refused below as such (403), not as a forgery.
            verify_pod_token(state, tns, tuid, token).await?;
        }
        if tns != ns || tuid != uid {
            return Err(ApiError::new(ErrorCode::Forbidden, "this token belongs to another job"));
        }
        Ok(Caller::Job)
    } else if let Some(token) = cred.strip_prefix("operator:") {
        if verify_job_token(key, "", OPERATOR_SUBJECT, token) {
            Ok(Caller::Operator)
        } else {
            Err(unauthorized("invalid operator token"))
        }
    } else if verify_job_token(key, ns, uid, cred) {
        Ok(Caller::Job)
    } else if verify_job_token(key, "", OPERATOR_SUBJECT, cred) {
        Ok(Caller::Operator)
    } else if looks_like_jwt(cred) && check_namespace(ns).is_ok() && check_uid(uid).is_ok() {
        verify_pod_token(state, ns, uid, cred).await?;
        Ok(Caller::Job)
    } else {
        Err(unauthorized("invalid token"))
    }
}

/// A pod token of job `ns/uid`, or the answer saying why not.
async fn verify_pod_token(state: &AppState, ns: &str, uid: &str, token: &str) -> Result<(), ApiError> {
    let Some(pod_tokens) = &state.0.pod_tokens else {
        return Err(unauthorized("this endpoint does not accept ServiceAccount tokens; start it with --pod-tokens"));
    };
    pod_tokens.verify(ns, uid, token).await.map_err(|err| match err {
        PodTokenError::Unavailable(_) => ApiError::new(ErrorCode::Unavailable, err.to_string()),
        refused => unauthorized(&refused.to_string()),
    })
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(ErrorCode::Unauthorized, message.to_string())
}

pub(super) fn rel_path(raw: &str) -> Result<RelPath, ApiError> {
    RelPath::parse(raw).map_err(|e| ApiError::bad(ErrorCode::BadPath, format!("path {raw:?}: {e}")))
}
