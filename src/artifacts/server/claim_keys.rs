//! Warm pods' public keys: what a run's granted variables are sealed to.
//!
//! ```text
//! PUT /v1/jobs/{ns}/{warm_uid}/claim-key   job (the warm pod itself)  body: ClaimKey JSON; write-once
//! GET /v1/jobs/{ns}/{warm_uid}/claim-key   operator                   the ClaimKey, or 404
//! ```
//!
//! A warm pod's launcher makes a key pair when it starts and keeps the
//! private half; its sidecar publishes the public half here with the pod's
//! own credential. The controller reads it when it claims the pod for a run
//! granted variables and seals them to it ([`crate::artifacts::sealed`]).
//!
//! - **Only the pod publishes, only the operator reads.** A job credential
//!   of another warm uid (or of a run) cannot publish for this one: the
//!   credential is checked against the route's warm uid.
//! - **Write-once.** The same key again is 200 (a restarted sidecar sends
//!   it again); another is 409 `key_published`: whoever got into a waiting
//!   pod after its start cannot swap the key a run's values are sealed to.
//! - **Stored like a claim** (tag `job_<ns>_<warm_uid>_claimkey`, its one
//!   file [`CLAIM_KEY_FILE`]), so any replica answers, and removed with the
//!   warm uid's other tags by `DELETE /v1/jobs/{ns}/{warm_uid}`. A stored
//!   key never changes, so it is remembered after the first read (a
//!   bounded map, cleared when full).
//!
//! Order of checks: names (400 `bad_job`), the credential, the body (400
//! `bad_claim_key`, 413 `body_too_large`), then the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::auth::{admit, Access};
use super::claims::{names, WarmDoc};
use super::extract::JobPath;
use super::{internal, ApiError, AppState};
use crate::artifacts::sealed::{ClaimKey, CLAIM_KEY_MAX_BYTES};
use crate::artifacts::{ArtifactKind, ErrorCode, CLAIM_KEY_FILE};

const KEY_DOC: WarmDoc =
    WarmDoc { kind: ArtifactKind::ClaimKey, file: CLAIM_KEY_FILE, max: CLAIM_KEY_MAX_BYTES as u64, what: "a warm pod's key" };

/// Keys kept in memory before the map is cleared.
const KEYS_CACHED: usize = 4096;

/// The keys this replica knows.
#[derive(Default)]
pub(super) struct ClaimKeys(Mutex<HashMap<(String, String), Arc<ClaimKey>>>);

impl ClaimKeys {
    fn cached(&self, ns: &str, warm: &str) -> Option<Arc<ClaimKey>> {
        self.0.lock().expect("lock poisoned").get(&(ns.to_string(), warm.to_string())).cloned()
    }

    fn remember(&self, ns: &str, warm: &str, key: Arc<ClaimKey>) {
        let mut keys = self.0.lock().expect("lock poisoned");
        if keys.len() >= KEYS_CACHED {
            keys.clear();
        }
        keys.insert((ns.to_string(), warm.to_string()), key);
    }

    /// Drops what is known of `ns/uid`'s key (its artifacts were deleted).
    pub(super) fn forget(&self, ns: &str, uid: &str) {
        self.0.lock().expect("lock poisoned").remove(&(ns.to_string(), uid.to_string()));
    }
}

impl AppState {
    /// The key stored for a warm uid: from memory, else from the store
    /// (then remembered). `None` while there is none.
    async fn claim_key_of(&self, ns: &str, warm: &str) -> Result<Option<Arc<ClaimKey>>, ApiError> {
        if let Some(key) = self.0.claim_keys.cached(ns, warm) {
            return Ok(Some(key));
        }
        let check = |key: &ClaimKey| key.validate().map_err(|e| e.to_string());
        let doc = self.warm_doc(ns, warm, &KEY_DOC, check).await?;
        let Some((key, _)) = doc else { return Ok(None) };
        let key = Arc::new(key);
        self.0.claim_keys.remember(ns, warm, key.clone());
        Ok(Some(key))
    }
}

/// `PUT /v1/jobs/{ns}/{warm_uid}/claim-key`: stores the pod's key once (see the module docs).
pub(super) async fn put_claim_key(
    State(state): State<AppState>,
    JobPath((ns, warm)): JobPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    names(&ns, &warm)?;
    admit(&state, req.headers(), &ns, &warm, Access::PublishKey).await?;
    let body = axum::body::to_bytes(req.into_body(), CLAIM_KEY_MAX_BYTES).await.map_err(|e| {
        if super::spool::is_length_limit(&e) {
            ApiError::too_large(ErrorCode::BodyTooLarge, format!("a warm pod's key is at most {CLAIM_KEY_MAX_BYTES} bytes"))
        } else {
            ApiError::bad(ErrorCode::BadBody, "reading the key failed")
        }
    })?;
    let key: ClaimKey =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad(ErrorCode::BadClaimKey, format!("not a warm pod's key: {e}")))?;
    key.validate().map_err(|e| ApiError::bad(ErrorCode::BadClaimKey, e.to_string()))?;
    let _lock = state.lock(&ns, &warm).lock().await;
    if let Some(stored) = state.claim_key_of(&ns, &warm).await? {
        if *stored == key {
            return Ok(Json(json!({ "created": false })).into_response());
        }
        return Err(ApiError::new(
            ErrorCode::KeyPublished,
            format!("warm pod {warm} published its key already; a pod has one key, made when it started"),
        ));
    }
    let bytes = serde_json::to_vec(&key).map_err(internal)?;
    state.store_warm_doc(&ns, &warm, &KEY_DOC, &bytes).await?;
    state.0.claim_keys.remember(&ns, &warm, Arc::new(key));
    Ok(Json(json!({ "created": true })).into_response())
}

/// `GET /v1/jobs/{ns}/{warm_uid}/claim-key`: the pod's key, or 404.
pub(super) async fn get_claim_key(
    State(state): State<AppState>,
    JobPath((ns, warm)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    names(&ns, &warm)?;
    admit(&state, &headers, &ns, &warm, Access::ReadKey).await?;
    match state.claim_key_of(&ns, &warm).await? {
        Some(key) => Ok(([(header::CACHE_CONTROL, "no-store")], Json(&*key)).into_response()),
        None => Err(ApiError::new(ErrorCode::NotFound, format!("warm pod {warm} has published no key"))),
    }
}
