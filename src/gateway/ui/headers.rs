//! The headers every console answer carries: a Content-Security-Policy
//! that lets the page run only its own script and style, talk only to
//! this origin, and never be framed; no MIME sniffing; no referrer; and
//! no caching of anything but the compiled-in assets (the API's answers
//! hold a person's data).

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::Response;

/// The policy. `script-src 'self'` with no `'unsafe-inline'` is what makes
/// a script smuggled into a skill's text inert even if it were ever put
/// into the page as markup; `connect-src 'self'` keeps the token on this
/// origin; `img-src data:` is for nothing but the page's own icon.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Added to every answer under `/ui` (an answer that already set
/// `Cache-Control`, the assets, keeps it).
pub async fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin"));
    headers.insert(HeaderName::from_static("cross-origin-resource-policy"), HeaderValue::from_static("same-origin"));
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}
