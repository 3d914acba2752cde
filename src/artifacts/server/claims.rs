//! Warm pods' claims: how a run is handed to a pod started before it.
//!
//! ```text
//! PUT /v1/jobs/{ns}/{warm_uid}/claim          operator  body: Claim JSON; write-once
//! GET /v1/jobs/{ns}/{warm_uid}/claim[?wait=]  job       the Claim, or 204 when none came within `wait` s
//! ```
//!
//! A warm pod has an identity of its own, a warm uid
//! ([`is_warm_uid`]), and so a job credential of its own (its projected
//! token's audience is that uid's). When a SkillJob takes the pod, the
//! operator stores the [`Claim`] under the warm uid; the pod's sidecar,
//! waiting on the GET, reads it, and from then on reads the SkillJob's
//! inputs and stores its outputs on the SkillJob's routes with its own
//! credential and the header [`CLAIM_HEADER`]` = <warm_uid>` ([`admit_job`]).
//!
//! - **Write-once.** The first PUT stores the claim; the same claim again
//!   is 200 (the controller retries); another is 409 `already_claimed`: a
//!   warm pod runs one claim, never two. Writes to one warm uid are
//!   serialised by the job lock (the endpoint's single-writer assumption).
//! - **Durable and shared.** The claim is a job file set (tag
//!   `job_<ns>_<warm_uid>_claim`, its one file [`CLAIM_FILE`]) in the
//!   endpoint's store, the built-in one or a registry, so any replica
//!   answers the GET and authorises the claimed routes. `DELETE
//!   /v1/jobs/{ns}/{warm_uid}` removes it with the warm uid's other tags.
//! - **The wait.** A GET with `?wait=` (at most [`CLAIM_WAIT_MAX_SECS`]) is
//!   answered the moment this replica stores the claim (a [`Notify`] per
//!   waited-on warm uid), and reads the store every
//!   [`CLAIM_RECHECK`](crate::artifacts::CLAIM_RECHECK) for a
//!   claim another replica stored; 204 when none came, and at once on
//!   shutdown.
//! - **Cached.** A stored claim never changes (a delete removes it, and
//!   the warm pod is gone by then), so the claimed routes check it from
//!   memory after the first read: a bounded map, cleared when full.
//!
//! Order of checks: namespace and warm uid as names (400 `bad_job`), then
//! the credential, then the body (400 `bad_claim`, 413 `body_too_large`)
//! or `?wait=` (400 `bad_query`), then the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;

use super::auth::{admit, authenticate, Access, Caller};
use super::extract::{JobPath, QueryOf};
use super::{internal, oci_error, ApiError, AppState};
use crate::artifacts::{
    check_namespace, check_uid, is_warm_uid, ArtifactKind, Claim, ErrorCode, SetFile, ANNOTATION_JOB, ANNOTATION_KIND, CLAIM_FILE,
    CLAIM_HEADER, CLAIM_WAIT_MAX_SECS, MAX_CLAIM_BYTES,
};

/// Claims kept in memory before the map is cleared.
const CLAIMS_CACHED: usize = 4096;
/// Bytes of claim JSON kept in memory before the map is cleared.
const CLAIMS_CACHED_BYTES: usize = 16 * 1024 * 1024;

type Key = (String, String);

/// The claims this replica knows and the requests waiting for one.
#[derive(Default)]
pub(super) struct Claims {
    cache: Mutex<Cache>,
    waiters: Mutex<HashMap<Key, Arc<Notify>>>,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, (Arc<Claim>, usize)>,
    bytes: usize,
}

fn key(ns: &str, warm: &str) -> Key {
    (ns.to_string(), warm.to_string())
}

impl Claims {
    fn cached(&self, ns: &str, warm: &str) -> Option<Arc<Claim>> {
        self.cache.lock().expect("lock poisoned").entries.get(&key(ns, warm)).map(|(c, _)| c.clone())
    }

    fn remember(&self, ns: &str, warm: &str, claim: Arc<Claim>, bytes: usize) {
        let mut cache = self.cache.lock().expect("lock poisoned");
        if cache.entries.len() >= CLAIMS_CACHED || cache.bytes + bytes > CLAIMS_CACHED_BYTES {
            cache.entries.clear();
            cache.bytes = 0;
        }
        if let Some((_, old)) = cache.entries.insert(key(ns, warm), (claim, bytes)) {
            cache.bytes -= old;
        }
        cache.bytes += bytes;
    }

    /// Drops what is known of `ns/uid`'s claim (its job's artifacts were deleted).
    pub(super) fn forget(&self, ns: &str, uid: &str) {
        let mut cache = self.cache.lock().expect("lock poisoned");
        if let Some((_, bytes)) = cache.entries.remove(&key(ns, uid)) {
            cache.bytes -= bytes;
        }
    }

    /// Wakes every request of this replica waiting for the warm uid's claim.
    fn wake(&self, ns: &str, warm: &str) {
        if let Some(notify) = self.waiters.lock().expect("lock poisoned").get(&key(ns, warm)) {
            notify.notify_waiters();
        }
    }

    pub(super) fn waiting(&self) -> usize {
        self.waiters.lock().expect("lock poisoned").len()
    }

    fn waiter(&self, ns: &str, warm: &str) -> Waiter<'_> {
        let key = key(ns, warm);
        let notify = self.waiters.lock().expect("lock poisoned").entry(key.clone()).or_default().clone();
        Waiter { claims: self, key, notify }
    }
}

/// One waiting request's registration; the last one out removes the entry.
struct Waiter<'a> {
    claims: &'a Claims,
    key: Key,
    notify: Arc<Notify>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut waiters = self.claims.waiters.lock().expect("lock poisoned");
        // Clones are made under this lock only: two means the map's and ours.
        if Arc::strong_count(&self.notify) == 2 {
            waiters.remove(&self.key);
        }
    }
}

/// A small JSON document kept under a warm uid: a set of one file.
#[derive(Debug, Clone, Copy)]
pub(super) struct WarmDoc {
    pub kind: ArtifactKind,
    pub file: &'static str,
    /// Its largest size, as stored.
    pub max: u64,
    /// What it is, for a refusal's message.
    pub what: &'static str,
}

const CLAIM_DOC: WarmDoc = WarmDoc { kind: ArtifactKind::Claim, file: CLAIM_FILE, max: MAX_CLAIM_BYTES, what: "a claim" };

impl AppState {
    /// The claim stored for a warm uid: from memory, else from the store
    /// (then remembered). `None` while there is none.
    pub(super) async fn claim_of(&self, ns: &str, warm: &str) -> Result<Option<Arc<Claim>>, ApiError> {
        if let Some(claim) = self.0.claims.cached(ns, warm) {
            return Ok(Some(claim));
        }
        let doc = self.warm_doc(ns, warm, &CLAIM_DOC, Claim::validate).await?;
        let Some((claim, size)) = doc else { return Ok(None) };
        let claim = Arc::new(claim);
        self.0.claims.remember(ns, warm, claim.clone(), size);
        Ok(Some(claim))
    }

    /// The one JSON file of a warm uid's `doc` set, parsed and checked by
    /// `check`, and its size; `None` while none is stored. A set of another
    /// shape is 502 `wrong_artifact`.
    pub(super) async fn warm_doc<T: serde::de::DeserializeOwned>(
        &self,
        ns: &str,
        warm: &str,
        doc: &WarmDoc,
        check: impl Fn(&T) -> Result<(), String>,
    ) -> Result<Option<(T, usize)>, ApiError> {
        let WarmDoc { kind, file: name, max, what } = *doc;
        let set = match self.read_set(ns, warm, kind).await {
            Ok(set) => set,
            Err(e) if e.code == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let reference = self.reference(ns, warm, kind);
        let wrong = |why: &str| ApiError::new(ErrorCode::WrongArtifact, format!("{reference} is not {what}: {why}"));
        let [file] = set.files.as_slice() else { return Err(wrong("it holds more than one file")) };
        if file.path != name || file.size > max {
            return Err(wrong(&format!("it holds {} ({} bytes)", file.path, file.size)));
        }
        let bytes = self.0.sets.pull_set_file(&reference, file).await.map_err(oci_error)?;
        let doc: T = serde_json::from_slice(&bytes).map_err(|e| wrong(&e.to_string()))?;
        check(&doc).map_err(|e| wrong(&e))?;
        Ok(Some((doc, bytes.len())))
    }

    /// Stores `bytes` as the one file of a warm uid's `doc` set (annotated
    /// with its job and kind), and forgets the set's cached copy.
    pub(super) async fn store_warm_doc(&self, ns: &str, warm: &str, doc: &WarmDoc, bytes: &[u8]) -> Result<(), ApiError> {
        let kind = doc.kind;
        let reference = self.reference(ns, warm, kind);
        let digest = self.0.sets.push_set_blob(&reference, bytes).await.map_err(oci_error)?;
        let file = SetFile { path: doc.file.into(), size: bytes.len() as u64, digest };
        let annotations = BTreeMap::from([
            (ANNOTATION_JOB.to_string(), format!("{ns}/{warm}")),
            (ANNOTATION_KIND.to_string(), kind.as_str().to_string()),
        ]);
        self.0.sets.push_set_manifest(&reference, vec![file], annotations).await.map_err(oci_error)?;
        self.forget(&reference);
        Ok(())
    }
}

/// The namespace and the warm uid as names: 400 before anything else.
pub(super) fn names(ns: &str, warm: &str) -> Result<(), ApiError> {
    check_namespace(ns).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    if !is_warm_uid(warm) {
        return Err(ApiError::bad(ErrorCode::BadJob, format!("{warm:?} is not a warm pod's uid (warm-<32 lowercase hex>)")));
    }
    Ok(())
}

/// `PUT /v1/jobs/{ns}/{warm_uid}/claim`: stores the claim once (see the module docs).
pub(super) async fn put_claim(
    State(state): State<AppState>,
    JobPath((ns, warm)): JobPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    names(&ns, &warm)?;
    admit(&state, req.headers(), &ns, &warm, Access::Claim).await?;
    let limit = MAX_CLAIM_BYTES as usize;
    let body = axum::body::to_bytes(req.into_body(), limit).await.map_err(|e| {
        if super::spool::is_length_limit(&e) {
            ApiError::too_large(ErrorCode::BodyTooLarge, format!("a claim is at most {limit} bytes"))
        } else if crate::listener::is_body_timeout(&e) {
            ApiError::new(ErrorCode::BodyTooSlow, format!("the claim: {e}"))
        } else {
            ApiError::bad(ErrorCode::BadBody, "reading the claim failed")
        }
    })?;
    let claim: Claim = serde_json::from_slice(&body).map_err(|e| ApiError::bad(ErrorCode::BadClaim, format!("not a claim: {e}")))?;
    claim.validate().map_err(|m| ApiError::bad(ErrorCode::BadClaim, m))?;
    let _lock = state.lock(&ns, &warm).lock().await;
    if let Some(stored) = state.claim_of(&ns, &warm).await? {
        if *stored == claim {
            return Ok(Json(json!({ "created": false })).into_response());
        }
        return Err(ApiError::new(
            ErrorCode::AlreadyClaimed,
            format!("warm pod {warm} is claimed already (by SkillJob {}); a warm pod runs one claim", stored.skilljob_uid),
        ));
    }
    let bytes = serde_json::to_vec(&claim).map_err(internal)?;
    state.store_warm_doc(&ns, &warm, &CLAIM_DOC, &bytes).await?;
    state.0.claims.remember(&ns, &warm, Arc::new(claim), bytes.len());
    state.0.claims.wake(&ns, &warm);
    Ok(Json(json!({ "created": true })).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct WaitQuery {
    wait: Option<u64>,
}

/// `GET /v1/jobs/{ns}/{warm_uid}/claim?wait=`: the claim, or 204 (see the module docs).
pub(super) async fn get_claim(
    State(state): State<AppState>,
    JobPath((ns, warm)): JobPath<(String, String)>,
    QueryOf(q): QueryOf<WaitQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    names(&ns, &warm)?;
    admit(&state, &headers, &ns, &warm, Access::ReadClaim).await?;
    let wait = q.wait.unwrap_or(0);
    if wait > CLAIM_WAIT_MAX_SECS {
        return Err(ApiError::bad(ErrorCode::BadQuery, format!("wait={wait}: at most {CLAIM_WAIT_MAX_SECS} seconds")));
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(wait);
    let waiter = state.0.claims.waiter(&ns, &warm);
    loop {
        // Registered before the look, so a claim stored meanwhile still wakes it.
        let notified = waiter.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(claim) = state.claim_of(&ns, &warm).await? {
            return Ok(([(header::CACHE_CONTROL, "no-store")], Json(&*claim)).into_response());
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(deadline.min(now + state.0.claim_recheck)) => {}
            _ = state.0.stop.cancelled() => return Ok(StatusCode::NO_CONTENT.into_response()),
        }
    }
}

/// [`admit`] for the routes a claimed warm pod uses on its run's behalf
/// (`GET .../inputs`, `GET .../inputs/{*path}`, `PUT .../outputs`). With
/// no [`CLAIM_HEADER`], exactly [`admit`]. With it, the credential must be
/// the job credential of the warm uid it names, and the claim stored for
/// that warm uid must name the route's job; anything else is 403.
pub(super) async fn admit_job(state: &AppState, headers: &HeaderMap, ns: &str, uid: &str, access: Access) -> Result<(), ApiError> {
    let Some(value) = headers.get(CLAIM_HEADER) else {
        return admit(state, headers, ns, uid, access).await;
    };
    check_namespace(ns).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    check_uid(uid).map_err(|m| ApiError::bad(ErrorCode::BadJob, m))?;
    let warm = value.to_str().ok().filter(|w| is_warm_uid(w)).ok_or_else(|| {
        ApiError::bad(ErrorCode::BadJob, format!("the {CLAIM_HEADER} header names no warm pod's uid (warm-<32 lowercase hex>)"))
    })?;
    let forbidden = |m: String| Err(ApiError::new(ErrorCode::Forbidden, m));
    if !matches!(access, Access::ReadStaged | Access::WriteOutputs) {
        return forbidden("a claimed warm pod reads its run's inputs and writes its outputs, nothing else".into());
    }
    match authenticate(state, headers, ns, warm).await? {
        Caller::Job => {}
        Caller::Operator => return forbidden(format!("the {CLAIM_HEADER} header goes with the warm pod's own credential")),
    }
    match state.claim_of(ns, warm).await? {
        None => forbidden(format!("warm pod {warm} is not claimed by any run")),
        Some(claim) if claim.skilljob_uid != uid => forbidden(format!("warm pod {warm} is claimed by another run, not {uid}")),
        Some(_) => Ok(()),
    }
}
