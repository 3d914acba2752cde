//! What discovery produces: the skills served, and the problems found.
//!
//! The catalog is built once at start-up and kept in memory. It holds names,
//! descriptions, frontmatter, file indexes and declarations; it does not hold
//! bodies or file contents, which are read from disk (through the two path
//! checks) when asked for, so memory stays flat for thousands of skills.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::declaration::ScriptDecl;
use super::frontmatter::{self, FrontmatterError};
use super::limits::SKILL_MD_READ_CAP;
use super::paths::RelPath;
use super::problems::Problem;
use super::spec::SkillMeta;

/// One file of a skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub path: RelPath,
    pub size: u64,
}

/// A declared script, with what discovery found about it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredScript {
    pub decl: ScriptDecl,
    /// Why the package itself keeps this script from running (missing file,
    /// symlink escape, refused declaration); `None` when it could run.
    pub unavailable: Option<String>,
}

/// A served skill.
#[derive(Debug, Clone)]
pub struct Skill {
    /// The served name: the directory's name, never the frontmatter's.
    pub name: String,
    /// The root (as given) this skill was found under.
    pub root: PathBuf,
    /// The real (canonical) skill directory; every read resolves inside it.
    pub dir: PathBuf,
    pub meta: SkillMeta,
    /// The frontmatter as written, for `skill_load` and `skills/list`.
    pub frontmatter: Map<String, Value>,
    /// Files sorted by path, `SKILL.md` included.
    pub files: Vec<FileEntry>,
    pub bytes: u64,
    /// `SKILL.md` was larger than the read cap.
    pub skill_md_truncated: bool,
    /// Declared scripts in declaration order (empty when the block is absent or broken).
    pub scripts: Vec<DeclaredScript>,
    /// Hosts the skill declares it reaches.
    pub egress: Vec<String>,
    /// Whether the skill has an `mcp-host:` block that parsed.
    pub has_declaration: bool,
    /// Problems concerning this skill (also in the catalog's list).
    pub problems: Vec<Problem>,
    /// Where clients are told this skill is.
    pub shown: Shown,
}

/// Where clients are told a skill is, set by whoever builds the catalog:
/// `serve` shows its directories as they are on disk (its operator wants
/// them), the gateway a package's name and digest in place of its cache
/// directory ([`Catalog::relocate`]), which means nothing to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// The root, as `skill_list` names it.
    pub root: String,
    /// The skill's directory as `skill_list` shows it: on disk, or relative to its root.
    pub dir: String,
    /// What a file's path inside the skill is prefixed with in problems.
    files: String,
}

impl Shown {
    /// The directories themselves (the standalone server).
    pub fn on_disk(root: &Path, dir: &Path) -> Shown {
        let dir = dir.display().to_string();
        Shown { root: root.display().to_string(), files: dir.clone(), dir }
    }

    /// A file of the skill (`rel` inside it), as problems name it.
    pub fn file(&self, rel: &str) -> String {
        format!("{}/{rel}", self.files)
    }
}

impl Skill {
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files.binary_search_by(|f| f.path.as_str().cmp(path)).ok().map(|i| &self.files[i])
    }

    pub fn script(&self, path: &str) -> Option<&DeclaredScript> {
        self.scripts.iter().find(|s| s.decl.script.as_str() == path)
    }

    /// Read `SKILL.md` again and return its body. Bodies are not kept in
    /// memory; the file is re-read (capped) and re-split on demand.
    pub fn load_body(&self) -> Result<(String, bool), BodyError> {
        let (bytes, truncated) = read_capped(&self.dir.join("SKILL.md"), SKILL_MD_READ_CAP).map_err(BodyError::Io)?;
        let text = frontmatter::decode(&bytes, truncated).map_err(BodyError::Parse)?;
        let md = frontmatter::parse(text).map_err(BodyError::Parse)?;
        Ok((md.body, truncated))
    }
}

/// Why a body could not be produced for a skill that was served at start-up.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("SKILL.md could not be read: {0}")]
    Io(#[source] std::io::Error),
    #[error("SKILL.md changed since start-up and no longer parses: {0}")]
    Parse(#[source] FrontmatterError),
}

/// A root directory as given, with what was found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub path: PathBuf,
    pub skills: usize,
    /// Where clients are told it is (see [`Shown`]).
    pub shown: String,
    /// The content digest clients are told it has (a gateway package's pinned digest).
    pub digest: Option<String>,
}

impl Root {
    /// A root shown as its own path.
    pub fn on_disk(path: PathBuf, skills: usize) -> Root {
        Root { shown: path.display().to_string(), path, skills, digest: None }
    }
}

/// Every served skill (sorted by name) and every problem found.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub roots: Vec<Root>,
    pub skills: Vec<Skill>,
    pub problems: Vec<Problem>,
}

impl Catalog {
    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.binary_search_by(|s| s.name.as_str().cmp(name)).ok().map(|i| &self.skills[i])
    }

    pub fn names(&self) -> Vec<&str> {
        self.skills.iter().map(|s| s.name.as_str()).collect()
    }

    /// Show the root at `root` (as discovery was given it) to clients as
    /// `label`: the root itself, its skills' directories relative to it,
    /// and every path under it in problems (their path and detail), as
    /// `label/…`. The one place a catalog's on-disk locations are mapped to
    /// what clients see; files are still read from the real directories.
    pub fn relocate(&mut self, root: &Path, label: &str) {
        let real_root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        let mut on_disk = vec![root.display().to_string(), real_root.display().to_string()];
        // The longer spelling first, so a canonical path is never half replaced.
        on_disk.sort_by_key(|p| std::cmp::Reverse(p.len()));
        on_disk.dedup();
        let relabel = |text: &str| on_disk.iter().fold(text.to_string(), |t, p| replace_path(&t, p, label));
        for r in self.roots.iter_mut().filter(|r| r.path == root) {
            r.shown = label.to_string();
        }
        for skill in self.skills.iter_mut().filter(|s| s.root == root) {
            let rel = skill.dir.strip_prefix(&real_root).or_else(|_| skill.dir.strip_prefix(root)).map(|r| r.display().to_string());
            let rel = match rel {
                Ok(r) if r.is_empty() => ".".to_string(),
                Ok(r) => r,
                Err(_) => skill.name.clone(),
            };
            let files = if rel == "." { label.to_string() } else { format!("{label}/{rel}") };
            skill.shown = Shown { root: label.to_string(), dir: rel, files };
            for p in &mut skill.problems {
                relabel_problem(p, &relabel);
            }
        }
        for p in &mut self.problems {
            relabel_problem(p, &relabel);
        }
    }
}

fn relabel_problem(p: &mut Problem, relabel: &impl Fn(&str) -> String) {
    p.path = relabel(&p.path);
    p.detail = relabel(&p.detail);
}

/// `text` with every occurrence of the path `from` that is a whole path
/// (followed by `/`, the end, or a character no path name continues with)
/// replaced by `to`.
fn replace_path(text: &str, from: &str, to: &str) -> String {
    if from.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let after = &rest[at + from.len()..];
        let mut next = after.chars();
        let whole = match next.next() {
            None => true,
            Some(c) if c.is_alphanumeric() || matches!(c, '-' | '_') => false,
            // A sentence's full stop, not a longer name.
            Some('.') => next.next().is_none_or(char::is_whitespace),
            Some(_) => true,
        };
        out.push_str(&rest[..at]);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Read at most `cap` bytes of a file; the flag says whether more existed.
/// Reads `cap + 1` bytes through `take`, so memory is bounded by the cap
/// whatever the file's (possibly sparse) size.
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<(Vec<u8>, bool)> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes)?;
    let truncated = bytes.len() as u64 > cap;
    bytes.truncate(cap as usize);
    Ok((bytes, truncated))
}
