//! Why composing, verifying or building an image failed.

use std::path::PathBuf;

use crate::oci::OciError;

/// One variant per failing operation; every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A registry call failed (unreachable, auth, not found, digest, caps).
    #[error(transparent)]
    Registry(#[from] OciError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the layer spool file in {dir}: {source}; check that the spool directory exists and has free space")]
    Spool {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: {kind} files cannot go into a layer; remove it (only regular files, directories and symlinks inside the tree are kept)"
    )]
    SpecialFile { path: String, kind: &'static str },
    #[error("{path}: symlink to {target:?} points outside the tree; make it relative and inside the directory, or copy the file")]
    SymlinkEscape { path: String, target: String },
    #[error("{path}: invalid layer path: {reason}")]
    BadPath { path: String, reason: String },
    #[error("layer over its cap: {what} ({limit}); split the content or raise the cap in src/image/limits.rs")]
    LayerTooLarge { what: String, limit: u64 },
    #[error("not a deterministic package archive: {detail}; rebuild it with `skill-operator package` (crate::core::package)")]
    BadArchive { detail: String },
    #[error("base {reference}: {detail}")]
    Base { reference: String, detail: String },
    #[error("base {reference} offers none of the platforms asked for ({wanted}); it has: {found}. Pick a multi-platform base or ask for one of those")]
    NoPlatform { reference: String, wanted: String, found: String },
    #[error("base {reference} has layer media type {media_type:?}, which a composed OCI image cannot carry; use a Linux base with gzip/zstd/plain tar layers")]
    UnsupportedLayer { reference: String, media_type: String },
    #[error("{what}: {detail}")]
    Verify { what: String, detail: String },
    #[error("{path}: cannot read it as an ELF file: {detail}")]
    Elf { path: PathBuf, detail: String },
    #[error("{name} (needed by {needed_by}) not found in {searched}; install it or build a static binary")]
    LibraryNotFound { name: String, needed_by: String, searched: String },
    #[error("cannot write the image archive {path}: {source}; check that its directory exists, is writable and has free space")]
    ArchiveWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid compose request: {detail}")]
    Invalid { detail: String },
    #[error("background task failed: {detail}")]
    Task { detail: String },
}

impl ImageError {
    pub(crate) fn read(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ImageError::Read { path: path.into(), source }
    }

    pub(crate) fn invalid(detail: impl Into<String>) -> Self {
        ImageError::Invalid { detail: detail.into() }
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// Runs blocking work (tar, gzip, hashing, ELF parsing) off the async
/// workers; a panic in it is resumed here, a cancellation is an error.
/// The work starts at the call, not at the first poll: a caller that feeds
/// it through a bounded channel before awaiting it (verify) would otherwise
/// wait forever on a full channel.
pub(crate) fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> impl std::future::Future<Output = Result<T>> {
    let handle = tokio::task::spawn_blocking(f);
    async move {
        match handle.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(ImageError::Task { detail: e.to_string() }),
        }
    }
}
