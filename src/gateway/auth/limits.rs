//! Every bound the gateway's authentication keeps, defined once here and
//! named in the error a caller (or an operator's flag) gets when it is hit.

use std::time::Duration;

/// The longest any cache TTL may be set to, so a revocation always takes
/// effect within minutes.
pub const MAX_CACHE_TTL_SECS: u64 = 600;
/// The largest cache the flags accept (answers per cache).
pub const MAX_CACHE_ENTRIES: usize = 1_000_000;
/// The longest bearer token accepted, in bytes. Kubernetes tokens are JWTs
/// of one to two KiB; OIDC tokens with many groups are larger, but nothing
/// legitimate comes near this.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// How long one TokenReview or SubjectAccessReview may take before the
/// request is answered 503.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest API server text (a refusal's reason) passed on to a caller.
pub const MAX_REASON_CHARS: usize = 512;
/// The most audiences and authorization servers the flags accept (each).
pub const MAX_LIST_FLAGS: usize = 16;
