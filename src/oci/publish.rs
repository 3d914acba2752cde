//! `skill-operator package push`: build a deterministic package from a skill
//! directory, a ZIP or a git tree, push it, and print the digest and a SkillPackage
//! pinned to it. Nothing from the package runs: it is read as files only.

use std::path::PathBuf;

use anyhow::Context;

use crate::core::package;

#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// A skill directory (SKILL.md at its root) or a .zip file.
    #[arg(value_name = "DIR|ZIP", required_unless_present = "git", conflicts_with = "git")]
    pub source: Option<PathBuf>,
    /// Instead of DIR|ZIP: a git repository (https://, git://, file:// or a local path), read object by object; nothing in it runs.
    #[arg(long, value_name = "URL")]
    pub git: Option<String>,
    /// With --git: the branch, tag or commit id (default: the repository's HEAD).
    #[arg(long = "ref", value_name = "REF", requires = "git")]
    pub reference: Option<String>,
    /// Inside a ZIP or a --git repository: the folder holding SKILL.md (default: the root).
    #[arg(long, value_name = "PATH")]
    pub path: Option<String>,
    /// Registry and repository, e.g. registry.example:5000/skills.
    #[arg(long, value_name = "HOST/REPO")]
    pub registry: String,
    /// Artifact name (default: the skill's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Tag (default: the skill's metadata.version, else `latest`).
    #[arg(long)]
    pub tag: Option<String>,
    /// Talk plain HTTP to the registry (loopback or in-cluster test registries).
    #[arg(long)]
    pub plain_http: bool,
    /// Push to an artifact endpoint's built-in store with the operator
    /// credential derived from this token key (the chart's token-key Secret).
    #[arg(long, value_name = "FILE", conflicts_with = "password")]
    pub token_key_file: Option<PathBuf>,
    /// Registry user for Basic auth (default with a password: `operator`).
    #[arg(long, env = "SKILL_OPERATOR_REGISTRY_USERNAME")]
    pub username: Option<String>,
    /// Registry password, or a built-in store's operator token (prefer the variable: a flag shows in the process list).
    #[arg(long, env = "SKILL_OPERATOR_REGISTRY_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
}

/// What an archive is, as its artifact says it: the skill's name, version
/// and the config pushed with it.
pub struct Described {
    pub skill: String,
    pub version: Option<String>,
    pub config: super::SkillConfig,
}

/// Reads the name, description and version from the archive's `SKILL.md`
/// (as files only) and makes the artifact config: what `package push` and the
/// built-in store's sample seeding both push, so both give one digest.
pub fn describe(archive: &[u8]) -> anyhow::Result<Described> {
    let dir = tempfile::tempdir()?;
    package::unpack(archive, &dir.path().join("pkg"))?;
    let text = std::fs::read_to_string(dir.path().join("pkg/SKILL.md"))?;
    let md = crate::core::frontmatter::parse(crate::core::frontmatter::decode(text.as_bytes(), false)?)?;
    let skill =
        md.frontmatter.get("name").and_then(|v| v.as_str()).context("SKILL.md has no `name`: a package is named by it")?.to_string();
    crate::core::spec::servable_name(&skill).map_err(|why| anyhow::anyhow!("SKILL.md `name` {skill:?} cannot be served: it {why}"))?;
    let description = md.frontmatter.get("description").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let version = version_of(&md.frontmatter);
    let config = super::SkillConfig::for_package(archive, &skill, &description, version.clone())?;
    Ok(Described { skill, version, config })
}

/// A skill's version as its frontmatter states it (`metadata.version`).
pub fn version_of(frontmatter: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    frontmatter.get("metadata").and_then(|m| m.get("version")).and_then(|v| v.as_str()).map(String::from)
}

/// The push credential: the operator credential derived from a token key
/// file (the built-in store), or a user and password from the environment.
fn push_auth(args: &PushArgs) -> anyhow::Result<super::Auth> {
    if let Some(path) = &args.token_key_file {
        let key = std::fs::read(path).with_context(|| format!("cannot read the token key {}", path.display()))?;
        anyhow::ensure!(key.len() >= 32, "the token key in {} is shorter than 32 bytes", path.display());
        return Ok(super::Auth::Basic {
            username: crate::artifacts::store::v2::OPERATOR_USER.into(),
            password: crate::artifacts::operator_token(&key),
        });
    }
    match &args.password {
        Some(password) => {
            Ok(super::Auth::Basic { username: args.username.clone().unwrap_or_else(|| "operator".into()), password: password.clone() })
        }
        None => Ok(super::Auth::Anonymous),
    }
}

/// The OCI image-spec's provenance keys, reused on the SkillPackage.
pub const ANNOTATION_SOURCE: &str = "org.opencontainers.image.source";
pub const ANNOTATION_REVISION: &str = "org.opencontainers.image.revision";
/// The folder of the repository the skill came from.
pub const ANNOTATION_PATH: &str = "skill-operator.dev/source-path";

/// Where a `--git` package came from.
struct Provenance {
    url: String,
    path: Option<String>,
    commit: String,
    refused: Vec<crate::source::git::Refused>,
}

/// The package bytes, from a directory, a ZIP, or a git tree fetched into a
/// temporary directory and then packaged exactly as a directory is.
async fn build(args: &PushArgs) -> anyhow::Result<(Vec<u8>, Option<Provenance>)> {
    use crate::source::git;
    if let Some(url) = &args.git {
        let path = args.path.as_deref().map(crate::core::paths::RelPath::parse).transpose().context("--path")?;
        let source = git::GitRef { url: url.clone(), reference: args.reference.clone(), path };
        let scratch = tempfile::tempdir()?;
        let dest = scratch.path().join("tree");
        let (source, fetched) = tokio::task::spawn_blocking(move || {
            let fetched = git::fetch_tree(&source, &git::Caps::DEFAULT, &dest);
            (source, fetched)
        })
        .await?;
        let fetched = fetched?;
        let archive = package::build_from_dir(&scratch.path().join("tree"))?;
        let provenance =
            Provenance { url: source.url, path: source.path.map(|p| p.to_string()), commit: fetched.commit, refused: fetched.refused };
        return Ok((archive, Some(provenance)));
    }
    let source = args.source.as_ref().context("give a skill directory, a ZIP or --git URL")?;
    let archive = if source.is_dir() {
        package::build_from_dir(source)?
    } else {
        let bytes = std::fs::read(source).with_context(|| format!("cannot read {}", source.display()))?;
        package::build_from_zip(&bytes, args.path.as_deref())?
    };
    Ok((archive, None))
}

/// Build, push, print the digest and a SkillPackage to apply.
pub async fn push(args: PushArgs) -> anyhow::Result<()> {
    let auth = push_auth(&args)?;
    let (archive, provenance) = build(&args).await?;
    let described = describe(&archive)?;
    let (skill, version) = (described.skill.clone(), described.version.clone());
    let name = args.name.unwrap_or_else(|| skill.clone());
    let tag = args.tag.or(version.clone()).unwrap_or_else(|| "latest".into());
    let reference = format!("{}/{name}:{tag}", args.registry.trim_end_matches('/'));
    let config = described.config;
    let mut options = super::RegistryOptions::default();
    if args.plain_http {
        options.plain_http.push(super::registry_of(&reference)?);
    }
    options.auth = auth;
    let digest = super::Registry::new(options)?.push(&reference, &archive, &config).await?;
    let pinned = format!("{}/{name}@{digest}", args.registry.trim_end_matches('/'));
    eprintln!("pushed {reference} ({} files, {} bytes)", config.file_count, config.total_bytes);
    println!("# digest: {digest}");
    if let Some(p) = &provenance {
        eprintln!("from {} at commit {}{}", p.url, p.commit, p.path.as_deref().map(|p| format!(", folder {p}")).unwrap_or_default());
        for refused in &p.refused {
            eprintln!("not packaged: {} ({})", refused.path, refused.reason);
        }
        println!("# source: {}", p.url);
        if let Some(path) = &p.path {
            println!("# path: {path}");
        }
        println!("# commit: {}", p.commit);
    }
    let short = digest.trim_start_matches("sha256:").get(..12).unwrap_or_default();
    let mut package = crate::api::SkillPackage::new(
        &format!("{skill}-{short}"),
        crate::api::SkillPackageSpec {
            source: crate::api::package::PackageSource {
                oci: crate::api::package::OciSource { reference: pinned, pull_secret: None, insecure: args.plain_http },
            },
            runtime: None,
        },
    );
    if let Some(p) = &provenance {
        // On the SkillPackage, not the OCI manifest: the artifact's digest
        // stays the digest of its files, whichever way they were fetched.
        let annotations = package.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(ANNOTATION_SOURCE.into(), p.url.clone());
        annotations.insert(ANNOTATION_REVISION.into(), p.commit.clone());
        if let Some(path) = &p.path {
            annotations.insert(ANNOTATION_PATH.into(), path.clone());
        }
    }
    print!("{}", serde_norway::to_string(&package)?);
    Ok(())
}
