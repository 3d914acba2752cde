//! Filesystem steps the store takes with hostile content around: no write
//! through a symlink, no read of a swapped file, atomic record writes.

use crate::core::paths::RelPath;
use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::IoContext;
use super::*;

// -- free helpers ------------------------------------------------------------

/// A temp file [`write_atomic`] left behind (`job.json.tmp-*`, `stdout.tmp-*`, `stderr.tmp-*`).
pub(super) fn is_temp_name(name: &str) -> bool {
    [RECORD, STDOUT, STDERR, OUTPUTS].iter().any(|base| name.strip_prefix(base).is_some_and(|rest| rest.starts_with(".tmp-")))
}

/// Exactly 32 lowercase hex characters, checked before any path is built.
pub(super) fn check_id(id: &str) -> Result<()> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(JobError::BadId(clip(&format!("{id:?}"), 80)))
    }
}

pub(super) fn parse_path(raw: &str) -> Result<RelPath> {
    RelPath::parse(raw).map_err(|source| JobError::BadPath { path: clip(&format!("{raw:?}"), 120), source })
}

/// At most `max` characters of `s`, marked when cut.
pub(super) fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut cut: String = s.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

pub(super) fn display_rel(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}/{name}"),
    }
}

pub(super) fn skip(listing: &mut OutputListing, cap: usize, path: String, kind: SkipKind, reason: String) {
    if listing.skipped.len() < cap {
        listing.skipped.push(SkippedEntry { path, kind, reason });
    } else {
        listing.truncated = true;
    }
}

pub(super) fn special_kind(file_type: &fs::FileType) -> &'static str {
    if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_char_device() {
        "a character device"
    } else {
        "a special file"
    }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub(super) fn digest_label(hasher: Sha256) -> String {
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

pub(super) fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Open a file the store itself wrote (`job.json`, `stdout`, `stderr`),
/// refusing a symlink or special file planted in its place.
pub(super) fn open_own_file(path: &Path) -> io::Result<File> {
    let before = fs::symlink_metadata(path)?;
    if !before.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file (a symlink or special file was put in its place)"));
    }
    let file = File::open(path)?;
    let after = file.metadata()?;
    if !same_file(&before, &after) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the file changed while it was being opened"));
    }
    Ok(file)
}

/// Hash a regular file found by the walk, checking the opened handle is the
/// entry that was `lstat`ed (not a link swapped in since).
pub(super) fn hash_regular(path: &Path, meta: &fs::Metadata) -> Result<(u64, String), String> {
    let file = File::open(path).map_err(|err| format!("cannot open: {err}"))?;
    let opened = file.metadata().map_err(|err| format!("cannot stat: {err}"))?;
    if !opened.is_file() || !same_file(meta, &opened) {
        return Err("the file changed while it was being listed".into());
    }
    let mut hasher = Sha256::new();
    let mut file = file;
    let size = io::copy(&mut file, &mut hasher).map_err(|err| format!("cannot read: {err}"))?;
    Ok((size, digest_label(hasher)))
}

/// Read `limit` bytes from `offset` (no data past the end).
pub(super) fn read_chunk(mut file: File, offset: u64, limit: u64) -> io::Result<Chunk> {
    let size = file.metadata()?.len();
    if offset >= size {
        return Ok(Chunk { data: Vec::new(), offset, size, eof: true, download: None });
    }
    let want = limit.min(size - offset);
    file.seek(SeekFrom::Start(offset))?;
    let mut data = Vec::with_capacity(want as usize);
    file.take(want).read_to_end(&mut data)?;
    let eof = offset + data.len() as u64 >= size;
    Ok(Chunk { data, offset, size, eof, download: None })
}

/// Create the missing parent directories of `rel` under `work`, refusing any
/// existing component that is a symlink or not a directory. Returns the
/// parent directory of the final component.
pub(super) fn make_parents(work: &Path, rel: &RelPath) -> Result<PathBuf> {
    let segments: Vec<&str> = rel.as_str().split('/').collect();
    let mut current = work.to_path_buf();
    let mut shown = String::new();
    for segment in &segments[..segments.len().saturating_sub(1)] {
        current.push(segment);
        if !shown.is_empty() {
            shown.push('/');
        }
        shown.push_str(segment);
        let obstructed = |what| JobError::ParentObstructed { path: rel.to_string(), component: shown.clone(), what };
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(obstructed("a symlink")),
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(obstructed("a file, not a directory")),
            // create_dir does not follow a symlink at its last component: if
            // one appeared since the lstat it fails with AlreadyExists.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&current).ctx(|| format!("create directory {shown}"))?;
            }
            Err(err) => return Err(err).ctx(|| format!("stat {shown}")),
        }
    }
    Ok(current)
}

pub(super) fn obstruction(meta: &fs::Metadata) -> Option<&'static str> {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        Some("a symlink")
    } else if file_type.is_dir() {
        Some("a directory")
    } else if !file_type.is_file() {
        Some("a special file")
    } else {
        None
    }
}

/// Offset 0: replace whatever regular file is at `target` with `bytes`.
pub(super) fn write_new(target: &Path, rel: &RelPath, bytes: &[u8]) -> Result<()> {
    match fs::symlink_metadata(target) {
        Ok(meta) => {
            if let Some(what) = obstruction(&meta) {
                return Err(JobError::PathObstructed { path: rel.to_string(), what });
            }
            fs::remove_file(target).ctx(|| format!("replace {rel}"))?;
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).ctx(|| format!("stat {rel}")),
    }
    // create_new = O_CREAT|O_EXCL: fails on any existing name, a symlink
    // included, so the write can never land outside work/.
    let mut file = OpenOptions::new().write(true).create_new(true).open(target).ctx(|| format!("create {rel}"))?;
    file.write_all(bytes).ctx(|| format!("write {rel}"))
}

/// Append `bytes` at `offset` (the recorded size) and return the hash of the
/// whole file, continuing `cached` when it covers exactly `offset` bytes.
pub(super) fn append(target: &Path, rel: &RelPath, offset: u64, bytes: &[u8], cached: Option<Sha256>) -> Result<Sha256> {
    let before = match fs::symlink_metadata(target) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(JobError::InputOutOfSync { path: rel.to_string(), expected: offset, found: 0 });
        }
        Err(err) => return Err(err).ctx(|| format!("stat {rel}")),
    };
    if let Some(what) = obstruction(&before) {
        return Err(JobError::PathObstructed { path: rel.to_string(), what });
    }
    let mut file = OpenOptions::new().read(true).write(true).open(target).ctx(|| format!("open {rel}"))?;
    let opened = file.metadata().ctx(|| format!("stat {rel}"))?;
    if !same_file(&before, &opened) {
        return Err(JobError::PathObstructed { path: rel.to_string(), what: "a file that changed while it was being opened" });
    }
    if opened.len() < offset {
        return Err(JobError::InputOutOfSync { path: rel.to_string(), expected: offset, found: opened.len() });
    }
    let hasher = match cached {
        Some(hasher) => hasher,
        None => {
            let mut hasher = Sha256::new();
            file.seek(SeekFrom::Start(0)).ctx(|| format!("read {rel}"))?;
            let read = io::copy(&mut (&mut file).take(offset), &mut hasher).ctx(|| format!("read {rel}"))?;
            if read != offset {
                return Err(JobError::InputOutOfSync { path: rel.to_string(), expected: offset, found: read });
            }
            hasher
        }
    };
    // Drop any tail a crash left past the recorded size, then append.
    file.set_len(offset).ctx(|| format!("write {rel}"))?;
    file.seek(SeekFrom::Start(offset)).ctx(|| format!("write {rel}"))?;
    file.write_all(bytes).ctx(|| format!("write {rel}"))?;
    let mut hasher = hasher;
    hasher.update(bytes);
    Ok(hasher)
}

/// Write `dir/name` atomically: a fresh temp file (never an existing name,
/// so never through a symlink), fsync, rename over the old one, fsync the
/// directory. A crash leaves the old file or the new one, never a mix; a
/// leftover temp file is removed by [`JobStore::open`].
pub(super) fn write_atomic(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp-{}", uuid::Uuid::new_v4().simple()));
    let written = (|| -> io::Result<()> {
        // 0600: a run's uid may pass through the job directory, never read its record or streams.
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, dir.join(name))
    })();
    if let Err(err) = written {
        let _ = fs::remove_file(&tmp);
        return Err(err).ctx(|| format!("write {name}"));
    }
    sync_dir(dir, durable)
}

pub(super) fn save_record(dir: &Path, record: &JobRecord, durable: bool) -> Result<()> {
    let json = serde_json::to_vec(record).map_err(|err| JobError::Io { what: "encode the job record".into(), source: err.into() })?;
    write_atomic(dir, RECORD, &json, durable)
}

pub(super) fn sync_dir(dir: &Path, durable: bool) -> Result<()> {
    if !durable {
        return Ok(());
    }
    File::open(dir).and_then(|d| d.sync_all()).ctx(|| format!("sync {}", dir.display()))
}

/// The inputs of a job are exactly the confirmed ones: the same paths with
/// the same digests in the record, and each file on disk hashing to it.
pub(super) fn check_confirmed_inputs(id: &str, recorded: &[FileInfo], confirmed: &[(String, String)], work: &Path) -> Result<()> {
    let changed = |detail: String| JobError::InputsChanged { id: id.to_string(), detail };
    let mut want: Vec<(&str, &str)> = confirmed.iter().map(|(p, d)| (p.as_str(), d.as_str())).collect();
    want.sort();
    let have: Vec<(&str, &str)> = recorded.iter().map(|f| (f.path.as_str(), f.sha256.as_str())).collect();
    if want != have {
        let added: Vec<&str> = have.iter().filter(|h| !want.contains(h)).map(|h| h.0).collect();
        let gone: Vec<&str> = want.iter().filter(|w| !have.contains(w)).map(|w| w.0).collect();
        return Err(changed(format!("uploaded or changed since: {}; no longer as confirmed: {}", list(&added), list(&gone))));
    }
    for file in recorded {
        let rel = RelPath::parse(&file.path).map_err(|e| changed(format!("{}: {e}", file.path)))?;
        let path = work.join(rel.as_str());
        let meta = fs::symlink_metadata(&path).map_err(|e| changed(format!("{}: {e}", file.path)))?;
        if !meta.is_file() {
            return Err(changed(format!("{} is no longer a regular file", file.path)));
        }
        let (_, digest) = hash_regular(&path, &meta).map_err(|e| changed(format!("{}: {e}", file.path)))?;
        if digest != file.sha256 {
            return Err(changed(format!("{} on disk hashes to {digest}, not the confirmed {}", file.path, file.sha256)));
        }
    }
    Ok(())
}

fn list(items: &[&str]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}
