//! An image written to one tar file instead of pushed: for a cluster that
//! cannot reach the release registry (air-gapped, or from a clone before
//! the first release). `kind load image-archive`, `k3d image import`,
//! `minikube image load`, `ctr -n k8s.io images import` and `docker load`
//! all read it.
//!
//! # Format (decision)
//! One tar holding both an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) and Docker's `manifest.json` beside it, pointing at
//! the same blobs: what `docker save` writes since Docker 25. Why both:
//! containerd's importer (behind kind, k3d, minikube on containerd and
//! `ctr`) and Docker 25+ read the layout; Docker before 25 (minikube on the
//! docker runtime of older releases) reads only `manifest.json`. The image
//! is named in both (`io.containerd.image.name`, `RepoTags`), so no loader
//! needs a name from its caller. The documents are made as
//! [`super::compose`] makes them for a push ([`super::compose::documents`]):
//! the same spec archived or pushed gives the same manifest digest.
//!
//! # Nothing half-written
//! The tar is written to a temporary file beside the destination and
//! renamed over it only when complete; a failure leaves what was there.
//! Entries carry fixed owners, modes and times, so the same image gives a
//! byte-identical archive.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use super::base::{resolve_empty, BaseSpec, Platform};
use super::compose::{check_spec, documents, ComposeSpec};
use super::error::{ImageError, Result};
use super::remote::{OCI_INDEX, OCI_MANIFEST};

/// containerd's image-name annotation (what `ctr images import` names the
/// image after).
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI layout's reference-name annotation (the tag).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// What [`write`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Archived {
    pub path: PathBuf,
    /// `host/repository:tag`, as the loaders name the image.
    pub name: String,
    /// The manifest's digest (the same a push of this image gives).
    pub digest: String,
    pub platform: Platform,
    /// The archive's size in bytes.
    pub size: u64,
}

/// Writes the image `spec` describes to `out` (blocking). The base must be
/// empty (`image self`): an archive carries every layer, and a base's
/// layers are never downloaded here. `spec.tag` names the image.
pub fn write(spec: &ComposeSpec<'_>, out: &Path) -> Result<Archived> {
    check_spec(spec)?;
    let BaseSpec::Empty { platform } = &spec.base else {
        return Err(ImageError::invalid("an image archive is written only for an image on an empty base (`image self --archive`)"));
    };
    let tag = spec.tag.as_deref().ok_or_else(|| ImageError::invalid("an image archive needs a tag: loaders name the image by it"))?;
    let name = format!("{}:{tag}", spec.repository);
    let resolved = resolve_empty(platform);
    let docs = documents(spec, &resolved)?.pop().ok_or_else(|| ImageError::invalid("the empty base resolved to no image"))?;

    let index = super::json::canonical(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": docs.manifest_digest,
            "size": docs.manifest.len(),
            "platform": platform.to_json(),
            "annotations": { ANNOTATION_CONTAINERD_NAME: name, ANNOTATION_REF_NAME: tag },
        }],
    }));
    let docker = super::json::canonical(&json!([{
        "Config": blob_path(&docs.config_digest),
        "RepoTags": [name],
        "Layers": spec.layers.iter().map(|l| blob_path(&l.digest)).collect::<Vec<_>>(),
    }]));

    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let failed = |source: std::io::Error| ImageError::ArchiveWrite { path: out.to_path_buf(), source };
    let tmp = tempfile::Builder::new().prefix(".image-archive").tempfile_in(&dir).map_err(failed)?;
    {
        let mut tar = tar::Builder::new(BufWriter::new(tmp.as_file()));
        tar.mode(tar::HeaderMode::Deterministic);
        let mut bytes = |path: &str, data: &[u8]| append(&mut tar, path, data.len() as u64, data);
        bytes("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(failed)?;
        bytes(&blob_path(&docs.config_digest), &docs.config).map_err(failed)?;
        bytes(&blob_path(&docs.manifest_digest), &docs.manifest).map_err(failed)?;
        for layer in &spec.layers {
            let file = File::open(layer.path()).map_err(|e| ImageError::read(layer.path(), e))?;
            append(&mut tar, &blob_path(&layer.digest), layer.size, file).map_err(failed)?;
        }
        append(&mut tar, "index.json", index.len() as u64, index.as_slice()).map_err(failed)?;
        append(&mut tar, "manifest.json", docker.len() as u64, docker.as_slice()).map_err(failed)?;
        let mut w = tar.into_inner().map_err(failed)?;
        w.flush().map_err(failed)?;
    }
    tmp.as_file().sync_all().map_err(failed)?;
    let size = tmp.as_file().metadata().map_err(failed)?.len();
    tmp.persist(out).map_err(|e| failed(e.error))?;
    Ok(Archived { path: out.to_path_buf(), name, digest: docs.manifest_digest, platform: platform.clone(), size })
}

/// `blobs/sha256/<hex>` of `sha256:<hex>`.
fn blob_path(digest: &str) -> String {
    format!("blobs/{}", digest.replacen(':', "/", 1))
}

fn append<W: Write>(tar: &mut tar::Builder<W>, path: &str, size: u64, data: impl std::io::Read) -> std::io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, path, data)
}
