//! Axum extractors with the endpoint's JSON error shape, shared by every
//! route module.

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;

use super::ApiError;
use crate::artifacts::ErrorCode;

/// `Path` with the JSON error shape (a path that does not decode is 400 `bad_path`).
pub(super) struct JobPath<T>(pub(super) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for JobPath<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(JobPath(v)),
            Err(e) => Err(ApiError::bad(ErrorCode::BadPath, e.body_text())),
        }
    }
}

/// `Query` with the JSON error shape (`?set=`, `?digest=`; a query that
/// does not decode is 400 `bad_query`).
pub(super) struct QueryOf<T>(pub(super) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for QueryOf<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(q)) => Ok(QueryOf(q)),
            Err(e) => Err(ApiError::bad(ErrorCode::BadQuery, e.body_text())),
        }
    }
}
