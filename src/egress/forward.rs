//! A TCP → unix-socket relay for a sandbox whose network namespace has
//! only its own loopback.
//!
//! Inside the sandbox the script sees `HTTPS_PROXY=http://127.0.0.1:<port>`;
//! this relay listens there and hands every connection, byte for byte, to
//! the proxy's unix socket, which is bound into the sandbox from outside.
//! The relay decides nothing: the proxy on the other end identifies the
//! run by the socket and enforces everything. It is bounded only so that a
//! script cannot exhaust the sandbox's file descriptors through it.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixStream};
use tokio::sync::Semaphore;

/// Relayed connections open at once.
pub const MAX_FORWARD_CONNECTIONS: usize = 256;

/// Bind `listen` (normally `127.0.0.1:<port>`) and relay to `socket` until `shutdown`.
pub async fn forward_on(listen: SocketAddr, socket: PathBuf, shutdown: impl Future<Output = ()>) -> io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    forward(listener, socket, shutdown).await
}

/// Relay every connection accepted on `listener` to the unix socket `socket`.
pub async fn forward(listener: TcpListener, socket: PathBuf, shutdown: impl Future<Output = ()>) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_FORWARD_CONNECTIONS));
    let socket = Arc::new(socket);
    tokio::pin!(shutdown);
    loop {
        let (mut tcp, _) = tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(()),
            r = listener.accept() => match r {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(target: "skill_operator::egress", error = %e, "forwarder accept failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue; // dropped: the client sees a closed connection
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            match UnixStream::connect(socket.as_path()).await {
                Ok(mut unix) => {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
                Err(e) => {
                    tracing::warn!(target: "skill_operator::egress", socket = %socket.display(), error = %e, "cannot reach the egress proxy socket")
                }
            }
            drop(permit);
        });
    }
}
