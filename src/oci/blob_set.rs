//! Job file sets: one layer per file, pushed whole or file by file, read whole or file by file.

use crate::core::package::{self, PackageError};
use futures::StreamExt;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::RegistryOperation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::*;

/// One file of a job file set, as its manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetFile {
    /// Relative `/`-separated path (the layer's `org.opencontainers.image.title`).
    pub path: String,
    pub size: u64,
    /// `sha256:<hex>` of the content.
    pub digest: String,
}

impl SetFile {
    pub(super) fn descriptor(&self) -> OciDescriptor {
        OciDescriptor {
            media_type: JOB_FILE_MEDIA_TYPE.into(),
            digest: self.digest.clone(),
            size: i64::try_from(self.size).unwrap_or(i64::MAX),
            annotations: Some(BTreeMap::from([(ANNOTATION_TITLE.to_string(), self.path.clone())])),
            ..Default::default()
        }
    }
}

/// A job file set's manifest, read by [`Registry::blob_set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobSet {
    /// `sha256:…` of the manifest.
    pub digest: String,
    /// Sorted by path.
    pub files: Vec<SetFile>,
    pub annotations: BTreeMap<String, String>,
}

impl Registry {
    // -- job file sets ------------------------------------------------------

    /// Pushes files (path, bytes) as a job file set; returns the manifest
    /// digest. Paths follow the package path rules; caps are checked before
    /// anything is uploaded.
    pub async fn push_blob_set(&self, reference: &str, mut files: Vec<(String, Vec<u8>)>) -> Result<String> {
        let r = parse_ref(reference)?;
        package::check_file_set(files.iter().map(|(p, d)| (p.as_str(), d.len() as u64)), &self.opts.limits.files)?;
        files.sort_by(|a, b| a.0.cmp(&b.0));
        self.authenticate(&r, RegistryOperation::Push).await?;

        let layers: Vec<OciDescriptor> = files.iter().map(|(p, d)| descriptor(JOB_FILE_MEDIA_TYPE, d, Some(p.clone()))).collect();
        let mut unique: BTreeMap<&str, &[u8]> = BTreeMap::new();
        for (l, (_, d)) in layers.iter().zip(&files) {
            unique.insert(&l.digest, d);
        }
        unique.insert(OCI_EMPTY_DIGEST, b"{}");
        let uploads = futures::stream::iter(unique)
            .map(|(digest, data)| {
                let r = &r;
                async move { self.upload(r, data, digest, Upload::IfMissing).await }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        uploads.into_iter().collect::<Result<Vec<_>>>()?;

        self.put_manifest(&r, &file_set_manifest(layers, BTreeMap::new())).await
    }

    /// Pulls a job file set: (manifest digest, files sorted by path). Every
    /// path and size is checked from the manifest before any download.
    pub async fn pull_blob_set(&self, reference: &str) -> Result<(String, Vec<(String, Vec<u8>)>)> {
        let r = parse_ref(reference)?;
        let set = self.blob_set(reference).await?;
        let fetched = futures::stream::iter(set.files)
            .map(|f| {
                let r = &r;
                async move {
                    let data = self.fetch_blob(r, &f.descriptor(), &format!("job file {}", f.path)).await?;
                    Ok::<_, OciError>((f.path, data))
                }
            })
            .buffered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let mut files = fetched.into_iter().collect::<Result<Vec<_>>>()?;
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((set.digest, files))
    }

    /// Reads a job file set's manifest without downloading any file: the
    /// same checks as [`Registry::pull_blob_set`] (artifact type, titles,
    /// sha256 digests, path rules, caps). Files sorted by path.
    pub async fn blob_set(&self, reference: &str) -> Result<BlobSet> {
        let r = parse_ref(reference)?;
        let token = self.authenticate(&r, RegistryOperation::Pull).await?;
        let (body, digest) = self.fetch_manifest(&r, token.as_deref()).await?;
        let m = parse_manifest(reference, &body)?;
        let artifact_type = m.artifact_type.clone().unwrap_or_default();
        if m.is_index() || artifact_type != JOB_FILES_ARTIFACT_TYPE {
            return Err(OciError::UnsupportedArtifact {
                reference: reference.into(),
                artifact_type,
                detail: format!("expected a job file set ({JOB_FILES_ARTIFACT_TYPE})"),
            });
        }
        let lim = &self.opts.limits.files;
        if m.layers.len() > lim.max_files {
            return Err(PackageError::TooManyFiles { limit: lim.max_files }.into());
        }
        let mut files = Vec::with_capacity(m.layers.len());
        for l in &m.layers {
            let path = l.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TITLE)).cloned().ok_or_else(|| OciError::InvalidManifest {
                reference: reference.into(),
                detail: format!("layer {} has no {ANNOTATION_TITLE} annotation", l.digest),
            })?;
            check_digest(&l.digest)?;
            let size = u64::try_from(l.size)
                .map_err(|_| OciError::InvalidManifest { reference: reference.into(), detail: "negative size".into() })?;
            files.push(SetFile { path, size, digest: l.digest.clone() });
        }
        package::check_file_set(files.iter().map(|f| (f.path.as_str(), f.size)), lim)?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(BlobSet { digest, files, annotations: m.annotations })
    }

    /// Downloads one file of a job file set (as listed by
    /// [`Registry::blob_set`]): its size is capped by the descriptor and its
    /// sha256 checked against it.
    pub async fn pull_set_file(&self, reference: &str, file: &SetFile) -> Result<Vec<u8>> {
        let r = parse_ref(reference)?;
        let lim = &self.opts.limits.files;
        if file.size > lim.max_file_bytes {
            return Err(OciError::TooLarge { what: format!("job file {}", file.path), size: file.size, limit: lim.max_file_bytes });
        }
        self.authenticate(&r, RegistryOperation::Pull).await?;
        self.fetch_blob(&r, &file.descriptor(), &format!("job file {}", file.path)).await
    }

    /// Uploads one blob into the reference's repository (skipped when the
    /// registry has it already) and returns its digest; for building a job
    /// file set file by file with [`Registry::push_set_manifest`].
    pub async fn push_set_blob(&self, reference: &str, data: &[u8]) -> Result<String> {
        let r = parse_ref(reference)?;
        let lim = &self.opts.limits.files;
        if data.len() as u64 > lim.max_file_bytes {
            return Err(OciError::TooLarge { what: "job file".into(), size: data.len() as u64, limit: lim.max_file_bytes });
        }
        self.authenticate(&r, RegistryOperation::Push).await?;
        let digest = sha256_digest(data);
        self.upload(&r, data, &digest, Upload::IfMissing).await?;
        Ok(digest)
    }

    /// Writes a job file set manifest over blobs already pushed (with
    /// [`Registry::push_set_blob`]); returns the manifest digest. Paths and
    /// caps are checked as in [`Registry::push_blob_set`]. `annotations`
    /// go on the manifest: distinct annotations keep two sets with the same
    /// files from sharing one manifest (and one fate on delete).
    pub async fn push_set_manifest(
        &self,
        reference: &str,
        mut files: Vec<SetFile>,
        annotations: BTreeMap<String, String>,
    ) -> Result<String> {
        let r = parse_ref(reference)?;
        package::check_file_set(files.iter().map(|f| (f.path.as_str(), f.size)), &self.opts.limits.files)?;
        for f in &files {
            check_digest(&f.digest)?;
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        self.authenticate(&r, RegistryOperation::Push).await?;
        self.upload(&r, b"{}", OCI_EMPTY_DIGEST, Upload::IfMissing).await?;
        self.put_manifest(&r, &file_set_manifest(files.iter().map(SetFile::descriptor).collect(), annotations)).await
    }

    /// Deletes the manifest a reference resolves to (by digest, which
    /// distribution requires; every tag on that manifest goes with it).
    /// `Ok(false)` when there is nothing to delete. Blobs stay until the
    /// registry's garbage collection runs. The registry must allow deletes
    /// (distribution: `storage.delete.enabled: true`).
    pub async fn delete(&self, reference: &str) -> Result<bool> {
        let r = parse_ref(reference)?;
        let token = self.authenticate(&r, RegistryOperation::Push).await?;
        let digest = match self.fetch_manifest(&r, token.as_deref()).await {
            Ok((_, d)) => d,
            Err(OciError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let registry = r.resolve_registry().to_string();
        let scheme = if self.opts.plain_http.iter().any(|h| h == &registry) { "http" } else { "https" };
        let url = format!("{scheme}://{registry}/v2/{}/manifests/{digest}", r.repository());
        let req = self.signed(self.http.delete(&url), token.as_deref(), &r);
        let resp = req.send().await.map_err(|e| map_reqwest_error(&r, e))?;
        let status = resp.status();
        match status {
            s if s.is_success() => Ok(true),
            reqwest::StatusCode::NOT_FOUND => Ok(false),
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
                Err(OciError::Auth { registry, detail: format!("HTTP {status} on DELETE {url}") })
            }
            reqwest::StatusCode::METHOD_NOT_ALLOWED => Err(OciError::Registry {
                reference: r.whole(),
                detail: "the registry does not allow deletes (distribution: set storage.delete.enabled: true)".into(),
            }),
            _ => Err(OciError::Registry { reference: r.whole(), detail: format!("HTTP {status} on DELETE {url}") }),
        }
    }
}

/// A job file set's manifest: the empty config, one layer per file.
pub(super) fn file_set_manifest(layers: Vec<OciDescriptor>, annotations: BTreeMap<String, String>) -> OciImageManifest {
    OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
        config: OciDescriptor { media_type: OCI_EMPTY_MEDIA_TYPE.into(), digest: OCI_EMPTY_DIGEST.into(), size: 2, ..Default::default() },
        layers,
        subject: None,
        artifact_type: Some(JOB_FILES_ARTIFACT_TYPE.into()),
        annotations: if annotations.is_empty() { None } else { Some(annotations) },
    }
}
