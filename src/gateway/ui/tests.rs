//! The console's pieces that need no API server: the headers on every
//! answer, the assets, the event framing, and the page's own rules about
//! how data reaches the DOM. The routes' authorization against a
//! reviewing API server is tests/console_api.rs; the page in a real
//! browser is tests/console/.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use tower::ServiceExt;

use super::headers::CONTENT_SECURITY_POLICY;
use super::*;

fn app() -> Router {
    Router::new()
        .route(&format!("{UI_PREFIX}/"), get(assets::index))
        .route(&format!("{UI_PREFIX}/assets/{{name}}"), get(assets::asset))
        .route(&format!("{UI_PREFIX}/{{*rest}}"), get(api::not_found))
        .layer(axum::middleware::map_response(headers::secure))
}

async fn fetch(app: Router, uri: &str, etag: Option<&str>) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut request = Request::get(uri);
    if let Some(tag) = etag {
        request = request.header(header::IF_NONE_MATCH, tag);
    }
    let response = app.oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    (parts.status, parts.headers, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn every_answer_carries_the_policy_and_its_media_type() {
    for (uri, status, media) in [
        ("/ui/", StatusCode::OK, "text/html; charset=utf-8"),
        ("/ui/assets/app.js", StatusCode::OK, "text/javascript; charset=utf-8"),
        ("/ui/assets/app.css", StatusCode::OK, "text/css; charset=utf-8"),
        ("/ui/assets/evil.js", StatusCode::NOT_FOUND, "application/json"),
        ("/ui/../etc/passwd", StatusCode::NOT_FOUND, "application/json"),
    ] {
        let (got, headers, body) = fetch(app(), uri, None).await;
        assert_eq!(got, status, "{uri}: {body}");
        assert_eq!(headers[header::CONTENT_TYPE], media, "{uri}");
        assert_eq!(headers[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY, "{uri}");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{uri}");
        assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY", "{uri}");
        assert_eq!(headers[header::REFERRER_POLICY], "no-referrer", "{uri}");
    }
    // The API's answers are never cached; the assets revalidate.
    assert_eq!(fetch(app(), "/ui/nothing", None).await.1[header::CACHE_CONTROL], "no-store");
    assert_eq!(fetch(app(), "/ui/assets/app.js", None).await.1[header::CACHE_CONTROL], "no-cache");
}

#[test]
fn the_policy_allows_no_inline_script_no_other_origin_and_no_framing() {
    let directives: Vec<&str> = CONTENT_SECURITY_POLICY.split(';').map(str::trim).collect();
    for needed in
        ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'"]
    {
        assert!(directives.contains(&needed), "{needed} missing from {CONTENT_SECURITY_POLICY}");
    }
    for forbidden in ["unsafe-inline", "unsafe-eval", "http:", "https:", "*"] {
        assert!(!CONTENT_SECURITY_POLICY.contains(forbidden), "{forbidden} in {CONTENT_SECURITY_POLICY}");
    }
}

#[tokio::test]
async fn an_asset_revalidates_by_its_content_tag() {
    let (_, headers, _) = fetch(app(), "/ui/assets/app.js", None).await;
    let tag = headers[header::ETAG].to_str().unwrap().to_string();
    let (status, _, body) = fetch(app(), "/ui/assets/app.js", Some(&tag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());
    let (status, _, _) = fetch(app(), "/ui/assets/app.js", Some("\"stale\"")).await;
    assert_eq!(status, StatusCode::OK);
    let (_, css, _) = fetch(app(), "/ui/assets/app.css", None).await;
    assert_ne!(css[header::ETAG], tag, "each asset has its own tag");
}

/// The page puts data into the DOM only as text (see app.js's header):
/// none of the markup sinks appears in it, no inline handler or script in
/// the HTML, and nothing is loaded from another origin.
#[test]
fn the_page_has_no_markup_sinks_inline_script_or_third_party_source() {
    let js = include_str!("assets/app.js");
    let code: String = js.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    for sink in
        ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "setAttribute(\"on", "javascript:"]
    {
        assert!(!code.contains(sink), "app.js uses {sink}");
    }
    let html = include_str!("assets/index.html");
    assert!(!html.contains("<script>") && !html.contains("onclick") && !html.contains("style="), "inline script or style in index.html");
    for text in [js, html, include_str!("assets/app.css")] {
        assert!(!text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"), "a third-party URL in an asset");
    }
    // The token is read from sessionStorage and sent as a header, never put into a URL.
    assert!(!code.contains("localStorage"), "the token must not outlive the tab");
    assert!(!code.contains("?token") && !code.contains("&token"), "a token in a URL");
}

#[test]
fn an_event_is_one_line_of_json_whatever_the_data_holds() {
    let record = crate::jobs::JobRecord {
        id: "skj-1".into(),
        skill: "evil\n\nevent: job\ndata: {\"forged\":true}".into(),
        owner: "alice".into(),
        created_at_ms: 1,
        state: crate::jobs::JobState::Running,
        inputs: vec![],
        run: None,
    };
    let frame = String::from_utf8(events_encode(JobChange::Changed(Box::new(record))).to_vec()).unwrap();
    assert!(frame.starts_with("event: job\ndata: {"), "{frame}");
    assert!(frame.ends_with("}\n\n"), "{frame}");
    assert_eq!(frame.matches('\n').count(), 3, "the data stayed on its line: {frame}");
    assert_eq!(frame.lines().filter(|l| l.starts_with("event:")).count(), 1, "{frame}");
}

fn events_encode(change: JobChange) -> bytes::Bytes {
    events::encode_change(&change)
}

#[test]
fn a_stream_lives_as_long_as_a_token_review_with_a_floor() {
    assert_eq!(events::lifetime(Duration::from_secs(60)), Duration::from_secs(60));
    assert_eq!(events::lifetime(Duration::ZERO), limits::STREAM_LIFETIME_MIN);
}

#[test]
fn refusal_codes_keep_their_http_meaning() {
    use crate::mcp::error::codes;
    assert_eq!(api::status_of(codes::UNAUTHORIZED), StatusCode::UNAUTHORIZED);
    assert_eq!(api::status_of(codes::FORBIDDEN), StatusCode::FORBIDDEN);
    assert_eq!(api::status_of(codes::RUNS_REFUSED), StatusCode::FORBIDDEN);
    assert_eq!(api::status_of(codes::BACKEND), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(api::status_of("job-not-found"), StatusCode::NOT_FOUND);
    assert_eq!(api::status_of("unknown-skill"), StatusCode::NOT_FOUND);
    assert_eq!(api::status_of("job-still-running"), StatusCode::CONFLICT);
    assert_eq!(api::status_of("confirm-mismatch"), StatusCode::BAD_REQUEST);
    assert_eq!(api::status_of(codes::INTERNAL), StatusCode::INTERNAL_SERVER_ERROR);
}
