//! Skill packages: a deterministic gzip'd tar of one skill directory.
//!
//! Pure and synchronous: no network, no async. The OCI layer
//! (`crate::oci`) moves these bytes; this module makes and checks them.
//!
//! Sources: a directory with `SKILL.md` at its root ([`build_from_dir`]), a
//! ZIP upload whose `SKILL.md` is at its root or in one named subfolder
//! ([`build_from_zip`]), or any `.tar.gz` skill tree such as a ToolHive
//! layer ([`build_from_tarball`]). All three go through one in-memory
//! [`Tree`] and one writer, so the same tree always gives the same bytes.
//!
//! # The archive (decisions)
//! - Entries sorted by path (byte order); a directory entry (`dir/`, 0755)
//!   for every directory, including empty ones and every implied parent.
//! - Files are 0755 when the source had any execute bit, else 0644: scripts
//!   the operator runs keep `+x`; setuid/setgid/sticky and group/other write
//!   bits never survive.
//! - mtime 0, uid/gid 0, uname/gname empty; GNU headers, GNU long-name
//!   entries for paths over 100 bytes (written by the `tar` crate, also
//!   fixed mtime 0/uid 0).
//! - Regular files and directories only. Symlinks, hardlink entries, FIFOs,
//!   sockets and devices are refused with the path named (never skipped).
//!   A source file with several hard links is stored as plain content.
//! - `.git` directories are skipped (a checkout's history is not the skill);
//!   `__MACOSX/` in ZIPs is skipped (Finder's resource-fork junk). Nothing
//!   else is filtered: hidden files are part of the skill.
//! - gzip: 10-byte header, mtime 0, no name/comment, OS byte 255, then raw
//!   deflate from `miniz_oxide` at level 6 (called directly, not through
//!   flate2, whose backend depends on cargo feature unification), then
//!   CRC-32 and size. The digest is stable for a given `miniz_oxide`
//!   version (pinned by Cargo.lock); bumping it may change package digests.
//!
//! # Limits
//! [`Limits::DEFAULT`]: 32 MiB per file, 128 MiB total, 2,000 files, 2,000
//! directories, 1,024-byte paths, depth 32, and for ZIP entries a
//! compression ratio of at most 200:1 once an entry passes 1 MiB. Sizes are
//! counted on the bytes actually produced while streaming; a ZIP's or tar's
//! declared size is only used to refuse early, never to allow.
//!
//! The ratio check is applied to ZIP uploads only: a package this module
//! wrote (say with a 32 MiB file of zeros, ~1000:1) must stay readable, and
//! the absolute caps already bound what a `.tar.gz` can expand to.
//!
//! # Path rules (ZIP names, tar names, job file names)
//! Relative, `/`-separated, UTF-8, no empty/`.`/`..` components, no
//! backslash, no drive letter (`C:`), no control characters. Two entries
//! whose paths differ only in case or in Unicode spelling (`café` as one
//! code point or as `e` plus a combining accent: compared after NFC) are
//! refused (they look the same and collide on macOS/Windows checkouts and
//! on case-insensitive or normalising volumes such as APFS), as is a path
//! used both as a file and as a directory.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use unicode_normalization::UnicodeNormalization;

/// The key two paths collide under: NFC, lower case, NFC again (lowering
/// can undo composition).
pub fn fold(path: &str) -> String {
    path.nfc().collect::<String>().to_lowercase().nfc().collect()
}

/// For a duplicate that only differs in Unicode spelling, both spellings
/// as code points (printed, the two names look the same).
fn spellings(path: &str, existing: &str) -> String {
    let escaped =
        |s: &str| s.chars().map(|c| if c.is_ascii() { c.to_string() } else { format!("\\u{{{:04x}}}", c as u32) }).collect::<String>();
    if path != existing && path.to_lowercase() == existing.to_lowercase() {
        return String::new();
    }
    if path == existing {
        return String::new();
    }
    format!(": the same name in two Unicode spellings, {} and {}", escaped(path), escaped(existing))
}

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Name of the required file at the package root.
pub const SKILL_MD: &str = "SKILL.md";

// The caps are the project's (`core::limits`); re-exported under the names
// this module's callers and tests use.
pub use super::limits::{
    MAX_DEPTH, MAX_DIRS, MAX_FILES, MAX_FILE_BYTES, MAX_TOTAL_BYTES, MAX_ZIP_RATIO, PATH_MAX_BYTES as MAX_PATH_BYTES, ZIP_RATIO_FLOOR,
};

/// Fixed deflate level of the package's gzip stream.
const DEFLATE_LEVEL: u8 = 6;
/// Slack on top of `max_total_bytes` for tar headers when reading a
/// tarball: 512-byte headers and padding for 4,000 entries plus long names.
const TAR_OVERHEAD_BYTES: u64 = 16 * 1024 * 1024;

/// Every cap this module enforces. Tests shrink them; callers use
/// [`Limits::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    pub max_files: usize,
    pub max_dirs: usize,
    pub max_path_bytes: usize,
    pub max_depth: usize,
    pub max_zip_ratio: u64,
    pub zip_ratio_floor: u64,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_file_bytes: MAX_FILE_BYTES,
        max_total_bytes: MAX_TOTAL_BYTES,
        max_files: MAX_FILES,
        max_dirs: MAX_DIRS,
        max_path_bytes: MAX_PATH_BYTES,
        max_depth: MAX_DEPTH,
        max_zip_ratio: MAX_ZIP_RATIO,
        zip_ratio_floor: ZIP_RATIO_FLOOR,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// One file of a package, as listed by [`manifest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative `/`-separated path.
    pub path: String,
    pub size: u64,
    /// Lowercase hex SHA-256 of the content.
    pub sha256: String,
    /// Stored as 0755 (else 0644).
    #[serde(default, skip_serializing_if = "is_false")]
    pub executable: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Why a package could not be built, read or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a directory; pass the skill's folder (the one holding SKILL.md)")]
    NotADirectory { path: PathBuf },
    #[error("no SKILL.md at the package root{}", hint_found(.found_in))]
    MissingSkillMd { found_in: Vec<String> },
    #[error("{path} is a symlink; symlinks are not packaged: replace it with the file it points to")]
    Symlink { path: String },
    #[error("{path} is a {kind}; only regular files and directories can be packaged: remove it")]
    SpecialFile { path: String, kind: &'static str },
    #[error("path {path:?} is not valid UTF-8; rename it")]
    NonUtf8Path { path: String },
    #[error("unsafe path {path:?}: {reason}")]
    UnsafePath { path: String, reason: &'static str },
    #[error("path {path:?} is longer than {limit} bytes; shorten it")]
    PathTooLong { path: String, limit: usize },
    #[error("path {path:?} is nested deeper than {limit} levels; flatten it")]
    TooDeep { path: String, limit: usize },
    #[error("{path:?} appears twice (as {existing:?}{}); paths must be unique, ignoring case and Unicode normalisation (NFC), and not both file and directory", spellings(.path, .existing))]
    DuplicatePath { path: String, existing: String },
    #[error("{path} is larger than {limit} bytes; remove it or split it")]
    FileTooLarge { path: String, limit: u64 },
    #[error("files add up to more than {limit} bytes (passed at {path}); remove large files")]
    TotalTooLarge { path: String, limit: u64 },
    #[error("more than {limit} files; remove some")]
    TooManyFiles { limit: usize },
    #[error("more than {limit} directories; flatten the tree")]
    TooManyDirs { limit: usize },
    #[error("the ZIP lists the same file name twice; re-create it")]
    DuplicateZipNames,
    #[error("ZIP has {entries} entries; at most {limit} are read")]
    TooManyZipEntries { entries: usize, limit: usize },
    #[error("ZIP entry {path} expands more than {limit}:1 (compressed {compressed} bytes); looks like a decompression bomb, store it uncompressed or leave it out")]
    CompressionRatio { path: String, compressed: u64, limit: u64 },
    #[error("ZIP entries {first} and {second} share compressed data (overlapping entries, a known zip-bomb trick); re-create the ZIP")]
    OverlappingZipEntries { first: String, second: String },
    #[error("ZIP entry {path} is encrypted; upload an unencrypted ZIP")]
    EncryptedZipEntry { path: String },
    #[error("not a readable ZIP{}: {source}; re-create it with Deflate or Stored compression", at_path(.path))]
    InvalidZip {
        path: Option<String>,
        #[source]
        source: zip::result::ZipError,
    },
    #[error("subfolder {subdir:?} not found in the ZIP{}", hint_found(.found_in))]
    SubfolderNotFound { subdir: String, found_in: Vec<String> },
    #[error("tar entry {path} is a {kind}; packages hold only regular files and directories")]
    UnsupportedEntry { path: String, kind: String },
    #[error("not a valid package (.tar.gz): {source}")]
    InvalidTarball {
        #[source]
        source: io::Error,
    },
    #[error("{path} exists and is not empty; unpack needs an empty directory")]
    DestinationNotEmpty { path: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn hint_found(found: &[String]) -> String {
    if found.is_empty() {
        String::new()
    } else {
        format!("; SKILL.md was found under {found:?}: pass one of these as the subfolder (--path)")
    }
}

fn at_path(p: &Option<String>) -> String {
    p.as_ref().map(|p| format!(" (entry {p})")).unwrap_or_default()
}

type Result<T, E = PackageError> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------
// Path rules
// ---------------------------------------------------------------------------

/// Checks one relative path against the path rules and the length/depth caps.
/// `path` has no trailing `/` (callers strip a directory's).
pub fn check_rel_path(path: &str, limits: &Limits) -> Result<()> {
    let unsafe_path = |reason| PackageError::UnsafePath { path: path.to_string(), reason };
    if path.is_empty() {
        return Err(unsafe_path("empty path"));
    }
    if path.len() > limits.max_path_bytes {
        return Err(PackageError::PathTooLong { path: path.to_string(), limit: limits.max_path_bytes });
    }
    if path.chars().any(|c| c.is_control()) {
        return Err(unsafe_path("contains a control character"));
    }
    if path.contains('\\') {
        return Err(unsafe_path("contains a backslash; use '/' as the separator"));
    }
    if path.starts_with('/') {
        return Err(unsafe_path("absolute path; paths must be relative to the skill root"));
    }
    let b = path.as_bytes();
    if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' {
        return Err(unsafe_path("starts with a drive letter"));
    }
    let mut depth = 0;
    for comp in path.split('/') {
        match comp {
            "" => return Err(unsafe_path("empty path component ('//' or trailing '/')")),
            "." | ".." => return Err(unsafe_path("'.' or '..' component (path traversal)")),
            _ => depth += 1,
        }
    }
    if depth > limits.max_depth {
        return Err(PackageError::TooDeep { path: path.to_string(), limit: limits.max_depth });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The in-memory tree
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

/// Path bookkeeping shared by building and unpacking: uniqueness (exact and
/// by case), file/dir conflicts, counts and the total byte cap.
struct PathIndex {
    kinds: BTreeMap<String, Kind>,
    by_lower: HashMap<String, String>,
    files: usize,
    dirs: usize,
    total: u64,
    limits: Limits,
}

impl PathIndex {
    fn new(limits: Limits) -> Self {
        PathIndex { kinds: BTreeMap::new(), by_lower: HashMap::new(), files: 0, dirs: 0, total: 0, limits }
    }

    /// Bytes still allowed before the total cap.
    fn remaining(&self) -> u64 {
        self.limits.max_total_bytes - self.total
    }

    /// Registers a checked path and any parents it implies. Returns the new
    /// directories (parents first) so an unpacker can create them.
    /// A directory may be registered again (implied then explicit); a file
    /// may not.
    fn add(&mut self, path: &str, kind: Kind, size: u64) -> Result<Vec<String>> {
        check_rel_path(path, &self.limits)?;
        let mut new_dirs = Vec::new();
        let mut start = 0;
        while let Some(i) = path[start..].find('/') {
            let parent = &path[..start + i];
            if self.insert(parent, Kind::Dir)? {
                new_dirs.push(parent.to_string());
            }
            start += i + 1;
        }
        match kind {
            Kind::Dir => {
                if self.insert(path, Kind::Dir)? {
                    new_dirs.push(path.to_string());
                }
            }
            Kind::File => {
                if !self.insert(path, Kind::File)? {
                    unreachable!("insert refuses an existing file");
                }
                if size > self.limits.max_file_bytes {
                    return Err(PackageError::FileTooLarge { path: path.into(), limit: self.limits.max_file_bytes });
                }
                if size > self.remaining() {
                    return Err(PackageError::TotalTooLarge { path: path.into(), limit: self.limits.max_total_bytes });
                }
                self.total += size;
            }
        }
        Ok(new_dirs)
    }

    /// Inserts one path; `Ok(false)` when it is a directory already known.
    fn insert(&mut self, path: &str, kind: Kind) -> Result<bool> {
        let lower = fold(path);
        if let Some(existing) = self.by_lower.get(&lower) {
            let same = existing == path && kind == Kind::Dir && self.kinds.get(path) == Some(&Kind::Dir);
            if same {
                return Ok(false);
            }
            return Err(PackageError::DuplicatePath { path: path.into(), existing: existing.clone() });
        }
        match kind {
            Kind::Dir => {
                if self.dirs >= self.limits.max_dirs {
                    return Err(PackageError::TooManyDirs { limit: self.limits.max_dirs });
                }
                self.dirs += 1;
            }
            Kind::File => {
                if self.files >= self.limits.max_files {
                    return Err(PackageError::TooManyFiles { limit: self.limits.max_files });
                }
                self.files += 1;
            }
        }
        self.by_lower.insert(lower, path.to_string());
        self.kinds.insert(path.to_string(), kind);
        Ok(true)
    }
}

/// A skill tree held in memory, ready to be written as a package.
struct Tree {
    index: PathIndex,
    files: BTreeMap<String, (bool, Vec<u8>)>,
}

impl Tree {
    fn new(limits: Limits) -> Self {
        Tree { index: PathIndex::new(limits), files: BTreeMap::new() }
    }

    fn add_dir(&mut self, path: &str) -> Result<()> {
        self.index.add(path, Kind::Dir, 0).map(drop)
    }

    fn add_file(&mut self, path: &str, executable: bool, data: Vec<u8>) -> Result<()> {
        self.index.add(path, Kind::File, data.len() as u64)?;
        self.files.insert(path.to_string(), (executable, data));
        Ok(())
    }

    fn require_skill_md(&self, found_in: Vec<String>) -> Result<()> {
        match self.index.kinds.get(SKILL_MD) {
            Some(Kind::File) => Ok(()),
            _ => Err(PackageError::MissingSkillMd { found_in }),
        }
    }

    /// The deterministic archive: see the module docs.
    fn write(&self) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, kind) in &self.index.kinds {
            let mut h = tar::Header::new_gnu();
            h.set_mtime(0);
            h.set_uid(0);
            h.set_gid(0);
            let res = match kind {
                Kind::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    tar.append_data(&mut h, format!("{path}/"), io::empty())
                }
                Kind::File => {
                    let (exec, data) = &self.files[path];
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(if *exec { 0o755 } else { 0o644 });
                    h.set_size(data.len() as u64);
                    tar.append_data(&mut h, path, data.as_slice())
                }
            };
            // Writing to a Vec cannot fail, and every path passed
            // check_rel_path, so the tar crate accepts it.
            res.expect("tar entry for a checked path");
        }
        let tar = tar.into_inner().expect("tar into Vec");
        gzip(&tar)
    }
}

/// gzip with fixed header fields around `miniz_oxide`'s raw deflate.
fn gzip(data: &[u8]) -> Vec<u8> {
    let deflated = miniz_oxide::deflate::compress_to_vec(data, DEFLATE_LEVEL);
    let mut out = Vec::with_capacity(deflated.len() + 18);
    // ID1 ID2 CM=deflate FLG=0 MTIME=0 XFL=0 OS=255(unknown)
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    out.extend_from_slice(&deflated);
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Reads `r` to the end, refusing as soon as the per-file cap, the total
/// cap or (for ZIP entries, `compressed = Some`) the ratio cap is passed.
fn read_capped(r: &mut dyn Read, path: &str, compressed: Option<u64>, index: &PathIndex) -> Result<Vec<u8>, ReadCapError> {
    let limits = &index.limits;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadCapError::Io(e)),
        };
        out.extend_from_slice(&buf[..n]);
        let len = out.len() as u64;
        if len > limits.max_file_bytes {
            return Err(ReadCapError::Cap(PackageError::FileTooLarge { path: path.into(), limit: limits.max_file_bytes }));
        }
        if len > index.remaining() {
            return Err(ReadCapError::Cap(PackageError::TotalTooLarge { path: path.into(), limit: limits.max_total_bytes }));
        }
        if let Some(c) = compressed {
            if len > limits.zip_ratio_floor && len > limits.max_zip_ratio.saturating_mul(c.max(1)) {
                return Err(ReadCapError::Cap(PackageError::CompressionRatio {
                    path: path.into(),
                    compressed: c,
                    limit: limits.max_zip_ratio,
                }));
            }
        }
    }
    Ok(out)
}

enum ReadCapError {
    Cap(PackageError),
    Io(io::Error),
}

// ---------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------

/// Builds a package from a skill directory with the default limits.
pub fn build_from_dir(dir: &Path) -> Result<Vec<u8>> {
    build_from_dir_with(dir, &Limits::DEFAULT)
}

/// Builds a package from a skill directory.
pub fn build_from_dir_with(dir: &Path, limits: &Limits) -> Result<Vec<u8>> {
    let meta = fs::symlink_metadata(dir).map_err(|source| PackageError::Read { path: dir.into(), source })?;
    if !meta.is_dir() {
        return Err(PackageError::NotADirectory { path: dir.into() });
    }
    let mut tree = Tree::new(*limits);
    walk_dir(dir, "", &mut tree)?;
    tree.require_skill_md(Vec::new())?;
    Ok(tree.write())
}

fn walk_dir(dir: &Path, rel: &str, tree: &mut Tree) -> Result<()> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PackageError::Read { path, source }
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_err(dir))? {
        let entry = entry.map_err(read_err(dir))?;
        let name = entry.file_name();
        let name =
            name.to_str().ok_or_else(|| PackageError::NonUtf8Path { path: format!("{rel}{}", entry.file_name().to_string_lossy()) })?;
        names.push(name.to_string());
    }
    names.sort();
    for name in names {
        if name == ".git" {
            continue;
        }
        let abs = dir.join(&name);
        let path = format!("{rel}{name}");
        let meta = fs::symlink_metadata(&abs).map_err(read_err(&abs))?;
        let ft = meta.file_type();
        if ft.is_symlink() {
            return Err(PackageError::Symlink { path });
        } else if ft.is_dir() {
            tree.add_dir(&path)?;
            walk_dir(&abs, &format!("{path}/"), tree)?;
        } else if ft.is_file() {
            // Refuse early on the size the filesystem reports, then read
            // with the cap anyway in case the file grows meanwhile.
            if meta.len() > tree.index.limits.max_file_bytes {
                return Err(PackageError::FileTooLarge { path, limit: tree.index.limits.max_file_bytes });
            }
            check_rel_path(&path, &tree.index.limits)?;
            let mut f = fs::File::open(&abs).map_err(read_err(&abs))?;
            let data = match read_capped(&mut f, &path, None, &tree.index) {
                Ok(d) => d,
                Err(ReadCapError::Cap(e)) => return Err(e),
                Err(ReadCapError::Io(source)) => return Err(PackageError::Read { path: abs, source }),
            };
            tree.add_file(&path, is_executable(&meta), data)?;
        } else {
            return Err(PackageError::SpecialFile { path, kind: special_kind(&ft) });
        }
    }
    Ok(())
}

/// A file is executable for packaging when any execute bit is set.
#[cfg(unix)]
pub(crate) fn is_executable(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
pub(crate) fn is_executable(_meta: &fs::Metadata) -> bool {
    false
}

/// What a refused special file is, for the error.
#[cfg(unix)]
pub(crate) fn special_kind(ft: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

#[cfg(not(unix))]
pub(crate) fn special_kind(_ft: &fs::FileType) -> &'static str {
    "special file"
}

/// Builds a package from a ZIP with the default limits. `subdir` names the
/// folder holding `SKILL.md`; `None` means the ZIP's root.
pub fn build_from_zip(zip_bytes: &[u8], subdir: Option<&str>) -> Result<Vec<u8>> {
    build_from_zip_with(zip_bytes, subdir, &Limits::DEFAULT)
}

struct ZipEntryInfo {
    index: usize,
    name: String,
    is_dir: bool,
    executable: bool,
    compressed: u64,
    declared: u64,
}

/// Builds a package from a ZIP. Every entry is checked (path rules,
/// duplicates, type, encryption, overlap), including entries outside
/// `subdir`, which are then left out; only selected entries are inflated.
pub fn build_from_zip_with(zip_bytes: &[u8], subdir: Option<&str>, limits: &Limits) -> Result<Vec<u8>> {
    zip_archive(zip_bytes, subdir, limits, true)
}

/// A ZIP's folder (`subdir`, or the root) as this module's archive, with
/// every check of [`build_from_zip_with`] but without asking for a
/// `SKILL.md` at its root: a source's ZIP holds many skills, found by
/// discovery once it is unpacked ([`unpack_with`]).
pub fn zip_folder_archive(zip_bytes: &[u8], subdir: Option<&str>, limits: &Limits) -> Result<Vec<u8>> {
    zip_archive(zip_bytes, subdir, limits, false)
}

fn zip_archive(zip_bytes: &[u8], subdir: Option<&str>, limits: &Limits, one_skill: bool) -> Result<Vec<u8>> {
    let invalid = |path: Option<&str>| {
        let path = path.map(str::to_string);
        move |source| PackageError::InvalidZip { path, source }
    };
    let mut archive = zip::ZipArchive::new(io::Cursor::new(zip_bytes)).map_err(invalid(None))?;
    let entry_limit = limits.max_files + limits.max_dirs;
    if archive.len() > entry_limit {
        return Err(PackageError::TooManyZipEntries { entries: archive.len(), limit: entry_limit });
    }
    // The reader keeps one of two same-named records; refuse instead.
    if archive.has_duplicate_names() {
        return Err(PackageError::DuplicateZipNames);
    }

    // Pass 1: metadata only.
    let mut infos = Vec::with_capacity(archive.len());
    let mut spans = Vec::with_capacity(archive.len());
    let mut seen: HashMap<String, String> = HashMap::new();
    for i in 0..archive.len() {
        let f = archive.by_index_raw(i).map_err(invalid(None))?;
        let raw_name = f.name().map_err(invalid(None))?.into_owned();
        let is_dir = raw_name.ends_with('/');
        let name = raw_name.strip_suffix('/').unwrap_or(&raw_name).to_string();
        check_rel_path(&name, limits)?;
        if f.encrypted() {
            return Err(PackageError::EncryptedZipEntry { path: name });
        }
        let mode = f.unix_mode();
        if let Some(mode) = mode {
            match mode & 0o170000 {
                0 | 0o100000 | 0o040000 => {}
                0o120000 => return Err(PackageError::Symlink { path: name }),
                0o010000 => return Err(PackageError::SpecialFile { path: name, kind: "FIFO" }),
                0o140000 => return Err(PackageError::SpecialFile { path: name, kind: "socket" }),
                0o060000 => return Err(PackageError::SpecialFile { path: name, kind: "block device" }),
                0o020000 => return Err(PackageError::SpecialFile { path: name, kind: "character device" }),
                _ => return Err(PackageError::SpecialFile { path: name, kind: "special file" }),
            }
            if (mode & 0o170000 == 0o040000) != is_dir && mode & 0o170000 != 0 {
                return Err(PackageError::UnsafePath { path: name, reason: "directory flag and name disagree" });
            }
        }
        let lower = fold(&name);
        if let Some(existing) = seen.insert(lower, name.clone()) {
            return Err(PackageError::DuplicatePath { path: name, existing });
        }
        let data_start = f.data_start().unwrap_or_else(|| f.header_start());
        spans.push((f.header_start(), data_start.saturating_add(f.compressed_size()), name.clone()));
        infos.push(ZipEntryInfo {
            index: i,
            name,
            is_dir,
            executable: mode.is_some_and(|m| m & 0o111 != 0) && !is_dir,
            compressed: f.compressed_size(),
            declared: f.size(),
        });
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(PackageError::OverlappingZipEntries { first: w[0].2.clone(), second: w[1].2.clone() });
        }
    }

    // Select the subtree.
    let prefix = match subdir.map(|s| s.trim_matches('/')).filter(|s| !s.is_empty()) {
        None => String::new(),
        Some(s) => {
            check_rel_path(s, limits)?;
            format!("{s}/")
        }
    };
    let skill_md_dirs: Vec<String> = infos
        .iter()
        .filter(|e| !e.is_dir && (e.name == SKILL_MD || e.name.ends_with("/SKILL.md")))
        .map(|e| e.name.strip_suffix(SKILL_MD).unwrap_or("").trim_end_matches('/').to_string())
        .filter(|d| !d.is_empty() && !d.starts_with("__MACOSX"))
        .take(5)
        .collect();
    let mut selected: Vec<(&ZipEntryInfo, String)> = infos
        .iter()
        .filter(|e| !e.name.starts_with("__MACOSX/") && e.name != "__MACOSX")
        .filter_map(|e| {
            let rest = e.name.strip_prefix(prefix.as_str())?;
            (!rest.is_empty()).then(|| (e, rest.to_string()))
        })
        .collect();
    if selected.is_empty() && !prefix.is_empty() {
        return Err(PackageError::SubfolderNotFound { subdir: prefix.trim_end_matches('/').into(), found_in: skill_md_dirs });
    }
    selected.sort_by(|a, b| a.1.cmp(&b.1));
    if one_skill && !selected.iter().any(|(e, rel)| !e.is_dir && rel == SKILL_MD) {
        return Err(PackageError::MissingSkillMd { found_in: skill_md_dirs });
    }

    // Pass 2: inflate the selected files, capped while streaming.
    let mut tree = Tree::new(*limits);
    for (e, rel) in selected {
        if e.is_dir {
            tree.add_dir(&rel)?;
            continue;
        }
        // The declared size may only refuse early; it never allows.
        if e.declared > limits.max_file_bytes {
            return Err(PackageError::FileTooLarge { path: rel, limit: limits.max_file_bytes });
        }
        let mut f = archive.by_index(e.index).map_err(invalid(Some(&e.name)))?;
        let data = match read_capped(&mut f, &rel, Some(e.compressed), &tree.index) {
            Ok(d) => d,
            Err(ReadCapError::Cap(err)) => return Err(err),
            Err(ReadCapError::Io(source)) => return Err(PackageError::InvalidZip { path: Some(e.name.clone()), source: source.into() }),
        };
        tree.add_file(&rel, e.executable, data)?;
    }
    Ok(tree.write())
}

/// Re-packs any skill `.tar.gz` (for example a ToolHive layer) into this
/// module's deterministic form, with the same checks as [`unpack`].
pub fn build_from_tarball(bytes: &[u8], limits: &Limits) -> Result<Vec<u8>> {
    let mut tree = Tree::new(*limits);
    read_tarball(bytes, limits, |entry| {
        match entry {
            TarItem::Dir(path) => tree.add_dir(path)?,
            TarItem::File { path, executable, reader, size_hint } => {
                // Declared sizes refuse early; the read is capped regardless.
                if size_hint > limits.max_file_bytes {
                    return Err(PackageError::FileTooLarge { path: path.into(), limit: limits.max_file_bytes });
                }
                let data = match read_capped(reader, path, None, &tree.index) {
                    Ok(d) => d,
                    Err(ReadCapError::Cap(e)) => return Err(e),
                    Err(ReadCapError::Io(source)) => return Err(PackageError::InvalidTarball { source }),
                };
                tree.add_file(path, executable, data)?;
            }
        }
        Ok(())
    })?;
    tree.require_skill_md(Vec::new())?;
    Ok(tree.write())
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

enum TarItem<'a> {
    Dir(&'a str),
    File { path: &'a str, executable: bool, size_hint: u64, reader: &'a mut dyn Read },
}

/// Caps the decompressed tar stream; sets `hit` when the cap is reached so
/// the caller can tell a cap from a corrupt archive.
struct CapReader<R> {
    inner: R,
    remaining: u64,
    hit: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<R: Read> Read for CapReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            // Probe: is there more?
            let mut one = [0u8; 1];
            return match self.inner.read(&mut one)? {
                0 => Ok(0),
                _ => {
                    self.hit.set(true);
                    Err(io::Error::other("package expands past the size cap"))
                }
            };
        }
        let max = buf.len().min(self.remaining.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..max])?;
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Streams a `.tar.gz`, checking entry types and paths, and hands each entry
/// to `visit`. Tar-level caps (raw size) are enforced here; per-file and
/// total caps by the visitor through its `PathIndex`.
fn read_tarball(bytes: &[u8], limits: &Limits, mut visit: impl FnMut(TarItem<'_>) -> Result<()>) -> Result<()> {
    let hit = std::rc::Rc::new(std::cell::Cell::new(false));
    let reader = CapReader {
        inner: flate2::read::GzDecoder::new(bytes),
        remaining: limits.max_total_bytes.saturating_add(TAR_OVERHEAD_BYTES),
        hit: hit.clone(),
    };
    let tar_err = |source: io::Error| {
        if hit.get() {
            PackageError::TotalTooLarge { path: "(tar stream)".into(), limit: limits.max_total_bytes }
        } else {
            PackageError::InvalidTarball { source }
        }
    };
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(tar_err)?;
    for entry in entries {
        let mut entry = entry.map_err(tar_err)?;
        let raw = entry.path_bytes().into_owned();
        let name =
            String::from_utf8(raw).map_err(|e| PackageError::NonUtf8Path { path: String::from_utf8_lossy(e.as_bytes()).into_owned() })?;
        let etype = entry.header().entry_type();
        let kind = match etype {
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::XGlobalHeader => continue,
            tar::EntryType::Symlink => return Err(PackageError::Symlink { path: name }),
            other => {
                let kind = match other {
                    tar::EntryType::Link => "hard link".to_string(),
                    tar::EntryType::Char => "character device".into(),
                    tar::EntryType::Block => "block device".into(),
                    tar::EntryType::Fifo => "FIFO".into(),
                    tar::EntryType::GNUSparse => "sparse file".into(),
                    o => format!("entry of type {:?}", o.as_byte() as char),
                };
                return Err(PackageError::UnsupportedEntry { path: name, kind });
            }
        };
        // "./" prefixes are common in hand-made tarballs; a bare "." is the root.
        let trimmed = name.strip_prefix("./").unwrap_or(&name);
        let path = match kind {
            Kind::Dir => trimmed.strip_suffix('/').unwrap_or(trimmed),
            Kind::File => trimmed,
        };
        if kind == Kind::Dir && (path.is_empty() || path == ".") {
            continue;
        }
        check_rel_path(path, limits)?;
        match kind {
            Kind::Dir => visit(TarItem::Dir(path))?,
            Kind::File => {
                let executable = entry.header().mode().map(|m| m & 0o111 != 0).unwrap_or(false);
                let size_hint = entry.header().size().unwrap_or(0);
                visit(TarItem::File { path, executable, size_hint, reader: &mut entry })?;
            }
        }
    }
    if hit.get() {
        return Err(PackageError::TotalTooLarge { path: "(tar stream)".into(), limit: limits.max_total_bytes });
    }
    Ok(())
}

/// Lists a package's files (sorted by path) with the default limits.
pub fn manifest(bytes: &[u8]) -> Result<Vec<FileEntry>> {
    manifest_with(bytes, &Limits::DEFAULT)
}

/// Lists a package's files (sorted by path), applying every unpack check
/// without writing anything.
pub fn manifest_with(bytes: &[u8], limits: &Limits) -> Result<Vec<FileEntry>> {
    let mut index = PathIndex::new(*limits);
    let mut out = Vec::new();
    read_tarball(bytes, limits, |item| {
        match item {
            TarItem::Dir(path) => {
                index.add(path, Kind::Dir, 0)?;
            }
            TarItem::File { path, executable, reader, size_hint } => {
                if size_hint > limits.max_file_bytes {
                    return Err(PackageError::FileTooLarge { path: path.into(), limit: limits.max_file_bytes });
                }
                let (size, sha256) = hash_capped(reader, path, &index)?;
                index.add(path, Kind::File, size)?;
                out.push(FileEntry { path: path.to_string(), size, sha256, executable });
            }
        }
        Ok(())
    })?;
    if index.kinds.get(SKILL_MD) != Some(&Kind::File) {
        return Err(PackageError::MissingSkillMd { found_in: Vec::new() });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Hashes a reader without keeping it, with the per-file and total caps.
fn hash_capped(r: &mut dyn Read, path: &str, index: &PathIndex) -> Result<(u64, String)> {
    let mut h = Sha256::new();
    let mut n = 0u64;
    copy_capped(
        r,
        path,
        index,
        |chunk| {
            h.update(chunk);
            Ok(())
        },
        &mut n,
    )?;
    Ok((n, hex::encode(h.finalize())))
}

fn copy_capped(r: &mut dyn Read, path: &str, index: &PathIndex, mut sink: impl FnMut(&[u8]) -> io::Result<()>, n: &mut u64) -> Result<()> {
    let limits = &index.limits;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(PackageError::InvalidTarball { source }),
        };
        *n += k as u64;
        if *n > limits.max_file_bytes {
            return Err(PackageError::FileTooLarge { path: path.into(), limit: limits.max_file_bytes });
        }
        if *n > index.remaining() {
            return Err(PackageError::TotalTooLarge { path: path.into(), limit: limits.max_total_bytes });
        }
        sink(&buf[..k]).map_err(|source| PackageError::Write { path: path.into(), source })?;
    }
}

/// Extracts a package into `dest` (default limits); see [`unpack_with`].
pub fn unpack(bytes: &[u8], dest: &Path) -> Result<Vec<FileEntry>> {
    unpack_with(bytes, dest, &Limits::DEFAULT)
}

/// Extracts a package into `dest`: an empty directory, or a path that does
/// not exist yet (its parent must; it is created 0755). Files are created
/// with `create_new` (never through an existing path) as 0644/0755,
/// directories as 0755. Every check of [`manifest_with`] applies while
/// streaming; on any error everything written so far is removed (and a
/// `dest` this call created, too). Returns the listing.
pub fn unpack_with(bytes: &[u8], dest: &Path, limits: &Limits) -> Result<Vec<FileEntry>> {
    unpack_checked(bytes, dest, limits, true)
}

/// [`unpack_with`] for an archive of many skills ([`zip_folder_archive`]),
/// which has no `SKILL.md` of its own at its root.
pub fn unpack_folder_with(bytes: &[u8], dest: &Path, limits: &Limits) -> Result<Vec<FileEntry>> {
    unpack_checked(bytes, dest, limits, false)
}

fn unpack_checked(bytes: &[u8], dest: &Path, limits: &Limits, one_skill: bool) -> Result<Vec<FileEntry>> {
    let created = match fs::symlink_metadata(dest) {
        Ok(meta) => {
            if !meta.is_dir() {
                return Err(PackageError::NotADirectory { path: dest.into() });
            }
            if fs::read_dir(dest).map_err(|source| PackageError::Read { path: dest.into(), source })?.next().is_some() {
                return Err(PackageError::DestinationNotEmpty { path: dest.into() });
            }
            false
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir(dest).map_err(|source| PackageError::Write { path: dest.into(), source })?;
            set_mode(dest, 0o755)?;
            true
        }
        Err(source) => return Err(PackageError::Read { path: dest.into(), source }),
    };
    let result = unpack_inner(bytes, dest, limits, one_skill);
    if result.is_err() && created {
        let _ = fs::remove_dir_all(dest);
    } else if result.is_err() {
        if let Ok(rd) = fs::read_dir(dest) {
            for e in rd.flatten() {
                let p = e.path();
                let _ = if e.file_type().map(|t| t.is_dir()).unwrap_or(false) { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
            }
        }
    }
    result
}

fn unpack_inner(bytes: &[u8], dest: &Path, limits: &Limits, one_skill: bool) -> Result<Vec<FileEntry>> {
    let mut index = PathIndex::new(*limits);
    let mut out = Vec::new();
    let mkdirs = |dirs: Vec<String>| -> Result<()> {
        for d in dirs {
            let p = dest.join(&d);
            fs::create_dir(&p).map_err(|source| PackageError::Write { path: p.clone(), source })?;
            set_mode(&p, 0o755)?;
        }
        Ok(())
    };
    read_tarball(bytes, limits, |item| {
        match item {
            TarItem::Dir(path) => mkdirs(index.add(path, Kind::Dir, 0)?)?,
            TarItem::File { path, executable, reader, size_hint } => {
                if size_hint > limits.max_file_bytes {
                    return Err(PackageError::FileTooLarge { path: path.into(), limit: limits.max_file_bytes });
                }
                // Register with size 0 first (uniqueness, parents), then
                // count the real bytes once streamed.
                mkdirs(index.add(path, Kind::File, 0)?)?;
                let p = dest.join(path);
                let mut f = create_new_file(&p, executable)?;
                let mut h = Sha256::new();
                let mut n = 0u64;
                copy_capped(
                    reader,
                    path,
                    &index,
                    |chunk| {
                        h.update(chunk);
                        f.write_all(chunk)
                    },
                    &mut n,
                )?;
                index.total += n;
                out.push(FileEntry { path: path.to_string(), size: n, sha256: hex::encode(h.finalize()), executable });
            }
        }
        Ok(())
    })?;
    if one_skill && index.kinds.get(SKILL_MD) != Some(&Kind::File) {
        return Err(PackageError::MissingSkillMd { found_in: Vec::new() });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

#[cfg(unix)]
fn create_new_file(p: &Path, executable: bool) -> Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if executable { 0o755 } else { 0o644 })
        .open(p)
        .map_err(|source| PackageError::Write { path: p.into(), source })?;
    // The umask may have removed bits; set exactly.
    set_mode(p, if executable { 0o755 } else { 0o644 })?;
    Ok(f)
}

#[cfg(not(unix))]
fn create_new_file(p: &Path, _executable: bool) -> Result<fs::File> {
    fs::OpenOptions::new().write(true).create_new(true).open(p).map_err(|source| PackageError::Write { path: p.into(), source })
}

#[cfg(unix)]
fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).map_err(|source| PackageError::Write { path: p.into(), source })
}

#[cfg(not(unix))]
fn set_mode(_p: &Path, _mode: u32) -> Result<()> {
    Ok(())
}

/// Checks a set of (path, size) pairs, such as job files, against the path
/// rules (uniqueness included) and the file, total and count caps.
pub fn check_file_set<'a>(files: impl IntoIterator<Item = (&'a str, u64)>, limits: &Limits) -> Result<()> {
    let mut index = PathIndex::new(*limits);
    for (path, size) in files {
        index.add(path, Kind::File, size)?;
    }
    Ok(())
}

/// SHA-256 of a package, `sha256:<hex>` (the OCI layer digest).
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}
