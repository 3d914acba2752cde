//! The built-in sandbox's filesystem: a fresh tmpfs root holding exactly
//! the binds, tmpfs, procfs and device nodes the plan names, as bubblewrap
//! builds it (same order, same flags), then pivoted into.
//!
//! Runs in the sandbox's first process, inside its new user and mount
//! namespaces, before anything of the script's exists. Every source path
//! was resolved against the host's root before the first pivot
//! ([`resolve_sources`]): after it, the host is reachable only under
//! `/oldroot`, where an absolute symlink would resolve against the new
//! root instead.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::args::Op;

/// The new root while it is built (inside the first pivot's tmpfs).
const NEWROOT: &str = "/newroot";
/// Where the host's root is while the new one is built.
const OLDROOT: &str = "/oldroot";
/// Device nodes bound from the host into `--dev` (what bubblewrap binds).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Parts of `--proc` that stay read-only (as bubblewrap covers them).
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus"];

/// A step that failed, in words naming the path.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct MountError {
    what: &'static str,
    path: String,
    source: io::Error,
}

fn fail(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MountError {
    let path = path.display().to_string();
    move |source| MountError { what, path, source }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn mount(src: Option<&Path>, dest: &Path, fstype: Option<&str>, flags: libc::c_ulong, data: Option<&str>) -> io::Result<()> {
    let src = src.map(cstr).transpose()?;
    let dest = cstr(dest)?;
    let fstype = fstype.map(|f| CString::new(f).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))).transpose()?;
    let data = data.map(|d| CString::new(d).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is a live NUL-terminated string or null, as mount(2) takes them.
    check(unsafe { libc::mount(ptr(&src), dest.as_ptr(), ptr(&fstype), flags, ptr(&data).cast()) })
}

/// Resolve each bind source against the host's root (symlinks followed,
/// as mount(2) would there); a missing `--ro-bind-try` source drops its op.
pub fn resolve_sources(ops: Vec<Op>) -> Result<Vec<Op>, MountError> {
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        match op {
            Op::Bind { src, dest, writable, must_exist } => match std::fs::canonicalize(&src) {
                Ok(real) => out.push(Op::Bind { src: real, dest, writable, must_exist }),
                Err(_) if !must_exist => {}
                Err(e) => return Err(fail("bind source", &src)(e)),
            },
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Build the new root from `ops` and make it the root.
pub fn build(ops: &[Op]) -> Result<(), MountError> {
    let root = Path::new("/");
    // Nothing mounted here reaches the host, nor the host's later mounts us.
    mount(None, root, None, libc::MS_REC | libc::MS_PRIVATE, None).map_err(fail("make private", root))?;
    let base = Path::new("/tmp");
    mount(Some(Path::new("tmpfs")), base, Some("tmpfs"), libc::MS_NODEV | libc::MS_NOSUID, Some("mode=0755"))
        .map_err(fail("mount the base tmpfs on", base))?;
    let newroot_base = base.join("newroot");
    let oldroot_base = base.join("oldroot");
    for d in [&newroot_base, &oldroot_base] {
        std::fs::create_dir(d).map_err(fail("mkdir", d))?;
    }
    // The new root must be a mount point of its own for the last pivot.
    mount(Some(&newroot_base), &newroot_base, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(fail("bind the new root", &newroot_base))?;
    pivot_root(base, &oldroot_base).map_err(fail("pivot_root into", base))?;
    std::env::set_current_dir(root).map_err(fail("chdir", root))?;

    for op in ops {
        apply(op)?;
    }

    let old = Path::new(OLDROOT);
    // SAFETY: a NUL-terminated literal path.
    check(unsafe { libc::umount2(c"/oldroot".as_ptr(), libc::MNT_DETACH) }).map_err(fail("detach the host root at", old))?;
    let new = Path::new(NEWROOT);
    std::env::set_current_dir(new).map_err(fail("chdir", new))?;
    pivot_root(Path::new("."), Path::new(".")).map_err(fail("pivot_root into", new))?;
    // SAFETY: a NUL-terminated literal path.
    check(unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) }).map_err(fail("detach the base tmpfs at", new))?;
    std::env::set_current_dir(root).map_err(fail("chdir", root))?;
    Ok(())
}

fn pivot_root(new: &Path, old: &Path) -> io::Result<()> {
    let (new, old) = (cstr(new)?, cstr(old)?);
    // SAFETY: two live NUL-terminated paths.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new.as_ptr(), old.as_ptr()) } as libc::c_int)
}

/// `/newroot/<dest>` for a path inside the sandbox.
fn inside(dest: &Path) -> PathBuf {
    Path::new(NEWROOT).join(dest.strip_prefix("/").unwrap_or(dest))
}

/// `/oldroot/<src>` for a host path.
fn host(src: &Path) -> PathBuf {
    Path::new(OLDROOT).join(src.strip_prefix("/").unwrap_or(src))
}

fn mkdirs(dir: &Path) -> Result<(), MountError> {
    std::fs::create_dir_all(dir).map_err(fail("mkdir", dir))
}

/// A mount point of the source's kind: a directory, or an empty file.
fn mount_point(dest: &Path, dir: bool) -> Result<(), MountError> {
    if let Some(parent) = dest.parent() {
        mkdirs(parent)?;
    }
    if dir {
        return mkdirs(dest);
    }
    match std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(dest) {
        Ok(_) => Ok(()),
        Err(e) => Err(fail("create mount point", dest)(e)),
    }
}

fn apply(op: &Op) -> Result<(), MountError> {
    match op {
        Op::Symlink { target, link } => {
            let at = inside(link);
            if let Some(parent) = at.parent() {
                mkdirs(parent)?;
            }
            std::os::unix::fs::symlink(target, &at).map_err(fail("symlink", &at))
        }
        Op::Tmpfs { dest, size } => {
            let at = inside(dest);
            mkdirs(&at)?;
            let data = match size {
                Some(n) => format!("mode=0755,size={n}"),
                None => "mode=0755".into(),
            };
            mount(Some(Path::new("tmpfs")), &at, Some("tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some(&data))
                .map_err(fail("mount tmpfs on", &at))
        }
        Op::Bind { src, dest, writable, .. } => {
            let from = host(src);
            let at = inside(dest);
            let dir = std::fs::metadata(&from).map_err(fail("bind source", src))?.is_dir();
            mount_point(&at, dir)?;
            bind(&from, &at, !*writable)
        }
        Op::BindFd { fd, dest } => {
            // A descriptor of another mount namespace cannot be a bind's
            // source: bind the path it names (as bubblewrap does), then make
            // sure the bound file is the descriptor's (no swap in between).
            let link = host(Path::new(&format!("/proc/self/fd/{fd}")));
            let named = std::fs::read_link(&link).map_err(fail("read descriptor", &link))?;
            let from = host(&named);
            let at = inside(dest);
            let dir = std::fs::metadata(&from).map_err(fail("bind descriptor's file", &named))?.is_dir();
            mount_point(&at, dir)?;
            bind(&from, &at, true)?;
            same_file(*fd, &at).map_err(fail("bind descriptor's file", &named))?;
            // SAFETY: the descriptor was handed to us for this bind alone.
            unsafe { libc::close(*fd) };
            Ok(())
        }
        Op::RemountRo(dest) => {
            let at = inside(dest);
            remount(&at, libc::MS_RDONLY).map_err(fail("remount read-only", &at))
        }
        Op::Proc(dest) => {
            let at = inside(dest);
            mkdirs(&at)?;
            mount(Some(Path::new("proc")), &at, Some("proc"), libc::MS_NOSUID | libc::MS_NOEXEC | libc::MS_NODEV, None)
                .map_err(fail("mount proc on", &at))?;
            for part in PROC_READ_ONLY {
                let p = at.join(part);
                if p.exists() {
                    bind(&p, &p, true)?;
                }
            }
            Ok(())
        }
        Op::Dev(dest) => dev(&inside(dest)),
    }
}

/// Is what `at` names the file `fd` is open on?
fn same_file(fd: std::os::fd::RawFd, at: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let bound = std::fs::metadata(at)?;
    // SAFETY: fstat fills the struct for a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    if bound.dev() == st.st_dev as u64 && bound.ino() == st.st_ino as u64 {
        Ok(())
    } else {
        Err(io::Error::other("the file changed between opening it and binding it"))
    }
}

/// A bind of `from` at `at` (recursive), then nosuid and nodev (and
/// read-only) on it and every mount beneath it.
fn bind(from: &Path, at: &Path, read_only: bool) -> Result<(), MountError> {
    mount(Some(from), at, None, libc::MS_BIND | libc::MS_REC, None).map_err(fail("bind", at))?;
    let extra = libc::MS_NOSUID | libc::MS_NODEV | if read_only { libc::MS_RDONLY } else { 0 };
    for point in mounts_at_or_below(at).map_err(fail("read mountinfo for", at))? {
        remount(&point, extra).map_err(fail("remount", &point))?;
    }
    Ok(())
}

/// Remount a bind with `extra` flags on top of the ones it has: a user
/// namespace may not clear flags the host set (nosuid, noexec, atime), so
/// they are read back and kept.
fn remount(at: &Path, extra: libc::c_ulong) -> io::Result<()> {
    let c = cstr(at)?;
    // SAFETY: statvfs fills the struct or fails.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a live path and a struct to fill.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    let keep = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
        (libc::ST_RDONLY, libc::MS_RDONLY),
    ]
    .iter()
    .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
    .fold(0, |acc, (_, ms)| acc | ms);
    mount(None, at, None, libc::MS_REMOUNT | libc::MS_BIND | keep | extra, None)
}

/// Mount points at `at` or beneath it, outermost first.
fn mounts_at_or_below(at: &Path) -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(host(Path::new("/proc/self/mountinfo")))?;
    let mut found: Vec<PathBuf> =
        text.lines().filter_map(|line| line.split(' ').nth(4)).map(|p| PathBuf::from(unescape(p))).filter(|p| p.starts_with(at)).collect();
    found.dedup();
    if found.is_empty() {
        found.push(at.to_path_buf());
    }
    Ok(found)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `--dev`: a tmpfs with the host's harmless device nodes bound in, a
/// private devpts, and the usual links.
fn dev(at: &Path) -> Result<(), MountError> {
    mkdirs(at)?;
    mount(Some(Path::new("tmpfs")), at, Some("tmpfs"), libc::MS_NOSUID | libc::MS_NOEXEC, Some("mode=0755"))
        .map_err(fail("mount tmpfs on", at))?;
    for name in DEVICES {
        let node = at.join(name);
        mount_point(&node, false)?;
        let from = host(&Path::new("/dev").join(name));
        mount(Some(&from), &node, None, libc::MS_BIND, None).map_err(fail("bind device", &node))?;
    }
    for (target, link) in
        [("/proc/self/fd", "fd"), ("/proc/self/fd/0", "stdin"), ("/proc/self/fd/1", "stdout"), ("/proc/self/fd/2", "stderr")]
    {
        std::os::unix::fs::symlink(target, at.join(link)).map_err(fail("symlink", &at.join(link)))?;
    }
    mkdirs(&at.join("shm"))?;
    let pts = at.join("pts");
    mkdirs(&pts)?;
    // A pty is a convenience, not part of the fence: where the kernel
    // refuses a devpts in a user namespace the sandbox goes on without one.
    if mount(Some(Path::new("devpts")), &pts, Some("devpts"), libc::MS_NOSUID | libc::MS_NOEXEC, Some("newinstance,ptmxmode=0666,mode=620"))
        .is_ok()
    {
        std::os::unix::fs::symlink("pts/ptmx", at.join("ptmx")).map_err(fail("symlink", &at.join("ptmx")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/tab\011x\134y"), "/tab\tx\\y");
        assert_eq!(unescape(r"/short\04"), r"/short\04");
    }

    #[test]
    fn inside_and_host_never_leave_their_prefix_for_absolute_paths() {
        assert_eq!(inside(Path::new("/work")), PathBuf::from("/newroot/work"));
        assert_eq!(host(Path::new("/usr")), PathBuf::from("/oldroot/usr"));
        assert_eq!(inside(Path::new("/")), PathBuf::from("/newroot"));
    }
}
