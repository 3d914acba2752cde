//! Composing: a base image plus new layers, a patched config, pushed with
//! registry calls only. The `crane append` + `crane mutate` of this
//! project.
//!
//! # Flow
//! 1. Resolve the base ([`super::base`]): manifests and configs only.
//! 2. Per platform: config = base config with our `diff_ids` and `history`
//!    appended and `User`/`WorkingDir`/`Env`/`Labels`(/`Entrypoint`/`Cmd`)
//!    set; manifest = base layers + our layers, annotated.
//! 3. Blobs: every base layer made present in the target repository
//!    ([`Remote::ensure_base_blob`]: HEAD, mount, streamed copy), every new
//!    layer HEAD-then-upload from its spool file, configs likewise.
//! 4. Manifests by digest; an OCI index when the base was an index; the top
//!    one at the tag. Each is HEADed first and skipped when in place, so an
//!    unchanged compose writes nothing.
//! 5. The SBOM as an OCI 1.1 referrer of the result ([`super::sbom`]).
//!
//! # Media types: always OCI
//! A Docker schema 2 base is converted: the manifest, the config descriptor
//! and the layer descriptors get their OCI media types; no blob changes
//! (a Docker `rootfs.diff.tar.gzip` is byte for byte an OCI `tar+gzip`
//! layer, and the config JSON schema is the same). Why convert rather than
//! keep the base's: the annotations we must write (base digest, package
//! digest, lock digest) exist only in OCI manifests and indexes, the SBOM's
//! `subject` is OCI 1.1, and one format for every result means one code
//! path for every reader (containerd, CRI-O and skopeo all read OCI).
//! Docker foreign (Windows) and non-distributable layers are refused: they
//! cannot be mounted or copied.
//!
//! # Determinism
//! Every JSON document goes through [`super::json::canonical`]; history
//! entries carry a fixed `created` ([`FIXED_CREATED`] unless the caller
//! gives one); nothing reads the clock. Same base digest + same layers +
//! same patch + same annotations → same digest.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use oci_client::Reference;
use serde_json::{json, Map, Value};

use super::base::{self, BaseImage, BaseSpec, Platform, ResolvedBase, OCI_CONFIG};
use super::deps::Dependency;
use super::error::{ImageError, Result};
use super::json::{canonical, sha256_digest};
use super::layer::{Layer, LAYER_MEDIA_TYPE};
use super::limits::{DEFAULT_USER, FIXED_CREATED, UPLOAD_CONCURRENCY};
use super::remote::{parse_ref, Remote, UploadReport, OCI_INDEX, OCI_MANIFEST};
use super::sbom::{self, SbomRef};

/// `org.opencontainers.image.base.digest`.
pub const ANNOTATION_BASE_DIGEST: &str = "org.opencontainers.image.base.digest";
/// `org.opencontainers.image.base.name`.
pub const ANNOTATION_BASE_NAME: &str = "org.opencontainers.image.base.name";
/// The skill package's digest (what `SkillPackage.status.digest` pins).
pub const ANNOTATION_PACKAGE_DIGEST: &str = "dev.skill-operator.package.digest";
/// The dependency lock digest ([`super::deps::DepsReport::lock_digest`]).
pub const ANNOTATION_DEPS_LOCK_DIGEST: &str = "dev.skill-operator.deps.lock-digest";

const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// Changes to the base config (`config` section of the image config).
#[derive(Debug, Clone)]
pub struct ConfigPatch {
    /// `User`; [`DEFAULT_USER`] (`65532:65532`) by default. Must be numeric
    /// `uid[:gid]`, non-zero: Pod Security `restricted` needs `runAsNonRoot`
    /// to be checkable without reading `/etc/passwd`.
    pub user: String,
    pub working_dir: Option<String>,
    /// Set (replacing a base entry of the same name) in this order.
    pub env: Vec<(String, String)>,
    /// Merged over the base's labels.
    pub labels: BTreeMap<String, String>,
    /// Set `Entrypoint` (and drop the base `Cmd`, as Docker does, unless
    /// `cmd` is set too).
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
}

impl Default for ConfigPatch {
    fn default() -> Self {
        ConfigPatch { user: DEFAULT_USER.into(), working_dir: None, env: Vec::new(), labels: BTreeMap::new(), entrypoint: None, cmd: None }
    }
}

/// What the SBOM covers besides the new layers' files.
#[derive(Debug, Clone, Default)]
pub struct SbomInput {
    /// Installed dependencies ([`super::deps::DepsReport::dependencies`]).
    pub dependencies: Vec<Dependency>,
}

/// A compose request. Layers are borrowed: the caller keeps the spool
/// files (and can compose the same layers onto several bases).
#[derive(Debug, Clone)]
pub struct ComposeSpec<'a> {
    pub base: BaseSpec,
    /// Platforms to take from an index base ([`Platform::defaults`]).
    pub platforms: Vec<Platform>,
    /// `host[:port]/repository` to push to.
    pub repository: String,
    /// Tag for the result; `None` pushes by digest only.
    pub tag: Option<String>,
    /// New layers, bottom to top, applied to every platform.
    pub layers: Vec<&'a Layer>,
    pub config: ConfigPatch,
    pub package_digest: Option<String>,
    pub deps_lock_digest: Option<String>,
    /// Extra manifest (and index) annotations.
    pub annotations: BTreeMap<String, String>,
    /// Attach a CycloneDX SBOM of the new layers as a referrer.
    pub sbom: Option<SbomInput>,
    /// `created` of the appended history entries ([`FIXED_CREATED`]).
    pub created: String,
    /// Where the SBOM is spooled (`None`: the temp dir).
    pub spool_dir: Option<std::path::PathBuf>,
}

impl<'a> ComposeSpec<'a> {
    pub fn new(base: BaseSpec, repository: impl Into<String>) -> Self {
        ComposeSpec {
            base,
            platforms: Platform::defaults(),
            repository: repository.into(),
            tag: None,
            layers: Vec::new(),
            config: ConfigPatch::default(),
            package_digest: None,
            deps_lock_digest: None,
            annotations: BTreeMap::new(),
            sbom: None,
            created: FIXED_CREATED.into(),
            spool_dir: None,
        }
    }
}

/// One platform image of a result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComposedImage {
    pub platform: Platform,
    pub manifest_digest: String,
    pub config_digest: String,
    /// The base platform manifest it was built on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_manifest_digest: Option<String>,
}

/// A new layer as pushed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushedLayer {
    pub digest: String,
    pub diff_id: String,
    pub size: u64,
    pub created_by: String,
}

/// What [`compose`] made.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Composed {
    /// `host/repository@sha256:…`: what a Job's `image:` should say.
    pub reference: String,
    /// The top manifest's (or index's) digest.
    pub digest: String,
    /// [`OCI_INDEX`] or [`OCI_MANIFEST`].
    pub media_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_name: Option<String>,
    /// What the base reference resolved to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_digest: Option<String>,
    pub images: Vec<ComposedImage>,
    pub layers: Vec<PushedLayer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sbom: Option<SbomRef>,
    pub uploads: UploadReport,
}

/// Composes and pushes; see the module docs. `remote`'s counters become
/// the result's [`UploadReport`] (use one `Remote` per compose for a
/// per-compose count).
pub async fn compose(remote: &Remote, spec: &ComposeSpec<'_>) -> Result<Composed> {
    check_spec(spec)?;
    let target = parse_ref(&format!("{}:{}", spec.repository, spec.tag.as_deref().unwrap_or("latest")))?;
    let resolved = base::resolve(remote, &spec.base, &spec.platforms).await?;
    tracing::info!(base = ?resolved.name, platforms = resolved.images.len(), target = %spec.repository, "composing");

    // Documents first (pure), then blobs, then manifests bottom-up.
    let platform_docs: Vec<_> = resolved.images.iter().zip(documents(spec, &resolved)?).collect();

    // Base blobs, deduplicated across platforms (sizes from descriptors).
    let mut base_blobs: BTreeMap<String, u64> = BTreeMap::new();
    for image in &resolved.images {
        for l in &image.layers {
            if let (Some(d), Some(s)) = (l.get("digest").and_then(Value::as_str), l.get("size").and_then(Value::as_u64)) {
                base_blobs.insert(d.to_string(), s);
            }
        }
    }
    if let Some(source) = &resolved.reference {
        futures::stream::iter(base_blobs.iter())
            .map(|(digest, size)| remote.ensure_base_blob(&target, source, digest, *size))
            .buffer_unordered(UPLOAD_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
    }
    futures::stream::iter(spec.layers.iter())
        .map(|l| remote.ensure_file_blob(&target, l.path(), &l.digest, l.size))
        .buffer_unordered(UPLOAD_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    for (_, docs) in &platform_docs {
        remote.ensure_bytes_blob(&target, &docs.config).await?;
    }

    let mut images = Vec::new();
    let top_is_index = resolved.is_index;
    for (image, docs) in &platform_docs {
        let tag = if top_is_index { None } else { spec.tag.as_deref() };
        let digest = remote.ensure_manifest(&target, tag, &docs.manifest, OCI_MANIFEST).await?;
        images.push((
            ComposedImage {
                platform: image.platform.clone(),
                manifest_digest: digest,
                config_digest: docs.config_digest.clone(),
                base_manifest_digest: image.manifest_digest.clone(),
            },
            docs.manifest.len() as u64,
        ));
    }
    let (digest, media_type, size) = if top_is_index {
        let index = canonical(&index_json(&images, spec, &resolved));
        let digest = remote.ensure_manifest(&target, spec.tag.as_deref(), &index, OCI_INDEX).await?;
        (digest, OCI_INDEX, index.len() as u64)
    } else {
        let (img, size) = images.first().ok_or_else(|| ImageError::invalid("the base resolved to no image"))?;
        (img.manifest_digest.clone(), OCI_MANIFEST, *size)
    };

    let sbom = match &spec.sbom {
        None => None,
        Some(input) => {
            // Written to a spool file (its size grows with the file count);
            // a few MiB at most, so on this thread.
            let dir = spec.spool_dir.clone().unwrap_or_else(std::env::temp_dir);
            let doc = sbom::spool(&dir, &spec.repository, &digest, &spec.layers, &input.dependencies)?;
            Some(sbom::attach(remote, &target, media_type, &digest, size, &doc).await?)
        }
    };

    let reference = format!("{}@{digest}", spec.repository);
    tracing::info!(%reference, uploads = ?remote.report(), "composed");
    Ok(Composed {
        reference,
        digest,
        media_type: media_type.into(),
        tag: spec.tag.clone(),
        base_name: resolved.name.clone(),
        base_digest: resolved.digest.clone(),
        images: images.into_iter().map(|(i, _)| i).collect(),
        layers: spec
            .layers
            .iter()
            .map(|l| PushedLayer { digest: l.digest.clone(), diff_id: l.diff_id.clone(), size: l.size, created_by: l.created_by.clone() })
            .collect(),
        sbom,
        uploads: remote.report(),
    })
}

/// One platform's image config and manifest, as stored (canonical bytes).
pub(crate) struct PlatformDocs {
    pub config: Vec<u8>,
    pub config_digest: String,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
}

/// The config and manifest of every platform of `resolved`, in its order:
/// what [`compose`] pushes and what an image archive holds
/// ([`super::archive`]), so the two can never differ.
pub(crate) fn documents(spec: &ComposeSpec<'_>, resolved: &ResolvedBase) -> Result<Vec<PlatformDocs>> {
    resolved
        .images
        .iter()
        .map(|image| {
            let config = canonical(&patch_config(image, spec, resolved)?);
            let config_digest = sha256_digest(&config);
            let manifest = canonical(&manifest_json(image, spec, resolved, &config_digest, config.len() as u64)?);
            let manifest_digest = sha256_digest(&manifest);
            Ok(PlatformDocs { config, config_digest, manifest, manifest_digest })
        })
        .collect()
}

pub(crate) fn check_spec(spec: &ComposeSpec<'_>) -> Result<()> {
    let user = &spec.config.user;
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ok = match user.split_once(':') {
        Some((u, g)) => numeric(u) && numeric(g),
        None => numeric(user),
    };
    let uid_zero = user.split(':').next().and_then(|u| u.parse::<u64>().ok()) == Some(0);
    if !ok || uid_zero {
        return Err(ImageError::invalid(format!("user {user:?}: give a numeric non-root uid[:gid], e.g. {DEFAULT_USER}")));
    }
    if spec.repository.contains('@') || spec.repository.rsplit('/').next().is_some_and(|last| last.contains(':')) {
        return Err(ImageError::invalid(format!(
            "repository {:?}: give host/repository without tag or digest (the tag goes in `tag`)",
            spec.repository
        )));
    }
    for (k, _) in &spec.config.env {
        if k.is_empty() || k.contains('=') {
            return Err(ImageError::invalid(format!("environment variable name {k:?}")));
        }
    }
    for d in [&spec.package_digest, &spec.deps_lock_digest].into_iter().flatten() {
        super::remote::check_digest(d)?;
    }
    Ok(())
}

/// The provenance keys (base name and digest, package and lock digests)
/// plus the caller's extra annotations, for a manifest or the index.
fn annotations(spec: &ComposeSpec<'_>, resolved: &ResolvedBase, base_digest: Option<&str>) -> Map<String, Value> {
    let mut a = provenance(spec, resolved, base_digest);
    for (k, v) in &spec.annotations {
        a.insert(k.clone(), v.clone().into());
    }
    a
}

/// Base name and digest, package digest, lock digest: the keys that go
/// both into annotations and into the config's labels.
fn provenance(spec: &ComposeSpec<'_>, resolved: &ResolvedBase, base_digest: Option<&str>) -> Map<String, Value> {
    let mut a = Map::new();
    if let Some(n) = &resolved.name {
        a.insert(ANNOTATION_BASE_NAME.into(), n.clone().into());
    }
    if let Some(d) = base_digest {
        a.insert(ANNOTATION_BASE_DIGEST.into(), d.to_string().into());
    }
    if let Some(d) = &spec.package_digest {
        a.insert(ANNOTATION_PACKAGE_DIGEST.into(), d.clone().into());
    }
    if let Some(d) = &spec.deps_lock_digest {
        a.insert(ANNOTATION_DEPS_LOCK_DIGEST.into(), d.clone().into());
    }
    a
}

fn patch_config(image: &BaseImage, spec: &ComposeSpec<'_>, resolved: &ResolvedBase) -> Result<Value> {
    let bad = |detail: &str| ImageError::Base { reference: resolved.name.clone().unwrap_or_default(), detail: detail.into() };
    let mut config = image.config.clone();
    let obj = config.as_object_mut().ok_or_else(|| bad("config is not a JSON object"))?;

    let rootfs = obj.entry("rootfs").or_insert_with(|| json!({ "type": "layers", "diff_ids": [] }));
    let diff_ids = rootfs.get_mut("diff_ids").and_then(Value::as_array_mut).ok_or_else(|| bad("config has no rootfs.diff_ids"))?;
    diff_ids.extend(spec.layers.iter().map(|l| Value::String(l.diff_id.clone())));

    let history = obj.entry("history").or_insert_with(|| json!([]));
    let history = history.as_array_mut().ok_or_else(|| bad("config history is not a list"))?;
    for l in &spec.layers {
        history.push(json!({ "created": spec.created, "created_by": l.created_by, "comment": "skill-operator" }));
    }

    let section = obj.entry("config").or_insert_with(|| json!({}));
    if section.is_null() {
        *section = json!({});
    }
    let c = section.as_object_mut().ok_or_else(|| bad("config.config is not a JSON object"))?;
    let p = &spec.config;
    c.insert("User".into(), p.user.clone().into());
    if let Some(w) = &p.working_dir {
        c.insert("WorkingDir".into(), w.clone().into());
    }
    if !p.env.is_empty() {
        let mut env: Vec<String> = c
            .get("Env")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        for (k, v) in &p.env {
            let entry = format!("{k}={v}");
            match env.iter_mut().find(|e| e.split_once('=').map_or(e.as_str(), |(n, _)| n) == k) {
                Some(e) => *e = entry,
                None => env.push(entry),
            }
        }
        c.insert("Env".into(), env.into_iter().map(Value::String).collect::<Vec<_>>().into());
    }
    let mut labels: Map<String, Value> = c.get("Labels").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut ours = provenance(spec, resolved, resolved.digest.as_deref());
    ours.extend(p.labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))));
    labels.extend(ours);
    if !labels.is_empty() {
        c.insert("Labels".into(), Value::Object(labels));
    }
    if let Some(ep) = &p.entrypoint {
        c.insert("Entrypoint".into(), ep.clone().into());
        if p.cmd.is_none() {
            c.remove("Cmd");
        }
    }
    if let Some(cmd) = &p.cmd {
        c.insert("Cmd".into(), cmd.clone().into());
    }
    Ok(config)
}

/// A base layer descriptor with its OCI media type (see the module docs).
fn oci_layer(desc: &Value, resolved: &ResolvedBase) -> Result<Value> {
    let mt = desc.get("mediaType").and_then(Value::as_str).unwrap_or("");
    let new = match mt {
        DOCKER_LAYER_GZIP | LAYER_MEDIA_TYPE => LAYER_MEDIA_TYPE,
        OCI_LAYER_TAR | OCI_LAYER_ZSTD => mt,
        other => {
            return Err(ImageError::UnsupportedLayer { reference: resolved.name.clone().unwrap_or_default(), media_type: other.into() });
        }
    };
    if desc.get("urls").is_some() {
        return Err(ImageError::UnsupportedLayer {
            reference: resolved.name.clone().unwrap_or_default(),
            media_type: format!("{mt} with urls (non-distributable)"),
        });
    }
    let mut d = desc.clone();
    if let Some(o) = d.as_object_mut() {
        o.insert("mediaType".into(), new.into());
    }
    Ok(d)
}

fn manifest_json(
    image: &BaseImage,
    spec: &ComposeSpec<'_>,
    resolved: &ResolvedBase,
    config_digest: &str,
    config_size: u64,
) -> Result<Value> {
    let mut layers = Vec::with_capacity(image.layers.len() + spec.layers.len());
    for l in &image.layers {
        layers.push(oci_layer(l, resolved)?);
    }
    layers.extend(spec.layers.iter().map(|l| l.descriptor()));
    let mut m = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size },
        "layers": layers,
    });
    let a = annotations(spec, resolved, image.manifest_digest.as_deref());
    if let (false, Some(o)) = (a.is_empty(), m.as_object_mut()) {
        o.insert("annotations".into(), Value::Object(a));
    }
    Ok(m)
}

fn index_json(images: &[(ComposedImage, u64)], spec: &ComposeSpec<'_>, resolved: &ResolvedBase) -> Value {
    let manifests: Vec<Value> = images
        .iter()
        .map(|(i, size)| json!({ "mediaType": OCI_MANIFEST, "digest": i.manifest_digest, "size": size, "platform": i.platform.to_json() }))
        .collect();
    let mut m = json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests });
    let a = annotations(spec, resolved, resolved.digest.as_deref());
    if let (false, Some(o)) = (a.is_empty(), m.as_object_mut()) {
        o.insert("annotations".into(), Value::Object(a));
    }
    m
}

/// `host/repository` of a reference (no tag or digest).
pub fn repository_of(r: &Reference) -> String {
    format!("{}/{}", r.registry(), r.repository())
}
