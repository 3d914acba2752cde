//! What a package's preparation is, from its spec, status and the
//! controller's configuration: pure, so every rule (what changes the key,
//! what names a build, what is refused before anything runs) is unit-tested.

use sha2::{Digest, Sha256};

use super::{PrepareConfig, PrepareError};
use crate::api::package::{ImageMode, SkillPackage, SkillPackageStatus};
use crate::image::Platform;

/// The preparation a package wants now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// `sha256:` of everything the image depends on ([`key_text`]).
    pub key: String,
    /// `key` plus the prepare annotation's value: a failed attempt is not
    /// tried again until this changes.
    pub attempt: String,
    pub mode: ImageMode,
    /// The base reference as configured (a tag is pinned when used).
    pub base: String,
    /// `host/repo` the image is pushed to.
    pub repository: String,
    /// Tag of the result (keeps it from garbage collection): `<skill>-<key12>`.
    pub tag: String,
    pub package_digest: String,
    /// Platforms taken from the base.
    pub platforms: Vec<Platform>,
    /// The dependency build, when the package declares dependencies.
    pub build: Option<Build>,
}

/// A dependency build's identity and inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// The Job's and NetworkPolicy's name: `skillbuild-<12 hex>`.
    pub name: String,
    /// The artifact endpoint UID of its files: `build-<32 hex>`.
    pub uid: String,
    pub lock_digest: String,
    pub pip_index_url: Option<String>,
    pub npm_registry: Option<String>,
}

/// Decides [`Wanted`] for a package whose status is resolved and valid.
pub fn wanted(pkg: &SkillPackage, status: &SkillPackageStatus, cfg: &PrepareConfig) -> Result<Wanted, PrepareError> {
    let profile = pkg.spec.runtime.as_ref().ok_or(PrepareError::Refused("no runtime profile".into()))?;
    let repository = cfg.repository.clone().ok_or(PrepareError::NoRepository)?;
    let package_digest = status.digest.clone().ok_or(PrepareError::Refused("the package is not resolved yet".into()))?;
    let mode = super::super::decide::image_mode(profile.image_mode, cfg.mode, &cfg.image_volumes).map_err(PrepareError::ImageVolumes)?;
    let base = profile.image.clone().unwrap_or_else(|| cfg.bases.for_interpreter(profile.interpreter).to_string());
    let plan = status.dependencies.clone().unwrap_or_default();
    if let Some(why) = &plan.refused {
        return Err(PrepareError::Refused(why.clone()));
    }
    let source = profile.dependencies.clone().unwrap_or_default();
    let pip = source.pip_index_url.or_else(|| cfg.pip_index_url.clone());
    let npm = source.npm_registry.or_else(|| cfg.npm_registry.clone());
    let build = match &plan.lock_digest {
        None => None,
        Some(lock) => {
            if plan.python && pip.is_none() {
                return Err(PrepareError::NoIndex { what: "a requirements.txt", field: "pipIndexUrl", flag: "pip-index-url" });
            }
            if plan.node && npm.is_none() {
                return Err(PrepareError::NoIndex { what: "a package-lock.json", field: "npmRegistry", flag: "npm-registry" });
            }
            Some((lock.clone(), plan.python.then(|| pip.clone()).flatten(), plan.node.then(|| npm.clone()).flatten()))
        }
    };
    // Dependencies are installed for the build's platform (binary wheels
    // are per platform); without any, the base's platforms all stay.
    let platforms = if build.is_some() { vec![cfg.build_platform.clone()] } else { Platform::defaults() };
    let attempt_tag = pkg.prepare_annotation().unwrap_or("");
    let text = key_text(&package_digest, &base, mode, &repository, &platforms, build.as_ref());
    let key = digest(&text);
    let attempt = format!("{key} {attempt_tag}");
    let build = build.map(|(lock_digest, pip_index_url, npm_registry)| {
        // The build's own identity: what the installed tree depends on, and
        // the attempt (a retry must not find the failed Job of the last one).
        let id =
            hex(&format!("{package_digest}\n{lock_digest}\n{base}\n{pip_index_url:?}\n{npm_registry:?}\n{platforms:?}\n{attempt_tag}\n"));
        Build { name: format!("skillbuild-{}", &id[..12]), uid: format!("build-{}", &id[..32]), lock_digest, pip_index_url, npm_registry }
    });
    let skill = status.skill_name.clone().unwrap_or_else(|| "skill".into());
    let tag = format!("{skill}-{}", key.trim_start_matches("sha256:").get(..12).unwrap_or_default());
    Ok(Wanted { key, attempt, mode, base, repository, tag, package_digest, platforms, build })
}

/// The text the key hashes: one line per input, in a fixed order. What is
/// not here (allowed scripts, timeouts, resources) does not change the image.
pub fn key_text(
    package_digest: &str,
    base: &str,
    mode: ImageMode,
    repository: &str,
    platforms: &[Platform],
    build: Option<&(String, Option<String>, Option<String>)>,
) -> String {
    let platforms: Vec<String> = platforms.iter().map(ToString::to_string).collect();
    let (lock, pip, npm) = match build {
        Some((l, p, n)) => (l.as_str(), p.as_deref().unwrap_or(""), n.as_deref().unwrap_or("")),
        None => ("", "", ""),
    };
    format!(
        "skill-operator-prepare-v1\npackage {package_digest}\nbase {base}\nmode {mode:?}\nrepository {repository}\nplatforms {}\nlock {lock}\npip {pip}\nnpm {npm}\n",
        platforms.join(",")
    )
}

fn hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn digest(text: &str) -> String {
    format!("sha256:{}", hex(text))
}
