//! The host-allowlisting egress proxy (`skill-operator egress-proxy`, and
//! in-process for the standalone server).
//!
//! A NetworkPolicy matches pods and IP blocks, never host names, so a job
//! whose skill needs `api.example.com` reaches the internet only through
//! this proxy: HTTP CONNECT tunnels and plain-HTTP forwarding, each
//! request checked against that job's allowlist. No TLS is terminated,
//! ever; the ClientHello is only read.
//!
//! Layout (one job per module):
//! - [`allowlist`]: entries (exact, `*.suffix`, IP), port lists, matching,
//!   narrowing ([`allowlist::effective`]).
//! - [`host`]: the requested host, refusing IP literals in every notation.
//! - [`addr`]: the address policy applied after resolution.
//! - [`resolve`]: the resolver trait and the system resolver.
//! - [`tls`]: the bounded ClientHello reader (SNI, ECH).
//! - [`identity`]: job credentials; [`registry`]: jobs, sources, budgets.
//! - [`config`]: every bound in one place; [`refusal`]: reason codes.
//! - `head`, `splice`, `proxy`, `server`: request heads, byte moving,
//!   the per-request sequence, the listeners; `zerocopy`: splice(2)
//!   through a pipe for bulk bytes.
//! - [`cluster`]: in the cluster, the jobs are the SkillJobs the controller
//!   sealed (watched; the pod address and allowlist from their status).
//! - [`forward`]: the TCP → unix-socket relay for a sandbox.
//! - [`metrics`]; `command`: the `egress-proxy` subcommand.
//!
//! One request, in order (`proxy.rs`):
//! 1. read the head: ≤ `max_header_bytes`, within `header_timeout` of the
//!    accept (slowloris), at most `max_pending` connections in this phase;
//! 2. identify the job: on TCP, `Proxy-Authorization: Basic
//!    base64(job:<token>)` whose HMAC must verify *and* whose connection
//!    must come from the job's registered pod address; on a unix socket,
//!    the socket is the job;
//! 3. parse the target (CONNECT authority or `http://` URI) and match
//!    host and port against the job's allowlist (empty: nothing);
//! 4. budgets: the job's tunnel count and byte budgets, the global tunnel cap;
//! 5. resolve once; refuse if any address is not public (or is a deny
//!    CIDR, or the proxy itself); dial only those checked addresses,
//!    within `connect_timeout`;
//! 6. CONNECT: `200`, then the ClientHello's SNI must be the CONNECT host
//!    (ECH: the outer SNI must), required TLS on `tls_ports`; plain HTTP:
//!    the head is rewritten (origin-form, `Host` from the URI, no proxy or
//!    hop-by-hop headers, `Connection: close`);
//! 7. splice under the byte budgets, `idle_timeout` and `tunnel_lifetime`;
//! 8. one access-log line (`tracing`, target `skill_operator::egress`) and
//!    a per-verdict counter.
//!
//! Bypasses closed, each with a test in `tests/egress.rs`: other hosts and
//! ports; IP literals (decimal, octal, hex, short, trailing-dot, IDNA-mapped
//! digits, zones, mapped IPv6); names resolving to loopback, private,
//! CGNAT, link-local/metadata, ULA, embedded-IPv4 IPv6 addresses; DNS
//! rebinding (resolution per request, the dial uses the checked address);
//! domain fronting by SNI and by ECH outer name; plain-HTTP `Host`
//! fronting; a token used from another pod; the proxy dialing itself.
//!
//! Not closed here: DNS-over-HTTPS or any
//! tunnel *through* an allowed host (the allowed host decides what it
//! relays); what an ECH inner name names behind an allowed provider.

pub mod addr;
pub mod allowlist;
pub mod cluster;
mod command;
pub mod config;
pub mod forward;
mod head;
pub mod host;
pub mod identity;
mod io;
pub mod metrics;
mod proxy;
pub mod refusal;
pub mod registry;
pub mod resolve;
mod server;
mod shared;
mod splice;
pub mod tls;
mod zerocopy;

pub use allowlist::{effective, Allowlist, Effective, Entry};
pub use command::{metrics_registry, run, serve_metrics, CommandError, ProxyArgs};
pub use config::{JobBudget, JobLimits, Limits, ProxyConfig};
pub use identity::{proxy_env, proxy_token, proxy_url, JobId, PROXY_URL_ENV};
pub use metrics::{ProxyMetrics, Verdict};
pub use proxy::RECORD_GRACE;
pub use refusal::{Reason, Refusal};
pub use registry::{JobEntry, JobRegistry, JobSpec, MemoryRegistry};
pub use resolve::{Resolver, SystemResolver};
pub use server::{Proxy, ProxyError};
