//! The `catalog` subcommands: their flags, and printing what the other
//! modules of [`super`] answer. No catalog logic lives here.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::build::{self, BuildCaps, RepositorySpec};
use super::cluster::ClusterStore;
use super::install::manifest_yaml;
use super::model::{write_atomically, Catalog};
use super::query::{Found, Searcher};
use super::refresh;
use super::store::{self, CatalogStore, Origin, CATALOG_ENV};
use crate::core::limits::SEARCH_RESULTS_DEFAULT;

/// Description columns shown per search result (the rest is in `show`).
const DESCRIPTION_COLUMNS: usize = 100;

#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// Build a catalog from git repositories: every valid skill, pinned to the commit read.
    Build(BuildArgs),
    /// Search the catalog: names outrank descriptions, which outrank authors; case, accents and small typos do not matter.
    Search(SearchArgs),
    /// Show one catalog entry.
    Show(ShowArgs),
    /// Print (or write) the SkillSource that installs an entry, pinned to its commit.
    Install(InstallArgs),
    /// Replace the local (or, with --cluster, the cluster's) catalog with one from an https URL or a file, once it is checked whole.
    Refresh(RefreshArgs),
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Repository URLs, comma-separated; `URL#ref` pins a branch, tag or commit (default: HEAD).
    #[arg(long, value_delimiter = ',', required = true, value_name = "URL")]
    pub repositories: Vec<String>,
    /// Where to write the catalog (gzip when it ends in .gz); written only if the whole build succeeds.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Read URL from a local git directory instead, recording URL in the catalog (repeatable).
    #[arg(long = "mirror", value_name = "URL=LOCALPATH")]
    pub mirrors: Vec<String>,
}

/// The namespace `--cluster` reads and writes when `--namespace` is not
/// given: the one docs/install.md installs the chart in (the gateway reads
/// its own release namespace).
pub const DEFAULT_NAMESPACE: &str = "skill-operator";
/// Overrides [`DEFAULT_NAMESPACE`].
pub const NAMESPACE_ENV: &str = "SKILL_OPERATOR_NAMESPACE";

/// Which catalog to read or replace.
#[derive(Debug, Args)]
pub struct CatalogFile {
    /// The local catalog (default: ~/.local/share/skill-operator/catalog.json); the embedded snapshot is read while it does not exist.
    #[arg(long = "catalog", env = CATALOG_ENV, value_name = "FILE", conflicts_with = "cluster")]
    pub path: Option<PathBuf>,
    /// The cluster's catalog instead (the ConfigMap skill-operator-catalog the gateway serves; KUBECONFIG or the in-cluster config); the embedded snapshot is read while there is none.
    #[arg(long)]
    pub cluster: bool,
    /// With --cluster: the namespace of the catalog, the operator's (the chart's release namespace).
    #[arg(long, env = NAMESPACE_ENV, default_value = DEFAULT_NAMESPACE, value_name = "NS")]
    pub namespace: String,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Words to look for.
    #[arg(required = true, num_args = 1.., value_name = "QUERY")]
    pub query: Vec<String>,
    /// Only entries of this category.
    #[arg(long)]
    pub category: Option<String>,
    /// At most this many results.
    #[arg(long, default_value_t = SEARCH_RESULTS_DEFAULT as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Print JSON: `{"total": N, "results": [entry + score + matched]}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub catalog: CatalogFile,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The entry's id (`<owner>/<repo>/<name>`, as search prints it).
    pub id: String,
    /// Print JSON instead of YAML.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub catalog: CatalogFile,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The entry's id.
    pub id: String,
    /// Write the manifest to this file instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub catalog: CatalogFile,
}

#[derive(Debug, Args)]
pub struct RefreshArgs {
    /// An https:// URL or a file (JSON, or gzip of it).
    #[arg(long, value_name = "URL|FILE")]
    pub from: String,
    #[command(flatten)]
    pub catalog: CatalogFile,
}

pub async fn run(command: CatalogCommand) -> anyhow::Result<()> {
    match command {
        CatalogCommand::Build(args) => tokio::task::spawn_blocking(move || build_command(&args)).await.context("the build thread")?,
        CatalogCommand::Search(args) => search_command(&args).await,
        CatalogCommand::Show(args) => show_command(&args).await,
        CatalogCommand::Install(args) => install_command(&args).await,
        CatalogCommand::Refresh(args) if args.catalog.cluster => refresh_cluster_command(&args).await,
        CatalogCommand::Refresh(args) => refresh_command(&args).await,
    }
}

fn build_command(args: &BuildArgs) -> anyhow::Result<()> {
    let mirrors: HashMap<String, String> = args.mirrors.iter().map(|m| build::parse_mirror(m)).collect::<Result<_, _>>()?;
    let specs: Vec<RepositorySpec> = args.repositories.iter().map(|r| RepositorySpec::parse(r, &mirrors)).collect::<Result<_, _>>()?;
    if let Some(unused) = mirrors.keys().find(|url| !specs.iter().any(|s| &s.url == *url)) {
        anyhow::bail!("--mirror names {unused}, which is not among --repositories");
    }
    let catalog = build::build_to_file(&specs, &BuildCaps::DEFAULT, &args.out)
        .with_context(|| format!("catalog build failed; {} was not changed", args.out.display()))?;
    for repo in &catalog.repositories {
        println!("{}\t{}\t{} skills", repo.url, repo.commit, repo.skills);
    }
    println!("wrote {} entries from {} repositories to {}", catalog.entries.len(), catalog.repositories.len(), args.out.display());
    Ok(())
}

/// The catalog in use, and where it came from.
async fn open(file: &CatalogFile) -> anyhow::Result<(Searcher, Origin)> {
    let (catalog, origin) = if file.cluster {
        let cluster = ClusterStore::connect(&file.namespace).await?;
        // As with a local file, a stored catalog that does not load is an
        // error, not a silent fallback (the gateway keeps its previous one).
        match cluster.load().await? {
            Some(catalog) => (catalog, Origin::Stored(cluster.describe())),
            None => (store::snapshot().context("the embedded snapshot")?, Origin::Snapshot),
        }
    } else {
        match store::local(file.path.as_deref()) {
            Some(local) => store::active(&local)?,
            None => (store::snapshot().context("the embedded snapshot")?, Origin::Snapshot),
        }
    };
    tracing::debug!(%origin, entries = catalog.entries.len(), built = %catalog.built, "catalog in use");
    Ok((Searcher::new(catalog), origin))
}

async fn search_command(args: &SearchArgs) -> anyhow::Result<()> {
    let (searcher, origin) = open(&args.catalog).await?;
    let query = args.query.join(" ");
    let (found, total) = searcher.search(&query, args.category.as_deref(), args.limit as usize);
    if args.json {
        println!("{}", serde_json::json!({ "total": total, "results": found }));
        return Ok(());
    }
    let width = found.iter().map(|f| f.entry.id.chars().count()).max().unwrap_or(0);
    for Found { entry, .. } in &found {
        println!("{:width$}  {}", entry.id, one_line(&entry.description, DESCRIPTION_COLUMNS));
    }
    eprintln!(
        "{} of {total} matching entries ({} in all, {origin}, built {})",
        found.len(),
        searcher.catalog().entries.len(),
        searcher.catalog().built
    );
    Ok(())
}

async fn show_command(args: &ShowArgs) -> anyhow::Result<()> {
    let (searcher, _) = open(&args.catalog).await?;
    let entry = searcher.get(&args.id)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(entry)?);
    } else {
        print!("{}", serde_norway::to_string(entry)?);
    }
    Ok(())
}

async fn install_command(args: &InstallArgs) -> anyhow::Result<()> {
    let (searcher, _) = open(&args.catalog).await?;
    let yaml = manifest_yaml(searcher.get(&args.id)?);
    match &args.out {
        Some(out) => {
            write_atomically(out, yaml.as_bytes())?;
            eprintln!("wrote {}; apply it with `kubectl apply -f {}`", out.display(), out.display());
        }
        None => print!("{yaml}"),
    }
    Ok(())
}

async fn refresh_command(args: &RefreshArgs) -> anyhow::Result<()> {
    let Some(local) = store::local(args.catalog.path.as_deref()) else {
        anyhow::bail!("no place to keep the catalog (no HOME or XDG_DATA_HOME): give --catalog FILE or {CATALOG_ENV}");
    };
    let previous = describe_previous(&local);
    let catalog = refresh::refresh(&args.from, &local).await.with_context(|| format!("refresh failed; {previous} stays in use"))?;
    println!("refreshed {}: {}", local.describe(), summary(&catalog));
    Ok(())
}

/// `catalog refresh --cluster`: the catalog read and checked whole, then
/// written to the ConfigMap in one write; on any failure it is as it was.
async fn refresh_cluster_command(args: &RefreshArgs) -> anyhow::Result<()> {
    let cluster = ClusterStore::connect(&args.catalog.namespace).await?;
    let previous = match cluster.load().await {
        Ok(Some(c)) => format!("the catalog in {} (built {}, {} entries)", cluster.describe(), c.built, c.entries.len()),
        Ok(None) => format!("the embedded snapshot (there is no {})", cluster.describe()),
        Err(e) => format!("{} (unchanged: {e})", cluster.describe()),
    };
    let written = async {
        let catalog = refresh::fetch(&args.from).await?;
        cluster.replace(&catalog).await?;
        anyhow::Ok(catalog)
    };
    let catalog = written.await.with_context(|| format!("refresh failed; {previous} stays in use"))?;
    println!("refreshed {}: {}; the gateway serves it once its watch sees it", cluster.describe(), summary(&catalog));
    Ok(())
}

/// A refreshed catalog in one line.
fn summary(catalog: &Catalog) -> String {
    format!("{} entries from {} repositories, built {}", catalog.entries.len(), catalog.repositories.len(), catalog.built)
}

/// What is in use before a refresh, for its failure message.
fn describe_previous(local: &store::LocalFile) -> String {
    let summary = |c: &Catalog| format!("built {}, {} entries", c.built, c.entries.len());
    match local.load() {
        Ok(Some(c)) => format!("the catalog at {} ({})", local.describe(), summary(&c)),
        Ok(None) => match store::snapshot() {
            Ok(c) => format!("the embedded snapshot ({})", summary(&c)),
            Err(_) => "the embedded snapshot".into(),
        },
        Err(_) => format!("the file at {} (unchanged, and not a usable catalog)", local.describe()),
    }
}

/// `text` on one line, cut at `columns` characters with an ellipsis.
fn one_line(text: &str, columns: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= columns {
        return flat;
    }
    let cut: String = flat.chars().take(columns - 1).collect();
    format!("{}…", cut.trim_end())
}
