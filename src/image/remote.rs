//! The registry calls the composer makes, on `oci-client` (auth, blob
//! HEAD, mount, streamed blob upload and download, manifest PUT) plus a
//! reqwest client for the bounded manifest GET/HEAD (oci-client's manifest
//! pull has no size cap).
//!
//! # Uploads: monolithic, streamed from the spool file
//! A new layer is already on disk with its digest known (see
//! [`super::layer`]), so each upload is `POST /blobs/uploads/` then one
//! `PUT <location>?digest=…` whose body streams the file in
//! [`IO_CHUNK_BYTES`] pieces with `Content-Length` set: two requests per
//! blob, memory flat, and every registry supports it. Chunked `PATCH`
//! uploads would add a request per chunk and buy only resumability, which
//! a re-run gets anyway (blobs that made it are found by the HEAD).
//!
//! # Base blobs
//! [`Remote::ensure_base_blob`]: `HEAD` in the target repository; absent →
//! cross-repository mount when base and target share a registry; the
//! registry answering `202` (it started an upload instead: the source is
//! unknown to it or our token may not read it) or a different registry →
//! a streamed copy (download stream piped into the upload, digest checked
//! by us while it passes and by the registry on commit). Every outcome is
//! counted in an [`UploadReport`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::error::{ImageError, Result};
use super::limits::{CONNECT_TIMEOUT, IO_CHUNK_BYTES, LOGIN_REUSE, MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, READ_TIMEOUT};
use crate::oci::{map_oci_error, map_reqwest_error, Auth, OciError, RegistryOptions};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// What a compose moved, counted per blob and manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadReport {
    /// Blobs the target repository already had (HEAD said so).
    pub blobs_present: u64,
    /// Base blobs made present by a cross-repository mount.
    pub blobs_mounted: u64,
    /// Base blobs copied through us (other registry, or mount refused).
    pub blobs_copied: u64,
    pub bytes_copied: u64,
    /// New blobs (layers, configs, SBOM) uploaded.
    pub blobs_uploaded: u64,
    pub bytes_uploaded: u64,
    pub manifests_pushed: u64,
    /// Manifests (and tags) already in place, not pushed again.
    pub manifests_present: u64,
}

impl UploadReport {
    /// Registry writes (mounts, copies, uploads, manifest PUTs) made.
    pub fn writes(&self) -> u64 {
        self.blobs_mounted + self.blobs_copied + self.blobs_uploaded + self.manifests_pushed
    }
}

#[derive(Default)]
struct Counters {
    present: AtomicU64,
    mounted: AtomicU64,
    copied: AtomicU64,
    bytes_copied: AtomicU64,
    uploaded: AtomicU64,
    bytes_uploaded: AtomicU64,
    manifests_pushed: AtomicU64,
    manifests_present: AtomicU64,
}

impl Counters {
    fn report(&self) -> UploadReport {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        UploadReport {
            blobs_present: g(&self.present),
            blobs_mounted: g(&self.mounted),
            blobs_copied: g(&self.copied),
            bytes_copied: g(&self.bytes_copied),
            blobs_uploaded: g(&self.uploaded),
            bytes_uploaded: g(&self.bytes_uploaded),
            manifests_pushed: g(&self.manifests_pushed),
            manifests_present: g(&self.manifests_present),
        }
    }
}

/// A manifest body fetched with a cap and checked against its digest.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub body: Vec<u8>,
    /// `sha256:` of `body`.
    pub digest: String,
    /// The `Content-Type` the registry sent.
    pub content_type: Option<String>,
}

/// (registry, repository, push): a login's scope.
type LoginKey = (String, String, bool);

/// Registry access for composing: one per compose (its counters are the
/// compose's [`UploadReport`]).
pub struct Remote {
    client: Client,
    http: reqwest::Client,
    opts: RegistryOptions,
    /// Per-registry credentials overriding `opts.auth` (base and target may
    /// live on registries with different credentials).
    auths: BTreeMap<String, Auth>,
    logins: Mutex<BTreeMap<LoginKey, (Instant, Option<String>)>>,
    counters: Counters,
}

impl Remote {
    pub fn new(opts: RegistryOptions) -> Result<Self> {
        crate::tls::install_crypto_provider();
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(opts.plain_http.clone()),
            connect_timeout: Some(opts.connect_timeout.unwrap_or(CONNECT_TIMEOUT)),
            read_timeout: Some(READ_TIMEOUT),
            // One streamed PUT per blob: see the module docs.
            use_monolithic_push: true,
            ..Default::default()
        };
        let http = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout.unwrap_or(CONNECT_TIMEOUT))
            .read_timeout(READ_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .map_err(|e| ImageError::invalid(format!("HTTP client: {e}")))?;
        Ok(Remote {
            client: Client::new(config),
            http,
            opts,
            auths: BTreeMap::new(),
            logins: Default::default(),
            counters: Counters::default(),
        })
    }

    /// Uses `auth` for `registry` (`host[:port]`) instead of the default.
    pub fn with_registry_auth(mut self, registry: impl Into<String>, auth: Auth) -> Self {
        self.auths.insert(registry.into(), auth);
        self
    }

    pub fn report(&self) -> UploadReport {
        self.counters.report()
    }

    fn auth_for(&self, r: &Reference) -> &Auth {
        self.auths.get(r.resolve_registry()).or_else(|| self.auths.get(r.registry())).unwrap_or(&self.opts.auth)
    }

    fn scheme(&self, r: &Reference) -> &'static str {
        let registry = r.resolve_registry();
        if self.opts.plain_http.iter().any(|h| h == registry || h == r.registry()) {
            "http"
        } else {
            "https"
        }
    }

    /// Logs in for `op` on `r`'s repository (the `/v2/` challenge, and a
    /// bearer token when asked for), reused for [`LOGIN_REUSE`]; returns
    /// the token for our own reqwest calls.
    pub async fn login(&self, r: &Reference, op: RegistryOperation) -> Result<Option<String>> {
        let key = (r.resolve_registry().to_string(), r.repository().to_string(), matches!(op, RegistryOperation::Push));
        if let Ok(logins) = self.logins.lock() {
            if let Some((at, token)) = logins.get(&key) {
                if at.elapsed() < LOGIN_REUSE {
                    return Ok(token.clone());
                }
            }
        }
        let auth = match self.auth_for(r) {
            Auth::Anonymous => RegistryAuth::Anonymous,
            Auth::Basic { username, password } => RegistryAuth::Basic(username.clone(), password.clone()),
            Auth::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        };
        let token = self.client.auth(r, &auth, op).await.map_err(|e| map_oci_error(r, e))?;
        if let Ok(mut logins) = self.logins.lock() {
            logins.insert(key, (Instant::now(), token.clone()));
        }
        Ok(token)
    }

    fn authorize(&self, req: reqwest::RequestBuilder, token: Option<&str>, r: &Reference) -> reqwest::RequestBuilder {
        match (token, self.auth_for(r)) {
            (Some(t), _) => req.bearer_auth(t),
            (None, Auth::Basic { username, password }) => req.basic_auth(username, Some(password)),
            (None, Auth::Bearer(t)) => req.bearer_auth(t),
            (None, Auth::Anonymous) => req,
        }
    }

    fn manifest_url(&self, r: &Reference, target: &str) -> String {
        format!("{}://{}/v2/{}/manifests/{target}", self.scheme(r), r.resolve_registry(), r.repository())
    }

    /// GETs a manifest or index (by `r`'s digest, else tag) with a cap of
    /// [`MAX_MANIFEST_BYTES`]. The digest is computed from the body; it
    /// must equal the reference's digest, or the `Docker-Content-Digest`
    /// header when fetched by tag.
    pub async fn get_manifest(&self, r: &Reference) -> Result<Fetched> {
        let token = self.login(r, RegistryOperation::Pull).await?;
        let target = r.digest().or(r.tag()).unwrap_or("latest").to_string();
        let url = self.manifest_url(r, &target);
        let accept = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST].join(", ");
        let req = self.authorize(self.http.get(&url).header(reqwest::header::ACCEPT, accept), token.as_deref(), r);
        let resp = req.send().await.map_err(|e| map_reqwest_error(r, e))?;
        let resp = check_status(r, &url, resp)?;
        if let Some(len) = resp.content_length() {
            if len > MAX_MANIFEST_BYTES {
                return Err(OciError::TooLarge { what: format!("manifest {target}"), size: len, limit: MAX_MANIFEST_BYTES }.into());
            }
        }
        let header_digest = header(&resp, "Docker-Content-Digest");
        let content_type = header(&resp, "Content-Type");
        let mut body = Vec::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| map_reqwest_error(r, e))?;
            if body.len() as u64 + chunk.len() as u64 > MAX_MANIFEST_BYTES {
                return Err(OciError::TooLarge {
                    what: format!("manifest {target}"),
                    size: MAX_MANIFEST_BYTES + 1,
                    limit: MAX_MANIFEST_BYTES,
                }
                .into());
            }
            body.extend_from_slice(&chunk);
        }
        let digest = super::json::sha256_digest(&body);
        let expected = r.digest().map(str::to_string).or(header_digest.filter(|h| h.starts_with("sha256:")));
        if let Some(expected) = expected {
            if expected != digest {
                return Err(OciError::DigestMismatch {
                    what: format!("manifest {target} of {}", r.repository()),
                    expected,
                    actual: digest,
                }
                .into());
            }
        }
        Ok(Fetched { body, digest, content_type })
    }

    /// The digest a manifest tag or digest resolves to, by `HEAD`; `None`
    /// when absent.
    pub async fn head_manifest(&self, r: &Reference, target: &str) -> Result<Option<String>> {
        let token = self.login(r, RegistryOperation::Pull).await?;
        let url = self.manifest_url(r, target);
        let accept = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST].join(", ");
        let req = self.authorize(self.http.head(&url).header(reqwest::header::ACCEPT, accept), token.as_deref(), r);
        let resp = req.send().await.map_err(|e| map_reqwest_error(r, e))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let resp = check_status(r, &url, resp)?;
        Ok(header(&resp, "Docker-Content-Digest"))
    }

    /// Downloads a small blob (a config) whole: size capped by `cap` before
    /// and while reading, sha256 checked against the descriptor.
    pub async fn get_small_blob(&self, r: &Reference, digest: &str, size: u64, cap: u64, what: &str) -> Result<Vec<u8>> {
        check_digest(digest)?;
        if size > cap {
            return Err(OciError::TooLarge { what: format!("{what} {digest}"), size, limit: cap }.into());
        }
        self.login(r, RegistryOperation::Pull).await?;
        let desc = OciDescriptor { digest: digest.into(), size: size as i64, ..Default::default() };
        let mut stream = self.client.pull_blob_stream(r, &desc).await.map_err(|e| map_oci_error(r, e))?;
        let mut buf = Vec::with_capacity(size.min(cap) as usize);
        while let Some(chunk) = stream.stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                // oci-client fails the stream's end on a digest mismatch;
                // our own hash below names it precisely.
                Err(_) if buf.len() as u64 == size => break,
                Err(e) => return Err(OciError::Registry { reference: r.whole(), detail: format!("downloading {what}: {e}") }.into()),
            };
            if buf.len() as u64 + chunk.len() as u64 > size {
                return Err(OciError::SizeMismatch {
                    what: what.into(),
                    digest: digest.into(),
                    expected: size,
                    actual: buf.len() as u64 + chunk.len() as u64,
                }
                .into());
            }
            buf.extend_from_slice(&chunk);
        }
        if buf.len() as u64 != size {
            return Err(
                OciError::SizeMismatch { what: what.into(), digest: digest.into(), expected: size, actual: buf.len() as u64 }.into()
            );
        }
        let actual = super::json::sha256_digest(&buf);
        if actual != digest {
            return Err(OciError::DigestMismatch { what: what.into(), expected: digest.into(), actual }.into());
        }
        Ok(buf)
    }

    /// A blob's bytes as a stream (for [`super::verify`]); the caller
    /// hashes and counts.
    pub async fn blob_stream(
        &self,
        r: &Reference,
        digest: &str,
        size: u64,
    ) -> Result<futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>> {
        check_digest(digest)?;
        self.login(r, RegistryOperation::Pull).await?;
        let desc = OciDescriptor { digest: digest.into(), size: size as i64, ..Default::default() };
        let s = self.client.pull_blob_stream(r, &desc).await.map_err(|e| map_oci_error(r, e))?;
        Ok(s.stream)
    }

    pub async fn blob_exists(&self, r: &Reference, digest: &str) -> Result<bool> {
        self.login(r, RegistryOperation::Pull).await?;
        Ok(self.client.blob_exists(r, digest).await.map_err(|e| map_oci_error(r, e))?)
    }

    /// Makes a base blob present in `target`: HEAD, then mount, then a
    /// streamed copy (module docs).
    pub async fn ensure_base_blob(&self, target: &Reference, source: &Reference, digest: &str, size: u64) -> Result<()> {
        check_digest(digest)?;
        if self.blob_exists(target, digest).await? {
            self.counters.present.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if target.resolve_registry() == source.resolve_registry() {
            if target.repository() == source.repository() {
                // Same repository and still absent: the base manifest names
                // a blob the registry does not have.
                return Err(OciError::NotFound { reference: format!("{}@{digest} (a base layer)", source.whole()) }.into());
            }
            self.login(target, RegistryOperation::Push).await?;
            match self.client.mount_blob(target, source, digest).await {
                Ok(()) => {
                    tracing::debug!(digest, from = source.repository(), to = target.repository(), "mounted base blob");
                    self.counters.mounted.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                // 202: the registry opened an upload instead of mounting.
                Err(OciDistributionError::SpecViolationError(detail)) => {
                    tracing::info!(digest, detail, "registry did not mount the base blob; copying it");
                }
                Err(e) => return Err(map_oci_error(target, e).into()),
            }
        }
        self.copy_blob(source, target, digest, size).await
    }

    /// Streams a blob from `source` into `target`, never holding more than
    /// a chunk; the bytes are hashed and counted on the way.
    async fn copy_blob(&self, source: &Reference, target: &Reference, digest: &str, size: u64) -> Result<()> {
        self.login(source, RegistryOperation::Pull).await?;
        self.login(target, RegistryOperation::Push).await?;
        let desc = OciDescriptor { digest: digest.into(), size: size as i64, ..Default::default() };
        let down = self.client.pull_blob_stream(source, &desc).await.map_err(|e| map_oci_error(source, e))?;
        if let Some(len) = down.content_length {
            if len != size {
                return Err(OciError::SizeMismatch { what: "base layer".into(), digest: digest.into(), expected: size, actual: len }.into());
            }
        }
        let want = digest.to_string();
        let mut hasher = Sha256::new();
        let mut seen = 0u64;
        // Size and digest are checked as bytes pass; a mismatch fails the
        // stream, which aborts the PUT (the registry checks the digest on
        // commit too).
        let checked = down.stream.map(move |chunk| {
            let chunk = chunk.map_err(|e| OciDistributionError::GenericError(Some(e.to_string())))?;
            seen += chunk.len() as u64;
            if seen > size {
                return Err(OciDistributionError::GenericError(Some(format!("base layer {want} is longer than its {size} bytes"))));
            }
            hasher.update(&chunk);
            if seen == size {
                let actual = format!("sha256:{}", hex::encode(hasher.clone().finalize()));
                if actual != want {
                    return Err(OciDistributionError::GenericError(Some(format!("base layer hashes to {actual}, expected {want}"))));
                }
            }
            Ok(chunk)
        });
        self.client.push_blob_stream(target, checked, digest, Some(size)).await.map_err(|e| map_oci_error(target, e))?;
        self.counters.copied.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_copied.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }

    /// Uploads a spooled file as blob `digest` unless `target` has it.
    pub async fn ensure_file_blob(&self, target: &Reference, path: &std::path::Path, digest: &str, size: u64) -> Result<()> {
        check_digest(digest)?;
        if self.blob_exists(target, digest).await? {
            self.counters.present.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.login(target, RegistryOperation::Push).await?;
        let file = tokio::fs::File::open(path).await.map_err(|e| ImageError::read(path, e))?;
        let stream = futures::stream::try_unfold(file, |mut f| async move {
            let mut buf = bytes::BytesMut::with_capacity(IO_CHUNK_BYTES);
            let n = f
                .read_buf(&mut buf)
                .await
                .map_err(|e| OciDistributionError::GenericError(Some(format!("reading the layer spool: {e}"))))?;
            Ok::<_, OciDistributionError>(if n == 0 { None } else { Some((buf.freeze(), f)) })
        });
        self.client.push_blob_stream(target, stream.into_stream(), digest, Some(size)).await.map_err(|e| map_oci_error(target, e))?;
        self.counters.uploaded.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_uploaded.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }

    /// Uploads small bytes (a config, an SBOM) as a blob unless present.
    pub async fn ensure_bytes_blob(&self, target: &Reference, data: &[u8]) -> Result<String> {
        let digest = super::json::sha256_digest(data);
        if self.blob_exists(target, &digest).await? {
            self.counters.present.fetch_add(1, Ordering::Relaxed);
            return Ok(digest);
        }
        self.login(target, RegistryOperation::Push).await?;
        self.client.push_blob(target, data.to_vec(), &digest).await.map_err(|e| map_oci_error(target, e))?;
        self.counters.uploaded.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_uploaded.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(digest)
    }

    /// PUTs a manifest at `tag` (or at its own digest when `None`) unless
    /// that tag or digest already resolves to exactly these bytes.
    pub async fn ensure_manifest(&self, target: &Reference, tag: Option<&str>, body: &[u8], media_type: &str) -> Result<String> {
        let digest = super::json::sha256_digest(body);
        let at = tag.unwrap_or(&digest).to_string();
        if self.head_manifest(target, &at).await?.as_deref() == Some(digest.as_str()) {
            self.counters.manifests_present.fetch_add(1, Ordering::Relaxed);
            return Ok(digest);
        }
        self.login(target, RegistryOperation::Push).await?;
        let r = match tag {
            Some(t) => Reference::with_tag(target.registry().into(), target.repository().into(), t.into()),
            None => Reference::with_digest(target.registry().into(), target.repository().into(), digest.clone()),
        };
        let ct = media_type.parse().map_err(|_| ImageError::invalid(format!("media type {media_type:?}")))?;
        self.client.push_manifest_raw(&r, body.to_vec(), ct).await.map_err(|e| map_oci_error(target, e))?;
        self.counters.manifests_pushed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(reference = %r, %digest, "pushed manifest");
        Ok(digest)
    }

    /// Reads a config blob with the config cap.
    pub async fn get_config(&self, r: &Reference, digest: &str, size: u64) -> Result<Vec<u8>> {
        self.get_small_blob(r, digest, size, MAX_CONFIG_BYTES, "image config").await
    }
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

fn check_status(r: &Reference, url: &str, resp: reqwest::Response) -> Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let registry = r.resolve_registry().to_string();
    Err(match status {
        reqwest::StatusCode::NOT_FOUND => OciError::NotFound { reference: r.whole() },
        reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
            OciError::Auth { registry, detail: format!("HTTP {status} on {url}") }
        }
        _ => OciError::Registry { reference: r.whole(), detail: format!("HTTP {status} on {url}") },
    }
    .into())
}

/// Only `sha256:<64 lowercase hex>` digests are accepted ([`crate::oci::check_digest`]).
pub fn check_digest(d: &str) -> Result<()> {
    Ok(crate::oci::check_digest(d)?)
}

/// Parses `host[:port]/repo[:tag|@digest]` ([`crate::oci::parse_ref`]).
pub fn parse_ref(reference: &str) -> Result<Reference> {
    Ok(crate::oci::parse_ref(reference)?)
}
