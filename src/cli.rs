//! The `skill-operator` command line: parse, then dispatch to library code.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::core::confirm::{ConfirmMode, Confirmations};
use crate::core::declaration::Interpreter;
use crate::core::grants::{is_set, Grants};
use crate::core::jobs::{JobLimits, JobStore};
use crate::mcp::run::Execution;
use crate::mcp::state::ServerState;
use crate::runner::local::{LocalRunner, SandboxMode};
use crate::serve::{self, HttpOptions};

#[derive(Debug, Parser)]
#[command(name = "skill-operator", version, about = "Serve Agent Skills over MCP and run their declared scripts in a fence")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve skills directories to MCP clients (stdio by default, or streamable HTTP).
    Serve(ServeArgs),
    /// Print the README's generated reference tables (tools, problem reasons).
    Docs,
    /// Skill packages: build a deterministic artifact and push it to an OCI registry.
    #[command(subcommand)]
    Package(PackageCommand),
    /// Run the Kubernetes controller (SkillPackage, SkillBinding, SkillJob).
    Controller(ControllerArgs),
    /// In-pod init container: download the job's package and inputs, copy this binary for the launcher.
    Fetch(FetchArgs),
    /// In-pod native sidecar: wait for the result, upload outputs, write the digest to the termination log.
    Upload(UploadArgs),
    /// The artifact endpoint: job packages, inputs and outputs kept in an OCI registry.
    Artifacts(ArtifactsArgs),
    /// In-pod launcher (the Job's main container): run one script under the fence and record the result.
    Launch(LaunchArgs),
    /// The host-allowlisting egress proxy jobs reach the internet through.
    EgressProxy(crate::egress::ProxyArgs),
    /// Print the CustomResourceDefinitions (or write one file per CRD into --out).
    Crdgen {
        /// Write `<crd name>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A skills root (repeatable). Without one: MCP_SKILLS_PATH, then SKILLS_DIR
    /// (colon-separated), then the bundled sample skills.
    #[arg(long = "skills", value_name = "DIR")]
    pub skills: Vec<PathBuf>,
    /// Serve streamable HTTP on this address (path /mcp) instead of stdio, e.g. 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Extra Host header values the HTTP endpoint accepts (loopback names always are).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Extra Origin values the HTTP endpoint accepts (loopback origins always are).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// A JSON grants file: [{"skill", "script", "env"?, "egress"?}] rows (instead of MCP_SKILL_RUN).
    #[arg(long, value_name = "FILE")]
    pub grants: Option<PathBuf>,
    /// Where jobs (inputs, outputs, streams) are kept across restarts.
    /// Default: $MCP_DATA_DIR/skill-operator when a host set MCP_DATA_DIR,
    /// else /var/lib/skill-operator as root, else $XDG_STATE_HOME (or ~/.local/state)/skill-operator.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Sandbox runs with bubblewrap: `required` refuses to run without it.
    #[arg(long, value_enum, default_value = "auto")]
    pub sandbox: SandboxMode,
    /// Confirmation before a run: ask (preview + token, or the client asks its user), auto, refuse.
    /// Any other value means refuse.
    #[arg(long, env = "SKILL_OPERATOR_CONFIRM", default_value = "ask", value_name = "MODE")]
    pub confirm: String,
    /// Runs at the same time; a busy server says so instead of queueing.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub max_concurrent_runs: usize,
    /// A dedicated uid for scripts when the server runs as root (default 65534).
    /// With one run at a time, leftovers under that uid are killed after each unsandboxed run.
    #[arg(long, value_name = "UID")]
    pub run_as_uid: Option<u32>,
    /// fsync job records on every state change (survives power loss; about 4 ms per run).
    /// Without it a record is still replaced atomically, so a restart never sees a torn one.
    #[arg(long)]
    pub durable_jobs: bool,
    /// Serve the skills but never run anything (no job store, no run tools).
    #[arg(long)]
    pub read_only: bool,
}

#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Build a package from a skill directory or a ZIP and push it; prints the digest and a SkillPackage.
    Push(PushArgs),
}

#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// A skill directory (SKILL.md at its root) or a .zip file.
    #[arg(value_name = "DIR|ZIP")]
    pub source: PathBuf,
    /// Inside a ZIP: the folder holding SKILL.md (default: the ZIP's root).
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
}

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Metrics and health endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// This binary's image (init and sidecar containers of every run).
    #[arg(long, value_name = "IMAGE")]
    pub operator_image: String,
    /// The artifact endpoint runs reach (pods have no DNS: an IP, or a name resolved here at start-up).
    #[arg(long, value_name = "URL")]
    pub artifact_endpoint: String,
    /// The operator's namespace (NetworkPolicy peer of every run).
    #[arg(long, value_name = "NS")]
    pub operator_namespace: String,
    /// Labels of the artifact endpoint pods, `key=value` (repeatable).
    #[arg(long = "operator-pod-label", value_name = "KEY=VALUE")]
    pub operator_pod_labels: Vec<String>,
    /// Label namespaces pod-security.kubernetes.io/enforce=restricted when they lack it.
    #[arg(long)]
    pub label_namespaces: bool,
    /// File holding the key per-job artifact tokens derive from.
    #[arg(long, value_name = "FILE")]
    pub token_key_file: PathBuf,
    /// Registries reached over plain HTTP (repeatable).
    #[arg(long = "plain-http-registry", value_name = "HOST:PORT")]
    pub plain_http_registries: Vec<String>,
    /// SkillJob reconciles at once (0: no limit).
    #[arg(long, default_value_t = 32)]
    pub reconcile_concurrency: u16,
}

#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// Artifact endpoint base URL, API version included (an IP: pods have no DNS), e.g. http://10.96.0.10:8443/v1.
    #[arg(long, value_name = "URL")]
    pub endpoint: String,
    /// The SkillJob's namespace (pods get no service-account mount to read it from).
    #[arg(long, value_name = "NS")]
    pub namespace: String,
    /// The SkillJob's UID.
    #[arg(long, value_name = "UID")]
    pub job: String,
    /// File holding the per-job token.
    #[arg(long, value_name = "FILE", default_value = "/var/run/skill-operator/token")]
    pub token_file: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Where the package is unpacked (empty).
    #[arg(long, value_name = "DIR")]
    pub package: PathBuf,
    /// Where input files go.
    #[arg(long, value_name = "DIR")]
    pub work: PathBuf,
    /// Where this binary is copied as skill-operator (for the launcher).
    #[arg(long, value_name = "DIR")]
    pub tools: PathBuf,
    /// Refuse a package whose sha256 differs (sha256:<hex>).
    #[arg(long, value_name = "DIGEST")]
    pub package_digest: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct UploadArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// The work directory whose regular files are uploaded.
    #[arg(long, value_name = "DIR")]
    pub work: PathBuf,
    /// The launcher's result.json (stdout and stderr are next to it).
    #[arg(long, value_name = "FILE")]
    pub result: PathBuf,
    /// Where the digest line goes.
    #[arg(long, value_name = "FILE", default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct ArtifactsArgs {
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Registry and repository for job artifacts, e.g. registry.example:5000/skill-operator/jobs.
    #[arg(long, value_name = "HOST/REPO")]
    pub registry: String,
    /// Talk plain HTTP to the registry (test registries only).
    #[arg(long, alias = "insecure-registry")]
    pub plain_http: bool,
    /// Registry credentials: a docker config JSON (a kubernetes.io/dockerconfigjson Secret's key).
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,
    /// File holding the key job tokens derive from (the controller's).
    #[arg(long, value_name = "FILE")]
    pub token_key_file: PathBuf,
    /// Where request bodies are spooled (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// MiB of file data all requests may hold in memory together.
    #[arg(long, default_value_t = 1024)]
    pub memory_budget_mib: u32,
}

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// Where result.json goes (stdout and stderr are written beside it).
    #[arg(long, value_name = "FILE")]
    pub result: PathBuf,
    /// Wall-clock timeout in seconds (at most 300).
    #[arg(long, value_name = "SECS")]
    pub timeout: u64,
    /// A variable passed through from the container's environment (repeatable); nothing else is.
    #[arg(long = "allow-env", value_name = "NAME")]
    pub allow_env: Vec<String>,
    /// The interpreter and its arguments: `-- /usr/bin/python3 /package/scripts/x.py ARGS...`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

/// The default data directory (see `--data-dir`).
pub fn default_data_dir(lookup: &dyn Fn(&str) -> Option<String>, is_root: bool) -> PathBuf {
    if let Some(dir) = lookup("MCP_DATA_DIR").filter(|v| is_set(v)) {
        return PathBuf::from(dir).join("skill-operator");
    }
    if is_root {
        return PathBuf::from("/var/lib/skill-operator");
    }
    if let Some(state) = lookup("XDG_STATE_HOME").filter(|v| is_set(v)) {
        return PathBuf::from(state).join("skill-operator");
    }
    match lookup("HOME").filter(|v| is_set(v)) {
        Some(home) => PathBuf::from(home).join(".local/state/skill-operator"),
        None => std::env::temp_dir().join("skill-operator"),
    }
}

/// Where the roots come from: flags, then `MCP_SKILLS_PATH`, then
/// `SKILLS_DIR`; a blank value or a literal `${...}` counts as unset.
pub fn roots_from(flags: &[PathBuf], lookup: &dyn Fn(&str) -> Option<String>) -> Option<Vec<PathBuf>> {
    if !flags.is_empty() {
        return Some(flags.to_vec());
    }
    for var in ["MCP_SKILLS_PATH", "SKILLS_DIR"] {
        if let Some(value) = lookup(var).filter(|v| is_set(v)) {
            let roots: Vec<PathBuf> = value.split(':').filter(|p| is_set(p)).map(PathBuf::from).collect();
            if !roots.is_empty() {
                return Some(roots);
            }
        }
    }
    None
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve_command(args).await,
        Command::Package(PackageCommand::Push(args)) => package_push(args).await,
        Command::Controller(args) => controller_command(args).await,
        Command::Fetch(a) => {
            use crate::artifacts::client::{self, Endpoint, FetchOptions};
            crate::oci::install_crypto_provider();
            let endpoint = Endpoint::with_token_file(a.job.endpoint, a.job.namespace, a.job.job, &a.job.token_file)?;
            let opts = FetchOptions {
                endpoint,
                package_dir: a.package,
                work_dir: a.work,
                tools_dir: Some(a.tools),
                expect_package_digest: a.package_digest,
                limits: crate::artifacts::ArtifactLimits::DEFAULT,
            };
            let r = client::fetch(&opts).await?;
            eprintln!("fetched package {} ({} files) and {} inputs", r.package_digest, r.package_files, r.inputs.len());
            Ok(())
        }
        Command::Upload(a) => {
            use crate::artifacts::client::{self, Endpoint, UploadOptions};
            // First: a SIGTERM (the kubelet's, after the main container exits)
            // must never meet the default action before the upload is done.
            let stop = client::stop_signal()?;
            crate::oci::install_crypto_provider();
            let endpoint = Endpoint::with_token_file(a.job.endpoint, a.job.namespace, a.job.job, &a.job.token_file)?;
            let mut opts = UploadOptions::new(endpoint, a.work, a.result);
            opts.termination_log = Some(a.termination_log);
            let r = client::run_upload_sidecar(&opts, stop).await?;
            eprintln!("uploaded: {}", r.termination_message);
            Ok(())
        }
        Command::Artifacts(a) => artifacts_command(a).await,
        Command::EgressProxy(args) => Ok(crate::egress::run(args, crate::egress::shutdown_signal()).await?),
        Command::Launch(args) => {
            let mut command = args.command.into_iter();
            let program = PathBuf::from(command.next().unwrap_or_default());
            let spec = crate::runner::launch::Launch {
                program,
                args: command.collect(),
                allow_env: args.allow_env,
                timeout: std::time::Duration::from_secs(args.timeout.clamp(1, crate::core::limits::MAX_TIMEOUT_SECS)),
                result: args.result,
                cwd: std::env::current_dir()?,
            };
            let result = crate::runner::launch::launch(spec, &|k| std::env::var(k).ok()).await?;
            if let Some(error) = &result.error {
                eprintln!("skill-operator launch: {error}");
            }
            std::process::exit(crate::runner::launch::exit_status(&result));
        }
        Command::Crdgen { out } => {
            let crds = crate::api::crds_yaml()?;
            match out {
                Some(dir) => {
                    std::fs::create_dir_all(&dir)?;
                    for (name, yaml) in crds {
                        std::fs::write(dir.join(&name), yaml).with_context(|| format!("cannot write {}", dir.join(&name).display()))?;
                    }
                }
                None => {
                    for (_, yaml) in crds {
                        print!("---\n{yaml}");
                    }
                }
            }
            Ok(())
        }
        Command::Docs => {
            println!("<!-- BEGIN tools (generated: skill-operator docs) -->\n{}<!-- END tools -->\n", crate::docs::tools_reference());
            println!("<!-- BEGIN reasons (generated: skill-operator docs) -->\n{}<!-- END reasons -->", crate::docs::reasons_table());
            Ok(())
        }
    }
}

async fn serve_command(args: ServeArgs) -> anyhow::Result<()> {
    let lookup = |k: &str| std::env::var(k).ok();
    let roots = match roots_from(&args.skills, &lookup) {
        Some(roots) => roots,
        None => {
            let samples = crate::samples::materialize()?;
            tracing::info!(path = %samples.display(), "no skills root given: serving the bundled samples");
            vec![samples]
        }
    };
    let grants = Grants::resolve(&lookup, args.grants.as_deref());
    let execution = if args.read_only { None } else { Some(Arc::new(execution(&args, &lookup).await?)) };
    let interpreters: BTreeSet<Interpreter> = execution.as_ref().map(|e| e.runner.interpreters()).unwrap_or_default();
    let mut state = tokio::task::spawn_blocking(move || ServerState::scan(&roots, grants, interpreters)).await?;
    if let Some(execution) = execution {
        state = state.with_execution(execution);
    }
    tracing::info!(skills = state.catalog.skills.len(), problems = state.problems.len(), "catalog ready");
    let state = Arc::new(state);
    match args.http {
        None => serve::stdio(state).await,
        Some(addr) => {
            serve::http(state, HttpOptions { addr, allowed_hosts: args.allowed_hosts, allowed_origins: args.allowed_origins }).await
        }
    }
}

/// `package push`: build, push, print the digest and a SkillPackage to apply.
/// Nothing from the package runs: it is read as files only.
async fn package_push(args: PushArgs) -> anyhow::Result<()> {
    use crate::core::package;
    let archive = if args.source.is_dir() {
        package::build_from_dir(&args.source)?
    } else {
        let bytes = std::fs::read(&args.source).with_context(|| format!("cannot read {}", args.source.display()))?;
        package::build_from_zip(&bytes, args.path.as_deref())?
    };
    let dir = tempfile::tempdir()?;
    package::unpack(&archive, &dir.path().join("pkg"))?;
    let text = std::fs::read_to_string(dir.path().join("pkg/SKILL.md"))?;
    let md = crate::core::frontmatter::parse(crate::core::frontmatter::decode(text.as_bytes(), false)?)?;
    let skill =
        md.frontmatter.get("name").and_then(|v| v.as_str()).context("SKILL.md has no `name`: a package is named by it")?.to_string();
    crate::core::spec::servable_name(&skill).map_err(|why| anyhow::anyhow!("SKILL.md `name` {skill:?} cannot be served: it {why}"))?;
    let description = md.frontmatter.get("description").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let version = md.frontmatter.get("metadata").and_then(|m| m.get("version")).and_then(|v| v.as_str()).map(String::from);
    let name = args.name.unwrap_or_else(|| skill.clone());
    let tag = args.tag.or(version.clone()).unwrap_or_else(|| "latest".into());
    let reference = format!("{}/{name}:{tag}", args.registry.trim_end_matches('/'));
    let config = crate::oci::SkillConfig::for_package(&archive, &skill, &description, version)?;
    let mut options = crate::oci::RegistryOptions::default();
    if args.plain_http {
        options.plain_http.push(crate::oci::registry_of(&reference)?);
    }
    let digest = crate::oci::Registry::new(options).push(&reference, &archive, &config).await?;
    let pinned = format!("{}/{name}@{digest}", args.registry.trim_end_matches('/'));
    eprintln!("pushed {reference} ({} files, {} bytes)", config.file_count, config.total_bytes);
    println!("# digest: {digest}");
    let package = crate::api::SkillPackage::new(
        &format!("{skill}-{}", &digest.trim_start_matches("sha256:")[..12]),
        crate::api::SkillPackageSpec {
            source: crate::api::package::PackageSource {
                oci: crate::api::package::OciSource { reference: pinned, pull_secret: None, insecure: args.plain_http },
            },
            runtime: None,
        },
    );
    print!("{}", serde_norway::to_string(&package)?);
    Ok(())
}

/// Run pods have no DNS: a named artifact endpoint is resolved here, once,
/// and handed to the pods as a hosts entry.
async fn endpoint_aliases(endpoint: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let uri: http::Uri = endpoint.parse().with_context(|| format!("--artifact-endpoint {endpoint:?} is not a URL"))?;
    let host = uri.host().context("--artifact-endpoint has no host")?.trim_matches(['[', ']']).to_string();
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(Default::default());
    }
    let port = uri.port_u16().unwrap_or(80);
    let ip = tokio::net::lookup_host((host.as_str(), port))
        .await
        .with_context(|| format!("cannot resolve the artifact endpoint host {host}"))?
        .next()
        .with_context(|| format!("the artifact endpoint host {host} has no address"))?
        .ip();
    Ok([(host, ip.to_string())].into())
}

/// `artifacts`: serve the artifact endpoint until SIGTERM.
async fn artifacts_command(a: ArtifactsArgs) -> anyhow::Result<()> {
    use crate::artifacts::server::{self, AppState, ServerConfig};
    let mut stop = crate::artifacts::client::stop_signal()?;
    crate::oci::install_crypto_provider();
    let key = std::fs::read(&a.token_key_file).with_context(|| format!("cannot read the token key {}", a.token_key_file.display()))?;
    let mut cfg = ServerConfig::new(a.registry, key);
    cfg.plain_http = a.plain_http;
    if let Some(path) = &a.registry_config {
        let json = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let host = cfg.registry.split('/').next().unwrap_or_default().to_string();
        cfg.registry_auth = crate::oci::Auth::from_docker_config(&json, &host)?;
    }
    cfg.spool_dir = a.spool_dir;
    cfg.memory_budget_mib = a.memory_budget_mib;
    let state = AppState::new(cfg).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("cannot listen on {}", a.listen))?;
    eprintln!("skill-operator: artifact endpoint on {}", listener.local_addr()?);
    server::serve(listener, state, async move {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    })
    .await?;
    Ok(())
}

/// `controller`: reconcile until SIGTERM.
async fn controller_command(args: ControllerArgs) -> anyhow::Result<()> {
    use crate::controller::{context, metrics::Metrics, resolver::OciResolver};
    crate::oci::install_crypto_provider();
    let token_key =
        std::fs::read(&args.token_key_file).with_context(|| format!("cannot read the token key {}", args.token_key_file.display()))?;
    anyhow::ensure!(token_key.len() >= 32, "the token key in {} is shorter than 32 bytes", args.token_key_file.display());
    let mut labels = std::collections::BTreeMap::new();
    for pair in &args.operator_pod_labels {
        let (k, v) = pair.split_once('=').with_context(|| format!("--operator-pod-label {pair:?}: use key=value"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let client = kube::Client::try_default().await.context("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let host_aliases = endpoint_aliases(&args.artifact_endpoint).await?;
    // Pods call the endpoint's versioned API.
    let artifact_endpoint = match args.artifact_endpoint.trim_end_matches('/') {
        e if e.ends_with("/v1") => e.to_string(),
        e => format!("{e}/v1"),
    };
    let config = context::OperatorConfig {
        operator_image: args.operator_image,
        artifact_endpoint,
        operator_namespace: args.operator_namespace,
        operator_pod_labels: labels,
        label_namespaces: args.label_namespaces,
        token_key,
        host_aliases,
        reconcile_concurrency: args.reconcile_concurrency,
    };
    // Every SkillJob pulls its pinned package: keep up to 64 MiB of them.
    let resolver = std::sync::Arc::new(crate::controller::resolver::PinnedCache::new(
        std::sync::Arc::new(OciResolver { plain_http: args.plain_http_registries }),
        64 << 20,
    ));
    let artifacts = std::sync::Arc::new(context::HttpArtifacts::new(&config.artifact_endpoint, &config.token_key));
    let ctx = std::sync::Arc::new(context::Context::new(client, std::sync::Arc::new(Metrics::default()), config, resolver, artifacts));
    crate::controller::run::run(ctx, args.listen).await
}

/// Build the execution backend: protect the server's environment, probe
/// interpreters and the sandbox, open the job store.
async fn execution(args: &ServeArgs, lookup: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Execution> {
    // SAFETY: trivial getter.
    let is_root = unsafe { libc::geteuid() } == 0;
    if !is_root {
        // Scripts then share our uid: make /proc/<pid>/environ unreadable to them.
        crate::runner::process::protect_server_environ()?;
    }
    let mode = ConfirmMode::parse(&args.confirm);
    if mode == ConfirmMode::Refuse && args.confirm.trim() != "refuse" {
        tracing::warn!(value = %args.confirm, "unknown --confirm value: nothing will run (refuse)");
    }
    let data_dir = args.data_dir.clone().unwrap_or_else(|| default_data_dir(lookup, is_root));
    std::fs::create_dir_all(&data_dir).with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let (jobs, report) = JobStore::open(&data_dir, JobLimits { durable: args.durable_jobs, ..JobLimits::default() })
        .with_context(|| format!("cannot open the job store in {}", data_dir.display()))?;
    for id in &report.interrupted {
        tracing::warn!(job = %id, "a run was interrupted by a restart; it is marked interrupted and not re-run");
    }
    for skipped in &report.skipped {
        tracing::warn!(job = %skipped.name, reason = %skipped.reason, "unreadable job left in place");
    }
    let runner = LocalRunner::detect(args.sandbox, args.max_concurrent_runs, args.run_as_uid).await;
    Ok(Execution { runner, jobs, confirmations: Confirmations::default(), mode, data_dir })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn root_precedence() {
        let e = env(&[("MCP_SKILLS_PATH", "/a:/b"), ("SKILLS_DIR", "/c")]);
        assert_eq!(roots_from(&[PathBuf::from("/flag")], &e), Some(vec![PathBuf::from("/flag")]));
        assert_eq!(roots_from(&[], &e), Some(vec![PathBuf::from("/a"), PathBuf::from("/b")]));
        assert_eq!(roots_from(&[], &env(&[("SKILLS_DIR", "/c")])), Some(vec![PathBuf::from("/c")]));
        assert_eq!(roots_from(&[], &env(&[("MCP_SKILLS_PATH", "${SKILLS}"), ("SKILLS_DIR", "/c")])), Some(vec![PathBuf::from("/c")]));
        assert_eq!(roots_from(&[], &env(&[("MCP_SKILLS_PATH", "  "), ("SKILLS_DIR", "")])), None);
        assert_eq!(roots_from(&[], &env(&[("SKILLS_DIR", "/x::/y")])), Some(vec![PathBuf::from("/x"), PathBuf::from("/y")]));
    }

    #[test]
    fn data_dir_defaults() {
        assert_eq!(default_data_dir(&env(&[("MCP_DATA_DIR", "/data")]), true), PathBuf::from("/data/skill-operator"));
        assert_eq!(default_data_dir(&env(&[]), true), PathBuf::from("/var/lib/skill-operator"));
        assert_eq!(default_data_dir(&env(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")]), false), PathBuf::from("/s/skill-operator"));
        assert_eq!(default_data_dir(&env(&[("HOME", "/h")]), false), PathBuf::from("/h/.local/state/skill-operator"));
    }
}
