//! `ssh://` (and `user@host:path`) repositories, read over a pure-Rust SSH
//! client (russh) instead of an `ssh` program: the operator's image has
//! none, and a program would read `~/.ssh/config` and agents the
//! controller must not depend on.
//!
//! The server's host key must be in the known_hosts the caller gives (a
//! SkillSource's Secret): a key that is missing or different refuses the
//! connection before anything is sent, and nothing is ever learned at run
//! time. The client key authenticates; the channel then runs
//! `git-upload-pack '<path>'` and gix speaks the pack protocol over it as
//! over a spawned process.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client;
use russh::keys::{check_known_hosts_path, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use tokio::io::{ReadHalf, WriteHalf};
use tokio_util::io::SyncIoBridge;

/// How long connecting, the handshake and authentication may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// A connection with no traffic for this long is closed.
const INACTIVITY: Duration = Duration::from_secs(120);

/// Why an SSH connection was not made: refused (a host key, the client
/// key, a bad URL: trying again changes nothing) or unreachable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshError {
    Refused(String),
    Unreachable(String),
}

impl std::fmt::Display for SshError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SshError::Refused(why) | SshError::Unreachable(why) => f.write_str(why),
        }
    }
}

/// What an SSH repository is read with.
#[derive(Clone)]
pub struct SshKey {
    /// The client's private key (OpenSSH or PEM format, unencrypted).
    pub private_key: String,
    /// OpenSSH known_hosts lines: the only host keys accepted.
    pub known_hosts: String,
}

impl std::fmt::Debug for SshKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshKey").field("private_key", &"<redacted>").field("known_hosts_lines", &self.known_hosts.lines().count()).finish()
    }
}

/// Where an SSH URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub user: String,
    pub host: String,
    pub port: u16,
    pub path: String,
}

/// Whether `url` is an SSH URL (`ssh://…` or `user@host:path`).
pub fn is_ssh(url: &str) -> bool {
    gix::url::parse(gix::bstr::BStr::new(url)).is_ok_and(|u| u.scheme == gix::url::Scheme::Ssh)
}

/// `ssh://[user@]host[:port]/path` or `user@host:path`; the user defaults
/// to `git`, the forges' convention.
pub fn target(url: &str) -> Result<Target, String> {
    let parsed = gix::url::parse(gix::bstr::BStr::new(url)).map_err(|e| format!("not an SSH URL: {e}"))?;
    if parsed.scheme != gix::url::Scheme::Ssh {
        return Err("not an SSH URL".into());
    }
    let host = parsed.host().ok_or("the URL names no host")?.to_string();
    if host.starts_with('-') {
        return Err("a host may not start with `-`".into());
    }
    let path = parsed.path.to_string();
    if path.is_empty() || path.contains('\'') || path.contains('\n') || path.contains('\0') {
        return Err("the repository path is empty or holds a quote or control character".into());
    }
    Ok(Target { user: parsed.user().unwrap_or("git").to_string(), host, port: parsed.port.unwrap_or(22), path })
}

/// Why the server was not trusted, kept by the handler for the error.
#[derive(Default)]
struct Verdict(Mutex<Option<String>>);

struct Checker {
    host: String,
    port: u16,
    known_hosts: std::path::PathBuf,
    verdict: Arc<Verdict>,
}

impl client::Handler for Checker {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let refuse = |why: String| {
            *self.verdict.0.lock().expect("lock poisoned") = Some(why);
            Ok(false)
        };
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            return refuse("the server offered a host certificate; pin its plain host key in known_hosts".into());
        };
        match check_known_hosts_path(&self.host, self.port, key, &self.known_hosts) {
            Ok(true) => Ok(true),
            Ok(false) => refuse(format!(
                "{}:{} offered a {} host key that known_hosts does not list; add the key you verified (never one learned now)",
                self.host,
                self.port,
                key.algorithm()
            )),
            Err(russh::keys::Error::KeyChanged { line }) => refuse(format!(
                "{}:{} offered a host key that differs from the one pinned on known_hosts line {line}: refused",
                self.host, self.port
            )),
            Err(e) => refuse(format!("known_hosts could not be read: {e}")),
        }
    }
}

type Stream = russh::ChannelStream<client::Msg>;

/// The channel's reading side; it keeps the session (and a runtime of its
/// own, outside one) alive for as long as gix reads.
pub struct Reader {
    inner: Option<SyncIoBridge<ReadHalf<Stream>>>,
    session: Option<client::Handle<Checker>>,
    handle: tokio::runtime::Handle,
    _runtime: Option<Arc<tokio::runtime::Runtime>>,
}

impl std::io::Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.as_mut().map_or(Ok(0), |r| r.read(buf))
    }
}

impl Drop for Reader {
    // russh closes a channel from a task it spawns on drop: drop inside
    // the runtime (gix drops us on whatever thread it runs on).
    fn drop(&mut self) {
        let _inside = self.handle.enter();
        self.inner.take();
        self.session.take();
    }
}

/// The channel's writing side.
pub struct Writer {
    inner: Option<SyncIoBridge<WriteHalf<Stream>>>,
    handle: tokio::runtime::Handle,
    _runtime: Option<Arc<tokio::runtime::Runtime>>,
}

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.as_mut().map_or(Ok(0), |w| w.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.as_mut().map_or(Ok(()), |w| w.flush())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _inside = self.handle.enter();
        self.inner.take();
    }
}

/// Connects to `target`, checks its host key, authenticates and starts
/// `git-upload-pack`. Blocking: call it off an async runtime's workers
/// (from `spawn_blocking`, or a thread outside any runtime).
pub fn upload_pack(target: &Target, key: &SshKey) -> Result<(Reader, Writer), SshError> {
    let (handle, runtime) = match tokio::runtime::Handle::try_current() {
        Ok(h) => (h, None),
        Err(_) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| SshError::Unreachable(format!("a runtime for the SSH client: {e}")))?;
            (rt.handle().clone(), Some(Arc::new(rt)))
        }
    };
    let local = |e: std::io::Error| SshError::Unreachable(format!("a temporary known_hosts file: {e}"));
    let dir = tempfile::tempdir().map_err(local)?;
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(&known_hosts, &key.known_hosts).map_err(local)?;
    let verdict = Arc::new(Verdict::default());
    let session = handle.block_on(async {
        tokio::time::timeout(CONNECT_TIMEOUT, open(target, key, &known_hosts, verdict.clone())).await.map_err(|_| {
            SshError::Unreachable(format!("{}:{} did not answer within {} s", target.host, target.port, CONNECT_TIMEOUT.as_secs()))
        })?
    });
    // A host key refused by the checker shows up as a failed connect: say why.
    let session = session.map_err(|e| match verdict.0.lock().expect("lock poisoned").clone() {
        Some(why) => SshError::Refused(why),
        None => e,
    })?;
    let (read, write) = tokio::io::split(session.1);
    Ok((
        Reader {
            inner: Some(SyncIoBridge::new_with_handle(read, handle.clone())),
            session: Some(session.0),
            handle: handle.clone(),
            _runtime: runtime.clone(),
        },
        Writer { inner: Some(SyncIoBridge::new_with_handle(write, handle.clone())), handle, _runtime: runtime },
    ))
}

async fn open(
    target: &Target,
    key: &SshKey,
    known_hosts: &Path,
    verdict: Arc<Verdict>,
) -> Result<(client::Handle<Checker>, russh::ChannelStream<client::Msg>), SshError> {
    use SshError::{Refused, Unreachable};
    let private = russh::keys::decode_secret_key(&key.private_key, None)
        .map_err(|e| Refused(format!("the private key cannot be read ({e}); give an unencrypted OpenSSH or PEM key")))?;
    let config = Arc::new(client::Config { inactivity_timeout: Some(INACTIVITY), ..Default::default() });
    let checker = Checker { host: target.host.clone(), port: target.port, known_hosts: known_hosts.to_path_buf(), verdict };
    let mut session = client::connect(config, (target.host.as_str(), target.port), checker)
        .await
        .map_err(|e| Unreachable(format!("connecting to {}:{}: {e}", target.host, target.port)))?;
    let hash =
        session.best_supported_rsa_hash().await.map_err(|e| Unreachable(format!("negotiating with {}: {e}", target.host)))?.flatten();
    let auth = session
        .authenticate_publickey(target.user.clone(), PrivateKeyWithHashAlg::new(Arc::new(private), hash))
        .await
        .map_err(|e| Unreachable(format!("authenticating to {}: {e}", target.host)))?;
    if !auth.success() {
        return Err(Refused(format!(
            "{}@{} refused the key; check that its public half is a deploy key of the repository",
            target.user, target.host
        )));
    }
    let channel = session.channel_open_session().await.map_err(|e| Unreachable(format!("opening a channel: {e}")))?;
    channel
        .exec(true, format!("git-upload-pack '{}'", target.path))
        .await
        .map_err(|e| Unreachable(format!("starting git-upload-pack: {e}")))?;
    Ok((session, channel.into_stream()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_user_host_port_and_path() {
        let t = target("ssh://deploy@git.example:2222/team/skills.git").unwrap();
        assert_eq!(t, Target { user: "deploy".into(), host: "git.example".into(), port: 2222, path: "/team/skills.git".into() });
        let scp = target("git@github.com:anthropics/skills.git").unwrap();
        assert_eq!((scp.user.as_str(), scp.host.as_str(), scp.port, scp.path.as_str()), ("git", "github.com", 22, "anthropics/skills.git"));
        assert_eq!(target("ssh://h/x").unwrap().user, "git");
        for bad in ["https://h/x", "ssh://h/it's", "ssh://-oProxyCommand=x/r"] {
            assert!(target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_key_is_never_printed() {
        let key = SshKey { private_key: "-----BEGIN OPENSSH PRIVATE KEY-----secret".into(), known_hosts: "h ssh-ed25519 AAAA\n".into() };
        assert!(!format!("{key:?}").contains("secret"));
    }
}
