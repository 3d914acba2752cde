//! The page and its two assets, compiled into the binary: nothing to
//! build, nothing fetched from a CDN. Each is served with its own media
//! type (and `nosniff`, see [`super::headers`]) and a strong ETag of its
//! content, so a browser revalidates instead of keeping an old page after
//! an upgrade.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};

use super::UI_PREFIX;

struct Asset {
    name: &'static str,
    media_type: &'static str,
    body: &'static str,
}

const INDEX: Asset = Asset { name: "index.html", media_type: "text/html; charset=utf-8", body: include_str!("assets/index.html") };

/// Everything under `/ui/assets/`.
const ASSETS: &[Asset] = &[
    Asset { name: "app.js", media_type: "text/javascript; charset=utf-8", body: include_str!("assets/app.js") },
    Asset { name: "app.css", media_type: "text/css; charset=utf-8", body: include_str!("assets/app.css") },
];

fn etag(asset: &Asset) -> HeaderValue {
    static TAGS: OnceLock<Vec<(&'static str, HeaderValue)>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        std::iter::once(&INDEX)
            .chain(ASSETS)
            .map(|a| {
                let hex = hex::encode(&Sha256::digest(a.body.as_bytes())[..12]);
                (a.name, HeaderValue::from_str(&format!("\"{hex}\"")).unwrap_or_else(|_| HeaderValue::from_static("\"0\"")))
            })
            .collect()
    });
    tags.iter().find(|(n, _)| *n == asset.name).map(|(_, t)| t.clone()).unwrap_or_else(|| HeaderValue::from_static("\"0\""))
}

fn serve(asset: &Asset, request: &HeaderMap) -> Response {
    let tag = etag(asset);
    if request.get(header::IF_NONE_MATCH) == Some(&tag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, tag)]).into_response();
    }
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(asset.media_type)),
        (header::ETAG, tag),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, asset.body).into_response()
}

/// `GET /ui`: the page lives at `/ui/` (its relative asset paths need the slash).
pub async fn redirect() -> Redirect {
    Redirect::permanent(&format!("{UI_PREFIX}/"))
}

/// `GET /ui/`.
pub async fn index(headers: HeaderMap) -> Response {
    serve(&INDEX, &headers)
}

/// `GET /ui/assets/{name}`.
pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => serve(asset, &headers),
        None => super::api::not_found().await,
    }
}
