//! Request bodies: spooled to a temporary file under an explicit limit, tar batches scanned, answers built.

use super::super::{ArtifactLimits, HEADER_CONTENT_DIGEST, HEADER_SET_DIGEST};
use crate::core::package::{self};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::RequestExt;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io::Seek;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

use super::super::ErrorCode;
use super::*;

// -- bodies -------------------------------------------------------------------

pub(super) struct Spooled {
    pub(super) file: Arc<std::fs::File>,
    pub(super) len: u64,
    pub(super) digest: String,
}

/// One regular file inside a spooled tar.
#[derive(Debug, Clone)]
pub(super) struct SpoolEntry {
    pub(super) path: String,
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) digest: String,
}

/// Streams a request body into an unnamed temp file (see module docs).
pub(super) async fn spool(state: &AppState, req: Request, limit: u64, what: &str) -> Result<Spooled, ApiError> {
    let over = || ApiError::too_large(ErrorCode::BodyTooLarge, format!("{what} is larger than {limit} bytes"));
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit + DRAIN_SLACK) {
        return Err(over());
    }
    let claimed = claimed_digest(&req, what)?;
    let file = tempfile::tempfile_in(&state.0.spool_dir).map_err(|e| internal(format!("spool file: {e}")))?;
    let mut out = tokio::fs::File::from_std(file.try_clone().map_err(internal)?);
    let mut stream = req.with_limited_body().into_body().into_data_stream();
    let mut n = 0u64;
    let mut h = Sha256::new();
    let mut overflow = false;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) if overflow || is_length_limit(&e) => return Err(over()),
            // The spool file is unnamed: dropping it here frees its space.
            Err(e) if crate::listener::is_body_timeout(&e) => {
                return Err(ApiError::new(ErrorCode::BodyTooSlow, format!("the {what}: {e}")))
            }
            Err(_) => return Err(ApiError::bad(ErrorCode::BadBody, format!("reading the {what} failed"))),
        };
        n += chunk.len() as u64;
        if n > limit {
            // Read on (discarding) so the client gets to see the answer.
            overflow = true;
            if n > limit + DRAIN_SLACK {
                return Err(over());
            }
            continue;
        }
        h.update(&chunk);
        out.write_all(&chunk).await.map_err(|e| internal(format!("spool write: {e}")))?;
    }
    if overflow {
        return Err(over());
    }
    out.flush().await.map_err(internal)?;
    let digest = format!("sha256:{}", hex::encode(h.finalize()));
    if let Some(claimed) = claimed {
        if claimed != digest {
            return Err(ApiError::bad(
                ErrorCode::ContentDigestMismatch,
                format!("the {what} has digest {digest}, but {HEADER_CONTENT_DIGEST} says {claimed}: nothing was stored; send the header the body has"),
            ));
        }
    }
    Ok(Spooled { file: Arc::new(file), len: n, digest })
}

/// The `X-Content-Digest` a PUT carries, checked for shape before the body is read.
fn claimed_digest(req: &Request, what: &str) -> Result<Option<String>, ApiError> {
    let Some(value) = req.headers().get(HEADER_CONTENT_DIGEST) else { return Ok(None) };
    let bad = || {
        ApiError::bad(ErrorCode::ContentDigestMismatch, format!("{HEADER_CONTENT_DIGEST} of the {what} is not `sha256:<64 lowercase hex>`"))
    };
    let value = value.to_str().map_err(|_| bad())?.trim();
    let hex = value.strip_prefix("sha256:").ok_or_else(bad)?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(bad());
    }
    Ok(Some(value.to_string()))
}

pub(super) fn is_length_limit(e: &axum::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Lists the regular files of a spooled tar with offsets and digests.
/// Directory entries are ignored; links and special entries are refused.
pub(super) fn scan_tar(file: &std::fs::File, max_entries: usize) -> Result<Vec<SpoolEntry>, ApiError> {
    struct HashWriter(Sha256);
    impl std::io::Write for HashWriter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let not_tar = |e: std::io::Error| ApiError::bad(ErrorCode::BadTar, format!("the body is not a readable tar: {e}"));
    let mut f = file.try_clone().map_err(internal)?;
    f.rewind().map_err(internal)?;
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(256 * 1024, f));
    let mut out: Vec<SpoolEntry> = Vec::new();
    let mut seen = HashSet::new();
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        match entry.header().entry_type() {
            tar::EntryType::Regular => {}
            tar::EntryType::Directory => continue,
            other => {
                return Err(ApiError::bad(
                    ErrorCode::BadTar,
                    format!("tar entry {} is a {other:?}; only regular files are accepted", String::from_utf8_lossy(&entry.path_bytes())),
                ))
            }
        }
        if out.len() >= max_entries {
            return Err(ApiError::too_large(ErrorCode::TooManyFiles, format!("more than {max_entries} entries")));
        }
        let path = String::from_utf8(entry.path_bytes().into_owned())
            .map_err(|_| ApiError::bad(ErrorCode::BadPath, "a tar entry name is not UTF-8"))?;
        if !seen.insert(path.clone()) {
            return Err(ApiError::bad(ErrorCode::BadTar, format!("tar entry {path} appears twice")));
        }
        let offset = entry.raw_file_position();
        let size = entry.size();
        let mut h = HashWriter(Sha256::new());
        let copied = std::io::copy(&mut entry, &mut h).map_err(not_tar)?;
        if copied != size {
            return Err(ApiError::bad(ErrorCode::BadTar, format!("tar entry {path} is cut short")));
        }
        out.push(SpoolEntry { path, offset, size, digest: format!("sha256:{}", hex::encode(h.0.finalize())) });
    }
    Ok(out)
}

pub(super) fn read_entry(file: &std::fs::File, e: &SpoolEntry) -> Result<Vec<u8>, ApiError> {
    let mut buf = vec![0u8; e.size as usize];
    file.read_exact_at(&mut buf, e.offset).map_err(internal)?;
    Ok(buf)
}

/// Checks input paths and the per-job caps; 413 for caps, 400 for names.
pub(super) fn check_work_set<'a>(files: impl Iterator<Item = (&'a str, u64)> + Clone, l: &ArtifactLimits) -> Result<(), ApiError> {
    let mut count = 0usize;
    let mut total = 0u64;
    for (path, size) in files.clone() {
        rel_path(path)?;
        count += 1;
        if count > l.max_files {
            return Err(ApiError::too_large(ErrorCode::TooManyFiles, format!("more than {} files", l.max_files)));
        }
        if size > l.max_file_bytes {
            return Err(ApiError::too_large(
                ErrorCode::FileTooLarge,
                format!("{path} is {size} bytes, over the {}-byte cap", l.max_file_bytes),
            ));
        }
        total += size;
        if total > l.max_total_bytes {
            return Err(ApiError::too_large(ErrorCode::TotalTooLarge, format!("files add up to more than {} bytes", l.max_total_bytes)));
        }
    }
    package::check_file_set(files, &l.file_set()).map_err(file_set_error)
}

pub(super) fn bytes_response(data: Vec<u8>, content_type: &'static str, digest: &str, set_digest: Option<&str>) -> Response {
    let mut resp = Response::new(Body::from(data));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(digest) {
        h.insert(HEADER_CONTENT_DIGEST, v);
    }
    if let Some(v) = set_digest.and_then(|s| HeaderValue::from_str(s).ok()) {
        h.insert(HEADER_SET_DIGEST, v);
    }
    resp
}
