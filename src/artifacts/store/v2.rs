//! The distribution API subset the store serves at `/v2/...`: what
//! `oci-client` (and so `oci::Registry`, `package push`, the controller and
//! the gateway) and the common CLI tools need to push, pull and delete.
//!
//! ```text
//! GET    /v2/                                   200 {} (the login probe)
//! HEAD   /v2/<name>/blobs/<digest>              200 + Content-Length | 404 BLOB_UNKNOWN
//! GET    /v2/<name>/blobs/<digest>              the bytes, streamed from disk
//! POST   /v2/<name>/blobs/uploads/              202 + Location  (?digest=: monolithic, 201; ?mount=: 201 when present)
//! PATCH  /v2/<name>/blobs/uploads/<id>          202 + Range     (Content-Range must continue the upload)
//! PUT    /v2/<name>/blobs/uploads/<id>?digest=  201             (the bytes must hash to the digest)
//! GET    /v2/<name>/blobs/uploads/<id>          204 + Range
//! DELETE /v2/<name>/blobs/uploads/<id>          204
//! HEAD   /v2/<name>/manifests/<tag|digest>      200 + Docker-Content-Digest
//! GET    /v2/<name>/manifests/<tag|digest>      the manifest
//! PUT    /v2/<name>/manifests/<tag|digest>      201 (every blob it names must be present)
//! DELETE /v2/<name>/manifests/<tag|digest>      202 (by digest: the manifest and its tags)
//! GET    /v2/<name>/tags/list                   {"name","tags"}  (?n=&last=: pages, with a Link to the next)
//! ```
//!
//! # Who may call
//! Only the operator credential: `Authorization: Bearer operator:<token>`
//! (what the endpoint itself, the controller and the gateway send) or Basic
//! `operator:<token>` (what `docker login`, `oras` and `crane` send; `package
//! push` takes it from `SKILL_OPERATOR_REGISTRY_PASSWORD`). Run pods reach
//! this listener, so a job token, however valid, is refused (403 `DENIED`):
//! with it a script could read every other job's files by tag. No
//! credential gets 401 with a Basic challenge, which is what makes
//! `oci-client` and docker send the Basic credential they were given.
//! Names, tags and digests are checked by grammar before any file is touched.

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use base64::Engine as _;

use super::{check_name, ManifestRef, Store, StoreError};
use crate::artifacts::OPERATOR_SUBJECT;
use crate::core::limits::{STORE_BLOB_MAX_BYTES, STORE_MANIFEST_MAX_BYTES};
use crate::core::token::verify_job_token;

/// The realm of the Basic challenge.
pub const REALM: &str = "skill-operator";
/// The Basic user name that goes with the operator token.
pub const OPERATOR_USER: &str = "operator";

#[derive(Clone)]
pub struct V2State {
    pub store: Store,
    pub key: std::sync::Arc<Vec<u8>>,
}

/// A distribution error: status, code, message.
#[derive(Debug)]
pub struct V2Error {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl V2Error {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        V2Error { status, code, message: message.into() }
    }
}

impl From<StoreError> for V2Error {
    fn from(e: StoreError) -> Self {
        let (status, code) = match &e {
            StoreError::NameInvalid(_) => (StatusCode::BAD_REQUEST, "NAME_INVALID"),
            StoreError::TagInvalid(_) => (StatusCode::BAD_REQUEST, "TAG_INVALID"),
            StoreError::DigestInvalid(_) | StoreError::DigestMismatch { .. } => (StatusCode::BAD_REQUEST, "DIGEST_INVALID"),
            StoreError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "SIZE_INVALID"),
            StoreError::BlobUnknown(_) => (StatusCode::NOT_FOUND, "BLOB_UNKNOWN"),
            StoreError::ManifestUnknown(_) => (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN"),
            StoreError::ManifestBlobUnknown(_) => (StatusCode::BAD_REQUEST, "MANIFEST_BLOB_UNKNOWN"),
            StoreError::ManifestInvalid(_) => (StatusCode::BAD_REQUEST, "MANIFEST_INVALID"),
            StoreError::UploadUnknown(_) => (StatusCode::NOT_FOUND, "BLOB_UPLOAD_UNKNOWN"),
            StoreError::UploadBusy(_) => (StatusCode::CONFLICT, "BLOB_UPLOAD_INVALID"),
            StoreError::TooManyUploads => (StatusCode::TOO_MANY_REQUESTS, "TOOMANYREQUESTS"),
            StoreError::Body(_) => (StatusCode::BAD_REQUEST, "BLOB_UPLOAD_INVALID"),
            StoreError::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN"),
        };
        V2Error::new(status, code, e.to_string())
    }
}

impl IntoResponse for V2Error {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = self.code, message = %self.message, "store request failed");
        }
        let body = serde_json::json!({ "errors": [{ "code": self.code, "message": self.message, "detail": null }] });
        let mut resp = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"skill-operator\""));
        }
        resp
    }
}

/// The `/v2` routes.
pub fn router(state: V2State) -> Router {
    Router::new()
        .route("/v2", any(base))
        .route("/v2/", any(base))
        .route("/v2/{*rest}", any(dispatch))
        // Blob bodies are streamed to disk under the store's own cap.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// Operator credential only (see the module docs).
pub fn authorize(key: &[u8], headers: &HeaderMap) -> Result<(), V2Error> {
    let unauthorized = |m: &str| V2Error::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", m);
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(unauthorized("the registry API needs the operator credential: Basic operator:<token> or Bearer operator:<token>"));
    };
    let value = value.to_str().map_err(|_| unauthorized("malformed Authorization header"))?;
    let (scheme, cred) = value.split_once(' ').ok_or_else(|| unauthorized("malformed Authorization header"))?;
    let cred = cred.trim();
    let operator = |token: &str| verify_job_token(key, "", OPERATOR_SUBJECT, token);
    if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD.decode(cred).map_err(|_| unauthorized("malformed Basic credential"))?;
        let pair = String::from_utf8(raw).map_err(|_| unauthorized("malformed Basic credential"))?;
        let (user, pass) = pair.split_once(':').ok_or_else(|| unauthorized("malformed Basic credential"))?;
        if user == OPERATOR_USER && operator(pass) {
            return Ok(());
        }
        return Err(unauthorized("invalid credential; the user is `operator` and the password the operator token"));
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthorized("use Basic or Bearer"));
    }
    if let Some(token) = cred.strip_prefix("operator:") {
        return if operator(token) { Ok(()) } else { Err(unauthorized("invalid operator token")) };
    }
    if let Some(rest) = cred.strip_prefix("job:") {
        let mut parts = rest.splitn(3, ':');
        if let (Some(ns), Some(uid), Some(token)) = (parts.next(), parts.next(), parts.next()) {
            if verify_job_token(key, ns, uid, token) {
                return Err(job_refused());
            }
        }
        return Err(unauthorized("invalid job token"));
    }
    Err(unauthorized("invalid credential"))
}

fn job_refused() -> V2Error {
    V2Error::new(
        StatusCode::FORBIDDEN,
        "DENIED",
        "a job token cannot use the registry API: it may read its own package and inputs and write its outputs under /v1, nothing else",
    )
}

async fn base(State(state): State<V2State>, headers: HeaderMap) -> Result<Response, V2Error> {
    authorize(&state.key, &headers)?;
    let mut resp = axum::Json(serde_json::json!({})).into_response();
    resp.headers_mut().insert("docker-distribution-api-version", HeaderValue::from_static("registry/2.0"));
    Ok(resp)
}

/// What a `/v2/<rest>` path addresses.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Manifest(&'a str, &'a str),
    Blob(&'a str, &'a str),
    /// An upload: `None` starts one.
    Upload(&'a str, Option<&'a str>),
    Tags(&'a str),
}

fn parse_target(rest: &str) -> Option<Target<'_>> {
    if let Some(name) = rest.strip_suffix("/tags/list") {
        return Some(Target::Tags(name));
    }
    if let Some(name) = rest.strip_suffix("/blobs/uploads/").or_else(|| rest.strip_suffix("/blobs/uploads")) {
        return Some(Target::Upload(name, None));
    }
    if let Some((name, id)) = rest.rsplit_once("/blobs/uploads/") {
        if !id.contains('/') {
            return Some(Target::Upload(name, Some(id)));
        }
    }
    if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        if !reference.contains('/') {
            return Some(Target::Manifest(name, reference));
        }
    }
    if let Some((name, digest)) = rest.rsplit_once("/blobs/") {
        if !digest.contains('/') {
            return Some(Target::Blob(name, digest));
        }
    }
    None
}

#[derive(Debug, Default, serde::Deserialize)]
struct V2Query {
    digest: Option<String>,
    mount: Option<String>,
    /// `tags/list`: at most this many tags (then a `Link` to the next page).
    n: Option<usize>,
    /// `tags/list`: only tags after this one.
    last: Option<String>,
}

async fn dispatch(
    State(state): State<V2State>,
    Path(rest): Path<String>,
    query: Result<Query<V2Query>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Result<Response, V2Error> {
    authorize(&state.key, req.headers())?;
    let Query(q) = query.map_err(|e| V2Error::new(StatusCode::BAD_REQUEST, "UNSUPPORTED", e.body_text()))?;
    let target =
        parse_target(&rest).ok_or_else(|| V2Error::new(StatusCode::NOT_FOUND, "NAME_UNKNOWN", format!("no registry route /v2/{rest}")))?;
    let method = req.method().clone();
    match (target, method) {
        (Target::Blob(name, digest), m) if m == Method::GET || m == Method::HEAD => get_blob(&state, name, digest, m == Method::HEAD).await,
        (Target::Upload(name, None), Method::POST) => start_upload(&state, name, q, req).await,
        (Target::Upload(name, Some(id)), Method::PATCH) => patch_upload(&state, name, id, req).await,
        (Target::Upload(name, Some(id)), Method::PUT) => put_upload(&state, name, id, q, req).await,
        (Target::Upload(name, Some(id)), Method::GET) => {
            check_name(name)?;
            let len = state.store.upload_len(id)?;
            Ok(upload_response(StatusCode::NO_CONTENT, name, id, len))
        }
        (Target::Upload(name, Some(id)), Method::DELETE) => {
            check_name(name)?;
            state.store.cancel(id)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (Target::Manifest(name, reference), m) if m == Method::GET || m == Method::HEAD => {
            get_manifest(&state, name, reference, m == Method::HEAD).await
        }
        (Target::Manifest(name, reference), Method::PUT) => put_manifest(&state, name, reference, req).await,
        (Target::Manifest(name, reference), Method::DELETE) => {
            let (store, name, reference) = (state.store.clone(), name.to_string(), ManifestRef::parse(reference)?);
            let deleted = blocking(move || store.delete_manifest(&name, &reference)).await?;
            if deleted {
                Ok(StatusCode::ACCEPTED.into_response())
            } else {
                Err(V2Error::new(StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN", "no such manifest or tag"))
            }
        }
        (Target::Tags(name), Method::GET) => {
            let (store, owned) = (state.store.clone(), name.to_string());
            let mut tags = blocking(move || store.tags(&owned)).await?;
            // distribution's pagination: sorted, after `last`, `n` at most,
            // and a `Link` to the next page when there is more.
            if let Some(last) = &q.last {
                tags.retain(|t| t.as_str() > last.as_str());
            }
            let mut next = None;
            if let Some(n) = q.n.filter(|n| tags.len() > *n) {
                tags.truncate(n);
                next = tags.last().map(|l| format!("</v2/{name}/tags/list?last={l}&n={n}>; rel=\"next\""));
            }
            let mut resp = axum::Json(serde_json::json!({ "name": name, "tags": tags })).into_response();
            if let Some(link) = next.and_then(|l| HeaderValue::from_str(&l).ok()) {
                resp.headers_mut().insert(header::LINK, link);
            }
            Ok(resp)
        }
        (_, m) => Err(V2Error::new(StatusCode::METHOD_NOT_ALLOWED, "UNSUPPORTED", format!("{m} is not served on /v2/{rest}"))),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, StoreError> + Send + 'static) -> Result<T, V2Error> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(V2Error::from),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(V2Error::new(StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN", e.to_string())),
    }
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

async fn get_blob(state: &V2State, name: &str, digest: &str, head: bool) -> Result<Response, V2Error> {
    check_name(name)?;
    let (store, owned) = (state.store.clone(), digest.to_string());
    let (path, size) = blocking(move || store.blob(&owned)).await?;
    let body = if head {
        Body::empty()
    } else {
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| V2Error::from(StoreError::Io { path: path.display().to_string(), source: e }))?;
        Body::from_stream(file_stream(file))
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    h.insert("docker-content-digest", header_value(digest));
    Ok(resp)
}

/// A file as a stream of 256 KiB chunks.
fn file_stream(file: tokio::fs::File) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> {
    futures::stream::unfold(Some(file), |file| async move {
        use tokio::io::AsyncReadExt;
        let mut file = file?;
        let mut buf = vec![0u8; 256 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

fn upload_response(status: StatusCode, name: &str, id: &str, len: u64) -> Response {
    let mut resp = status.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, header_value(&format!("/v2/{name}/blobs/uploads/{id}")));
    h.insert(header::RANGE, header_value(&format!("0-{}", len.saturating_sub(1))));
    h.insert("docker-upload-uuid", header_value(id));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    resp
}

fn blob_created(name: &str, digest: &str) -> Response {
    let mut resp = StatusCode::CREATED.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, header_value(&format!("/v2/{name}/blobs/{digest}")));
    h.insert("docker-content-digest", header_value(digest));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    resp
}

/// A declared body over the blob cap is refused before a byte is read.
fn check_declared(req: &Request, limit: u64, what: &'static str) -> Result<(), V2Error> {
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(StoreError::TooLarge { what, limit }.into());
    }
    Ok(())
}

async fn start_upload(state: &V2State, name: &str, q: V2Query, req: Request) -> Result<Response, V2Error> {
    check_name(name)?;
    if let Some(mount) = &q.mount {
        // Blobs are shared by every repository: a mount is a presence check.
        let (store, owned) = (state.store.clone(), mount.clone());
        if blocking(move || store.blob(&owned)).await.is_ok() {
            return Ok(blob_created(name, mount));
        }
    }
    check_declared(&req, STORE_BLOB_MAX_BYTES, "the blob")?;
    let id = state.store.start_upload().await?;
    if let Some(digest) = q.digest {
        // Monolithic: POST ?digest= with the whole body.
        super::check_digest(&digest)?;
        state.store.append(&id, req.into_body().into_data_stream()).await?;
        state.store.finish(&id, &digest).await?;
        return Ok(blob_created(name, &digest));
    }
    Ok(upload_response(StatusCode::ACCEPTED, name, &id, 0))
}

/// A body refused for its declared size gives its upload up, as one that
/// passes the cap while streaming does.
fn check_declared_upload(state: &V2State, id: &str, req: &Request) -> Result<(), V2Error> {
    check_declared(req, STORE_BLOB_MAX_BYTES, "the blob").inspect_err(|_| {
        let _ = state.store.cancel(id);
    })
}

async fn patch_upload(state: &V2State, name: &str, id: &str, req: Request) -> Result<Response, V2Error> {
    check_name(name)?;
    check_declared_upload(state, id, &req)?;
    if let Some(range) = req.headers().get(header::CONTENT_RANGE).and_then(|v| v.to_str().ok()) {
        let start = range.trim().trim_start_matches("bytes ").split('-').next().and_then(|s| s.parse::<u64>().ok());
        let have = state.store.upload_len(id)?;
        if start != Some(have) {
            let mut resp = V2Error::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "BLOB_UPLOAD_INVALID",
                format!("Content-Range {range:?} does not continue the upload at byte {have}"),
            )
            .into_response();
            resp.headers_mut().insert(header::RANGE, header_value(&format!("0-{}", have.saturating_sub(1))));
            return Ok(resp);
        }
    }
    let len = state.store.append(id, req.into_body().into_data_stream()).await?;
    Ok(upload_response(StatusCode::ACCEPTED, name, id, len))
}

async fn put_upload(state: &V2State, name: &str, id: &str, q: V2Query, req: Request) -> Result<Response, V2Error> {
    check_name(name)?;
    let digest = q.digest.ok_or_else(|| V2Error::new(StatusCode::BAD_REQUEST, "DIGEST_INVALID", "PUT needs ?digest=sha256:<hex>"))?;
    super::check_digest(&digest)?;
    check_declared_upload(state, id, &req)?;
    state.store.append(id, req.into_body().into_data_stream()).await?;
    state.store.finish(id, &digest).await?;
    Ok(blob_created(name, &digest))
}

async fn get_manifest(state: &V2State, name: &str, reference: &str, head: bool) -> Result<Response, V2Error> {
    let (store, owned, reference) = (state.store.clone(), name.to_string(), ManifestRef::parse(reference)?);
    let m = blocking(move || store.get_manifest(&owned, &reference)).await?;
    let len = m.body.len();
    let mut resp = Response::new(if head { Body::empty() } else { Body::from(m.body) });
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, header_value(&m.media_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert("docker-content-digest", header_value(&m.digest));
    Ok(resp)
}

async fn put_manifest(state: &V2State, name: &str, reference: &str, req: Request) -> Result<Response, V2Error> {
    check_name(name)?;
    let reference = ManifestRef::parse(reference)?;
    check_declared(&req, STORE_MANIFEST_MAX_BYTES, "the manifest")?;
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = axum::body::to_bytes(req.into_body(), STORE_MANIFEST_MAX_BYTES as usize)
        .await
        .map_err(|_| V2Error::from(StoreError::TooLarge { what: "the manifest", limit: STORE_MANIFEST_MAX_BYTES }))?;
    let (store, owned) = (state.store.clone(), name.to_string());
    let digest = blocking(move || store.put_manifest(&owned, &reference, &body, content_type.as_deref())).await?;
    let mut resp = StatusCode::CREATED.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, header_value(&format!("/v2/{name}/manifests/{digest}")));
    h.insert("docker-content-digest", header_value(&digest));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    Ok(resp)
}

/// Sweeps unreferenced blobs every `interval` until `stop`.
pub async fn collect_garbage_every(store: Store, interval: std::time::Duration, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.collect_garbage()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(removed = n, "store: unreferenced blobs removed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "store: garbage sweep failed"),
            Err(e) => tracing::warn!(error = %e, "store: garbage sweep task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_name_and_target() {
        assert_eq!(parse_target("a/b/manifests/v1"), Some(Target::Manifest("a/b", "v1")));
        assert_eq!(parse_target("a/blobs/sha256:x"), Some(Target::Blob("a", "sha256:x")));
        assert_eq!(parse_target("a/blobs/uploads/"), Some(Target::Upload("a", None)));
        assert_eq!(parse_target("a/blobs/uploads/abc"), Some(Target::Upload("a", Some("abc"))));
        assert_eq!(parse_target("a/blobs/uploads/x/blobs/uploads/"), Some(Target::Upload("a/blobs/uploads/x", None)));
        assert_eq!(parse_target("a/tags/list"), Some(Target::Tags("a")));
        assert_eq!(parse_target("a/manifests/../x"), None);
        assert_eq!(parse_target("nothing"), None);
    }

    #[test]
    fn only_the_operator_credential_passes() {
        let key = b"0123456789abcdef0123456789abcdef".to_vec();
        let op = crate::artifacts::operator_token(&key);
        let job = crate::core::token::job_token(&key, "ns", "uid");
        let h = |v: String| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, HeaderValue::from_str(&v).unwrap());
            m
        };
        let basic = |u: &str, p: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}")));
        assert!(authorize(&key, &h(format!("Bearer operator:{op}"))).is_ok());
        assert!(authorize(&key, &h(basic("operator", &op))).is_ok());
        assert_eq!(authorize(&key, &HeaderMap::new()).unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert_eq!(authorize(&key, &h(format!("Bearer job:ns:uid:{job}"))).unwrap_err().status, StatusCode::FORBIDDEN);
        assert_eq!(authorize(&key, &h(format!("Bearer {job}"))).unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert_eq!(authorize(&key, &h(format!("Bearer {op}"))).unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert_eq!(authorize(&key, &h(basic("operator", &job))).unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert_eq!(authorize(&key, &h(basic("admin", &op))).unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert_eq!(authorize(&key, &h(format!("Bearer operator:{}", "0".repeat(64)))).unwrap_err().status, StatusCode::UNAUTHORIZED);
    }
}
