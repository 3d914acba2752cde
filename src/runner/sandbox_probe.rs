//! Whether a sandbox works here, proved once at startup by running `true`
//! in exactly the shape runs get (kept apart from [`super::sandbox`], which
//! only describes a sandbox, so describing one never depends on running one).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::process::{execute, ExecError, ExecSpec, RunAs};
use super::sandbox::{Launcher, SandboxSpec};

/// Prove that bwrap actually works here, as the uid scripts will run as: it may be
/// installed yet fail (user namespaces disabled by sysctl or by a container's seccomp
/// profile, bwrap < 0.8 without `--disable-userns`, ...). Runs `true` in exactly the
/// sandbox shape the executor uses. Call once at startup and fall back (or refuse) on
/// error; the error carries bwrap's own message.
///
/// A probe that failed for want of a kernel resource at that moment (EAGAIN
/// from clone(2): the user-namespace or process count while other sandboxes
/// start) says nothing about whether bwrap works here, and the verdict lasts
/// the server's lifetime: it is tried again, [`SELF_TEST_ATTEMPTS`] times in
/// all, before the sandbox is given up.
pub async fn bwrap_self_test(bwrap: &Path, run_as: RunAs) -> Result<(), ExecError> {
    sandbox_self_test(&Launcher::Bwrap(bwrap.to_path_buf()), None, run_as).await
}

/// [`bwrap_self_test`] for the built-in sandbox: `exe` is an open
/// descriptor of this binary (see [`Launcher::Builtin`]).
pub async fn builtin_self_test(exe: Arc<OwnedFd>, run_as: RunAs) -> Result<(), ExecError> {
    sandbox_self_test(&Launcher::Builtin(exe.as_raw_fd()), Some(exe), run_as).await
}

async fn sandbox_self_test(launcher: &Launcher, keep: Option<Arc<OwnedFd>>, run_as: RunAs) -> Result<(), ExecError> {
    let mut pause = SELF_TEST_FIRST_PAUSE;
    for attempt in 1..SELF_TEST_ATTEMPTS {
        match self_test_once(launcher, keep.clone(), run_as).await {
            Err(ExecError::SandboxSelfTest { message }) if message.contains(TRANSIENT) => {
                tracing::warn!(sandbox = launcher.name(), attempt, %message, "sandbox self-test hit a transient limit; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return other,
        }
    }
    self_test_once(launcher, keep, run_as).await
}

/// How often the self-test runs when it keeps failing transiently, and its
/// first pause (doubled after each try: 0.1 + 0.2 + 0.4 s at most).
pub const SELF_TEST_ATTEMPTS: u32 = 4;
const SELF_TEST_FIRST_PAUSE: Duration = Duration::from_millis(100);
/// strerror(EAGAIN), as bwrap (and the built-in sandbox) print it.
const TRANSIENT: &str = "Resource temporarily unavailable";

async fn self_test_once(launcher: &Launcher, keep: Option<Arc<OwnedFd>>, run_as: RunAs) -> Result<(), ExecError> {
    let program = ["/usr/bin/true", "/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| ExecError::SandboxSelfTest { message: "no /usr/bin/true to run inside the sandbox".into() })?;
    let mut spec = ExecSpec::new(program, "/");
    spec.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    spec.timeout = Duration::from_secs(10);
    spec.run_as = run_as;
    spec.sandbox = Some(SandboxSpec::with_launcher(launcher.clone()));
    spec.keep_fds.extend(keep);
    let out = match execute(spec).await {
        Ok(o) => o,
        Err(ExecError::SandboxSetup { message, .. }) => return Err(ExecError::SandboxSelfTest { message }),
        Err(e) => return Err(ExecError::SandboxSelfTest { message: e.to_string() }),
    };
    if out.outcome.exit_code == Some(0) {
        tracing::debug!(sandbox = launcher.name(), "sandbox self-test passed");
        Ok(())
    } else {
        Err(ExecError::SandboxSelfTest {
            message: format!(
                "exit {:?}, signal {:?}, timed out {}: {}",
                out.outcome.exit_code,
                out.outcome.signal,
                out.outcome.timed_out,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}
