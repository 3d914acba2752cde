//! Who is calling: a job's own token or the operator credential, checked per route.

use super::super::{check_namespace, check_uid, OPERATOR_SUBJECT};
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
}

/// Route names, then credential, then role.
pub(super) fn admit(state: &AppState, headers: &HeaderMap, ns: &str, uid: &str, access: Access) -> Result<(), ApiError> {
    check_namespace(ns).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    check_uid(uid).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    let caller = authenticate(&state.0.key, headers, ns, uid)?;
    let ok = match (caller, access) {
        (Caller::Job, Access::ReadStaged | Access::WriteOutputs) => true,
        (Caller::Job, _) => false,
        (Caller::Operator, Access::WriteOutputs) => false,
        (Caller::Operator, _) => true,
    };
    if ok {
        Ok(())
    } else if caller == Caller::Job {
        Err(ApiError::new(ErrorCode::Forbidden, "a job token may read its package and inputs and write its outputs, nothing else"))
    } else {
        Err(ApiError::new(ErrorCode::Forbidden, "only the job itself writes its outputs"))
    }
}

pub(super) fn authenticate(key: &[u8], headers: &HeaderMap, ns: &str, uid: &str) -> Result<Caller, ApiError> {
    let unauthorized = |m: &str| ApiError::new(ErrorCode::Unauthorized, m.to_string());
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
        if check_namespace(tns).is_err() || check_uid(tuid).is_err() || !verify_job_token(key, tns, tuid, token) {
            return Err(unauthorized("invalid job token"));
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
    } else {
        Err(unauthorized("invalid token"))
    }
}

pub(super) fn rel_path(raw: &str) -> Result<RelPath, ApiError> {
    RelPath::parse(raw).map_err(|e| ApiError::bad(ErrorCode::BadPath, format!("path {raw:?}: {e}")))
}
