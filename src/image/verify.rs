//! Verifying a pushed image end to end: every manifest, config and layer
//! is downloaded (streamed, never held whole) and checked: manifest and
//! blob digests and sizes against their descriptors, and for gzip layers
//! the uncompressed sha256 against the config's `rootfs.diff_ids`. A blob
//! changed in the registry's storage fails here with a digest mismatch.
//!
//! Decompression and hashing run on a blocking thread fed through a
//! bounded channel, so neither memory nor the async workers are held by a
//! large layer.

use futures::StreamExt;
use oci_client::Reference;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Write;

use super::error::{blocking, ImageError, Result};
use super::gzip::HashingWriter;
use super::layer::LAYER_MEDIA_TYPE;
use super::limits::MAX_INDEX_ENTRIES;
use super::remote::{parse_ref, Remote, DOCKER_LIST, OCI_INDEX};

/// What [`verify`] checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub manifests: u64,
    pub layers: u64,
    pub bytes: u64,
}

/// Downloads and checks everything `reference` points at.
pub async fn verify(remote: &Remote, reference: &str) -> Result<VerifyReport> {
    let r = parse_ref(reference)?;
    let top = remote.get_manifest(&r).await?;
    let v: Value = json(&top.body, reference)?;
    let mut report = VerifyReport::default();
    let mt = v.get("mediaType").and_then(Value::as_str).unwrap_or("");
    if mt == OCI_INDEX || mt == DOCKER_LIST || v.get("manifests").is_some() {
        report.manifests += 1;
        let entries = v.get("manifests").and_then(Value::as_array).cloned().unwrap_or_default();
        if entries.len() > MAX_INDEX_ENTRIES {
            return Err(ImageError::Verify { what: reference.into(), detail: format!("{} index entries", entries.len()) });
        }
        for e in entries {
            let d = e.get("digest").and_then(Value::as_str).unwrap_or_default().to_string();
            let mr = r.clone_with_digest(d);
            let m = remote.get_manifest(&mr).await?;
            let expected = e.get("size").and_then(Value::as_u64);
            if expected != Some(m.body.len() as u64) {
                return Err(ImageError::Verify {
                    what: format!("manifest {}", m.digest),
                    detail: format!("index says {expected:?} bytes, got {}", m.body.len()),
                });
            }
            verify_manifest(remote, &mr, &json(&m.body, reference)?, &mut report).await?;
        }
    } else {
        verify_manifest(remote, &r, &v, &mut report).await?;
    }
    Ok(report)
}

fn json(body: &[u8], what: &str) -> Result<Value> {
    serde_json::from_slice(body).map_err(|e| ImageError::Verify { what: what.into(), detail: format!("not JSON: {e}") })
}

async fn verify_manifest(remote: &Remote, r: &Reference, m: &Value, report: &mut VerifyReport) -> Result<()> {
    report.manifests += 1;
    let what = r.whole();
    let bad = |detail: String| ImageError::Verify { what: what.clone(), detail };
    let cfg = m.get("config").ok_or_else(|| bad("no config".into()))?;
    let cd = cfg.get("digest").and_then(Value::as_str).ok_or_else(|| bad("config without digest".into()))?;
    let cs = cfg.get("size").and_then(Value::as_u64).ok_or_else(|| bad("config without size".into()))?;
    let config: Value = json(&remote.get_config(r, cd, cs).await?, &what)?;
    let diff_ids: Vec<String> = config
        .pointer("/rootfs/diff_ids")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let layers = m.get("layers").and_then(Value::as_array).cloned().unwrap_or_default();
    if diff_ids.len() != layers.len() {
        return Err(bad(format!("{} layers but {} diff_ids", layers.len(), diff_ids.len())));
    }
    for (l, diff_id) in layers.iter().zip(diff_ids) {
        let digest = l.get("digest").and_then(Value::as_str).ok_or_else(|| bad("layer without digest".into()))?.to_string();
        let size = l.get("size").and_then(Value::as_u64).ok_or_else(|| bad("layer without size".into()))?;
        let gzip = matches!(
            l.get("mediaType").and_then(Value::as_str),
            Some(LAYER_MEDIA_TYPE | "application/vnd.docker.image.rootfs.diff.tar.gzip")
        );
        verify_layer(remote, r, &digest, size, gzip.then_some(diff_id)).await?;
        report.layers += 1;
        report.bytes += size;
    }
    Ok(())
}

async fn verify_layer(remote: &Remote, r: &Reference, digest: &str, size: u64, diff_id: Option<String>) -> Result<()> {
    let mut stream = remote.blob_stream(r, digest, size).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
    let want_digest = digest.to_string();
    let checker = blocking(move || {
        let mut hasher = Sha256::new();
        let mut count = 0u64;
        let mut gunzip = diff_id.as_ref().map(|_| flate2::write::GzDecoder::new(HashingWriter::new(std::io::sink(), u64::MAX)));
        let mut inflate_error = None;
        while let Some(chunk) = rx.blocking_recv() {
            hasher.update(&chunk);
            count += chunk.len() as u64;
            if let (Some(g), None) = (gunzip.as_mut(), &inflate_error) {
                if let Err(e) = g.write_all(&chunk) {
                    inflate_error = Some(e);
                }
            }
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if count != size {
            return Err(
                crate::oci::OciError::SizeMismatch { what: "layer".into(), digest: want_digest, expected: size, actual: count }.into()
            );
        }
        if actual != want_digest {
            return Err(crate::oci::OciError::DigestMismatch { what: "layer".into(), expected: want_digest, actual }.into());
        }
        if let (Some(g), Some(diff_id)) = (gunzip, diff_id) {
            if let Some(e) = inflate_error {
                return Err(ImageError::Verify { what: format!("layer {want_digest}"), detail: format!("not valid gzip: {e}") });
            }
            let inner = g
                .finish()
                .map_err(|e| ImageError::Verify { what: format!("layer {want_digest}"), detail: format!("not valid gzip: {e}") })?;
            let (got, _, _) = inner.finish();
            if got != diff_id {
                return Err(ImageError::Verify {
                    what: format!("layer {want_digest}"),
                    detail: format!("uncompressed content hashes to {got}, config diff_id says {diff_id}"),
                });
            }
        }
        Ok(())
    });
    // Feed the checker; a download error (oci-client's own digest check
    // fails the stream's end) is remembered, and the checker's more precise
    // verdict wins when it has one.
    let mut download_error = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                if tx.send(c).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                download_error = Some(e);
                break;
            }
        }
    }
    drop(tx);
    checker.await?;
    if let Some(e) = download_error {
        return Err(ImageError::Verify { what: format!("layer {digest}"), detail: format!("download failed: {e}") });
    }
    Ok(())
}
