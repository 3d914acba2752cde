//! One shutdown value for every task of the process.
//!
//! `main` makes it once ([`Shutdown::on_signals`]), before anything else
//! runs, so a SIGTERM never meets the default action (which would kill an
//! upload sidecar before it has uploaded, or a launcher before it has
//! stopped its script). Every task gets a clone and either waits for it
//! ([`Shutdown::wait`]) or hands its token to a library that takes one
//! (rmcp, axum's graceful shutdown, kube's controllers).

use std::io;

use tokio_util::sync::CancellationToken;

/// A shared "stop now" flag that can be awaited.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    /// A shutdown nothing triggers but [`Shutdown::trigger`] (tests, embedding).
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// A shutdown triggered by the first SIGTERM or SIGINT. The handlers are
    /// installed before this returns. Needs a tokio runtime.
    pub fn on_signals() -> io::Result<Shutdown> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = Shutdown::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            }
            trigger.trigger();
        });
        Ok(shutdown)
    }

    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown is triggered (at once if it already was).
    pub async fn wait(&self) {
        self.token.cancelled().await
    }

    /// An owned future for APIs that want `'static` (axum, kube).
    pub fn wait_owned(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        self.token.clone().cancelled_owned()
    }

    /// The token, for libraries that take one (rmcp's HTTP service).
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}
