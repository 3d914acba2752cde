//! The proxy's listeners: TCP (jobs identified by credential and source
//! address) and unix sockets (one per standalone run, the socket is the
//! identity), their accept loops, the global caps and shutdown.
//!
//! Shutdown (mini-redis style): the accept loop stops, every connection
//! task holds a clone of one `mpsc::Sender` and the loop waits until the
//! last is dropped, for at most `shutdown_grace`; tunnels still open then
//! are cut (`shutting_down`).

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::addr::AddressPolicy;
use super::config::{ProxyConfig, MIN_KEY_BYTES};
use super::identity::{self, JobId};
use super::io::Socket;
use super::metrics::{ProxyMetrics, Verdict};
use super::proxy::{self, Origin};
use super::refusal::{Reason, Refusal};
use super::registry::JobRegistry;
use super::resolve::Resolver;
use super::shared::{Pending, Shared};
use crate::listener::PerAddress;

/// Why the proxy could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("the operator key is {0} bytes; use at least {MIN_KEY_BYTES} random bytes (the controller's --token-key-file)")]
    KeyTooShort(usize),
    #[error("limits: {0} must be at least 1")]
    ZeroLimit(&'static str),
}

/// The egress proxy. Cheap to clone; serve any number of listeners.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

impl Proxy {
    /// Build a proxy reading jobs from `registry` and names from `resolver`.
    pub fn new(config: ProxyConfig, registry: Arc<dyn JobRegistry>, resolver: Arc<dyn Resolver>) -> Result<Proxy, ProxyError> {
        if config.operator_key.len() < MIN_KEY_BYTES {
            return Err(ProxyError::KeyTooShort(config.operator_key.len()));
        }
        let l = &config.limits;
        for (name, value) in [
            ("max_header_bytes", l.max_header_bytes),
            ("max_headers", l.max_headers),
            ("max_tunnels", l.max_tunnels),
            ("max_pending", l.max_pending),
            ("max_pending_per_address", l.max_pending_per_address),
            ("max_client_hello_bytes", l.max_client_hello_bytes),
            ("max_response_head_bytes", l.max_response_head_bytes),
        ] {
            if value == 0 {
                return Err(ProxyError::ZeroLimit(name));
            }
        }
        let shared = Shared {
            tunnels: Arc::new(Semaphore::new(l.max_tunnels)),
            pending: Arc::new(Semaphore::new(l.max_pending)),
            pending_per_address: Arc::new(PerAddress::new(l.max_pending_per_address)),
            limits: config.limits.clone(),
            tls_ports: config.tls_ports.clone(),
            zero_copy: config.zero_copy,
            proxy_key: identity::proxy_key(&config.operator_key),
            registry,
            resolver,
            policy: AddressPolicy::new(config.deny_cidrs.clone(), config.allow_cidrs.clone()),
            metrics: ProxyMetrics::default(),
            audit: config.audit.clone(),
            own: RwLock::new(Vec::new()),
            outbound: Mutex::new(HashSet::new()),
        };
        Ok(Proxy { shared: Arc::new(shared) })
    }

    /// The proxy's counters (register them with [`ProxyMetrics::register`]).
    pub fn metrics(&self) -> &ProxyMetrics {
        &self.shared.metrics
    }

    /// Serve TCP clients until `shutdown` resolves (then drain, see the module docs).
    pub async fn serve_tcp(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let local = listener.local_addr()?;
        self.shared.own.write().unwrap_or_else(|p| p.into_inner()).push(local);
        let result = self
            .accept_loop(
                || {
                    let listener = &listener;
                    async move {
                        let (stream, peer) = listener.accept().await?;
                        let _ = stream.set_nodelay(true);
                        let local = stream.local_addr()?;
                        Ok((stream, Origin::Tcp { peer, local }))
                    }
                },
                shutdown,
            )
            .await;
        self.shared.own.write().unwrap_or_else(|p| p.into_inner()).retain(|a| *a != local);
        result
    }

    /// Serve one job on a unix socket until `shutdown`: every connection
    /// is `job`, no credential needed (the socket's file permissions and
    /// where it is bound decide who can connect).
    pub async fn serve_unix(&self, listener: UnixListener, job: JobId, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        self.accept_loop(
            || {
                let (listener, job) = (&listener, job.clone());
                async move {
                    let (stream, _) = listener.accept().await?;
                    Ok((stream, Origin::Unix(job)))
                }
            },
            shutdown,
        )
        .await
    }

    async fn accept_loop<S, F, Fut>(&self, mut accept: F, shutdown: impl Future<Output = ()>) -> io::Result<()>
    where
        S: Socket,
        F: FnMut() -> Fut,
        Fut: Future<Output = io::Result<(S, Origin)>>,
    {
        let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
        let cancel = CancellationToken::new();
        let mut backoff = Duration::from_millis(5);
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                r = accept() => r,
            };
            let (stream, origin) = match accepted {
                Ok(pair) => {
                    backoff = Duration::from_millis(5);
                    pair
                }
                Err(e) => {
                    // EMFILE and friends: wait and retry rather than spin or die.
                    tracing::warn!(target: "skill_operator::egress", error = %e, "accept failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let slot = match &origin {
                Origin::Tcp { peer, .. } => match self.shared.pending_per_address.try_acquire(peer.ip()) {
                    Some(slot) => Some(slot),
                    None => {
                        let refusal = Refusal::new(
                            Reason::AddressBusy,
                            format!(
                                "max_pending_per_address = {} connections from {} are sending their request head or waiting for their run's record; finish those first",
                                self.shared.limits.max_pending_per_address,
                                peer.ip()
                            ),
                        );
                        let _ = stream.try_write(&refusal.response());
                        self.shared.metrics.count(Verdict::Refused, Reason::AddressBusy.as_str());
                        proxy::audit_busy(&self.shared, &refusal, &origin);
                        continue;
                    }
                },
                Origin::Unix(_) => None,
            };
            let Ok(permit) = self.shared.pending.clone().try_acquire_owned() else {
                let refusal = Refusal::new(
                    Reason::ProxyBusy,
                    format!(
                        "max_pending = {} connections are sending their request head or waiting for their run's record; retry later",
                        self.shared.limits.max_pending
                    ),
                );
                let _ = stream.try_write(&refusal.response());
                self.shared.metrics.count(Verdict::Refused, Reason::ProxyBusy.as_str());
                proxy::audit_busy(&self.shared, &refusal, &origin);
                continue;
            };
            let pending = Pending { _permit: permit, _slot: slot };
            let shared = self.shared.clone();
            let done = done_tx.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                proxy::handle(shared, stream, origin, Instant::now(), pending, cancel).await;
                drop(done);
            });
        }
        drop(done_tx);
        if tokio::time::timeout(self.shared.limits.shutdown_grace, done_rx.recv()).await.is_err() {
            cancel.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), done_rx.recv()).await;
        }
        Ok(())
    }
}
