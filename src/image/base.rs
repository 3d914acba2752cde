//! Resolving a base image: a reference (tag or digest) to one manifest or
//! an index, and for an index the platform manifests we compose onto.
//! Manifests and configs are fetched with bounded GETs and checked against
//! their digests; base layers are never downloaded (only their descriptors
//! are read).
//!
//! # Platforms
//! From an index we take the entries whose platform is one of those asked
//! for (default [`Platform::defaults`]: linux/amd64 and linux/arm64),
//! first match wins; entries that are not image manifests, carry no
//! platform, are `unknown/unknown` (BuildKit attestations) or are annotated
//! `vnd.docker.reference.type` are skipped. A single-manifest base is used
//! as it is, whatever its platform (read from its config).

use std::fmt;

use oci_client::Reference;
use serde_json::Value;

use super::error::{ImageError, Result};
use super::limits::{MAX_BASE_LAYERS, MAX_INDEX_ENTRIES};
use super::remote::{check_digest, parse_ref, Remote, DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST};

pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// An OS/architecture(/variant) pair as in an index entry's `platform`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    pub fn linux(architecture: &str) -> Self {
        Platform { os: "linux".into(), architecture: architecture.into(), variant: None }
    }

    /// The platforms the issue names: linux/amd64 and linux/arm64.
    pub fn defaults() -> Vec<Platform> {
        vec![Platform::linux("amd64"), Platform::linux("arm64")]
    }

    /// The platform this binary was built for (`linux/amd64` on x86_64).
    pub fn host() -> Platform {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "arm" => "arm",
            "riscv64" => "riscv64",
            "powerpc64" => "ppc64le",
            "s390x" => "s390x",
            other => other,
        };
        Platform::linux(arch)
    }

    /// `os/arch[/variant]`.
    pub fn parse(s: &str) -> Result<Platform> {
        let parts: Vec<&str> = s.split('/').collect();
        match parts.as_slice() {
            [os, arch] if !os.is_empty() && !arch.is_empty() => {
                Ok(Platform { os: (*os).into(), architecture: (*arch).into(), variant: None })
            }
            [os, arch, v] if !os.is_empty() && !arch.is_empty() && !v.is_empty() => {
                Ok(Platform { os: (*os).into(), architecture: (*arch).into(), variant: Some((*v).into()) })
            }
            _ => Err(ImageError::invalid(format!("platform {s:?}: expected os/arch[/variant], e.g. linux/arm64"))),
        }
    }

    /// Whether an index entry's platform satisfies this wanted one: same
    /// OS and architecture, and the same variant when we ask for one
    /// (arm64's `v8` is its only variant, so no variant matches it).
    fn accepts(&self, offered: &Platform) -> bool {
        self.os == offered.os
            && self.architecture == offered.architecture
            && match (&self.variant, &offered.variant) {
                (Some(w), Some(o)) => w == o,
                (Some(w), None) => self.architecture == "arm64" && w == "v8",
                (None, _) => true,
            }
    }

    fn from_json(v: &Value) -> Option<Platform> {
        Some(Platform {
            os: v.get("os")?.as_str()?.to_string(),
            architecture: v.get("architecture")?.as_str()?.to_string(),
            variant: v.get("variant").and_then(Value::as_str).map(str::to_string),
        })
    }

    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("architecture".into(), self.architecture.clone().into());
        m.insert("os".into(), self.os.clone().into());
        if let Some(v) = &self.variant {
            m.insert("variant".into(), v.clone().into());
        }
        Value::Object(m)
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// Where a composed image starts.
#[derive(Debug, Clone)]
pub enum BaseSpec {
    /// An image in a registry (`host/repo:tag` or `host/repo@sha256:…`).
    Image(String),
    /// No base: an empty rootfs and a minimal config for `platform` (the
    /// operator image; `crane append --oci-empty-base`).
    Empty { platform: Platform },
}

/// The wire format the base came in. Composed images are always OCI; see
/// [`super::compose`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Flavor {
    Oci,
    Docker,
    /// The empty base: nothing to convert.
    None,
}

/// One platform image of a base.
#[derive(Debug, Clone)]
pub struct BaseImage {
    pub platform: Platform,
    /// `sha256:` of its manifest (`None` for the empty base).
    pub manifest_digest: Option<String>,
    /// The parsed config JSON (kept whole: unknown fields survive).
    pub config: Value,
    /// Layer descriptors as the base manifest lists them.
    pub layers: Vec<Value>,
    pub flavor: Flavor,
}

/// A resolved base.
#[derive(Debug, Clone)]
pub struct ResolvedBase {
    /// The repository the base layers are in (`None` for the empty base).
    pub reference: Option<Reference>,
    /// As given (for `org.opencontainers.image.base.name`), `None` for empty.
    pub name: Option<String>,
    /// `sha256:` of what the reference resolved to (index or manifest).
    pub digest: Option<String>,
    /// Whether the base was an index (the result is an index too).
    pub is_index: bool,
    pub images: Vec<BaseImage>,
}

/// Resolves `spec` for `platforms` (see the module docs).
pub async fn resolve(remote: &Remote, spec: &BaseSpec, platforms: &[Platform]) -> Result<ResolvedBase> {
    let name = match spec {
        BaseSpec::Empty { platform } => return Ok(resolve_empty(platform)),
        BaseSpec::Image(name) => name,
    };
    resolve_image(remote, name, platforms).await
}

/// The empty base (`scratch`) for one platform: no registry call.
pub fn resolve_empty(platform: &Platform) -> ResolvedBase {
    let config = serde_json::json!({
        "architecture": platform.architecture,
        "os": platform.os,
        "created": super::limits::FIXED_CREATED,
        "config": {},
        "rootfs": { "type": "layers", "diff_ids": [] },
        "history": [],
    });
    let mut config = config;
    if let (Some(v), Some(obj)) = (&platform.variant, config.as_object_mut()) {
        obj.insert("variant".into(), v.clone().into());
    }
    let image = BaseImage { platform: platform.clone(), manifest_digest: None, config, layers: Vec::new(), flavor: Flavor::None };
    ResolvedBase { reference: None, name: None, digest: None, is_index: false, images: vec![image] }
}

async fn resolve_image(remote: &Remote, name: &str, platforms: &[Platform]) -> Result<ResolvedBase> {
    if platforms.is_empty() {
        return Err(ImageError::invalid("no platforms asked for"));
    }
    let r = parse_ref(name)?;
    let top = remote.get_manifest(&r).await?;
    let bad = |detail: String| ImageError::Base { reference: name.to_string(), detail };
    let v: Value = serde_json::from_slice(&top.body).map_err(|e| bad(format!("manifest is not JSON: {e}")))?;
    let media_type = media_type_of(&v, top.content_type.as_deref());
    if v.get("schemaVersion").and_then(Value::as_u64) != Some(2) {
        return Err(bad("schemaVersion is not 2 (schema 1 images are not supported; re-push the base)".into()));
    }
    match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => {
            let entries = v.get("manifests").and_then(Value::as_array).ok_or_else(|| bad("index without manifests".into()))?;
            if entries.len() > MAX_INDEX_ENTRIES {
                return Err(bad(format!("index has {} entries, over the cap of {MAX_INDEX_ENTRIES}", entries.len())));
            }
            let mut found = Vec::new();
            let mut chosen: Vec<(Platform, String)> = Vec::new();
            for want in platforms {
                for e in entries {
                    let Some(p) = e.get("platform").and_then(Platform::from_json) else { continue };
                    let mt = e.get("mediaType").and_then(Value::as_str).unwrap_or("");
                    let attestation = e.get("annotations").and_then(|a| a.get("vnd.docker.reference.type")).is_some();
                    if p.os == "unknown" || attestation || !(mt == OCI_MANIFEST || mt == DOCKER_MANIFEST) {
                        continue;
                    }
                    if !found.contains(&p.to_string()) {
                        found.push(p.to_string());
                    }
                    if want.accepts(&p) && !chosen.iter().any(|(c, _)| want.accepts(c)) {
                        let digest = e.get("digest").and_then(Value::as_str).ok_or_else(|| bad("index entry without digest".into()))?;
                        check_digest(digest)?;
                        chosen.push((p, digest.to_string()));
                    }
                }
            }
            if chosen.is_empty() {
                return Err(ImageError::NoPlatform {
                    reference: name.to_string(),
                    wanted: platforms.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    found: if found.is_empty() { "no image manifests".into() } else { found.join(", ") },
                });
            }
            let mut images = Vec::new();
            for (platform, digest) in chosen {
                let mr = r.clone_with_digest(digest.clone());
                images.push(platform_image(remote, name, &mr, Some(platform)).await?);
            }
            Ok(ResolvedBase { reference: Some(r), name: Some(name.to_string()), digest: Some(top.digest), is_index: true, images })
        }
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let image = image_from_manifest(remote, name, &r, &v, &media_type, top.digest.clone(), None).await?;
            Ok(ResolvedBase {
                reference: Some(r),
                name: Some(name.to_string()),
                digest: Some(top.digest),
                is_index: false,
                images: vec![image],
            })
        }
        other => Err(bad(format!("unsupported manifest media type {other:?}"))),
    }
}

fn media_type_of(v: &Value, content_type: Option<&str>) -> String {
    if let Some(mt) = v.get("mediaType").and_then(Value::as_str) {
        return mt.to_string();
    }
    // OCI makes mediaType optional; fall back to the header, then shape.
    match content_type.map(|c| c.split(';').next().unwrap_or(c).trim()) {
        Some(c @ (OCI_INDEX | OCI_MANIFEST | DOCKER_LIST | DOCKER_MANIFEST)) => c.to_string(),
        _ if v.get("manifests").is_some() => OCI_INDEX.into(),
        _ => OCI_MANIFEST.into(),
    }
}

async fn platform_image(remote: &Remote, name: &str, r: &Reference, platform: Option<Platform>) -> Result<BaseImage> {
    let fetched = remote.get_manifest(r).await?;
    let v: Value = serde_json::from_slice(&fetched.body)
        .map_err(|e| ImageError::Base { reference: name.into(), detail: format!("platform manifest is not JSON: {e}") })?;
    let mt = media_type_of(&v, fetched.content_type.as_deref());
    if mt != OCI_MANIFEST && mt != DOCKER_MANIFEST {
        return Err(ImageError::Base {
            reference: name.into(),
            detail: format!("index entry {} is a {mt}, not an image manifest", fetched.digest),
        });
    }
    image_from_manifest(remote, name, r, &v, &mt, fetched.digest, platform).await
}

async fn image_from_manifest(
    remote: &Remote,
    name: &str,
    r: &Reference,
    v: &Value,
    media_type: &str,
    digest: String,
    platform: Option<Platform>,
) -> Result<BaseImage> {
    let bad = |detail: String| ImageError::Base { reference: name.into(), detail };
    let config = v.get("config").ok_or_else(|| bad("manifest has no config".into()))?;
    let config_digest = config.get("digest").and_then(Value::as_str).ok_or_else(|| bad("config without digest".into()))?;
    let config_size = config.get("size").and_then(Value::as_u64).ok_or_else(|| bad("config without size".into()))?;
    let config_mt = config.get("mediaType").and_then(Value::as_str).unwrap_or("");
    if config_mt != OCI_CONFIG && config_mt != DOCKER_CONFIG {
        return Err(bad(format!("config media type {config_mt:?}: not a container image (an artifact?)")));
    }
    let layers = v.get("layers").and_then(Value::as_array).cloned().unwrap_or_default();
    if layers.len() > MAX_BASE_LAYERS {
        return Err(bad(format!("{} layers, over the cap of {MAX_BASE_LAYERS}", layers.len())));
    }
    for l in &layers {
        let d = l.get("digest").and_then(Value::as_str).ok_or_else(|| bad("layer without digest".into()))?;
        check_digest(d)?;
        l.get("size").and_then(Value::as_u64).ok_or_else(|| bad(format!("layer {d} without size")))?;
    }
    let raw = remote.get_config(r, config_digest, config_size).await?;
    let config: Value = serde_json::from_slice(&raw).map_err(|e| bad(format!("config is not JSON: {e}")))?;
    let diff_ids = config.pointer("/rootfs/diff_ids").and_then(Value::as_array).map(Vec::len).unwrap_or(0);
    if diff_ids != layers.len() {
        return Err(bad(format!("config lists {diff_ids} diff_ids for {} layers", layers.len())));
    }
    let platform = platform.or_else(|| Platform::from_json(&config)).ok_or_else(|| bad("config has no os/architecture".into()))?;
    let flavor = if media_type == DOCKER_MANIFEST { Flavor::Docker } else { Flavor::Oci };
    Ok(BaseImage { platform, manifest_digest: Some(digest), config, layers, flavor })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_matching() {
        let arm = Platform::linux("arm64");
        let v8 = Platform { variant: Some("v8".into()), ..Platform::linux("arm64") };
        assert!(arm.accepts(&v8));
        assert!(v8.accepts(&arm));
        assert!(!Platform::linux("amd64").accepts(&arm));
        assert_eq!(Platform::parse("linux/arm64/v8").unwrap(), v8);
        assert!(Platform::parse("linux").is_err());
        assert_eq!(v8.to_string(), "linux/arm64/v8");
    }
}
