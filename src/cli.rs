//! The `skill-operator` command line: parse, then dispatch to library code.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::core::declaration::Interpreter;
use crate::core::grants::{is_set, Grants};
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
    /// A JSON grants file: [{"skill", "script", "env"?}] rows (instead of MCP_SKILL_RUN).
    #[arg(long, value_name = "FILE")]
    pub grants: Option<PathBuf>,
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

/// Interpreters found on PATH.
pub fn available_interpreters() -> BTreeSet<Interpreter> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    Interpreter::ALL
        .into_iter()
        .filter(|i| std::env::split_paths(&path).any(|dir| dir.join(i.program()).is_file()))
        .collect()
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve_command(args).await,
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
    let interpreters = available_interpreters();
    let state = tokio::task::spawn_blocking(move || ServerState::scan(&roots, grants, interpreters)).await?;
    tracing::info!(skills = state.catalog.skills.len(), problems = state.problems.len(), "catalog ready");
    let state = Arc::new(state);
    match args.http {
        None => serve::stdio(state).await,
        Some(addr) => serve::http(state, HttpOptions { addr, allowed_hosts: args.allowed_hosts, allowed_origins: args.allowed_origins }).await,
    }
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
}
