//! `/metrics` of the gateway, in the OpenMetrics text format: the auth
//! caches' work (how often the API server is asked vs answered from the
//! cache) as counters read at scrape time.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;

use super::auth::{AuthStats, Authenticator};

/// The current figures, encoded.
pub fn render(auth: &Authenticator) -> String {
    render_stats(auth.stats())
}

/// `stats` and the rate limiter's refusals, encoded (the gateway's listener
/// counters follow them on `/metrics`).
pub fn render_stats(stats: AuthStats) -> String {
    let mut registry = Registry::with_prefix("skill_operator_gateway");
    registry.register("token_reviews", "TokenReviews sent to the API server", ConstCounter::new(stats.token_reviews));
    registry.register("token_cache_hits", "Bearer tokens answered from the cache", ConstCounter::new(stats.token_cache_hits));
    registry.register("access_reviews", "SubjectAccessReviews sent to the API server", ConstCounter::new(stats.access_reviews));
    registry.register("access_cache_hits", "Authorization decisions answered from the cache", ConstCounter::new(stats.access_cache_hits));
    crate::mcp::ratelimit::register_metrics(&mut registry);
    crate::audit::register_metrics(&mut registry);
    let mut out = String::new();
    if encode(&mut out, &registry).is_err() {
        out = "# the metrics could not be encoded\n".into();
    }
    out
}
