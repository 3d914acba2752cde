//! `GET /ui/api/ns/{namespace}/events`: server-sent events for one
//! namespace's page. The page reads them with `fetch` (an `EventSource`
//! cannot send the bearer token, and the token never goes into a URL).
//!
//! Events: `hello` (the stream's life in seconds), `job` (one of the
//! caller's jobs, as `skill_job_list` shows it), `gone` (a job deleted),
//! `skills` (the namespace's skills changed: list them again) and, last,
//! `reauth`. A stream lives as long as a verified token is trusted
//! without a new TokenReview ([`STREAM_LIFETIME_MIN`] at least), then
//! ends: the page reconnects through the gate, so a revoked token or a
//! removed RoleBinding stops the events within the same bound as any
//! other request. Streams are counted against [`STREAMS_MAX`]; each holds
//! one watch, dropped with it.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::json;

use super::api::authorized;
use super::limits::{STREAMS_MAX, STREAM_HEARTBEAT, STREAM_LIFETIME_MIN};
use super::{Console, JobChange};
use crate::gateway::shared::json_error;
use crate::mcp::executor::Caller;
use crate::mcp::state::Action;

/// One thing the stream says.
enum Tick {
    Job(JobChange),
    Skills,
    Heartbeat,
    End,
}

/// One event in the `text/event-stream` framing. The data is one line of
/// compact JSON (serde escapes every newline), so it cannot end the event
/// or start another.
fn frame(event: &str, data: &serde_json::Value) -> bytes::Bytes {
    bytes::Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// A job change as its event.
pub(super) fn encode_change(change: &JobChange) -> bytes::Bytes {
    match change {
        JobChange::Changed(record) => frame("job", &serde_json::to_value(record).unwrap_or_default()),
        JobChange::Gone(id) => frame("gone", &json!({ "id": id })),
    }
}

fn encode(tick: &Tick, lifetime: Duration) -> bytes::Bytes {
    match tick {
        Tick::Job(change) => encode_change(change),
        Tick::Skills => frame("skills", &json!({})),
        Tick::Heartbeat => bytes::Bytes::from_static(b": keep-alive\n\n"),
        Tick::End => frame("reauth", &json!({ "afterSecs": lifetime.as_secs() })),
    }
}

/// How long one stream lives (see the module docs).
pub fn lifetime(token_ttl: Duration) -> Duration {
    token_ttl.max(STREAM_LIFETIME_MIN)
}

pub async fn events(State(console): State<Console>, Path(namespace): Path<String>, Extension(caller): Extension<Caller>) -> Response {
    let ns = match authorized(&console, &namespace, &caller, Action::ReadJobs).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    let Ok(permit) = console.streams.clone().try_acquire_owned() else {
        let mut response = json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "streams-full",
            format!("this gateway already serves {STREAMS_MAX} console event streams; the page retries, or close other console tabs"),
        );
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return response;
    };
    let lifetime = lifetime(console.auth.config().token_ttl);
    let jobs: BoxStream<'static, Tick> = match console.directory.job_changes(&namespace, &caller) {
        Some(changes) => changes.map(Tick::Job).boxed(),
        None => stream::pending().boxed(),
    };
    let skills = stream::unfold(ns.state.snapshots.subscribe(), |mut changes| async move {
        changes.changed().await.ok()?;
        Some((Tick::Skills, changes))
    });
    let heartbeat = stream::unfold((), |()| async {
        tokio::time::sleep(STREAM_HEARTBEAT).await;
        Some((Tick::Heartbeat, ()))
    });
    let end = stream::once(tokio::time::sleep(lifetime)).map(|()| Tick::End);
    let ticks = stream::select(stream::select(jobs, skills), stream::select(heartbeat, end));
    let hello = stream::once(async move { frame("hello", &json!({ "namespace": namespace, "lifetimeSecs": lifetime.as_secs() })) });
    let body = hello
        .chain(
            ticks
                .scan(false, |ended, tick| {
                    let next = if *ended { None } else { Some(tick) };
                    if matches!(next, Some(Tick::End)) {
                        *ended = true;
                    }
                    futures::future::ready(next)
                })
                .map(move |tick| {
                    // The permit lives as long as the stream does.
                    let _held = &permit;
                    encode(&tick, lifetime)
                }),
        )
        .map(Ok::<_, std::convert::Infallible>);
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (header::HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no")),
    ];
    (headers, Body::from_stream(body)).into_response()
}
