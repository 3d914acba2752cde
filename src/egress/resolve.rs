//! Name resolution, behind a trait so tests can answer (and change their
//! answer between calls: the DNS-rebinding test).
//!
//! The proxy resolves once per request, checks every address, and dials
//! only addresses it checked: it never hands a name to the kernel or to a
//! library that would resolve again. Nothing is cached, so a name that
//! re-points between two requests is checked afresh on the second.
//!
//! [`SystemResolver`] is tokio's `lookup_host` (getaddrinfo on the blocking
//! pool): it honours `/etc/hosts` and `resolv.conf` like every other
//! program in the pod, needs no extra dependency, and has no cache of its
//! own whose TTL handling would need auditing. The call is bounded by
//! `resolve_timeout` in the proxy.

use std::io;
use std::net::IpAddr;

use futures::future::BoxFuture;

/// Resolve a host name to addresses.
pub trait Resolver: Send + Sync + 'static {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The system resolver.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let mut out: Vec<IpAddr> = Vec::new();
            for addr in tokio::net::lookup_host((host, 0)).await? {
                if !out.contains(&addr.ip()) {
                    out.push(addr.ip());
                }
            }
            Ok(out)
        })
    }
}
