//! Namespace packages: a package staged once for every run of a namespace
//! that pins one SkillPackage digest, instead of once per job.
//!
//! ```text
//! PUT    /v1/namespaces/{ns}/packages/{digest}   operator  body: package bytes; idempotent
//! DELETE /v1/namespaces/{ns}/packages/{digest}   operator  {"deleted": true|false}
//! GET    /v1/namespaces/packages                 operator  [NamespacePackage] from the repository's tags
//! GET    /v1/jobs/{ns}/{uid}/package?digest=     job|operator  the package staged for {ns} at digest
//! ```
//!
//! `{digest}` is the SkillPackage's pinned OCI manifest digest, taken on
//! the operator credential's word: the endpoint stores the archive it is
//! given under `<ns>.<hex>` ([`namespace_package_tag`]) and cannot tie the
//! two together. The archive's own sha256 is what the job's GET announces
//! (`X-Content-Digest`) and `fetch` verifies. The job's GET is admitted as
//! every job route is (its token against the route's namespace and UID),
//! and the tag is built from the route's namespace: a job reads its own
//! namespace's copy only. Every manifest carries [`ANNOTATION_PACKAGE`] =
//! `<ns>/<digest>`; a tag pointing at anything else is refused (502
//! `wrong_artifact`), on read and on delete.
//!
//! Order of checks: namespace (400 `bad_job`) and digest (400
//! `bad_digest`) as names, then the credential (401, 403 for any job
//! token), then the registry.

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::auth::{admit, authenticate, Access, Caller};
use super::extract::{JobPath, QueryOf};
use super::handlers::stage_archive;
use super::{bytes_response, oci_error, ApiError, AppState};
use crate::artifacts::{
    check_namespace, namespace_package_tag, parse_namespace_package_tag, sha256_hex, ArtifactKind, ErrorCode, NamespacePackage,
    ANNOTATION_JOB, ANNOTATION_PACKAGE,
};
use crate::core::package;
use crate::oci::OciError;

/// The namespace and digest as names: 400 before anything else.
fn names(ns: &str, digest: &str) -> Result<String, ApiError> {
    check_namespace(ns).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    check_digest(digest)?;
    Ok(namespace_package_tag(ns, digest).expect("namespace and digest checked"))
}

fn check_digest(digest: &str) -> Result<(), ApiError> {
    match sha256_hex(digest) {
        Some(_) => Ok(()),
        None => Err(ApiError::bad(
            ErrorCode::BadDigest,
            format!("package digest {digest:?} is not sha256:<64 lowercase hex> (the SkillPackage's pinned manifest digest)"),
        )),
    }
}

/// The operator credential, or 401/403.
async fn operator_only(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let forbidden = || {
        ApiError::new(
            ErrorCode::Forbidden,
            "namespace packages are staged, listed and deleted by the operator only; \
             a job reads its namespace's package with GET /v1/jobs/{ns}/{uid}/package?digest=",
        )
    };
    // No job is named: every job credential is another job's here.
    match authenticate(state, headers, "", "").await {
        Ok(Caller::Operator) => Ok(()),
        Ok(Caller::Job) => Err(forbidden()),
        Err(e) if e.code == ErrorCode::Forbidden => Err(forbidden()),
        Err(e) => Err(e),
    }
}

impl AppState {
    fn namespace_reference(&self, tag: &str) -> String {
        format!("{}:{tag}", self.0.repo)
    }
}

fn annotation(ns: &str, digest: &str) -> String {
    format!("{ns}/{digest}")
}

pub(super) async fn put_namespace_package(
    State(state): State<AppState>,
    JobPath((ns, digest)): JobPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    let tag = names(&ns, &digest)?;
    operator_only(&state, req.headers()).await?;
    let reference = state.namespace_reference(&tag);
    let annotations = BTreeMap::from([(ANNOTATION_PACKAGE.to_string(), annotation(&ns, &digest))]);
    stage_archive(&state, req, (&ns, &digest), &reference, annotations).await
}

pub(super) async fn delete_namespace_package(
    State(state): State<AppState>,
    JobPath((ns, digest)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tag = names(&ns, &digest)?;
    operator_only(&state, &headers).await?;
    let _lock = state.lock(&ns, &digest).lock().await;
    let reference = state.namespace_reference(&tag);
    state.forget(&reference);
    // Deleting goes by manifest digest (every tag on it goes too): only a
    // manifest that is this namespace's copy.
    let manifest = match state.0.packages.manifest_annotations(&reference).await {
        Ok((manifest, annotations)) => {
            if annotations.get(ANNOTATION_PACKAGE) != Some(&annotation(&ns, &digest)) {
                return Err(ApiError::new(
                    ErrorCode::WrongArtifact,
                    format!("{reference} is not the package staged for namespace {ns} at {digest}; nothing was deleted"),
                ));
            }
            manifest
        }
        Err(OciError::NotFound { .. }) => return Ok(Json(json!({ "deleted": false })).into_response()),
        Err(e) => return Err(oci_error(e)),
    };
    let deleted = state.0.packages.delete(&format!("{}@{manifest}", state.0.repo)).await.map_err(oci_error)?;
    Ok(Json(json!({ "deleted": deleted })).into_response())
}

pub(super) async fn list_namespace_packages(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    operator_only(&state, &headers).await?;
    let tags = state.0.packages.list_tags(&state.0.repo).await.map_err(oci_error)?;
    let mut packages: Vec<NamespacePackage> = tags
        .iter()
        .filter_map(|t| parse_namespace_package_tag(t))
        .map(|(namespace, digest)| NamespacePackage { namespace, digest })
        .collect();
    packages.sort_by(|a, b| (&a.namespace, &a.digest).cmp(&(&b.namespace, &b.digest)));
    Ok(Json(packages).into_response())
}

/// `GET /v1/jobs/{ns}/{uid}/package?digest=`, once `admit` passed the
/// caller for the route's job: the package staged for `ns` at `digest`.
pub(super) async fn get_namespace_package(state: &AppState, ns: &str, digest: &str) -> Result<Response, ApiError> {
    check_digest(digest)?;
    let tag = namespace_package_tag(ns, digest).expect("namespace checked by admit, digest above");
    let reference = state.namespace_reference(&tag);
    let _held = state.hold(state.0.limits.max_package_bytes).await;
    let pulled = match state.0.packages.pull(&reference).await {
        Ok(p) => p,
        Err(OciError::NotFound { .. }) => {
            return Err(ApiError::new(ErrorCode::NotFound, format!("package {digest} is not staged for namespace {ns}")));
        }
        Err(e) => return Err(oci_error(e)),
    };
    if pulled.annotations.get(ANNOTATION_PACKAGE) != Some(&annotation(ns, digest)) {
        return Err(ApiError::new(
            ErrorCode::WrongArtifact,
            format!("{reference} is not the package staged for namespace {ns} at {digest}"),
        ));
    }
    let sha = package::digest(&pulled.package);
    Ok(bytes_response(pulled.package, "application/gzip", &sha, Some(&pulled.digest)))
}

/// `?digest=` of `GET .../package`: the namespace package pinned at that
/// digest instead of the job's own.
#[derive(Debug, Deserialize)]
pub(super) struct PackageQuery {
    pub(super) digest: Option<String>,
}

/// `GET /v1/jobs/{ns}/{uid}/package[?digest=]`: the job's own staged
/// package, or with `?digest=` its namespace's copy.
pub(super) async fn get_package(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    QueryOf(q): QueryOf<PackageQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadStaged).await?;
    if let Some(digest) = &q.digest {
        // The route's namespace, checked against the credential by `admit`:
        // a job reads its own namespace's package, never another's.
        return get_namespace_package(&state, &ns, digest).await;
    }
    let _held = state.hold(state.0.limits.max_package_bytes).await;
    let reference = state.reference(&ns, &uid, ArtifactKind::Package);
    let pulled = state.0.packages.pull(&reference).await.map_err(oci_error)?;
    if pulled.annotations.get(ANNOTATION_JOB) != Some(&format!("{ns}/{uid}")) {
        return Err(ApiError::new(ErrorCode::WrongArtifact, format!("{reference} is not this job's package")));
    }
    let digest = package::digest(&pulled.package);
    Ok(bytes_response(pulled.package, "application/gzip", &digest, Some(&pulled.digest)))
}
