//! Claude Code plugin marketplaces: the skills a root's
//! `.claude-plugin/marketplace.json` lists, for `serve --layout recursive`.
//!
//! Each `plugins[]` entry whose `source` is a path inside the root (`"./"`,
//! `"./plugins/foo"`) contributes the skills of the folders its `skills`
//! field lists, or of `<source>/skills/` when it lists none, plus those its
//! own `<source>/.claude-plugin/plugin.json` lists in `skills`. A listed folder holding a
//! `SKILL.md` is one skill; another is a folder of skills. Every skill is
//! named `<plugin>/<folder name>`: the plugin's name is how the repository
//! groups them, and two plugins may ship a skill of one name.
//!
//! `serve` never fetches anything: an entry whose `source` is an object
//! (`github`, `url`, `git-subdir`) is reported once and skipped. A path that
//! leaves the root (`..`, absolute, or a symlink out) is refused. A file that
//! is not JSON of this shape is reported; it never stops the scan.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::catalog::read_capped;
use super::limits::{bytes_text, MARKETPLACE_READ_CAP};
use super::paths::RelPath;
use super::problems::{Problem, Reason};
use super::spec::servable_name;

/// Where a marketplace lives under a root.
pub const MARKETPLACE_FILE: &str = ".claude-plugin/marketplace.json";
/// Where a plugin's manifest lives under its source folder.
pub const PLUGIN_FILE: &str = ".claude-plugin/plugin.json";

/// A skill folder a marketplace names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSkill {
    /// `<plugin>/<folder name>`.
    pub name: String,
    /// The folder as the root was given (for messages).
    pub seen_at: PathBuf,
    /// Its real path (inside the real root).
    pub real: PathBuf,
}

#[derive(Debug, Deserialize)]
struct Marketplace {
    #[serde(default)]
    plugins: Vec<Value>,
}

/// One `plugins[]` entry; read one by one so a bad entry harms only itself.
#[derive(Debug, Deserialize)]
struct PluginEntry {
    name: String,
    source: Source,
    #[serde(default)]
    skills: Option<Paths>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Source {
    Path(String),
    Remote(RemoteSource),
}

/// A plugin source in another repository (`github`, `url`, `git-subdir`,
/// or a package source `serve` and SkillSources cannot follow).
#[derive(Debug, Clone, Deserialize)]
struct RemoteSource {
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    repo: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default, rename = "ref")]
    reference: Option<String>,
    #[serde(default)]
    sha: Option<String>,
}

/// A `plugins[]` entry whose source is another git repository, as a
/// SkillSource may follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePlugin {
    /// Its place in `plugins[]`.
    pub index: usize,
    pub name: String,
    /// `github`, `url`, `git-subdir`, or what else the entry says.
    pub kind: String,
    /// The repository's URL (`github` entries: `https://github.com/<repo>.git`);
    /// `None` for a kind that names no git repository.
    pub url: Option<String>,
    /// The plugin's folder in that repository (`git-subdir`).
    pub path: Option<String>,
    /// The commit the entry pins (`sha`).
    pub sha: Option<String>,
    /// The branch or tag it names (`ref`).
    pub reference: Option<String>,
}

/// The remote plugin entries of `<real_root>/.claude-plugin/marketplace.json`
/// (none without one, or when it does not parse: [`skills`] reports that).
pub fn remote_plugins(real_root: &Path) -> Vec<RemotePlugin> {
    let file = real_root.join(MARKETPLACE_FILE);
    if !file.is_file() {
        return Vec::new();
    }
    let Some(market) = read_json::<Marketplace>(&file, &file, &mut Vec::new()) else { return Vec::new() };
    market
        .plugins
        .into_iter()
        .enumerate()
        .filter_map(|(index, raw)| {
            let entry = serde_json::from_value::<PluginEntry>(raw).ok()?;
            let Source::Remote(remote) = entry.source else { return None };
            let kind = remote.source.clone().unwrap_or_default();
            let url = match kind.as_str() {
                "github" => remote.repo.as_ref().map(|repo| format!("https://github.com/{}.git", repo.trim_end_matches(".git"))),
                "url" | "git-subdir" => remote.url.clone(),
                _ => None,
            };
            Some(RemotePlugin { index, name: entry.name, kind, url, path: remote.path, sha: remote.sha, reference: remote.reference })
        })
        .collect()
}

/// Points `plugins[index].source` at a folder of the root for each pair
/// (a followed remote plugin, fetched there), keeping every other field.
pub fn point_at_folders(real_root: &Path, folders: &[(usize, String)]) -> std::io::Result<()> {
    let file = real_root.join(MARKETPLACE_FILE);
    let (bytes, _) = read_capped(&file, MARKETPLACE_READ_CAP)?;
    let mut doc: Value = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
    for (index, folder) in folders {
        if let Some(entry) = doc.get_mut("plugins").and_then(|p| p.get_mut(*index)).and_then(Value::as_object_mut) {
            entry.insert("source".into(), Value::String(format!("./{folder}")));
        }
    }
    std::fs::write(&file, serde_json::to_vec(&doc).map_err(std::io::Error::other)?)
}

/// `plugin.json`: only the skill paths matter here.
#[derive(Debug, Deserialize)]
struct PluginManifest {
    #[serde(default)]
    skills: Option<Paths>,
}

/// One path or a list of them (both forms occur).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Paths {
    One(String),
    Many(Vec<String>),
}

impl Paths {
    fn into_vec(self) -> Vec<String> {
        match self {
            Paths::One(path) => vec![path],
            Paths::Many(paths) => paths,
        }
    }
}

/// The skills `<root>/.claude-plugin/marketplace.json` names; none when
/// there is no such file. Problems go to `problems`.
pub fn skills(root: &Path, real_root: &Path, problems: &mut Vec<Problem>) -> Vec<PluginSkill> {
    let file = real_root.join(MARKETPLACE_FILE);
    if !file.is_file() {
        return Vec::new();
    }
    let shown = root.join(MARKETPLACE_FILE);
    let Some(market) = read_json::<Marketplace>(&file, &shown, problems) else { return Vec::new() };
    let place = Place { root, real_root, shown: &shown };
    let mut out = Vec::new();
    for (i, raw) in market.plugins.into_iter().enumerate() {
        match serde_json::from_value::<PluginEntry>(raw) {
            Ok(entry) => place.plugin(entry, problems, &mut out),
            Err(err) => problems.push(Problem::new(
                &shown,
                Reason::Marketplace,
                format!("plugins[{i}] is not a plugin entry ({err}); it needs a `name` and a `source`"),
            )),
        }
    }
    out
}

/// Read a small JSON file into `T`, or report why not.
fn read_json<T: for<'de> Deserialize<'de>>(file: &Path, shown: &Path, problems: &mut Vec<Problem>) -> Option<T> {
    let report = |problems: &mut Vec<Problem>, detail: String| problems.push(Problem::new(shown, Reason::Marketplace, detail));
    let bytes = match read_capped(file, MARKETPLACE_READ_CAP) {
        Ok((_, true)) => {
            report(problems, format!("larger than {}; not read", bytes_text(MARKETPLACE_READ_CAP)));
            return None;
        }
        Ok((bytes, false)) => bytes,
        Err(err) => {
            report(problems, format!("cannot read: {err}"));
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(value) => Some(value),
        Err(err) => {
            report(problems, format!("not valid JSON of the expected shape: {err}; its plugins are not served"));
            None
        }
    }
}

/// The root a marketplace belongs to, and where its file is shown.
struct Place<'a> {
    root: &'a Path,
    real_root: &'a Path,
    shown: &'a Path,
}

impl Place<'_> {
    fn report(&self, problems: &mut Vec<Problem>, detail: String) {
        problems.push(Problem::new(self.shown, Reason::Marketplace, detail));
    }

    fn plugin(&self, entry: PluginEntry, problems: &mut Vec<Problem>, out: &mut Vec<PluginSkill>) {
        let plugin = entry.name;
        if let Err(why) = servable_name(&plugin) {
            self.report(problems, format!("plugin name {plugin:?} {why}; its skills are not served under it"));
            return;
        }
        let source = match entry.source {
            Source::Path(path) => path,
            Source::Remote(remote) => {
                self.report(problems, remote_detail(&plugin, &remote));
                return;
            }
        };
        let Some(base) = self.inside(self.real_root, &source, &plugin, problems) else { return };
        // A marketplace list replaces the default folder (anthropics/skills
        // lists parts of one shared `skills/`); a plugin.json list adds to it.
        let mut listed = match entry.skills {
            Some(paths) => paths.into_vec(),
            None if base.join("skills").is_dir() => vec!["skills".into()],
            None => Vec::new(),
        };
        let manifest = base.join(PLUGIN_FILE);
        if manifest.is_file() {
            let shown = self.shown_path(&manifest);
            if let Some(m) = read_json::<PluginManifest>(&manifest, &shown, problems) {
                listed.extend(m.skills.map(Paths::into_vec).unwrap_or_default());
            }
        }
        for path in listed {
            let Some(dir) = self.inside(&base, &path, &plugin, problems) else { continue };
            self.collect(&plugin, &dir, problems, out);
        }
    }

    /// `dir` as one skill (it holds a `SKILL.md`) or as a folder of skills.
    fn collect(&self, plugin: &str, dir: &Path, problems: &mut Vec<Problem>, out: &mut Vec<PluginSkill>) {
        if dir.join("SKILL.md").is_file() {
            self.push(plugin, dir, problems, out);
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut dirs: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.join("SKILL.md").is_file()).collect();
        dirs.sort();
        for skill in dirs {
            // The walk's rule: folder symlinks are not followed.
            if std::fs::symlink_metadata(&skill).is_ok_and(|m| m.file_type().is_symlink()) {
                continue;
            }
            self.push(plugin, &skill, problems, out);
        }
    }

    fn push(&self, plugin: &str, dir: &Path, problems: &mut Vec<Problem>, out: &mut Vec<PluginSkill>) {
        let Some(leaf) = dir.file_name().and_then(OsStr::to_str) else {
            self.report(problems, format!("{}: the folder name is not UTF-8; not served", dir.display()));
            return;
        };
        out.push(PluginSkill { name: format!("{plugin}/{leaf}"), seen_at: self.shown_path(dir), real: dir.to_path_buf() });
    }

    /// `raw` (relative to `base`) resolved, when it stays inside the real root.
    fn inside(&self, base: &Path, raw: &str, plugin: &str, problems: &mut Vec<Problem>) -> Option<PathBuf> {
        let refuse = |problems: &mut Vec<Problem>, why: String| {
            self.report(problems, format!("plugin `{plugin}`: path {raw:?} {why}; not served"));
            None
        };
        let trimmed = strip_dot_slash(raw);
        let joined = if trimmed.is_empty() {
            base.to_path_buf()
        } else {
            match RelPath::parse(trimmed) {
                Ok(rel) => base.join(rel.as_str()),
                Err(err) => return refuse(problems, format!("is refused ({err}); give a path inside the repository, like ./plugins/foo")),
            }
        };
        let real = match joined.canonicalize() {
            Ok(real) => real,
            Err(err) => return refuse(problems, format!("does not resolve ({err})")),
        };
        if !real.starts_with(self.real_root) {
            return refuse(problems, "leads outside the root".into());
        }
        if !real.is_dir() {
            return refuse(problems, "is not a folder".into());
        }
        Some(real)
    }

    fn shown_path(&self, real: &Path) -> PathBuf {
        real.strip_prefix(self.real_root).map_or_else(|_| real.to_path_buf(), |rel| self.root.join(rel))
    }
}

/// `./`, `./plugins/foo` and `plugins/foo/` name the same folders as `` and `plugins/foo`.
fn strip_dot_slash(raw: &str) -> &str {
    let mut path = raw;
    while let Some(rest) = path.strip_prefix("./") {
        path = rest;
    }
    let path = path.trim_end_matches('/');
    if path == "." {
        ""
    } else {
        path
    }
}

fn remote_detail(plugin: &str, remote: &RemoteSource) -> String {
    let kind = remote.source.as_deref().unwrap_or("remote");
    let at: Vec<&str> = [remote.repo.as_deref(), remote.url.as_deref(), remote.path.as_deref()].into_iter().flatten().collect();
    let at = if at.is_empty() { String::new() } else { format!(" ({})", at.join(", ")) };
    format!(
        "plugin `{plugin}` has a remote plugin source `{kind}`{at} that is not fetched here; clone it and add it as a root (`serve`), or list its host in a SkillSource's spec.git.followHosts"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_slash_forms() {
        assert_eq!(strip_dot_slash("./"), "");
        assert_eq!(strip_dot_slash("."), "");
        assert_eq!(strip_dot_slash("./plugins/foo/"), "plugins/foo");
        assert_eq!(strip_dot_slash("././x"), "x");
        assert_eq!(strip_dot_slash("../x"), "../x");
    }
}
