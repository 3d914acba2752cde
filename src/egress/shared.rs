//! What every connection task of the proxy shares: its configuration,
//! registry and resolver, the tunnel and head-reading budgets, and the
//! proxy's own addresses and open upstream connections (to refuse loops).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::addr::AddressPolicy;
use super::config::Limits;
use super::metrics::ProxyMetrics;
use super::registry::JobRegistry;
use super::resolve::Resolver;
use crate::listener::{AddressSlot, PerAddress};

/// A connection's place among those still sending their request head:
/// released (dropped) once the head is read and its job is known (a
/// request may wait for its run's record meanwhile).
pub(crate) struct Pending {
    pub(super) _permit: OwnedSemaphorePermit,
    pub(super) _slot: Option<AddressSlot>,
}

/// State every connection task shares.
pub(crate) struct Shared {
    pub limits: Limits,
    pub tls_ports: Vec<u16>,
    pub zero_copy: bool,
    pub proxy_key: Vec<u8>,
    pub registry: Arc<dyn JobRegistry>,
    pub resolver: Arc<dyn Resolver>,
    pub policy: AddressPolicy,
    pub metrics: ProxyMetrics,
    pub audit: crate::audit::Audit,
    pub tunnels: Arc<Semaphore>,
    pub(super) pending: Arc<Semaphore>,
    /// The same count the HTTP listeners keep ([`crate::listener::PerAddress`]), for connections still sending their head.
    pub(super) pending_per_address: Arc<PerAddress>,
    /// The TCP listen sockets (never dialed).
    pub(super) own: RwLock<Vec<SocketAddr>>,
    /// Open upstream connections as (local, remote): a connection accepted
    /// with peer = local and our address = remote is one of them come
    /// back (a loop through some address that leads to the proxy). The
    /// whole pair is the key: the kernel reuses a local port for
    /// connections to different remotes.
    pub(super) outbound: Mutex<HashSet<(SocketAddr, SocketAddr)>>,
}

impl Shared {
    pub(super) fn own_addresses(&self) -> Vec<SocketAddr> {
        self.own.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn is_outbound(&self, peer: SocketAddr, local: SocketAddr) -> bool {
        self.outbound.lock().unwrap_or_else(|p| p.into_inner()).contains(&(peer, local))
    }

    pub(super) fn track_outbound<'a>(&'a self, upstream: &TcpStream) -> OutboundGuard<'a> {
        let pair = upstream.local_addr().ok().zip(upstream.peer_addr().ok());
        if let Some(pair) = pair {
            self.outbound.lock().unwrap_or_else(|p| p.into_inner()).insert(pair);
        }
        OutboundGuard { shared: self, pair }
    }
}

pub(crate) struct OutboundGuard<'a> {
    shared: &'a Shared,
    pair: Option<(SocketAddr, SocketAddr)>,
}

impl Drop for OutboundGuard<'_> {
    fn drop(&mut self) {
        if let Some(pair) = self.pair {
            self.shared.outbound.lock().unwrap_or_else(|p| p.into_inner()).remove(&pair);
        }
    }
}
