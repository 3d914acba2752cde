//! `serve --layout recursive`: skills at any depth up to
//! [`RECURSIVE_DEPTH`] folders below a root, named by their path.
//!
//! Real repositories nest skills: `skills/<category>/<name>`,
//! `<team>-skills/<name>`, Claude Code plugin trees
//! `plugins/<plugin>/skills/<name>`, per-agent homes `.claude/skills/<name>`,
//! OpenAI-style groups `skills/.curated/<name>`.
//!
//! The walk: a folder holding a `SKILL.md` is a skill and is not searched
//! further (its subfolders are its files, indexed by the usual rules).
//! Tooling folders ([`TOOLING_DIRS`]) are not searched, though one holding
//! a `SKILL.md` is still a skill (a skill may be called `build`). Hidden
//! folders are searched only when they are an agent home ([`AGENT_HOMES`],
//! anywhere) or a group ([`HIDDEN_GROUPS`]) directly inside a `skills`
//! folder; another hidden folder holding a `SKILL.md` is `hidden-skipped`.
//! Folder symlinks are never followed (`symlink-not-followed`; silently
//! when the link or a folder above it is hidden, since `.agents/skills ->
//! ../skills` is the usual way to share skills between agents). A skill
//! deeper than [`RECURSIVE_DEPTH`] is reported `dir-limit`, not served;
//! nothing below that depth is looked at. At most [`RECURSIVE_DIRS`]
//! folders are listed per root (`dir-limit` once, then the walk stops).
//!
//! The served name ([`served_name`]): the skill folder's path relative to
//! the root, split into segments; every `skills` and `plugins` segment and
//! every agent home is dropped, a hidden group loses its dot, and the rest
//! is joined with `/`: `skills/pdf` is `pdf`, `skills/.system/skill-creator`
//! is `system/skill-creator`, `plugins/document-skills/skills/xlsx` is
//! `document-skills/xlsx`, `.claude/skills/foo` is `foo`,
//! `skills/devops/terraform` is `devops/terraform`; a root that is itself a
//! skill is named by the root directory, as in the standard layout. Each
//! segment must be a servable name (and the whole at most 128 characters),
//! or the skill is refused `unusable-name`. The frontmatter `name` is
//! compared with the last segment (`name-mismatch` otherwise; the path
//! still wins).
//!
//! Skills a root's `.claude-plugin/marketplace.json` lists (see
//! [`super::super::marketplace`]) are named `<plugin>/<skill>`; a folder
//! that both the marketplace and the walk reach is served once, under the
//! marketplace name.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use super::super::limits::{count_text, RECURSIVE_DEPTH, RECURSIVE_DIRS};
use super::super::marketplace;
use super::super::problems::{Problem, Reason};
use super::{open_root, root_skill, typed_entries, Candidate};

/// Folders that hold tools, builds or vendored code, never skills to serve.
pub const TOOLING_DIRS: &[&str] =
    &[".git", ".hg", ".svn", "node_modules", ".github", ".vscode", "__pycache__", "target", "dist", "build", "venv", ".venv"];
/// Hidden folders agents keep their skills in; searched, and dropped from names.
pub const AGENT_HOMES: &[&str] = &[".claude", ".agents", ".codex", ".cursor", ".gemini", ".opencode"];
/// Hidden groups inside a `skills` folder (openai/skills); searched, named without the dot.
pub const HIDDEN_GROUPS: &[&str] = &[".curated", ".experimental", ".system"];
/// Container segments dropped from names.
const CONTAINERS: &[&str] = &["skills", "plugins"];

/// The served name of a skill folder at `segments` below its root, or
/// `None` when the rule leaves nothing (a `skills/SKILL.md`).
pub fn served_name(segments: &[&str]) -> Option<String> {
    let kept: Vec<&str> = segments
        .iter()
        .filter(|s| !CONTAINERS.contains(s) && !AGENT_HOMES.contains(s))
        .map(|s| if HIDDEN_GROUPS.contains(s) { &s[1..] } else { *s })
        .collect();
    (!kept.is_empty()).then(|| kept.join("/"))
}

/// Collect the candidates of one root: the root itself when it is a
/// skill, else the marketplace's skills and then the walk's.
pub(super) fn collect_root(index: usize, root: &Path, out: &mut Vec<Candidate>, problems: &mut Vec<Problem>) {
    let Some(real_root) = open_root(root, problems) else { return };
    if real_root.join("SKILL.md").exists() {
        out.push(root_skill(index, root, real_root));
        return;
    }
    let mut claimed = HashSet::new();
    for found in marketplace::skills(root, &real_root, problems) {
        claimed.insert(found.real.clone());
        out.push(Candidate {
            name: found.name,
            root: root.to_path_buf(),
            root_index: index,
            seen_at: found.seen_at,
            real: found.real,
            via_symlink: false,
        });
    }
    let mut walk = Walk { index, root, real_root: &real_root, claimed: &claimed, listed: 0, out, problems };
    walk.run();
}

/// One root's walk.
struct Walk<'a> {
    index: usize,
    root: &'a Path,
    real_root: &'a Path,
    /// Skill folders the marketplace already named.
    claimed: &'a HashSet<PathBuf>,
    listed: usize,
    out: &'a mut Vec<Candidate>,
    problems: &'a mut Vec<Problem>,
}

/// A folder to list: its segments below the root, and whether one of them is hidden.
struct Pending {
    segments: Vec<String>,
    hidden: bool,
}

impl Walk<'_> {
    fn run(&mut self) {
        let mut stack = vec![Pending { segments: Vec::new(), hidden: false }];
        while let Some(dir) = stack.pop() {
            if self.listed >= RECURSIVE_DIRS {
                self.problems.push(Problem::new(
                    self.root,
                    Reason::DirLimit,
                    format!("more than {} folders searched for skills; the rest are not; give a narrower root", count_text(RECURSIVE_DIRS)),
                ));
                return;
            }
            self.listed += 1;
            let children = self.list(&dir);
            // Depth-first in name order.
            stack.extend(children.into_iter().rev());
        }
    }

    /// List one folder: record its skills, return the folders to search next.
    fn list(&mut self, dir: &Pending) -> Vec<Pending> {
        let real_dir = self.real_root.join(dir.segments.iter().collect::<PathBuf>());
        let entries = match typed_entries(&real_dir) {
            Ok(entries) => entries,
            Err(err) => {
                self.problems.push(Problem::new(self.seen(&dir.segments), Reason::UnusablePath, format!("cannot list: {err}")));
                return Vec::new();
            }
        };
        let mut next = Vec::new();
        for (name, path, file_type) in entries {
            let Some(file_type) = file_type else { continue };
            if file_type.is_symlink() {
                self.symlink(dir, &name, &path);
                continue;
            }
            if !file_type.is_dir() {
                continue; // README.md, LICENSE and other files next to skills.
            }
            let Some(name) = name.to_str() else {
                self.problems.push(Problem::new(&path, Reason::UnusableName, "the folder name is not UTF-8; not searched"));
                continue;
            };
            let mut segments = dir.segments.clone();
            segments.push(name.to_string());
            let has_skill_md = path.join("SKILL.md").exists();
            if name.starts_with('.') && !searchable_hidden(&dir.segments, name) {
                if has_skill_md {
                    self.problems.push(Problem::new(
                        self.seen(&segments),
                        Reason::HiddenSkipped,
                        "a hidden folder holds a SKILL.md; only agent homes (.claude, .agents, ...) and skills/.curated-style groups are searched (add it as a root to serve it)",
                    ));
                }
                continue;
            }
            if has_skill_md {
                self.skill(segments, path);
            } else if segments.len() <= RECURSIVE_DEPTH && !TOOLING_DIRS.contains(&name) {
                next.push(Pending { segments, hidden: dir.hidden || name.starts_with('.') });
            }
        }
        next
    }

    fn skill(&mut self, segments: Vec<String>, real: PathBuf) {
        let seen_at = self.seen(&segments);
        if segments.len() > RECURSIVE_DEPTH {
            self.problems.push(Problem::new(
                &seen_at,
                Reason::DirLimit,
                format!("a skill nested deeper than {RECURSIVE_DEPTH} folders below the root; not served (add a nearer root)"),
            ));
            return;
        }
        if self.claimed.contains(&real) {
            return; // Served under its marketplace name.
        }
        let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
        let Some(name) = served_name(&parts) else {
            self.problems.push(Problem::new(
                &seen_at,
                Reason::UnusableName,
                "the naming rule leaves no name for this skill (it drops `skills`, `plugins` and agent homes); move it into a folder named after it",
            ));
            return;
        };
        self.out.push(Candidate { name, root: self.root.to_path_buf(), root_index: self.index, seen_at, real, via_symlink: false });
    }

    fn symlink(&mut self, dir: &Pending, name: &OsStr, path: &Path) {
        let hidden = dir.hidden || name.to_str().is_some_and(|n| n.starts_with('.'));
        if hidden || !fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return; // File links and hidden aliases are not skills to report.
        }
        self.problems.push(Problem::new(
            path_for_message(self.root, self.real_root, path),
            Reason::SymlinkNotFollowed,
            "a symlinked folder; --layout recursive never follows folder symlinks (add its target as a root, or use --layout standard)",
        ));
    }

    /// A folder as the root was given (for messages).
    fn seen(&self, segments: &[String]) -> PathBuf {
        self.root.join(segments.iter().collect::<PathBuf>())
    }
}

/// Whether a hidden folder named `name` inside `parent` is searched.
fn searchable_hidden(parent: &[String], name: &str) -> bool {
    AGENT_HOMES.contains(&name) || (HIDDEN_GROUPS.contains(&name) && parent.last().is_some_and(|p| p == "skills"))
}

/// `path` (under the real root) shown under the root as given.
fn path_for_message(root: &Path, real_root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(real_root).map_or_else(|_| path.to_path_buf(), |rel| root.join(rel))
}

#[cfg(test)]
#[path = "discovery_recursive_tests.rs"]
mod tests;
