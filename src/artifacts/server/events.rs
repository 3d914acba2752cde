//! `GET /v1/outputs/stored`: the operator hears of each job's stored
//! outputs the moment they are stored.
//!
//! The controller records a run's verdict from its stored result; without
//! this it would learn of the upload only when the kubelet reported the run
//! container's end, a relist (up to a second) later. One stream serves
//! every job: a long poll per running job would hold a connection each.
//!
//! Newline-delimited JSON, one [`OutputsStored`] per line, and an empty
//! line every [`KEEPALIVE`] so a dead peer is noticed. Best effort by
//! design: events while no one listens, or beyond what a slow reader
//! buffers ([`BACKLOG`]), are dropped (a `{"lagged":N}` line says so), and
//! the controller's slower path (the pod's reported end) still decides
//! those runs. The stream ends when the endpoint shuts down.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast::error::RecvError;

use super::auth::{authenticate, Caller};
use super::{ApiError, AppState};
use crate::artifacts::{ErrorCode, OutputsStored};

/// How often an idle stream carries an empty line.
pub(super) const KEEPALIVE: Duration = Duration::from_secs(15);
/// Events a slow reader may fall behind by before it misses some.
pub(super) const BACKLOG: usize = 1024;

pub(super) async fn stored_outputs(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    match authenticate(&state, &headers, "", "").await? {
        Caller::Operator => {}
        Caller::Job => return Err(ApiError::new(ErrorCode::Forbidden, "only the operator follows stored outputs")),
    }
    let rx = state.0.stored.subscribe();
    let stop = state.0.stop.clone();
    let lines = futures::stream::unfold((rx, stop), |(mut rx, stop)| async move {
        let line = tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            event = rx.recv() => match event {
                Ok(stored) => serde_json::to_vec(&stored).ok().map(|mut v| { v.push(b'\n'); v }).unwrap_or_default(),
                Err(RecvError::Lagged(n)) => format!("{{\"lagged\":{n}}}\n").into_bytes(),
                Err(RecvError::Closed) => return None,
            },
            _ = tokio::time::sleep(KEEPALIVE) => b"\n".to_vec(),
        };
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), (rx, stop)))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-store")], Body::from_stream(lines)).into_response())
}

/// Tell every follower that a job's outputs are stored.
pub(super) fn announce(state: &AppState, namespace: &str, uid: &str) {
    // No follower is not an error: the controller may be restarting.
    let _ = state.0.stored.send(OutputsStored { namespace: namespace.to_string(), uid: uid.to_string() });
}
