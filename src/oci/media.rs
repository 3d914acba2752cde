//! Media types, artifact types and annotation keys.

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
pub(crate) const OCI_EMPTY_DIGEST: &str = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
pub(crate) const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const DOCKER_LIST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
pub const ANNOTATION_DESCRIPTION: &str = "org.opencontainers.image.description";
pub const ANNOTATION_VERSION: &str = "org.opencontainers.image.version";
