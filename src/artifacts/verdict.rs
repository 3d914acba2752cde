//! The run's verdict, from the launcher to the upload sidecar, over a
//! channel the script cannot reach.
//!
//! The launcher and the script share a container, a uid and a filesystem:
//! whatever file the launcher could write, the script could write first
//! (or again, while it keeps running). So the verdict (the launcher's
//! `result.json`) and the streams it captured never pass through a file
//! of the run container. Instead:
//!
//! 1. The upload sidecar starts before the run container and listens on an
//!    abstract Unix socket ([`DEFAULT_NAME`]; abstract names belong to the
//!    pod's network namespace, so no volume is shared for it).
//! 2. The launcher connects as the first thing it does, while it is the
//!    only process of its container: no script exists yet. The sidecar
//!    accepts exactly one connection, then closes its listener, and leaves
//!    [`MARKER`] in its own volume.
//! 3. The launcher keeps the connection (close-on-exec, so the script never
//!    inherits it) and is not dumpable, so the script, with the same uid but
//!    no capabilities, can neither open `/proc/1/fd/N` nor attach to it.
//!    When the script has ended (the launcher's own timeout, exit or
//!    signal), the launcher sends stdout, stderr and the result as frames,
//!    the result last, and waits for the sidecar's acknowledgement.
//! 4. The sidecar writes them into its result directory, a volume the run
//!    container does not mount, and from there uploads them as before.
//!
//! A sidecar restarted after step 2 finds [`MARKER`]: the launcher's
//! channel went with the old process, and a connection now could only come
//! from the script. It accepts none, and the run has no verdict (the
//! controller says so); a result already received before the restart is
//! still in the sidecar's volume and is uploaded.
//!
//! Frames: one byte of kind ([`KIND_STDOUT`], [`KIND_STDERR`],
//! [`KIND_RESULT`]), a big-endian `u32` length, the bytes. The connection
//! opens with [`HELLO`]; the sidecar answers the result with [`ACK`].

use std::io::{self, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ArtifactLimits;
use crate::api::outcome::LaunchResult;

/// The abstract socket name in a run pod (one pod, one network namespace).
pub const DEFAULT_NAME: &str = "skill-operator/verdict";
/// The first bytes on a connection.
pub const HELLO: &[u8] = b"skill-operator verdict v1\n";
/// The sidecar's answer once the verdict is written.
pub const ACK: u8 = b'K';
pub const KIND_STDOUT: u8 = b'O';
pub const KIND_STDERR: u8 = b'E';
pub const KIND_RESULT: u8 = b'R';
/// Left in the sidecar's result directory once the launcher's connection
/// was accepted (see the module docs).
pub const MARKER: &str = ".launcher-connected";
/// How long the launcher tries to reach the sidecar at its start (the
/// sidecar is started first; this covers a slow start on a busy node).
pub const CONNECT_PATIENCE: Duration = Duration::from_secs(30);
/// How long the launcher waits for the sidecar to acknowledge the verdict.
pub const ACK_PATIENCE: Duration = Duration::from_secs(10);

/// What went wrong on the channel; each says what it means for the run.
#[derive(Debug, thiserror::Error)]
pub enum VerdictError {
    #[error(
        "no upload sidecar answers on the verdict channel @{name} ({source}); the launcher runs nothing without one: see the pod's upload container"
    )]
    NoSidecar { name: String, source: io::Error },
    #[error("the verdict channel to the upload sidecar broke: {0}; the run's verdict was not delivered")]
    Broken(io::Error),
    #[error(
        "the upload sidecar was restarted after the launcher connected to it: the launcher's channel went with it, so no verdict of this run can be trusted and none is taken"
    )]
    Restarted,
    #[error("the launcher's channel closed before it sent a verdict (the launcher ended without one)")]
    NoVerdict,
    #[error("the verdict channel broke its protocol: {0}")]
    Protocol(String),
    #[error("cannot listen on the verdict channel @{name}: {source}")]
    Listen { name: String, source: io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: io::Error },
}

fn address(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

/// What the launcher sends: its result and the streams it captured.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub result: LaunchResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The launcher's end.
#[derive(Debug)]
pub struct VerdictSender {
    stream: UnixStream,
}

impl VerdictSender {
    /// Connects to the sidecar listening on `name`, trying for `patience`
    /// (it may not have bound its socket yet). Blocking.
    pub fn connect(name: &str, patience: Duration) -> Result<VerdictSender, VerdictError> {
        let addr = address(name).map_err(|source| VerdictError::NoSidecar { name: name.into(), source })?;
        let give_up = Instant::now() + patience;
        let mut pause = Duration::from_millis(2);
        loop {
            match UnixStream::connect_addr(&addr) {
                Ok(mut stream) => {
                    stream.write_all(HELLO).map_err(VerdictError::Broken)?;
                    return Ok(VerdictSender { stream });
                }
                Err(source) if Instant::now() >= give_up => return Err(VerdictError::NoSidecar { name: name.into(), source }),
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
            }
        }
    }

    /// Whether the sidecar still holds its end (it never writes before the
    /// verdict, so anything readable now is its end closing).
    pub fn is_open(&self) -> bool {
        let mut byte = [0u8; 1];
        // SAFETY: a non-blocking peek into a one-byte buffer we own.
        let n = unsafe {
            libc::recv(std::os::fd::AsRawFd::as_raw_fd(&self.stream), byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
    }

    /// Sends the verdict (streams first, the result last) and waits up to
    /// [`ACK_PATIENCE`] for the sidecar to say it has it.
    pub fn send(mut self, verdict: &Verdict) -> Result<(), VerdictError> {
        let result = serde_json::to_vec(&verdict.result).map_err(|e| VerdictError::Protocol(e.to_string()))?;
        for (kind, bytes) in [(KIND_STDOUT, &verdict.stdout[..]), (KIND_STDERR, &verdict.stderr[..]), (KIND_RESULT, &result[..])] {
            let len = u32::try_from(bytes.len()).map_err(|_| VerdictError::Protocol(format!("a frame of {} bytes", bytes.len())))?;
            let mut head = [0u8; 5];
            head[0] = kind;
            head[1..].copy_from_slice(&len.to_be_bytes());
            self.stream.write_all(&head).and_then(|()| self.stream.write_all(bytes)).map_err(VerdictError::Broken)?;
        }
        self.stream.flush().map_err(VerdictError::Broken)?;
        self.stream.set_read_timeout(Some(ACK_PATIENCE)).map_err(VerdictError::Broken)?;
        let mut ack = [0u8; 1];
        match self.stream.read(&mut ack) {
            Ok(1) if ack[0] == ACK => Ok(()),
            Ok(_) => Err(VerdictError::Protocol("the sidecar closed the channel without acknowledging the verdict".into())),
            Err(e) => Err(VerdictError::Broken(e)),
        }
    }
}

/// The sidecar's end before the launcher has connected.
#[derive(Debug)]
pub struct VerdictListener {
    listener: tokio::net::UnixListener,
    result_file: PathBuf,
}

/// What [`listen`] found.
#[derive(Debug)]
pub enum Listening {
    /// Waiting for the launcher.
    Waiting(VerdictListener),
    /// A restarted sidecar whose verdict had already arrived (it is in
    /// the result directory).
    Received,
}

/// The sidecar's start: listen on `name` for the launcher, whose verdict
/// goes to `result_file` (`stdout` and `stderr` beside it). A sidecar that
/// already accepted the launcher once (its [`MARKER`] beside the result) is
/// [`VerdictError::Restarted`], unless the verdict had already arrived.
pub fn listen(name: &str, result_file: &Path) -> Result<Listening, VerdictError> {
    let dir = result_dir(result_file);
    if std::fs::symlink_metadata(result_file).is_ok() {
        return Ok(Listening::Received);
    }
    if std::fs::symlink_metadata(dir.join(MARKER)).is_ok() {
        return Err(VerdictError::Restarted);
    }
    let listen_error = |source| VerdictError::Listen { name: name.into(), source };
    let addr = address(name).map_err(listen_error)?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr).map_err(listen_error)?;
    std_listener.set_nonblocking(true).map_err(listen_error)?;
    let listener = tokio::net::UnixListener::from_std(std_listener).map_err(listen_error)?;
    Ok(Listening::Waiting(VerdictListener { listener, result_file: result_file.to_path_buf() }))
}

fn result_dir(result_file: &Path) -> PathBuf {
    result_file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf()
}

impl VerdictListener {
    /// The one connection: the launcher's. The listener is closed once it
    /// is accepted (a second connection is refused), and [`MARKER`] left.
    pub async fn accept(self) -> Result<VerdictConnection, VerdictError> {
        let (mut stream, _) = self.listener.accept().await.map_err(|source| VerdictError::Listen { name: "accept".into(), source })?;
        drop(self.listener);
        let dir = result_dir(&self.result_file);
        let marker = dir.join(MARKER);
        std::fs::write(&marker, b"").map_err(|source| VerdictError::Write { path: marker.display().to_string(), source })?;
        let mut hello = [0u8; HELLO.len()];
        stream.read_exact(&mut hello).await.map_err(VerdictError::Broken)?;
        if hello != HELLO {
            return Err(VerdictError::Protocol("the first bytes on the channel are not the launcher's greeting".into()));
        }
        Ok(VerdictConnection { stream, result_file: self.result_file })
    }
}

/// The sidecar's end once the launcher is connected.
#[derive(Debug)]
pub struct VerdictConnection {
    stream: tokio::net::UnixStream,
    result_file: PathBuf,
}

impl VerdictConnection {
    /// Reads the verdict (each frame within `limits`), writes `stdout`,
    /// `stderr` and the result (last, whole: a temporary file renamed) into
    /// the result directory, and acknowledges it.
    pub async fn receive(mut self, limits: &ArtifactLimits) -> Result<Verdict, VerdictError> {
        let mut stdout = None;
        let mut stderr = None;
        let result = loop {
            let mut head = [0u8; 5];
            match self.stream.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(VerdictError::NoVerdict),
                Err(e) => return Err(VerdictError::Broken(e)),
            }
            let len = u64::from(u32::from_be_bytes([head[1], head[2], head[3], head[4]]));
            let (slot, cap, what) = match head[0] {
                KIND_STDOUT => (&mut stdout, limits.max_stream_bytes, "stdout"),
                KIND_STDERR => (&mut stderr, limits.max_stream_bytes, "stderr"),
                KIND_RESULT => (&mut None, limits.max_result_bytes, "result"),
                other => return Err(VerdictError::Protocol(format!("a frame of unknown kind {other:#04x}"))),
            };
            if len > cap {
                return Err(VerdictError::Protocol(format!("{what} of {len} bytes is over its cap of {cap}")));
            }
            let mut bytes = vec![0u8; len as usize];
            self.stream.read_exact(&mut bytes).await.map_err(VerdictError::Broken)?;
            if head[0] == KIND_RESULT {
                break bytes;
            }
            if slot.replace(bytes).is_some() {
                return Err(VerdictError::Protocol(format!("{what} sent twice")));
            }
        };
        let parsed: LaunchResult = serde_json::from_slice(&result).map_err(|e| VerdictError::Protocol(format!("the result: {e}")))?;
        let verdict = Verdict { result: parsed, stdout: stdout.unwrap_or_default(), stderr: stderr.unwrap_or_default() };
        let file = self.result_file.clone();
        let (out, err) = (verdict.stdout.clone(), verdict.stderr.clone());
        tokio::task::spawn_blocking(move || write_files(&file, &out, &err, &result))
            .await
            .map_err(|e| VerdictError::Protocol(format!("writing the verdict: {e}")))??;
        // The launcher may already have given up waiting: the verdict is written either way.
        let _ = self.stream.write_all(&[ACK]).await;
        Ok(verdict)
    }
}

/// The streams, then the result (a reader that sees `result.json` sees all three whole).
pub fn write_files(result_file: &Path, stdout: &[u8], stderr: &[u8], result: &[u8]) -> Result<(), VerdictError> {
    let dir = result_dir(result_file);
    for (path, bytes) in [(dir.join("stdout"), stdout), (dir.join("stderr"), stderr), (result_file.to_path_buf(), result)] {
        write_atomic(&path, bytes).map_err(|source| VerdictError::Write { path: path.display().to_string(), source })?;
    }
    Ok(())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("partial");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The sidecar's end as one blocking call, for running the launcher
/// without a pod (the tests, a debugging session): listens on a fresh name
/// on a thread of its own and takes one verdict into `result_file`.
pub struct Collector {
    /// The socket name to give the launcher (`launch --verdict NAME`).
    pub name: String,
    handle: std::thread::JoinHandle<Result<Verdict, VerdictError>>,
}

impl Collector {
    /// Listening once this returns.
    pub fn start(result_file: &Path) -> Result<Collector, VerdictError> {
        let name = format!("skill-operator/collector/{}", uuid::Uuid::new_v4().simple());
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (file, thread_name) = (result_file.to_path_buf(), name.clone());
        let handle = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(VerdictError::Broken)?;
            runtime.block_on(async move {
                let listener = match listen(&thread_name, &file) {
                    Ok(Listening::Waiting(listener)) => listener,
                    Ok(Listening::Received) => {
                        let _ = bound_tx.send(Err(VerdictError::Protocol(format!("{} already holds a verdict", file.display()))));
                        return Err(VerdictError::Restarted);
                    }
                    Err(e) => {
                        let _ = bound_tx.send(Err(e));
                        return Err(VerdictError::Restarted);
                    }
                };
                let _ = bound_tx.send(Ok(()));
                listener.accept().await?.receive(&ArtifactLimits::DEFAULT).await
            })
        });
        match bound_rx.recv() {
            Ok(Ok(())) => Ok(Collector { name, handle }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(VerdictError::Protocol("the collector's thread ended before it listened".into())),
        }
    }

    /// The verdict, once the launcher has sent it (or its channel closed).
    pub fn wait(self) -> Result<Verdict, VerdictError> {
        self.handle.join().unwrap_or_else(|_| Err(VerdictError::Protocol("the collector's thread panicked".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::outcome::RunOutcome;

    fn unique(tag: &str) -> String {
        format!("skill-operator-test/{tag}/{}", uuid::Uuid::new_v4().simple())
    }

    fn verdict(code: i32) -> Verdict {
        let outcome = RunOutcome { exit_code: Some(code), ..RunOutcome::default() };
        Verdict { result: LaunchResult { outcome, error: None, times: None }, stdout: b"out\n".to_vec(), stderr: b"err\n".to_vec() }
    }

    fn waiting(name: &str, file: &Path) -> VerdictListener {
        match listen(name, file).unwrap() {
            Listening::Waiting(l) => l,
            Listening::Received => panic!("nothing was received yet"),
        }
    }

    #[tokio::test]
    async fn the_launchers_verdict_arrives_whole_and_acknowledged() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("result.json");
        let name = unique("whole");
        let listener = waiting(&name, &file);
        let sent = verdict(3);
        let sending = {
            let (name, sent) = (name.clone(), sent.clone());
            tokio::task::spawn_blocking(move || VerdictSender::connect(&name, Duration::from_secs(5)).unwrap().send(&sent))
        };
        let got = listener.accept().await.unwrap().receive(&ArtifactLimits::DEFAULT).await.unwrap();
        sending.await.unwrap().expect("acknowledged");
        assert_eq!(got, sent);
        assert_eq!(std::fs::read(t.path().join("stdout")).unwrap(), b"out\n");
        assert_eq!(std::fs::read(t.path().join("stderr")).unwrap(), b"err\n");
        let stored: LaunchResult = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(stored, sent.result);
        assert!(t.path().join(MARKER).exists());
    }

    #[tokio::test]
    async fn only_the_first_connection_is_taken_and_a_restarted_sidecar_takes_none() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("result.json");
        let name = unique("first");
        let listener = waiting(&name, &file);
        let first = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || VerdictSender::connect(&name, Duration::from_secs(5)).unwrap())
        };
        let connection = listener.accept().await.unwrap();
        let first = first.await.unwrap();
        assert!(first.is_open());
        // The listener is gone: whoever comes next (the script) is refused at once.
        let second = VerdictSender::connect(&name, Duration::ZERO).unwrap_err();
        assert!(matches!(second, VerdictError::NoSidecar { .. }), "{second}");
        drop(connection);
        // The sidecar's end closed: the launcher can tell before it hands a claim over.
        let deadline = Instant::now() + Duration::from_secs(5);
        while first.is_open() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!first.is_open());
        // A restarted sidecar finds the marker and listens for nobody.
        assert!(matches!(listen(&name, &file), Err(VerdictError::Restarted)));
        // ... unless the verdict had already arrived before the restart.
        write_files(&file, b"", b"", &serde_json::to_vec(&verdict(0).result).unwrap()).unwrap();
        assert!(matches!(listen(&name, &file), Ok(Listening::Received)));
    }

    #[tokio::test]
    async fn frames_over_their_caps_or_of_unknown_kinds_are_refused_and_nothing_is_written() {
        let limits = ArtifactLimits { max_stream_bytes: 8, ..ArtifactLimits::DEFAULT };
        for (frames, want) in [
            (vec![(KIND_STDOUT, vec![b'x'; 9])], "stdout of 9 bytes is over its cap of 8"),
            (vec![(b'Z', vec![])], "unknown kind"),
            (vec![(KIND_STDOUT, vec![]), (KIND_STDOUT, vec![])], "stdout sent twice"),
            (vec![(KIND_RESULT, b"{".to_vec())], "the result"),
        ] {
            let t = tempfile::tempdir().unwrap();
            let file = t.path().join("result.json");
            let name = unique("caps");
            let listener = waiting(&name, &file);
            let raw = {
                let name = name.clone();
                tokio::task::spawn_blocking(move || {
                    let mut s = UnixStream::connect_addr(&address(&name).unwrap()).unwrap();
                    s.write_all(HELLO).unwrap();
                    for (kind, bytes) in frames {
                        s.write_all(&[kind]).unwrap();
                        s.write_all(&(bytes.len() as u32).to_be_bytes()).unwrap();
                        s.write_all(&bytes).unwrap();
                    }
                    s
                })
            };
            let err = listener.accept().await.unwrap().receive(&limits).await.unwrap_err();
            drop(raw.await.unwrap());
            assert!(err.to_string().contains(want), "{want}: {err}");
            assert!(!file.exists(), "{want}: nothing written");
        }
    }

    #[tokio::test]
    async fn a_launcher_that_closes_without_a_verdict_gives_none() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("result.json");
        let name = unique("none");
        let listener = waiting(&name, &file);
        let sender = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || VerdictSender::connect(&name, Duration::from_secs(5)).unwrap())
        };
        let connection = listener.accept().await.unwrap();
        drop(sender.await.unwrap());
        assert!(matches!(connection.receive(&ArtifactLimits::DEFAULT).await, Err(VerdictError::NoVerdict)));
        assert!(!file.exists());
    }
}
