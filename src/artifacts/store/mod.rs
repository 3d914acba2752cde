//! The artifact endpoint's built-in store (`skill-operator artifacts --store
//! DIR`): a small OCI distribution API at `/v2/...` on the endpoint's own
//! listener, backed by a directory. The endpoint then uses it as its
//! registry, so staging, fetching, digest checks, `package push` and the
//! controller resolving `source.oci.reference` stay the one `oci::Registry`
//! code path they are with an external registry.
//!
//! # Why a registry API and not a second storage backend
//! Everything that moves packages and job files already speaks the
//! distribution API and verifies every digest on the way out; a second
//! backend behind the endpoint would have to re-implement those checks and
//! would leave `package push` and the controller's package pulls without a
//! target. Serving the API means the store is checked by the same code that
//! checks any registry, and a cluster that outgrows it points
//! `artifacts --registry` at a real one with nothing else changed.
//!
//! # Layout under DIR
//! ```text
//! blobs/sha256/<hex>                  content (manifests too), written once by rename
//! repos/<name>/_manifests/<hex>       this repository holds manifest <hex>; the file is its media type
//! repos/<name>/_tags/<tag>            the digest the tag points at
//! uploads/<id>                        blob uploads in progress (removed at start)
//! ```
//! Repository names follow the distribution grammar (lowercase segments of
//! `[a-z0-9]` joined by `.`, `_`, `__` or `-`), so no segment can be `..`,
//! start with `_` or be empty: a name never leaves `repos/` nor collides
//! with `_manifests`/`_tags`. Tags follow `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`,
//! digests are `sha256:<64 lowercase hex>` only.
//!
//! # Integrity
//! A blob is streamed to `uploads/`, hashed while it arrives, and renamed
//! into `blobs/` only when its sha256 equals the digest the client named
//! (two uploads of one blob race harmlessly: both renames put the same
//! bytes at the same name). A manifest is accepted only when it parses,
//! fits [`STORE_MANIFEST_MAX_BYTES`], hashes to the digest it is put under
//! (when put by digest) and every blob (or, for an index, every manifest)
//! it names is present. Files are fsynced before the rename, so a node
//! crash leaves either the old state or the new one.
//!
//! # Garbage
//! Deleting a manifest leaves its blobs; [`Store::collect_garbage`] (every
//! [`STORE_GC_INTERVAL`]) removes blobs that no manifest of any repository
//! names and that are older than [`STORE_GC_GRACE`]. A push checks for a
//! blob before it uploads it, and that check refreshes the blob's time, so
//! a blob a push relies on is never swept between the check and the
//! manifest.

pub mod v2;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::core::limits::{STORE_BLOB_MAX_BYTES, STORE_GC_GRACE, STORE_MANIFEST_MAX_BYTES, STORE_UPLOADS_MAX, STORE_UPLOAD_IDLE};

/// What went wrong, as the distribution API names it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("repository name {0:?} is invalid: lowercase letters and digits in segments joined by '/', '.', '_', '__' or '-', at most 255 characters")]
    NameInvalid(String),
    #[error("tag {0:?} is invalid: [A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}")]
    TagInvalid(String),
    #[error("digest {0:?} is invalid: only sha256:<64 lowercase hex> is accepted")]
    DigestInvalid(String),
    #[error("the upload hashes to {actual}, not {expected}: nothing was stored")]
    DigestMismatch { expected: String, actual: String },
    #[error("{what} is over the {limit}-byte cap")]
    TooLarge { what: &'static str, limit: u64 },
    #[error("blob {0} is not in the store")]
    BlobUnknown(String),
    #[error("manifest {0} is not in the store")]
    ManifestUnknown(String),
    #[error("the manifest names {0}, which is not in the store: push it first")]
    ManifestBlobUnknown(String),
    #[error("the manifest is invalid: {0}")]
    ManifestInvalid(String),
    #[error("upload {0:?} is unknown (finished, given up after idling, or never started): start a new one")]
    UploadUnknown(String),
    #[error("upload {0:?} is in use by another request")]
    UploadBusy(String),
    #[error("{STORE_UPLOADS_MAX} uploads are open: finish or cancel one first")]
    TooManyUploads,
    #[error("the request body failed: {0}")]
    Body(String),
    #[error("store I/O on {path}: {source}; check the volume at the store directory is mounted and writable")]
    Io { path: String, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.display().to_string(), source }
}

/// A repository name under the distribution grammar.
pub fn check_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty() && name.len() <= 255 && name.split('/').all(crate::oci::reference::is_path_component);
    if ok {
        Ok(())
    } else {
        Err(StoreError::NameInvalid(name.to_string()))
    }
}

pub fn check_tag(tag: &str) -> Result<(), StoreError> {
    if crate::oci::reference::is_tag(tag) {
        Ok(())
    } else {
        Err(StoreError::TagInvalid(tag.to_string()))
    }
}

/// `sha256:<hex>` to `<hex>`.
pub fn check_digest(digest: &str) -> Result<&str, StoreError> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => Ok(h),
        _ => Err(StoreError::DigestInvalid(digest.to_string())),
    }
}

/// A manifest reference: a digest or a tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestRef {
    Digest(String),
    Tag(String),
}

impl ManifestRef {
    pub fn parse(s: &str) -> Result<ManifestRef, StoreError> {
        if s.contains(':') {
            check_digest(s)?;
            Ok(ManifestRef::Digest(s.to_string()))
        } else {
            check_tag(s)?;
            Ok(ManifestRef::Tag(s.to_string()))
        }
    }
}

/// One blob upload in progress.
pub struct Upload {
    file: tokio::fs::File,
    path: PathBuf,
    len: u64,
    hasher: Sha256,
    touched: Instant,
}

/// A stored manifest.
#[derive(Debug, Clone)]
pub struct StoredManifest {
    pub body: Vec<u8>,
    pub digest: String,
    pub media_type: String,
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct Store(Arc<StoreInner>);

struct StoreInner {
    root: PathBuf,
    uploads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Upload>>>>>,
    /// Manifest and tag writes, deletes and the garbage sweep: one at a
    /// time, so a sweep never sees half a push.
    meta: Mutex<()>,
}

/// The fields of a manifest or index that name other content.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Refs {
    #[serde(rename = "schemaVersion")]
    schema_version: Option<u32>,
    media_type: Option<String>,
    config: Option<Desc>,
    #[serde(default)]
    layers: Vec<Desc>,
    manifests: Option<Vec<Desc>>,
    subject: Option<Desc>,
}

#[derive(serde::Deserialize)]
struct Desc {
    digest: String,
}

impl Store {
    /// Opens (creating) the store at `root` and drops uploads a previous
    /// process left.
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        for sub in ["blobs/sha256", "repos", "uploads"] {
            let p = root.join(sub);
            std::fs::create_dir_all(&p).map_err(io(&p))?;
        }
        let uploads = root.join("uploads");
        for entry in std::fs::read_dir(&uploads).map_err(io(&uploads))? {
            let entry = entry.map_err(io(&uploads))?;
            let _ = std::fs::remove_file(entry.path());
        }
        // Fail at start, not at the first push, when the volume is read-only.
        let probe = root.join("uploads/.write-probe");
        std::fs::write(&probe, b"").map_err(io(&probe))?;
        let _ = std::fs::remove_file(&probe);
        Ok(Store(Arc::new(StoreInner { root: root.to_path_buf(), uploads: Mutex::new(HashMap::new()), meta: Mutex::new(()) })))
    }

    pub fn root(&self) -> &Path {
        &self.0.root
    }

    fn blob_path(&self, hex: &str) -> PathBuf {
        self.0.root.join("blobs/sha256").join(hex)
    }

    fn repo_dir(&self, name: &str) -> PathBuf {
        self.0.root.join("repos").join(name)
    }

    /// A blob's path and size, refreshing its time (see the module docs on garbage).
    pub fn blob(&self, digest: &str) -> Result<(PathBuf, u64), StoreError> {
        let hex = check_digest(digest)?;
        let path = self.blob_path(hex);
        match std::fs::metadata(&path) {
            Ok(m) => {
                if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Ok((path, m.len()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::BlobUnknown(digest.to_string())),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn has_blob(&self, digest: &str) -> bool {
        check_digest(digest).map(|h| self.blob_path(h).is_file()).unwrap_or(false)
    }

    // -- uploads ----------------------------------------------------------

    /// Starts an upload; its id goes into the Location the client PATCHes/PUTs.
    pub async fn start_upload(&self) -> Result<String, StoreError> {
        self.expire_uploads();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = self.0.root.join("uploads").join(&id);
        let file = tokio::fs::File::create(&path).await.map_err(io(&path))?;
        let upload = Upload { file, path, len: 0, hasher: Sha256::new(), touched: Instant::now() };
        let mut uploads = self.0.uploads.lock().expect("lock poisoned");
        if uploads.len() >= STORE_UPLOADS_MAX {
            let _ = std::fs::remove_file(&upload.path);
            return Err(StoreError::TooManyUploads);
        }
        uploads.insert(id.clone(), Arc::new(tokio::sync::Mutex::new(Some(upload))));
        Ok(id)
    }

    fn expire_uploads(&self) {
        let mut uploads = self.0.uploads.lock().expect("lock poisoned");
        uploads.retain(|_, slot| match slot.try_lock() {
            Ok(mut guard) => match guard.as_ref() {
                Some(u) if u.touched.elapsed() > STORE_UPLOAD_IDLE => {
                    let _ = std::fs::remove_file(&u.path);
                    *guard = None;
                    false
                }
                Some(_) => true,
                None => false,
            },
            // In use right now: not idle.
            Err(_) => true,
        });
    }

    fn slot(&self, id: &str) -> Result<Arc<tokio::sync::Mutex<Option<Upload>>>, StoreError> {
        self.0.uploads.lock().expect("lock poisoned").get(id).cloned().ok_or_else(|| StoreError::UploadUnknown(id.to_string()))
    }

    /// Appends a body to an upload; returns the upload's length. Over the
    /// blob cap the upload is given up.
    pub async fn append<S, E>(&self, id: &str, body: S) -> Result<u64, StoreError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let slot = self.slot(id)?;
        let mut guard = slot.try_lock().map_err(|_| StoreError::UploadBusy(id.to_string()))?;
        let Some(upload) = guard.as_mut() else { return Err(StoreError::UploadUnknown(id.to_string())) };
        let mut body = body;
        let outcome: Result<(), StoreError> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| StoreError::Body(e.to_string()))?;
                if upload.len + chunk.len() as u64 > STORE_BLOB_MAX_BYTES {
                    return Err(StoreError::TooLarge { what: "the blob", limit: STORE_BLOB_MAX_BYTES });
                }
                upload.hasher.update(&chunk);
                upload.file.write_all(&chunk).await.map_err(io(&upload.path))?;
                upload.len += chunk.len() as u64;
            }
            Ok(())
        }
        .await;
        upload.touched = Instant::now();
        match outcome {
            Ok(()) => Ok(upload.len),
            Err(e) => {
                // A failed body leaves an upload whose bytes nobody knows: drop it.
                let _ = std::fs::remove_file(&upload.path);
                *guard = None;
                drop(guard);
                self.0.uploads.lock().expect("lock poisoned").remove(id);
                Err(e)
            }
        }
    }

    /// Ends an upload: the bytes must hash to `digest`; then they become the blob.
    pub async fn finish(&self, id: &str, digest: &str) -> Result<u64, StoreError> {
        use tokio::io::AsyncWriteExt;
        let hex = check_digest(digest)?.to_string();
        let slot = self.slot(id)?;
        let mut guard = slot.try_lock().map_err(|_| StoreError::UploadBusy(id.to_string()))?;
        let upload = guard.take().ok_or_else(|| StoreError::UploadUnknown(id.to_string()))?;
        drop(guard);
        self.0.uploads.lock().expect("lock poisoned").remove(id);
        let Upload { mut file, path, len, hasher, .. } = upload;
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != digest {
            let _ = tokio::fs::remove_file(&path).await;
            return Err(StoreError::DigestMismatch { expected: digest.to_string(), actual });
        }
        file.flush().await.map_err(io(&path))?;
        file.sync_all().await.map_err(io(&path))?;
        drop(file);
        let target = self.blob_path(&hex);
        tokio::fs::rename(&path, &target).await.map_err(io(&target))?;
        Ok(len)
    }

    /// Gives an upload up.
    pub fn cancel(&self, id: &str) -> Result<(), StoreError> {
        let slot = self.0.uploads.lock().expect("lock poisoned").remove(id).ok_or_else(|| StoreError::UploadUnknown(id.to_string()))?;
        if let Ok(mut g) = slot.try_lock() {
            if let Some(u) = g.take() {
                let _ = std::fs::remove_file(&u.path);
            }
        }
        Ok(())
    }

    /// The length of an upload so far.
    pub fn upload_len(&self, id: &str) -> Result<u64, StoreError> {
        let slot = self.slot(id)?;
        let guard = slot.try_lock().map_err(|_| StoreError::UploadBusy(id.to_string()))?;
        guard.as_ref().map(|u| u.len).ok_or_else(|| StoreError::UploadUnknown(id.to_string()))
    }

    // -- manifests and tags (blocking: call from spawn_blocking) ------------

    /// Stores a manifest under `reference` in repository `name`; returns its digest.
    pub fn put_manifest(&self, name: &str, reference: &ManifestRef, body: &[u8], content_type: Option<&str>) -> Result<String, StoreError> {
        check_name(name)?;
        if body.len() as u64 > STORE_MANIFEST_MAX_BYTES {
            return Err(StoreError::TooLarge { what: "the manifest", limit: STORE_MANIFEST_MAX_BYTES });
        }
        let digest = crate::core::package::digest(body);
        if let ManifestRef::Digest(d) = reference {
            if d != &digest {
                return Err(StoreError::DigestMismatch { expected: d.clone(), actual: digest });
            }
        }
        let refs: Refs = serde_json::from_slice(body).map_err(|e| StoreError::ManifestInvalid(e.to_string()))?;
        if refs.schema_version != Some(2) {
            return Err(StoreError::ManifestInvalid("schemaVersion must be 2".into()));
        }
        let media_type = refs
            .media_type
            .clone()
            .or_else(|| content_type.map(str::to_string))
            .ok_or_else(|| StoreError::ManifestInvalid("no mediaType in the body or Content-Type".into()))?;
        let _meta = self.0.meta.lock().expect("lock poisoned");
        let repo = self.repo_dir(name);
        let manifests = repo.join("_manifests");
        if let Some(children) = &refs.manifests {
            // An index names manifests of this repository.
            for m in children {
                let hex = check_digest(&m.digest)?;
                if !manifests.join(hex).is_file() {
                    return Err(StoreError::ManifestBlobUnknown(m.digest.clone()));
                }
            }
        }
        for d in refs.config.iter().chain(refs.layers.iter()) {
            check_digest(&d.digest)?;
            if !self.has_blob(&d.digest) {
                return Err(StoreError::ManifestBlobUnknown(d.digest.clone()));
            }
        }
        if let Some(s) = &refs.subject {
            check_digest(&s.digest)?;
        }
        let hex = digest.trim_start_matches("sha256:").to_string();
        let blob = self.blob_path(&hex);
        if !blob.is_file() {
            write_atomic(&blob, body)?;
        }
        std::fs::create_dir_all(&manifests).map_err(io(&manifests))?;
        write_atomic(&manifests.join(&hex), media_type.as_bytes())?;
        if let ManifestRef::Tag(tag) = reference {
            let tags = repo.join("_tags");
            std::fs::create_dir_all(&tags).map_err(io(&tags))?;
            write_atomic(&tags.join(tag), digest.as_bytes())?;
        }
        Ok(digest)
    }

    /// The digest a reference names in a repository, if it is there.
    fn resolve(&self, name: &str, reference: &ManifestRef) -> Result<Option<String>, StoreError> {
        let repo = self.repo_dir(name);
        let digest = match reference {
            ManifestRef::Digest(d) => d.clone(),
            ManifestRef::Tag(t) => match std::fs::read_to_string(repo.join("_tags").join(t)) {
                Ok(d) => d.trim().to_string(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io(&repo)(e)),
            },
        };
        let hex = check_digest(&digest)?;
        Ok(repo.join("_manifests").join(hex).is_file().then_some(digest))
    }

    pub fn get_manifest(&self, name: &str, reference: &ManifestRef) -> Result<StoredManifest, StoreError> {
        check_name(name)?;
        let unknown = || {
            StoreError::ManifestUnknown(match reference {
                ManifestRef::Digest(d) | ManifestRef::Tag(d) => format!("{name}:{d}"),
            })
        };
        let digest = self.resolve(name, reference)?.ok_or_else(unknown)?;
        let hex = check_digest(&digest)?.to_string();
        let link = self.repo_dir(name).join("_manifests").join(&hex);
        let media_type = std::fs::read_to_string(&link).map_err(io(&link))?;
        let path = self.blob_path(&hex);
        let body = std::fs::read(&path).map_err(|e| if e.kind() == std::io::ErrorKind::NotFound { unknown() } else { io(&path)(e) })?;
        // The store's own copy is checked like a registry's: bytes on a volume can rot.
        let actual = crate::core::package::digest(&body);
        if actual != digest {
            return Err(StoreError::DigestMismatch { expected: digest, actual });
        }
        Ok(StoredManifest { body, digest, media_type: media_type.trim().to_string() })
    }

    /// Deletes a tag, or (by digest) a manifest and every tag of the
    /// repository that points at it. `false` when there was nothing.
    pub fn delete_manifest(&self, name: &str, reference: &ManifestRef) -> Result<bool, StoreError> {
        check_name(name)?;
        let _meta = self.0.meta.lock().expect("lock poisoned");
        let repo = self.repo_dir(name);
        match reference {
            ManifestRef::Tag(t) => {
                let p = repo.join("_tags").join(t);
                match std::fs::remove_file(&p) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(io(&p)(e)),
                }
            }
            ManifestRef::Digest(d) => {
                let hex = check_digest(d)?;
                let link = repo.join("_manifests").join(hex);
                let existed = match std::fs::remove_file(&link) {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                    Err(e) => return Err(io(&link)(e)),
                };
                let tags = repo.join("_tags");
                if let Ok(entries) = std::fs::read_dir(&tags) {
                    for entry in entries.flatten() {
                        if std::fs::read_to_string(entry.path()).is_ok_and(|v| v.trim() == d) {
                            let _ = std::fs::remove_file(entry.path());
                        }
                    }
                }
                Ok(existed)
            }
        }
    }

    /// Tags of a repository, sorted.
    pub fn tags(&self, name: &str) -> Result<Vec<String>, StoreError> {
        check_name(name)?;
        let dir = self.repo_dir(name).join("_tags");
        let mut tags: Vec<String> = match std::fs::read_dir(&dir) {
            Ok(entries) => entries.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|t| check_tag(t).is_ok()).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::ManifestUnknown(name.to_string())),
            Err(e) => return Err(io(&dir)(e)),
        };
        tags.sort();
        Ok(tags)
    }

    /// Removes blobs no manifest names that are older than the grace time;
    /// returns how many went.
    pub fn collect_garbage(&self) -> Result<usize, StoreError> {
        let _meta = self.0.meta.lock().expect("lock poisoned");
        let mut keep = HashSet::new();
        let mut stack = vec![self.0.root.join("repos")];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let p = entry.path();
                if entry.file_name() == "_manifests" {
                    for m in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                        let hex = m.file_name().to_string_lossy().into_owned();
                        keep.insert(hex.clone());
                        let Ok(body) = std::fs::read(self.blob_path(&hex)) else { continue };
                        if let Ok(refs) = serde_json::from_slice::<Refs>(&body) {
                            for d in refs.config.iter().chain(refs.layers.iter()).chain(refs.manifests.iter().flatten()) {
                                if let Ok(h) = check_digest(&d.digest) {
                                    keep.insert(h.to_string());
                                }
                            }
                        }
                    }
                } else if entry.file_type().is_ok_and(|t| t.is_dir()) && entry.file_name() != "_tags" {
                    stack.push(p);
                }
            }
        }
        let blobs = self.0.root.join("blobs/sha256");
        let mut removed = 0;
        for entry in std::fs::read_dir(&blobs).map_err(io(&blobs))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) || name.starts_with('.') {
                continue;
            }
            let old = entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STORE_GC_GRACE);
            if old && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// Writes `data` to `path` by a fsynced temporary file and a rename.
fn write_atomic(path: &Path, data: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().expect("store paths have a parent");
    let mut tmp = tempfile::Builder::new().prefix(".tmp").tempfile_in(dir).map_err(io(dir))?;
    tmp.write_all(data).map_err(io(path))?;
    tmp.as_file().sync_all().map_err(io(path))?;
    tmp.persist(path).map_err(|e| io(path)(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_distribution_grammar() {
        for ok in ["jobs", "samples/csv-stats", "a.b_c__d--e/f0", "x"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "..", "a/../b", "a//b", "/a", "a/", "_manifests", "a/_tags", "A", "a..b", "a._b", "a b", "a/.", "-a", "a-", "a%2f"]
        {
            assert!(check_name(bad).is_err(), "{bad} was accepted");
        }
        assert!(check_name(&"a".repeat(256)).is_err());
    }

    #[test]
    fn tags_and_digests_are_checked() {
        assert!(check_tag("job_team-a_3f1c_outputs").is_ok());
        assert!(check_tag("1.0.0").is_ok());
        for bad in ["", ".hidden", "-x", "a/b", "a:b", "..", &"a".repeat(129)] {
            assert!(check_tag(bad).is_err(), "{bad}");
        }
        assert!(check_digest(&format!("sha256:{}", "a".repeat(64))).is_ok());
        for bad in ["sha256:", "sha512:aa", &format!("sha256:{}", "A".repeat(64)), &format!("sha256:../{}", "a".repeat(61))] {
            assert!(check_digest(bad).is_err(), "{bad}");
        }
    }
}
