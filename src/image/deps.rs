//! The dependency step: install a package's declared dependencies into a
//! tree that becomes the image's dependency layer, running no package code.
//! The controller runs it (the hidden `skill-operator image deps`) inside a
//! restricted build Job whose only network is the package indexes.
//!
//! # What is installed
//! - `requirements.txt` at the package root: `python3 -m pip install
//!   --isolated --only-binary=:all: --no-compile --no-cache-dir --target
//!   <out>/python -r <normalised copy>`. Wheels only: an sdist would run its
//!   build backend (package code), so pip finding no wheel for a
//!   requirement is a refusal naming it ([`DepsError::NoWheel`]). The file
//!   may hold requirement lines only (name, extras, version specifiers,
//!   markers, `--hash`); options (`-r`, `-e`, `--index-url`,
//!   `--no-binary`, `--find-links`…), URLs and paths are refused: the
//!   index is the admin's choice, not the package's.
//! - `package-lock.json` with `package.json` at the root: both are copied to
//!   `<out>/node`, then `npm ci --ignore-scripts --omit=dev --no-audit
//!   --no-fund` there (user and global npmrc ignored). A `package.json`
//!   without a lockfile is refused ([`DepsError::NoLockfile`]): without it
//!   the installed versions are whatever the registry says today. Lifecycle
//!   scripts (`preinstall`, `install`, `postinstall`, and the implicit
//!   `node-gyp rebuild` of a `binding.gyp`) are never run; the report lists
//!   every package that declares one, and
//!   [`DepsOptions::refuse_lifecycle_scripts`] turns them into a refusal.
//!
//! # Output
//! `<out>/python/…` and `<out>/node/{package.json,package-lock.json,
//! node_modules/…}`; the controller makes `<out>` the layer under `/deps`
//! ([`super::layer::from_dir`] with prefix `deps`) and sets the
//! environment from [`DepsReport::env`] (`PYTHONPATH=/deps/python`,
//! `NODE_PATH=/deps/node/node_modules`). The [`DepsReport`] (printed as
//! JSON) carries the lock digest and the dependency list for the SBOM.
//!
//! # The lock digest
//! `sha256` of `skill-operator-deps-v1\n` followed by, for each present
//! file, `requirements.txt <sha256 of the normalised lines>\n` and
//! `package-lock.json <sha256 of its canonical JSON>\n`. Normalised
//! requirements: comments and blank lines dropped, continuations joined,
//! whitespace collapsed, lines sorted. Canonical lock: keys sorted, compact.
//! So reformatting either file keeps the digest; changing what is pinned
//! changes it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::limits::{
    DEPS_TIMEOUT, MAX_DEPENDENCIES, MAX_LOCKFILE_BYTES, MAX_METADATA_BYTES, MAX_REQUIREMENTS_BYTES, TOOL_OUTPUT_TAIL_BYTES,
};

pub const REQUIREMENTS: &str = "requirements.txt";
pub const PACKAGE_JSON: &str = "package.json";
pub const PACKAGE_LOCK: &str = "package-lock.json";
/// Where the Python tree lands in the image.
pub const PYTHON_PATH: &str = "/deps/python";
/// Where `node_modules` lands in the image.
pub const NODE_PATH: &str = "/deps/node/node_modules";
/// The layer prefix of the dependency tree.
pub const DEPS_PREFIX: &str = "deps";

/// npm lifecycle stages that `npm ci` would run for a dependency.
const INSTALL_STAGES: [&str; 3] = ["preinstall", "install", "postinstall"];

/// Why the dependency step refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum DepsError {
    #[error("{detail}; commit a package-lock.json (npm install --package-lock-only) so that exactly those versions are installed")]
    NoLockfile { detail: String },
    #[error("requirements.txt line {line:?}: {reason}; list only requirements (name, extras, versions, markers, --hash): the index is configured by the admin")]
    BadRequirement { line: String, reason: String },
    #[error("no wheel of {package} on the index: installing it would build an sdist, which runs the package's build code, so it is refused; publish a wheel to the mirror or point the runtime profile at a prebuilt image\n{tail}")]
    NoWheel { package: String, tail: String },
    #[error("these dependencies declare install scripts, which are never run: {list}; remove them or point the runtime profile at a prebuilt image")]
    LifecycleScripts { list: String },
    #[error("cannot run {tool}: {source}; install it in the build image")]
    ToolMissing {
        tool: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} failed ({status})\n{tail}")]
    ToolFailed { tool: String, status: String, tail: String },
    #[error("{tool} ran longer than {after:?}; check the index is reachable through the egress proxy")]
    Timeout { tool: String, after: Duration },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

type Result<T, E = DepsError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DepsError + '_ {
    move |source| DepsError::Io { path: path.to_path_buf(), source }
}

/// The ecosystem a dependency comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    Pypi,
    Npm,
}

/// One installed dependency.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dependency {
    pub ecosystem: Ecosystem,
    pub name: String,
    pub version: String,
    /// Package URL (`pkg:pypi/name@version`, `pkg:npm/%40scope/name@version`).
    pub purl: String,
}

impl Dependency {
    fn new(ecosystem: Ecosystem, name: &str, version: &str) -> Self {
        let purl = match ecosystem {
            // PEP 503 normalised name, as purl's pypi type asks.
            Ecosystem::Pypi => format!("pkg:pypi/{}@{version}", normalise_pypi_name(name)),
            Ecosystem::Npm => format!("pkg:npm/{}@{version}", name.replace('@', "%40")),
        };
        Dependency { ecosystem, name: name.into(), version: version.into(), purl }
    }
}

/// A dependency that declares install-time scripts (not run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleScript {
    pub package: String,
    pub version: String,
    /// Stage → command (`install` → `node-gyp rebuild` for a `binding.gyp`).
    pub scripts: BTreeMap<String, String>,
}

/// What a package needs, read without installing anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DepsPlan {
    /// Normalised requirement lines, when there is a `requirements.txt`.
    pub requirements: Option<Vec<String>>,
    /// Whether a `package.json` + `package-lock.json` pair is there.
    pub npm_lock: bool,
    /// See the module docs; `None` when there is nothing to install.
    pub lock_digest: Option<String>,
}

impl DepsPlan {
    pub fn is_empty(&self) -> bool {
        self.requirements.is_none() && !self.npm_lock
    }
}

/// Reads what `package_dir` declares and computes the lock digest.
pub fn plan(package_dir: &Path) -> Result<DepsPlan> {
    let req_path = package_dir.join(REQUIREMENTS);
    let requirements = match read_capped(&req_path, MAX_REQUIREMENTS_BYTES)? {
        None => None,
        Some(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| DepsError::Invalid { path: req_path.clone(), detail: "not UTF-8".into() })?;
            Some(normalise_requirements(&text)?)
        }
    };
    let pkg = package_dir.join(PACKAGE_JSON);
    let lock_path = package_dir.join(PACKAGE_LOCK);
    let lock = read_capped(&lock_path, MAX_LOCKFILE_BYTES)?;
    let has_pkg = pkg.is_file();
    let lock_canonical = match (has_pkg, lock) {
        (false, None) => None,
        (true, None) => return Err(DepsError::NoLockfile { detail: "package.json has no package-lock.json next to it".into() }),
        (false, Some(_)) => {
            return Err(DepsError::NoLockfile { detail: "package-lock.json without package.json: npm ci needs both".into() })
        }
        (true, Some(bytes)) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| DepsError::Invalid { path: lock_path.clone(), detail: format!("not JSON: {e}") })?;
            Some(super::json::canonical(&v))
        }
    };
    let lock_digest = if requirements.is_none() && lock_canonical.is_none() {
        None
    } else {
        let mut text = String::from("skill-operator-deps-v1\n");
        if let Some(lines) = &requirements {
            let joined: String = lines.iter().map(|l| format!("{l}\n")).collect();
            text.push_str(&format!("{REQUIREMENTS} {}\n", hex::encode(Sha256::digest(joined.as_bytes()))));
        }
        if let Some(c) = &lock_canonical {
            text.push_str(&format!("{PACKAGE_LOCK} {}\n", hex::encode(Sha256::digest(c))));
        }
        Some(super::json::sha256_digest(text.as_bytes()))
    };
    Ok(DepsPlan { requirements, npm_lock: lock_canonical.is_some(), lock_digest })
}

fn read_capped(path: &Path, cap: u64) -> Result<Option<Vec<u8>>> {
    let f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DepsError::Io { path: path.into(), source: e }),
    };
    let mut buf = Vec::new();
    f.take(cap + 1).read_to_end(&mut buf).map_err(io(path))?;
    if buf.len() as u64 > cap {
        return Err(DepsError::Invalid { path: path.into(), detail: format!("larger than {cap} bytes") });
    }
    Ok(Some(buf))
}

/// Requirement lines only (module docs), normalised and sorted.
pub fn normalise_requirements(text: &str) -> Result<Vec<String>> {
    let mut logical = Vec::new();
    let mut cur = String::new();
    for raw in text.lines() {
        // A comment starts at `#` at the line start or after whitespace.
        let mut line = raw;
        if let Some(i) = raw.char_indices().find(|&(i, c)| c == '#' && (i == 0 || raw[..i].ends_with(char::is_whitespace))).map(|(i, _)| i)
        {
            line = &raw[..i];
        }
        if let Some(stripped) = line.trim_end().strip_suffix('\\') {
            cur.push_str(stripped);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        let joined = cur.split_whitespace().collect::<Vec<_>>().join(" ");
        cur.clear();
        if !joined.is_empty() {
            logical.push(joined);
        }
    }
    let tail = cur.split_whitespace().collect::<Vec<_>>().join(" ");
    if !tail.is_empty() {
        logical.push(tail);
    }
    for l in &logical {
        let bad = |reason: &str| Err(DepsError::BadRequirement { line: l.clone(), reason: reason.into() });
        if l.starts_with('-') {
            return bad("options are not allowed");
        }
        if !l.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return bad("not a requirement (a path?)");
        }
        if l.contains("://") || l.contains(" @ ") || l.split(';').next().is_some_and(|spec| spec.contains('@')) {
            return bad("direct URL references are not allowed");
        }
        // Per-requirement options other than --hash change how pip fetches.
        for opt in l.split_whitespace().filter(|w| w.starts_with("--")) {
            if !opt.starts_with("--hash=") {
                return bad("only --hash is allowed after a requirement");
            }
        }
    }
    logical.sort();
    logical.dedup();
    Ok(logical)
}

/// PEP 503: lowercase, runs of `-_.` become `-`.
pub fn normalise_pypi_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// How to run the dependency step.
#[derive(Debug, Clone)]
pub struct DepsOptions {
    /// The unpacked skill package.
    pub package_dir: PathBuf,
    /// Output tree (created; must be absent or empty).
    pub out: PathBuf,
    /// Python interpreter with pip (`python3`).
    pub python: PathBuf,
    /// npm (`npm`).
    pub npm: PathBuf,
    /// pip `--index-url` (a PyPI mirror); `None` for pip's default.
    pub index_url: Option<String>,
    pub extra_index_urls: Vec<String>,
    pub trusted_hosts: Vec<String>,
    /// pip `--platform` tags, to install wheels for another platform than
    /// the build Job's (e.g. `manylinux2014_aarch64` for linux/arm64).
    pub pip_platforms: Vec<String>,
    /// pip `--python-version` with `pip_platforms` (e.g. `3.12`).
    pub pip_python_version: Option<String>,
    /// npm `--registry` (an npm mirror); `None` for npm's default.
    pub npm_registry: Option<String>,
    /// Refuse (rather than only report) dependencies with install scripts.
    pub refuse_lifecycle_scripts: bool,
    pub timeout: Duration,
}

impl DepsOptions {
    pub fn new(package_dir: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        DepsOptions {
            package_dir: package_dir.into(),
            out: out.into(),
            python: "python3".into(),
            npm: "npm".into(),
            index_url: None,
            extra_index_urls: Vec::new(),
            trusted_hosts: Vec::new(),
            pip_platforms: Vec::new(),
            pip_python_version: None,
            npm_registry: None,
            refuse_lifecycle_scripts: false,
            timeout: DEPS_TIMEOUT,
        }
    }
}

/// What the step installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DepsReport {
    /// See the module docs; `None` when nothing was declared.
    pub lock_digest: Option<String>,
    pub python: bool,
    pub node: bool,
    /// Every installed package, sorted.
    pub dependencies: Vec<Dependency>,
    /// Packages declaring install scripts (which did not run).
    pub lifecycle_scripts: Vec<LifecycleScript>,
}

impl DepsReport {
    /// The environment the image needs for this tree.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.python {
            env.push(("PYTHONPATH".to_string(), PYTHON_PATH.to_string()));
        }
        if self.node {
            env.push(("NODE_PATH".to_string(), NODE_PATH.to_string()));
        }
        env
    }
}

/// Runs the step (blocking: it waits for pip and npm).
pub fn install(opts: &DepsOptions) -> Result<DepsReport> {
    let plan = plan(&opts.package_dir)?;
    prepare_out(&opts.out)?;
    let scratch = tempfile::tempdir().map_err(io(&opts.out))?;
    let mut dependencies = BTreeSet::new();
    let mut lifecycle_scripts = Vec::new();

    if let Some(lines) = &plan.requirements {
        let target = opts.out.join("python");
        fs::create_dir_all(&target).map_err(io(&target))?;
        if !lines.is_empty() {
            let req = scratch.path().join(REQUIREMENTS);
            fs::write(&req, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).map_err(io(&req))?;
            run_pip(opts, &req, &target, scratch.path())?;
        }
        dependencies.extend(python_dependencies(&target)?);
    }
    if plan.npm_lock {
        let node = opts.out.join("node");
        fs::create_dir_all(&node).map_err(io(&node))?;
        for f in [PACKAGE_JSON, PACKAGE_LOCK] {
            let (from, to) = (opts.package_dir.join(f), node.join(f));
            fs::copy(&from, &to).map_err(io(&from))?;
        }
        run_npm(opts, &node, scratch.path())?;
        let (deps, scripts) = node_dependencies(&node.join("node_modules"))?;
        dependencies.extend(deps);
        lifecycle_scripts = scripts;
    }
    if dependencies.len() > MAX_DEPENDENCIES {
        return Err(DepsError::Invalid { path: opts.out.clone(), detail: format!("more than {MAX_DEPENDENCIES} installed packages") });
    }
    if !lifecycle_scripts.is_empty() {
        let list = lifecycle_scripts
            .iter()
            .map(|s| format!("{}@{} ({})", s.package, s.version, s.scripts.keys().cloned().collect::<Vec<_>>().join(", ")))
            .collect::<Vec<_>>()
            .join("; ");
        tracing::warn!(%list, "dependencies declare install scripts; they were not run");
        if opts.refuse_lifecycle_scripts {
            return Err(DepsError::LifecycleScripts { list });
        }
    }
    Ok(DepsReport {
        lock_digest: plan.lock_digest,
        python: plan.requirements.is_some(),
        node: plan.npm_lock,
        dependencies: dependencies.into_iter().collect(),
        lifecycle_scripts,
    })
}

fn prepare_out(out: &Path) -> Result<()> {
    match fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(DepsError::Invalid { path: out.into(), detail: "output directory is not empty".into() });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::create_dir_all(out).map_err(io(out)),
        Err(e) => Err(DepsError::Io { path: out.into(), source: e }),
    }
}

/// A clean environment: PATH only, HOME in the scratch dir, so no user
/// config, cache or credentials of the build pod leak in.
fn base_command(program: &Path, scratch: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.env("HOME", scratch).env("LANG", "C.UTF-8").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn run_pip(opts: &DepsOptions, requirements: &Path, target: &Path, scratch: &Path) -> Result<()> {
    let mut cmd = base_command(&opts.python, scratch);
    cmd.args(["-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--no-input", "--no-cache-dir"])
        .args(["--only-binary=:all:", "--no-compile", "--no-warn-script-location", "--progress-bar", "off"])
        .arg("--target")
        .arg(target);
    if let Some(u) = &opts.index_url {
        cmd.args(["--index-url", u]);
    }
    for u in &opts.extra_index_urls {
        cmd.args(["--extra-index-url", u]);
    }
    for h in &opts.trusted_hosts {
        cmd.args(["--trusted-host", h]);
    }
    for p in &opts.pip_platforms {
        cmd.args(["--platform", p]);
    }
    if let Some(v) = &opts.pip_python_version {
        cmd.args(["--python-version", v]);
    }
    cmd.arg("-r").arg(requirements);
    let tool = format!("{} -m pip", opts.python.display());
    match run_tool(cmd, &tool, opts.timeout) {
        Ok(_) => Ok(()),
        Err(DepsError::ToolFailed { tail, status, tool }) => match no_wheel_package(&tail) {
            Some(package) => Err(DepsError::NoWheel { package, tail }),
            None => Err(DepsError::ToolFailed { tool, status, tail }),
        },
        Err(e) => Err(e),
    }
}

/// The requirement pip could not satisfy with wheels only, from its
/// "Could not find a version that satisfies the requirement X" or
/// "No matching distribution found for X".
fn no_wheel_package(output: &str) -> Option<String> {
    for marker in ["satisfies the requirement ", "No matching distribution found for "] {
        if let Some(i) = output.find(marker) {
            let rest = &output[i + marker.len()..];
            let end = rest.find([' ', '\n', '(']).unwrap_or(rest.len());
            let name = rest[..end].trim();
            if !name.is_empty() {
                return Some(name.to_string());
            }
        }
    }
    None
}

fn run_npm(opts: &DepsOptions, dir: &Path, scratch: &Path) -> Result<()> {
    // Empty user and global npmrc (two files: npm refuses to load one file
    // as both), so no config of the build image can turn scripts back on or
    // point at another registry.
    let (user_rc, global_rc) = (scratch.join("npmrc-user"), scratch.join("npmrc-global"));
    for rc in [&user_rc, &global_rc] {
        fs::write(rc, "").map_err(io(rc))?;
    }
    let mut cmd = base_command(&opts.npm, scratch);
    cmd.current_dir(dir)
        .args(["ci", "--ignore-scripts", "--omit=dev", "--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=warn"])
        .arg(format!("--cache={}", scratch.join("npm-cache").display()))
        .arg(format!("--userconfig={}", user_rc.display()))
        .arg(format!("--globalconfig={}", global_rc.display()));
    if let Some(r) = &opts.npm_registry {
        cmd.arg(format!("--registry={r}"));
    }
    run_tool(cmd, &format!("{} ci", opts.npm.display()), opts.timeout).map(drop)
}

/// Runs a tool to completion within `timeout`, keeping the tail of its
/// output (read on threads so a full pipe cannot block it).
fn run_tool(mut cmd: Command, tool: &str, timeout: Duration) -> Result<String> {
    tracing::info!(tool, "running");
    let mut child = cmd.spawn().map_err(|source| DepsError::ToolMissing { tool: tool.into(), source })?;
    let readers: Vec<_> = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut r| {
        std::thread::spawn(move || {
            let mut tail: Vec<u8> = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * TOOL_OUTPUT_TAIL_BYTES {
                    tail.drain(..tail.len() - TOOL_OUTPUT_TAIL_BYTES);
                }
            }
            tail
        })
    })
    .collect();
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(DepsError::Timeout { tool: tool.into(), after: timeout });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(DepsError::ToolMissing { tool: tool.into(), source: e }),
        }
    };
    let mut out = Vec::new();
    for r in readers {
        out.extend(r.join().unwrap_or_default());
    }
    let start = out.len().saturating_sub(TOOL_OUTPUT_TAIL_BYTES);
    let tail = String::from_utf8_lossy(&out[start..]).into_owned();
    if status.success() {
        Ok(tail)
    } else {
        Err(DepsError::ToolFailed { tool: tool.into(), status: status.to_string(), tail })
    }
}

/// Name and version of every `*.dist-info/METADATA` under `target`.
fn python_dependencies(target: &Path) -> Result<Vec<Dependency>> {
    let mut deps = Vec::new();
    let mut names: Vec<PathBuf> = fs::read_dir(target).map_err(io(target))?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    names.sort();
    for dir in names {
        if dir.extension().is_none_or(|e| e != "dist-info") {
            continue;
        }
        let meta = dir.join("METADATA");
        let Some(bytes) = read_capped(&meta, MAX_METADATA_BYTES)? else { continue };
        let text = String::from_utf8_lossy(&bytes);
        let mut name = None;
        let mut version = None;
        // RFC 822-style headers up to the first blank line.
        for line in text.lines().take_while(|l| !l.is_empty()) {
            if let Some(v) = line.strip_prefix("Name:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("Version:") {
                version = Some(v.trim().to_string());
            }
        }
        match (name, version) {
            (Some(n), Some(v)) => deps.push(Dependency::new(Ecosystem::Pypi, &n, &v)),
            _ => return Err(DepsError::Invalid { path: meta, detail: "no Name/Version header".into() }),
        }
    }
    Ok(deps)
}

#[derive(Deserialize)]
struct PackageJson {
    name: Option<String>,
    version: Option<String>,
    #[serde(default)]
    scripts: BTreeMap<String, serde_json::Value>,
}

/// Every package under `node_modules` (nested ones and `@scope/` too):
/// name, version, and install scripts it declares.
fn node_dependencies(node_modules: &Path) -> Result<(Vec<Dependency>, Vec<LifecycleScript>)> {
    let mut deps = Vec::new();
    let mut scripts = Vec::new();
    if node_modules.is_dir() {
        walk_node_modules(node_modules, &mut deps, &mut scripts, 0)?;
    }
    scripts.sort_by(|a: &LifecycleScript, b| (&a.package, &a.version).cmp(&(&b.package, &b.version)));
    scripts.dedup();
    Ok((deps, scripts))
}

fn walk_node_modules(dir: &Path, deps: &mut Vec<Dependency>, scripts: &mut Vec<LifecycleScript>, depth: usize) -> Result<()> {
    if depth > 64 || deps.len() > MAX_DEPENDENCIES {
        return Err(DepsError::Invalid { path: dir.into(), detail: "node_modules nested too deep or too many packages".into() });
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(dir).map_err(io(dir))?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // Links (workspaces, `file:` dirs) are not installed packages; .bin
        // holds links; dot files are npm's own.
        let is_dir = fs::symlink_metadata(&p).map(|m| m.is_dir()).unwrap_or(false);
        if !is_dir || name.starts_with('.') {
            continue;
        }
        if name.starts_with('@') {
            walk_node_modules(&p, deps, scripts, depth + 1)?;
            continue;
        }
        let pj = p.join(PACKAGE_JSON);
        if let Some(bytes) = read_capped(&pj, MAX_METADATA_BYTES)? {
            let parsed: PackageJson = serde_json::from_slice(&bytes)
                .map_err(|e| DepsError::Invalid { path: pj.clone(), detail: format!("not a package.json: {e}") })?;
            let name = parsed.name.unwrap_or_else(|| name.to_string());
            let version = parsed.version.unwrap_or_default();
            let mut found = BTreeMap::new();
            for stage in INSTALL_STAGES {
                if let Some(cmd) = parsed.scripts.get(stage).and_then(|v| v.as_str()) {
                    found.insert(stage.to_string(), cmd.to_string());
                }
            }
            // npm runs `node-gyp rebuild` for a binding.gyp when no
            // install/preinstall script is given.
            if !found.contains_key("install") && !found.contains_key("preinstall") && p.join("binding.gyp").is_file() {
                found.insert("install".into(), "node-gyp rebuild".into());
            }
            if !found.is_empty() {
                scripts.push(LifecycleScript { package: name.clone(), version: version.clone(), scripts: found });
            }
            deps.push(Dependency::new(Ecosystem::Npm, &name, &version));
        }
        let nested = p.join("node_modules");
        if nested.is_dir() {
            walk_node_modules(&nested, deps, scripts, depth + 1)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_are_normalised_and_options_refused() {
        let text = "# deps\nRequests==2.31.0   # pinned\n\nattrs>=23 ; python_version >= \"3.8\"\nidna==3.6 \\\n    --hash=sha256:abc\n";
        assert_eq!(
            normalise_requirements(text).unwrap(),
            vec!["Requests==2.31.0", "attrs>=23 ; python_version >= \"3.8\"", "idna==3.6 --hash=sha256:abc"]
        );
        for bad in [
            "-r other.txt",
            "--index-url https://evil/",
            "-e .",
            "./local",
            "pkg @ https://x/pkg.tar.gz",
            "git+https://x/y",
            "pkg --no-binary=:all:",
        ] {
            assert!(matches!(normalise_requirements(bad), Err(DepsError::BadRequirement { .. })), "{bad}");
        }
    }

    #[test]
    fn lock_digest_ignores_formatting_and_follows_content() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        fs::write(a.path().join(REQUIREMENTS), "b==1\na==2\n").unwrap();
        fs::write(b.path().join(REQUIREMENTS), "# x\na==2\n\n  b==1  \n").unwrap();
        for d in [&a, &b] {
            fs::write(d.path().join(PACKAGE_JSON), "{}").unwrap();
        }
        fs::write(a.path().join(PACKAGE_LOCK), r#"{"name":"x","lockfileVersion":3}"#).unwrap();
        fs::write(b.path().join(PACKAGE_LOCK), "{\n  \"lockfileVersion\": 3,\n  \"name\": \"x\"\n}\n").unwrap();
        let (pa, pb) = (plan(a.path()).unwrap(), plan(b.path()).unwrap());
        assert_eq!(pa.lock_digest, pb.lock_digest);
        assert!(pa.lock_digest.is_some());
        fs::write(b.path().join(REQUIREMENTS), "a==2\nb==1.1\n").unwrap();
        assert_ne!(plan(b.path()).unwrap().lock_digest, pa.lock_digest);
    }

    #[test]
    fn package_json_without_lock_is_refused() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join(PACKAGE_JSON), "{}").unwrap();
        assert!(matches!(plan(d.path()), Err(DepsError::NoLockfile { .. })));
        let e = tempfile::tempdir().unwrap();
        assert!(plan(e.path()).unwrap().is_empty());
    }

    #[test]
    fn pip_no_wheel_output_names_the_package() {
        let out = "ERROR: Could not find a version that satisfies the requirement sdistonly==1.0 (from versions: none)\nERROR: No matching distribution found for sdistonly==1.0\n";
        assert_eq!(no_wheel_package(out).as_deref(), Some("sdistonly==1.0"));
    }

    #[test]
    fn purls() {
        assert_eq!(Dependency::new(Ecosystem::Pypi, "Foo_Bar.baz", "1.0").purl, "pkg:pypi/foo-bar-baz@1.0");
        assert_eq!(Dependency::new(Ecosystem::Npm, "@scope/x", "2.0.0").purl, "pkg:npm/%40scope/x@2.0.0");
    }
}
