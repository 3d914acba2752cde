//! Deterministic image layers: a gzip'd tar written from a directory tree,
//! from a skill package archive, or from a list of entries, spooled to a
//! temporary file while both digests are computed.
//!
//! # The bytes (decisions)
//! - Entries sorted by path (byte order of the path without its trailing
//!   `/`, as `crate::core::package` sorts), every directory present as its
//!   own entry before its contents, everything under a prefix (`skill`,
//!   `deps`, or none for the operator image). No `./` entry.
//! - mtime 0, uid/gid 0, uname/gname empty, GNU headers (GNU long-name and
//!   long-link entries past 100 bytes, written by the `tar` crate with the
//!   same fixed fields). No PAX headers, so no xattrs, no atime/ctime.
//! - Modes: directories 0755, files 0755 if the source had any execute bit
//!   else 0644 (setuid/setgid/sticky and group/other write never survive),
//!   symlinks 0777.
//! - Regular files, directories and symlinks whose target stays inside the
//!   tree (relative, never through another symlink; checked lexically
//!   against the source tree). Absolute or escaping targets, devices,
//!   FIFOs and sockets are refused with the path named. Hard links are
//!   stored as plain content. A name starting with `.wh.` is refused: a
//!   runtime would read it as an overlay whiteout and delete base files.
//! - gzip from [`super::gzip`]: fixed header, fixed level.
//!
//! Same entries → same bytes → same digest, on any machine with the same
//! Cargo.lock.
//!
//! # Memory
//! The layer is written straight to a spool file (tar → sha256 for the
//! diff_id → gzip → sha256 for the digest → file); file contents pass
//! through fixed buffers. What stays in memory is one record per entry
//! (path, size, sha256), bounded by [`MAX_LAYER_ENTRIES`]. We spool rather
//! than stream the layer into the upload because the digest must be known
//! before uploading: it names the blob we HEAD first (the cache-hit path
//! uploads nothing) and the digest we commit the upload with.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::{ImageError, Result};
use super::gzip::{GzipWriter, HashingWriter, LimitHit};
use super::limits::{IO_CHUNK_BYTES, MAX_DEPTH, MAX_LAYER_BYTES, MAX_LAYER_ENTRIES, MAX_LINK_TARGET_BYTES, MAX_PATH_BYTES};
use crate::core::package::{is_executable, special_kind};

/// The media type of every layer we write.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Where layers are spooled and how big they may get.
#[derive(Debug, Clone)]
pub struct LayerOptions {
    /// Directory for the spool file; `None` for the system temp dir. In a
    /// pod, point this at an emptyDir: the layer is as big as its content.
    pub spool_dir: Option<PathBuf>,
    pub max_entries: usize,
    /// Uncompressed (tar) bytes.
    pub max_bytes: u64,
}

impl Default for LayerOptions {
    fn default() -> Self {
        LayerOptions { spool_dir: None, max_entries: MAX_LAYER_ENTRIES, max_bytes: MAX_LAYER_BYTES }
    }
}

/// A file of a layer, for the SBOM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerFile {
    /// Absolute path in the image (`/skill/SKILL.md`).
    pub path: String,
    pub size: u64,
    /// Lowercase hex sha256 of the content.
    pub sha256: String,
    pub executable: bool,
}

/// A finished layer: its spool file (deleted on drop) and its digests.
#[derive(Debug)]
pub struct Layer {
    /// `sha256:<hex>` of the gzip'd bytes: the blob's name.
    pub digest: String,
    /// `sha256:<hex>` of the tar: what the config's `rootfs.diff_ids` lists.
    pub diff_id: String,
    /// Compressed size (the descriptor's `size`).
    pub size: u64,
    pub uncompressed_size: u64,
    /// Every regular file, by path.
    pub files: Vec<LayerFile>,
    /// The history entry's `created_by`.
    pub created_by: String,
    spool: tempfile::TempPath,
}

impl Layer {
    /// The spool file (read it to upload the blob).
    pub fn path(&self) -> &Path {
        &self.spool
    }

    /// The OCI descriptor JSON of this layer.
    pub fn descriptor(&self) -> serde_json::Value {
        serde_json::json!({ "mediaType": LAYER_MEDIA_TYPE, "digest": self.digest, "size": self.size })
    }
}

/// What one entry of a [`LayerTree`] is made from.
#[derive(Debug, Clone)]
pub enum Source {
    Dir,
    /// A file on disk, read when the layer is written.
    File {
        path: PathBuf,
        executable: bool,
    },
    /// Content made in memory (`/etc/passwd`).
    Bytes {
        data: Vec<u8>,
        executable: bool,
    },
    /// Target already checked to stay inside the tree.
    Symlink {
        target: String,
    },
}

/// Entries of a layer by path (relative, no leading `/`), sorted; parents
/// are added as directories when an entry is inserted.
#[derive(Debug, Clone, Default)]
pub struct LayerTree {
    entries: BTreeMap<String, Source>,
}

impl LayerTree {
    pub fn new() -> Self {
        LayerTree::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Paths in the order they will be written.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Inserts `path` (checked) and its parent directories. Inserting a
    /// path twice, or below a non-directory, is an error.
    pub fn insert(&mut self, path: &str, source: Source) -> Result<()> {
        let path = path.trim_start_matches('/').trim_end_matches('/');
        check_path(path)?;
        let mut parent = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            match self.entries.get(&parent) {
                None => {
                    self.entries.insert(parent.clone(), Source::Dir);
                }
                Some(Source::Dir) => {}
                Some(_) => return Err(ImageError::BadPath { path: path.into(), reason: format!("{parent} is not a directory") }),
            }
        }
        match (self.entries.get(path), &source) {
            (None, _) => {
                self.entries.insert(path.to_string(), source);
                Ok(())
            }
            (Some(Source::Dir), Source::Dir) => Ok(()),
            (Some(_), _) => Err(ImageError::BadPath { path: path.into(), reason: "listed twice".into() }),
        }
    }

    /// Adds every entry under `dir`, placed under `prefix` (`""` for the
    /// root; the prefix directories themselves are added too). Names in
    /// `skip` (e.g. `.git`) are left out wherever they appear. Symlinks are
    /// kept when their target stays inside `dir`; see the module docs.
    pub fn add_dir(&mut self, dir: &Path, prefix: &str, skip: &[&str], opts: &LayerOptions) -> Result<()> {
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            self.insert(prefix, Source::Dir)?;
        }
        let meta = fs::metadata(dir).map_err(|e| ImageError::read(dir, e))?;
        if !meta.is_dir() {
            return Err(ImageError::read(dir, io::Error::new(io::ErrorKind::NotADirectory, "not a directory")));
        }
        walk(dir, dir, "", prefix, skip, self, opts)
    }
}

fn join(prefix: &str, rel: &str) -> String {
    match (prefix.is_empty(), rel.is_empty()) {
        (true, _) => rel.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}/{rel}"),
    }
}

fn walk(root: &Path, dir: &Path, rel: &str, prefix: &str, skip: &[&str], tree: &mut LayerTree, opts: &LayerOptions) -> Result<()> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| ImageError::read(dir, e))? {
        let entry = entry.map_err(|e| ImageError::read(dir, e))?;
        let name = entry
            .file_name()
            .into_string()
            .map_err(|n| ImageError::BadPath { path: format!("{}/{}", dir.display(), n.to_string_lossy()), reason: "not UTF-8".into() })?;
        if !skip.contains(&name.as_str()) {
            names.push(name);
        }
    }
    // Sorted only for a stable error when two entries fail; the tree sorts.
    names.sort();
    for name in names {
        let child_rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
        let host = dir.join(&name);
        let meta = fs::symlink_metadata(&host).map_err(|e| ImageError::read(&host, e))?;
        let ft = meta.file_type();
        let path = join(prefix, &child_rel);
        if tree.entries.len() >= opts.max_entries {
            return Err(ImageError::LayerTooLarge { what: "entries".into(), limit: opts.max_entries as u64 });
        }
        if ft.is_dir() {
            tree.insert(&path, Source::Dir)?;
            walk(root, &host, &child_rel, prefix, skip, tree, opts)?;
        } else if ft.is_file() {
            tree.insert(&path, Source::File { path: host, executable: is_executable(&meta) })?;
        } else if ft.is_symlink() {
            let target = symlink_target(root, &host, &child_rel)?;
            tree.insert(&path, Source::Symlink { target })?;
        } else {
            return Err(ImageError::SpecialFile { path: child_rel, kind: special_kind(&ft) });
        }
    }
    Ok(())
}

/// A symlink at `rel` (inside `root`) may point only at a relative target
/// that, resolved lexically from the link's directory, stays inside
/// `root` without passing through another symlink (whose own target could
/// lead anywhere once combined with `..`).
fn check_symlink(root: &Path, rel: &str, target: &str) -> Result<()> {
    let escape = || ImageError::SymlinkEscape { path: rel.into(), target: target.into() };
    if target.is_empty() || target.starts_with('/') || target.len() > MAX_LINK_TARGET_BYTES || target.contains('\0') {
        return Err(escape());
    }
    let mut stack: Vec<&str> = rel.split('/').collect();
    stack.pop(); // the link's own name
    let parts: Vec<&str> = target.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    for (i, part) in parts.iter().enumerate() {
        if *part == ".." {
            stack.pop().ok_or_else(escape)?;
            continue;
        }
        stack.push(part);
        // Intermediate components must not be symlinks: `a/..` through a
        // link `a -> x/y` is `x`, not the tree root.
        if i + 1 < parts.len() {
            let host = root.join(stack.join("/"));
            if fs::symlink_metadata(&host).map(|m| m.file_type().is_symlink()).unwrap_or(false) {
                return Err(escape());
            }
        }
    }
    Ok(())
}

/// Path rules for layer entries: relative, UTF-8, no empty/`.`/`..`
/// components, no NUL, no whiteout names, within the length and depth
/// caps.
fn check_path(path: &str) -> Result<()> {
    let bad = |reason: &str| Err(ImageError::BadPath { path: path.into(), reason: reason.into() });
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > MAX_PATH_BYTES {
        return bad(&format!("longer than {MAX_PATH_BYTES} bytes"));
    }
    if path.contains('\0') || path.contains('\\') {
        return bad("NUL or backslash");
    }
    let mut depth = 0;
    for part in path.split('/') {
        depth += 1;
        if part.is_empty() || part == "." || part == ".." {
            return bad("empty, `.` or `..` component");
        }
        if part.starts_with(".wh.") {
            return bad("`.wh.` names are overlay whiteouts");
        }
    }
    if depth > MAX_DEPTH {
        return bad(&format!("deeper than {MAX_DEPTH}"));
    }
    Ok(())
}

/// The tar writer chain: tar → diff_id hash → gzip → digest hash → file.
type Chain = HashingWriter<GzipWriter<HashingWriter<BufWriter<fs::File>>>>;

/// Writes entries in order, checking order, parents and caps, recording
/// files for the SBOM.
struct TarSink {
    builder: tar::Builder<Chain>,
    spool: tempfile::TempPath,
    spool_dir: PathBuf,
    last: Option<String>,
    dirs: HashSet<String>,
    entries: usize,
    max_entries: usize,
    max_bytes: u64,
    files: Vec<LayerFile>,
}

impl TarSink {
    fn new(opts: &LayerOptions) -> Result<Self> {
        let spool_dir = opts.spool_dir.clone().unwrap_or_else(std::env::temp_dir);
        let spool_err = |source| ImageError::Spool { dir: spool_dir.clone(), source };
        let file = tempfile::Builder::new().prefix("skill-operator-layer-").suffix(".tar.gz").tempfile_in(&spool_dir).map_err(spool_err)?;
        let (file, spool) = file.into_parts();
        let chain = HashingWriter::new(
            GzipWriter::new(HashingWriter::new(BufWriter::with_capacity(IO_CHUNK_BYTES, file), u64::MAX)),
            opts.max_bytes,
        );
        let mut builder = tar::Builder::new(chain);
        // Never follow symlinks from the tar crate's side; we add links as
        // links ourselves.
        builder.follow_symlinks(false);
        Ok(TarSink {
            builder,
            spool,
            spool_dir,
            last: None,
            dirs: HashSet::new(),
            entries: 0,
            max_entries: opts.max_entries,
            max_bytes: opts.max_bytes,
            files: Vec::new(),
        })
    }

    fn io_error(&self, e: io::Error) -> ImageError {
        if e.get_ref().is_some_and(|inner| inner.is::<LimitHit>()) {
            return ImageError::LayerTooLarge { what: "uncompressed bytes".into(), limit: self.max_bytes };
        }
        ImageError::Spool { dir: self.spool_dir.clone(), source: e }
    }

    /// Order and parent checks, shared by every entry kind.
    fn admit(&mut self, path: &str) -> Result<()> {
        check_path(path)?;
        if let Some(last) = &self.last {
            if path <= last.as_str() {
                return Err(ImageError::BadArchive { detail: format!("{path} comes after {last}: entries must be sorted and unique") });
            }
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            if !self.dirs.contains(parent) {
                return Err(ImageError::BadArchive { detail: format!("{path}: parent directory {parent} has no entry before it") });
            }
        }
        self.entries += 1;
        if self.entries > self.max_entries {
            return Err(ImageError::LayerTooLarge { what: "entries".into(), limit: self.max_entries as u64 });
        }
        self.last = Some(path.to_string());
        Ok(())
    }

    fn header(entry_type: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(entry_type);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h
    }

    fn dir(&mut self, path: &str) -> Result<()> {
        self.admit(path)?;
        let mut h = Self::header(tar::EntryType::Directory, 0o755, 0);
        let r = self.builder.append_data(&mut h, format!("{path}/"), io::empty());
        r.map_err(|e| self.io_error(e))?;
        self.dirs.insert(path.to_string());
        Ok(())
    }

    fn file(&mut self, path: &str, size: u64, executable: bool, reader: &mut dyn Read, source: &Path) -> Result<()> {
        self.admit(path)?;
        let mut h = Self::header(tar::EntryType::Regular, if executable { 0o755 } else { 0o644 }, size);
        let mut exact = ExactReader { inner: reader, remaining: size, hasher: Sha256::new() };
        match self.builder.append_data(&mut h, path, &mut exact) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ImageError::read(source, io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while being read")))
            }
            Err(e) => return Err(self.io_error(e)),
        }
        let sha256 = hex::encode(exact.hasher.finalize());
        self.files.push(LayerFile { path: format!("/{path}"), size, sha256, executable });
        Ok(())
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.admit(path)?;
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0);
        let r = self.builder.append_link(&mut h, path, target);
        r.map_err(|e| self.io_error(e))
    }

    fn finish(self, created_by: String) -> Result<Layer> {
        let spool_dir = self.spool_dir.clone();
        let io = |source| ImageError::Spool { dir: spool_dir.clone(), source };
        let chain = self.builder.into_inner().map_err(io)?;
        let (diff_id, uncompressed_size, gz) = chain.finish();
        let counted = gz.finish().map_err(io)?;
        let (digest, size, mut file) = counted.finish();
        file.flush().map_err(io)?;
        Ok(Layer { digest, diff_id, size, uncompressed_size, files: self.files, created_by, spool: self.spool })
    }
}

/// Reads exactly `remaining` bytes (an early EOF is an error, so a file
/// that shrank cannot misalign the tar), hashing them.
struct ExactReader<'a> {
    inner: &'a mut dyn Read,
    remaining: u64,
    hasher: Sha256,
}

impl Read for ExactReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.remaining.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        }
        self.hasher.update(&buf[..n]);
        self.remaining -= n as u64;
        Ok(n)
    }
}

impl LayerTree {
    /// Writes the layer (blocking: run it on a blocking thread).
    pub fn write(&self, created_by: impl Into<String>, opts: &LayerOptions) -> Result<Layer> {
        if self.entries.len() > opts.max_entries {
            return Err(ImageError::LayerTooLarge { what: "entries".into(), limit: opts.max_entries as u64 });
        }
        let mut sink = TarSink::new(opts)?;
        for (path, source) in &self.entries {
            match source {
                Source::Dir => sink.dir(path)?,
                Source::File { path: host, executable } => {
                    let mut f = fs::File::open(host).map_err(|e| ImageError::read(host, e))?;
                    let meta = f.metadata().map_err(|e| ImageError::read(host, e))?;
                    sink.file(path, meta.len(), *executable, &mut f, host)?;
                }
                Source::Bytes { data, executable } => {
                    sink.file(path, data.len() as u64, *executable, &mut data.as_slice(), Path::new(path))?;
                }
                Source::Symlink { target } => sink.symlink(path, target)?,
            }
        }
        sink.finish(created_by.into())
    }
}

/// A layer holding the tree at `dir` under `prefix` (blocking). The same
/// bytes as [`LayerTree::add_dir`] then [`LayerTree::write`], but the walk
/// streams entries into the tar as it goes, holding one directory's
/// listing per level instead of every path of the tree.
pub fn from_dir(dir: &Path, prefix: &str, skip: &[&str], created_by: impl Into<String>, opts: &LayerOptions) -> Result<Layer> {
    let meta = fs::metadata(dir).map_err(|e| ImageError::read(dir, e))?;
    if !meta.is_dir() {
        return Err(ImageError::read(dir, io::Error::new(io::ErrorKind::NotADirectory, "not a directory")));
    }
    let prefix = prefix.trim_matches('/');
    let mut sink = TarSink::new(opts)?;
    let mut acc = String::new();
    for part in prefix.split('/').filter(|p| !p.is_empty()) {
        if !acc.is_empty() {
            acc.push('/');
        }
        acc.push_str(part);
        sink.dir(&acc)?;
    }
    stream_walk(&mut sink, dir, dir, "", prefix, skip)?;
    sink.finish(created_by.into())
}

/// One step of [`stream_walk`]: an entry to write, or a directory's
/// contents to visit.
enum Step {
    Entry(String, fs::Metadata),
    Descend(String),
}

/// Writes `dir`'s entries in full-path order. Full-path order is not
/// depth-first order (`a.txt` sorts between the directory `a` and its
/// child `a/b`), so each child directory is two keys: `name` for its own
/// entry and `name/` for its contents, and the siblings' keys are sorted
/// together. A sibling name has no `/`, so it never falls inside the
/// `name/…` range: merging keys per level gives the global order.
fn stream_walk(sink: &mut TarSink, root: &Path, dir: &Path, rel: &str, prefix: &str, skip: &[&str]) -> Result<()> {
    let mut steps: Vec<(String, Step)> = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| ImageError::read(dir, e))? {
        let entry = entry.map_err(|e| ImageError::read(dir, e))?;
        let name = entry
            .file_name()
            .into_string()
            .map_err(|n| ImageError::BadPath { path: format!("{}/{}", dir.display(), n.to_string_lossy()), reason: "not UTF-8".into() })?;
        if skip.contains(&name.as_str()) {
            continue;
        }
        let host = dir.join(&name);
        let meta = fs::symlink_metadata(&host).map_err(|e| ImageError::read(&host, e))?;
        if meta.is_dir() {
            steps.push((format!("{name}/"), Step::Descend(name.clone())));
        }
        steps.push((name.clone(), Step::Entry(name, meta)));
        if sink.entries + steps.len() > sink.max_entries {
            return Err(ImageError::LayerTooLarge { what: "entries".into(), limit: sink.max_entries as u64 });
        }
    }
    steps.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, step) in steps {
        match step {
            Step::Descend(name) => {
                let child_rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
                stream_walk(sink, root, &dir.join(&name), &child_rel, prefix, skip)?;
            }
            Step::Entry(name, meta) => {
                let child_rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
                let host = dir.join(&name);
                let path = join(prefix, &child_rel);
                let ft = meta.file_type();
                if ft.is_dir() {
                    sink.dir(&path)?;
                } else if ft.is_file() {
                    let mut f = fs::File::open(&host).map_err(|e| ImageError::read(&host, e))?;
                    let len = f.metadata().map_err(|e| ImageError::read(&host, e))?.len();
                    sink.file(&path, len, is_executable(&meta), &mut f, &host)?;
                } else if ft.is_symlink() {
                    let target = symlink_target(root, &host, &child_rel)?;
                    sink.symlink(&path, &target)?;
                } else {
                    return Err(ImageError::SpecialFile { path: child_rel, kind: special_kind(&ft) });
                }
            }
        }
    }
    Ok(())
}

/// A symlink's target, checked with [`check_symlink`].
fn symlink_target(root: &Path, host: &Path, rel: &str) -> Result<String> {
    let target = fs::read_link(host).map_err(|e| ImageError::read(host, e))?;
    let target =
        target.into_os_string().into_string().map_err(|_| ImageError::SymlinkEscape { path: rel.into(), target: "<not UTF-8>".into() })?;
    check_symlink(root, rel, &target)?;
    Ok(target)
}

/// A layer holding a skill package archive (`crate::core::package`'s
/// deterministic `.tar.gz`, read as a stream) under `prefix` (blocking).
/// The archive must be sorted with every directory listed, as that module
/// writes it; the result is byte-identical to [`from_dir`] on the same
/// tree.
pub fn from_package_archive(archive: impl Read, prefix: &str, created_by: impl Into<String>, opts: &LayerOptions) -> Result<Layer> {
    let prefix = prefix.trim_matches('/');
    let mut sink = TarSink::new(opts)?;
    let mut acc = String::new();
    for part in prefix.split('/').filter(|p| !p.is_empty()) {
        if !acc.is_empty() {
            acc.push('/');
        }
        acc.push_str(part);
        sink.dir(&acc)?;
    }
    let bad = |detail: String| ImageError::BadArchive { detail };
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let entries = tar.entries().map_err(|e| bad(format!("cannot read the tar: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("cannot read the tar: {e}")))?;
        let raw = entry.path_bytes().into_owned();
        let rel = String::from_utf8(raw).map_err(|_| bad("a path is not UTF-8".into()))?;
        let rel = rel.trim_end_matches('/');
        let path = join(prefix, rel);
        let header = entry.header();
        let executable = header.mode().map(|m| m & 0o111 != 0).unwrap_or(false);
        match header.entry_type() {
            tar::EntryType::Directory => sink.dir(&path)?,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.size();
                sink.file(&path, size, executable, &mut entry, Path::new(rel))?;
            }
            other => return Err(bad(format!("{rel}: entry type {other:?} (packages hold files and directories only)"))),
        }
    }
    sink.finish(created_by.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("SKILL.md"), "---\nname: t\ndescription: d\n---\n").unwrap();
        fs::create_dir_all(d.path().join("scripts/empty")).unwrap();
        fs::write(d.path().join("scripts/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(d.path().join("scripts/run.sh"), fs::Permissions::from_mode(0o4775)).unwrap();
        fs::write(d.path().join("a.txt"), "a").unwrap();
        fs::set_permissions(d.path().join("a.txt"), fs::Permissions::from_mode(0o666)).unwrap();
        fs::write(d.path().join(format!("{}.txt", "x".repeat(150))), "long").unwrap();
        d
    }

    fn entries(layer: &Layer) -> Vec<(String, u32, u64, u64, String)> {
        let f = fs::File::open(layer.path()).unwrap();
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(f));
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                    h.uid().unwrap() + h.gid().unwrap(),
                    h.username().unwrap().unwrap_or("").to_string() + h.groupname().unwrap().unwrap_or(""),
                )
            })
            .collect()
    }

    #[test]
    fn sorted_normalised_prefixed_and_reproducible() {
        let d = tree();
        let opts = LayerOptions::default();
        let one = from_dir(d.path(), "skill", &[".git"], "x", &opts).unwrap();
        // Touch mtimes and re-create: the bytes must not change.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        fs::write(d.path().join("a.txt"), "a").unwrap();
        let two = from_dir(d.path(), "skill", &[".git"], "x", &opts).unwrap();
        assert_eq!(one.digest, two.digest);
        assert_eq!(fs::read(one.path()).unwrap(), fs::read(two.path()).unwrap());
        assert_ne!(one.digest, one.diff_id);

        let got = entries(&one);
        let names: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
        let long = format!("skill/{}.txt", "x".repeat(150));
        assert_eq!(
            names,
            vec!["skill/", "skill/SKILL.md", "skill/a.txt", "skill/scripts/", "skill/scripts/empty/", "skill/scripts/run.sh", &long]
        );
        for (name, mode, mtime, ids, owners) in &got {
            assert_eq!((*mtime, *ids, owners.as_str()), (0, 0, ""), "{name}");
            let want = if name.ends_with('/') || name.ends_with("run.sh") { 0o755 } else { 0o644 };
            assert_eq!(*mode, want, "{name}");
        }
        assert_eq!(one.files.len(), 4);
        assert_eq!(one.files[0].path, "/skill/SKILL.md");
    }

    #[test]
    fn digests_are_of_the_spooled_bytes_and_of_the_tar() {
        let d = tree();
        let l = from_dir(d.path(), "skill", &[], "x", &LayerOptions::default()).unwrap();
        let gz = fs::read(l.path()).unwrap();
        assert_eq!(crate::core::package::digest(&gz), l.digest);
        assert_eq!(gz.len() as u64, l.size);
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(gz.as_slice()).read_to_end(&mut tar).unwrap();
        assert_eq!(crate::core::package::digest(&tar), l.diff_id);
        assert_eq!(tar.len() as u64, l.uncompressed_size);
    }

    #[test]
    fn streamed_walk_gives_the_same_bytes_as_the_tree() {
        // Names around `/` in byte order: `a-b` < `a.txt` < `a/` < `a0`.
        let d = tree();
        for name in ["a", "a.x", "a-b", "a0"] {
            fs::create_dir_all(d.path().join(name).join("inner")).unwrap();
            fs::write(d.path().join(name).join("inner/f"), name).unwrap();
        }
        std::os::unix::fs::symlink("a/inner/f", d.path().join("link")).unwrap();
        let opts = LayerOptions::default();
        let streamed = from_dir(d.path(), "deps/x", &[], "x", &opts).unwrap();
        let mut t = LayerTree::new();
        t.add_dir(d.path(), "deps/x", &[], &opts).unwrap();
        let buffered = t.write("x", &opts).unwrap();
        assert_eq!(streamed.digest, buffered.digest);
        assert_eq!(fs::read(streamed.path()).unwrap(), fs::read(buffered.path()).unwrap());
    }

    #[test]
    fn package_archive_gives_the_same_layer_as_the_directory() {
        let d = tree();
        let pkg = crate::core::package::build_from_dir(d.path()).unwrap();
        let opts = LayerOptions::default();
        let a = from_package_archive(pkg.as_slice(), "skill", "x", &opts).unwrap();
        let b = from_dir(d.path(), "skill", &[".git"], "x", &opts).unwrap();
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.files, b.files);
    }

    #[test]
    fn symlinks_inside_are_kept_and_escapes_refused() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("node_modules/pkg/bin")).unwrap();
        fs::write(d.path().join("node_modules/pkg/bin/cli.js"), "x").unwrap();
        fs::create_dir_all(d.path().join("node_modules/.bin")).unwrap();
        std::os::unix::fs::symlink("../pkg/bin/cli.js", d.path().join("node_modules/.bin/cli")).unwrap();
        let l = from_dir(d.path(), "deps", &[], "x", &LayerOptions::default()).unwrap();
        let f = fs::File::open(l.path()).unwrap();
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(f));
        let link = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.header().entry_type() == tar::EntryType::Symlink)
            .map(|e| e.link_name().unwrap().unwrap().to_string_lossy().into_owned());
        assert_eq!(link.as_deref(), Some("../pkg/bin/cli.js"));

        for (name, target) in [("up", "../../etc/passwd"), ("abs", "/etc/passwd")] {
            let d = tempfile::tempdir().unwrap();
            fs::create_dir(d.path().join("sub")).unwrap();
            std::os::unix::fs::symlink(target, d.path().join("sub").join(name)).unwrap();
            let err = from_dir(d.path(), "deps", &[], "x", &LayerOptions::default()).unwrap_err();
            assert!(matches!(err, ImageError::SymlinkEscape { .. }), "{name}: {err}");
        }
        // Through another symlink: `l -> .` then `x -> l/..` would leave the tree.
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(".", d.path().join("l")).unwrap();
        std::os::unix::fs::symlink("l/../x", d.path().join("x")).unwrap();
        let err = from_dir(d.path(), "deps", &[], "x", &LayerOptions::default()).unwrap_err();
        assert!(matches!(err, ImageError::SymlinkEscape { .. }), "{err}");
    }

    #[test]
    fn special_files_and_whiteouts_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = from_dir(d.path(), "", &[], "x", &LayerOptions::default()).unwrap_err();
        assert!(matches!(err, ImageError::SpecialFile { kind: "FIFO", .. }), "{err}");

        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join(".wh.etc"), "").unwrap();
        let err = from_dir(d.path(), "skill", &[], "x", &LayerOptions::default()).unwrap_err();
        assert!(matches!(err, ImageError::BadPath { .. }), "{err}");
    }

    #[test]
    fn caps_are_enforced_while_streaming() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("big"), vec![7u8; 64 * 1024]).unwrap();
        let opts = LayerOptions { max_bytes: 32 * 1024, ..Default::default() };
        let err = from_dir(d.path(), "", &[], "x", &opts).unwrap_err();
        assert!(matches!(err, ImageError::LayerTooLarge { .. }), "{err}");
        let opts = LayerOptions { max_entries: 1, ..Default::default() };
        fs::write(d.path().join("small"), "x").unwrap();
        let err = from_dir(d.path(), "", &[], "x", &opts).unwrap_err();
        assert!(matches!(err, ImageError::LayerTooLarge { .. }), "{err}");
    }

    #[test]
    fn unsorted_archives_are_refused() {
        let mut b = tar::Builder::new(Vec::new());
        for p in ["b.txt", "a.txt"] {
            let mut h = tar::Header::new_gnu();
            h.set_size(1);
            h.set_mode(0o644);
            b.append_data(&mut h, p, &b"x"[..]).unwrap();
        }
        let tar = b.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&tar).unwrap();
        let err = from_package_archive(gz.finish().unwrap().as_slice(), "skill", "x", &LayerOptions::default()).unwrap_err();
        assert!(matches!(err, ImageError::BadArchive { .. }), "{err}");
    }
}
