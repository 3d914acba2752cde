//! The outputs tar, streamed from the files as they are read, walked
//! without ever following a symlink.

use super::super::{ArtifactLimits, OutputManifest, SetFile, SkipReason, Skipped, MANIFEST_PATH, RESULT_PREFIX, WORK_PREFIX};
use crate::core::package::{self};
use crate::core::paths::RelPath;
use sha2::{Digest, Sha256};
use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

use super::*;

/// The request body: chunks from the tar writer thread.
pub(super) struct RxStream(pub(super) mpsc::Receiver<io::Result<Vec<u8>>>);

impl futures::Stream for RxStream {
    type Item = io::Result<Vec<u8>>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// `Write` into the channel in 256 KiB chunks (backpressure: the channel
/// holds 8, so at most ~2 MiB is buffered).
pub(super) struct ChannelWriter {
    pub(super) tx: mpsc::Sender<io::Result<Vec<u8>>>,
    pub(super) buf: Vec<u8>,
}

pub(super) const CHUNK: usize = 256 * 1024;

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the request ended before the upload was sent"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Which directory a planned file is under.
#[derive(Debug, Clone, Copy)]
pub(super) enum Root {
    Work,
    Result,
}

#[derive(Debug)]
pub(super) struct PlanFile {
    /// `result/...` or `work/...`.
    pub(super) set_path: String,
    pub(super) root: Root,
    /// Components below the root.
    pub(super) comps: Vec<CString>,
    pub(super) size: u64,
}

#[derive(Debug)]
pub(super) struct Plan {
    pub(super) work: PathBuf,
    pub(super) result_dir: PathBuf,
    pub(super) files: Vec<PlanFile>,
    pub(super) skipped: Vec<Skipped>,
    pub(super) skipped_omitted: u64,
    pub(super) complete: bool,
    pub(super) max_skipped: usize,
}

impl Plan {
    fn skip(&mut self, path: String, reason: SkipReason, size: Option<u64>) {
        if self.skipped.len() < self.max_skipped {
            self.skipped.push(Skipped { path, reason, size });
        } else {
            self.skipped_omitted += 1;
        }
    }
}

/// Decides what to send: the result files, then the walk of the work
/// directory with the caps applied in walk order (names sorted).
pub(super) fn plan_upload(work: &Path, result_file: &Path, l: &ArtifactLimits) -> Result<Plan, ClientError> {
    let result_dir = result_file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let result_name = result_file.file_name().unwrap_or(OsStr::new("result.json"));
    let mut plan = Plan {
        work: work.to_path_buf(),
        result_dir: result_dir.clone(),
        files: Vec::new(),
        skipped: Vec::new(),
        skipped_omitted: 0,
        complete: false,
        max_skipped: l.max_skipped_listed,
    };
    // The result files.
    if let Ok(dir) = fsx::open_dir(&result_dir) {
        for (name, stored, cap) in [
            (result_name, "result.json", l.max_result_bytes),
            (OsStr::new("stdout"), "stdout", l.max_stream_bytes),
            (OsStr::new("stderr"), "stderr", l.max_stream_bytes),
        ] {
            let c = CString::new(name.as_bytes()).map_err(|_| ClientError::Config("the result path has a NUL".into()))?;
            let set_path = format!("{RESULT_PREFIX}{stored}");
            match fsx::stat_at(&dir, &c) {
                Err(_) => {}
                Ok(st) => match fsx::kind(&st) {
                    fsx::Kind::Symlink => plan.skip(set_path, SkipReason::Symlink, None),
                    fsx::Kind::Other | fsx::Kind::Dir => plan.skip(set_path, SkipReason::NotRegular, None),
                    fsx::Kind::File if st.st_size as u64 > cap => plan.skip(set_path, SkipReason::FileTooLarge, Some(st.st_size as u64)),
                    fsx::Kind::File => {
                        plan.complete |= stored == "result.json";
                        plan.files.push(PlanFile { set_path, root: Root::Result, comps: vec![c], size: st.st_size as u64 });
                    }
                },
            }
        }
    }
    // The work directory.
    let root = fsx::open_dir(work).map_err(io_err(format!("opening {}", work.display())))?;
    let mut walk = Walk { l: *l, seen: 0, stopped: false, files: 0, dirs: 0, total: 0, lower: std::collections::HashMap::new() };
    walk.dir(&mut plan, &root, "", &[], 0);
    Ok(plan)
}

pub(super) struct Walk {
    pub(super) l: ArtifactLimits,
    pub(super) seen: usize,
    pub(super) stopped: bool,
    pub(super) files: usize,
    pub(super) dirs: usize,
    pub(super) total: u64,
    /// Lower-cased path -> the path taken (files and implied directories).
    pub(super) lower: std::collections::HashMap<String, String>,
}

impl Walk {
    /// `prefix` is the directory's path below the work root (`""` or `a/b/`).
    fn dir(&mut self, plan: &mut Plan, fd: &OwnedFd, prefix: &str, comps: &[CString], depth: usize) {
        let names = match fsx::list(fd) {
            Ok(n) => n,
            Err(_) => {
                plan.skip(format!("{WORK_PREFIX}{prefix}"), SkipReason::Unreadable, None);
                return;
            }
        };
        for name in names {
            if self.stopped {
                return;
            }
            self.seen += 1;
            let shown = format!("{WORK_PREFIX}{prefix}{}", String::from_utf8_lossy(name.as_bytes()));
            if self.seen > self.l.max_walk_entries {
                self.stopped = true;
                plan.skip(shown, SkipReason::WalkLimit, None);
                return;
            }
            let Ok(st) = fsx::stat_at(fd, &name) else {
                plan.skip(shown, SkipReason::Unreadable, None);
                continue;
            };
            let size = st.st_size as u64;
            let Ok(utf8) = std::str::from_utf8(name.as_bytes()) else {
                plan.skip(shown, SkipReason::BadName, None);
                continue;
            };
            let rel = format!("{prefix}{utf8}");
            let mut sub = comps.to_vec();
            sub.push(name.clone());
            match fsx::kind(&st) {
                fsx::Kind::Symlink => plan.skip(shown, SkipReason::Symlink, None),
                fsx::Kind::Other => plan.skip(shown, SkipReason::NotRegular, None),
                fsx::Kind::Dir => {
                    // Files inside sit one level deeper than the directory.
                    if depth + 2 > self.l.file_set().max_depth {
                        plan.skip(shown, SkipReason::TooDeep, None);
                        continue;
                    }
                    match fsx::open_dir_at(fd, &name) {
                        Ok(child) => self.dir(plan, &child, &format!("{rel}/"), &sub, depth + 1),
                        Err(_) => plan.skip(shown, SkipReason::Unreadable, None),
                    }
                }
                fsx::Kind::File => {
                    if let Some(reason) = self.admit(&rel, size) {
                        plan.skip(shown, reason, Some(size));
                    } else {
                        plan.files.push(PlanFile { set_path: format!("{WORK_PREFIX}{rel}"), root: Root::Work, comps: sub, size });
                    }
                }
            }
        }
    }

    /// The caps and path rules for one file, in the order the endpoint checks them.
    fn admit(&mut self, rel: &str, size: u64) -> Option<SkipReason> {
        let l = self.l;
        // Both rule sets: the package rules the registry set obeys, and
        // RelPath's, which `GET .../outputs/{*path}` applies when reading back.
        if package::check_rel_path(rel, &l.file_set()).is_err() || RelPath::parse(rel).is_err() {
            return Some(SkipReason::BadName);
        }
        // Case (and Unicode spelling) collisions with anything taken, the file and its parents.
        let parents: Vec<&str> = rel.match_indices('/').map(|(i, _)| &rel[..i]).collect();
        let mut new_dirs = 0;
        for p in &parents {
            match self.lower.get(&package::fold(p)) {
                Some(taken) if taken != p => return Some(SkipReason::CaseCollision),
                Some(_) => {}
                None => new_dirs += 1,
            }
        }
        if self.lower.contains_key(&package::fold(rel)) {
            return Some(SkipReason::CaseCollision);
        }
        if size > l.max_file_bytes {
            return Some(SkipReason::FileTooLarge);
        }
        if self.files >= l.max_files {
            return Some(SkipReason::FileLimit);
        }
        if self.total + size > l.max_total_bytes {
            return Some(SkipReason::TotalTooLarge);
        }
        if self.dirs + new_dirs > l.max_dirs {
            return Some(SkipReason::DirLimit);
        }
        for p in parents {
            self.lower.entry(package::fold(p)).or_insert_with(|| p.to_string());
        }
        self.lower.insert(package::fold(rel), rel.to_string());
        self.dirs += new_dirs;
        self.files += 1;
        self.total += size;
        None
    }
}

/// Hashes what it reads and insists on exactly `size` bytes (a tar header
/// promises the size before the content).
pub(super) struct ExactReader {
    pub(super) inner: io::Take<std::fs::File>,
    pub(super) left: u64,
    pub(super) hasher: Sha256,
}

impl Read for ExactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank while it was being uploaded"));
        }
        self.left -= n as u64;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes the tar (on a blocking thread) and returns the manifest sent
/// last. On failure the body stream ends with an error, so the request is
/// aborted rather than ending in a truncated (but well-framed) body.
pub(super) fn write_tar(
    plan: Plan,
    ns: &str,
    uid: &str,
    tx: mpsc::Sender<io::Result<Vec<u8>>>,
) -> Result<(OutputManifest, Vec<u8>), ClientError> {
    let abort = tx.clone();
    let result = write_tar_inner(plan, ns, uid, tx);
    if let Err(e) = &result {
        let _ = abort.blocking_send(Err(io::Error::other(e.to_string())));
    }
    result
}

pub(super) fn write_tar_inner(
    plan: Plan,
    ns: &str,
    uid: &str,
    tx: mpsc::Sender<io::Result<Vec<u8>>>,
) -> Result<(OutputManifest, Vec<u8>), ClientError> {
    let mut builder = tar::Builder::new(ChannelWriter { tx, buf: Vec::with_capacity(CHUNK) });
    let mut files = Vec::with_capacity(plan.files.len());
    for pf in &plan.files {
        let root = match pf.root {
            Root::Work => &plan.work,
            Root::Result => &plan.result_dir,
        };
        let file = fsx::open_beneath(root, &pf.comps).map_err(io_err(format!("opening {}", pf.set_path)))?;
        let mut reader = ExactReader { inner: file.take(pf.size), left: pf.size, hasher: Sha256::new() };
        let mut header = file_header(pf.size);
        builder.append_data(&mut header, &pf.set_path, &mut reader).map_err(io_err(format!("sending {}", pf.set_path)))?;
        files.push(SetFile {
            path: pf.set_path.clone(),
            size: pf.size,
            digest: format!("sha256:{}", hex::encode(reader.hasher.finalize())),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let manifest = OutputManifest {
        schema_version: 1,
        namespace: ns.into(),
        uid: uid.into(),
        complete: plan.complete,
        files,
        skipped: plan.skipped,
        skipped_omitted: plan.skipped_omitted,
    };
    let bytes = serde_json::to_vec(&manifest).expect("the manifest serializes");
    let mut header = file_header(bytes.len() as u64);
    builder.append_data(&mut header, MANIFEST_PATH, bytes.as_slice()).map_err(io_err("sending the manifest"))?;
    let mut w = builder.into_inner().map_err(io_err("finishing the upload"))?;
    w.flush().map_err(io_err("finishing the upload"))?;
    Ok((manifest, bytes))
}

pub(super) fn file_header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Directory walking relative to open directory descriptors, never
/// following a symlink below the root (see the module docs).
pub(super) mod fsx {
    use super::*;

    pub(super) enum Kind {
        File,
        Dir,
        Symlink,
        Other,
    }

    pub(super) fn kind(st: &libc::stat) -> Kind {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }

    fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    /// The configured root itself (a mount point; following it is fine).
    pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub(super) fn open_dir_at(dir: &OwnedFd, name: &CStr) -> io::Result<OwnedFd> {
        let fd = cvt(unsafe {
            libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        })?;
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A regular file only: O_NONBLOCK so a FIFO swapped in cannot hang us.
    pub(super) fn open_file_at(dir: &OwnedFd, name: &CStr) -> io::Result<std::fs::File> {
        let fd = cvt(unsafe {
            libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        })?;
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file any more"));
        }
        Ok(file)
    }

    pub(super) fn open_beneath(root: &Path, comps: &[CString]) -> io::Result<std::fs::File> {
        let (last, dirs) = comps.split_last().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut dir = open_dir(root)?;
        for c in dirs {
            dir = open_dir_at(&dir, c)?;
        }
        open_file_at(&dir, last)
    }

    pub(super) fn stat_at(dir: &OwnedFd, name: &CStr) -> io::Result<libc::stat> {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        cvt(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
        Ok(st)
    }

    /// Entry names, sorted, without `.` and `..`.
    pub(super) fn list(dir: &OwnedFd) -> io::Result<Vec<CString>> {
        let dup = cvt(unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        let dirp = unsafe { libc::fdopendir(dup) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            unsafe { libc::close(dup) };
            return Err(e);
        }
        let mut names = Vec::new();
        loop {
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                break;
            }
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            let b = name.to_bytes();
            if b != b"." && b != b".." {
                names.push(name.to_owned());
            }
        }
        unsafe { libc::closedir(dirp) };
        names.sort();
        Ok(names)
    }
}
