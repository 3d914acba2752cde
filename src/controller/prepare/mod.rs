//! Preparing a SkillPackage's run image: the package reconciler's second
//! step, after the package is resolved, verified and found valid.
//!
//! # Flow
//! 1. [`plan::wanted`] (pure): the key of everything the image depends on
//!    (package digest, base reference, dependency lock and indexes, mode,
//!    repository, platforms), and the build, when the package declares
//!    dependencies. Refusals come first, before anything is created: no
//!    image repository, no index for a declared ecosystem, dependency files
//!    that cannot be installed as they are, image volumes asked for where
//!    the cluster has none.
//! 2. `status.preparation.preparedKey == key`: prepared, nothing to do (a
//!    profile change that does not touch the image, such as
//!    `allowedScripts`, is ready again at once). A recorded failure of this
//!    attempt stays a failure.
//! 3. No dependencies: compose now ([`compose`]): the skill layer from the
//!    package archive (fetched again and checked against the pinned digest)
//!    onto the base, pushed; `status.image` holds the digest.
//! 4. Dependencies: [`build`] starts one restricted build Job (deterministic
//!    name; its base pinned by digest; the package staged for it under the
//!    build's UID), watches it, and once it succeeded [`outputs`] reads the
//!    tree back through the artifact endpoint (every file against its
//!    digest, the report's lock digest against the plan's) and composes
//!    skill layer + dependency layer. The Job, its Secret and NetworkPolicy
//!    (owned by the Job) and the build's files are deleted after.
//!
//! # Guarantees
//! - Idempotent and restart-safe: the build is found by name (a Job we did
//!   not make under that name is refused), a finished build whose Job is
//!   gone is found by its files, and composing the same inputs gives the
//!   same digest with no registry writes. A restarted controller never
//!   builds twice for the same inputs.
//! - A failed preparation keeps the last good image (`status.image` is only
//!   ever replaced by a newer good one); runs use it only while it was made
//!   for the current key, so a changed profile resets readiness.
//! - Transient failures (registry, artifact endpoint, an index host that
//!   does not resolve) leave `Preparing` true with the reason and are tried
//!   again; the rest record the attempt as failed, with the reason and the
//!   build's log tail, until the profile or the `skill-operator.dev/prepare`
//!   annotation changes.

pub mod build;
pub mod images;
pub mod outputs;
pub mod plan;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;

use super::context::{ArtifactError, Context, ResolveError};
use crate::api::package::{ImageMode, OciSource, PrepareMode, SkillPackage, SkillPackageStatus};
use crate::core::declaration::Interpreter;
use crate::image::{DepsReport, ImageError, Platform};

/// How often a build in progress is looked at without a Job event.
pub const BUILD_POLL: Duration = Duration::from_secs(10);
/// How soon a transient failure is tried again.
pub const RETRY: Duration = Duration::from_secs(30);
/// How often a prepared (or finally failed) package is looked at.
pub const SETTLED: Duration = Duration::from_secs(600);
/// The ServiceAccount build pods run as (no RBAC, token never mounted).
pub const BUILD_SERVICE_ACCOUNT: &str = "skill-operator-build";

/// The default bases, per interpreter (`--base-image-python` ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseImages {
    pub python: String,
    pub node: String,
    pub bash: String,
}

impl Default for BaseImages {
    fn default() -> Self {
        BaseImages { python: "python:3.12-slim".into(), node: "node:22-bookworm-slim".into(), bash: "debian:bookworm-slim".into() }
    }
}

impl BaseImages {
    pub fn for_interpreter(&self, i: Interpreter) -> &str {
        match i {
            Interpreter::Python => &self.python,
            Interpreter::Node => &self.node,
            Interpreter::Bash => &self.bash,
        }
    }
}

/// The controller's preparation settings (from flags).
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    /// `HOST[:PORT]/REPO` prepared images are pushed to; `None` refuses preparation.
    pub repository: Option<String>,
    pub bases: BaseImages,
    /// Default pip index and npm registry (a profile's `dependencies` wins).
    pub pip_index_url: Option<String>,
    pub npm_registry: Option<String>,
    /// The mode of profiles that name none.
    pub mode: PrepareMode,
    /// Whether runs may use image volumes (decided at start:
    /// [`super::decide::image_volume_support`]); `Err` says why not.
    pub image_volumes: Result<(), String>,
    /// Where build Jobs run (default: the operator's namespace).
    pub build_namespace: String,
    /// The platform dependencies are installed for (the build node's).
    pub build_platform: Platform,
    /// Where layers and the dependency tree are spooled (default: the temp dir).
    pub spool_dir: Option<PathBuf>,
}

impl Default for PrepareConfig {
    fn default() -> Self {
        PrepareConfig {
            repository: None,
            bases: BaseImages::default(),
            pip_index_url: None,
            npm_registry: None,
            mode: PrepareMode::Composed,
            image_volumes: Err("not checked".into()),
            build_namespace: "skill-system".into(),
            build_platform: Platform::host(),
            spool_dir: None,
        }
    }
}

/// Why a preparation failed. Each variant is a condition reason.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("no image repository is configured: start the controller with --image-repository HOST/REPO to prepare run images")]
    NoRepository,
    #[error("the package has {what} but no index is configured for it: set spec.runtime.dependencies.{field} or the controller's --{flag} (the build pod reaches that host only)")]
    NoIndex { what: &'static str, field: &'static str, flag: &'static str },
    #[error("{0}; fix the package, or point the runtime profile at a prebuilt image without prepare")]
    Refused(String),
    #[error("image volumes cannot be used here: {0}; set runtime.imageMode to composed or auto")]
    ImageVolumes(String),
    #[error("composing the image: {0}")]
    Image(#[from] ImageError),
    #[error("{message}")]
    Build { reason: &'static str, message: String },
    #[error("the build's outputs are refused: {0}")]
    Outputs(String),
    #[error("the package index host {host} does not resolve here ({detail}); the build pod has no DNS and gets the address the controller resolves")]
    IndexHost { host: String, detail: String },
    #[error("the build Job cannot be built: {0}")]
    InvalidJob(#[from] super::builders::Error),
    #[error("{0}")]
    Artifacts(#[from] ArtifactError),
    #[error("the package: {0}")]
    Package(#[from] ResolveError),
    #[error("the package fetched for preparation is {got}, not the pinned {pinned}: refused")]
    PackageMismatch { pinned: String, got: String },
    #[error("the image {image} holds package {got:?}, not {want}: refused")]
    WrongImage { image: String, want: String, got: Option<String> },
    #[error("{0}")]
    Busy(String),
    #[error("a spool directory: {0}")]
    Io(#[from] std::io::Error),
}

impl PrepareError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            PrepareError::NoRepository => "NoImageRepository",
            PrepareError::NoIndex { .. } => "NoDependencyIndex",
            PrepareError::Refused(_) => "DependenciesRefused",
            PrepareError::ImageVolumes(_) => "ImageVolumesUnsupported",
            PrepareError::Image(_) => "ComposeFailed",
            PrepareError::Build { reason, .. } => reason,
            PrepareError::Outputs(_) => "BuildOutputsRefused",
            PrepareError::IndexHost { .. } => "IndexUnresolvable",
            PrepareError::InvalidJob(_) => "InvalidBuildJob",
            PrepareError::Artifacts(_) => "ArtifactsUnavailable",
            PrepareError::Package(_) => "PackageUnavailable",
            PrepareError::PackageMismatch { .. } => "PackageDigestMismatch",
            PrepareError::WrongImage { .. } => "WrongImage",
            PrepareError::Busy(_) => "BuildNameTaken",
            PrepareError::Io(_) => "SpoolFailed",
        }
    }

    /// Whether trying again later may succeed with the same inputs.
    pub fn is_transient(&self) -> bool {
        match self {
            PrepareError::Image(ImageError::Registry(e)) => {
                matches!(e, crate::oci::OciError::Unreachable { .. } | crate::oci::OciError::Registry { .. })
            }
            PrepareError::Image(ImageError::Spool { .. } | ImageError::Task { .. }) => true,
            PrepareError::IndexHost { .. } | PrepareError::Io(_) => true,
            PrepareError::Artifacts(e) => matches!(e, ArtifactError::Unreachable { .. } | ArtifactError::Refused { status: 500.., .. }),
            PrepareError::Package(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// A compose request for [`ImageService::compose`].
#[derive(Debug)]
pub struct ComposeRequest {
    pub mode: ImageMode,
    /// The base (pinned by digest when a build ran on it).
    pub base: String,
    pub repository: String,
    pub tag: String,
    /// The package archive, already checked against `package_digest`.
    pub archive: Vec<u8>,
    pub package_digest: String,
    /// The dependency tree (its root is placed at `/deps`) and the build's report.
    pub deps: Option<(PathBuf, DepsReport)>,
    pub platforms: Vec<Platform>,
}

/// What [`ImageService::compose`] pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedImage {
    /// `host/repo@sha256:…`.
    pub reference: String,
    /// The base, `host/repo@sha256:…` (the run image of image-volume runs).
    pub base_image: String,
    pub base_digest: Option<String>,
    pub sbom_digest: Option<String>,
    /// `NAME=value` the dependencies need.
    pub env: Vec<String>,
    /// Registry writes made (0 when the image was already there).
    pub writes: u64,
}

/// Registry work of preparation: the production one composes with
/// [`crate::image`]; tests substitute their own.
pub trait ImageService: Send + Sync {
    /// `reference` as `host/repo@sha256:…`, without downloading layers.
    fn pin<'a>(&'a self, reference: &'a str) -> BoxFuture<'a, Result<String, PrepareError>>;
    /// Compose and push.
    fn compose(&self, request: ComposeRequest) -> BoxFuture<'_, Result<PreparedImage, PrepareError>>;
    /// Checks that the pinned `image` says it holds `package_digest` (its
    /// manifest annotation), once per image per process.
    fn check_package<'a>(&'a self, image: &'a str, package_digest: &'a str) -> BoxFuture<'a, Result<(), PrepareError>>;
}

/// No registry: preparation is refused, runs of prepared packages are not checked.
pub struct NoImages;

impl ImageService for NoImages {
    fn pin<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<String, PrepareError>> {
        Box::pin(async { Err(PrepareError::NoRepository) })
    }
    fn compose(&self, _: ComposeRequest) -> BoxFuture<'_, Result<PreparedImage, PrepareError>> {
        Box::pin(async { Err(PrepareError::NoRepository) })
    }
    fn check_package<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), PrepareError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Where a preparation stands after a step: what the conditions say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// `status.image` is current.
    Prepared { message: String },
    /// Underway (a build runs, or a transient failure is retried).
    Preparing { reason: &'static str, message: String },
    /// This attempt failed; not retried until the key or the annotation changes.
    Failed { reason: String, message: String },
}

/// A step's failure: an API error (the reconcile's to retry) or a preparation's.
#[derive(Debug)]
pub(crate) enum StepError {
    Kube(kube::Error),
    Prepare(PrepareError),
}

impl From<kube::Error> for StepError {
    fn from(e: kube::Error) -> Self {
        StepError::Kube(e)
    }
}

macro_rules! step_error_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StepError {
            fn from(e: $t) -> Self {
                StepError::Prepare(e.into())
            }
        }
    )*};
}
step_error_from!(PrepareError, ArtifactError, ResolveError, ImageError, super::builders::Error, std::io::Error);

/// One preparation step for a resolved, valid package with a runtime
/// profile that asks for it; updates `status` (image fields and
/// bookkeeping) and says where it stands. API errors are returned.
pub async fn step(pkg: &SkillPackage, status: &mut SkillPackageStatus, ctx: &Context) -> super::context::Result<(Progress, Duration)> {
    let want = match plan::wanted(pkg, status, &ctx.config.prepare) {
        Ok(w) => w,
        Err(e) => return Ok((Progress::Failed { reason: e.reason().into(), message: e.to_string() }, SETTLED)),
    };
    let prep = status.preparation.get_or_insert_with(Default::default);
    prep.key = Some(want.key.clone());
    if prep.prepared_key.as_deref() == Some(want.key.as_str()) {
        if let Some(image) = &status.image {
            return Ok((Progress::Prepared { message: prepared_message(image, status.image_mode) }, SETTLED));
        }
    }
    if prep.failed_attempt.as_deref() == Some(want.attempt.as_str()) {
        // Said before; say it again (a new generation recomputed Ready).
        let (reason, message) = status
            .conditions
            .iter()
            .find(|c| c.type_ == "PreparationFailed" && c.status == "True")
            .map(|c| (c.reason.clone(), c.message.clone()))
            .unwrap_or_else(|| ("PreparationFailed".into(), "this attempt failed before".into()));
        return Ok((Progress::Failed { reason, message }, SETTLED));
    }
    let result = match &want.build {
        None => compose::compose(pkg, status, &want, None, ctx).await,
        Some(b) => build::advance(pkg, status, &want, b, ctx).await,
    };
    match result {
        Ok((progress, next)) => Ok((progress, next)),
        Err(StepError::Kube(e)) => Err(e.into()),
        Err(StepError::Prepare(e)) if e.is_transient() => {
            tracing::warn!(package = %pkg.metadata.name.as_deref().unwrap_or_default(), error = %e, "preparation will be tried again");
            Ok((Progress::Preparing { reason: "Retrying", message: format!("{e}; trying again in {} s", RETRY.as_secs()) }, RETRY))
        }
        Err(StepError::Prepare(e)) => {
            tracing::warn!(package = %pkg.metadata.name.as_deref().unwrap_or_default(), error = %e, "preparation failed");
            if let Some(prep) = status.preparation.as_mut() {
                prep.failed_attempt = Some(want.attempt.clone());
            }
            Ok((Progress::Failed { reason: e.reason().into(), message: e.to_string() }, SETTLED))
        }
    }
}

fn prepared_message(image: &str, mode: Option<ImageMode>) -> String {
    match mode {
        Some(ImageMode::ImageVolume) => format!("runs mount {image} read-only on the base"),
        _ => format!("runs start from {image}"),
    }
}

/// The package archive, fetched by its pinned digest: the hash is checked
/// before anything is prepared from it.
pub(crate) async fn fetch_verified(ctx: &Context, pkg: &SkillPackage, digest: &str) -> Result<Vec<u8>, PrepareError> {
    let mut source: OciSource = pkg.spec.source.oci.clone();
    source.reference = super::decide::pinned_reference(&source.reference, digest);
    let fetched = ctx.resolver.fetch(&source).await?;
    if fetched.digest != digest {
        return Err(PrepareError::PackageMismatch { pinned: digest.to_string(), got: fetched.digest });
    }
    Ok(fetched.archive)
}

pub mod compose {
    //! Composing the prepared image and recording it.

    use super::*;

    /// Compose (with the build's tree when there was one) and record the
    /// result as the package's image.
    pub(crate) async fn compose(
        pkg: &SkillPackage,
        status: &mut SkillPackageStatus,
        want: &plan::Wanted,
        deps: Option<outputs::Collected>,
        ctx: &Context,
    ) -> Result<(Progress, Duration), StepError> {
        let archive = fetch_verified(ctx, pkg, &want.package_digest).await?;
        // A build ran on its pinned base: compose on exactly that one.
        let base = status.preparation.as_ref().and_then(|p| p.pinned_base.clone()).filter(|_| deps.is_some()).unwrap_or(want.base.clone());
        let lock = deps.as_ref().and_then(|d| d.report.lock_digest.clone());
        let request = ComposeRequest {
            mode: want.mode,
            base,
            repository: want.repository.clone(),
            tag: want.tag.clone(),
            archive,
            package_digest: want.package_digest.clone(),
            deps: deps.as_ref().map(|d| (d.tree(), d.report.clone())),
            platforms: want.platforms.clone(),
        };
        let image = ctx.images.compose(request).await?;
        drop(deps);
        tracing::info!(package = %pkg.metadata.name.as_deref().unwrap_or_default(), image = %image.reference, writes = image.writes, "prepared");
        status.image = Some(image.reference.clone());
        status.image_mode = Some(want.mode);
        status.base_image = Some(image.base_image.clone());
        status.base_digest = image.base_digest.clone();
        status.lock_digest = lock;
        status.sbom_digest = image.sbom_digest.clone();
        let prep = status.preparation.get_or_insert_with(Default::default);
        prep.prepared_key = Some(want.key.clone());
        prep.package_digest = Some(want.package_digest.clone());
        prep.env = image.env.clone();
        prep.failed_attempt = None;
        prep.build_job = None;
        prep.pinned_base = None;
        Ok((Progress::Prepared { message: prepared_message(&image.reference, Some(want.mode)) }, SETTLED))
    }
}

/// `NAME=value` pairs of a prepared image's environment.
pub fn env_pairs(env: &[String]) -> Vec<(String, String)> {
    env.iter().filter_map(|e| e.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect()
}

/// Annotations of a JSON manifest or index (for [`ImageService::check_package`]).
pub(crate) fn annotations(manifest: &[u8]) -> BTreeMap<String, String> {
    serde_json::from_slice::<serde_json::Value>(manifest)
        .ok()
        .and_then(|v| v.get("annotations").and_then(|a| a.as_object()).cloned())
        .map(|m| m.into_iter().filter_map(|(k, v)| v.as_str().map(|s| (k, s.to_string()))).collect())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
