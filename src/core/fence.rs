//! The execution fence: what may run, with which argv, environment and
//! limits. Decided here, in the core, so the local process runner and the
//! Kubernetes runner apply the same checks and differ only in how they
//! start a process.
//!
//! Every rule narrows what runs or what it is handed: only a declared script
//! of a served skill, granted and with an available interpreter; argv as an
//! array (no shell, capped, no NUL); an environment built from an allowlist
//! plus exactly the granted variables the script asked for; a timeout from
//! the declaration under the hard ceiling.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::catalog::Catalog;
use super::declaration::Interpreter;
use super::grants::Grants;
use super::limits::MAX_TIMEOUT_SECS;
use super::paths::RelPath;
use super::policy::{script_status, ScriptStatus};

/// Arguments per run.
pub const MAX_ARGS: usize = 64;
/// Total bytes of all arguments per run.
pub const MAX_ARG_BYTES: usize = 8 * 1024;
/// Variables every script gets (values chosen by the server, never the caller).
pub const FIXED_ENV: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR"];
/// The PATH handed to scripts: system directories only, never the server's own PATH.
pub const SCRIPT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Why a run is refused. Every refusal happens before anything starts, at
/// preview time as well as at run time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no skill named `{name}` is served; served skills: {served}")]
    UnknownSkill { name: String, served: String },
    #[error("{script} is not a script `{skill}` declares: a script must be declared in the skill's mcp-host: block to run. Declared: {declared}")]
    NotDeclared { skill: String, script: String, declared: String },
    #[error("bad script path {script:?}: {reason}")]
    BadPath { script: String, reason: String },
    #[error("{script} cannot run here: {reason}")]
    Unavailable { script: String, reason: String },
    #[error("{script} is not granted: {reason}")]
    Ungranted { script: String, reason: String },
    #[error("{count} arguments given; at most {MAX_ARGS}")]
    TooManyArgs { count: usize },
    #[error("the arguments total {bytes} bytes; at most {MAX_ARG_BYTES}")]
    ArgsTooLarge { bytes: usize },
    #[error("argument {index} contains a NUL byte, which cannot be passed to a process")]
    NulInArg { index: usize },
}

impl Refusal {
    /// Stable code for clients.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::UnknownSkill { .. } => "unknown-skill",
            Refusal::NotDeclared { .. } => "not-declared",
            Refusal::BadPath { .. } => "bad-path",
            Refusal::Unavailable { .. } => "unavailable",
            Refusal::Ungranted { .. } => "ungranted",
            Refusal::TooManyArgs { .. } => "too-many-args",
            Refusal::ArgsTooLarge { .. } => "args-too-large",
            Refusal::NulInArg { .. } => "nul-in-arg",
        }
    }
}

/// A checked run: everything a runner needs, nothing it may choose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPlan {
    pub skill: String,
    /// The skill's real directory.
    pub skill_dir: PathBuf,
    pub script: RelPath,
    pub interpreter: Interpreter,
    pub args: Vec<String>,
    /// Granted variables the script asked for, in declaration order.
    pub granted_env: Vec<String>,
    pub timeout_secs: u64,
    /// Hosts the skill declares (a proposal; enforcement depends on the runner).
    pub egress: Vec<String>,
}

/// Check argv: count, total size, NUL. Arguments are passed as they are:
/// there is no shell, so `; rm -rf` or `$(whoami)` arrive as plain text.
pub fn check_args(args: &[String]) -> Result<(), Refusal> {
    if args.len() > MAX_ARGS {
        return Err(Refusal::TooManyArgs { count: args.len() });
    }
    let bytes: usize = args.iter().map(String::len).sum();
    if bytes > MAX_ARG_BYTES {
        return Err(Refusal::ArgsTooLarge { bytes });
    }
    if let Some(index) = args.iter().position(|a| a.contains('\0')) {
        return Err(Refusal::NulInArg { index });
    }
    Ok(())
}

/// Decide whether `skill`/`script` may run with `args`, and how.
pub fn plan(
    catalog: &Catalog,
    grants: &Grants,
    interpreters: &std::collections::BTreeSet<Interpreter>,
    skill_name: &str,
    script: &str,
    args: &[String],
) -> Result<RunPlan, Refusal> {
    let skill = catalog.get(skill_name).ok_or_else(|| Refusal::UnknownSkill {
        name: skill_name.to_string(),
        served: if catalog.skills.is_empty() { "none".into() } else { catalog.names().join(", ") },
    })?;
    let rel = RelPath::parse(script).map_err(|e| Refusal::BadPath { script: script.to_string(), reason: e.to_string() })?;
    let declared = skill.script(rel.as_str()).ok_or_else(|| Refusal::NotDeclared {
        skill: skill.name.clone(),
        script: script.to_string(),
        declared: if skill.scripts.is_empty() {
            "none".into()
        } else {
            skill.scripts.iter().map(|s| s.decl.script.as_str()).collect::<Vec<_>>().join(", ")
        },
    })?;
    check_args(args)?;
    let granted_env = match script_status(skill, declared, grants, interpreters) {
        ScriptStatus::Runnable { env } => env,
        ScriptStatus::Unavailable(reason) => return Err(Refusal::Unavailable { script: script.to_string(), reason }),
        ScriptStatus::Ungranted(reason) => return Err(Refusal::Ungranted { script: script.to_string(), reason }),
    };
    let interpreter = declared
        .decl
        .interpreter
        .ok_or_else(|| Refusal::Unavailable { script: script.to_string(), reason: "no interpreter declared".into() })?;
    Ok(RunPlan {
        skill: skill.name.clone(),
        skill_dir: skill.dir.clone(),
        script: rel,
        interpreter,
        args: args.to_vec(),
        granted_env,
        timeout_secs: declared.decl.timeout_secs.min(MAX_TIMEOUT_SECS),
        egress: skill.egress.clone(),
    })
}

/// The environment a script receives, and the names a preview shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScriptEnv {
    /// Name and value of every variable handed over.
    #[serde(skip)]
    pub vars: Vec<(String, String)>,
    /// Names only (what previews and logs show).
    pub names: Vec<String>,
    /// Granted variables the server's environment does not hold: not handed over.
    pub missing: Vec<String>,
}

/// Build the allowlisted environment. `home` and `tmp` are the run's private
/// directories (as the script sees them); `lookup` reads the server's own
/// environment, consulted only for `LANG`, `TZ`, `MCP_DATA_DIR` and the
/// granted names.
pub fn script_env(plan: &RunPlan, home: &str, tmp: &str, lookup: &dyn Fn(&str) -> Option<String>) -> ScriptEnv {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    vars.insert("PATH".into(), SCRIPT_PATH.into());
    vars.insert("HOME".into(), home.into());
    vars.insert("TMPDIR".into(), tmp.into());
    vars.insert("LANG".into(), lookup("LANG").filter(|v| !v.is_empty()).unwrap_or_else(|| "C.UTF-8".into()));
    if let Some(tz) = lookup("TZ").filter(|v| !v.is_empty()) {
        vars.insert("TZ".into(), tz);
    }
    if let Some(dir) = lookup("MCP_DATA_DIR").filter(|v| super::grants::is_set(v)) {
        vars.insert("MCP_DATA_DIR".into(), dir);
    }
    let mut missing = Vec::new();
    for name in &plan.granted_env {
        match lookup(name) {
            Some(value) => {
                vars.insert(name.clone(), value);
            }
            None => missing.push(name.clone()),
        }
    }
    let names = vars.keys().cloned().collect();
    ScriptEnv { vars: vars.into_iter().collect(), names, missing }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::discovery::{discover, Limits};
    use std::collections::{BTreeSet, HashMap};

    fn catalog() -> (tempfile::TempDir, Catalog) {
        let t = tempfile::tempdir().unwrap();
        let s = t.path().join("tool");
        std::fs::create_dir_all(s.join("scripts")).unwrap();
        std::fs::write(
            s.join("SKILL.md"),
            "---\nname: tool\ndescription: d\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/run.py\n      interpreter: python\n      env: [API_KEY, OTHER]\n      timeout: 30\n    - script: scripts/x.rb\n      interpreter: ruby\n  egress: [api.example.com]\n---\nbody\n",
        )
        .unwrap();
        std::fs::write(s.join("scripts/run.py"), "print(1)").unwrap();
        std::fs::write(s.join("scripts/x.rb"), "puts 1").unwrap();
        std::fs::write(s.join("scripts/undeclared.py"), "print(2)").unwrap();
        let c = discover(&[t.path().to_path_buf()], Limits::default());
        (t, c)
    }

    fn all() -> BTreeSet<Interpreter> {
        Interpreter::ALL.into_iter().collect()
    }

    fn standalone() -> Grants {
        Grants::resolve(&|_| None, None)
    }

    #[test]
    fn only_declared_scripts_run() {
        let (_t, c) = catalog();
        let err = plan(&c, &standalone(), &all(), "tool", "scripts/undeclared.py", &[]).unwrap_err();
        assert_eq!(err.code(), "not-declared");
        let msg = err.to_string();
        assert!(msg.contains("must be declared"), "{msg}");
        assert!(msg.contains("scripts/run.py, scripts/x.rb"), "{msg}");
        let ok = plan(&c, &standalone(), &all(), "tool", "scripts/run.py", &[]).unwrap();
        assert_eq!((ok.interpreter, ok.timeout_secs), (Interpreter::Python, 30));
    }

    #[test]
    fn unknown_skill_and_bad_paths() {
        let (_t, c) = catalog();
        assert!(plan(&c, &standalone(), &all(), "nope", "x", &[]).unwrap_err().to_string().contains("served skills: tool"));
        for bad in ["../tool/scripts/run.py", "/etc/passwd", "scripts\\run.py", "%2e%2e/x", "scripts/./run.py"] {
            assert_eq!(plan(&c, &standalone(), &all(), "tool", bad, &[]).unwrap_err().code(), "bad-path", "{bad}");
        }
    }

    #[test]
    fn interpreter_outside_the_set_or_missing_here() {
        let (_t, c) = catalog();
        let e = plan(&c, &standalone(), &all(), "tool", "scripts/x.rb", &[]).unwrap_err();
        assert_eq!(e.code(), "unavailable");
        assert!(e.to_string().contains("closed set"));
        let node_only: BTreeSet<_> = [Interpreter::Node].into_iter().collect();
        let e = plan(&c, &standalone(), &node_only, "tool", "scripts/run.py", &[]).unwrap_err();
        assert!(e.to_string().contains("it runs: node"), "{e}");
    }

    #[test]
    fn grants_intersect_and_hosted_runs_nothing() {
        let (_t, c) = catalog();
        let hosted = Grants::resolve(&|k| (k == "MCP_HOST_METER_FILE").then(|| "/m".to_string()), None);
        assert_eq!(plan(&c, &hosted, &all(), "tool", "scripts/run.py", &[]).unwrap_err().code(), "ungranted");
        let rows = r#"[{"skill":"tool","script":"scripts/run.py","env":["API_KEY","UNASKED"]}]"#.to_string();
        let granted = Grants::resolve(&move |k| (k == "MCP_SKILL_RUN").then(|| rows.clone()), None);
        let p = plan(&c, &granted, &all(), "tool", "scripts/run.py", &[]).unwrap();
        assert_eq!(p.granted_env, vec!["API_KEY"]);
    }

    #[test]
    fn argv_limits_at_their_edges() {
        assert!(check_args(&vec!["a".into(); MAX_ARGS]).is_ok());
        assert_eq!(check_args(&vec!["a".into(); MAX_ARGS + 1]), Err(Refusal::TooManyArgs { count: 65 }));
        assert!(check_args(&["x".repeat(MAX_ARG_BYTES)]).is_ok());
        assert_eq!(check_args(&["x".repeat(MAX_ARG_BYTES + 1)]), Err(Refusal::ArgsTooLarge { bytes: 8193 }));
        assert_eq!(check_args(&["ok".into(), "a\0b".into()]), Err(Refusal::NulInArg { index: 1 }));
        // Shell syntax is just text: nothing to refuse.
        assert!(check_args(&["; touch x".into(), "$(whoami)".into(), "`id`".into(), "*".into()]).is_ok());
    }

    #[test]
    fn env_is_an_allowlist_plus_granted_names() {
        let (_t, c) = catalog();
        let p = plan(&c, &standalone(), &all(), "tool", "scripts/run.py", &[]).unwrap();
        let server: HashMap<&str, &str> = [
            ("API_KEY", "k"),
            ("SECRET_OF_SERVER", "s"),
            ("PATH", "/root/.pyenv/shims:/usr/bin"),
            ("LD_PRELOAD", "/evil.so"),
            ("TZ", "UTC"),
        ]
        .into();
        let env = script_env(&p, "/home", "/tmp", &|k| server.get(k).map(|v| v.to_string()));
        assert_eq!(env.names, vec!["API_KEY", "HOME", "LANG", "PATH", "TMPDIR", "TZ"]);
        assert_eq!(env.missing, vec!["OTHER"]);
        let path = env.vars.iter().find(|(k, _)| k == "PATH").unwrap();
        assert_eq!(path.1, SCRIPT_PATH, "never the server's PATH");
        assert!(!env.vars.iter().any(|(k, _)| k == "SECRET_OF_SERVER" || k == "LD_PRELOAD"));
        let with_data = script_env(&p, "/h", "/t", &|k| (k == "MCP_DATA_DIR").then(|| "/data".to_string()));
        assert!(with_data.names.contains(&"MCP_DATA_DIR".to_string()));
    }
}
