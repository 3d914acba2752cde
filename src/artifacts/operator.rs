//! The artifact endpoint as the operator sees it: the operator credential's
//! client ([`HttpArtifacts`]), shared by the controller (stage a package,
//! once per namespace and pinned digest or per job, read outputs back,
//! delete a job's artifacts) and the gateway (stage a
//! run's inputs, read its streams and files), and the [`ArtifactStore`]
//! seam the controller's reconcilers call through.

use futures::future::BoxFuture;

/// Why a call to the artifact endpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{what}: the artifact endpoint is unreachable: {detail}")]
    Unreachable { what: String, detail: String },
    #[error("{what}: the artifact endpoint answered {status}: {body}")]
    Refused { what: String, status: u16, code: Option<crate::artifacts::ErrorCode>, body: String },
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
    #[error("{0}: no artifact store is configured")]
    Unsupported(String),
}

impl ArtifactError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            ArtifactError::Unreachable { .. } => "artifacts-unreachable",
            ArtifactError::Refused { .. } => "artifacts-refused",
            ArtifactError::Invalid { .. } => "artifacts-invalid",
            ArtifactError::Unsupported(_) => "artifacts-unsupported",
        }
    }

    /// The endpoint is down or failing (unreachable, or a 5xx), as opposed
    /// to refusing this request: waiting for it may help.
    pub fn is_outage(&self) -> bool {
        matches!(self, ArtifactError::Unreachable { .. } | ArtifactError::Refused { status: 500.., .. })
    }

    /// [`ArtifactStore::claim`] was refused because the warm pod holds
    /// another claim already (409 `already_claimed`): it runs that one, never
    /// this, and the run must take another pod or start cold.
    pub fn is_already_claimed(&self) -> bool {
        matches!(self, ArtifactError::Refused { code: Some(crate::artifacts::ErrorCode::AlreadyClaimed), .. })
    }
}

/// Where a run's files live: the controller stages a job's package before
/// the Job starts and removes the job's artifacts when the SkillJob goes.
pub trait ArtifactStore: Send + Sync {
    fn stage_package<'a>(&'a self, namespace: &'a str, uid: &'a str, archive: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>>;
    fn delete<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>>;
    /// The outputs manifest the upload sidecar stored (`None`: nothing stored).
    fn outputs<'a>(
        &'a self,
        namespace: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, ArtifactError>>;
    /// One stored output file (`result/result.json`, `work/<path>`).
    fn output_file<'a>(&'a self, namespace: &'a str, uid: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>>;
    /// The input files staged for the job (empty when none were). A store
    /// that cannot hold inputs has none.
    fn staged_inputs<'a>(
        &'a self,
        _namespace: &'a str,
        _uid: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::artifacts::SetFile>, ArtifactError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Each job's outputs as they are stored, until the stream breaks (the
    /// caller stops at its first error and follows again). A store that
    /// cannot tell says [`ArtifactError::Unsupported`].
    fn follow_stored(&self) -> BoxFuture<'_, Result<StoredStream, ArtifactError>> {
        Box::pin(async { Err(ArtifactError::Unsupported("follow stored outputs".into())) })
    }
    /// Stages `archive` once for every run of `namespace` that pins `digest`. Idempotent.
    ///
    /// `digest` is the SkillPackage's pinned OCI manifest digest
    /// (`sha256:<64 hex>`), not the archive's sha256: the endpoint takes the
    /// operator's word for that link. A run's pod then reads it with `fetch
    /// --staged-package <digest>`.
    fn stage_namespace_package<'a>(
        &'a self,
        _namespace: &'a str,
        _digest: &'a str,
        _archive: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Err(ArtifactError::Unsupported("stage namespace packages".into())) })
    }
    /// Every namespace package the endpoint holds.
    fn namespace_packages(&self) -> BoxFuture<'_, Result<Vec<crate::artifacts::NamespacePackage>, ArtifactError>> {
        Box::pin(async { Err(ArtifactError::Unsupported("list namespace packages".into())) })
    }
    /// `Ok(false)`: there was none.
    fn delete_namespace_package<'a>(&'a self, _namespace: &'a str, _digest: &'a str) -> BoxFuture<'a, Result<bool, ArtifactError>> {
        Box::pin(async { Err(ArtifactError::Unsupported("delete namespace packages".into())) })
    }
    /// Hands `claim` to the warm pod `warm_uid` of `namespace` (`PUT
    /// /v1/jobs/{ns}/{warm_uid}/claim`). Write-once: storing the same claim
    /// again is `Ok` (a retry), another one is refused
    /// ([`ArtifactError::is_already_claimed`]). A store that keeps no
    /// claims says [`ArtifactError::Unsupported`].
    fn claim<'a>(
        &'a self,
        _namespace: &'a str,
        _warm_uid: &'a str,
        _claim: &'a crate::artifacts::Claim,
    ) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Err(ArtifactError::Unsupported("claim warm pods".into())) })
    }
    /// The key the warm pod `warm_uid` of `namespace` published (`GET
    /// /v1/jobs/{ns}/{warm_uid}/claim-key`), a run's granted variables are
    /// sealed to; `None` while it has published none.
    fn claim_key<'a>(
        &'a self,
        _namespace: &'a str,
        _warm_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::artifacts::sealed::ClaimKey>, ArtifactError>> {
        Box::pin(async { Err(ArtifactError::Unsupported("read warm pods' keys".into())) })
    }
}

/// What [`ArtifactStore::follow_stored`] yields.
pub type StoredStream = futures::stream::BoxStream<'static, Result<crate::artifacts::OutputsStored, ArtifactError>>;

/// The longest line `GET /v1/outputs/stored` sends (a namespace and a UID).
const STORED_LINE_MAX: usize = 1024;

/// The artifact endpoint over HTTP, with the operator credential.
pub struct HttpArtifacts {
    pub base: String,
    pub bearer: String,
    pub http: reqwest::Client,
}

impl HttpArtifacts {
    pub fn new(base: &str, key: &[u8]) -> Self {
        HttpArtifacts {
            base: base.trim_end_matches('/').to_string(),
            bearer: crate::artifacts::operator_bearer(key),
            // With no proxy from the environment and no CA bundle, building cannot fail.
            http: crate::tls::reqwest_builder().no_proxy().build().unwrap_or_default(),
        }
    }

    /// GET a JSON document under the API base; `None` on 404.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str, what: &str) -> Result<Option<T>, ArtifactError> {
        let url = format!("{}/{path}", self.base);
        let response = self.http.get(url).header("Authorization", &self.bearer).send().await;
        let response = match Self::answer(response, &format!("read {what}")).await {
            Ok(r) => r,
            Err(ArtifactError::Refused { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let bytes = response.bytes().await.map_err(|e| unreachable(&format!("read {what}"), &e))?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ArtifactError::Invalid { what: format!("read {what}"), detail: format!("the manifest is not valid: {e}") })
    }

    /// A success, or the endpoint's refusal with its code and the first bytes of its answer.
    async fn answer(response: Result<reqwest::Response, reqwest::Error>, what: &str) -> Result<reqwest::Response, ArtifactError> {
        let response = response.map_err(|e| unreachable(what, &e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let code =
            serde_json::from_str::<crate::artifacts::ErrorBody>(&body).ok().and_then(|b| crate::artifacts::ErrorCode::parse(&b.error.code));
        Err(ArtifactError::Refused { what: what.to_string(), status, code, body: body.chars().take(300).collect() })
    }

    async fn check(response: Result<reqwest::Response, reqwest::Error>, what: &str) -> Result<(), ArtifactError> {
        match Self::answer(response, what).await {
            Ok(_) => Ok(()),
            Err(ArtifactError::Refused { status: 404, .. }) if what.starts_with("delete") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl HttpArtifacts {
    /// The URL of `/jobs/{namespace}/{uid}/{kind}/{path}`, each segment of
    /// `path` escaped (a staged file's name may hold spaces or `#`).
    fn file_url(&self, namespace: &str, uid: &str, kind: &str, path: &str) -> Result<reqwest::Url, ArtifactError> {
        let invalid = |detail: String| ArtifactError::Invalid { what: format!("address {path}"), detail };
        let mut url = reqwest::Url::parse(&self.base).map_err(|e| invalid(format!("the endpoint URL {} is not a URL: {e}", self.base)))?;
        url.path_segments_mut()
            .map_err(|()| invalid(format!("the endpoint URL {} cannot take a path", self.base)))?
            .pop_if_empty()
            .extend(["jobs", namespace, uid, kind])
            .extend(path.split('/'));
        Ok(url)
    }

    /// The URL of `/jobs/{namespace}/{warm_uid}/{route}` (`claim`, `claim-key`).
    fn warm_url(&self, namespace: &str, warm_uid: &str, route: &str) -> Result<reqwest::Url, ArtifactError> {
        let invalid = |detail: String| ArtifactError::Invalid { what: format!("address the {route} of {namespace}/{warm_uid}"), detail };
        let mut url = reqwest::Url::parse(&self.base).map_err(|e| invalid(format!("the endpoint URL {} is not a URL: {e}", self.base)))?;
        url.path_segments_mut()
            .map_err(|()| invalid(format!("the endpoint URL {} cannot take a path", self.base)))?
            .pop_if_empty()
            .extend(["jobs", namespace, warm_uid, route]);
        Ok(url)
    }

    /// The URL of `/namespaces/{namespace}/packages/{digest}` (each segment
    /// escaped as a path segment needs; the digest's `:` stays as it is).
    fn namespace_package_url(&self, namespace: &str, digest: &str) -> Result<reqwest::Url, ArtifactError> {
        let invalid = |detail: String| ArtifactError::Invalid { what: format!("address the package {namespace}/{digest}"), detail };
        let mut url = reqwest::Url::parse(&self.base).map_err(|e| invalid(format!("the endpoint URL {} is not a URL: {e}", self.base)))?;
        url.path_segments_mut()
            .map_err(|()| invalid(format!("the endpoint URL {} cannot take a path", self.base)))?
            .pop_if_empty()
            .extend(["namespaces", namespace, "packages", digest]);
        Ok(url)
    }

    /// Stage one input file of a job (adds it to the job's input set, or
    /// replaces the file of that path). Returns the file as stored.
    pub async fn stage_input(
        &self,
        namespace: &str,
        uid: &str,
        path: &str,
        bytes: Vec<u8>,
    ) -> Result<crate::artifacts::SetFile, ArtifactError> {
        let size = bytes.len() as u64;
        self.stage_input_stream(namespace, uid, path, size, reqwest::Body::from(bytes)).await
    }

    /// [`Self::stage_input`] from a body of exactly `size` bytes, sent as it
    /// arrives (the gateway's file route: up to 32 MiB never held whole).
    /// The length is declared, so a body that ends early or runs long is
    /// cut off and the endpoint stores nothing.
    pub async fn stage_input_stream(
        &self,
        namespace: &str,
        uid: &str,
        path: &str,
        size: u64,
        body: reqwest::Body,
    ) -> Result<crate::artifacts::SetFile, ArtifactError> {
        let what = format!("stage input {path}");
        let url = self.file_url(namespace, uid, "inputs", path)?;
        let response = self
            .http
            .put(url)
            .header("Authorization", &self.bearer)
            .header(reqwest::header::CONTENT_LENGTH, size)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body)
            .send()
            .await;
        let response = Self::answer(response, &what).await?;
        #[derive(serde::Deserialize)]
        struct Staged {
            file: crate::artifacts::SetFile,
        }
        let body = response.bytes().await.map_err(|e| unreachable(&what, &e))?;
        serde_json::from_slice::<Staged>(&body)
            .map(|s| s.file)
            .map_err(|e| ArtifactError::Invalid { what, detail: format!("the endpoint's answer is not a staged file: {e}") })
    }

    /// One staged input file's bytes.
    pub async fn input_file(&self, namespace: &str, uid: &str, path: &str) -> Result<Vec<u8>, ArtifactError> {
        let what = format!("read staged input {path}");
        let url = self.file_url(namespace, uid, "inputs", path)?;
        let response = Self::answer(self.http.get(url).header("Authorization", &self.bearer).send().await, &what).await?;
        Ok(response.bytes().await.map_err(|e| unreachable(&what, &e))?.to_vec())
    }

    /// One stored output file as the endpoint's answer, its body not read
    /// yet (to stream on; its `Content-Length` and `X-Content-Digest` are
    /// the file's); `None` when the run stored no such file.
    pub async fn output_response(&self, namespace: &str, uid: &str, path: &str) -> Result<Option<reqwest::Response>, ArtifactError> {
        let what = format!("read {path}");
        let url = self.file_url(namespace, uid, "outputs", path)?;
        match Self::answer(self.http.get(url).header("Authorization", &self.bearer).send().await, &what).await {
            Ok(response) => Ok(Some(response)),
            Err(ArtifactError::Refused { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One stored output file's bytes (`result/stdout`, `work/<path>`);
    /// `None` when the run stored no such file.
    pub async fn output_file_opt(&self, namespace: &str, uid: &str, path: &str) -> Result<Option<Vec<u8>>, ArtifactError> {
        let what = format!("read {path}");
        let url = self.file_url(namespace, uid, "outputs", path)?;
        match Self::answer(self.http.get(url).header("Authorization", &self.bearer).send().await, &what).await {
            Ok(response) => Ok(Some(response.bytes().await.map_err(|e| unreachable(&what, &e))?.to_vec())),
            Err(ArtifactError::Refused { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn unreachable(what: &str, e: &reqwest::Error) -> ArtifactError {
    ArtifactError::Unreachable { what: what.to_string(), detail: crate::oci::error_chain(e) }
}

impl ArtifactStore for HttpArtifacts {
    fn output_file<'a>(&'a self, namespace: &'a str, uid: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}/outputs/{path}", self.base);
            let what = format!("read {path}");
            let response = Self::answer(self.http.get(url).header("Authorization", &self.bearer).send().await, &what).await?;
            Ok(response.bytes().await.map_err(|e| unreachable(&what, &e))?.to_vec())
        })
    }

    fn outputs<'a>(
        &'a self,
        namespace: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, ArtifactError>> {
        Box::pin(async move { self.get_json(&format!("jobs/{namespace}/{uid}/outputs"), "the outputs").await })
    }

    fn staged_inputs<'a>(
        &'a self,
        namespace: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::artifacts::SetFile>, ArtifactError>> {
        Box::pin(async move {
            // The endpoint answers an empty manifest when nothing is staged; 404 is a wrong route.
            let manifest: Option<crate::artifacts::InputsManifest> =
                self.get_json(&format!("jobs/{namespace}/{uid}/inputs"), "the staged inputs").await?;
            manifest.map(|m| m.files).ok_or_else(|| ArtifactError::Refused {
                what: "read the staged inputs".into(),
                status: 404,
                code: None,
                body: "the inputs route is missing: is the endpoint this version's?".into(),
            })
        })
    }

    fn stage_package<'a>(&'a self, namespace: &'a str, uid: &'a str, archive: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}/package", self.base);
            Self::check(self.http.put(url).header("Authorization", &self.bearer).body(archive).send().await, "stage the package").await
        })
    }

    fn delete<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}", self.base);
            Self::check(self.http.delete(url).header("Authorization", &self.bearer).send().await, "delete the job's artifacts").await
        })
    }

    fn stage_namespace_package<'a>(
        &'a self,
        namespace: &'a str,
        digest: &'a str,
        archive: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async move {
            let url = self.namespace_package_url(namespace, digest)?;
            let what = format!("stage the package {digest} for namespace {namespace}");
            let response = self
                .http
                .put(url)
                .header("Authorization", &self.bearer)
                .header(reqwest::header::CONTENT_TYPE, "application/gzip")
                .header(crate::artifacts::HEADER_CONTENT_DIGEST, crate::artifacts::sha256_digest(&archive))
                .body(archive)
                .send()
                .await;
            Self::answer(response, &what).await.map(drop)
        })
    }

    fn namespace_packages(&self) -> BoxFuture<'_, Result<Vec<crate::artifacts::NamespacePackage>, ArtifactError>> {
        Box::pin(async move {
            const WHAT: &str = "list the namespace packages";
            let url = format!("{}/namespaces/packages", self.base);
            let response = Self::answer(self.http.get(url).header("Authorization", &self.bearer).send().await, WHAT).await?;
            let body = response.bytes().await.map_err(|e| unreachable(WHAT, &e))?;
            serde_json::from_slice(&body).map_err(|e| ArtifactError::Invalid {
                what: WHAT.into(),
                detail: format!("the endpoint's answer is not a package list: {e}"),
            })
        })
    }

    fn delete_namespace_package<'a>(&'a self, namespace: &'a str, digest: &'a str) -> BoxFuture<'a, Result<bool, ArtifactError>> {
        Box::pin(async move {
            let what = format!("delete the package {digest} of namespace {namespace}");
            let url = self.namespace_package_url(namespace, digest)?;
            let response = Self::answer(self.http.delete(url).header("Authorization", &self.bearer).send().await, &what).await?;
            #[derive(serde::Deserialize)]
            struct Deleted {
                deleted: bool,
            }
            let body = response.bytes().await.map_err(|e| unreachable(&what, &e))?;
            serde_json::from_slice::<Deleted>(&body)
                .map(|d| d.deleted)
                .map_err(|e| ArtifactError::Invalid { what, detail: format!("the endpoint's answer is not a deletion: {e}") })
        })
    }

    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        warm_uid: &'a str,
        claim: &'a crate::artifacts::Claim,
    ) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async move {
            let what = format!("claim warm pod {warm_uid} for SkillJob {}", claim.skilljob_uid);
            let url = self.warm_url(namespace, warm_uid, "claim")?;
            let body = serde_json::to_vec(claim).map_err(|e| ArtifactError::Invalid { what: what.clone(), detail: e.to_string() })?;
            let response = self
                .http
                .put(url)
                .header("Authorization", &self.bearer)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await;
            Self::answer(response, &what).await.map(drop)
        })
    }

    fn claim_key<'a>(
        &'a self,
        namespace: &'a str,
        warm_uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::artifacts::sealed::ClaimKey>, ArtifactError>> {
        Box::pin(async move {
            let what = format!("read the key of warm pod {warm_uid}");
            let url = self.warm_url(namespace, warm_uid, "claim-key")?;
            let response = self.http.get(url).header("Authorization", &self.bearer).send().await;
            let response = match Self::answer(response, &what).await {
                Ok(r) => r,
                Err(ArtifactError::Refused { status: 404, .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            let invalid = |detail: String| ArtifactError::Invalid { what: what.clone(), detail };
            let bytes = response.bytes().await.map_err(|e| unreachable(&what, &e))?;
            if bytes.len() > crate::artifacts::sealed::CLAIM_KEY_MAX_BYTES {
                return Err(invalid(format!("{} bytes, more than a key", bytes.len())));
            }
            let key: crate::artifacts::sealed::ClaimKey = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
            key.validate().map_err(|e| invalid(e.to_string()))?;
            Ok(Some(key))
        })
    }

    fn follow_stored(&self) -> BoxFuture<'_, Result<StoredStream, ArtifactError>> {
        Box::pin(async move {
            use futures::StreamExt;
            const WHAT: &str = "follow stored outputs";
            let url = format!("{}/outputs/stored", self.base);
            let response = Self::answer(self.http.get(url).header("Authorization", &self.bearer).send().await, WHAT).await?;
            let chunks = response.bytes_stream();
            let lines = futures::stream::unfold((chunks, Vec::new()), |(mut chunks, mut buf)| async move {
                loop {
                    if let Some(end) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=end).collect();
                        return Some((Ok(line), (chunks, buf)));
                    }
                    if buf.len() > STORED_LINE_MAX {
                        let e = ArtifactError::Invalid { what: WHAT.into(), detail: format!("a line longer than {STORED_LINE_MAX} bytes") };
                        return Some((Err(e), (chunks, Vec::new())));
                    }
                    match chunks.next().await? {
                        Ok(bytes) => buf.extend_from_slice(&bytes),
                        Err(e) => return Some((Err(unreachable(WHAT, &e)), (chunks, Vec::new()))),
                    }
                }
            });
            // Keep-alive (empty) and `lagged` lines carry no job.
            let events = lines.filter_map(|line| async move {
                match line {
                    Ok(line) => serde_json::from_slice::<crate::artifacts::OutputsStored>(&line).ok().map(Ok),
                    Err(e) => Some(Err(e)),
                }
            });
            Ok(events.boxed())
        })
    }
}

/// An artifact store that keeps nothing (tests without an endpoint).
pub struct NoArtifacts;

impl ArtifactStore for NoArtifacts {
    fn output_file<'a>(&'a self, _: &'a str, _: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>> {
        Box::pin(async move { Err(ArtifactError::Unsupported(format!("read {path}"))) })
    }
    fn outputs<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, ArtifactError>> {
        Box::pin(async { Ok(None) })
    }
    fn stage_package<'a>(&'a self, _: &'a str, _: &'a str, _: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
    fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
    fn stage_namespace_package<'a>(&'a self, _: &'a str, _: &'a str, _: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
    fn namespace_packages(&self) -> BoxFuture<'_, Result<Vec<crate::artifacts::NamespacePackage>, ArtifactError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn delete_namespace_package<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<bool, ArtifactError>> {
        Box::pin(async { Ok(false) })
    }
    fn claim<'a>(&'a self, _: &'a str, _: &'a str, _: &'a crate::artifacts::Claim) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The endpoint's versioned API base (`…/v1`), whether or not the flag named it.
pub fn versioned_endpoint(endpoint: &str) -> String {
    match endpoint.trim_end_matches('/') {
        e if e.ends_with("/v1") => e.to_string(),
        e => format!("{e}/v1"),
    }
}

/// How the controller and gateway reach the artifact endpoint's built-in
/// store: the registry a SkillPackage names it by is the endpoint URL's own
/// `host:port` (the chart renders sample references exactly so, IP literal
/// when the ClusterIP is pinned, the Service name otherwise), plain HTTP when
/// the URL is `http`, and the operator credential derived from the key.
/// Harmless when the endpoint runs on an external registry: no reference
/// names the endpoint's address then.
pub struct StoreAccess {
    pub registry: String,
    pub plain_http: bool,
    pub auth: crate::oci::Auth,
}

pub fn store_access(endpoint: &str, key: &[u8]) -> Option<StoreAccess> {
    let uri: http::Uri = endpoint.parse().ok()?;
    let host = uri.host()?;
    let plain = uri.scheme_str() == Some("http");
    let port = uri.port_u16().unwrap_or(if plain { 80 } else { 443 });
    Some(StoreAccess {
        registry: format!("{host}:{port}"),
        plain_http: plain,
        auth: crate::oci::Auth::Bearer(format!("{}:{}", super::OPERATOR_SUBJECT, super::operator_token(key))),
    })
}

#[cfg(test)]
mod store_access_tests {
    #[test]
    fn the_registry_is_the_endpoint_urls_host_and_port() {
        let a = super::store_access("http://10.96.0.50:8443", b"k").unwrap();
        assert_eq!((a.registry.as_str(), a.plain_http), ("10.96.0.50:8443", true));
        let a = super::store_access("http://skills-skill-operator-artifacts.skill-operator.svc:8443/", b"k").unwrap();
        assert_eq!(a.registry, "skills-skill-operator-artifacts.skill-operator.svc:8443");
        let a = super::store_access("https://artifacts.example", b"k").unwrap();
        assert_eq!((a.registry.as_str(), a.plain_http), ("artifacts.example:443", false));
        assert!(super::store_access("not a url", b"k").is_none());
    }
}
