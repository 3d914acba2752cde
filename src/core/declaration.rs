//! The optional `mcp-host:` block: which files are entry points and what each
//! asks for.
//!
//! A declaration restricts, it never grants: the author of the scripts wrote
//! this block too, so nothing in it authorises anything. It is read strictly:
//! a structural error costs the skill its scripts (never its instructions),
//! an unknown major version ignores the block, unknown keys are ignored and
//! reported by name, and a script that asks for a reserved variable is kept
//! visible but can never run.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

use super::limits::{DEFAULT_TIMEOUT_SECS, MAX_TIMEOUT_SECS};
use super::paths::RelPath;
use super::problems::Reason;
use super::spec::{kind, Finding};

/// The declaration major version this server reads.
pub const SUPPORTED_VERSION: i64 = 1;

/// The closed interpreter set. Named by the declaration, never inferred from
/// a file's extension or shebang: a file that can pick its interpreter has
/// already picked its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Interpreter {
    Node,
    Python,
    Bash,
}

impl Interpreter {
    pub const ALL: [Interpreter; 3] = [Interpreter::Node, Interpreter::Python, Interpreter::Bash];

    pub fn name(self) -> &'static str {
        match self {
            Interpreter::Node => "node",
            Interpreter::Python => "python",
            Interpreter::Bash => "bash",
        }
    }

    /// The program looked up on PATH for this interpreter.
    pub fn program(self) -> &'static str {
        match self {
            Interpreter::Node => "node",
            Interpreter::Python => "python3",
            Interpreter::Bash => "bash",
        }
    }

    pub fn from_name(name: &str) -> Option<Interpreter> {
        Interpreter::ALL.into_iter().find(|i| i.name() == name)
    }
}

impl fmt::Display for Interpreter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One `run[]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptDecl {
    pub script: RelPath,
    /// `None` when the declared interpreter is missing or outside the closed set.
    pub interpreter: Option<Interpreter>,
    /// The interpreter as written, for messages.
    pub interpreter_text: Option<String>,
    /// Variables this script asks for.
    pub env: Vec<String>,
    pub timeout_secs: u64,
    /// Why this script can never run, decided from the declaration alone.
    pub refused: Option<String>,
}

/// One `env[]` entry: a variable proposed for the server's environment.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct EnvDecl {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub secret: bool,
    pub required: bool,
}

/// A parsed `mcp-host:` block.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Declaration {
    pub scripts: Vec<ScriptDecl>,
    pub env: Vec<EnvDecl>,
    pub egress: Vec<String>,
}

impl Declaration {
    pub fn script(&self, path: &str) -> Option<&ScriptDecl> {
        self.scripts.iter().find(|s| s.script.as_str() == path)
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters.
pub use super::env::is_identifier as is_env_identifier;
/// Whether a variable name is reserved (one list for every backend: [`super::env`]).
pub use super::env::is_reserved as is_reserved_env;

/// A host pattern: `api.example.com`, `*.example.com`, optionally `:port`.
pub fn is_host_pattern(pattern: &str) -> bool {
    let (host, port) = match pattern.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (pattern, None),
    };
    if let Some(port) = port {
        if !port.parse::<u16>().is_ok_and(|p| p > 0) {
            return false;
        }
    }
    let host = host.strip_prefix("*.").unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// Parse the value of `mcp-host`. `None` means the skill gets no scripts
/// (block broken or of an unknown version); the findings say why.
pub fn parse(value: &Value) -> (Option<Declaration>, Vec<Finding>) {
    let mut findings = Vec::new();
    match parse_block(value, &mut findings) {
        Ok(decl) => (decl, findings),
        Err(why) => {
            findings.push((Reason::Declaration, format!("mcp-host: {why}; the skill's scripts are not served")));
            (None, findings)
        }
    }
}

fn parse_block(value: &Value, findings: &mut Vec<Finding>) -> Result<Option<Declaration>, String> {
    let block = value.as_object().ok_or_else(|| format!("must be a mapping, found {}", kind(value)))?;
    report_unknown(block, &["version", "run", "env", "egress"], "mcp-host", findings);
    match block.get("version") {
        None => return Err("`version` is required (use `version: 1`)".into()),
        Some(Value::Number(n)) if n.as_i64() == Some(SUPPORTED_VERSION) => {}
        Some(Value::Number(n)) if n.is_i64() => {
            findings.push((
                Reason::DeclarationVersion,
                format!("mcp-host version {n} is not one this server reads (it reads {SUPPORTED_VERSION}); the block is ignored"),
            ));
            return Ok(None);
        }
        Some(other) => return Err(format!("`version` must be an integer, found {}", kind(other))),
    }

    let mut decl = Declaration::default();
    for (i, item) in list(block, "env")?.iter().enumerate() {
        let entry = item.as_object().ok_or_else(|| format!("env[{i}] must be a mapping"))?;
        report_unknown(entry, &["name", "description", "secret", "required"], &format!("mcp-host.env[{i}]"), findings);
        let name = string(entry, "name", &format!("env[{i}]"))?.ok_or_else(|| format!("env[{i}] needs a `name`"))?;
        if !is_env_identifier(&name) {
            return Err(format!("env[{i}].name {name:?} is not a variable name"));
        }
        decl.env.push(EnvDecl {
            description: string(entry, "description", &format!("env[{i}]"))?,
            secret: boolean(entry, "secret", &format!("env[{i}]"))?,
            required: boolean(entry, "required", &format!("env[{i}]"))?,
            name,
        });
    }

    for (i, item) in list(block, "egress")?.iter().enumerate() {
        let Value::String(pattern) = item else {
            return Err(format!("egress[{i}] must be a host name, found {}", kind(item)));
        };
        if is_host_pattern(pattern) {
            decl.egress.push(pattern.clone());
        } else {
            findings.push((
                Reason::Declaration,
                format!("egress[{i}] {pattern:?} is not a host pattern (host, *.domain, optional :port); dropped"),
            ));
        }
    }

    for (i, item) in list(block, "run")?.iter().enumerate() {
        let entry = item.as_object().ok_or_else(|| format!("run[{i}] must be a mapping"))?;
        report_unknown(entry, &["script", "interpreter", "env", "timeout"], &format!("mcp-host.run[{i}]"), findings);
        let raw = string(entry, "script", &format!("run[{i}]"))?.ok_or_else(|| format!("run[{i}] needs a `script` path"))?;
        let script = match RelPath::parse(&raw) {
            Ok(path) => path,
            Err(err) => {
                findings.push((Reason::Declaration, format!("run[{i}].script {raw:?}: {err}; not declared")));
                continue;
            }
        };
        if decl.script(script.as_str()).is_some() {
            findings.push((Reason::Declaration, format!("run[{i}] declares {script} a second time; ignored")));
            continue;
        }
        let mut refused = None;
        let interpreter_text = string(entry, "interpreter", &format!("run[{i}]"))?;
        let interpreter = match interpreter_text.as_deref() {
            None => {
                refused = Some(format!(
                    "{script} declares no interpreter; it is never inferred from the extension or shebang (use one of node, python, bash)"
                ));
                None
            }
            Some(text) => {
                let known = Interpreter::from_name(text);
                if known.is_none() {
                    refused = Some(format!("interpreter `{text}` is not in the closed set (node, python, bash)"));
                }
                known
            }
        };
        let mut env = Vec::new();
        for (j, var) in list(entry, "env")?.iter().enumerate() {
            let Value::String(var) = var else {
                return Err(format!("run[{i}].env[{j}] must be a variable name, found {}", kind(var)));
            };
            if !is_env_identifier(var) {
                return Err(format!("run[{i}].env[{j}] {var:?} is not a variable name"));
            }
            if is_reserved_env(var) {
                findings.push((Reason::ReservedEnv, format!("{script} asks for {var}, a reserved variable; the script cannot run")));
                refused.get_or_insert_with(|| format!("asks for the reserved variable {var}"));
                continue;
            }
            if !decl.env.iter().any(|e| &e.name == var) {
                findings.push((Reason::Declaration, format!("{script} asks for {var}, which env[] does not describe")));
            }
            if !env.contains(var) {
                env.push(var.clone());
            }
        }
        let timeout_secs = match entry.get("timeout") {
            None => DEFAULT_TIMEOUT_SECS,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(0) | None => {
                    findings.push((
                        Reason::Declaration,
                        format!("{script}: timeout {n} is not a positive whole number of seconds; {DEFAULT_TIMEOUT_SECS} s used"),
                    ));
                    DEFAULT_TIMEOUT_SECS
                }
                Some(secs) if secs > MAX_TIMEOUT_SECS => {
                    findings
                        .push((Reason::TimeoutClamped, format!("{script}: timeout {secs} s clamped to the {MAX_TIMEOUT_SECS} s ceiling")));
                    MAX_TIMEOUT_SECS
                }
                Some(secs) => secs,
            },
            Some(other) => return Err(format!("run[{i}].timeout must be seconds, found {}", kind(other))),
        };
        decl.scripts.push(ScriptDecl { script, interpreter, interpreter_text, env, timeout_secs, refused });
    }
    Ok(Some(decl))
}

fn report_unknown(map: &Map<String, Value>, known: &[&str], at: &str, findings: &mut Vec<Finding>) {
    let unknown: Vec<&str> = map.keys().map(String::as_str).filter(|k| !known.contains(k)).collect();
    if !unknown.is_empty() {
        findings.push((Reason::DeclarationUnknownKey, format!("{at}: unknown keys ignored: {}", unknown.join(", "))));
    }
}

fn list<'a>(map: &'a Map<String, Value>, key: &str) -> Result<&'a [Value], String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("`{key}` must be a list, found {}", kind(other))),
    }
}

fn string(map: &Map<String, Value>, key: &str, at: &str) -> Result<Option<String>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{at}.{key} must be text, found {}", kind(other))),
    }
}

fn boolean(map: &Map<String, Value>, key: &str, at: &str) -> Result<bool, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{at}.{key} must be true or false, found {}", kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reasons(f: &[Finding]) -> Vec<Reason> {
        f.iter().map(|x| x.0).collect()
    }

    #[test]
    fn full_block_parses() {
        let (decl, f) = parse(&json!({
            "version": 1,
            "run": [{"script":"scripts/forecast.js","interpreter":"node","env":["WEATHER_API_KEY"],"timeout":30}],
            "env": [{"name":"WEATHER_API_KEY","secret":true,"required":true,"description":"key"}],
            "egress": ["api.weather.example", "*.example.org:443"]
        }));
        assert!(f.is_empty(), "{f:?}");
        let decl = decl.unwrap();
        let s = &decl.scripts[0];
        assert_eq!((s.script.as_str(), s.interpreter, s.timeout_secs), ("scripts/forecast.js", Some(Interpreter::Node), 30));
        assert_eq!(s.env, vec!["WEATHER_API_KEY"]);
        assert!(s.refused.is_none());
        assert_eq!(decl.egress.len(), 2);
        assert!(decl.env[0].secret);
    }

    #[test]
    fn unknown_major_ignores_block() {
        let (decl, f) = parse(&json!({"version": 2, "run": [{"script":"a.js","interpreter":"node"}]}));
        assert!(decl.is_none());
        assert_eq!(reasons(&f), vec![Reason::DeclarationVersion]);
    }

    #[test]
    fn structural_errors_cost_the_scripts() {
        for bad in [
            json!("text"),
            json!({"run": []}),
            json!({"version": "1"}),
            json!({"version": 1, "run": "a.js"}),
            json!({"version": 1, "run": ["a.js"]}),
            json!({"version": 1, "run": [{"interpreter":"node"}]}),
            json!({"version": 1, "run": [{"script":"a.js","interpreter":"node","env":"X"}]}),
            json!({"version": 1, "run": [{"script":"a.js","interpreter":"node","env":["1X"]}]}),
            json!({"version": 1, "run": [{"script":"a.js","interpreter":"node","timeout":"30s"}]}),
            json!({"version": 1, "env": [{"secret":true}]}),
        ] {
            let (decl, f) = parse(&bad);
            assert!(decl.is_none(), "{bad}");
            assert_eq!(f.last().unwrap().0, Reason::Declaration, "{bad}");
        }
    }

    #[test]
    fn unknown_keys_reported_by_name() {
        let (decl, f) = parse(&json!({"version":1,"color":"red","run":[{"script":"a.js","interpreter":"node","shell":true}]}));
        assert!(decl.is_some());
        assert_eq!(reasons(&f), vec![Reason::DeclarationUnknownKey, Reason::DeclarationUnknownKey]);
        assert!(f[0].1.contains("color") && f[1].1.contains("shell"));
    }

    #[test]
    fn timeout_edges() {
        let t = |v: Value| {
            let (d, f) = parse(&json!({"version":1,"run":[{"script":"a.js","interpreter":"node","timeout":v}]}));
            (d.unwrap().scripts[0].timeout_secs, reasons(&f))
        };
        assert_eq!(t(json!(300)), (300, vec![]));
        assert_eq!(t(json!(301)), (300, vec![Reason::TimeoutClamped]));
        assert_eq!(t(json!(1)), (1, vec![]));
        assert_eq!(t(json!(0)), (DEFAULT_TIMEOUT_SECS, vec![Reason::Declaration]));
        assert_eq!(t(json!(-5)), (DEFAULT_TIMEOUT_SECS, vec![Reason::Declaration]));
    }

    #[test]
    fn reserved_env_refuses_the_script() {
        for var in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "NODE_OPTIONS",
            "PYTHONPATH",
            "NODE_REPL_EXTERNAL_MODULE",
            "MCP_SKILL_RUN",
            "SKILLS_DIR",
            "PATH",
            "BASH_ENV",
        ] {
            let (d, f) = parse(&json!({"version":1,"run":[{"script":"a.js","interpreter":"node","env":[var]}]}));
            let s = &d.unwrap().scripts[0];
            assert!(s.refused.as_deref().unwrap().contains(var), "{var}");
            assert!(s.env.is_empty());
            assert_eq!(f[0].0, Reason::ReservedEnv);
        }
    }

    #[test]
    fn interpreter_is_never_inferred() {
        let (d, _) = parse(
            &json!({"version":1,"run":[{"script":"a.py"},{"script":"b.rb","interpreter":"ruby"},{"script":"c.py","interpreter":"python"}]}),
        );
        let d = d.unwrap();
        assert!(d.scripts[0].interpreter.is_none() && d.scripts[0].refused.as_deref().unwrap().contains("never inferred"));
        assert!(d.scripts[1].refused.as_deref().unwrap().contains("closed set"));
        assert_eq!(d.scripts[2].interpreter, Some(Interpreter::Python));
    }

    #[test]
    fn bad_script_paths_and_duplicates_are_dropped() {
        let (d, f) = parse(&json!({"version":1,"run":[
            {"script":"../x.js","interpreter":"node"},
            {"script":"/abs.js","interpreter":"node"},
            {"script":"ok.js","interpreter":"node"},
            {"script":"ok.js","interpreter":"bash"}]}));
        let d = d.unwrap();
        assert_eq!(d.scripts.len(), 1);
        assert_eq!(reasons(&f), vec![Reason::Declaration; 3]);
    }

    #[test]
    fn egress_patterns() {
        for ok in ["api.example.com", "*.example.com", "example.com:8443", "localhost"] {
            assert!(is_host_pattern(ok), "{ok}");
        }
        for bad in ["", "*", "http://x.com", "x.com/path", "X.COM", "a..b", "-a.com", "x.com:0", "x.com:99999", "*.*.com"] {
            assert!(!is_host_pattern(bad), "{bad}");
        }
    }
}
