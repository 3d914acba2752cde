//! A root server's per-run tmpfs: the run's `/tmp` and `/dev/shm` (and an
//! unsandboxed run's `TMPDIR`), sized to [`RUN_TMP_BYTES`] and mounted by
//! the server on the host, so that after the run it can still tell whether
//! the run filled it (bubblewrap's own `--size` tmpfs vanishes with the
//! sandbox, and a script that stops at the first `ENOSPC` would leave no
//! trace of the limit it hit). Unmounted when the run ends. A server that
//! is not root cannot mount: the sandbox then makes its own sized tmpfs,
//! just as bounded, and a full one shows only in the script's own errors.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::core::limits::RUN_TMP_BYTES;

/// The mounted tmpfs; unmounted and removed on drop.
#[derive(Debug)]
pub struct RunTmpfs {
    root: PathBuf,
}

fn c(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

impl RunTmpfs {
    /// Mount a fresh tmpfs at `root` (created), owned by `owner`, with a
    /// `tmp` and a `shm` directory in it.
    pub fn mount(root: &Path, owner: (u32, u32)) -> std::io::Result<RunTmpfs> {
        let _ = unmount(root);
        std::fs::create_dir_all(root)?;
        let (uid, gid) = owner;
        let options = format!("size={RUN_TMP_BYTES},mode=0700,uid={uid},gid={gid}");
        let (src, target, fstype, data) = (CString::new("tmpfs")?, c(root)?, CString::new("tmpfs")?, CString::new(options)?);
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc =
            unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), libc::MS_NOSUID | libc::MS_NODEV, data.as_ptr().cast()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let tmpfs = RunTmpfs { root: root.to_path_buf() };
        for sub in ["tmp", "shm"] {
            let dir = root.join(sub);
            std::fs::create_dir(&dir)?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        }
        Ok(tmpfs)
    }

    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn shm(&self) -> PathBuf {
        self.root.join("shm")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the tmpfs has no room left (the run hit its size).
    pub fn is_full(&self) -> bool {
        let Ok(path) = c(&self.root) else { return false };
        // SAFETY: statvfs fills the struct for a NUL-terminated path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return false;
        }
        st.f_bavail == 0 || st.f_favail == 0
    }
}

/// Detach whatever is mounted at `root` (a leftover of a crash, or ours).
pub fn unmount(root: &Path) -> std::io::Result<()> {
    let target = c(root)?;
    // SAFETY: umount2 with a NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for RunTmpfs {
    fn drop(&mut self) {
        if let Err(e) = unmount(&self.root) {
            tracing::warn!(path = %self.root.display(), error = %e, "could not unmount a run's tmpfs");
            return;
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}
