//! The file route, `/files/{namespace}/{job}/{*path}`: files too large for
//! an MCP call (over [`JOB_UPLOAD_CHUNK`](crate::core::limits::JOB_UPLOAD_CHUNK), up to [`FILE_ROUTE_BYTES`]) in one
//! authenticated HTTP request.
//!
//! - `GET` streams output file `path` of a finished job (from the artifact
//!   endpoint, through the operator credential; never held whole), with its
//!   `Content-Length` and `X-Content-Digest` (`sha256:<hex>`).
//! - `PUT` replaces input file `path` of a job that has not run yet (a
//!   draft of `skill_job_create`) with the body, streamed on to the
//!   artifact endpoint. The body needs a `Content-Length` of at most
//!   [`FILE_ROUTE_BYTES`] (413 above it, 411 without one), and must be
//!   exactly that long: a body that runs past it or ends before it stores
//!   nothing (400), because its last bytes are held back until its end has
//!   been seen.
//!
//! The route sits behind the same gate as `/mcp/{namespace}` (a verified
//! token, `get` on skillbindings there), then each method is authorized
//! as its MCP tool is: `GET` as reading jobs (`get` skilljobs), `PUT` as
//! starting work (`create` skilljobs), by the namespace's SubjectAccessReview
//! authorizer. Ownership is the job tools': a job of another principal, or
//! of another namespace, is not found (404), whoever asks.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::stream::BoxStream;
use futures::StreamExt;

pub use super::file_url::{BodyStream, Download, JobFiles, FILES_PREFIX};
use super::namespaces::Namespace;
use super::shared::{json_error, namespace_or_refusal, Shared};
use crate::artifacts::HEADER_CONTENT_DIGEST;
use crate::audit::{Event, FileRef, Outcome, Record};
use crate::core::limits::{bytes_text, FILE_ROUTE_BYTES};
use crate::mcp::error::{codes, ToolError};
use crate::mcp::executor::Caller;
use crate::mcp::state::Action;

/// How a request body failed to be what its `Content-Length` said.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BodyFault {
    Longer { declared: u64 },
    Shorter { declared: u64, got: u64 },
    Broken(String),
}

impl BodyFault {
    fn message(&self) -> String {
        match self {
            BodyFault::Longer { declared } => {
                format!("the body is longer than its Content-Length ({declared} bytes); nothing was stored: send the length of the file")
            }
            BodyFault::Shorter { declared, got } => format!(
                "the body ended after {got} of the {declared} bytes its Content-Length announced; nothing was stored: send the file again"
            ),
            BodyFault::Broken(detail) => format!("the body could not be read ({detail}); nothing was stored: send the file again"),
        }
    }
}

/// `body` held to exactly `declared` bytes. The chunk that reaches the
/// length is passed on only once the body is seen to end there, so a
/// receiver told the same length never gets a complete body from a
/// request that lied; a fault ends the stream with an error and is
/// recorded in `fault`.
fn exact_length(body: Body, declared: u64, fault: Arc<Mutex<Option<BodyFault>>>) -> BodyStream {
    struct St {
        inner: BoxStream<'static, Result<bytes::Bytes, axum::Error>>,
        seen: u64,
        done: bool,
        fault: Arc<Mutex<Option<BodyFault>>>,
    }
    fn fail(st: St, f: BodyFault) -> Option<(Result<bytes::Bytes, std::io::Error>, St)> {
        let message = f.message();
        *st.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
        Some((Err(std::io::Error::other(message)), St { done: true, ..st }))
    }
    /// Whether the body ends now (empty chunks aside), or the fault if not.
    async fn ends(inner: &mut BoxStream<'static, Result<bytes::Bytes, axum::Error>>, declared: u64) -> Result<(), BodyFault> {
        loop {
            match inner.next().await {
                None => return Ok(()),
                Some(Ok(chunk)) if chunk.is_empty() => continue,
                Some(Ok(_)) => return Err(BodyFault::Longer { declared }),
                Some(Err(e)) => return Err(BodyFault::Broken(e.to_string())),
            }
        }
    }
    let st = St { inner: body.into_data_stream().boxed(), seen: 0, done: false, fault };
    futures::stream::unfold(st, move |mut st| async move {
        if st.done {
            return None;
        }
        if declared == 0 {
            return match ends(&mut st.inner, declared).await {
                Ok(()) => None,
                Err(f) => fail(st, f),
            };
        }
        match st.inner.next().await {
            Some(Ok(chunk)) => {
                let seen = st.seen + chunk.len() as u64;
                if seen > declared {
                    return fail(st, BodyFault::Longer { declared });
                }
                st.seen = seen;
                if seen == declared {
                    if let Err(f) = ends(&mut st.inner, declared).await {
                        return fail(st, f);
                    }
                    st.done = true;
                }
                Some((Ok(chunk), st))
            }
            Some(Err(e)) => fail(st, BodyFault::Broken(e.to_string())),
            None => {
                let got = st.seen;
                fail(st, BodyFault::Shorter { declared, got })
            }
        }
    })
    .boxed()
}

/// The HTTP status of a job or authorization refusal.
fn status_of(code: &str) -> StatusCode {
    match code {
        "job-not-found" | "job-no-such-file" | "skill-not-bound" => StatusCode::NOT_FOUND,
        "job-bad-path" | "job-path-too-deep" => StatusCode::BAD_REQUEST,
        "job-not-run-yet" | "job-still-running" | "job-uploads-closed" | "job-withheld" | "job-vanished" => StatusCode::CONFLICT,
        "job-file-too-large" | "job-job-too-large" | "job-too-many-files" => StatusCode::PAYLOAD_TOO_LARGE,
        codes::UNAUTHORIZED => StatusCode::UNAUTHORIZED,
        codes::FORBIDDEN => StatusCode::FORBIDDEN,
        codes::BACKEND => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn refusal(err: ToolError) -> Response {
    if err.code == codes::BACKEND {
        tracing::warn!(error = %err.message, "the file route could not reach the cluster or the artifact endpoint");
    }
    json_error(status_of(err.code), err.code, err.message)
}

/// `GET`/`PUT /files/{namespace}/{job}/{*path}`.
pub(super) async fn files(
    State(shared): State<Shared>,
    Path((namespace, job, path)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    let ns = match namespace_or_refusal(&shared, &namespace).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    // The gate put the verified caller here; without a gate (tests, a
    // local listener) the caller is the one local principal, as on /mcp.
    let caller = request.extensions().get::<Caller>().cloned().unwrap_or_else(Caller::local);
    let event = if request.method() == Method::PUT { Event::FileUpload } else { Event::FileDownload };
    let mut response = serve_file(&ns, &caller, &namespace, &job, &path, request).await;
    if ns.state.audit.enabled() {
        ns.state.audit.record(file_record(event, &caller, &job, &path, &response));
        response.extensions_mut().insert(crate::audit::http::Recorded);
    }
    response
}

/// One authorized upload or download, or the refusal.
async fn serve_file(ns: &Namespace, caller: &Caller, namespace: &str, job: &str, path: &str, request: Request) -> Response {
    // The caller's one budget, whatever route they use.
    if let Err(over) = super::shared::charge_call(&ns.state.rate_limits, caller) {
        return super::shared::limited(over);
    }
    let action = if request.method() == Method::PUT { Action::Run } else { Action::ReadJobs };
    if let Err(err) = ns.state.authorize(caller, action).await {
        return refusal(err);
    }
    let Some(jobs) = ns.files.clone() else {
        return json_error(StatusCode::NOT_FOUND, codes::NO_EXECUTION, format!("namespace {namespace} runs no jobs here"));
    };
    if request.method() == Method::PUT {
        upload(jobs.as_ref(), caller, job, path, request).await
    } else {
        download(jobs.as_ref(), caller, job, path).await
    }
}

/// The route's audit record: the file, and the answer's status (the digest of a download, as sent).
fn file_record(event: Event, caller: &Caller, job: &str, path: &str, response: &Response) -> Record {
    let status = response.status();
    let outcome = match status {
        s if s.is_success() => Outcome::Ok,
        StatusCode::TOO_MANY_REQUESTS => Outcome::RateLimited,
        s if s.is_server_error() => Outcome::Failed,
        _ => Outcome::Refused,
    };
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let file = FileRef {
        path: path.to_string(),
        size: header(header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse().ok()).filter(|_| event == Event::FileDownload),
        sha256: header(HEADER_CONTENT_DIGEST).filter(|_| event == Event::FileDownload),
    };
    let mut record = Record::new(event, outcome).caller(caller).job(job).file(file);
    if !status.is_success() {
        record = record.code(format!("http:{}", status.as_u16()));
    }
    record
}

async fn download(jobs: &dyn JobFiles, caller: &Caller, job: &str, path: &str) -> Response {
    let file = match jobs.download(caller, job, path).await {
        Ok(file) => file,
        Err(err) => return refusal(err.into()),
    };
    let mut response = Response::new(Body::from_stream(file.body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Some(size) = file.size {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    }
    if let Some(digest) = file.digest.and_then(|d| HeaderValue::from_str(&d).ok()) {
        headers.insert(HEADER_CONTENT_DIGEST, digest);
    }
    response
}

async fn upload(jobs: &dyn JobFiles, caller: &Caller, job: &str, path: &str, request: Request) -> Response {
    let declared = request.headers().get(header::CONTENT_LENGTH).map(|v| v.to_str().ok().and_then(|v| v.parse::<u64>().ok()));
    let declared = match declared {
        None => {
            return json_error(
                StatusCode::LENGTH_REQUIRED,
                "length-required",
                format!("send the file with a Content-Length header (at most {})", bytes_text(FILE_ROUTE_BYTES)),
            )
        }
        Some(None) => return json_error(StatusCode::BAD_REQUEST, "bad-content-length", "the Content-Length header is not a number".into()),
        Some(Some(n)) => n,
    };
    if declared > FILE_ROUTE_BYTES {
        return json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "file-too-large",
            format!(
                "a file sent through this route may be at most {} ({FILE_ROUTE_BYTES} bytes); this one is {declared} bytes",
                bytes_text(FILE_ROUTE_BYTES)
            ),
        );
    }
    let fault = Arc::new(Mutex::new(None));
    let body = exact_length(request.into_body(), declared, fault.clone());
    let result = jobs.upload(caller, job, path, declared, body).await;
    // A lying body makes the upload fail however the endpoint put it: say why.
    if let Some(f) = fault.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return json_error(StatusCode::BAD_REQUEST, "body-length-mismatch", f.message());
    }
    match result {
        Ok(info) => (StatusCode::OK, axum::Json(serde_json::json!({ "job": job, "file": info }))).into_response(),
        Err(err) => refusal(err.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(body: BodyStream) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut body = body;
        while let Some(chunk) = body.next().await {
            out.extend_from_slice(&chunk.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }

    fn chunks(parts: &[&[u8]]) -> Body {
        let parts: Vec<Result<bytes::Bytes, std::io::Error>> = parts.iter().map(|p| Ok(bytes::Bytes::copy_from_slice(p))).collect();
        Body::from_stream(futures::stream::iter(parts))
    }

    #[tokio::test]
    async fn a_body_must_be_exactly_its_declared_length() {
        for (parts, declared, fault) in [
            (&[&b"abc"[..], b"de"][..], 5, None),
            (&[][..], 0, None),
            (&[&b""[..]][..], 0, None),
            (&[&b"abc"[..], b"", b"de", b""][..], 5, None),
            (&[&b"abc"[..], b"def"][..], 5, Some(BodyFault::Longer { declared: 5 })),
            (&[&b"abcde"[..], b"f"][..], 5, Some(BodyFault::Longer { declared: 5 })),
            (&[&b"x"[..]][..], 0, Some(BodyFault::Longer { declared: 0 })),
            (&[&b"abc"[..]][..], 5, Some(BodyFault::Shorter { declared: 5, got: 3 })),
        ] {
            let seen = Arc::new(Mutex::new(None));
            let out = collect(exact_length(chunks(parts), declared, seen.clone())).await;
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen, fault, "{parts:?} declared {declared}");
            match fault {
                None => assert_eq!(out.unwrap(), parts.concat()),
                Some(_) => assert!(out.is_err()),
            }
        }
    }

    #[tokio::test]
    async fn the_bytes_that_complete_a_lying_body_are_never_passed_on() {
        // Exactly the declared length, then one byte more: the receiver
        // gets the first chunk, then an error, never the complete length.
        let seen = Arc::new(Mutex::new(None));
        let mut body = exact_length(chunks(&[b"ab", b"cd", b"e"]), 4, seen.clone());
        assert_eq!(body.next().await.unwrap().unwrap(), &b"ab"[..]);
        assert!(body.next().await.unwrap().is_err(), "the chunk reaching the length is held back and refused");
        assert!(body.next().await.is_none());
        assert_eq!(*seen.lock().unwrap(), Some(BodyFault::Longer { declared: 4 }));
    }
}
