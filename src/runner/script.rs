//! The declared script, opened once.
//!
//! Checking a script's path and then handing the path to the interpreter
//! leaves a window: whoever can write the skill's directory can swap the
//! checked file for a symlink to something outside between the check and
//! the interpreter's own `open`. Unsandboxed, the interpreter would then
//! run the outside file. So the runner opens the script itself, with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the skill's
//! directory (the kernel refuses any path, symlinks included, that leaves
//! that directory, in one atomic walk), checks the opened file is a regular
//! file, and hands the interpreter that descriptor as `/proc/self/fd/N`:
//! the file checked is the file run. A symlink that stays inside the skill
//! still works.
//!
//! Node resolves its main module's real path and opens *that* unless told
//! not to, which would reopen the race: it gets `--preserve-symlinks-main`.
//! The price: unsandboxed, a script's `__file__` / `$0` /
//! `process.argv[1]` is `/proc/self/fd/N`, so a script that finds files
//! next to itself needs the sandbox, where `/skill` is a read-only bind and
//! nothing can be swapped from outside.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::core::paths::RelPath;

/// Why the declared script could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot open the skill directory {dir}: {source}")]
    Dir { dir: PathBuf, source: std::io::Error },
    #[error("{script} cannot be opened inside its skill ({source}); a declared script must be a file of the skill, not a link out of it")]
    Open { script: String, source: std::io::Error },
    #[error("{script} is not a regular file")]
    NotAFile { script: String },
    #[error("this kernel has no openat2 (Linux 5.6 or later), which unsandboxed runs need to open the script once; use the sandbox")]
    NoOpenat2,
}

/// Open `rel` beneath `dir`, read-only, refusing every path that leaves
/// `dir` (see the module docs). The descriptor is close-on-exec; the
/// runner keeps it open for the interpreter only.
pub fn open_beneath(dir: &Path, rel: &RelPath) -> Result<OwnedFd, ScriptError> {
    let dir_c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| ScriptError::Dir { dir: dir.to_path_buf(), source: std::io::Error::from(std::io::ErrorKind::InvalidInput) })?;
    // SAFETY: a plain open of a NUL-terminated path.
    let dirfd = unsafe { libc::open(dir_c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if dirfd < 0 {
        return Err(ScriptError::Dir { dir: dir.to_path_buf(), source: std::io::Error::last_os_error() });
    }
    // SAFETY: a fresh descriptor we own.
    let dirfd = unsafe { OwnedFd::from_raw_fd(dirfd) };
    let path = CString::new(rel.as_str().as_bytes())
        .map_err(|_| ScriptError::Open { script: rel.to_string(), source: std::io::Error::from(std::io::ErrorKind::InvalidInput) })?;
    // SAFETY: open_how is plain data; zeroed is its documented initial state.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads `how` (of the size given) and the path; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOSYS) {
            return Err(ScriptError::NoOpenat2);
        }
        return Err(ScriptError::Open { script: rel.to_string(), source: err });
    }
    // SAFETY: a fresh descriptor we own.
    let file = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let meta = std::fs::File::from(file.try_clone().map_err(|source| ScriptError::Open { script: rel.to_string(), source })?)
        .metadata()
        .map_err(|source| ScriptError::Open { script: rel.to_string(), source })?;
    if !meta.is_file() {
        return Err(ScriptError::NotAFile { script: rel.to_string() });
    }
    Ok(file)
}

/// The path an interpreter reads an inherited descriptor by.
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_beneath_the_skill_open() {
        let t = tempfile::tempdir().unwrap();
        let skill = t.path().join("skill");
        std::fs::create_dir_all(skill.join("scripts")).unwrap();
        std::fs::write(skill.join("scripts/a.py"), "print(1)").unwrap();
        std::fs::write(t.path().join("outside.py"), "print('outside')").unwrap();
        std::os::unix::fs::symlink("a.py", skill.join("scripts/inside.py")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside.py"), skill.join("scripts/abs.py")).unwrap();
        std::os::unix::fs::symlink("../../outside.py", skill.join("scripts/rel.py")).unwrap();
        let rel = |p: &str| RelPath::parse(p).unwrap();
        assert!(open_beneath(&skill, &rel("scripts/a.py")).is_ok());
        assert!(open_beneath(&skill, &rel("scripts/inside.py")).is_ok(), "a link that stays inside works");
        for escape in ["scripts/abs.py", "scripts/rel.py"] {
            let e = open_beneath(&skill, &rel(escape)).unwrap_err();
            assert!(matches!(e, ScriptError::Open { .. }), "{escape}: {e}");
        }
        assert!(matches!(open_beneath(&skill, &rel("scripts")).unwrap_err(), ScriptError::NotAFile { .. }));
    }
}
