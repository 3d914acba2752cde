//! The production [`ImageService`]: [`crate::image`]'s composer, with a
//! fresh [`Remote`] per call (its counters are that call's writes).
//!
//! - composed: skill layer (from the package archive, under `/skill`) and
//!   the dependency layer (the build's tree, under `/deps`) onto the base,
//!   config patched (non-root user, `/skill`, `PYTHONPATH`/`NODE_PATH`),
//!   annotated with the base, package and lock digests, SBOM attached.
//! - image volume: the same layers on an empty base, so the volume holds
//!   `skill/` and `deps/`; the base is only pinned (runs start from it).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::{annotations, ComposeRequest, ImageService, PrepareError, PreparedImage};
use crate::api::package::ImageMode;
use crate::core::limits::VERIFIED_IMAGES_KEPT;
use crate::image::cli::SKILL_PREFIX;
use crate::image::compose::{repository_of, ANNOTATION_PACKAGE_DIGEST};
use crate::image::deps::DEPS_PREFIX;
use crate::image::layer::{self, LayerOptions};
use crate::image::limits::DEFAULT_USER;
use crate::image::remote::parse_ref;
use crate::image::{compose, BaseSpec, ComposeSpec, ConfigPatch, ImageError, Remote, SbomInput};
use crate::oci::{Auth, RegistryOptions};

/// Registries as the controller's flags describe them.
pub struct RegistryImages {
    /// Plain-HTTP registries and the default credentials.
    pub options: RegistryOptions,
    /// Per-registry credentials (from `--image-registry-config`).
    pub auths: Vec<(String, Auth)>,
    /// Where layers are spooled.
    pub spool_dir: Option<PathBuf>,
    /// `image package-digest` pairs already checked.
    checked: Mutex<HashSet<String>>,
}

impl RegistryImages {
    pub fn new(options: RegistryOptions, auths: Vec<(String, Auth)>, spool_dir: Option<PathBuf>) -> Self {
        RegistryImages { options, auths, spool_dir, checked: Mutex::default() }
    }

    fn remote(&self) -> Result<Remote, ImageError> {
        let mut remote = Remote::new(self.options.clone())?;
        for (registry, auth) in &self.auths {
            remote = remote.with_registry_auth(registry.clone(), auth.clone());
        }
        Ok(remote)
    }

    async fn pin_with(&self, remote: &Remote, reference: &str) -> Result<(String, String), ImageError> {
        let r = parse_ref(reference)?;
        let fetched = remote.get_manifest(&r).await?;
        Ok((format!("{}@{}", repository_of(&r), fetched.digest), fetched.digest))
    }
}

impl ImageService for RegistryImages {
    fn pin<'a>(&'a self, reference: &'a str) -> BoxFuture<'a, Result<String, PrepareError>> {
        Box::pin(async move {
            let remote = self.remote()?;
            Ok(self.pin_with(&remote, reference).await?.0)
        })
    }

    fn compose(&self, req: ComposeRequest) -> BoxFuture<'_, Result<PreparedImage, PrepareError>> {
        Box::pin(async move {
            let remote = self.remote()?;
            // Pinned here for an image volume: runs start from the base.
            let pinned = match req.mode {
                ImageMode::ImageVolume => Some(self.pin_with(&remote, &req.base).await?),
                _ => None,
            };
            let package_digest = req.package_digest.clone();
            let spool = self.spool_dir.clone();
            // NB: the composer's future is not Send (its upload streams hold
            // closures over borrowed layers), so it runs on a blocking
            // thread, driven by this runtime's handle; the layers are
            // written there too (blocking work anyway).
            let handle = tokio::runtime::Handle::current();
            let image = tokio::task::spawn_blocking(move || handle.block_on(compose_on(remote, req, pinned, spool)))
                .await
                .map_err(|e| ImageError::Task { detail: e.to_string() })??;
            self.remember(&image.reference, &package_digest);
            Ok(image)
        })
    }

    fn check_package<'a>(&'a self, image: &'a str, package_digest: &'a str) -> BoxFuture<'a, Result<(), PrepareError>> {
        Box::pin(async move {
            let key = format!("{image} {package_digest}");
            if self.checked.lock().unwrap_or_else(|p| p.into_inner()).contains(&key) {
                return Ok(());
            }
            let remote = self.remote()?;
            let fetched = remote.get_manifest(&parse_ref(image)?).await?;
            let got = annotations(&fetched.body).get(ANNOTATION_PACKAGE_DIGEST).cloned();
            if got.as_deref() != Some(package_digest) {
                return Err(PrepareError::WrongImage { image: image.to_string(), want: package_digest.to_string(), got });
            }
            self.remember(image, package_digest);
            Ok(())
        })
    }
}

/// The compose itself (on a blocking thread: see [`RegistryImages::compose`]).
async fn compose_on(
    remote: Remote,
    req: ComposeRequest,
    pinned: Option<(String, String)>,
    spool: Option<PathBuf>,
) -> Result<PreparedImage, PrepareError> {
    let opts = LayerOptions { spool_dir: spool.clone(), ..Default::default() };
    let skill =
        layer::from_package_archive(std::io::Cursor::new(&req.archive), SKILL_PREFIX, "skill-operator: skill package at /skill", &opts)?;
    let deps_layer = match &req.deps {
        Some((dir, _)) => Some(layer::from_dir(dir, DEPS_PREFIX, &[], "skill-operator: dependencies at /deps", &opts)?),
        None => None,
    };
    let report = req.deps.as_ref().map(|(_, r)| r);
    let env = report.map(|r| r.env()).unwrap_or_default();
    let mut layers = vec![&skill];
    layers.extend(deps_layer.as_ref());
    let base_spec = match &pinned {
        // The volume is the layers alone, on an empty base.
        Some(_) => BaseSpec::Empty { platform: req.platforms.first().cloned().unwrap_or_else(crate::image::Platform::host) },
        None => BaseSpec::Image(req.base.clone()),
    };
    let mut spec = ComposeSpec::new(base_spec, req.repository.clone());
    spec.platforms = req.platforms.clone();
    spec.tag = Some(req.tag.clone());
    spec.layers = layers;
    spec.config = ConfigPatch { user: DEFAULT_USER.into(), working_dir: Some("/skill".into()), env: env.clone(), ..Default::default() };
    spec.package_digest = Some(req.package_digest.clone());
    spec.deps_lock_digest = report.and_then(|r| r.lock_digest.clone());
    spec.sbom = Some(SbomInput { dependencies: report.map(|r| r.dependencies.clone()).unwrap_or_default() });
    spec.spool_dir = spool;
    let composed = compose(&remote, &spec).await?;
    let (base_image, base_digest) = match pinned {
        Some((image, digest)) => (image, Some(digest)),
        None => {
            let digest = composed.base_digest.clone();
            let repo = parse_ref(&req.base).map(|r| repository_of(&r)).unwrap_or_else(|_| req.base.clone());
            (digest.as_ref().map(|d| format!("{repo}@{d}")).unwrap_or_else(|| req.base.clone()), digest)
        }
    };
    Ok(PreparedImage {
        reference: composed.reference,
        base_image,
        base_digest,
        sbom_digest: composed.sbom.map(|s| s.manifest_digest),
        env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        writes: composed.uploads.writes(),
    })
}

impl RegistryImages {
    fn remember(&self, image: &str, package_digest: &str) {
        let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        if checked.len() >= VERIFIED_IMAGES_KEPT {
            checked.clear();
        }
        checked.insert(format!("{image} {package_digest}"));
    }
}
