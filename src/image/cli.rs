//! `skill-operator image …`: the argument structs and bodies of the image
//! subcommands (`src/cli.rs` only parses and dispatches).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;

use super::archive::Archived;
use super::base::{BaseSpec, Platform};
use super::compose::{compose, ComposeSpec, Composed, ConfigPatch, SbomInput};
use super::deps::{self, DepsOptions, DepsReport, DEPS_PREFIX};
use super::error::blocking;
use super::layer::{self, LayerOptions};
use super::limits::DEFAULT_USER;
use super::remote::{parse_ref, Remote};
use super::self_image::{archive_self, push_self, SelfImageOptions};
use super::verify::verify;
use crate::oci::{registry_of, Auth, RegistryOptions};

/// Where the skill package goes in a composed image.
pub const SKILL_PREFIX: &str = "skill";

#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Push an image of this binary: empty base, the binary and exactly its shared libraries,
    /// CA certificates, /etc/passwd for 65532, no shell, non-root. Prints the pinned reference.
    /// With --archive, writes it to a file a cluster's loader imports instead, and prints the
    /// `helm install` flags that use it.
    #[command(name = "self")]
    SelfImage(SelfArgs),
    /// Compose a run image: base (never downloaded) + skill layer (+ dependency layer),
    /// pushed with registry calls only. Prints the pinned reference.
    Compose(ComposeArgs),
    /// Download every blob of an image and check digests, sizes and diff_ids.
    Verify(VerifyArgs),
    /// In-pod dependency step (the build Job): pip wheels only / npm ci --ignore-scripts into --out.
    #[command(hide = true)]
    Deps(DepsArgs),
}

#[derive(Debug, clap::Args)]
pub struct RegistryArgs {
    /// Talk plain HTTP (no TLS) to the registries named here (loopback and test registries).
    #[arg(long)]
    pub plain_http: bool,
    /// Docker config JSON with credentials (`{"auths": {...}}`, as in a dockerconfigjson Secret).
    #[arg(long, value_name = "FILE", env = "SKILL_OPERATOR_DOCKER_CONFIG")]
    pub docker_config: Option<PathBuf>,
    /// Print the whole result as JSON instead of the pinned reference.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SelfArgs {
    /// Repository to push to: HOST[:PORT]/REPO.
    #[arg(long, value_name = "HOST/REPO", required_unless_present = "archive", conflicts_with = "archive")]
    pub registry: Option<String>,
    #[arg(long, value_name = "TAG", conflicts_with = "archive")]
    pub tag: Option<String>,
    /// Write the image to FILE (OCI layout + Docker manifest.json) for `kind load image-archive`,
    /// `k3d image import`, `minikube image load` or `ctr -n k8s.io images import`, instead of
    /// pushing. Prints the `helm install` flags that use it on stdout.
    #[arg(long, value_name = "FILE")]
    pub archive: Option<PathBuf>,
    /// The name the archive gives the image (the chart's image.repository).
    #[arg(long, value_name = "HOST/REPO", default_value = super::self_image::RELEASE_REPOSITORY, requires = "archive")]
    pub repository: String,
    /// The binary to package (default: this one).
    #[arg(long, value_name = "FILE", hide = true)]
    pub binary: Option<PathBuf>,
    /// CA bundle copied to /etc/ssl/certs/ca-certificates.crt.
    #[arg(long, value_name = "FILE", default_value = super::self_image::CA_BUNDLE)]
    pub ca_bundle: PathBuf,
    /// Directory for the layer spool file (default: the temp dir).
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    #[command(flatten)]
    pub registry_args: RegistryArgs,
}

#[derive(Debug, clap::Args)]
pub struct ComposeArgs {
    /// Base image, by tag or digest; `scratch` for an empty base.
    #[arg(long, value_name = "REF")]
    pub base: String,
    /// Repository to push to: HOST[:PORT]/REPO.
    #[arg(long, value_name = "HOST/REPO")]
    pub registry: String,
    #[arg(long, value_name = "TAG")]
    pub tag: Option<String>,
    /// The skill directory, placed at /skill.
    #[arg(long, value_name = "DIR", conflicts_with = "package_archive", required_unless_present = "package_archive")]
    pub package: Option<PathBuf>,
    /// A package archive (`skill-operator package` output), placed at /skill.
    #[arg(long, value_name = "FILE")]
    pub package_archive: Option<PathBuf>,
    /// The package digest to annotate (default: the archive's sha256).
    #[arg(long, value_name = "sha256:…")]
    pub package_digest: Option<String>,
    /// The dependency tree made by `image deps --out`, placed at /deps.
    #[arg(long, value_name = "DIR")]
    pub deps: Option<PathBuf>,
    /// The JSON report `image deps` printed (lock digest, dependency list, env).
    #[arg(long, value_name = "FILE", requires = "deps")]
    pub deps_report: Option<PathBuf>,
    /// Numeric non-root user.
    #[arg(long, default_value = DEFAULT_USER)]
    pub user: String,
    #[arg(long, value_name = "DIR", default_value = "/skill")]
    pub workdir: String,
    /// Extra environment (KEY=VALUE, repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Config labels (KEY=VALUE, repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Manifest annotations (KEY=VALUE, repeatable).
    #[arg(long = "annotation", value_name = "KEY=VALUE")]
    pub annotations: Vec<String>,
    /// Platforms to take from a multi-platform base (repeatable; default linux/amd64 and linux/arm64).
    #[arg(long = "platform", value_name = "OS/ARCH")]
    pub platforms: Vec<String>,
    /// Do not attach the CycloneDX SBOM referrer.
    #[arg(long)]
    pub no_sbom: bool,
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    #[command(flatten)]
    pub registry_args: RegistryArgs,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// HOST/REPO[:TAG|@sha256:…]
    pub reference: String,
    #[command(flatten)]
    pub registry_args: RegistryArgs,
}

#[derive(Debug, clap::Args)]
pub struct DepsArgs {
    /// The unpacked skill package.
    #[arg(long, value_name = "DIR")]
    pub package: PathBuf,
    /// Output tree (absent or empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    #[arg(long, value_name = "URL")]
    pub index_url: Option<String>,
    #[arg(long = "extra-index-url", value_name = "URL")]
    pub extra_index_urls: Vec<String>,
    #[arg(long = "trusted-host", value_name = "HOST")]
    pub trusted_hosts: Vec<String>,
    /// pip --platform (repeatable) to install wheels for another platform.
    #[arg(long = "pip-platform", value_name = "TAG")]
    pub pip_platforms: Vec<String>,
    #[arg(long, value_name = "X.Y", requires = "pip_platforms")]
    pub pip_python_version: Option<String>,
    #[arg(long, value_name = "URL")]
    pub npm_registry: Option<String>,
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    #[arg(long, default_value = "npm")]
    pub npm: PathBuf,
    /// Refuse dependencies that declare install scripts (default: report them; they never run).
    #[arg(long)]
    pub refuse_lifecycle_scripts: bool,
    /// Also write the JSON report here.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
}

/// Runs one `image` subcommand.
pub async fn run(cmd: ImageCommand) -> anyhow::Result<()> {
    match cmd {
        ImageCommand::SelfImage(a) => {
            let mut opts = SelfImageOptions::current()?;
            if let Some(b) = a.binary {
                opts.binary = b;
            }
            opts.ca_bundle = a.ca_bundle;
            opts.layer.spool_dir = a.spool_dir;
            match (a.archive, a.registry) {
                (Some(out), _) => {
                    let repository = a.repository;
                    let archived = super::error::blocking(move || archive_self(&repository, &opts, &out)).await?;
                    print_archived(&archived, a.registry_args.json)
                }
                (None, Some(registry)) => {
                    let remote = remote(&a.registry_args, &[&registry])?;
                    let composed = push_self(&remote, &registry, a.tag.as_deref(), opts).await?;
                    print(&composed, a.registry_args.json)
                }
                (None, None) => anyhow::bail!("give --registry HOST/REPO to push the image, or --archive FILE to write it to a file"),
            }
        }
        ImageCommand::Compose(a) => compose_command(a).await,
        ImageCommand::Verify(a) => {
            let remote = remote(&a.registry_args, &[&a.reference])?;
            let report = verify(&remote, &a.reference).await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        ImageCommand::Deps(a) => {
            let opts = DepsOptions {
                package_dir: a.package,
                out: a.out,
                python: a.python,
                npm: a.npm,
                index_url: a.index_url,
                extra_index_urls: a.extra_index_urls,
                trusted_hosts: a.trusted_hosts,
                pip_platforms: a.pip_platforms,
                pip_python_version: a.pip_python_version,
                npm_registry: a.npm_registry,
                refuse_lifecycle_scripts: a.refuse_lifecycle_scripts,
                timeout: super::limits::DEPS_TIMEOUT,
            };
            let report = tokio::task::spawn_blocking(move || deps::install(&opts)).await.context("dependency step")??;
            let json = serde_json::to_string_pretty(&report)?;
            if let Some(p) = a.report {
                std::fs::write(&p, &json).with_context(|| format!("writing {}", p.display()))?;
            }
            println!("{json}");
            Ok(())
        }
    }
}

fn print(c: &Composed, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(c)?);
    } else {
        println!("{}", c.reference);
    }
    Ok(())
}

/// The `helm install` flags that run the chart on an archive's image: its
/// name, no digest (a loaded image has no registry to pin it in), never
/// pulled (the tag exists on no registry: a node the archive was not loaded
/// on fails with `ErrImageNeverPull` instead of asking the network for it),
/// and its architecture (the chart refuses a cluster with no node of it).
pub fn helm_flags(a: &Archived) -> String {
    let (repository, tag) = a.name.rsplit_once(':').unwrap_or((a.name.as_str(), ""));
    format!(
        "--set image.repository={repository} --set image.tag={tag} --set image.digest= --set image.pullPolicy=Never --set image.architecture={}",
        a.platform.architecture
    )
}

/// stdout: the helm flags (or the JSON with them); stderr: what was
/// written and how each cluster type loads it.
fn print_archived(a: &Archived, json: bool) -> anyhow::Result<()> {
    let flags = helm_flags(a);
    let file = a.path.display();
    if json {
        let mut v = serde_json::to_value(a)?;
        v["helmFlags"] = flags.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    eprintln!(
        "wrote {file} ({} MiB): {} for {}/{} ({})\nload it into the cluster, one of:\n  kind load image-archive {file}\n  k3d image import {file}\n  minikube image load {file}\n  ctr -n k8s.io images import {file}    (on each node)\nthen add these flags to helm install (printed on stdout):",
        a.size.div_ceil(1 << 20),
        a.name,
        a.platform.os,
        a.platform.architecture,
        a.digest
    );
    println!("{flags}");
    Ok(())
}

/// A [`Remote`] for the registries of `references`: plain HTTP to them when
/// asked, and credentials from the docker config for each.
fn remote(args: &RegistryArgs, references: &[&str]) -> anyhow::Result<Remote> {
    let mut registries = Vec::new();
    for r in references {
        // `HOST/REPO` without a tag parses as a reference too.
        registries.push(registry_of(r)?);
    }
    let mut opts = RegistryOptions::default();
    if args.plain_http {
        opts.plain_http = registries.clone();
    }
    let mut remote = Remote::new(opts)?;
    if let Some(path) = &args.docker_config {
        let json = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        for reg in &registries {
            let auth = Auth::from_docker_config(&json, reg)?;
            if !matches!(auth, Auth::Anonymous) {
                remote = remote.with_registry_auth(reg.clone(), auth);
            }
        }
    }
    Ok(remote)
}

fn pairs(items: &[String], what: &str) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|s| {
            s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).with_context(|| format!("{what} {s:?}: expected KEY=VALUE"))
        })
        .collect()
}

async fn compose_command(a: ComposeArgs) -> anyhow::Result<()> {
    let base = if a.base == "scratch" { None } else { Some(a.base.clone()) };
    let mut refs: Vec<&str> = vec![&a.registry];
    if let Some(b) = &base {
        refs.push(b);
    }
    let remote = remote(&a.registry_args, &refs)?;
    parse_ref(&a.registry)?;
    let platforms = if a.platforms.is_empty() {
        Platform::defaults()
    } else {
        a.platforms.iter().map(|p| Platform::parse(p)).collect::<Result<_, _>>()?
    };
    let layer_opts = LayerOptions { spool_dir: a.spool_dir.clone(), ..Default::default() };

    // The skill layer, streamed from the directory or the archive.
    let (skill, package_digest) = match (&a.package, &a.package_archive) {
        (Some(dir), _) => {
            let (dir, o) = (dir.clone(), layer_opts.clone());
            let l = blocking(move || layer::from_dir(&dir, SKILL_PREFIX, &[".git"], "skill-operator: skill package at /skill", &o)).await?;
            (l, a.package_digest.clone())
        }
        (None, Some(file)) => {
            let digest = match &a.package_digest {
                Some(d) => d.clone(),
                None => file_digest(file)?,
            };
            let (file, o) = (file.clone(), layer_opts.clone());
            let l = blocking(move || {
                let f = std::fs::File::open(&file).map_err(|e| super::error::ImageError::read(&file, e))?;
                layer::from_package_archive(std::io::BufReader::new(f), SKILL_PREFIX, "skill-operator: skill package at /skill", &o)
            })
            .await?;
            (l, Some(digest))
        }
        (None, None) => anyhow::bail!("give --package DIR or --package-archive FILE"),
    };

    // The dependency layer and what it implies.
    let report: Option<DepsReport> = match &a.deps_report {
        Some(p) => Some(
            serde_json::from_slice(&std::fs::read(p).with_context(|| format!("reading {}", p.display()))?)
                .context("the --deps-report JSON")?,
        ),
        None => None,
    };
    let deps_layer = match &a.deps {
        Some(dir) => {
            let (dir, o) = (dir.clone(), layer_opts.clone());
            Some(blocking(move || layer::from_dir(&dir, DEPS_PREFIX, &[], "skill-operator: dependencies at /deps", &o)).await?)
        }
        None => None,
    };
    let mut env = match (&report, &a.deps) {
        (Some(r), _) => r.env(),
        (None, Some(dir)) => {
            let mut e = Vec::new();
            if dir.join("python").is_dir() {
                e.push(("PYTHONPATH".to_string(), deps::PYTHON_PATH.to_string()));
            }
            if dir.join("node/node_modules").is_dir() {
                e.push(("NODE_PATH".to_string(), deps::NODE_PATH.to_string()));
            }
            e
        }
        (None, None) => Vec::new(),
    };
    env.extend(pairs(&a.env, "--env")?);

    let mut layers = vec![&skill];
    if let Some(d) = &deps_layer {
        layers.push(d);
    }
    let mut spec = ComposeSpec::new(base.map_or(BaseSpec::Empty { platform: Platform::host() }, BaseSpec::Image), a.registry.clone());
    spec.platforms = platforms;
    spec.tag = a.tag.clone();
    spec.layers = layers;
    spec.config = ConfigPatch {
        user: a.user.clone(),
        working_dir: Some(a.workdir.clone()),
        env,
        labels: pairs(&a.labels, "--label")?.into_iter().collect(),
        entrypoint: None,
        cmd: None,
    };
    spec.package_digest = package_digest;
    spec.deps_lock_digest = report.as_ref().and_then(|r| r.lock_digest.clone());
    spec.annotations = pairs(&a.annotations, "--annotation")?.into_iter().collect::<BTreeMap<_, _>>();
    spec.spool_dir = a.spool_dir.clone();
    spec.sbom = (!a.no_sbom).then(|| SbomInput { dependencies: report.as_ref().map(|r| r.dependencies.clone()).unwrap_or_default() });
    let composed = compose(&remote, &spec).await?;
    print(&composed, a.registry_args.json)
}

/// `sha256:` of a file, streamed.
fn file_digest(path: &std::path::Path) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; super::limits::IO_CHUNK_BYTES];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}
