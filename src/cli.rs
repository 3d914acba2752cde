//! The `skill-operator` command line: the subcommands and their dispatch.
//! Each subcommand's flags and body live in the module that does the work;
//! this file only parses and hands over.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::shutdown::Shutdown;

#[derive(Debug, Parser)]
#[command(name = "skill-operator", version, about = "Serve Agent Skills over MCP and run their declared scripts in a fence")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve skills directories to MCP clients (stdio by default, or streamable HTTP).
    Serve(crate::serve::ServeArgs),
    /// Print the generated reference tables of docs/reference.md (tools, problem reasons).
    Docs,
    /// Skill packages: build a deterministic artifact and push it to an OCI registry.
    #[command(subcommand)]
    Package(PackageCommand),
    /// The skill catalog: build it from git repositories, search it, show an entry, print its pinned SkillSource.
    #[command(subcommand)]
    Catalog(crate::catalog::CatalogCommand),
    /// Run the Kubernetes controller (SkillPackage, SkillBinding, SkillJob).
    Controller(Box<crate::controller::run::ControllerArgs>),
    /// The in-cluster MCP gateway: /mcp/<namespace> serves the skills bound there; skill_run becomes a SkillJob.
    Gateway(Box<crate::gateway::server::GatewayArgs>),
    /// In-pod init container: download the job's package and inputs, copy this binary for the launcher.
    Fetch(crate::artifacts::client::FetchArgs),
    /// In-pod native sidecar: wait for the result, upload outputs, write the digest to the termination log.
    Upload(crate::artifacts::client::UploadArgs),
    /// The artifact endpoint: job packages, inputs and outputs kept in an OCI registry.
    Artifacts(crate::artifacts::server::ArtifactsArgs),
    /// In-pod launcher (the Job's main container): run one script under the fence and record the result.
    Launch(crate::runner::launch::LaunchArgs),
    /// The host-allowlisting egress proxy (HTTP CONNECT and plain HTTP) runs reach the network through.
    EgressProxy(crate::egress::ProxyArgs),
    /// OCI images composed with registry calls only: `image self` (this binary), `image compose` (run images).
    #[command(subcommand)]
    Image(crate::image::ImageCommand),
    /// Inside a standalone run's sandbox: the egress forwarder, then the script as a child (started by `serve`).
    #[command(hide = true)]
    SandboxInit(crate::runner::init::InitArgs),
    /// The built-in sandbox for runs on machines without bubblewrap: bubblewrap's command line, carried out by this binary (started by `serve`).
    #[command(hide = true, disable_help_flag = true)]
    SandboxExec {
        /// bubblewrap's options, `--`, then the program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
    /// In a pod of the controller's: try to reach a peer from under a deny-all NetworkPolicy (is NetworkPolicy enforced?).
    #[command(hide = true)]
    ProbeNetwork(crate::controller::netpol_probe::ProbeArgs),
    /// The small single-threaded process `serve` starts its scripts from (started by `serve`).
    #[command(hide = true)]
    SpawnHelper(crate::runner::spawn_helper::HelperArgs),
    /// Print the CustomResourceDefinitions (or write one file per CRD into --out).
    Crdgen {
        /// Write `<crd name>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Build a package from a skill directory or a ZIP and push it; prints the digest and a SkillPackage.
    Push(crate::oci::publish::PushArgs),
}

impl Cli {
    /// The OpenTelemetry service name of a long-running server (traces are
    /// exported only from these); `None` for one-shot and in-sandbox commands,
    /// which must not start the exporter's threads.
    pub fn service_name(&self) -> Option<&'static str> {
        match self.command {
            Command::Serve(_) => Some("skill-operator-serve"),
            Command::Controller(_) => Some("skill-operator-controller"),
            Command::Gateway(_) => Some("skill-operator-gateway"),
            Command::Artifacts(_) => Some("skill-operator-artifacts"),
            Command::EgressProxy(_) => Some("skill-operator-egress-proxy"),
            _ => None,
        }
    }
}

/// The subcommands that must run before any runtime thread exists (the
/// built-in sandbox forks without exec'ing): carried out here; `None` for
/// every other command line, which [`run`] then takes.
pub fn run_single_threaded(cli: &Cli) -> Option<ExitCode> {
    match &cli.command {
        Command::SandboxExec { args } => Some(crate::runner::builtin::command(args.clone())),
        Command::SpawnHelper(args) => Some(crate::runner::spawn_helper::main(args.fd)),
        _ => None,
    }
}

/// Run one subcommand; the exit code is the subcommand's own.
pub async fn run(cli: Cli, shutdown: Shutdown) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => crate::serve::run(args, shutdown).await?,
        Command::Package(PackageCommand::Push(args)) => crate::oci::publish::push(args).await?,
        Command::Catalog(command) => crate::catalog::run(command).await?,
        Command::Controller(args) => crate::controller::run::command(*args, shutdown).await?,
        Command::Gateway(args) => crate::gateway::server::command(*args, shutdown).await?,
        Command::Fetch(args) => crate::artifacts::client::fetch_command(args).await?,
        Command::Upload(args) => crate::artifacts::client::upload_command(args, shutdown).await?,
        Command::Artifacts(args) => crate::artifacts::server::command(args, shutdown).await?,
        Command::Launch(args) => return Ok(crate::runner::launch::command(args, shutdown).await?),
        Command::SandboxInit(args) => return Ok(crate::runner::init::command(args).await),
        Command::ProbeNetwork(args) => return Ok(crate::controller::netpol_probe::pod_command(args).await),
        Command::Image(command) => crate::image::run(command).await?,
        Command::EgressProxy(args) => crate::egress::run(args, shutdown.wait_owned()).await?,
        Command::Crdgen { out } => crate::api::crdgen(out.as_deref())?,
        Command::Docs => crate::docs::print(),
        Command::SandboxExec { .. } => anyhow::bail!("sandbox-exec runs before the async runtime starts (cli::run_single_threaded)"),
        Command::SpawnHelper(_) => anyhow::bail!("spawn-helper runs before the async runtime starts (cli::run_single_threaded)"),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sandbox's command line reaches it whole: every flag, the `--`
    /// and the program's own flags (clap must not read any of them).
    #[test]
    fn sandbox_exec_gets_its_argv_verbatim() {
        let argv = ["--unshare-all", "--ro-bind", "/usr", "/usr", "--chdir", "/work", "--", "/usr/bin/python3", "--help", "-c", "--"];
        let cli = Cli::try_parse_from(["skill-operator", "sandbox-exec"].into_iter().chain(argv)).expect("parses");
        match cli.command {
            Command::SandboxExec { args } => assert_eq!(args, argv.iter().map(std::ffi::OsString::from).collect::<Vec<_>>()),
            other => panic!("{other:?}"),
        }
    }

    /// The trace exporter starts threads: never in the commands that fork
    /// without exec'ing (the built-in sandbox) or run inside a job's pod or
    /// sandbox, only in the long-running servers.
    #[test]
    fn only_the_servers_export_traces() {
        let service = |args: &[&str]| Cli::try_parse_from(["skill-operator"].iter().chain(args)).expect("parses").service_name();
        assert_eq!(service(&["sandbox-exec", "--", "/bin/true"]), None);
        assert_eq!(service(&["spawn-helper", "--fd", "3"]), None);
        assert_eq!(service(&["crdgen"]), None);
        assert_eq!(service(&["docs"]), None);
        assert_eq!(service(&["serve"]), Some("skill-operator-serve"));
        let gateway = ["gateway", "--artifact-endpoint", "http://a:8443", "--token-key-file", "/k", "--namespace", "ns"];
        assert_eq!(service(&gateway), Some("skill-operator-gateway"));
    }
}
