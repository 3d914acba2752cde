//! `skill-operator serve`: the standalone server. One process serving the
//! skills under some directories over stdio or streamable HTTP, running
//! their declared scripts locally (sandboxed with bubblewrap when it works
//! here) unless `--read-only`.
//!
//! - [`ServeArgs`]: the flags; [`run`]: set up and serve until the client
//!   goes (stdio) or shutdown (HTTP).
//! - [`http`]: the HTTP router (`/mcp`, `/healthz`) and its guards (Host,
//!   Origin, bearer token); [`sessions`]: the bounded session store.

pub mod http;
pub mod sessions;
pub mod watch;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use rmcp::ServiceExt;

use crate::core::confirm::ConfirmMode;
use crate::core::declaration::Interpreter;
use crate::core::discovery::Layout;
use crate::core::grants::{is_set, Grants};
use crate::jobs::JobLimits;
use crate::mcp::snapshot::Snapshot;
use crate::mcp::state::{Execution, ServerState};
use crate::mcp::SkillServer;
use crate::runner::executor::{default_data_dir, LocalExecutor, LocalOptions};
use crate::runner::local::{find_interpreters, run_as_for, SandboxMode};
use crate::shutdown::Shutdown;

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
    /// Sandbox runs (bubblewrap, or the built-in sandbox where bubblewrap is missing): `required`
    /// refuses to run without one, `off` never sandboxes.
    #[arg(long, value_enum, default_value = "auto")]
    pub sandbox: SandboxMode,
    /// Which sandbox: `auto` takes bubblewrap when it works here and the built-in one otherwise.
    #[arg(long, value_enum, default_value = "auto")]
    pub sandbox_backend: crate::runner::local::SandboxBackend,
    /// Confirmation before a run: ask (preview + token, or the client asks its user), auto, refuse.
    /// Any other value means refuse.
    #[arg(long, env = "SKILL_OPERATOR_CONFIRM", default_value = "ask", value_name = "MODE")]
    pub confirm: String,
    /// Runs at the same time; a busy server says so instead of queueing.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub max_concurrent_runs: usize,
    /// A dedicated uid for scripts when the server runs as root (default 65534 for sandboxed runs).
    /// A uid other than 65534 is a range of one (see --run-as-uids).
    #[arg(long, value_name = "UID")]
    pub run_as_uid: Option<u32>,
    /// Dedicated uids for runs, one per run (root servers): FIRST-LAST, uids nothing else uses.
    /// Each run's work directory is 0700 to its uid while it runs, and every process left
    /// under that uid is killed when it ends. Without a range, a root server refuses unsandboxed runs.
    #[arg(long, value_name = "FIRST-LAST")]
    pub run_as_uids: Option<crate::runner::uids::UidRange>,
    /// A cgroup per run (memory, processes, CPU for the whole run): `required` refuses runs without one,
    /// `auto` falls back to per-process limits (and says so), `off` never makes one.
    #[arg(long, value_enum, default_value = "auto")]
    pub cgroup: crate::runner::cgroup::CgroupMode,
    /// cgroup v2: a delegated directory to make run cgroups in, instead of the server's own cgroup.
    #[arg(long, value_name = "DIR")]
    pub cgroup_parent: Option<PathBuf>,
    /// Ask the kernel for cgroup migrations without an RCU grace period (`favordynmods`, through a
    /// detached mount of a cgroup hierarchy): otherwise each run waits one (about 5-8 ms) as it joins
    /// its cgroup. The kernel makes forks and exits slightly dearer in exchange, host-wide, and from
    /// Linux 6.18 on keeps it until reboot; `false` leaves the host as it is.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub cgroup_favor_dynmods: bool,
    /// Start scripts from a small single-threaded helper process started with the server, instead
    /// of forking the multi-threaded server for each (docs/security.md#the-spawn-helper).
    /// `false` forks the server, as it also does where the kernel refuses the helper.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub spawn_helper: bool,
    /// Addresses the egress proxy may dial although they are loopback, private or link-local
    /// (repeatable, e.g. 10.1.2.0/24): every skill declaring a host that resolves there can reach it.
    /// Never list this server's own address.
    #[arg(long = "egress-allow-cidr", value_name = "CIDR")]
    pub egress_allow_cidrs: Vec<ipnet::IpNet>,
    /// HTTP: the bearer tokens clients must send, one per line (`TOKEN`, or `PRINCIPAL TOKEN`).
    /// Without it a token is generated at start into <data dir>/http-token (0600) and printed once.
    #[arg(long, value_name = "FILE")]
    pub http_token_file: Option<PathBuf>,
    /// HTTP: accept requests without a token (loopback binds only; every local process
    /// can then list, read, run and delete jobs).
    #[arg(long)]
    pub http_no_auth: bool,
    /// HTTP: MCP sessions held at once (2025-11-25 and older clients); the oldest idle one is
    /// closed to make room, and a new one is refused when none is idle.
    #[arg(long, value_name = "N", default_value_t = crate::core::limits::HTTP_SESSIONS_MAX)]
    pub max_sessions: usize,
    /// HTTP: the listener's timeouts and connection caps.
    #[command(flatten)]
    pub listener: crate::listener::ListenerArgs,
    /// Tool calls and runs per principal (every principal: `local` over stdio, a token's over HTTP).
    #[command(flatten)]
    pub rate_limits: crate::mcp::ratelimit::RateLimits,
    /// Audit records (docs/audit.md): JSON lines to stdout over HTTP, and to --audit-file.
    #[command(flatten)]
    pub audit: crate::audit::AuditArgs,
    /// fsync job records on every state change (survives power loss; about 4 ms per run).
    /// Without it a record is still replaced atomically, so a restart never sees a torn one.
    #[arg(long)]
    pub durable_jobs: bool,
    /// How skills are laid out under each root: `standard` (<root>/<name>, <root>/skills/<name>)
    /// or `recursive` (nested skills found deeper and named by their path, e.g. plugin/skill; docs/serve.md).
    #[arg(long, value_enum, default_value = "standard")]
    pub layout: Layout,
    /// Serve the skills but never run anything (no job store, no run tools).
    #[arg(long)]
    pub read_only: bool,
    /// Watch the skills roots and the grants file: after a change, rescan and send clients
    /// tools/prompts/resources list_changed (calls in flight finish on the catalog they began with).
    #[arg(long)]
    pub watch: bool,
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

/// Roots are compared with resolved paths from here on (every read checks
/// that its real path stays inside the skill), so they are resolved once,
/// now: `--skills ./skills` must mean the same directory as its real path.
/// A root that does not resolve is kept as given; discovery reports it.
pub fn resolve_roots(roots: Vec<PathBuf>) -> Vec<PathBuf> {
    roots.into_iter().map(|root| std::fs::canonicalize(&root).unwrap_or(root)).collect()
}

/// Build the server state for `args` (scan, grants, execution backend).
pub async fn state(args: &ServeArgs) -> anyhow::Result<ServerState> {
    Ok(state_and_rescan(args).await?.0)
}

/// The server state, and what scanning the same catalog again takes.
async fn state_and_rescan(args: &ServeArgs) -> anyhow::Result<(ServerState, watch::Rescan)> {
    let lookup = |k: &str| std::env::var(k).ok();
    let roots = match roots_from(&args.skills, &lookup) {
        Some(roots) => roots,
        None => {
            let samples = crate::samples::materialize()?;
            tracing::info!(path = %samples.display(), "no skills root given: serving the bundled samples");
            vec![samples]
        }
    };
    let roots = resolve_roots(roots);
    // Over stdio, stdout carries the protocol: records go to --audit-file only.
    let audit = args.audit.open("serve", args.http.is_some())?;
    let grants = Grants::resolve(&lookup, args.grants.as_deref());
    let run_as = run_as_for(args.run_as_uids.map(|r| r.first).or(args.run_as_uid));
    let interpreters: BTreeSet<Interpreter> =
        if args.read_only { BTreeSet::new() } else { find_interpreters(run_as).keys().copied().collect() };
    let execution = if args.read_only {
        None
    } else {
        let mode = ConfirmMode::parse(&args.confirm);
        if mode == ConfirmMode::Refuse && args.confirm.trim() != "refuse" {
            tracing::warn!(value = %args.confirm, "unknown --confirm value: nothing will run (refuse)");
        }
        let data_dir = data_dir(args);
        crate::runner::executor::prepare(&data_dir)?;
        let mut options = LocalOptions::new(data_dir);
        options.runner.sandbox = args.sandbox;
        options.runner.sandbox_backend = args.sandbox_backend;
        options.runner.max_concurrent = args.max_concurrent_runs;
        options.runner.run_as_uid = args.run_as_uid;
        options.runner.run_as_uids = args.run_as_uids;
        options.runner.cgroup = args.cgroup;
        options.runner.cgroup_parent = args.cgroup_parent.clone();
        options.runner.cgroup_favor_dynmods = args.cgroup_favor_dynmods;
        options.runner.spawn_helper = args.spawn_helper;
        options.runner.egress.allow_cidrs = args.egress_allow_cidrs.clone();
        options.runner.egress.audit = audit.clone();
        options.limits = JobLimits { durable: args.durable_jobs, ..JobLimits::default() };
        let executor = LocalExecutor::start(options);
        Some(Execution::new(executor, mode))
    };
    let layout = args.layout;
    let rescan = watch::Rescan { roots: roots.clone(), layout, grants_file: args.grants.clone(), interpreters: interpreters.clone() };
    let snapshot = tokio::task::spawn_blocking(move || Snapshot::scan_with(&roots, layout, grants, interpreters)).await?;
    tracing::info!(skills = snapshot.catalog.skills.len(), problems = snapshot.problems.len(), "catalog ready");
    let mut state = ServerState::new(snapshot).with_rate_limits(args.rate_limits).with_audit(audit);
    if let Some(execution) = execution {
        state = state.with_execution(execution);
    }
    Ok((state, rescan))
}

/// The data directory `args` name (or the default one).
fn data_dir(args: &ServeArgs) -> PathBuf {
    let lookup = |k: &str| std::env::var(k).ok();
    // SAFETY: trivial getter.
    let is_root = unsafe { libc::geteuid() } == 0;
    args.data_dir.clone().unwrap_or_else(|| default_data_dir(&lookup, is_root))
}

/// Who may call the HTTP endpoint, from the flags; a generated token is
/// written to the data directory and printed once.
fn http_auth(args: &ServeArgs, addr: SocketAddr) -> anyhow::Result<http::Auth> {
    if args.http_no_auth {
        if args.http_token_file.is_some() {
            anyhow::bail!("--http-no-auth and --http-token-file contradict each other: give one");
        }
        if !addr.ip().is_loopback() {
            return Err(http::HttpSetupError::NoAuthOffLoopback(addr).into());
        }
        return Ok(http::Auth::None);
    }
    if let Some(path) = &args.http_token_file {
        return Ok(http::Auth::Tokens(Arc::new(http::Tokens::load(path)?)));
    }
    let dir = data_dir(args);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create the data directory {} for the HTTP token", dir.display()))?;
    let path = dir.join("http-token");
    let (token, tokens) = http::Tokens::generate(&path)?;
    eprintln!("skill-operator: HTTP bearer token (also in {}, mode 0600): {token}", path.display());
    Ok(http::Auth::Tokens(Arc::new(tokens)))
}

/// `serve`: until the client closes stdio, or until shutdown over HTTP.
pub async fn run(args: ServeArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    // Refuse a bad HTTP set-up before the scan and the start-up probes.
    let auth = args.http.map(|addr| http_auth(&args, addr)).transpose()?;
    let (state, rescan) = state_and_rescan(&args).await?;
    let state = Arc::new(state);
    if args.watch {
        watch::spawn(state.clone(), rescan, shutdown.clone())?;
        tracing::info!(roots = ?args.skills, "watching the skills roots for changes");
    }
    match (args.http, auth) {
        (Some(addr), Some(auth)) => {
            let options = http::HttpOptions {
                addr,
                allowed_hosts: args.allowed_hosts.clone(),
                allowed_origins: args.allowed_origins.clone(),
                auth,
                max_sessions: args.max_sessions,
                bounds: args.listener.bounds()?,
                listener_metrics: Default::default(),
            };
            http::serve(state, options, shutdown).await
        }
        _ => stdio(state, shutdown).await,
    }
}

/// Serve over stdin/stdout until the client closes the stream (or shutdown).
pub async fn stdio(state: Arc<ServerState>, shutdown: Shutdown) -> anyhow::Result<()> {
    let service = SkillServer::new(state).serve(rmcp::transport::stdio()).await.context("MCP handshake over stdio failed")?;
    let token = service.cancellation_token();
    tokio::select! {
        done = service.waiting() => { done.context("stdio session ended with an error")?; }
        _ = shutdown.wait() => token.cancel(),
    }
    Ok(())
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
