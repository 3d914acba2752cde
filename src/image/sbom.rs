//! The SBOM of a composed image: a CycloneDX 1.5 JSON document listing
//! every file of the new layers (path, sha256) and every installed
//! dependency (name, version, purl), attached as an OCI 1.1 referrer.
//!
//! # Why CycloneDX 1.5, not SPDX 2.3
//! SPDX 2.3 makes a SHA-1 checksum mandatory for every file; we hash with
//! SHA-256 only (what OCI and our packages use) and would have to hash
//! every file twice to be valid. CycloneDX takes SHA-256 file hashes as
//! they are, has first-class purls for PyPI and npm components, and its
//! optional `serialNumber`/`timestamp` can be left out, so the document
//! (and its digest) is a pure function of the image: Trivy, Grype and
//! Dependency-Track read it.
//!
//! # Attaching (OCI 1.1 distribution spec, "referrers tag schema")
//! The SBOM blob goes under an artifact manifest: `artifactType`
//! `application/vnd.cyclonedx+json`, the empty config, one layer, and
//! `subject` = the composed image's top manifest or index. Registries with
//! a referrers API index it from `subject`; for those without
//! (distribution 2.8 has none) the fallback tag `sha256-<hex>` of the
//! subject is an index of its referrers, which we read, extend and push
//! back. We also tag the SBOM manifest `sha256-<hex>.sbom` (the
//! cosign-style name tools look for). The SBOM manifest's digest is in
//! [`SbomRef`], in the compose result.

use oci_client::Reference;
use serde_json::{json, Value};

use super::deps::{Dependency, Ecosystem};
use super::error::Result;
use super::json::canonical;
use super::layer::Layer;
use super::remote::{Remote, OCI_INDEX, OCI_MANIFEST};

pub const SBOM_MEDIA_TYPE: &str = "application/vnd.cyclonedx+json";
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";

/// Where the SBOM went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SbomRef {
    /// The SBOM artifact manifest's digest.
    pub manifest_digest: String,
    /// The CycloneDX blob's digest.
    pub blob_digest: String,
    /// `sha256-<hex>`: the subject's referrers index (fallback tag).
    pub referrers_tag: String,
    /// `sha256-<hex>.sbom`: the SBOM manifest itself.
    pub sbom_tag: String,
}

/// The CycloneDX document for an image `repository@digest` whose new
/// layers are `layers`.
pub fn cyclonedx(repository: &str, digest: &str, layers: &[&Layer], deps: &[Dependency]) -> Vec<u8> {
    let mut components = Vec::new();
    for layer in layers {
        for f in &layer.files {
            components.push(json!({
                "type": "file",
                "bom-ref": format!("file:{}", f.path),
                "name": f.path,
                "hashes": [{ "alg": "SHA-256", "content": f.sha256 }],
                "properties": [
                    { "name": "dev.skill-operator:layer", "value": layer.digest },
                    { "name": "dev.skill-operator:size", "value": f.size.to_string() },
                    { "name": "dev.skill-operator:executable", "value": f.executable.to_string() },
                ],
            }));
        }
    }
    let mut deps: Vec<&Dependency> = deps.iter().collect();
    deps.sort();
    deps.dedup();
    for d in deps {
        let group = match d.ecosystem {
            Ecosystem::Pypi => "pypi",
            Ecosystem::Npm => "npm",
        };
        components.push(json!({
            "type": "library",
            "bom-ref": d.purl,
            "name": d.name,
            "version": d.version,
            "purl": d.purl,
            "properties": [{ "name": "dev.skill-operator:ecosystem", "value": group }],
        }));
    }
    let doc = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "tools": { "components": [{ "type": "application", "name": "skill-operator", "version": env!("CARGO_PKG_VERSION") }] },
            "component": {
                "type": "container",
                "bom-ref": format!("{repository}@{digest}"),
                "name": repository,
                "version": digest,
            },
        },
        "components": components,
    });
    canonical(&doc)
}

/// Pushes `sbom` as a referrer of the image (`subject_*`) in `target`'s
/// repository, plus the fallback tags; see the module docs.
pub async fn attach(
    remote: &Remote,
    target: &Reference,
    subject_media_type: &str,
    subject_digest: &str,
    subject_size: u64,
    sbom: &[u8],
) -> Result<SbomRef> {
    let blob_digest = remote.ensure_bytes_blob(target, sbom).await?;
    let empty_digest = remote.ensure_bytes_blob(target, b"{}").await?;
    let manifest = canonical(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": SBOM_MEDIA_TYPE,
        "config": { "mediaType": EMPTY_MEDIA_TYPE, "digest": empty_digest, "size": 2 },
        "layers": [{ "mediaType": SBOM_MEDIA_TYPE, "digest": blob_digest, "size": sbom.len(), "annotations": { ANNOTATION_TITLE: "sbom.cdx.json" } }],
        "subject": { "mediaType": subject_media_type, "digest": subject_digest, "size": subject_size },
    }));
    let hex = subject_digest.trim_start_matches("sha256:");
    let sbom_tag = format!("sha256-{hex}.sbom");
    let manifest_digest = remote.ensure_manifest(target, Some(&sbom_tag), &manifest, OCI_MANIFEST).await?;

    // The referrers index at the fallback tag: existing entries kept.
    let referrers_tag = format!("sha256-{hex}");
    let tag_ref = Reference::with_tag(target.registry().into(), target.repository().into(), referrers_tag.clone());
    let mut entries: Vec<Value> = match remote.get_manifest(&tag_ref).await {
        Ok(f) => serde_json::from_slice::<Value>(&f.body)
            .ok()
            .and_then(|v| v.get("manifests").and_then(Value::as_array).cloned())
            .unwrap_or_default(),
        Err(super::error::ImageError::Registry(crate::oci::OciError::NotFound { .. })) => Vec::new(),
        Err(e) => return Err(e),
    };
    if !entries.iter().any(|e| e.get("digest").and_then(Value::as_str) == Some(manifest_digest.as_str())) {
        entries
            .push(json!({ "mediaType": OCI_MANIFEST, "digest": manifest_digest, "size": manifest.len(), "artifactType": SBOM_MEDIA_TYPE }));
    }
    entries.sort_by(|a, b| a.get("digest").and_then(Value::as_str).cmp(&b.get("digest").and_then(Value::as_str)));
    let index = canonical(&json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries }));
    remote.ensure_manifest(target, Some(&referrers_tag), &index, OCI_INDEX).await?;
    tracing::debug!(%manifest_digest, subject = subject_digest, "attached SBOM");
    Ok(SbomRef { manifest_digest, blob_digest, referrers_tag, sbom_tag })
}
