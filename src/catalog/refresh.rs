//! `catalog refresh`: replace the stored catalog with one from an HTTPS URL
//! or a file, only once the new one is read whole and checked. On any
//! failure the stored catalog is untouched and the error says why.
//!
//! [`fetch`] is the reading and checking, shared by every store: a local
//! file ([`refresh`]) and the cluster's ConfigMap
//! ([`super::cluster::ClusterStore::replace`], async).

use std::io::Read;
use std::time::Duration;

use super::model::{Catalog, CatalogError, MAX_CATALOG_BYTES};
use super::store::CatalogStore;
use crate::core::limits::bytes_text;

/// A download that takes longer has stalled (a catalog is a few MiB).
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("{url}: plain http can be altered on the way; give an https:// URL or a file")]
    PlainHttp { url: String },
    #[error("{url}: only https:// URLs and files are read")]
    Scheme { url: String },
    #[error("cannot download {url}: {detail}")]
    Download { url: String, detail: String },
    #[error("{url} answered {status}")]
    Status { url: String, status: u16 },
    #[error("{from} is larger than {}; it is not a skill catalog", bytes_text(MAX_CATALOG_BYTES))]
    TooLarge { from: String },
    #[error("cannot read {from}: {cause}")]
    Read { from: String, cause: std::io::Error },
    #[error("{from} is not a usable catalog: {cause}")]
    Invalid { from: String, cause: CatalogError },
    #[error("cannot store the new catalog: {0}")]
    Store(CatalogError),
}

/// Read `from` (https URL, `file://` URL or path), check it, store it.
pub async fn refresh(from: &str, store: &dyn CatalogStore) -> Result<Catalog, RefreshError> {
    let catalog = fetch(from).await?;
    store.replace(&catalog).map_err(RefreshError::Store)?;
    Ok(catalog)
}

/// Read `from` and check it whole; nothing is stored.
pub async fn fetch(from: &str) -> Result<Catalog, RefreshError> {
    let bytes = read(from).await?;
    Catalog::from_bytes(&bytes).map_err(|cause| RefreshError::Invalid { from: from.into(), cause })
}

/// The bytes at `from`, at most [`MAX_CATALOG_BYTES`].
pub async fn read(from: &str) -> Result<Vec<u8>, RefreshError> {
    if from.starts_with("https://") {
        return download(from).await;
    }
    if from.starts_with("http://") {
        return Err(RefreshError::PlainHttp { url: from.into() });
    }
    let path = match from.strip_prefix("file://") {
        Some(path) => path,
        None if from.contains("://") => return Err(RefreshError::Scheme { url: from.into() }),
        None => from,
    };
    let read_err = |cause| RefreshError::Read { from: from.into(), cause };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_CATALOG_BYTES + 1).read_to_end(&mut bytes).map_err(read_err)?;
    if bytes.len() as u64 > MAX_CATALOG_BYTES {
        return Err(RefreshError::TooLarge { from: from.into() });
    }
    Ok(bytes)
}

/// GET `url` through the crate's TLS setup, reading at most the cap.
async fn download(url: &str) -> Result<Vec<u8>, RefreshError> {
    use crate::download::{self, DownloadError};
    let client = crate::tls::reqwest_builder()
        .timeout(REFRESH_TIMEOUT)
        .build()
        .map_err(|e| RefreshError::Download { url: url.into(), detail: download::describe(&e) })?;
    download::capped(&client, url, MAX_CATALOG_BYTES).await.map_err(|e| match e {
        DownloadError::Request(detail) => RefreshError::Download { url: url.into(), detail },
        DownloadError::Status(status) => RefreshError::Status { url: url.into(), status: status.as_u16() },
        DownloadError::TooLarge(_) => RefreshError::TooLarge { from: url.into() },
    })
}
