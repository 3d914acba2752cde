//! Granted egress on one machine: the egress proxy ([`crate::egress`]) runs
//! in the server's process, and a sandboxed run reaches it, and nothing
//! else, through a unix socket.
//!
//! # Why this shape
//!
//! A run with granted egress used to get the host's network namespace,
//! which let its script call the server's own HTTP endpoint and every
//! other host-local service. Now it gets the same empty network namespace
//! as a run without egress (only its own loopback), and three things:
//!
//! 1. a unix socket, made by the server for this run alone in a `0700`
//!    directory owned by the run's uid, and bound into the sandbox at
//!    [`SOCKET_INSIDE`]. The proxy serves exactly one job on it (the socket
//!    is the identity: no credential to steal) with that job's allowlist:
//!    the skill's declared hosts, port 443 unless an entry names its
//!    ports; an empty list means no network at all;
//! 2. this binary, bound read-only at [`EXE_INSIDE`] (by descriptor, so
//!    the run's uid needs no access to where the binary lives), started as
//!    `sandbox-init --forward 127.0.0.1:3128=<socket> -- <interpreter> ...`
//!    ([`super::init`]): it listens on the sandbox's own `127.0.0.1:3128`,
//!    relays each connection byte for byte to the socket, and runs the
//!    script as its child;
//! 3. `HTTPS_PROXY`/`HTTP_PROXY` (both cases), `NO_PROXY` (empty: nothing
//!    bypasses the proxy), `NODE_USE_ENV_PROXY=1`, `PIP_PROXY` and
//!    `npm_config_https_proxy`, all names a skill cannot ask for
//!    ([`crate::core::env`]).
//!
//! A socket and a relay were chosen over pasta or slirp4netns (a user-mode
//! TCP/IP stack giving the namespace a route out): with those, the
//! namespace can reach any address the stack forwards, and keeping the
//! server's port and the host's services out would be a second filter to
//! get right. Here there is no route at all; the only path is a socket
//! whose far end checks every request (host and port against the
//! allowlist, every address after resolution: loopback, private,
//! link-local and the rest are refused unless `--egress-allow-cidr` lists
//! them), and the relay itself decides nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use tokio::net::UnixListener;

use crate::egress::{Allowlist, Entry, JobBudget, JobId, JobSpec, MemoryRegistry, Proxy, ProxyConfig, Resolver, SystemResolver};
use crate::shutdown::Shutdown;

/// Where the forwarder listens inside the sandbox (its own loopback).
pub const FORWARD_ADDR: &str = "127.0.0.1:3128";
/// The proxy URL scripts are given.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";
/// The run's proxy socket, inside the sandbox.
pub const SOCKET_INSIDE: &str = "/run/skill-operator/egress.sock";
/// This binary, inside the sandbox.
pub const EXE_INSIDE: &str = "/run/skill-operator/skill-operator";
/// The registry namespace of standalone runs.
const NAMESPACE: &str = "local";

/// How the in-process proxy is set up (from `serve`'s flags).
#[derive(Clone, Default)]
pub struct EgressOptions {
    /// Addresses dialed even though they are loopback, private and so on
    /// (`--egress-allow-cidr`): for tests, and for an admin who must let
    /// runs reach an internal host on purpose. Every skill that declares a
    /// host resolving there can then reach it: never list the server's
    /// own address.
    pub allow_cidrs: Vec<IpNet>,
    /// The resolver the proxy asks (tests answer names themselves).
    pub resolver: Option<Arc<dyn Resolver>>,
    /// Where the proxy's `egress` audit records go (`serve`'s own writer).
    pub audit: crate::audit::Audit,
}

impl std::fmt::Debug for EgressOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressOptions").field("allow_cidrs", &self.allow_cidrs).field("resolver", &self.resolver.is_some()).finish()
    }
}

/// Why egress could not be set up for a run.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("the egress proxy could not start: {0}")]
    Proxy(String),
    #[error("cannot prepare the run's egress socket in {path}: {source}")]
    Socket { path: PathBuf, source: std::io::Error },
}

/// The in-process proxy and the runs it serves.
pub struct LocalEgress {
    proxy: Proxy,
    registry: MemoryRegistry,
    /// `<data dir>/egress`: one `0700` directory per running job.
    dir: PathBuf,
}

/// The effective allowlist of a skill's declared hosts, and the entries
/// the proxy could not read (left out: they allow nothing).
pub fn allowlist(hosts: &[String]) -> (Allowlist, Vec<String>) {
    let mut entries = Vec::new();
    let mut dropped = Vec::new();
    for host in hosts {
        match Entry::parse(host) {
            Ok(entry) => entries.push(entry),
            Err(e) => dropped.push(format!("{host:?} ({e})")),
        }
    }
    (Allowlist::new(entries), dropped)
}

/// 32 random bytes from the kernel.
pub fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: getrandom writes at most the given length into the buffer.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), N - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(buf)
}

impl LocalEgress {
    pub fn new(data_dir: &Path, options: &EgressOptions) -> Result<LocalEgress, EgressError> {
        // The key only signs TCP credentials, which this proxy never
        // serves (every standalone run has its own socket): any random key.
        let key = random_bytes::<32>().map_err(|e| EgressError::Proxy(format!("no random bytes for the proxy key: {e}")))?;
        let mut config = ProxyConfig::new(key.to_vec());
        config.allow_cidrs = options.allow_cidrs.clone();
        config.audit = options.audit.clone();
        let registry = MemoryRegistry::new();
        let resolver: Arc<dyn Resolver> = options.resolver.clone().unwrap_or_else(|| Arc::new(SystemResolver));
        let proxy = Proxy::new(config, Arc::new(registry.clone()), resolver).map_err(|e| EgressError::Proxy(e.to_string()))?;
        let dir = data_dir.join("egress");
        std::fs::create_dir_all(&dir).map_err(|source| EgressError::Socket { path: dir.clone(), source })?;
        // Only the server lists it; each run's directory below is its uid's.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|source| EgressError::Socket { path: dir.clone(), source })?;
        Ok(LocalEgress { proxy, registry, dir })
    }

    /// The proxy's counters (tests read the verdicts).
    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// Register `job` with the allowlist of `hosts` and serve it on a
    /// fresh socket owned by `owner` (the run's uid and gid, when the
    /// server switches uids). Served until the returned value is dropped.
    pub fn open(&self, job: &str, hosts: &[String], owner: Option<(u32, u32)>) -> Result<RunEgress, EgressError> {
        let (allow, dropped) = allowlist(hosts);
        for d in &dropped {
            tracing::warn!(job, entry = %d, "a declared egress entry is not a host pattern the proxy reads; it allows nothing");
        }
        let id = JobId::new(NAMESPACE, job);
        let dir = self.dir.join(job);
        let socket = dir.join("egress.sock");
        let fail = |source: std::io::Error| EgressError::Socket { path: dir.clone(), source };
        // A leftover of a crash: never reuse it.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(fail)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
        let listener = UnixListener::bind(&socket).map_err(fail)?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(fail)?;
            std::os::unix::fs::chown(&socket, Some(uid), Some(gid)).map_err(fail)?;
        }
        self.registry.upsert(JobSpec { namespace: NAMESPACE.into(), uid: job.into(), allow, source: None, limits: JobBudget::default() });
        let stop = Shutdown::new();
        let proxy = self.proxy.clone();
        let (serve_id, wait) = (id.clone(), stop.wait_owned());
        tokio::spawn(async move {
            if let Err(e) = proxy.serve_unix(listener, serve_id, wait).await {
                tracing::warn!(target: "skill_operator::egress", error = %e, "a run's egress socket failed");
            }
        });
        Ok(RunEgress { id, dir, socket, stop, registry: self.registry.clone() })
    }
}

/// One run's egress: its socket and registry entry, removed on drop.
pub struct RunEgress {
    id: JobId,
    dir: PathBuf,
    socket: PathBuf,
    stop: Shutdown,
    registry: MemoryRegistry,
}

impl RunEgress {
    /// The socket on the host (bound into the sandbox at [`SOCKET_INSIDE`]).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The proxy variables a script gets.
    pub fn env() -> Vec<(String, String)> {
        let url = PROXY_URL.to_string();
        vec![
            ("HTTPS_PROXY".into(), url.clone()),
            ("HTTP_PROXY".into(), url.clone()),
            ("https_proxy".into(), url.clone()),
            ("http_proxy".into(), url.clone()),
            // Nothing bypasses the proxy (a bypass could only fail: there is no route).
            ("NO_PROXY".into(), String::new()),
            ("no_proxy".into(), String::new()),
            ("NODE_USE_ENV_PROXY".into(), "1".into()),
            ("PIP_PROXY".into(), url.clone()),
            ("npm_config_https_proxy".into(), url.clone()),
            ("npm_config_proxy".into(), url),
        ]
    }
}

impl Drop for RunEgress {
    fn drop(&mut self) {
        // Forget the job first: a connection still open is refused from now on.
        self.registry.remove(&self.id);
        self.stop.trigger();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
