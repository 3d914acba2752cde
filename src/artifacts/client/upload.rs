//! `skill-operator upload`: the run's result, streams and work files out of the pod.

use super::super::{termination_error, termination_message, verdict, ArtifactLimits, OutputManifest, TAR_CONTENT_TYPE};
use crate::shutdown::Shutdown;
use reqwest::header::CONTENT_TYPE;
use std::io::{self};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

use super::*;

// -- upload -------------------------------------------------------------------

/// What `upload` does (the `skill-operator upload` flags).
#[derive(Debug, Clone)]
pub struct UploadOptions {
    pub endpoint: Endpoint,
    pub work_dir: PathBuf,
    /// Where the launcher's verdict is written as it arrives over the
    /// channel: `result.json`, with `stdout` and `stderr` beside it (a
    /// volume of the sidecar's own, which the run container does not mount).
    pub result_file: PathBuf,
    /// The abstract socket the launcher sends its verdict on ([`verdict`]).
    pub verdict_socket: String,
    /// Where the digest line goes (`/dev/termination-log`); `None` to skip.
    pub termination_log: Option<PathBuf>,
    pub limits: ArtifactLimits,
    /// How long transient failures (the endpoint unreachable, restarting
    /// or answering 5xx) are retried, counted from the first attempt
    /// ([`super::ENDPOINT_PATIENCE`] by default). Zero: one attempt.
    pub patience: Duration,
}

impl UploadOptions {
    pub fn new(endpoint: Endpoint, work_dir: PathBuf, result_file: PathBuf) -> Self {
        UploadOptions {
            endpoint,
            work_dir,
            result_file,
            verdict_socket: verdict::DEFAULT_NAME.to_string(),
            termination_log: Some(PathBuf::from("/dev/termination-log")),
            limits: ArtifactLimits::DEFAULT,
            patience: ENDPOINT_PATIENCE,
        }
    }
}

/// What `upload` sent.
#[derive(Debug, Clone)]
pub struct UploadReport {
    pub manifest: OutputManifest,
    /// sha256 of the `manifest.json` bytes sent (and stored).
    pub manifest_digest: String,
    /// The OCI manifest digest of the stored outputs set.
    pub set_digest: String,
    /// The line written to the termination log.
    pub termination_message: String,
}

/// How long, once stopped before the verdict came, the sidecar waits for
/// the launcher to send it (the kubelet stops both at once; the launcher
/// kills its script and sends a `cancelled` verdict within a moment).
pub const RESULT_AFTER_STOP: Duration = Duration::from_secs(5);

/// The sidecar: [`upload`], then stay up until stopped (a native sidecar
/// that exits is restarted while `run` runs). Exit 0 on `Ok`.
pub async fn run_upload_sidecar(opts: &UploadOptions, stop: &Shutdown) -> Result<Option<UploadReport>, ClientError> {
    let report = upload(opts, stop).await?;
    stop.wait().await;
    Ok(report)
}

/// Why nothing was uploaded, when nothing was.
fn withheld(opts: &UploadOptions) -> Option<&'static str> {
    let Ok(bytes) = std::fs::read(&opts.result_file) else {
        return Some("no result: the run was stopped before it finished; nothing uploaded");
    };
    match serde_json::from_slice::<crate::api::outcome::LaunchResult>(&bytes) {
        Ok(result) if result.outcome.cancelled => Some("cancelled: the run was stopped; nothing uploaded"),
        _ => None,
    }
}

/// The sidecar's side of the verdict channel ([`verdict`]), from its
/// start: listening, or (restarted) the verdict already there, or the
/// launcher's channel lost with the process before the restart.
#[derive(Debug)]
pub enum Channel {
    Listening(verdict::VerdictListener),
    Connected(verdict::VerdictConnection),
    Received,
    /// Restarted after the launcher connected, before its verdict came:
    /// this sidecar takes no verdict ([`verdict::VerdictError::Restarted`]).
    Lost,
}

impl Channel {
    /// Listen on the options' socket for the launcher (before the run
    /// container starts: the sidecar's first act).
    pub fn open(opts: &UploadOptions) -> Result<Channel, verdict::VerdictError> {
        match verdict::listen(&opts.verdict_socket, &opts.result_file) {
            Ok(verdict::Listening::Waiting(listener)) => Ok(Channel::Listening(listener)),
            Ok(verdict::Listening::Received) => Ok(Channel::Received),
            Err(verdict::VerdictError::Restarted) => Ok(Channel::Lost),
            Err(e) => Err(e),
        }
    }

    /// The launcher's connection taken (`Ok(None)`: stopped first).
    pub async fn connected(self, stop: &Shutdown) -> Result<Option<Channel>, verdict::VerdictError> {
        match self {
            Channel::Listening(listener) => tokio::select! {
                biased;
                accepted = listener.accept() => accepted.map(|c| Some(Channel::Connected(c))),
                _ = stop.wait() => Ok(None),
            },
            other => Ok(Some(other)),
        }
    }
}

/// Waits for the launcher's verdict (written into the result directory by
/// the channel) or the stop signal, uploads (retrying transient failures),
/// and writes the termination log either way. A run that was cancelled
/// (its verdict says so, or it never sent one) uploads nothing: its
/// partial files are not a result. `Ok(None)` then.
pub async fn upload(opts: &UploadOptions, stop: &Shutdown) -> Result<Option<UploadReport>, ClientError> {
    let channel = match Channel::open(opts) {
        Ok(channel) => channel,
        Err(e) => {
            write_termination_log(opts, &termination_error(&e.to_string()));
            return Err(ClientError::Refused(e.to_string()));
        }
    };
    upload_with(opts, channel, stop).await
}

/// [`upload`] over a channel opened earlier (a warm pod's sidecar opens it
/// before it waits for a claim).
pub async fn upload_with(opts: &UploadOptions, channel: Channel, stop: &Shutdown) -> Result<Option<UploadReport>, ClientError> {
    let received = match channel.connected(stop).await {
        Ok(Some(Channel::Connected(connection))) => {
            let receiving = connection.receive(&opts.limits);
            tokio::pin!(receiving);
            let got = tokio::select! {
                biased;
                got = &mut receiving => got,
                _ = stop.wait() => match tokio::time::timeout(RESULT_AFTER_STOP, &mut receiving).await {
                    Ok(got) => got,
                    Err(_) => Err(verdict::VerdictError::NoVerdict),
                },
            };
            got.map(|_| ())
        }
        Ok(Some(Channel::Lost)) => Err(verdict::VerdictError::Restarted),
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(verdict::VerdictError::NoVerdict),
        Err(e) => Err(e),
    };
    if let Err(e) = received {
        let why = match e {
            verdict::VerdictError::NoVerdict => "no result: the run was stopped before it finished; nothing uploaded".to_string(),
            other => format!("no result: {other}; nothing uploaded"),
        };
        write_termination_log(opts, &why);
        return Ok(None);
    }
    if let Some(why) = withheld(opts) {
        write_termination_log(opts, why);
        return Ok(None);
    }
    send_outputs(opts).await.map(Some)
}

/// Uploads what is there now (retrying transient failures within the
/// patience) and writes the termination log either way.
pub(super) async fn send_outputs(opts: &UploadOptions) -> Result<UploadReport, ClientError> {
    let http = match http_client() {
        Ok(http) => http,
        Err(e) => {
            write_termination_log(opts, &termination_error(&e.to_string()));
            return Err(e);
        }
    };
    let mut retry = Retry::new(opts.patience);
    let result = loop {
        match upload_once(&http, opts).await {
            Ok(r) => break Ok(r),
            Err(e) if e.is_transient() && retry.again(&e).await => {}
            Err(e) => break Err(e),
        }
    };
    let line = match &result {
        Ok(r) => r.termination_message.clone(),
        Err(e) => termination_error(&e.to_string()),
    };
    write_termination_log(opts, &line);
    result
}

/// An inotify watch and the receiver its events wake: `None` watch (the
/// receiver then never yields) when the watch cannot be made.
pub(crate) type DirWatch = (Option<notify_debouncer_mini::notify::RecommendedWatcher>, tokio::sync::mpsc::Receiver<()>);

/// An inotify watch on `dir` (not recursive): its receiver yields once
/// per burst of events. The launcher waits on the claim directory with it.
pub(crate) fn watch_dir(dir: &std::path::Path) -> DirWatch {
    use notify_debouncer_mini::notify::{RecursiveMode, Watcher};
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let watcher = notify_debouncer_mini::notify::recommended_watcher(move |_event| {
        // A full channel already holds a wake-up: the waiter re-checks the file.
        let _ = tx.try_send(());
    })
    .and_then(|mut w| w.watch(dir, RecursiveMode::NonRecursive).map(|()| w));
    match watcher {
        Ok(w) => (Some(w), rx),
        Err(err) => {
            tracing::warn!(%err, dir = %dir.display(), "cannot watch the directory; polling it");
            (None, rx)
        }
    }
}

pub(super) fn write_termination_log(opts: &UploadOptions, line: &str) {
    if let Some(path) = &opts.termination_log {
        if let Err(e) = std::fs::write(path, line.as_bytes()) {
            tracing::warn!(error = %e, path = %path.display(), "cannot write the termination log");
        }
    }
}

pub(super) async fn upload_once(http: &reqwest::Client, opts: &UploadOptions) -> Result<UploadReport, ClientError> {
    let ep = &opts.endpoint;
    let request = ep.authorize(http.put(ep.url("outputs")))?;
    let (work, result_file, limits) = (opts.work_dir.clone(), opts.result_file.clone(), opts.limits);
    let plan = tokio::task::spawn_blocking(move || plan_upload(&work, &result_file, &limits))
        .await
        .map_err(|e| ClientError::Protocol(format!("walk task: {e}")))??;

    let (tx, rx) = mpsc::channel::<io::Result<Vec<u8>>>(8);
    let (ns, uid) = (ep.namespace.clone(), ep.uid.clone());
    let writer = tokio::task::spawn_blocking(move || write_tar(plan, &ns, &uid, tx));
    let url = ep.url("outputs");
    let sent = request.header(CONTENT_TYPE, TAR_CONTENT_TYPE).body(reqwest::Body::wrap_stream(RxStream(rx))).send().await;
    let written = writer.await.map_err(|e| ClientError::Protocol(format!("tar task: {e}")))?;
    let resp = match sent {
        Ok(r) if !r.status().is_success() => return Err(endpoint_error(&url, r).await),
        Ok(r) => r,
        // The writer's own failure (a file that shrank...) aborts the body
        // and is the better report; a broken pipe is only the consequence.
        Err(e) => match written {
            Err(w) if !is_broken_pipe(&w) => return Err(w),
            _ => return Err(ClientError::Unreachable { url, detail: error_chain(&e) }),
        },
    };
    let (manifest, manifest_bytes) = written?;
    let manifest_digest = super::super::sha256_digest(&manifest_bytes);
    let body = read_capped(resp, 64 * 1024).await?;
    let answer: serde_json::Value = serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(format!("outputs answer: {e}")))?;
    if answer.get("manifestDigest").and_then(|v| v.as_str()) != Some(manifest_digest.as_str()) {
        return Err(ClientError::Protocol(format!(
            "the endpoint stored manifest {:?}, this upload sent {manifest_digest}",
            answer.get("manifestDigest")
        )));
    }
    let set_digest = answer.get("setDigest").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let termination_message = termination_message(&manifest_digest, &manifest);
    Ok(UploadReport { manifest, manifest_digest, set_digest, termination_message })
}

pub(super) fn is_broken_pipe(e: &ClientError) -> bool {
    matches!(e, ClientError::Io { source, .. } if source.kind() == io::ErrorKind::BrokenPipe)
}
