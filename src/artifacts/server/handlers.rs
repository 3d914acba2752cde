//! The routes' handlers.

use super::super::{
    ArtifactKind, ArtifactLimits, InputsManifest, OutputManifest, SetFile, ANNOTATION_JOB, ANNOTATION_KIND, MANIFEST_PATH, RESULT_PREFIX,
    WORK_PREFIX,
};
use crate::core::paths::RelPath;
use crate::oci::{OciError, SkillConfig};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;

use super::super::ErrorCode;
use super::extract::{JobPath, QueryOf};
use super::*;

// -- handlers -----------------------------------------------------------------

pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    if state.is_starting() {
        return ApiError::new(ErrorCode::Starting, "seeding the sample skills and applying their SkillPackages").into_response();
    }
    let probe = format!("{}:readyz-probe", state.0.repo);
    match state.0.sets.blob_set(&probe).await {
        Ok(_) | Err(OciError::NotFound { .. }) => "ok".into_response(),
        Err(e) => ApiError::new(ErrorCode::RegistryUnavailable, e.to_string()).into_response(),
    }
}

pub(super) async fn put_package(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    admit(&state, req.headers(), &ns, &uid, Access::Stage).await?;
    let reference = state.reference(&ns, &uid, ArtifactKind::Package);
    let job = BTreeMap::from([(ANNOTATION_JOB.to_string(), format!("{ns}/{uid}"))]);
    stage_archive(&state, req, (&ns, &uid), &reference, job).await
}

/// The work of both package PUTs: spools the body (the package cap),
/// checks it is a package (once per sha256: the validation memo), and
/// pushes it to `reference` with `annotations`, blobs only when missing.
/// Writes under one `lock` key are serialised. Answers `{digest,
/// packageDigest, files, totalBytes}`.
pub(super) async fn stage_archive(
    state: &AppState,
    req: Request,
    lock: (&str, &str),
    reference: &str,
    annotations: BTreeMap<String, String>,
) -> Result<Response, ApiError> {
    let limit = state.0.limits.max_package_bytes;
    let sp = spool(state, req, limit, "package").await?;
    let _held = state.hold(sp.len).await;
    let _lock = state.lock(lock.0, lock.1).lock().await;
    let file = sp.file.clone();
    let len = sp.len;
    let known = state.0.validated.lock().expect("lock poisoned").get(&sp.digest).cloned();
    let checked = known.is_some();
    let (bytes, config) = blocking(move || {
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0).map_err(internal)?;
        let config = match known {
            Some(config) => config,
            None => SkillConfig::for_package(&bytes, STAGED_PACKAGE_NAME.to_string(), "", None)
                .map_err(|e| ApiError::bad(ErrorCode::BadPackage, format!("not a valid package: {e}")))?,
        };
        Ok((bytes, config))
    })
    .await?;
    {
        let mut memo = state.0.validated.lock().expect("lock poisoned");
        if memo.len() >= VALIDATED_ENTRIES {
            memo.clear();
        }
        memo.insert(sp.digest.clone(), config.clone());
    }
    let pushed = if checked {
        state.0.packages.push_checked(reference, &bytes, &config, annotations, crate::oci::Upload::IfMissing).await
    } else {
        state.0.packages.push_annotated(reference, &bytes, &config, annotations).await
    };
    let digest = pushed.map_err(oci_error)?;
    Ok(Json(json!({
        "digest": digest,
        "packageDigest": sp.digest,
        "files": config.file_count,
        "totalBytes": config.total_bytes,
    }))
    .into_response())
}

pub(super) async fn get_inputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<InputsManifest>, ApiError> {
    super::claims::admit_job(&state, &headers, &ns, &uid, Access::ReadStaged).await?;
    match state.read_set(&ns, &uid, ArtifactKind::Inputs).await {
        Ok(set) => Ok(Json(InputsManifest { digest: Some(set.digest.clone()), files: set.files.clone() })),
        Err(e) if e.status == StatusCode::NOT_FOUND => Ok(Json(InputsManifest { digest: None, files: Vec::new() })),
        Err(e) => Err(e),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct SetQuery {
    pub(super) set: Option<String>,
}

pub(super) async fn get_file(
    state: &AppState,
    ns: &str,
    uid: &str,
    kind: ArtifactKind,
    rel: &RelPath,
    pin: Option<&str>,
) -> Result<Response, ApiError> {
    let set = state.set_for(ns, uid, kind, pin).await?;
    let file = set
        .files
        .iter()
        .find(|f| f.path == rel.as_str())
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no {} file {rel}", kind.as_str())))?
        .clone();
    let _held = state.hold(file.size).await;
    let reference = state.reference(ns, uid, kind);
    let data = state.0.sets.pull_set_file(&reference, &file).await.map_err(oci_error)?;
    let ct = if rel.as_str() == MANIFEST_PATH { "application/json" } else { "application/octet-stream" };
    Ok(bytes_response(data, ct, &file.digest, Some(&set.digest)))
}

pub(super) async fn get_input_file(
    State(state): State<AppState>,
    JobPath((ns, uid, path)): JobPath<(String, String, String)>,
    QueryOf(q): QueryOf<SetQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    super::claims::admit_job(&state, &headers, &ns, &uid, Access::ReadStaged).await?;
    let rel = rel_path(&path)?;
    get_file(&state, &ns, &uid, ArtifactKind::Inputs, &rel, q.set.as_deref()).await
}

pub(super) async fn put_input_file(
    State(state): State<AppState>,
    JobPath((ns, uid, path)): JobPath<(String, String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    admit(&state, req.headers(), &ns, &uid, Access::Stage).await?;
    let rel = rel_path(&path)?;
    let l = state.0.limits;
    let sp = spool(&state, req, l.max_file_bytes, "input file").await?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let mut files: Vec<SetFile> = match state.read_set(&ns, &uid, ArtifactKind::Inputs).await {
        Ok(set) => set.files.iter().filter(|f| f.path != rel.as_str()).cloned().collect(),
        Err(e) if e.status == StatusCode::NOT_FOUND => Vec::new(),
        Err(e) => return Err(e),
    };
    let new = SetFile { path: rel.as_str().into(), size: sp.len, digest: sp.digest.clone() };
    files.push(new.clone());
    check_work_set(files.iter().map(|f| (f.path.as_str(), f.size)), &l)?;
    let reference = state.reference(&ns, &uid, ArtifactKind::Inputs);
    {
        let _held = state.hold(sp.len).await;
        let file = sp.file.clone();
        let entry = SpoolEntry { path: new.path.clone(), offset: 0, size: sp.len, digest: sp.digest.clone() };
        let data = blocking(move || read_entry(&file, &entry)).await?;
        state.0.sets.push_set_blob(&reference, &data).await.map_err(oci_error)?;
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    let count = files.len();
    let annotations = BTreeMap::from([
        (ANNOTATION_JOB.to_string(), format!("{ns}/{uid}")),
        (ANNOTATION_KIND.to_string(), ArtifactKind::Inputs.as_str().to_string()),
    ]);
    let set_digest = state.0.sets.push_set_manifest(&reference, files, annotations).await.map_err(oci_error)?;
    state.forget(&reference);
    Ok(Json(json!({ "file": new, "setDigest": set_digest, "setFiles": count, "setBytes": total })).into_response())
}

pub(super) async fn put_inputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    req: Request,
) -> Result<Json<InputsManifest>, ApiError> {
    admit(&state, req.headers(), &ns, &uid, Access::Stage).await?;
    let l = state.0.limits;
    let sp = spool(&state, req, l.max_batch_body_bytes(), "inputs batch").await?;
    let file = sp.file.clone();
    let entries = blocking(move || {
        let entries = scan_tar(&file, l.max_files)?;
        check_work_set(entries.iter().map(|e| (e.path.as_str(), e.size)), &l)?;
        Ok(entries)
    })
    .await?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let mut files: Vec<SetFile> =
        entries.iter().map(|e| SetFile { path: e.path.clone(), size: e.size, digest: e.digest.clone() }).collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let digest = state.push_set(&ns, &uid, ArtifactKind::Inputs, sp.file, entries).await?;
    Ok(Json(InputsManifest { digest: Some(digest), files }))
}

pub(super) async fn put_outputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    super::claims::admit_job(&state, req.headers(), &ns, &uid, Access::WriteOutputs).await?;
    let l = state.0.limits;
    let sp = spool(&state, req, l.max_batch_body_bytes(), "outputs batch").await?;
    let file = sp.file.clone();
    let (job_ns, job_uid) = (ns.clone(), uid.clone());
    let (entries, manifest, manifest_digest) = blocking(move || check_outputs(&file, &l, &job_ns, &job_uid)).await?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let count = manifest.files.len();
    let bytes: u64 = manifest.files.iter().map(|f| f.size).sum();
    let set_digest = state.push_set(&ns, &uid, ArtifactKind::Outputs, sp.file, entries).await?;
    super::events::announce(&state, &ns, &uid);
    Ok(Json(json!({
        "manifestDigest": manifest_digest,
        "setDigest": set_digest,
        "files": count,
        "bytes": bytes,
        "skipped": manifest.skipped_total(),
        "complete": manifest.complete,
    }))
    .into_response())
}

/// The outputs batch rules: `manifest.json` present and about this job,
/// entries and manifest agreeing exactly, only `result/{result.json,
/// stdout,stderr}` and `work/...`, caps per category.
pub(super) fn check_outputs(
    file: &std::fs::File,
    l: &ArtifactLimits,
    ns: &str,
    uid: &str,
) -> Result<(Vec<SpoolEntry>, OutputManifest, String), ApiError> {
    let entries = scan_tar(file, l.max_files + 4)?;
    let m_entry = entries
        .iter()
        .find(|e| e.path == MANIFEST_PATH)
        .ok_or_else(|| ApiError::bad(ErrorCode::BadManifest, format!("the batch has no {MANIFEST_PATH}")))?;
    if m_entry.size > l.max_manifest_bytes {
        return Err(ApiError::too_large(ErrorCode::ManifestTooLarge, format!("{MANIFEST_PATH} is over {} bytes", l.max_manifest_bytes)));
    }
    let manifest_bytes = read_entry(file, m_entry)?;
    let manifest: OutputManifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| ApiError::bad(ErrorCode::BadManifest, format!("{MANIFEST_PATH}: {e}")))?;
    if manifest.schema_version != 1 {
        return Err(ApiError::bad(ErrorCode::BadManifest, format!("schemaVersion {} (this endpoint reads 1)", manifest.schema_version)));
    }
    if manifest.namespace != ns || manifest.uid != uid {
        return Err(ApiError::bad(ErrorCode::BadManifest, "the manifest names another job"));
    }
    if manifest.skipped.len() > l.max_skipped_listed {
        return Err(ApiError::bad(ErrorCode::BadManifest, format!("more than {} skipped files listed", l.max_skipped_listed)));
    }
    let listed: HashMap<&str, &SetFile> = manifest.files.iter().map(|f| (f.path.as_str(), f)).collect();
    if listed.len() != manifest.files.len() || listed.contains_key(MANIFEST_PATH) {
        return Err(ApiError::bad(ErrorCode::BadManifest, "the manifest lists a path twice"));
    }
    if entries.len() != manifest.files.len() + 1 {
        return Err(ApiError::bad(
            ErrorCode::ManifestMismatch,
            format!("the batch has {} files, the manifest lists {}", entries.len() - 1, manifest.files.len()),
        ));
    }
    let mut work = Vec::new();
    for e in entries.iter().filter(|e| e.path != MANIFEST_PATH) {
        let f = listed
            .get(e.path.as_str())
            .ok_or_else(|| ApiError::bad(ErrorCode::ManifestMismatch, format!("{} is not in the manifest", e.path)))?;
        if f.size != e.size || f.digest != e.digest {
            return Err(ApiError::bad(
                ErrorCode::ManifestMismatch,
                format!("{}: manifest says {} bytes {}, the batch has {} bytes {}", e.path, f.size, f.digest, e.size, e.digest),
            ));
        }
        if let Some(name) = e.path.strip_prefix(RESULT_PREFIX) {
            let cap = match name {
                "result.json" => l.max_result_bytes,
                "stdout" | "stderr" => l.max_stream_bytes,
                _ => {
                    return Err(ApiError::bad(ErrorCode::BadPath, format!("{}: result/ holds result.json, stdout and stderr only", e.path)))
                }
            };
            if e.size > cap {
                return Err(ApiError::too_large(ErrorCode::FileTooLarge, format!("{} is over {cap} bytes", e.path)));
            }
        } else if let Some(rel) = e.path.strip_prefix(WORK_PREFIX) {
            work.push((rel, e.size));
        } else {
            return Err(ApiError::bad(ErrorCode::BadPath, format!("{}: entries are result/..., work/... and {MANIFEST_PATH}", e.path)));
        }
    }
    check_work_set(work.iter().copied(), l)?;
    let digest = super::super::sha256_digest(&manifest_bytes);
    Ok((entries, manifest, digest))
}

pub(super) async fn get_outputs(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadOutputs).await?;
    let rel = RelPath::parse(MANIFEST_PATH).expect("static path");
    get_file(&state, &ns, &uid, ArtifactKind::Outputs, &rel, None).await
}

pub(super) async fn get_output_file(
    State(state): State<AppState>,
    JobPath((ns, uid, path)): JobPath<(String, String, String)>,
    QueryOf(q): QueryOf<SetQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::ReadOutputs).await?;
    let rel = rel_path(&path)?;
    get_file(&state, &ns, &uid, ArtifactKind::Outputs, &rel, q.set.as_deref()).await
}

pub(super) async fn delete_job(
    State(state): State<AppState>,
    JobPath((ns, uid)): JobPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit(&state, &headers, &ns, &uid, Access::Delete).await?;
    let _lock = state.lock(&ns, &uid).lock().await;
    let mut deleted = Vec::new();
    // Only a warm pod's uid has a claim and a key: other jobs skip those registry requests.
    let warm = crate::artifacts::is_warm_uid(&uid);
    for kind in ArtifactKind::ALL.into_iter().filter(|k| warm || !k.is_warm_only()) {
        let reference = state.reference(&ns, &uid, kind);
        state.forget(&reference);
        if state.0.sets.delete(&reference).await.map_err(oci_error)? {
            deleted.push(kind.as_str());
        }
    }
    // A warm uid's claim and key went with its tags.
    state.0.claims.forget(&ns, &uid);
    state.0.claim_keys.forget(&ns, &uid);
    Ok(Json(json!({ "deleted": deleted })).into_response())
}
