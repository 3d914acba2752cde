//! A bounded session store for the HTTP endpoint (2025-11-25 and older
//! clients, which keep a session per `initialize`): rmcp's
//! [`LocalSessionManager`] behind a cap.
//!
//! Each session costs a server handler, a worker task and its queues
//! (about 57 KiB measured). Without a cap, 10,000 `initialize` calls kept
//! 10,000 sessions for their 300 s idle timeout. With it, a new session
//! past the cap first closes the oldest idle one (no request or stream
//! open on it); when every session is busy, the new one is refused with a
//! message that says so, and the client can retry or close one it holds.
//! Per session, memory is bounded by rmcp's per-stream queue
//! ([`HTTP_SESSION_QUEUE`] messages, also the resume cache of a stream),
//! and the session is closed after [`HTTP_SESSION_IDLE`] without a
//! request.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage, SessionId, SessionManager};

use crate::core::limits::{HTTP_SESSION_IDLE, HTTP_SESSION_QUEUE};

/// Why a session call failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(
        "this server holds its maximum of {max} MCP sessions and every one is in use; retry later, or close a session you hold (HTTP DELETE with its Mcp-Session-Id)"
    )]
    Full { max: usize },
    #[error(transparent)]
    Inner(#[from] LocalSessionManagerError),
}

#[derive(Debug)]
struct Meta {
    last_used: Instant,
    /// Requests and streams open on the session now.
    active: usize,
    /// The principal whose `initialize` opened it ([`BoundedSessions::bind_owner`]).
    owner: Option<String>,
}

/// Sessions, at most `max` of them.
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
    meta: Arc<Mutex<HashMap<SessionId, Meta>>>,
}

impl BoundedSessions {
    pub fn new(max: usize) -> BoundedSessions {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(HTTP_SESSION_IDLE);
        inner.session_config.channel_capacity = HTTP_SESSION_QUEUE;
        BoundedSessions { inner, max: max.max(1), meta: Arc::default() }
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Sessions held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a new session would be refused now (full, none idle).
    pub fn is_full(&self) -> bool {
        let meta = self.lock();
        meta.len() >= self.max && meta.values().all(|m| m.active > 0)
    }

    /// The session `id` (just opened) belongs to `principal`: every later
    /// request on it must come from them ([`BoundedSessions::is_owner`]).
    pub fn bind_owner(&self, id: &str, principal: &str) {
        if let Some(m) = self.lock().get_mut(id) {
            m.owner = Some(principal.to_string());
        }
    }

    /// Whether `id` is a session `principal` opened. A session of another
    /// principal (its id leaked), an unknown one, and one no principal was
    /// bound to are all `false`: to anyone else a session does not exist.
    pub fn is_owner(&self, id: &str, principal: &str) -> bool {
        self.lock().get(id).and_then(|m| m.owner.as_deref()) == Some(principal)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Meta>> {
        self.meta.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn touch(&self, id: &SessionId) {
        if let Some(m) = self.lock().get_mut(id) {
            m.last_used = Instant::now();
        }
    }

    /// Mark one request or stream open on `id` until the guard drops.
    fn open(&self, id: &SessionId) -> ActiveGuard {
        if let Some(m) = self.lock().get_mut(id) {
            m.active += 1;
            m.last_used = Instant::now();
        }
        ActiveGuard { id: id.clone(), meta: self.meta.clone() }
    }
}

struct ActiveGuard {
    id: SessionId,
    meta: Arc<Mutex<HashMap<SessionId, Meta>>>,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if let Some(m) = self.meta.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&self.id) {
            m.active = m.active.saturating_sub(1);
            m.last_used = Instant::now();
        }
    }
}

/// A stream that keeps its session marked in use while it is open.
struct Tracked<S> {
    inner: Pin<Box<S>>,
    _guard: ActiveGuard,
}

impl<S: Stream> Stream for Tracked<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl SessionManager for BoundedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let victim = {
            let mut meta = self.lock();
            if meta.len() >= self.max {
                let oldest = meta.iter().filter(|(_, m)| m.active == 0).min_by_key(|(_, m)| m.last_used).map(|(id, _)| id.clone());
                match oldest {
                    Some(id) => {
                        meta.remove(&id);
                        Some(id)
                    }
                    None => return Err(SessionsError::Full { max: self.max }),
                }
            } else {
                None
            }
        };
        if let Some(id) = victim {
            tracing::info!(session = %id, max = self.max, "session cap reached: closing the oldest idle session");
            self.inner.close_session(&id).await?;
        }
        let (id, transport) = self.inner.create_session().await?;
        self.lock().insert(id.clone(), Meta { last_used: Instant::now(), active: 0, owner: None });
        Ok((id, transport))
    }

    async fn initialize_session(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<ServerJsonRpcMessage, Self::Error> {
        let _open = self.open(id);
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.lock().remove(id);
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let guard = self.open(id);
        let stream = self.inner.create_stream(id, message).await?;
        Ok(Tracked { inner: Box::pin(stream), _guard: guard })
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        self.touch(id);
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let guard = self.open(id);
        let stream = self.inner.create_standalone_stream(id).await?;
        Ok(Tracked { inner: Box::pin(stream), _guard: guard })
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let guard = self.open(id);
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(Tracked { inner: Box::pin(stream), _guard: guard })
    }

    async fn restore_session(&self, _id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // Sessions live in this process only: one that is gone is gone.
        Ok(RestoreOutcome::NotSupported)
    }
}
