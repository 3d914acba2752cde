//! Every bound of the proxy, in one place, and the proxy's configuration.
//!
//! Each field of [`Limits`] has a `DEFAULT_*` constant and a name; a
//! refusal or a cut tunnel names the bound that fired (`idle_timeout =
//! 120 s`), so a script author can tell a limit from a fault.

use std::time::Duration;

use ipnet::IpNet;

/// Request head bytes (request line and headers) read before 431.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Header lines in a request head.
pub const DEFAULT_MAX_HEADERS: usize = 64;
/// Time for the whole request head to arrive (slowloris bound).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for a name to resolve.
pub const DEFAULT_RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to connect upstream, over all of a name's addresses.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for the ClientHello to arrive after `200 Connection Established`.
pub const DEFAULT_CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// ClientHello size (handshake message) read before refusing.
pub const DEFAULT_MAX_CLIENT_HELLO_BYTES: usize = 16 * 1024;
/// Upstream response head size (plain HTTP) before the request fails.
pub const DEFAULT_MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// A tunnel with no byte in either direction for this long is cut.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A tunnel is cut after this long, busy or not (runs last 300 s at most).
pub const DEFAULT_TUNNEL_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// Tunnels open at once, all jobs together.
pub const DEFAULT_MAX_TUNNELS: usize = 4096;
/// Connections still sending their request head (or waiting for their
/// run's record, see [`super::RECORD_GRACE`]), all jobs together.
pub const DEFAULT_MAX_PENDING: usize = 1024;
/// Connections from one client address still sending their request head
/// or waiting for their run's record (one pod cannot take all of `max_pending`).
pub const DEFAULT_MAX_PENDING_PER_ADDRESS: usize = 64;
/// Tunnels one job may hold at once.
pub const DEFAULT_JOB_MAX_CONNECTIONS: u32 = 64;
/// Bytes one job may send upstream over its life.
pub const DEFAULT_JOB_MAX_BYTES_UP: u64 = 1 << 30;
/// Bytes one job may receive over its life.
pub const DEFAULT_JOB_MAX_BYTES_DOWN: u64 = 4 << 30;
/// After shutdown: time open tunnels get to finish before they are cut.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Addresses of one name that are checked and tried.
pub const MAX_ADDRESSES: usize = 32;
/// Buffer one direction of a tunnel uses while bytes flow (freed when idle).
pub const SPLICE_BUFFER_BYTES: usize = 64 * 1024;
/// Bytes a direction copies before it moves the rest with splice(2)
/// (its pipe is made then, so short exchanges and idle tunnels hold none).
pub const ZERO_COPY_AFTER_BYTES: u64 = 64 * 1024;
/// Pipe size asked for a spliced direction: the most one splice call moves.
/// 1 MiB is the kernel's default `pipe-max-size` for unprivileged callers;
/// it took a third less proxy CPU per GiB than 256 KiB (0.21 s vs 0.33 s)
/// and half of 64 KiB. The pipe holds page references between a fill and
/// its send only, never a copy of the bytes.
pub const ZERO_COPY_PIPE_BYTES: usize = 1 << 20;

/// The bounds. `Default` is the production value of each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub header_timeout: Duration,
    pub resolve_timeout: Duration,
    pub connect_timeout: Duration,
    pub client_hello_timeout: Duration,
    pub max_client_hello_bytes: usize,
    pub max_response_head_bytes: usize,
    pub idle_timeout: Duration,
    pub tunnel_lifetime: Duration,
    pub max_tunnels: usize,
    pub max_pending: usize,
    pub max_pending_per_address: usize,
    pub shutdown_grace: Duration,
    /// Per-job defaults; a registry entry may set its own.
    pub job: JobLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            resolve_timeout: DEFAULT_RESOLVE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            client_hello_timeout: DEFAULT_CLIENT_HELLO_TIMEOUT,
            max_client_hello_bytes: DEFAULT_MAX_CLIENT_HELLO_BYTES,
            max_response_head_bytes: DEFAULT_MAX_RESPONSE_HEAD_BYTES,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            tunnel_lifetime: DEFAULT_TUNNEL_LIFETIME,
            max_tunnels: DEFAULT_MAX_TUNNELS,
            max_pending: DEFAULT_MAX_PENDING,
            max_pending_per_address: DEFAULT_MAX_PENDING_PER_ADDRESS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            job: JobLimits::default(),
        }
    }
}

/// Per-job budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobLimits {
    /// Tunnels (and forwarded requests) open at once.
    pub max_connections: u32,
    /// Bytes sent upstream, all tunnels of the job together, over its life.
    pub max_bytes_up: u64,
    /// Bytes received from upstream, likewise.
    pub max_bytes_down: u64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            max_connections: DEFAULT_JOB_MAX_CONNECTIONS,
            max_bytes_up: DEFAULT_JOB_MAX_BYTES_UP,
            max_bytes_down: DEFAULT_JOB_MAX_BYTES_DOWN,
        }
    }
}

/// Budget overrides a registry entry may carry; unset fields take
/// [`Limits::job`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes_up: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes_down: Option<u64>,
}

impl JobBudget {
    pub fn resolve(&self, defaults: &JobLimits) -> JobLimits {
        JobLimits {
            max_connections: self.max_connections.unwrap_or(defaults.max_connections),
            max_bytes_up: self.max_bytes_up.unwrap_or(defaults.max_bytes_up),
            max_bytes_down: self.max_bytes_down.unwrap_or(defaults.max_bytes_down),
        }
    }
}

/// How the proxy is set up (the `egress-proxy` flags map onto this).
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The operator's token key (`--token-key-file`, the one artifact
    /// tokens derive from; proxy credentials use a key derived from it).
    pub operator_key: Vec<u8>,
    pub limits: Limits,
    /// Never dialed: the cluster's pod and service CIDRs, anything else
    /// internal that the built-in classes do not cover.
    pub deny_cidrs: Vec<IpNet>,
    /// Dialed even though a built-in class would refuse them: for tests and
    /// for admins who must reach an internal host on purpose. Loopback is
    /// refused unless listed here.
    pub allow_cidrs: Vec<IpNet>,
    /// CONNECT ports where the stream must be TLS (with a matching SNI).
    /// On other ports a stream that starts like TLS is checked the same way.
    pub tls_ports: Vec<u16>,
    /// Move bulk bytes with splice(2), socket → pipe → socket, so they never
    /// enter user space (Linux; falls back to copying where splice fails).
    /// Off: every byte is copied (`--no-zero-copy`, for comparison).
    pub zero_copy: bool,
    /// One `egress` audit record per connection once it ends (off by default).
    pub audit: crate::audit::Audit,
}

/// The port TLS is required on unless configured otherwise.
pub const DEFAULT_TLS_PORTS: &[u16] = &[443];
/// The shortest operator key accepted.
pub const MIN_KEY_BYTES: usize = 32;

impl ProxyConfig {
    pub fn new(operator_key: Vec<u8>) -> ProxyConfig {
        ProxyConfig {
            operator_key,
            limits: Limits::default(),
            deny_cidrs: Vec::new(),
            allow_cidrs: Vec::new(),
            tls_ports: DEFAULT_TLS_PORTS.to_vec(),
            zero_copy: true,
            audit: crate::audit::Audit::off(),
        }
    }
}

/// A duration as a refusal prints it.
pub(crate) fn show(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}
