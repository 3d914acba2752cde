//! The pod side: `skill-operator fetch` (init container) and
//! `skill-operator upload` (native sidecar), as library functions over plain
//! structs; [`fetch_command`] and [`upload_command`] map the flags.
//!
//! Both talk to one URL only (`--endpoint`, an IP: the pod has no DNS),
//! never through a proxy and never following a redirect (the token must not
//! go anywhere else), and both identify as `job:<ns>:<uid>:<token>`, the
//! token read from a file mounted into these two containers only: in the
//! cluster the pod's projected ServiceAccount token, with `serve` and in
//! tests an HMAC job token (see the parent module). The file is read again
//! before every request, because the kubelet replaces a projected token
//! before it expires; the `run` container does not mount it.
//!
//! # fetch
//! 1. `GET .../package` (skipped without `--package`: a prepared image
//!    holds the package; with `--staged-package <digest>`, `GET
//!    .../package?digest=<digest>`: the copy staged once for the job's
//!    namespace): at most [`ArtifactLimits::max_package_bytes`]
//!    (checked against Content-Length, then while reading), sha256 compared
//!    with the `X-Content-Digest` the endpoint announces (and with
//!    `--package-digest` when given), then `package::unpack` into the
//!    package directory with all its checks (paths, types, caps).
//! 2. `GET .../inputs`: the manifest is checked whole before any download:
//!    every path through `RelPath::parse` and the package path rules, the
//!    count, per-file and total caps. Then each file is streamed to disk
//!    (never held in memory: the container has a 128 MiB limit), created
//!    with `create_new` under directories this call made, capped at the
//!    announced size and checked against the announced digest; reads are
//!    pinned to the manifest's set digest (`?set=`), so a set replaced
//!    mid-fetch fails (409) instead of mixing two versions.
//! 3. Copies its own executable to `<tools>/skill-operator` (0755, via a
//!    temporary name and rename) so the run image needs nothing of ours.
//!
//! `--no-inputs` skips step 2: a warm pod's fetch, made before any run has
//! claimed the pod ([`warm`]).
//!
//! # upload
//! Waits (polling) until the result file exists or the stop signal (SIGTERM:
//! the kubelet sends it once `run` has exited) arrives, then uploads in one
//! streamed tar (see the parent module): the result file, `stdout`,
//! `stderr`, and every regular file under the work directory. The walk
//! never follows a symlink: directories are opened with `openat(...,
//! O_NOFOLLOW | O_DIRECTORY)` relative to their parent and files with
//! `O_NOFOLLOW`, so a script that leaves `out -> /var/run/skill-operator/token`
//! (or swaps a directory for a link) cannot make the sidecar read through
//! it; symlinks, FIFOs, sockets and devices are skipped and reported. Over-cap
//! files are reported, not sent. The manifest goes last, so everything is
//! read once; its sha256, with counts, is the termination message (< 4 KiB).
//! After a successful upload the sidecar stays up until stopped: a native
//! sidecar that exits is restarted by the kubelet while `run` still runs.
//!
//! With `--claim-dir` it is a warm pod's sidecar: it waits for the pod's
//! claim first, then does the above for the run that claimed it ([`warm`]).

mod fetch;
mod tar_stream;
mod upload;
pub mod warm;

pub use fetch::*;
use tar_stream::*;
pub use upload::*;

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::AUTHORIZATION;

use super::{
    check_namespace, check_uid, job_bearer, termination_error, ArtifactLimits, ErrorBody, ErrorCode, CLAIM_HEADER, HEADER_CONTENT_DIGEST,
};
use crate::core::package::PackageError;

/// Where the endpoint is and who this pod is.
#[derive(Clone)]
pub struct Endpoint {
    /// Base URL including the API version, e.g. `http://10.96.0.10:8443/v1`.
    pub base: String,
    pub namespace: String,
    /// The SkillJob's UID.
    pub uid: String,
    /// The job token (the token file's content when it was read first).
    pub token: String,
    /// Where the token came from: read again for every request, because the
    /// kubelet replaces a projected ServiceAccount token before it expires.
    token_file: Option<PathBuf>,
    /// A claimed warm pod's own uid ([`Endpoint::claimed`]): the credential
    /// is that uid's and every request names it in [`CLAIM_HEADER`], while
    /// the routes are `uid`'s (the SkillJob's).
    claim: Option<String>,
}

/// The longest token accepted (bytes). An HMAC job token is 64; a projected
/// ServiceAccount token is a JWT of one to two KiB.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base", &self.base)
            .field("namespace", &self.namespace)
            .field("uid", &self.uid)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    pub fn new(
        base: impl Into<String>,
        namespace: impl Into<String>,
        uid: impl Into<String>,
        token: impl Into<String>,
    ) -> Result<Self, ClientError> {
        let base = base.into().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::Config(format!("--endpoint {base:?}: expected http://IP:PORT/v1")));
        }
        let (namespace, uid) = (namespace.into(), uid.into());
        check_namespace(&namespace).map_err(ClientError::Config)?;
        check_uid(&uid).map_err(ClientError::Config)?;
        let token = checked_token(token.into())?;
        Ok(Endpoint { base, namespace, uid, token, token_file: None, claim: None })
    }

    /// Reads the token from `token_file` (the mounted token volume), now to
    /// check it and again before every request.
    pub fn with_token_file(
        base: impl Into<String>,
        namespace: impl Into<String>,
        uid: impl Into<String>,
        token_file: &Path,
    ) -> Result<Self, ClientError> {
        let token = read_token_file(token_file)?;
        Ok(Endpoint { token_file: Some(token_file.to_path_buf()), ..Endpoint::new(base, namespace, uid, token)? })
    }

    /// This warm pod's endpoint for the run that claimed it: the routes of
    /// `skilljob_uid` (its inputs, its outputs), with this pod's own
    /// credential and [`CLAIM_HEADER`] naming this pod's warm uid. The
    /// endpoint admits that while the claim it stored for this warm uid
    /// names `skilljob_uid`.
    pub fn claimed(&self, skilljob_uid: &str) -> Result<Endpoint, ClientError> {
        check_uid(skilljob_uid).map_err(ClientError::Config)?;
        if self.claim.is_some() {
            return Err(ClientError::Config("this endpoint is claimed already".into()));
        }
        Ok(Endpoint { uid: skilljob_uid.to_string(), claim: Some(self.uid.clone()), ..self.clone() })
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/jobs/{}/{}/{tail}", self.base, self.namespace, self.uid)
    }

    /// The credential for the next request, from the token file's current
    /// content when there is one: the warm pod's own when claimed.
    fn bearer(&self) -> Result<String, ClientError> {
        let uid = self.claim.as_deref().unwrap_or(&self.uid);
        match &self.token_file {
            Some(path) => Ok(job_bearer(&self.namespace, uid, &read_token_file(path)?)),
            None => Ok(job_bearer(&self.namespace, uid, &self.token)),
        }
    }

    /// `req` with the credential and, when claimed, [`CLAIM_HEADER`].
    fn authorize(&self, req: reqwest::RequestBuilder) -> Result<reqwest::RequestBuilder, ClientError> {
        let req = req.header(AUTHORIZATION, self.bearer()?);
        Ok(match &self.claim {
            Some(warm) => req.header(CLAIM_HEADER, warm),
            None => req,
        })
    }
}

/// The token in `path`, checked. The read is capped: one byte over the
/// bound is enough to refuse an oversized file without reading it whole.
/// Links are followed on purpose: in a projected or Secret volume every file
/// is a link into a directory the kubelet swaps atomically, and that volume
/// is mounted (read-only) into fetch and upload alone, so nothing the run
/// writes can stand in for it.
fn read_token_file(path: &Path) -> Result<String, ClientError> {
    let mut raw = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES as u64 + 1).read_to_string(&mut raw))
        .map_err(|source| ClientError::Io { what: format!("reading the token file {}", path.display()), source })?;
    checked_token(raw)
}

fn checked_token(raw: String) -> Result<String, ClientError> {
    let token = raw.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ClientError::Config("the job token is empty or malformed".into()));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(ClientError::Config(format!("the job token is longer than {MAX_TOKEN_BYTES} bytes; is the token file the right one?")));
    }
    Ok(token.to_string())
}

/// Why fetch or upload failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Config(String),
    #[error("cannot reach the artifact endpoint ({url}): {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the artifact endpoint answered {status} {code} for {url}: {message}")]
    Endpoint { url: String, status: u16, code: String, message: String },
    #[error("{what}: content hashes to {actual}, the endpoint announced {expected}; the stored copy or the transfer is corrupt")]
    DigestMismatch { what: String, expected: String, actual: String },
    #[error("{what}: got {actual} bytes, the endpoint announced {expected}")]
    SizeMismatch { what: String, expected: u64, actual: u64 },
    #[error("{what} is larger than {limit} bytes")]
    TooLarge { what: String, limit: u64 },
    #[error("the endpoint's answer is not usable: {0}")]
    Protocol(String),
    /// A warm pod refused its claim (it was tampered with, or the claimed
    /// run's inputs could not be brought in): the result saying so is stored.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl ClientError {
    /// Worth another attempt: the network, a busy or failing endpoint, a
    /// file that changed under the upload. Not: refusals and integrity errors.
    fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::Io { .. } => true,
            ClientError::Endpoint { status, code, .. } => *status >= 500 && ErrorCode::parse(code) != Some(ErrorCode::DigestMismatch),
            _ => false,
        }
    }
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ClientError {
    let what = what.into();
    move |source| ClientError::Io { what, source }
}

pub(crate) fn http_client() -> Result<reqwest::Client, ClientError> {
    crate::tls::reqwest_builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| ClientError::Protocol(format!("cannot make an HTTP client: {}", crate::oci::error_chain(&e))))
}

/// Path segments and query values as the URL carries them.
pub(crate) const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

pub(crate) fn encode_path(rel: &str) -> String {
    rel.split('/').map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect::<Vec<_>>().join("/")
}

pub(crate) async fn endpoint_error(url: &str, resp: reqwest::Response) -> ClientError {
    let status = resp.status().as_u16();
    let body = read_capped(resp, 64 * 1024).await.unwrap_or_default();
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(e) => ClientError::Endpoint { url: url.into(), status, code: e.error.code, message: e.error.message },
        Err(_) => ClientError::Endpoint {
            url: url.into(),
            status,
            code: "http".into(),
            message: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        },
    }
}

pub(crate) async fn read_capped(mut resp: reqwest::Response, cap: u64) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| ClientError::Protocol(format!("reading an answer: {e}")))? {
        if out.len() as u64 + chunk.len() as u64 > cap {
            return Err(ClientError::TooLarge { what: "an answer".into(), limit: cap });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// How long the pod's fetch and upload wait out an artifact endpoint that
/// cannot be reached or answers 502/503/504, counted from the first
/// attempt: an endpoint that is down for a rolling restart or a
/// rescheduled pod (a new one is ready in about 5-15 s) must not fail the
/// runs that start or end meanwhile. The upload has only the pod's
/// termination grace period once the run container has exited, which the
/// Job builder checks leaves room for the last attempt.
pub const ENDPOINT_PATIENCE: Duration = Duration::from_secs(20);

/// The pause before the second attempt; each next one doubles, up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(4);

/// Paces the attempts at one request within a patience.
pub(crate) struct Retry {
    first: tokio::time::Instant,
    delay: Duration,
    patience: Duration,
    attempt: u32,
}

impl Retry {
    pub(crate) fn new(patience: Duration) -> Self {
        Retry { first: tokio::time::Instant::now(), delay: FIRST_RETRY_DELAY, patience, attempt: 1 }
    }

    /// Waits before the next attempt and says so; `false` (at once) when
    /// that attempt would start past the patience.
    pub(crate) async fn again(&mut self, failure: &ClientError) -> bool {
        if self.first.elapsed() + self.delay > self.patience {
            tracing::warn!(error = %failure, attempts = self.attempt, "the artifact endpoint did not answer; giving up");
            return false;
        }
        tracing::warn!(error = %failure, attempt = self.attempt, retry_in_ms = self.delay.as_millis() as u64, "the artifact endpoint did not answer; retrying");
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(MAX_RETRY_DELAY);
        self.attempt += 1;
        true
    }
}

/// A GET, sent again (within `patience`) whatever cut it short and on
/// 502/503/504 (the endpoint restarting, or nothing behind its Service):
/// a GET changes nothing, so sending it twice is safe.
pub(crate) async fn get(http: &reqwest::Client, ep: &Endpoint, url: &str, patience: Duration) -> Result<reqwest::Response, ClientError> {
    send_idempotent(http, ep, url, patience, |http, url| http.get(url)).await
}

/// A request `make` builds, authorised and sent again as [`get`] sends a
/// GET: only for requests that change nothing when repeated.
pub(crate) async fn send_idempotent(
    http: &reqwest::Client,
    ep: &Endpoint,
    url: &str,
    patience: Duration,
    make: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, ClientError> {
    let mut retry = Retry::new(patience);
    loop {
        let failure = match ep.authorize(make(http, url)) {
            // A token file unreadable for a moment is retried like the network.
            Err(e) if e.is_transient() => e,
            Err(e) => return Err(e),
            Ok(req) => match req.send().await {
                Ok(r) if r.status().is_success() => return Ok(r),
                Ok(r) if matches!(r.status().as_u16(), 502..=504) => endpoint_error(url, r).await,
                Ok(r) => return Err(endpoint_error(url, r).await),
                Err(e) => ClientError::Unreachable { url: url.into(), detail: error_chain(&e) },
            },
        };
        if !retry.again(&failure).await {
            return Err(failure);
        }
    }
}

use crate::oci::error_chain;

pub(crate) fn announced_digest(resp: &reqwest::Response, what: &str) -> Result<String, ClientError> {
    let d = resp
        .headers()
        .get(HEADER_CONTENT_DIGEST)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ClientError::Protocol(format!("{what}: no {HEADER_CONTENT_DIGEST} header")))?;
    check_digest(d).map_err(ClientError::Protocol)?;
    Ok(d.to_string())
}

pub(crate) fn check_digest(d: &str) -> Result<(), String> {
    match d.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => Ok(()),
        _ => Err(format!("{d:?} is not a sha256:<hex> digest")),
    }
}

#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// Artifact endpoint base URL, API version included (an IP: pods have no DNS), e.g. http://10.96.0.10:8443/v1.
    #[arg(long, value_name = "URL")]
    pub endpoint: String,
    /// The SkillJob's namespace (pods get no service-account mount to read it from).
    #[arg(long, value_name = "NS")]
    pub namespace: String,
    /// The SkillJob's UID.
    #[arg(long, value_name = "UID")]
    pub job: String,
    /// File holding the job's token (the pod's projected ServiceAccount token, or an HMAC job token).
    #[arg(long, value_name = "FILE", default_value = "/var/run/skill-operator/token")]
    pub token_file: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Where the package is unpacked (empty). Omitted when the run's image holds the package (a prepared one).
    #[arg(long, value_name = "DIR")]
    pub package: Option<PathBuf>,
    /// Where input files go.
    #[arg(long, value_name = "DIR")]
    pub work: PathBuf,
    /// Where this binary is copied as skill-operator (for the launcher).
    #[arg(long, value_name = "DIR")]
    pub tools: PathBuf,
    /// Refuse a package whose sha256 differs (sha256:<hex>).
    #[arg(long, value_name = "DIGEST")]
    pub package_digest: Option<String>,
    /// Fetch the package staged once for the job's namespace at this digest
    /// (the SkillPackage's pinned manifest digest, sha256:<hex>) instead of
    /// the job's own. The bytes are verified as without it. Checked before
    /// any request (a malformed one fails with its reason in the termination log).
    #[arg(long, value_name = "DIGEST")]
    pub staged_package: Option<String>,
    /// Fetch no inputs: a warm pod's fetch, made before any run has claimed
    /// the pod (there are no inputs yet). Its upload sidecar (`upload
    /// --claim-dir`) brings the claimed run's inputs once the claim comes.
    #[arg(long)]
    pub no_inputs: bool,
    /// Where a failure's one-line reason goes (the controller puts it in the SkillJob's message).
    #[arg(long, value_name = "FILE", default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct UploadArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// The work directory whose regular files are uploaded.
    #[arg(long, value_name = "DIR")]
    pub work: PathBuf,
    /// Where the launcher's verdict is written as it arrives (result.json,
    /// with stdout and stderr beside it): a volume of this container's own.
    #[arg(long, value_name = "FILE")]
    pub result: PathBuf,
    /// The abstract socket the launcher sends its verdict on (the pod's
    /// network namespace is the pod's own).
    #[arg(long, value_name = "NAME", default_value = super::verdict::DEFAULT_NAME)]
    pub verdict_socket: String,
    /// Where the digest line goes.
    #[arg(long, value_name = "FILE", default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
    /// A warm pod's sidecar (--job is the pod's warm uid): wait for a run to
    /// claim the pod, check that nothing was left in it meanwhile, bring the
    /// run's inputs into --work, and hand the claim to the launcher as
    /// DIR/claim.json (an emptyDir the run container mounts read-only); then
    /// upload that run's outputs under its SkillJob's uid. The pod is made
    /// before its run, so the run can only reach it this way.
    #[arg(long, value_name = "DIR")]
    pub claim_dir: Option<PathBuf>,
    /// With --claim-dir: the file where the launcher leaves this pod's
    /// public key (`launch --claim-key`); it is published at the endpoint
    /// before the wait, so a run granted variables can have them sealed to it.
    #[arg(long, value_name = "FILE", requires = "claim_dir")]
    pub claim_key: Option<PathBuf>,
    /// The proc filesystem whose entries are the container's processes
    /// (tests without a PID namespace give an empty directory).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

/// `skill-operator fetch`.
pub async fn fetch_command(a: FetchArgs) -> Result<(), ClientError> {
    crate::tls::install_crypto_provider();
    let endpoint = Endpoint::with_token_file(a.job.endpoint, a.job.namespace, a.job.job, &a.job.token_file)?;
    let opts = FetchOptions {
        endpoint,
        package_dir: a.package,
        work_dir: a.work,
        tools_dir: Some(a.tools.clone()),
        expect_package_digest: a.package_digest,
        staged_package: a.staged_package,
        skip_inputs: a.no_inputs,
        limits: ArtifactLimits::DEFAULT,
        patience: ENDPOINT_PATIENCE,
    };
    let start_unix_nano = crate::api::outcome::unix_nanos_now();
    match fetch(&opts).await {
        Ok(r) => {
            // For the run's trace: the launcher, in this tools volume, reports them.
            let times = crate::api::outcome::FetchTimes { start_unix_nano, end_unix_nano: crate::api::outcome::unix_nanos_now() };
            let path = a.tools.join(crate::api::outcome::FETCH_TIMES_FILE);
            if let Err(err) = serde_json::to_vec(&times).map_err(std::io::Error::other).and_then(|b| std::fs::write(&path, b)) {
                tracing::warn!(error = %err, path = %path.display(), "cannot leave the fetch times (the run's trace will lack them)");
            }
            match &r.package_digest {
                Some(d) => eprintln!("fetched package {d} ({} files) and {} inputs", r.package_files, r.inputs.len()),
                None => eprintln!("fetched {} inputs (the package is in the image)", r.inputs.len()),
            }
            Ok(())
        }
        Err(e) => {
            if let Err(write) = std::fs::write(&a.termination_log, termination_error(&e.to_string())) {
                tracing::warn!(error = %write, path = %a.termination_log.display(), "cannot write the termination log");
            }
            Err(e)
        }
    }
}

/// `skill-operator upload` (the native sidecar): upload once the result is
/// there (or at shutdown), then stay up until shutdown.
pub async fn upload_command(a: UploadArgs, shutdown: crate::shutdown::Shutdown) -> Result<(), ClientError> {
    crate::tls::install_crypto_provider();
    let endpoint = Endpoint::with_token_file(a.job.endpoint, a.job.namespace, a.job.job, &a.job.token_file)?;
    let mut opts = UploadOptions::new(endpoint, a.work, a.result);
    opts.termination_log = Some(a.termination_log);
    opts.verdict_socket = a.verdict_socket;
    if let Some(claim_dir) = a.claim_dir {
        let warm = warm::WarmOptions { proc_root: a.proc_root, claim_key: a.claim_key, ..warm::WarmOptions::new(opts, claim_dir) };
        eprintln!("skill-operator upload: warm pod {} waiting for a claim", warm.upload.endpoint.uid);
        match warm::run_warm_upload_sidecar(&warm, &shutdown).await? {
            warm::WarmEnd::Unclaimed => eprintln!("stopped before any run claimed this warm pod"),
            warm::WarmEnd::Ran { claim, report: Some(r) } => {
                eprintln!("uploaded SkillJob {}: {}", claim.skilljob_uid, r.termination_message)
            }
            warm::WarmEnd::Ran { claim, report: None } => {
                eprintln!("nothing uploaded for SkillJob {}: the run was cancelled or stopped before it finished", claim.skilljob_uid)
            }
        }
        return Ok(());
    }
    // The signal handlers are in place (main installs them first): from here
    // a SIGTERM is an orderly stop, which is what this line tells a watcher.
    eprintln!("skill-operator upload: waiting for the launcher's verdict on @{}", opts.verdict_socket);
    match run_upload_sidecar(&opts, &shutdown).await? {
        Some(r) => eprintln!("uploaded: {}", r.termination_message),
        None => eprintln!("nothing uploaded: the run was cancelled or stopped before it finished"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "http://10.0.0.10:8443/v1";

    #[test]
    fn a_projected_token_fits_and_an_oversized_one_is_refused() {
        let jwt = format!("eyJhbGciOiJSUzI1NiJ9.{}.sig", "a".repeat(2000));
        assert_eq!(Endpoint::new(BASE, "team", "uid-1", format!("{jwt}\n")).unwrap().token, jwt);
        assert!(Endpoint::new(BASE, "team", "uid-1", "a".repeat(MAX_TOKEN_BYTES)).is_ok());
        let err = Endpoint::new(BASE, "team", "uid-1", "a".repeat(MAX_TOKEN_BYTES + 1)).unwrap_err();
        assert!(err.to_string().contains("8192"), "{err}");
        for bad in ["", "  ", "a b", "tök"] {
            assert!(Endpoint::new(BASE, "team", "uid-1", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_token_file_is_read_again_for_every_request() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "first\n").unwrap();
        let ep = Endpoint::with_token_file(BASE, "team", "uid-1", &file).unwrap();
        assert_eq!(ep.bearer().unwrap(), job_bearer("team", "uid-1", "first"));
        // What the kubelet does when it rotates the token.
        std::fs::write(&file, "second").unwrap();
        assert_eq!(ep.bearer().unwrap(), job_bearer("team", "uid-1", "second"));
        std::fs::write(&file, "a".repeat(MAX_TOKEN_BYTES + 10)).unwrap();
        assert!(matches!(ep.bearer(), Err(ClientError::Config(_))));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(ep.bearer(), Err(ClientError::Io { .. })), "a missing file is transient");
    }
}
