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
use std::io::Write;

use super::error::{ImageError, Result};
use super::gzip::HashingWriter;
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
///
/// NB: written component by component rather than as one
/// `serde_json::Value` tree: a tree costs ~5 KiB per file (a BTreeMap node
/// per object), which for a dependency layer of thousands of files was
/// most of the composer's peak memory. Each component is canonical on its
/// own, and the outer keys are written in sorted order, so the result is
/// the same canonical JSON as [`canonical`] of the whole.
pub fn cyclonedx(repository: &str, digest: &str, layers: &[&Layer], deps: &[Dependency]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4096);
    // Writing into a Vec cannot fail.
    let _ = write_cyclonedx(&mut out, repository, digest, layers, deps);
    out
}

/// [`cyclonedx`] into any writer (compose spools it to a file, so its
/// memory does not grow with the number of files).
pub fn write_cyclonedx(out: &mut dyn Write, repository: &str, digest: &str, layers: &[&Layer], deps: &[Dependency]) -> std::io::Result<()> {
    out.write_all(br#"{"bomFormat":"CycloneDX","components":["#)?;
    let mut first = true;
    let mut push = |out: &mut dyn Write, v: Value| -> std::io::Result<()> {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        out.write_all(&canonical(&v))
    };
    for layer in layers {
        for f in &layer.files {
            let component = json!({
                "type": "file",
                "bom-ref": format!("file:{}", f.path),
                "name": f.path,
                "hashes": [{ "alg": "SHA-256", "content": f.sha256 }],
                "properties": [
                    { "name": "dev.skill-operator:layer", "value": layer.digest },
                    { "name": "dev.skill-operator:size", "value": f.size.to_string() },
                    { "name": "dev.skill-operator:executable", "value": f.executable.to_string() },
                ],
            });
            push(out, component)?;
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
        let component = json!({
            "type": "library",
            "bom-ref": d.purl,
            "name": d.name,
            "version": d.version,
            "purl": d.purl,
            "properties": [{ "name": "dev.skill-operator:ecosystem", "value": group }],
        });
        push(out, component)?;
    }
    let metadata = json!({
        "tools": { "components": [{ "type": "application", "name": "skill-operator", "version": env!("CARGO_PKG_VERSION") }] },
        "component": {
            "type": "container",
            "bom-ref": format!("{repository}@{digest}"),
            "name": repository,
            "version": digest,
        },
    });
    out.write_all(br#"],"metadata":"#)?;
    out.write_all(&canonical(&metadata))?;
    out.write_all(br#","specVersion":"1.5","version":1}"#)
}

/// An SBOM written to a spool file: its digest and size (the file is
/// deleted on drop).
#[derive(Debug)]
pub struct SpooledSbom {
    pub digest: String,
    pub size: u64,
    file: tempfile::TempPath,
}

/// Writes the SBOM into a temporary file in `dir`.
pub fn spool(dir: &std::path::Path, repository: &str, digest: &str, layers: &[&Layer], deps: &[Dependency]) -> Result<SpooledSbom> {
    let err = |source| ImageError::Spool { dir: dir.to_path_buf(), source };
    let (file, path) =
        tempfile::Builder::new().prefix("skill-operator-sbom-").suffix(".cdx.json").tempfile_in(dir).map_err(err)?.into_parts();
    let mut w = HashingWriter::new(std::io::BufWriter::new(file), u64::MAX);
    write_cyclonedx(&mut w, repository, digest, layers, deps).map_err(err)?;
    w.flush().map_err(err)?;
    let (digest, size, _) = w.finish();
    Ok(SpooledSbom { digest, size, file: path })
}

/// Pushes `sbom` as a referrer of the image (`subject_*`) in `target`'s
/// repository, plus the fallback tags; see the module docs.
pub async fn attach(
    remote: &Remote,
    target: &Reference,
    subject_media_type: &str,
    subject_digest: &str,
    subject_size: u64,
    sbom: &SpooledSbom,
) -> Result<SbomRef> {
    remote.ensure_file_blob(target, &sbom.file, &sbom.digest, sbom.size).await?;
    let blob_digest = sbom.digest.clone();
    let empty_digest = remote.ensure_bytes_blob(target, b"{}").await?;
    let manifest = canonical(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": SBOM_MEDIA_TYPE,
        "config": { "mediaType": EMPTY_MEDIA_TYPE, "digest": empty_digest, "size": 2 },
        "layers": [{ "mediaType": SBOM_MEDIA_TYPE, "digest": blob_digest, "size": sbom.size, "annotations": { ANNOTATION_TITLE: "sbom.cdx.json" } }],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_document_is_canonical_json() {
        let deps = vec![Dependency { ecosystem: Ecosystem::Npm, name: "a".into(), version: "1".into(), purl: "pkg:npm/a@1".into() }];
        let doc = cyclonedx("r/x", "sha256:00", &[], &deps);
        let v: Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(canonical(&v), doc);
        assert_eq!(v["components"][0]["purl"], "pkg:npm/a@1");
    }
}
