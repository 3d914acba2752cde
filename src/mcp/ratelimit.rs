//! Token buckets per principal: one for every `tools/call` (`calls`), one
//! for every run a call actually starts (`runs`). A server (a `serve`
//! process, or one gateway namespace) holds one [`RateLimiter`] in its
//! [`super::state::ServerState`], so the gateway limits namespace ×
//! principal and `serve` limits per principal. Buckets live in this
//! process: a gateway with N replicas allows up to N times the figures.
//! A server's figures may change while it runs ([`LimiterSlot::set`]: a
//! gateway namespace's annotation), and a server whose figures cannot be
//! known refuses every call ([`Policy::Closed`], fail closed).
//!
//! Memory stays bounded under many principals: at most
//! [`RATE_PRINCIPALS_MAX`] buckets are tracked (a few more while calls race
//! on the last free places), buckets that have refilled are swept every
//! [`RATE_SWEEP_EVERY`] checks and whenever the cap is reached, and a new
//! principal that finds the cap reached after a sweep is refused with the
//! same answer as one over its limit (fail closed: a flood of principals
//! cannot buy a fresh budget by crowding out the others' buckets).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use governor::clock::{Clock, DefaultClock};
use governor::nanos::Nanos;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::state::StateStore;
use governor::Quota;
use rmcp::model::ErrorCode;
use rmcp::ErrorData as McpError;
use serde_json::json;

use crate::core::limits::{count_text, RATE_CLOSED_RETRY, RATE_PRINCIPALS_MAX, RATE_SWEEP_EVERY};

/// The JSON-RPC error code of a refusal: in the application range (JSON-RPC
/// reserves -32768..-32000 only for its own -32700 and -32600..-32603 and
/// for server errors; MCP uses -32002 and -32042), chosen to read as 429.
pub const RATE_LIMITED: ErrorCode = ErrorCode(-32029);

/// The rate limits, as flags (`serve` and `gateway` take the same ones)
/// and as the configuration a [`RateLimiter`] is made from. 0 is unlimited,
/// the default: a server started without these flags limits nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct RateLimits {
    /// Tool calls per minute per principal (0: unlimited). Over it a call is answered
    /// JSON-RPC error -32029 with data.retryAfterSeconds.
    #[arg(long = "rate-calls-per-minute", value_name = "N", default_value_t = 0)]
    pub calls_per_minute: u32,
    /// Runs (confirmed skill_run or skill_job_run calls) per minute per principal (0: unlimited).
    #[arg(long = "rate-runs-per-minute", value_name = "N", default_value_t = 0)]
    pub runs_per_minute: u32,
    /// Tool calls a principal may make at once before the per-minute pace applies
    /// (0: a whole minute's worth).
    #[arg(long = "rate-burst-calls", value_name = "N", default_value_t = 0)]
    pub burst_calls: u32,
    /// Runs a principal may start at once before the per-minute pace applies (0: a whole minute's worth).
    #[arg(long = "rate-burst-runs", value_name = "N", default_value_t = 0)]
    pub burst_runs: u32,
}

/// What a server limits by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// These figures per principal.
    Limits(RateLimits),
    /// Nothing passes: the figures could not be known (the reason says why
    /// and what to do), and this server is set to fail closed.
    Closed(String),
}

impl From<RateLimits> for Policy {
    fn from(limits: RateLimits) -> Self {
        Policy::Limits(limits)
    }
}

/// Which bucket refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Calls,
    Runs,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Calls => "calls",
            Limit::Runs => "runs",
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused call: nothing was run or created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Limited {
    #[error("rate limited: retry after {retry_after_secs} s; the limit is {per_minute} {limit} per minute for principal {principal}")]
    Exhausted { limit: Limit, principal: String, per_minute: u32, retry_after_secs: u64 },
    #[error(
        "rate limited: this server tracks {} principals at once and is full; retry after {retry_after_secs} s \
         (the limit is {per_minute} {limit} per minute for principal {principal})",
        count_text(RATE_PRINCIPALS_MAX)
    )]
    TooManyPrincipals { limit: Limit, principal: String, per_minute: u32, retry_after_secs: u64 },
    #[error("rate limits unknown, so nothing is allowed (fail closed): {reason}; retry after {retry_after_secs} s")]
    Unknown { limit: Limit, principal: String, reason: String, retry_after_secs: u64 },
}

impl Limited {
    pub fn limit(&self) -> Limit {
        match self {
            Limited::Exhausted { limit, .. } | Limited::TooManyPrincipals { limit, .. } | Limited::Unknown { limit, .. } => *limit,
        }
    }

    pub fn retry_after_secs(&self) -> u64 {
        match self {
            Limited::Exhausted { retry_after_secs, .. }
            | Limited::TooManyPrincipals { retry_after_secs, .. }
            | Limited::Unknown { retry_after_secs, .. } => *retry_after_secs,
        }
    }
}

impl From<Limited> for McpError {
    fn from(err: Limited) -> Self {
        let data = match &err {
            Limited::Exhausted { limit, principal, per_minute, retry_after_secs }
            | Limited::TooManyPrincipals { limit, principal, per_minute, retry_after_secs } => json!({
                "status": 429,
                "retryAfterSeconds": retry_after_secs,
                "limit": limit.as_str(),
                "perMinute": per_minute,
                "principal": principal,
            }),
            // 503: the server, not the caller, is the reason.
            Limited::Unknown { limit, principal, retry_after_secs, .. } => json!({
                "status": 503,
                "retryAfterSeconds": retry_after_secs,
                "limit": limit.as_str(),
                "principal": principal,
            }),
        };
        McpError::new(RATE_LIMITED, err.to_string(), Some(data))
    }
}

/// Refusals since the process started, by limit (for `/metrics`).
static REFUSED_CALLS: AtomicU64 = AtomicU64::new(0);
static REFUSED_RUNS: AtomicU64 = AtomicU64::new(0);
static REFUSED_UNKNOWN: AtomicU64 = AtomicU64::new(0);

/// Refusals so far: (calls, runs, closed), across every server in this process.
pub fn refusals() -> (u64, u64, u64) {
    (REFUSED_CALLS.load(Ordering::Relaxed), REFUSED_RUNS.load(Ordering::Relaxed), REFUSED_UNKNOWN.load(Ordering::Relaxed))
}

/// Registers the refusal counter (`…_rate_limited_total{limit}`) in `registry`.
pub fn register_metrics(registry: &mut prometheus_client::registry::Registry) {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    let family = Family::<Vec<(String, String)>, Counter>::default();
    let (calls, runs, unknown) = refusals();
    family.get_or_create(&vec![("limit".to_string(), "calls".to_string())]).inc_by(calls);
    family.get_or_create(&vec![("limit".to_string(), "runs".to_string())]).inc_by(runs);
    family.get_or_create(&vec![("limit".to_string(), "unknown".to_string())]).inc_by(unknown);
    registry.register(
        "rate_limited",
        "Tool calls refused by a rate limit, by the limit that refused (unknown: the limits could not be read, fail closed)",
        family,
    );
}

/// The refusal counter alone, encoded (for a `/metrics` that has no other registry).
pub fn render_metrics(prefix: &str) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix(prefix);
    register_metrics(&mut registry);
    crate::audit::register_metrics(&mut registry);
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out = "# the metrics could not be encoded\n".into();
    }
    out
}

/// The buckets' map, shared between the governor limiter (which owns its
/// store) and the cap check (which must see whether a principal is tracked).
#[derive(Clone, Default)]
struct Shared(Arc<DashMapStateStore<String>>);

impl StateStore for Shared {
    type Key = String;

    fn measure_and_replace<T, F, E>(&self, key: &String, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        self.0.measure_and_replace(key, f)
    }
}

impl ShrinkableKeyedStateStore<String> for Shared {
    fn retain_recent(&self, drop_below: Nanos) {
        ShrinkableKeyedStateStore::retain_recent(self.0.as_ref(), drop_below)
    }

    fn shrink_to_fit(&self) {
        ShrinkableKeyedStateStore::shrink_to_fit(self.0.as_ref())
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One limit's buckets.
struct Bucket<C: Clock> {
    limit: Limit,
    per_minute: u32,
    /// How long an empty bucket takes to fill: after that a principal's
    /// bucket is swept, and a refused newcomer may find room.
    refill: Duration,
    limiter: governor::RateLimiter<String, Shared, C, governor::middleware::NoOpMiddleware<C::Instant>>,
    keys: Shared,
    clock: C,
    checks: AtomicU64,
    cap: usize,
}

impl<C: Clock + Clone> Bucket<C> {
    fn new(limit: Limit, per_minute: u32, burst: u32, clock: C, cap: usize) -> Option<Self> {
        let rate = NonZeroU32::new(per_minute)?;
        let burst = NonZeroU32::new(burst).unwrap_or(rate);
        let quota = Quota::per_minute(rate).allow_burst(burst);
        let refill = quota.replenish_interval() * burst.get();
        let keys = Shared::default();
        let limiter = governor::RateLimiter::new(quota, keys.clone(), clock.clone());
        Some(Bucket { limit, per_minute, refill, limiter, keys, clock, checks: AtomicU64::new(0), cap })
    }

    fn check(&self, principal: &str) -> Result<(), Limited> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % RATE_SWEEP_EVERY == RATE_SWEEP_EVERY - 1 {
            self.limiter.retain_recent();
        }
        // The membership test and the insert below are not one step: calls
        // racing on the last free places may pass the cap by as many as are
        // in flight, never more.
        if !self.keys.0.contains_key(principal) && self.keys.0.len() >= self.cap {
            self.limiter.retain_recent();
            if self.keys.0.len() >= self.cap {
                return Err(self.refused(true, principal, self.refill));
            }
        }
        match self.limiter.check_key(&principal.to_string()) {
            Ok(()) => Ok(()),
            Err(not_until) => Err(self.refused(false, principal, not_until.wait_time_from(self.clock.now()))),
        }
    }

    fn refused(&self, full: bool, principal: &str, wait: Duration) -> Limited {
        match self.limit {
            Limit::Calls => REFUSED_CALLS.fetch_add(1, Ordering::Relaxed),
            Limit::Runs => REFUSED_RUNS.fetch_add(1, Ordering::Relaxed),
        };
        // Whole seconds, rounded up: a client that waits that long finds a token.
        let retry_after_secs = wait.as_nanos().div_ceil(1_000_000_000).max(1) as u64;
        let (limit, principal, per_minute) = (self.limit, principal.to_string(), self.per_minute);
        tracing::debug!(%limit, %principal, retry_after_secs, full, "rate limited");
        if full {
            Limited::TooManyPrincipals { limit, principal, per_minute, retry_after_secs }
        } else {
            Limited::Exhausted { limit, principal, per_minute, retry_after_secs }
        }
    }
}

/// The `calls` and `runs` buckets of one server.
pub struct RateLimiter<C: Clock = DefaultClock> {
    policy: Policy,
    calls: Option<Bucket<C>>,
    runs: Option<Bucket<C>>,
}

impl Default for RateLimiter {
    /// Unlimited.
    fn default() -> Self {
        RateLimiter::new(Policy::Limits(RateLimits::default()))
    }
}

impl RateLimiter {
    pub fn new(policy: Policy) -> Self {
        RateLimiter::with_clock(policy, DefaultClock::default(), RATE_PRINCIPALS_MAX)
    }
}

impl<C: Clock + Clone> RateLimiter<C> {
    /// Buckets on `clock`, tracking at most `cap` principals per limit (tests pass a fake clock and a small cap).
    pub fn with_clock(policy: Policy, clock: C, cap: usize) -> Self {
        let (calls, runs) = match &policy {
            Policy::Limits(config) => (
                Bucket::new(Limit::Calls, config.calls_per_minute, config.burst_calls, clock.clone(), cap),
                Bucket::new(Limit::Runs, config.runs_per_minute, config.burst_runs, clock, cap),
            ),
            Policy::Closed(_) => (None, None),
        };
        RateLimiter { policy, calls, runs }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether a `tools/call` may be refused at all (a `calls` bucket, or closed).
    pub fn limits_calls(&self) -> bool {
        self.calls.is_some() || matches!(self.policy, Policy::Closed(_))
    }

    /// Takes one token from `principal`'s `calls` bucket (every `tools/call`).
    pub fn check_call(&self, principal: &str) -> Result<(), Limited> {
        self.check(Limit::Calls, &self.calls, principal)
    }

    /// Takes one token from `principal`'s `runs` bucket (a run about to start).
    pub fn check_run(&self, principal: &str) -> Result<(), Limited> {
        self.check(Limit::Runs, &self.runs, principal)
    }

    fn check(&self, limit: Limit, bucket: &Option<Bucket<C>>, principal: &str) -> Result<(), Limited> {
        if let Policy::Closed(reason) = &self.policy {
            REFUSED_UNKNOWN.fetch_add(1, Ordering::Relaxed);
            let retry_after_secs = RATE_CLOSED_RETRY.as_secs();
            tracing::debug!(%limit, %principal, %reason, "refused: rate limits unknown");
            return Err(Limited::Unknown { limit, principal: principal.to_string(), reason: reason.clone(), retry_after_secs });
        }
        bucket.as_ref().map_or(Ok(()), |b| b.check(principal))
    }

    /// Principals tracked per limit: (calls, runs).
    pub fn tracked(&self) -> (usize, usize) {
        let len = |b: &Option<Bucket<C>>| b.as_ref().map_or(0, |b| b.keys.0.len());
        (len(&self.calls), len(&self.runs))
    }
}

#[cfg(test)]
#[path = "ratelimit_tests.rs"]
mod tests;

/// A server's limiter, replaced when its [`Policy`] changes: calls in flight
/// finish on the limiter they started with, the next ones use the new one.
pub struct LimiterSlot(ArcSwap<RateLimiter>);

impl Default for LimiterSlot {
    fn default() -> Self {
        LimiterSlot::new(Policy::Limits(RateLimits::default()))
    }
}

impl LimiterSlot {
    pub fn new(policy: Policy) -> Self {
        LimiterSlot(ArcSwap::from_pointee(RateLimiter::new(policy)))
    }

    /// The limiter in force now.
    pub fn current(&self) -> arc_swap::Guard<Arc<RateLimiter>> {
        self.0.load()
    }

    /// Takes one token from `principal`'s `calls` bucket.
    pub fn check_call(&self, principal: &str) -> Result<(), Limited> {
        self.0.load().check_call(principal)
    }

    /// Puts `policy` in force. Fresh buckets when it differs (every principal
    /// starts full under the new figures); nothing changes when it is the
    /// policy already in force, so unchanged re-reads keep the buckets.
    /// Returns whether it changed.
    pub fn set(&self, policy: Policy) -> bool {
        if *self.0.load().policy() == policy {
            return false;
        }
        self.0.store(Arc::new(RateLimiter::new(policy)));
        true
    }
}
