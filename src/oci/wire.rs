//! Registry plumbing: logins, bounded manifest and blob GETs, uploads, reference parsing, error mapping.

use crate::core::package::PackageError;
use futures::StreamExt;
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::{Reference, RegistryOperation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

use super::*;

/// The manifest or index JSON fields we read (unknown fields ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AnyManifest {
    pub(super) schema_version: Option<u32>,
    pub(super) media_type: Option<String>,
    pub(super) artifact_type: Option<String>,
    pub(super) config: Option<OciDescriptor>,
    #[serde(default)]
    pub(super) layers: Vec<OciDescriptor>,
    pub(super) manifests: Option<Vec<OciDescriptor>>,
    #[serde(default)]
    pub(super) annotations: BTreeMap<String, String>,
}

impl AnyManifest {
    pub(super) fn is_index(&self) -> bool {
        matches!(self.media_type.as_deref(), Some(OCI_INDEX_MEDIA_TYPE | DOCKER_LIST_MEDIA_TYPE))
            || (self.media_type.is_none() && self.manifests.is_some())
    }
}

impl Registry {
    // -- plumbing -----------------------------------------------------------

    /// Logs in: asks `/v2/` and, when the registry answers with a bearer
    /// challenge, gets a token (oci-client caches it for blob calls; the
    /// manifest GET gets it passed). Reused for [`LOGIN_REUSE`] per
    /// repository and operation; a registry that went down is still noticed
    /// by the request that follows.
    ///
    /// A registry that asks an anonymous client for no login at all (its
    /// `/v2/` sends no challenge) is remembered for the whole registry, so
    /// pushing to many repositories (a SkillSource's one per skill) does not
    /// ask `/v2/` once per repository.
    pub(super) async fn authenticate(&self, r: &Reference, op: RegistryOperation) -> Result<Option<String>> {
        let registry = r.resolve_registry().to_string();
        let anonymous = matches!(self.auth_for(r), Auth::Anonymous);
        let open_key = (registry.clone(), String::new(), false);
        let key = (registry, r.repository().to_string(), matches!(op, RegistryOperation::Push));
        {
            let logins = self.logins.lock().unwrap();
            let fresh = |k: &LoginKey| logins.get(k).filter(|(at, _)| at.elapsed() < LOGIN_REUSE).map(|(_, t)| t.clone());
            if let Some(token) = fresh(&key) {
                return Ok(token);
            }
            if anonymous && fresh(&open_key).is_some() {
                return Ok(None);
            }
        }
        let token = self.client.auth(r, &self.auth_for(r).to_oci(), op).await.map_err(|e| map_oci_error(r, e))?;
        let mut logins = self.logins.lock().unwrap();
        let now = std::time::Instant::now();
        if anonymous && token.is_none() {
            logins.insert(open_key, (now, None));
        }
        logins.insert(key, (now, token.clone()));
        Ok(token)
    }

    /// Uploads a blob in one POST and one PUT. With [`Upload::IfMissing`]
    /// a HEAD first skips blobs the repository has; [`Upload::Always`]
    /// saves that round trip for blobs that are almost surely new (sending
    /// one the registry has is harmless: it keeps one copy).
    pub(super) async fn upload(&self, r: &Reference, data: &[u8], digest: &str, mode: Upload) -> Result<()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&(r.registry(), r.repository(), digest), &mut h);
        let _one_at_a_time = self.uploads[(std::hash::Hasher::finish(&h) as usize) % UPLOAD_STRIPES].lock().await;
        if mode == Upload::IfMissing {
            match self.client.blob_exists(r, digest).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, digest, "blob HEAD failed; uploading"),
            }
        }
        // The stream form: oci-client's monolithic `push_blob` refuses an
        // empty blob (an empty output file is one), its streamed PUT does not.
        let body = bytes::Bytes::copy_from_slice(data);
        let size = body.len() as u64;
        self.client
            .push_blob_stream(r, futures::stream::once(async move { Ok(body) }), digest, Some(size))
            .await
            .map(drop)
            .map_err(|e| map_oci_error(r, e))
    }

    pub(super) async fn put_manifest(&self, r: &Reference, m: &OciImageManifest) -> Result<String> {
        let body = serde_json::to_vec(m).expect("manifest serializes");
        let digest = sha256_digest(&body);
        self.client
            .push_manifest_raw(r, body, OCI_MANIFEST_MEDIA_TYPE.parse().expect("static header value"))
            .await
            .map_err(|e| map_oci_error(r, e))?;
        tracing::debug!(reference = %r, %digest, "pushed manifest");
        Ok(digest)
    }

    /// GETs a manifest with a byte cap and returns (body, digest). The
    /// digest is computed from the body, and must equal the reference's
    /// digest when it has one.
    pub(super) async fn fetch_manifest(&self, r: &Reference, token: Option<&str>) -> Result<(Vec<u8>, String)> {
        let registry = r.resolve_registry().to_string();
        let scheme = if self.opts.plain_http.iter().any(|h| h == &registry) { "http" } else { "https" };
        let target = r.digest().or(r.tag()).unwrap_or("latest");
        if let Some(d) = r.digest() {
            check_digest(d)?;
        }
        let url = format!("{scheme}://{registry}/v2/{}/manifests/{target}", r.repository());
        let accept = [OCI_MANIFEST_MEDIA_TYPE, OCI_INDEX_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, DOCKER_LIST_MEDIA_TYPE].join(", ");
        let req = self.signed(self.http.get(&url).header(reqwest::header::ACCEPT, accept), token, r);
        let resp = req.send().await.map_err(|e| map_reqwest_error(r, e))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(OciError::NotFound { reference: r.whole() });
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(OciError::Auth { registry, detail: format!("HTTP {status} on {url}") });
        }
        if !status.is_success() {
            return Err(OciError::Registry { reference: r.whole(), detail: format!("HTTP {status} on {url}") });
        }
        let limit = self.opts.limits.max_manifest_bytes;
        if let Some(len) = resp.content_length() {
            if len > limit {
                return Err(OciError::TooLarge { what: "manifest".into(), size: len, limit });
            }
        }
        let header_digest = resp.headers().get("Docker-Content-Digest").and_then(|v| v.to_str().ok()).map(str::to_string);
        let mut body = Vec::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| map_reqwest_error(r, e))?;
            if body.len() as u64 + chunk.len() as u64 > limit {
                return Err(OciError::TooLarge { what: "manifest".into(), size: body.len() as u64 + chunk.len() as u64, limit });
            }
            body.extend_from_slice(&chunk);
        }
        let digest = sha256_digest(&body);
        let expected = r.digest().map(str::to_string).or(header_digest.filter(|h| h.starts_with("sha256:")));
        if let Some(expected) = expected {
            if expected != digest {
                return Err(OciError::DigestMismatch { what: format!("manifest {target}"), expected, actual: digest });
            }
        }
        Ok((body, digest))
    }

    /// Downloads one blob: the cap was checked by the caller against the
    /// descriptor; here the stream may not exceed the descriptor's size and
    /// must hash to its digest.
    pub(super) async fn fetch_blob(&self, r: &Reference, desc: &OciDescriptor, what: &str) -> Result<Vec<u8>> {
        check_digest(&desc.digest)?;
        let expected = u64::try_from(desc.size)
            .map_err(|_| OciError::InvalidManifest { reference: r.whole(), detail: format!("{what} has a negative size") })?;
        let size_mismatch = |actual| OciError::SizeMismatch { what: what.into(), digest: desc.digest.clone(), expected, actual };
        let mut stream = self.client.pull_blob_stream(r, desc).await.map_err(|e| map_oci_error(r, e))?;
        if let Some(len) = stream.content_length {
            if len != expected {
                return Err(size_mismatch(len));
            }
        }
        let mut buf = Vec::with_capacity(expected.min(64 * 1024 * 1024) as usize);
        let mut hasher = Sha256::new();
        let mut failed = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    let total = buf.len() as u64 + bytes.len() as u64;
                    if total > expected {
                        return Err(size_mismatch(total));
                    }
                    hasher.update(&bytes);
                    buf.extend_from_slice(&bytes);
                }
                // oci-client's own digest check fails the stream's end; our
                // hash below gives the precise error then.
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if buf.len() as u64 == expected && actual != desc.digest {
            return Err(OciError::DigestMismatch { what: what.into(), expected: desc.digest.clone(), actual });
        }
        if let Some(e) = failed {
            return Err(OciError::Registry { reference: r.whole(), detail: format!("downloading {what}: {e}") });
        }
        if buf.len() as u64 != expected {
            return Err(size_mismatch(buf.len() as u64));
        }
        Ok(buf)
    }
}

/// Runs CPU-bound package work (inflating and hashing up to 128 MiB) off
/// the async workers.
pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, PackageError> + Send + 'static) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(OciError::from),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(OciError::Registry { reference: String::new(), detail: format!("package task cancelled: {e}") }),
    }
}

/// Parses `host[:port]/repo[:tag|@digest]`; a digest must be sha256.
pub(crate) fn parse_ref(reference: &str) -> Result<Reference> {
    let r: Reference =
        crate::oci::reference::parse(reference).map_err(|reason| OciError::InvalidReference { reference: reference.into(), reason })?;
    if let Some(d) = r.digest() {
        check_digest(d)?;
    }
    Ok(r)
}

pub(super) fn parse_manifest(reference: &str, body: &[u8]) -> Result<AnyManifest> {
    let m: AnyManifest =
        serde_json::from_slice(body).map_err(|e| OciError::InvalidManifest { reference: reference.into(), detail: e.to_string() })?;
    if m.schema_version != Some(2) {
        return Err(OciError::InvalidManifest {
            reference: reference.into(),
            detail: format!("schemaVersion {:?}, expected 2", m.schema_version),
        });
    }
    Ok(m)
}

/// Only `sha256:<64 lowercase hex>` digests are accepted.
pub(crate) fn check_digest(d: &str) -> Result<()> {
    match d.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => Ok(()),
        _ => Err(OciError::UnsupportedDigest { digest: d.into() }),
    }
}

pub(super) fn cap(what: &str, d: &OciDescriptor, limit: u64) -> Result<()> {
    check_digest(&d.digest)?;
    let size = u64::try_from(d.size).unwrap_or(u64::MAX);
    if size > limit {
        return Err(OciError::TooLarge { what: format!("{what} {}", d.digest), size, limit });
    }
    Ok(())
}

pub(super) fn sha256_digest(data: &[u8]) -> String {
    crate::core::package::digest(data)
}

pub(super) fn descriptor(media_type: &str, data: &[u8], title: Option<String>) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.into(),
        digest: sha256_digest(data),
        size: data.len() as i64,
        annotations: title.map(|t| BTreeMap::from([(ANNOTATION_TITLE.to_string(), t)])),
        ..Default::default()
    }
}

pub(crate) fn map_reqwest_error(r: &Reference, e: reqwest::Error) -> OciError {
    if e.is_connect() || e.is_timeout() {
        OciError::Unreachable { registry: r.resolve_registry().into(), detail: error_chain(&e) }
    } else {
        OciError::Registry { reference: r.whole(), detail: error_chain(&e) }
    }
}

pub(crate) fn map_oci_error(r: &Reference, e: OciDistributionError) -> OciError {
    let registry = r.resolve_registry().to_string();
    match e {
        OciDistributionError::RequestError(re) => map_reqwest_error(r, re),
        OciDistributionError::AuthenticationFailure(detail) => OciError::Auth { registry, detail },
        OciDistributionError::UnauthorizedError { url } => OciError::Auth { registry, detail: format!("unauthorized: {url}") },
        OciDistributionError::ServerError { code: 404, .. } => OciError::NotFound { reference: r.whole() },
        OciDistributionError::ServerError { code: 401 | 403, url, message } => {
            OciError::Auth { registry, detail: format!("{url}: {message}") }
        }
        OciDistributionError::RegistryError { envelope, url } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(c, OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::BlobUnknown | OciErrorCode::NotFound)
            }) {
                OciError::NotFound { reference: r.whole() }
            } else if codes.iter().any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                OciError::Auth { registry, detail: format!("{url}: {envelope}") }
            } else {
                OciError::Registry { reference: r.whole(), detail: format!("{url}: {envelope}") }
            }
        }
        other => OciError::Registry { reference: r.whole(), detail: error_chain(&other) },
    }
}

/// An error and its sources in one line, each cause once.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let cs = c.to_string();
        if !s.contains(&cs) {
            s.push_str(": ");
            s.push_str(&cs);
        }
        src = c.source();
    }
    s
}
