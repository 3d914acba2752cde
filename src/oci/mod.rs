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

mod auth;
mod blob_set;
mod media;
pub mod publish;
pub mod reference;
mod skill;
mod tags;
mod wire;

pub use auth::*;
pub use blob_set::*;
pub use media::*;
pub use skill::*;
pub use tags::{MAX_TAGS, TAGS_PAGE};
use wire::*;
pub(crate) use wire::{check_digest, error_chain, map_oci_error, map_reqwest_error, parse_ref};

use std::collections::BTreeMap;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::Client;

use crate::core::package::{Limits, PackageError};

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
        max_manifest_bytes: crate::core::limits::STORE_MANIFEST_MAX_BYTES,
        max_config_bytes: 1024 * 1024,
        max_package_bytes: crate::core::limits::STORE_BLOB_MAX_BYTES,
        max_index_entries: 32,
        files: Limits::DEFAULT,
    };
}

impl Default for OciLimits {
    fn default() -> Self {
        OciLimits::DEFAULT
    }
}

/// How to talk to registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    pub auth: Auth,
    /// Credentials for particular registries (`host:port`, as written in
    /// references), used instead of `auth` there: the controller and
    /// gateway reach the artifact endpoint's built-in store with the operator
    /// credential while every other registry keeps its own.
    pub credentials: Vec<(String, Auth)>,
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
    #[error("cannot make an HTTP client: {detail} (check HTTP_PROXY/HTTPS_PROXY in the environment)")]
    Client { detail: String },
}

type Result<T, E = OciError> = std::result::Result<T, E>;

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

/// Whether an upload asks the repository for the blob first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upload {
    /// HEAD first, upload only what is missing: a re-push of content the
    /// registry likely has (the same package again, shared layers).
    IfMissing,
    /// Upload without asking: content that is almost surely new (a
    /// SkillSource's changed skill at a new commit).
    Always,
}

impl Registry {
    /// A client for `opts`. Fails only when the environment makes an HTTP
    /// client impossible (an unparsable proxy variable, say); a machine
    /// without a CA bundle gets a client that fails at its first TLS call.
    pub fn new(opts: RegistryOptions) -> Result<Self> {
        crate::tls::install_crypto_provider();
        let connect = opts.connect_timeout.unwrap_or(Duration::from_secs(10));
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(opts.plain_http.clone()),
            connect_timeout: Some(connect),
            read_timeout: Some(Duration::from_secs(120)),
            max_concurrent_upload: CONCURRENCY,
            max_concurrent_download: CONCURRENCY,
            // Packages are at most 32 MiB and already in memory: one POST and
            // one PUT per blob, not oci-client's default POST, PATCH, PUT.
            use_monolithic_push: true,
            ..Default::default()
        };
        let http = crate::tls::reqwest_builder()
            .connect_timeout(connect)
            .read_timeout(Duration::from_secs(120))
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .map_err(|e| OciError::Client { detail: error_chain(&e) })?;
        let client = Client::try_from(crate::tls::oci_client_config(config)).map_err(|e| OciError::Client { detail: error_chain(&e) })?;
        Ok(Registry {
            client,
            http,
            opts,
            logins: Default::default(),
            uploads: (0..UPLOAD_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        })
    }

    pub fn limits(&self) -> &OciLimits {
        &self.opts.limits
    }

    /// The credential for the registry a reference names.
    pub(crate) fn auth_for(&self, r: &oci_client::Reference) -> &Auth {
        let registry = r.resolve_registry();
        self.opts.credentials.iter().find(|(host, _)| host == registry).map(|(_, a)| a).unwrap_or(&self.opts.auth)
    }

    /// A request of ours to the registry `r` names, signed: the bearer
    /// token `authenticate` got wins; else basic credentials; else anonymous.
    pub(crate) fn signed(&self, req: reqwest::RequestBuilder, token: Option<&str>, r: &oci_client::Reference) -> reqwest::RequestBuilder {
        match (token, self.auth_for(r)) {
            (Some(t), _) => req.bearer_auth(t),
            (None, Auth::Basic { username, password }) => req.basic_auth(username, Some(password)),
            (None, _) => req,
        }
    }
}

/// The registry (`host[:port]`) a reference points at, as used for
/// [`RegistryOptions::plain_http`] and [`Auth::from_docker_config`].
pub fn registry_of(reference: &str) -> Result<String> {
    Ok(parse_ref(reference)?.resolve_registry().to_string())
}
