//! Skill artifacts: our deterministic package format (push, pull, resolve) and ToolHive's (pull).

use crate::core::package::{self, FileEntry, PackageError};
use oci_client::manifest::OciImageManifest;
use oci_client::{Reference, RegistryOperation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::*;

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

    pub(super) fn check_against(&self, files: &[FileEntry]) -> Result<(), OciError> {
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

impl Registry {
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
        self.push_checked(reference, package, config, extra, Upload::IfMissing).await
    }

    /// [`Registry::push_annotated`] for a package whose `config` was already
    /// checked against it (by this process, for the same sha256): a burst of
    /// jobs of one package unpacks it once, not once per job. `mode` says
    /// whether its blobs are looked for before they are sent.
    pub async fn push_checked(
        &self,
        reference: &str,
        package: &[u8],
        config: &SkillConfig,
        extra: BTreeMap<String, String>,
        mode: Upload,
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
        self.upload(&r, package, &layer.digest, mode).await?;
        self.upload(&r, &config_bytes, &cfg.digest, mode).await?;

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

    pub(super) async fn read_ours(&self, reference: &str, r: &Reference, m: &AnyManifest) -> Result<(Vec<u8>, SkillConfig)> {
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

    pub(super) async fn read_toolhive(&self, reference: &str, r: &Reference, m: &AnyManifest) -> Result<(Vec<u8>, SkillConfig)> {
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
}
