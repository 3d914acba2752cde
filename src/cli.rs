//! The `skill-operator` command line: parse, then dispatch to library code.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::core::declaration::Interpreter;
use crate::core::confirm::{ConfirmMode, Confirmations};
use crate::core::grants::{is_set, Grants};
use crate::core::jobs::{JobLimits, JobStore};
use crate::mcp::run::Execution;
use crate::runner::local::{LocalRunner, SandboxMode};
use crate::mcp::state::ServerState;
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
    /// In-pod launcher (the Job's main container): run one script under the fence and record the result.
    Launch(LaunchArgs),
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
        Some(addr) => serve::http(state, HttpOptions { addr, allowed_hosts: args.allowed_hosts, allowed_origins: args.allowed_origins }).await,
    }
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
    let (jobs, report) = JobStore::open(&data_dir, JobLimits { durable: args.durable_jobs, ..JobLimits::default() }).with_context(|| format!("cannot open the job store in {}", data_dir.display()))?;
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
