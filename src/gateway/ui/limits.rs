//! Every bound the console keeps, defined once here and named in the
//! answer a caller gets when one is hit.

use std::time::Duration;

/// Event streams open at once on one gateway replica (all namespaces and
/// callers together); one more is answered 503 with `Retry-After`.
pub const STREAMS_MAX: usize = 256;
/// The shortest life of an event stream, even when tokens are reviewed on
/// every request (`--auth-cache-ttl-secs=0`): the page reconnects after
/// it, and the reconnect is reviewed again.
pub const STREAM_LIFETIME_MIN: Duration = Duration::from_secs(10);
/// Silence after which a stream sends a comment line, so proxies that cut
/// idle connections leave it open.
pub const STREAM_HEARTBEAT: Duration = Duration::from_secs(15);
/// Namespaces with bindings whose access is asked about for one namespace
/// list; more than this and the list says it was cut.
pub const NAMESPACES_LISTED_MAX: usize = 500;
/// SubjectAccessReviews one namespace list sends at once.
pub const NAMESPACE_REVIEWS_IN_FLIGHT: usize = 8;
/// Bytes of stdout and of stderr a job's page shows (the rest is a download).
pub const STREAM_SHOWN_BYTES: u64 = crate::core::limits::JOB_READ_CHUNK;
