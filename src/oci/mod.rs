//! Skill packages and job file sets as OCI artifacts, pushed to and pulled
//! from any OCI distribution registry with `oci-client`.
//!
//! # Our skill artifact
//! An OCI image manifest (`application/vnd.oci.image.manifest.v1+json`):
//! - `artifactType`: [`SKILL_ARTIFACT_TYPE`]
//! - `config`: [`SKILL_CONFIG_MEDIA_TYPE`], a [`SkillConfig`] JSON
//! - one layer: [`SKILL_LAYER_MEDIA_TYPE`], the package from
//!   [`crate::core::package`], annotated `org.opencontainers.image.title`
//!   = `<name>.tar.gz`
//! - annotations: `org.opencontainers.image.title` = skill name,
//!   `org.opencontainers.image.description` when non-empty,
//!   `org.opencontainers.image.version` when given. No `created`: the same
//!   package and config always give the same manifest digest.
//!
//! # ToolHive skill artifacts (pull only)
//! Defined in `stacklok/toolhive-core`, `oci/skills/mediatypes.go` and
//! `oci/skills/packager.go`; read by `stacklok/toolhive`,
//! `pkg/skills/skillsvc/oci.go` (`extractOCIContent`). An OCI image index
//! with `artifactType` `dev.toolhive.skills.v1` (one manifest per platform,
//! linux/amd64 and linux/arm64, all sharing one layer), or a bare manifest
//! with the same `artifactType`; config is a plain OCI image config
//! (`application/vnd.oci.image.config.v1+json`) whose `config.Labels` carry
//! `dev.toolhive.skills.name`/`.description`/`.version`/`.files`...; the
//! first layer is `application/vnd.oci.image.layer.v1.tar+gzip` holding the
//! skill tree (`SKILL.md` at the root, regular files only). We take the
//! first index entry (as ToolHive does), check the layer like any package
//! and re-pack it into our deterministic form; the digest returned is the
//! one the reference resolved to (the index's, for an index).
//!
//! # Job file sets
//! `artifactType` [`JOB_FILES_ARTIFACT_TYPE`], the OCI empty config
//! (`application/vnd.oci.empty.v1+json`, `{}`), one
//! `application/octet-stream` layer per file, sorted by path, each with its
//! path in `org.opencontainers.image.title` (what `oras pull` expects).
//! Same caps as packages: 32 MiB per file, 128 MiB total, 2,000 files.
//! A set is pushed whole ([`Registry::push_blob_set`]) or file by file
//! ([`Registry::push_set_blob`] then [`Registry::push_set_manifest`], which
//! keeps only one file in memory), and read whole or file by file
//! ([`Registry::blob_set`] then [`Registry::pull_set_file`]).
//!
//! # Trust
//! Manifests are fetched with a bounded GET (cap [`OciLimits::max_manifest_bytes`])
//! and hashed: by digest, the hash must equal it; by tag, the hash is the
//! digest (compared with `Docker-Content-Digest` when sent). Blob sizes are
//! checked against the caps before any download and against the
//! descriptor while streaming; every blob's sha256 is checked against its
//! descriptor. Only sha256 digests are accepted.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::package::{self, FileEntry, Limits, PackageError};

/// `artifactType` of our skill manifests.
pub const SKILL_ARTIFACT_TYPE: &str = "application/vnd.skill-operator.skill.v1";
/// Media type of the [`SkillConfig`] blob.
pub const SKILL_CONFIG_MEDIA_TYPE: &str = "application/vnd.skill-operator.skill.config.v1+json";
/// Media type of the package layer.
pub const SKILL_LAYER_MEDIA_TYPE: &str = "application/vnd.skill-operator.skill.layer.v1.tar+gzip";
/// `artifactType` of job file sets.
pub const JOB_FILES_ARTIFACT_TYPE: &str = "application/vnd.skill-operator.job-files.v1";
/// Media type of one job file layer.
pub const JOB_FILE_MEDIA_TYPE: &str = "application/octet-stream";
/// ToolHive's skill `artifactType` (toolhive-core `oci/skills/mediatypes.go`).
pub const TOOLHIVE_ARTIFACT_TYPE: &str = "dev.toolhive.skills.v1";
/// ToolHive label keys in the OCI image config.
pub const TOOLHIVE_LABEL_NAME: &str = "dev.toolhive.skills.name";
pub const TOOLHIVE_LABEL_DESCRIPTION: &str = "dev.toolhive.skills.description";
pub const TOOLHIVE_LABEL_VERSION: &str = "dev.toolhive.skills.version";

pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_IMAGE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_GZIP_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const OCI_EMPTY_DIGEST: &str = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
pub const ANNOTATION_DESCRIPTION: &str = "org.opencontainers.image.description";
pub const ANNOTATION_VERSION: &str = "org.opencontainers.image.version";

/// Blobs uploaded or downloaded at once.
const CONCURRENCY: usize = 4;
/// A login (the `/v2/` challenge and any token) is reused this long:
/// oci-client keeps tokens at least 60 s unless they say otherwise, and a
/// job file set read file by file would otherwise log in once per file.
const LOGIN_REUSE: Duration = Duration::from_secs(20);

/// Caps on what a pull downloads, checked before and while downloading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OciLimits {
    /// A manifest or index body (distribution's own limit is 4 MiB).
    pub max_manifest_bytes: u64,
    /// The [`SkillConfig`] or ToolHive image config blob.
    pub max_config_bytes: u64,
    /// The compressed package layer: the 128 MiB content cap plus tar headers.
    pub max_package_bytes: u64,
    /// Entries of an index we will look at.
    pub max_index_entries: usize,
    /// File caps for package contents and job file sets.
    pub files: Limits,
}

impl OciLimits {
    pub const DEFAULT: OciLimits = OciLimits {
        max_manifest_bytes: 4 * 1024 * 1024,
        max_config_bytes: 1024 * 1024,
        max_package_bytes: package::MAX_TOTAL_BYTES + 8 * 1024 * 1024,
        max_index_entries: 32,
        files: Limits::DEFAULT,
    };
}

impl Default for OciLimits {
    fn default() -> Self {
        OciLimits::DEFAULT
    }
}

/// Registry credentials.
#[derive(Clone, Default)]
pub enum Auth {
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
    /// A ready bearer token (e.g. from a token service or a k8s secret).
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Anonymous => f.write_str("Anonymous"),
            Auth::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
            Auth::Bearer(_) => f.write_str("Bearer(***)"),
        }
    }
}

impl Auth {
    /// Credentials for `registry` (`host[:port]`) from a docker config JSON:
    /// a `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`
    /// (`{"auths": {...}}`) or an old `.dockercfg` (the map alone). Keys may
    /// carry a scheme or path (`https://index.docker.io/v1/`); Docker Hub's
    /// aliases match each other. `username`/`password` or `auth`
    /// (base64 `user:pass`) give Basic, `registrytoken` gives Bearer; no
    /// entry gives Anonymous.
    pub fn from_docker_config(json: &[u8], registry: &str) -> Result<Auth, OciError> {
        use base64::Engine as _;
        #[derive(Deserialize)]
        struct Entry {
            username: Option<String>,
            password: Option<String>,
            auth: Option<String>,
            registrytoken: Option<String>,
        }
        let invalid = |detail: String| OciError::InvalidConfig { detail: format!("docker config: {detail}") };
        let mut v: serde_json::Value = serde_json::from_slice(json).map_err(|e| invalid(e.to_string()))?;
        let auths = match v.get_mut("auths") {
            Some(a) => a.take(),
            None => v,
        };
        let auths: BTreeMap<String, Entry> = serde_json::from_value(auths).map_err(|e| invalid(e.to_string()))?;
        let host = |k: &str| {
            let k = k.split_once("://").map_or(k, |(_, rest)| rest);
            let k = k.split('/').next().unwrap_or(k);
            match k {
                "docker.io" | "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
                other => other.to_ascii_lowercase(),
            }
        };
        let want = host(registry);
        let Some(e) = auths.into_iter().find(|(k, _)| host(k) == want).map(|(_, e)| e) else {
            return Ok(Auth::Anonymous);
        };
        if let Some(t) = e.registrytoken.filter(|t| !t.is_empty()) {
            return Ok(Auth::Bearer(t));
        }
        if let (Some(username), Some(password)) = (e.username.clone(), e.password.clone()) {
            return Ok(Auth::Basic { username, password });
        }
        if let Some(a) = e.auth.filter(|a| !a.is_empty()) {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .map_err(|e| invalid(format!("auth for {registry} is not base64: {e}")))?;
            let pair = String::from_utf8(raw).map_err(|_| invalid(format!("auth for {registry} is not UTF-8")))?;
            let (username, password) = pair.split_once(':').ok_or_else(|| invalid(format!("auth for {registry} is not user:password")))?;
            return Ok(Auth::Basic { username: username.into(), password: password.into() });
        }
        Ok(Auth::Anonymous)
    }

    fn to_oci(&self) -> RegistryAuth {
        match self {
            Auth::Anonymous => RegistryAuth::Anonymous,
            Auth::Basic { username, password } => RegistryAuth::Basic(username.clone(), password.clone()),
            Auth::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        }
    }
}

/// How to talk to registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    pub auth: Auth,
    /// Registries (`host:port`, as written in references) reached over plain
    /// HTTP; every other registry is HTTPS.
    pub plain_http: Vec<String>,
    pub limits: OciLimits,
    /// Connect timeout; `None` for 10 s.
    pub connect_timeout: Option<Duration>,
}

impl RegistryOptions {
    /// Anonymous, plain HTTP to `registry` only (tests, loopback registries).
    pub fn plain_http(registry: impl Into<String>) -> Self {
        RegistryOptions { plain_http: vec![registry.into()], ..Default::default() }
    }
}

/// Metadata stored as the config blob of our skill artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SkillConfig {
    /// Always 1 for this format.
    pub schema_version: u32,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub file_count: usize,
    pub total_bytes: u64,
    /// Every file: path, size, sha256 (and `executable` when set), by path.
    pub files: Vec<FileEntry>,
}

impl SkillConfig {
    /// The config for `package`: counts and hashes are read from it.
    pub fn for_package(
        package: &[u8],
        name: impl Into<String>,
        description: impl Into<String>,
        version: Option<String>,
    ) -> Result<Self, PackageError> {
        let files = package::manifest(package)?;
        Ok(SkillConfig {
            schema_version: 1,
            name: name.into(),
            description: description.into(),
            version,
            file_count: files.len(),
            total_bytes: files.iter().map(|f| f.size).sum(),
            files,
        })
    }

    fn check_against(&self, files: &[FileEntry]) -> Result<(), OciError> {
        let mismatch = |detail: String| Err(OciError::ConfigMismatch { detail });
        if self.schema_version != 1 {
            return mismatch(format!("schemaVersion {} (this build reads 1)", self.schema_version));
        }
        if self.name.trim().is_empty() {
            return mismatch("empty skill name".into());
        }
        if self.file_count != files.len() || self.total_bytes != files.iter().map(|f| f.size).sum::<u64>() {
            return mismatch(format!(
                "config says {} files / {} bytes, package has {} / {}",
                self.file_count,
                self.total_bytes,
                files.len(),
                files.iter().map(|f| f.size).sum::<u64>()
            ));
        }
        if let Some((c, p)) = self.files.iter().zip(files).find(|(c, p)| c != p) {
            return mismatch(format!("file {} differs from package file {}", c.path, p.path));
        }
        if self.files.len() != files.len() {
            return mismatch("file lists differ in length".into());
        }
        Ok(())
    }
}

/// Which format a pulled skill came in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactFormat {
    /// Our own ([`SKILL_ARTIFACT_TYPE`]); the package bytes are the layer.
    SkillOperator,
    /// ToolHive's (`dev.toolhive.skills.v1`); the package bytes are its
    /// layer re-packed. `manifest_digest` is the platform manifest used.
    ToolHive { manifest_digest: String },
}

/// A pulled skill.
#[derive(Debug, Clone)]
pub struct PulledSkill {
    /// `sha256:…` the reference resolved to (pin this).
    pub digest: String,
    /// A package as made by [`crate::core::package`].
    pub package: Vec<u8>,
    pub config: SkillConfig,
    pub format: ArtifactFormat,
    /// The (platform) manifest's annotations.
    pub annotations: BTreeMap<String, String>,
}

/// One file of a job file set, as its manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetFile {
    /// Relative `/`-separated path (the layer's `org.opencontainers.image.title`).
    pub path: String,
    pub size: u64,
    /// `sha256:<hex>` of the content.
    pub digest: String,
}

impl SetFile {
    fn descriptor(&self) -> OciDescriptor {
        OciDescriptor {
            media_type: JOB_FILE_MEDIA_TYPE.into(),
            digest: self.digest.clone(),
            size: i64::try_from(self.size).unwrap_or(i64::MAX),
            annotations: Some(BTreeMap::from([(ANNOTATION_TITLE.to_string(), self.path.clone())])),
            ..Default::default()
        }
    }
}

/// A job file set's manifest, read by [`Registry::blob_set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobSet {
    /// `sha256:…` of the manifest.
    pub digest: String,
    /// Sorted by path.
    pub files: Vec<SetFile>,
    pub annotations: BTreeMap<String, String>,
}

/// Why a push or pull failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("invalid reference {reference:?}: {reason}; expected host[:port]/repository[:tag|@sha256:<hex>]")]
    InvalidReference { reference: String, reason: String },
    #[error("cannot reach registry {registry}: {detail}; check the address and port and that the registry is running")]
    Unreachable { registry: String, detail: String },
    #[error("registry {registry} refused access: {detail}; check the credentials and that they may read/write this repository")]
    Auth { registry: String, detail: String },
    #[error("{reference} not found in the registry; check the repository name and tag")]
    NotFound { reference: String },
    #[error("registry error for {reference}: {detail}")]
    Registry { reference: String, detail: String },
    #[error("{what} is {size} bytes, over the {limit}-byte cap; refusing to download it")]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error("{what} ({digest}): registry sent {actual} bytes where the descriptor says {expected}")]
    SizeMismatch { what: String, digest: String, expected: u64, actual: u64 },
    #[error("{what}: content hashes to {actual}, expected {expected}; the registry's copy is corrupt or was tampered with")]
    DigestMismatch { what: String, expected: String, actual: String },
    #[error("unsupported digest {digest:?}: only sha256:<64 hex> is accepted")]
    UnsupportedDigest { digest: String },
    #[error("{reference} is not a skill artifact (artifactType {artifact_type:?}): {detail}")]
    UnsupportedArtifact { reference: String, artifact_type: String, detail: String },
    #[error("invalid manifest for {reference}: {detail}")]
    InvalidManifest { reference: String, detail: String },
    #[error("invalid skill config: {detail}")]
    InvalidConfig { detail: String },
    #[error("skill config does not match the package: {detail}")]
    ConfigMismatch { detail: String },
    #[error(transparent)]
    Package(#[from] PackageError),
}

type Result<T, E = OciError> = std::result::Result<T, E>;

/// The manifest or index JSON fields we read (unknown fields ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnyManifest {
    schema_version: Option<u32>,
    media_type: Option<String>,
    artifact_type: Option<String>,
    config: Option<OciDescriptor>,
    #[serde(default)]
    layers: Vec<OciDescriptor>,
    manifests: Option<Vec<OciDescriptor>>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl AnyManifest {
    fn is_index(&self) -> bool {
        matches!(self.media_type.as_deref(), Some(OCI_INDEX_MEDIA_TYPE | DOCKER_LIST_MEDIA_TYPE))
            || (self.media_type.is_none() && self.manifests.is_some())
    }
}

/// (registry, repository, push): a login's scope; remembered with when it
/// happened and the bearer token got.
type LoginKey = (String, String, bool);

/// A client for one set of [`RegistryOptions`].
pub struct Registry {
    client: Client,
    http: reqwest::Client,
    opts: RegistryOptions,
    logins: std::sync::Mutex<BTreeMap<LoginKey, (std::time::Instant, Option<String>)>>,
    /// One upload per blob digest at a time (striped): the distribution
    /// registry refuses a manifest when two uploads of one blob race
    /// (`DIGEST_INVALID`, then `MANIFEST_BLOB_UNKNOWN`), which a burst of
    /// jobs staging the same package triggered.
    uploads: Vec<tokio::sync::Mutex<()>>,
}

const UPLOAD_STRIPES: usize = 64;

impl Registry {
    pub fn new(opts: RegistryOptions) -> Self {
        install_crypto_provider();
        let connect = opts.connect_timeout.unwrap_or(Duration::from_secs(10));
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(opts.plain_http.clone()),
            connect_timeout: Some(connect),
            read_timeout: Some(Duration::from_secs(120)),
            max_concurrent_upload: CONCURRENCY,
            max_concurrent_download: CONCURRENCY,
            ..Default::default()
        };
        let http = reqwest::Client::builder()
            .connect_timeout(connect)
            .read_timeout(Duration::from_secs(120))
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .expect("reqwest client with static settings");
        Registry {
            client: Client::new(config),
            http,
            opts,
            logins: Default::default(),
            uploads: (0..UPLOAD_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    pub fn limits(&self) -> &OciLimits {
        &self.opts.limits
    }

    // -- skills -------------------------------------------------------------

    /// Pushes a package with its config and returns the manifest digest
    /// (`sha256:…`). The config must describe exactly this package
    /// ([`SkillConfig::for_package`] makes one).
    pub async fn push(&self, reference: &str, package: &[u8], config: &SkillConfig) -> Result<String> {
        self.push_annotated(reference, package, config, BTreeMap::new()).await
    }

    /// [`Registry::push`] with extra manifest annotations. Blobs depend only
    /// on the package and config, so two pushes that differ only here share
    /// them and the second uploads nothing.
    pub async fn push_annotated(
        &self,
        reference: &str,
        package: &[u8],
        config: &SkillConfig,
        extra: BTreeMap<String, String>,
    ) -> Result<String> {
        let limits = self.opts.limits.files;
        let owned = package.to_vec();
        let files = blocking(move || package::manifest_with(&owned, &limits)).await?;
        config.check_against(&files)?;
        self.push_checked(reference, package, config, extra).await
    }

    /// [`Registry::push_annotated`] for a package whose `config` was already
    /// checked against it (by this process, for the same sha256): a burst of
    /// jobs of one package unpacks it once, not once per job.
    pub async fn push_checked(
        &self,
        reference: &str,
        package: &[u8],
        config: &SkillConfig,
        extra: BTreeMap<String, String>,
    ) -> Result<String> {
        let r = parse_ref(reference)?;
        if package.len() as u64 > self.opts.limits.max_package_bytes {
            return Err(OciError::TooLarge {
                what: "package".into(),
                size: package.len() as u64,
                limit: self.opts.limits.max_package_bytes,
            });
        }
        let config_bytes = serde_json::to_vec(config).expect("SkillConfig serializes");
        self.authenticate(&r, RegistryOperation::Push).await?;

        let layer = descriptor(SKILL_LAYER_MEDIA_TYPE, package, Some(format!("{}.tar.gz", config.name)));
        let cfg = descriptor(SKILL_CONFIG_MEDIA_TYPE, &config_bytes, None);
        self.upload(&r, package, &layer.digest).await?;
        self.upload(&r, &config_bytes, &cfg.digest).await?;

        let mut annotations = BTreeMap::new();
        annotations.insert(ANNOTATION_TITLE.to_string(), config.name.clone());
        if !config.description.is_empty() {
            annotations.insert(ANNOTATION_DESCRIPTION.to_string(), config.description.clone());
        }
        if let Some(v) = &config.version {
            annotations.insert(ANNOTATION_VERSION.to_string(), v.clone());
        }
        annotations.extend(extra);
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
            config: cfg,
            layers: vec![layer],
            subject: None,
            artifact_type: Some(SKILL_ARTIFACT_TYPE.into()),
            annotations: Some(annotations),
        };
        self.put_manifest(&r, &manifest).await
    }

    /// Pulls a skill by tag or digest: ours, or ToolHive's (re-packed). An
    /// image index is followed to its first manifest (ToolHive's layout; its
    /// platform manifests share one layer), and the artifact type is the
    /// manifest's, else the index's.
    pub async fn pull(&self, reference: &str) -> Result<PulledSkill> {
        let r = parse_ref(reference)?;
        let token = self.authenticate(&r, RegistryOperation::Pull).await?;
        let (body, digest) = self.fetch_manifest(&r, token.as_deref()).await?;
        let top = parse_manifest(reference, &body)?;

        let (m, mr, manifest_digest) = if top.is_index() {
            let entries = top.manifests.as_deref().unwrap_or_default();
            if entries.len() > self.opts.limits.max_index_entries {
                return Err(OciError::TooLarge {
                    what: "index".into(),
                    size: entries.len() as u64,
                    limit: self.opts.limits.max_index_entries as u64,
                });
            }
            let first = entries
                .first()
                .ok_or_else(|| OciError::InvalidManifest { reference: reference.into(), detail: "index has no manifests".into() })?;
            cap("manifest", first, self.opts.limits.max_manifest_bytes)?;
            let mr = r.clone_with_digest(first.digest.clone());
            let (mbody, mdigest) = self.fetch_manifest(&mr, token.as_deref()).await?;
            let mut m = parse_manifest(reference, &mbody)?;
            if m.is_index() {
                return Err(OciError::InvalidManifest { reference: reference.into(), detail: "nested index".into() });
            }
            if m.artifact_type.is_none() {
                m.artifact_type = top.artifact_type.clone();
            }
            (m, mr, mdigest)
        } else {
            (top, r.clone(), digest.clone())
        };

        match m.artifact_type.as_deref() {
            Some(SKILL_ARTIFACT_TYPE) => {
                let (package, config) = self.read_ours(reference, &mr, &m).await?;
                Ok(PulledSkill { digest, package, config, format: ArtifactFormat::SkillOperator, annotations: m.annotations.clone() })
            }
            Some(TOOLHIVE_ARTIFACT_TYPE) => {
                let (package, config) = self.read_toolhive(reference, &mr, &m).await?;
                Ok(PulledSkill {
                    digest,
                    package,
                    config,
                    format: ArtifactFormat::ToolHive { manifest_digest },
                    annotations: m.annotations.clone(),
                })
            }
            other => Err(OciError::UnsupportedArtifact {
                reference: reference.into(),
                artifact_type: other.unwrap_or("").into(),
                detail: if other == Some(JOB_FILES_ARTIFACT_TYPE) {
                    "this is a job file set; use pull_blob_set".into()
                } else {
                    format!("expected {SKILL_ARTIFACT_TYPE} or {TOOLHIVE_ARTIFACT_TYPE}")
                },
            }),
        }
    }

    /// Resolves a tag (or checks a digest) to the manifest digest.
    pub async fn resolve(&self, reference: &str) -> Result<String> {
        let r = parse_ref(reference)?;
        let token = self.authenticate(&r, RegistryOperation::Pull).await?;
        Ok(self.fetch_manifest(&r, token.as_deref()).await?.1)
    }

    async fn read_ours(&self, reference: &str, r: &Reference, m: &AnyManifest) -> Result<(Vec<u8>, SkillConfig)> {
        let invalid = |detail: String| OciError::InvalidManifest { reference: reference.into(), detail };
        let cfg = m.config.as_ref().ok_or_else(|| invalid("no config".into()))?;
        if cfg.media_type != SKILL_CONFIG_MEDIA_TYPE {
            return Err(invalid(format!("config media type {:?}, expected {SKILL_CONFIG_MEDIA_TYPE}", cfg.media_type)));
        }
        let [layer] = m.layers.as_slice() else {
            return Err(invalid(format!("{} layers, expected exactly 1", m.layers.len())));
        };
        if layer.media_type != SKILL_LAYER_MEDIA_TYPE {
            return Err(invalid(format!("layer media type {:?}, expected {SKILL_LAYER_MEDIA_TYPE}", layer.media_type)));
        }
        // Both caps before either download.
        let lim = &self.opts.limits;
        cap("config", cfg, lim.max_config_bytes)?;
        cap("package layer", layer, lim.max_package_bytes)?;
        let config_bytes = self.fetch_blob(r, cfg, "config").await?;
        let config: SkillConfig = serde_json::from_slice(&config_bytes).map_err(|e| OciError::InvalidConfig { detail: e.to_string() })?;
        let package = self.fetch_blob(r, layer, "package layer").await?;
        let limits = lim.files;
        let (package, files) = blocking(move || package::manifest_with(&package, &limits).map(|f| (package, f))).await?;
        config.check_against(&files)?;
        Ok((package, config))
    }

    async fn read_toolhive(&self, reference: &str, r: &Reference, m: &AnyManifest) -> Result<(Vec<u8>, SkillConfig)> {
        let invalid = |detail: String| OciError::InvalidManifest { reference: reference.into(), detail };
        let cfg = m.config.as_ref().ok_or_else(|| invalid("no config".into()))?;
        if cfg.media_type != OCI_IMAGE_CONFIG_MEDIA_TYPE {
            return Err(invalid(format!("ToolHive config media type {:?}, expected {OCI_IMAGE_CONFIG_MEDIA_TYPE}", cfg.media_type)));
        }
        let layer = m.layers.first().ok_or_else(|| invalid("no layers".into()))?;
        if layer.media_type != OCI_LAYER_GZIP_MEDIA_TYPE {
            return Err(invalid(format!("ToolHive layer media type {:?}, expected {OCI_LAYER_GZIP_MEDIA_TYPE}", layer.media_type)));
        }
        let lim = &self.opts.limits;
        cap("config", cfg, lim.max_config_bytes)?;
        cap("skill layer", layer, lim.max_package_bytes)?;
        let config_bytes = self.fetch_blob(r, cfg, "config").await?;

        #[derive(Deserialize)]
        struct ImageConfig {
            config: Option<Inner>,
        }
        #[derive(Deserialize)]
        struct Inner {
            #[serde(rename = "Labels")]
            labels: Option<BTreeMap<String, String>>,
        }
        let img: ImageConfig =
            serde_json::from_slice(&config_bytes).map_err(|e| OciError::InvalidConfig { detail: format!("ToolHive image config: {e}") })?;
        let labels = img.config.and_then(|c| c.labels).unwrap_or_default();
        let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
        // Labels first, manifest annotations (same keys) as fallback.
        let name = Some(label(TOOLHIVE_LABEL_NAME))
            .filter(|s| !s.is_empty())
            .or_else(|| m.annotations.get(TOOLHIVE_LABEL_NAME).cloned())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| OciError::InvalidConfig { detail: format!("ToolHive config has no {TOOLHIVE_LABEL_NAME} label") })?;
        let version = Some(label(TOOLHIVE_LABEL_VERSION)).filter(|s| !s.is_empty());

        let layer_bytes = self.fetch_blob(r, layer, "skill layer").await?;
        let limits = lim.files;
        let description = label(TOOLHIVE_LABEL_DESCRIPTION);
        blocking(move || {
            let package = package::build_from_tarball(&layer_bytes, &limits)?;
            let config = SkillConfig::for_package(&package, name, description, version)?;
            Ok((package, config))
        })
        .await
    }

    // -- job file sets ------------------------------------------------------

    /// Pushes files (path, bytes) as a job file set; returns the manifest
    /// digest. Paths follow the package path rules; caps are checked before
    /// anything is uploaded.
    pub async fn push_blob_set(&self, reference: &str, mut files: Vec<(String, Vec<u8>)>) -> Result<String> {
        let r = parse_ref(reference)?;
        package::check_file_set(files.iter().map(|(p, d)| (p.as_str(), d.len() as u64)), &self.opts.limits.files)?;
        files.sort_by(|a, b| a.0.cmp(&b.0));
        self.authenticate(&r, RegistryOperation::Push).await?;

        let layers: Vec<OciDescriptor> = files.iter().map(|(p, d)| descriptor(JOB_FILE_MEDIA_TYPE, d, Some(p.clone()))).collect();
        let mut unique: BTreeMap<&str, &[u8]> = BTreeMap::new();
        for (l, (_, d)) in layers.iter().zip(&files) {
            unique.insert(&l.digest, d);
        }
        unique.insert(OCI_EMPTY_DIGEST, b"{}");
        let uploads = futures::stream::iter(unique)
            .map(|(digest, data)| {
                let r = &r;
                async move { self.upload(r, data, digest).await }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        uploads.into_iter().collect::<Result<Vec<_>>>()?;

        self.put_manifest(&r, &file_set_manifest(layers, BTreeMap::new())).await
    }

    /// Pulls a job file set: (manifest digest, files sorted by path). Every
    /// path and size is checked from the manifest before any download.
    pub async fn pull_blob_set(&self, reference: &str) -> Result<(String, Vec<(String, Vec<u8>)>)> {
        let r = parse_ref(reference)?;
        let set = self.blob_set(reference).await?;
        let fetched = futures::stream::iter(set.files)
            .map(|f| {
                let r = &r;
                async move {
                    let data = self.fetch_blob(r, &f.descriptor(), &format!("job file {}", f.path)).await?;
                    Ok::<_, OciError>((f.path, data))
                }
            })
            .buffered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let mut files = fetched.into_iter().collect::<Result<Vec<_>>>()?;
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((set.digest, files))
    }

    /// Reads a job file set's manifest without downloading any file: the
    /// same checks as [`Registry::pull_blob_set`] (artifact type, titles,
    /// sha256 digests, path rules, caps). Files sorted by path.
    pub async fn blob_set(&self, reference: &str) -> Result<BlobSet> {
        let r = parse_ref(reference)?;
        let token = self.authenticate(&r, RegistryOperation::Pull).await?;
        let (body, digest) = self.fetch_manifest(&r, token.as_deref()).await?;
        let m = parse_manifest(reference, &body)?;
        let artifact_type = m.artifact_type.clone().unwrap_or_default();
        if m.is_index() || artifact_type != JOB_FILES_ARTIFACT_TYPE {
            return Err(OciError::UnsupportedArtifact {
                reference: reference.into(),
                artifact_type,
                detail: format!("expected a job file set ({JOB_FILES_ARTIFACT_TYPE})"),
            });
        }
        let lim = &self.opts.limits.files;
        if m.layers.len() > lim.max_files {
            return Err(PackageError::TooManyFiles { limit: lim.max_files }.into());
        }
        let mut files = Vec::with_capacity(m.layers.len());
        for l in &m.layers {
            let path = l.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TITLE)).cloned().ok_or_else(|| OciError::InvalidManifest {
                reference: reference.into(),
                detail: format!("layer {} has no {ANNOTATION_TITLE} annotation", l.digest),
            })?;
            check_digest(&l.digest)?;
            let size = u64::try_from(l.size)
                .map_err(|_| OciError::InvalidManifest { reference: reference.into(), detail: "negative size".into() })?;
            files.push(SetFile { path, size, digest: l.digest.clone() });
        }
        package::check_file_set(files.iter().map(|f| (f.path.as_str(), f.size)), lim)?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(BlobSet { digest, files, annotations: m.annotations })
    }

    /// Downloads one file of a job file set (as listed by
    /// [`Registry::blob_set`]): its size is capped by the descriptor and its
    /// sha256 checked against it.
    pub async fn pull_set_file(&self, reference: &str, file: &SetFile) -> Result<Vec<u8>> {
        let r = parse_ref(reference)?;
        let lim = &self.opts.limits.files;
        if file.size > lim.max_file_bytes {
            return Err(OciError::TooLarge { what: format!("job file {}", file.path), size: file.size, limit: lim.max_file_bytes });
        }
        self.authenticate(&r, RegistryOperation::Pull).await?;
        self.fetch_blob(&r, &file.descriptor(), &format!("job file {}", file.path)).await
    }

    /// Uploads one blob into the reference's repository (skipped when the
    /// registry has it already) and returns its digest; for building a job
    /// file set file by file with [`Registry::push_set_manifest`].
    pub async fn push_set_blob(&self, reference: &str, data: &[u8]) -> Result<String> {
        let r = parse_ref(reference)?;
        let lim = &self.opts.limits.files;
        if data.len() as u64 > lim.max_file_bytes {
            return Err(OciError::TooLarge { what: "job file".into(), size: data.len() as u64, limit: lim.max_file_bytes });
        }
        self.authenticate(&r, RegistryOperation::Push).await?;
        let digest = sha256_digest(data);
        self.upload(&r, data, &digest).await?;
        Ok(digest)
    }

    /// Writes a job file set manifest over blobs already pushed (with
    /// [`Registry::push_set_blob`]); returns the manifest digest. Paths and
    /// caps are checked as in [`Registry::push_blob_set`]. `annotations`
    /// go on the manifest: distinct annotations keep two sets with the same
    /// files from sharing one manifest (and one fate on delete).
    pub async fn push_set_manifest(
        &self,
        reference: &str,
        mut files: Vec<SetFile>,
        annotations: BTreeMap<String, String>,
    ) -> Result<String> {
        let r = parse_ref(reference)?;
        package::check_file_set(files.iter().map(|f| (f.path.as_str(), f.size)), &self.opts.limits.files)?;
        for f in &files {
            check_digest(&f.digest)?;
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        self.authenticate(&r, RegistryOperation::Push).await?;
        self.upload(&r, b"{}", OCI_EMPTY_DIGEST).await?;
        self.put_manifest(&r, &file_set_manifest(files.iter().map(SetFile::descriptor).collect(), annotations)).await
    }

    /// Deletes the manifest a reference resolves to (by digest, which
    /// distribution requires; every tag on that manifest goes with it).
    /// `Ok(false)` when there is nothing to delete. Blobs stay until the
    /// registry's garbage collection runs. The registry must allow deletes
    /// (distribution: `storage.delete.enabled: true`).
    pub async fn delete(&self, reference: &str) -> Result<bool> {
        let r = parse_ref(reference)?;
        let token = self.authenticate(&r, RegistryOperation::Push).await?;
        let digest = match self.fetch_manifest(&r, token.as_deref()).await {
            Ok((_, d)) => d,
            Err(OciError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let registry = r.resolve_registry().to_string();
        let scheme = if self.opts.plain_http.iter().any(|h| h == &registry) { "http" } else { "https" };
        let url = format!("{scheme}://{registry}/v2/{}/manifests/{digest}", r.repository());
        let mut req = self.http.delete(&url);
        match (token.as_deref(), &self.opts.auth) {
            (Some(t), _) => req = req.bearer_auth(t),
            (None, Auth::Basic { username, password }) => req = req.basic_auth(username, Some(password)),
            (None, _) => {}
        }
        let resp = req.send().await.map_err(|e| map_reqwest_error(&r, e))?;
        let status = resp.status();
        match status {
            s if s.is_success() => Ok(true),
            reqwest::StatusCode::NOT_FOUND => Ok(false),
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
                Err(OciError::Auth { registry, detail: format!("HTTP {status} on DELETE {url}") })
            }
            reqwest::StatusCode::METHOD_NOT_ALLOWED => Err(OciError::Registry {
                reference: r.whole(),
                detail: "the registry does not allow deletes (distribution: set storage.delete.enabled: true)".into(),
            }),
            _ => Err(OciError::Registry { reference: r.whole(), detail: format!("HTTP {status} on DELETE {url}") }),
        }
    }

    // -- plumbing -----------------------------------------------------------

    /// Logs in: asks `/v2/` and, when the registry answers with a bearer
    /// challenge, gets a token (oci-client caches it for blob calls; the
    /// manifest GET gets it passed). Reused for [`LOGIN_REUSE`] per
    /// repository and operation; a registry that went down is still noticed
    /// by the request that follows.
    async fn authenticate(&self, r: &Reference, op: RegistryOperation) -> Result<Option<String>> {
        let key = (r.resolve_registry().to_string(), r.repository().to_string(), matches!(op, RegistryOperation::Push));
        if let Some((at, token)) = self.logins.lock().unwrap().get(&key) {
            if at.elapsed() < LOGIN_REUSE {
                return Ok(token.clone());
            }
        }
        let token = self.client.auth(r, &self.opts.auth.to_oci(), op).await.map_err(|e| map_oci_error(r, e))?;
        self.logins.lock().unwrap().insert(key, (std::time::Instant::now(), token.clone()));
        Ok(token)
    }

    async fn upload(&self, r: &Reference, data: &[u8], digest: &str) -> Result<()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&(r.registry(), r.repository(), digest), &mut h);
        let _one_at_a_time = self.uploads[(std::hash::Hasher::finish(&h) as usize) % UPLOAD_STRIPES].lock().await;
        match self.client.blob_exists(r, digest).await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, digest, "blob HEAD failed; uploading"),
        }
        self.client.push_blob(r, data.to_vec(), digest).await.map(drop).map_err(|e| map_oci_error(r, e))
    }

    async fn put_manifest(&self, r: &Reference, m: &OciImageManifest) -> Result<String> {
        let body = serde_json::to_vec(m).expect("manifest serializes");
        let digest = sha256_digest(&body);
        self.client
            .push_manifest_raw(r, body, OCI_MANIFEST_MEDIA_TYPE.parse().expect("static header value"))
            .await
            .map_err(|e| map_oci_error(r, e))?;
        tracing::debug!(reference = %r, %digest, "pushed manifest");
        Ok(digest)
    }

    /// GETs a manifest with a byte cap and returns (body, digest). The
    /// digest is computed from the body, and must equal the reference's
    /// digest when it has one.
    async fn fetch_manifest(&self, r: &Reference, token: Option<&str>) -> Result<(Vec<u8>, String)> {
        let registry = r.resolve_registry().to_string();
        let scheme = if self.opts.plain_http.iter().any(|h| h == &registry) { "http" } else { "https" };
        let target = r.digest().or(r.tag()).unwrap_or("latest");
        if let Some(d) = r.digest() {
            check_digest(d)?;
        }
        let url = format!("{scheme}://{registry}/v2/{}/manifests/{target}", r.repository());
        let accept = [OCI_MANIFEST_MEDIA_TYPE, OCI_INDEX_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, DOCKER_LIST_MEDIA_TYPE].join(", ");
        let mut req = self.http.get(&url).header(reqwest::header::ACCEPT, accept);
        // The bearer token `authenticate` got wins; else basic credentials;
        // else anonymous.
        match (token, &self.opts.auth) {
            (Some(t), _) => req = req.bearer_auth(t),
            (None, Auth::Basic { username, password }) => req = req.basic_auth(username, Some(password)),
            (None, _) => {}
        }
        let resp = req.send().await.map_err(|e| map_reqwest_error(r, e))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(OciError::NotFound { reference: r.whole() });
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(OciError::Auth { registry, detail: format!("HTTP {status} on {url}") });
        }
        if !status.is_success() {
            return Err(OciError::Registry { reference: r.whole(), detail: format!("HTTP {status} on {url}") });
        }
        let limit = self.opts.limits.max_manifest_bytes;
        if let Some(len) = resp.content_length() {
            if len > limit {
                return Err(OciError::TooLarge { what: "manifest".into(), size: len, limit });
            }
        }
        let header_digest = resp.headers().get("Docker-Content-Digest").and_then(|v| v.to_str().ok()).map(str::to_string);
        let mut body = Vec::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| map_reqwest_error(r, e))?;
            if body.len() as u64 + chunk.len() as u64 > limit {
                return Err(OciError::TooLarge { what: "manifest".into(), size: body.len() as u64 + chunk.len() as u64, limit });
            }
            body.extend_from_slice(&chunk);
        }
        let digest = sha256_digest(&body);
        let expected = r.digest().map(str::to_string).or(header_digest.filter(|h| h.starts_with("sha256:")));
        if let Some(expected) = expected {
            if expected != digest {
                return Err(OciError::DigestMismatch { what: format!("manifest {target}"), expected, actual: digest });
            }
        }
        Ok((body, digest))
    }

    /// Downloads one blob: the cap was checked by the caller against the
    /// descriptor; here the stream may not exceed the descriptor's size and
    /// must hash to its digest.
    async fn fetch_blob(&self, r: &Reference, desc: &OciDescriptor, what: &str) -> Result<Vec<u8>> {
        check_digest(&desc.digest)?;
        let expected = u64::try_from(desc.size)
            .map_err(|_| OciError::InvalidManifest { reference: r.whole(), detail: format!("{what} has a negative size") })?;
        let size_mismatch = |actual| OciError::SizeMismatch { what: what.into(), digest: desc.digest.clone(), expected, actual };
        let mut stream = self.client.pull_blob_stream(r, desc).await.map_err(|e| map_oci_error(r, e))?;
        if let Some(len) = stream.content_length {
            if len != expected {
                return Err(size_mismatch(len));
            }
        }
        let mut buf = Vec::with_capacity(expected.min(64 * 1024 * 1024) as usize);
        let mut hasher = Sha256::new();
        let mut failed = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    let total = buf.len() as u64 + bytes.len() as u64;
                    if total > expected {
                        return Err(size_mismatch(total));
                    }
                    hasher.update(&bytes);
                    buf.extend_from_slice(&bytes);
                }
                // oci-client's own digest check fails the stream's end; our
                // hash below gives the precise error then.
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if buf.len() as u64 == expected && actual != desc.digest {
            return Err(OciError::DigestMismatch { what: what.into(), expected: desc.digest.clone(), actual });
        }
        if let Some(e) = failed {
            return Err(OciError::Registry { reference: r.whole(), detail: format!("downloading {what}: {e}") });
        }
        if buf.len() as u64 != expected {
            return Err(size_mismatch(buf.len() as u64));
        }
        Ok(buf)
    }
}

/// The registry (`host[:port]`) a reference points at, as used for
/// [`RegistryOptions::plain_http`] and [`Auth::from_docker_config`].
pub fn registry_of(reference: &str) -> Result<String> {
    Ok(parse_ref(reference)?.resolve_registry().to_string())
}

/// reqwest is built without a crypto provider of its own (this crate uses
/// ring, like kube), so any reqwest client needs a process default: this
/// installs ring unless one is installed already. [`Registry::new`] calls
/// it; call it before building other reqwest clients.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Runs CPU-bound package work (inflating and hashing up to 128 MiB) off
/// the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, PackageError> + Send + 'static) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(OciError::from),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(OciError::Registry { reference: String::new(), detail: format!("package task cancelled: {e}") }),
    }
}

fn parse_ref(reference: &str) -> Result<Reference> {
    let r: Reference = reference
        .parse()
        .map_err(|e: oci_client::ParseError| OciError::InvalidReference { reference: reference.into(), reason: e.to_string() })?;
    if let Some(d) = r.digest() {
        check_digest(d)?;
    }
    Ok(r)
}

fn parse_manifest(reference: &str, body: &[u8]) -> Result<AnyManifest> {
    let m: AnyManifest =
        serde_json::from_slice(body).map_err(|e| OciError::InvalidManifest { reference: reference.into(), detail: e.to_string() })?;
    if m.schema_version != Some(2) {
        return Err(OciError::InvalidManifest {
            reference: reference.into(),
            detail: format!("schemaVersion {:?}, expected 2", m.schema_version),
        });
    }
    Ok(m)
}

fn check_digest(d: &str) -> Result<()> {
    match d.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => Ok(()),
        _ => Err(OciError::UnsupportedDigest { digest: d.into() }),
    }
}

fn cap(what: &str, d: &OciDescriptor, limit: u64) -> Result<()> {
    check_digest(&d.digest)?;
    let size = u64::try_from(d.size).unwrap_or(u64::MAX);
    if size > limit {
        return Err(OciError::TooLarge { what: format!("{what} {}", d.digest), size, limit });
    }
    Ok(())
}

fn sha256_digest(data: &[u8]) -> String {
    crate::core::package::digest(data)
}

/// A job file set's manifest: the empty config, one layer per file.
fn file_set_manifest(layers: Vec<OciDescriptor>, annotations: BTreeMap<String, String>) -> OciImageManifest {
    OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
        config: OciDescriptor { media_type: OCI_EMPTY_MEDIA_TYPE.into(), digest: OCI_EMPTY_DIGEST.into(), size: 2, ..Default::default() },
        layers,
        subject: None,
        artifact_type: Some(JOB_FILES_ARTIFACT_TYPE.into()),
        annotations: if annotations.is_empty() { None } else { Some(annotations) },
    }
}

fn descriptor(media_type: &str, data: &[u8], title: Option<String>) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.into(),
        digest: sha256_digest(data),
        size: data.len() as i64,
        annotations: title.map(|t| BTreeMap::from([(ANNOTATION_TITLE.to_string(), t)])),
        ..Default::default()
    }
}

fn map_reqwest_error(r: &Reference, e: reqwest::Error) -> OciError {
    if e.is_connect() || e.is_timeout() {
        OciError::Unreachable { registry: r.resolve_registry().into(), detail: error_chain(&e) }
    } else {
        OciError::Registry { reference: r.whole(), detail: error_chain(&e) }
    }
}

fn map_oci_error(r: &Reference, e: OciDistributionError) -> OciError {
    let registry = r.resolve_registry().to_string();
    match e {
        OciDistributionError::RequestError(re) => map_reqwest_error(r, re),
        OciDistributionError::AuthenticationFailure(detail) => OciError::Auth { registry, detail },
        OciDistributionError::UnauthorizedError { url } => OciError::Auth { registry, detail: format!("unauthorized: {url}") },
        OciDistributionError::ServerError { code: 404, .. } => OciError::NotFound { reference: r.whole() },
        OciDistributionError::ServerError { code: 401 | 403, url, message } => {
            OciError::Auth { registry, detail: format!("{url}: {message}") }
        }
        OciDistributionError::RegistryError { envelope, url } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(c, OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::BlobUnknown | OciErrorCode::NotFound)
            }) {
                OciError::NotFound { reference: r.whole() }
            } else if codes.iter().any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                OciError::Auth { registry, detail: format!("{url}: {envelope}") }
            } else {
                OciError::Registry { reference: r.whole(), detail: format!("{url}: {envelope}") }
            }
        }
        other => OciError::Registry { reference: r.whole(), detail: error_chain(&other) },
    }
}

/// An error and its sources in one line, each cause once.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let cs = c.to_string();
        if !s.contains(&cs) {
            s.push_str(": ");
            s.push_str(&cs);
        }
        src = c.source();
    }
    s
}
