//! The execution fence: whether a run may happen, and with what. One
//! decision function, [`decide`], over a backend-neutral description of the
//! skill ([`SkillFacts`]), the owner's grant ([`Grant`]), the deployment's
//! profile ([`Profile`]) and the call ([`Request`]). The standalone server
//! feeds it from its catalog and grants; the controller feeds it from a
//! SkillPackage's status, its runtime profile and the SkillBinding. Both get
//! the same checks, in the same order, with the same messages: the backends
//! differ only in how they start a process.
//!
//! Every rule narrows what runs or what it is handed: only a declared script
//! of a served skill, that the profile allows, granted, with an available
//! interpreter; argv as an array (no shell, capped, no NUL); an environment
//! built from an allowlist plus exactly the granted variables the script
//! asked for; a timeout from the declaration under the profile's ceiling
//! and the hard ceiling.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::Serialize;

use super::catalog::{Catalog, DeclaredScript, Skill};
use super::declaration::Interpreter;
use super::grants::Grants;
use super::limits::{MAX_ARGS, MAX_ARG_BYTES, MAX_TIMEOUT_SECS};
use super::paths::RelPath;

/// Variables every script gets (values chosen by the runner, never the caller).
pub const FIXED_ENV: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR"];
/// The PATH handed to scripts: system directories only, never the server's own PATH.
pub const SCRIPT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Why a run is refused. Every refusal happens before anything starts, at
/// preview time as well as at run time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no skill named `{name}` is served; served skills: {served}")]
    UnknownSkill { name: String, served: String },
    #[error("bad script path {script:?}: {reason}")]
    BadPath { script: String, reason: String },
    #[error(
        "{script} is not a script `{skill}` declares: a script must be declared in the skill's mcp-host: block to run. Declared: {declared}"
    )]
    NotDeclared { skill: String, script: String, declared: String },
    #[error("{script} cannot run here: {reason}")]
    Unavailable { script: String, reason: String },
    #[error("{script} may not run: {reason}")]
    NotAllowed { script: String, reason: String },
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
            Refusal::BadPath { .. } => "bad-path",
            Refusal::NotDeclared { .. } => "not-declared",
            Refusal::Unavailable { .. } => "unavailable",
            Refusal::NotAllowed { .. } => "not-allowed",
            Refusal::Ungranted { .. } => "ungranted",
            Refusal::TooManyArgs { .. } => "too-many-args",
            Refusal::ArgsTooLarge { .. } => "args-too-large",
            Refusal::NulInArg { .. } => "nul-in-arg",
        }
    }

    /// The same refusal as a Kubernetes condition reason (CamelCase).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::UnknownSkill { .. } => "UnknownSkill",
            Refusal::BadPath { .. } => "BadPath",
            Refusal::NotDeclared { .. } => "NotDeclared",
            Refusal::Unavailable { .. } => "Unavailable",
            Refusal::NotAllowed { .. } => "NotAllowed",
            Refusal::Ungranted { .. } => "Ungranted",
            Refusal::TooManyArgs { .. } => "TooManyArgs",
            Refusal::ArgsTooLarge { .. } => "ArgsTooLarge",
            Refusal::NulInArg { .. } => "NulInArg",
        }
    }

    /// The refusal for a skill name nobody serves.
    pub fn unknown_skill<'a>(name: &str, served: impl IntoIterator<Item = &'a str>) -> Refusal {
        let served: Vec<&str> = served.into_iter().collect();
        Refusal::UnknownSkill { name: name.to_string(), served: if served.is_empty() { "none".into() } else { served.join(", ") } }
    }
}

/// One declared script as the fence sees it, whichever backend holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptFacts {
    pub script: String,
    /// `None` when the declared interpreter is missing or outside the closed set.
    pub interpreter: Option<Interpreter>,
    /// Variables the script asks for.
    pub env: Vec<String>,
    /// Timeout from the declaration (already under the hard ceiling).
    pub timeout_secs: u64,
    /// Why the package itself keeps this script from running (missing file,
    /// symlink escape, refused declaration).
    pub unavailable: Option<String>,
}

impl From<&DeclaredScript> for ScriptFacts {
    fn from(s: &DeclaredScript) -> Self {
        ScriptFacts {
            script: s.decl.script.to_string(),
            interpreter: s.decl.interpreter,
            env: s.decl.env.clone(),
            timeout_secs: s.decl.timeout_secs,
            unavailable: s.unavailable.clone().or_else(|| s.decl.refused.clone()),
        }
    }
}

/// A skill as the fence sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFacts {
    pub name: String,
    /// Declared scripts in declaration order.
    pub scripts: Vec<ScriptFacts>,
    /// Hosts the skill proposes to reach (a proposal: the grant decides).
    pub egress: Vec<String>,
}

impl From<&Skill> for SkillFacts {
    fn from(skill: &Skill) -> Self {
        SkillFacts {
            name: skill.name.clone(),
            scripts: skill.scripts.iter().map(ScriptFacts::from).collect(),
            egress: skill.egress.clone(),
        }
    }
}

impl SkillFacts {
    pub fn script(&self, path: &str) -> Option<&ScriptFacts> {
        self.scripts.iter().find(|s| s.script == path)
    }
}

/// The owner's word on what may run: the standalone grants, or a SkillBinding.
pub trait Grant {
    /// The variables this script receives (`Ok`: the requested names it is
    /// granted), or why it is not granted at all.
    fn env(&self, skill: &str, script: &str, requested: &[String]) -> Result<Vec<String>, String>;
    /// Whether this script may use the network for the skill's proposed hosts.
    fn egress(&self, skill: &str, script: &str) -> bool;
}

impl Grant for Grants {
    fn env(&self, skill: &str, script: &str, requested: &[String]) -> Result<Vec<String>, String> {
        self.decide(skill, script, requested)
    }
    fn egress(&self, skill: &str, script: &str) -> bool {
        self.egress_allowed(skill, script)
    }
}

/// Everything granted: what a package's status reports before any binding
/// (the binding's grant is applied when a run is admitted).
pub struct AnyGrant;

impl Grant for AnyGrant {
    fn env(&self, _: &str, _: &str, requested: &[String]) -> Result<Vec<String>, String> {
        Ok(requested.to_vec())
    }
    fn egress(&self, _: &str, _: &str) -> bool {
        true
    }
}

/// What the deployment can and will run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Interpreters this deployment runs (found on the machine, or the one
    /// the runtime profile's image holds).
    pub interpreters: BTreeSet<Interpreter>,
    /// Scripts the admin allows (`None`: every declared script).
    pub allowed_scripts: Option<BTreeSet<String>>,
    /// The admin's timeout ceiling in seconds (`None`: the hard ceiling).
    pub timeout_ceiling_secs: Option<u64>,
}

impl Profile {
    /// A machine that runs these interpreters, every declared script, with the hard ceiling.
    pub fn local(interpreters: BTreeSet<Interpreter>) -> Profile {
        Profile { interpreters, allowed_scripts: None, timeout_ceiling_secs: None }
    }

    fn ceiling(&self) -> u64 {
        self.timeout_ceiling_secs.unwrap_or(MAX_TIMEOUT_SECS).clamp(1, MAX_TIMEOUT_SECS)
    }
}

/// The call.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub script: &'a str,
    pub args: &'a [String],
    /// A lower timeout the caller asks for (seconds); never raises it.
    pub timeout_secs: Option<u64>,
}

/// A checked run: everything a backend needs, nothing it may choose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub skill: String,
    pub script: RelPath,
    pub interpreter: Interpreter,
    pub args: Vec<String>,
    /// Granted variables the script asked for, in declaration order.
    pub granted_env: Vec<String>,
    pub timeout_secs: u64,
    /// Hosts the skill proposes.
    pub egress: Vec<String>,
    /// Whether the grant lets the run use the network for them.
    pub egress_granted: bool,
}

/// The status of one declared script, as `skill_list` and a package's
/// status report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptStatus {
    /// May run, receiving exactly these granted variables (names).
    Runnable { env: Vec<String> },
    /// Cannot run here whatever the grant says: the package or the deployment forbids it.
    Unavailable(String),
    /// The admin's profile does not allow it.
    NotAllowed(String),
    /// Could run, but the owner has not granted it.
    Ungranted(String),
}

impl ScriptStatus {
    pub fn label(&self) -> &'static str {
        match self {
            ScriptStatus::Runnable { .. } => "runnable",
            ScriptStatus::Unavailable(_) => "unavailable",
            ScriptStatus::NotAllowed(_) => "not-allowed",
            ScriptStatus::Ungranted(_) => "ungranted",
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            ScriptStatus::Runnable { .. } => None,
            ScriptStatus::Unavailable(r) | ScriptStatus::NotAllowed(r) | ScriptStatus::Ungranted(r) => Some(r),
        }
    }
}

/// The interpreters a deployment can run, for messages.
pub fn interpreter_set_text(available: &BTreeSet<Interpreter>) -> String {
    if available.is_empty() {
        "none".into()
    } else {
        available.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
    }
}

/// One script's status. A script the package cannot run is unavailable
/// whatever else holds; then the admin's allowlist; then whether its
/// interpreter is here; then the owner's grant. Neither an admin nor a grant
/// can make a missing file or an absent interpreter runnable, and a grant
/// cannot widen the profile.
pub fn script_status(skill: &str, script: &ScriptFacts, grant: &dyn Grant, profile: &Profile) -> ScriptStatus {
    if let Some(reason) = &script.unavailable {
        return ScriptStatus::Unavailable(reason.clone());
    }
    if let Some(allowed) = &profile.allowed_scripts {
        if !allowed.contains(&script.script) {
            return ScriptStatus::NotAllowed("not in the runtime profile's allowedScripts".into());
        }
    }
    let Some(interpreter) = script.interpreter else {
        return ScriptStatus::Unavailable("no interpreter from the closed set is declared".into());
    };
    if !profile.interpreters.contains(&interpreter) {
        return ScriptStatus::Unavailable(format!(
            "declared for {interpreter}, which is not available in this deployment (it runs: {})",
            interpreter_set_text(&profile.interpreters)
        ));
    }
    match grant.env(skill, &script.script, &script.env) {
        Ok(env) => ScriptStatus::Runnable { env },
        Err(reason) => ScriptStatus::Ungranted(reason),
    }
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

/// Decide whether `request` may run, and how. The only run check in the
/// project: every backend calls it.
pub fn decide(skill: &SkillFacts, grant: &dyn Grant, profile: &Profile, request: &Request<'_>) -> Result<Decision, Refusal> {
    let rel = RelPath::parse(request.script).map_err(|e| Refusal::BadPath { script: request.script.to_string(), reason: e.to_string() })?;
    let declared = skill.script(rel.as_str()).ok_or_else(|| Refusal::NotDeclared {
        skill: skill.name.clone(),
        script: request.script.to_string(),
        declared: if skill.scripts.is_empty() {
            "none".into()
        } else {
            skill.scripts.iter().map(|s| s.script.as_str()).collect::<Vec<_>>().join(", ")
        },
    })?;
    check_args(request.args)?;
    let script = request.script.to_string();
    let granted_env = match script_status(&skill.name, declared, grant, profile) {
        ScriptStatus::Runnable { env } => env,
        ScriptStatus::Unavailable(reason) => return Err(Refusal::Unavailable { script, reason }),
        ScriptStatus::NotAllowed(reason) => return Err(Refusal::NotAllowed { script, reason }),
        ScriptStatus::Ungranted(reason) => return Err(Refusal::Ungranted { script, reason }),
    };
    let interpreter = declared.interpreter.ok_or_else(|| Refusal::Unavailable { script, reason: "no interpreter declared".into() })?;
    let ceiling = declared.timeout_secs.min(profile.ceiling());
    let timeout_secs = request.timeout_secs.map_or(ceiling, |t| t.min(ceiling)).max(1);
    Ok(Decision {
        skill: skill.name.clone(),
        script: rel,
        interpreter,
        args: request.args.to_vec(),
        granted_env,
        timeout_secs,
        egress_granted: !skill.egress.is_empty() && grant.egress(&skill.name, declared.script.as_str()),
        egress: skill.egress.clone(),
    })
}

/// A checked run of a skill served from a directory on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPlan {
    pub decision: Decision,
    /// The skill's real directory.
    pub skill_dir: PathBuf,
}

impl std::ops::Deref for RunPlan {
    type Target = Decision;
    fn deref(&self) -> &Decision {
        &self.decision
    }
}

/// [`decide`] over a catalog: the standalone server's and the gateway's path.
pub fn plan(catalog: &Catalog, grant: &dyn Grant, profile: &Profile, skill_name: &str, request: &Request<'_>) -> Result<RunPlan, Refusal> {
    let skill = catalog.get(skill_name).ok_or_else(|| Refusal::unknown_skill(skill_name, catalog.names()))?;
    let decision = decide(&SkillFacts::from(skill), grant, profile, request)?;
    Ok(RunPlan { decision, skill_dir: skill.dir.clone() })
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
/// granted names. `extra` are variables the runner itself sets (the egress
/// proxy's address, for instance): reserved names a skill cannot ask for.
pub fn script_env(
    decision: &Decision,
    home: &str,
    tmp: &str,
    extra: &[(String, String)],
    lookup: &dyn Fn(&str) -> Option<String>,
) -> ScriptEnv {
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
    for name in &decision.granted_env {
        match lookup(name) {
            Some(value) => {
                vars.insert(name.clone(), value);
            }
            None => missing.push(name.clone()),
        }
    }
    for (name, value) in extra {
        vars.insert(name.clone(), value.clone());
    }
    let names = vars.keys().cloned().collect();
    ScriptEnv { vars: vars.into_iter().collect(), names, missing }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::discovery::{discover, Limits};
    use std::collections::HashMap;

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

    fn all() -> Profile {
        Profile::local(Interpreter::ALL.into_iter().collect())
    }

    fn standalone() -> Grants {
        Grants::resolve(&|_| None, None)
    }

    fn req<'a>(script: &'a str, args: &'a [String]) -> Request<'a> {
        Request { script, args, timeout_secs: None }
    }

    #[test]
    fn only_declared_scripts_run() {
        let (_t, c) = catalog();
        let err = plan(&c, &standalone(), &all(), "tool", &req("scripts/undeclared.py", &[])).unwrap_err();
        assert_eq!(err.code(), "not-declared");
        let msg = err.to_string();
        assert!(msg.contains("must be declared"), "{msg}");
        assert!(msg.contains("scripts/run.py, scripts/x.rb"), "{msg}");
        let ok = plan(&c, &standalone(), &all(), "tool", &req("scripts/run.py", &[])).unwrap();
        assert_eq!((ok.interpreter, ok.timeout_secs), (Interpreter::Python, 30));
    }

    #[test]
    fn unknown_skill_and_bad_paths() {
        let (_t, c) = catalog();
        assert!(plan(&c, &standalone(), &all(), "nope", &req("x", &[])).unwrap_err().to_string().contains("served skills: tool"));
        for bad in ["../tool/scripts/run.py", "/etc/passwd", "scripts\\run.py", "%2e%2e/x", "scripts/./run.py"] {
            assert_eq!(plan(&c, &standalone(), &all(), "tool", &req(bad, &[])).unwrap_err().code(), "bad-path", "{bad}");
        }
    }

    #[test]
    fn interpreter_outside_the_set_or_missing_here() {
        let (_t, c) = catalog();
        let e = plan(&c, &standalone(), &all(), "tool", &req("scripts/x.rb", &[])).unwrap_err();
        assert_eq!(e.code(), "unavailable");
        assert!(e.to_string().contains("closed set"));
        let node_only = Profile::local([Interpreter::Node].into_iter().collect());
        let e = plan(&c, &standalone(), &node_only, "tool", &req("scripts/run.py", &[])).unwrap_err();
        assert!(e.to_string().contains("it runs: node"), "{e}");
    }

    #[test]
    fn the_profile_narrows_and_caps() {
        let (_t, c) = catalog();
        let mut p = all();
        p.allowed_scripts = Some(BTreeSet::new());
        assert_eq!(plan(&c, &standalone(), &p, "tool", &req("scripts/run.py", &[])).unwrap_err().code(), "not-allowed");
        p.allowed_scripts = Some(["scripts/run.py".to_string()].into());
        p.timeout_ceiling_secs = Some(10);
        assert_eq!(plan(&c, &standalone(), &p, "tool", &req("scripts/run.py", &[])).unwrap().timeout_secs, 10);
        // A caller may lower the timeout, never raise it.
        let args: Vec<String> = vec![];
        let lower = Request { script: "scripts/run.py", args: &args, timeout_secs: Some(3) };
        assert_eq!(plan(&c, &standalone(), &p, "tool", &lower).unwrap().timeout_secs, 3);
        let higher = Request { script: "scripts/run.py", args: &args, timeout_secs: Some(999) };
        assert_eq!(plan(&c, &standalone(), &p, "tool", &higher).unwrap().timeout_secs, 10);
    }

    #[test]
    fn grants_intersect_and_hosted_runs_nothing() {
        let (_t, c) = catalog();
        let hosted = Grants::resolve(&|k| (k == "MCP_HOST_METER_FILE").then(|| "/m".to_string()), None);
        assert_eq!(plan(&c, &hosted, &all(), "tool", &req("scripts/run.py", &[])).unwrap_err().code(), "ungranted");
        let rows = r#"[{"skill":"tool","script":"scripts/run.py","env":["API_KEY","UNASKED"]}]"#.to_string();
        let granted = Grants::resolve(&move |k| (k == "MCP_SKILL_RUN").then(|| rows.clone()), None);
        let p = plan(&c, &granted, &all(), "tool", &req("scripts/run.py", &[])).unwrap();
        assert_eq!(p.granted_env, vec!["API_KEY"]);
        assert!(!p.egress_granted, "a grant row without egress: true grants no network");
        assert!(plan(&c, &standalone(), &all(), "tool", &req("scripts/run.py", &[])).unwrap().egress_granted);
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
        let p = plan(&c, &standalone(), &all(), "tool", &req("scripts/run.py", &[])).unwrap();
        let server: HashMap<&str, &str> = [
            ("API_KEY", "k"),
            ("SECRET_OF_SERVER", "s"),
            ("PATH", "/root/.pyenv/shims:/usr/bin"),
            ("LD_PRELOAD", "/evil.so"),
            ("TZ", "UTC"),
        ]
        .into();
        let env = script_env(&p, "/home", "/tmp", &[], &|k| server.get(k).map(|v| v.to_string()));
        assert_eq!(env.names, vec!["API_KEY", "HOME", "LANG", "PATH", "TMPDIR", "TZ"]);
        assert_eq!(env.missing, vec!["OTHER"]);
        let path = env.vars.iter().find(|(k, _)| k == "PATH").unwrap();
        assert_eq!(path.1, SCRIPT_PATH, "never the server's PATH");
        assert!(!env.vars.iter().any(|(k, _)| k == "SECRET_OF_SERVER" || k == "LD_PRELOAD"));
        let with_data = script_env(&p, "/h", "/t", &[], &|k| (k == "MCP_DATA_DIR").then(|| "/data".to_string()));
        assert!(with_data.names.contains(&"MCP_DATA_DIR".to_string()));
    }
}
