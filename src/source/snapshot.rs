//! A SkillSource's content at one commit: fetched (running nothing), walked
//! with the recursive layout rules, and cut into one package per skill.
//!
//! Everything here is blocking file work on a private temporary folder;
//! the controller calls [`take`] off its runtime.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::follow::{self, Followed};
use super::git::{self, Access, GitRef, GitSourceError};
use crate::core::discovery::{discover_with, Layout, Limits};
use crate::core::limits::{SOURCE_MAX_DIRS, SOURCE_MAX_FILES, SOURCE_MAX_SKILLS, SOURCE_MAX_TOTAL_BYTES, SOURCE_PROBLEMS_LISTED};
use crate::core::package::{self, PackageError};
use crate::core::paths::RelPath;
use crate::oci::SkillConfig;

/// The caps of a whole fetched tree: many skills, each still within the
/// package caps once cut out (file size and depth are the package's).
pub const CAPS: git::Caps =
    git::Caps { max_files: SOURCE_MAX_FILES, max_dirs: SOURCE_MAX_DIRS, max_total_bytes: SOURCE_MAX_TOTAL_BYTES, ..git::Caps::DEFAULT };

/// Files of the repository's root kept beside a nested skill that has none
/// of its own: its licence and notices travel with it (case-insensitive
/// prefixes, regular files only).
const ROOT_NOTICES: &[&str] = &["license", "licence", "copying", "notice"];

/// Where a snapshot's files come from.
pub enum Origin {
    /// A git repository, under `access`'s rules; its marketplace's pinned
    /// plugins on `follow_hosts` are fetched too ([`super::follow`]).
    Git { source: GitRef, access: Access, follow_hosts: Vec<String> },
    /// A downloaded ZIP, already checked against `digest` (which stands in
    /// for the commit), and the folder of it to walk.
    Zip { bytes: Vec<u8>, digest: String, path: Option<String> },
}

/// One skill, packaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackagedSkill {
    /// The served name its path gives (`document-skills/xlsx`).
    pub name: String,
    /// Its folder in the repository (`.` for a root that is one skill).
    pub path: String,
    /// The package archive (this project's deterministic tar.gz).
    pub archive: Vec<u8>,
    /// `sha256:` of `archive`: equal files, equal content digest.
    pub content: String,
    /// The artifact config pushed with it, named by the last segment of
    /// `name` (what a binding serves it as), made from `archive` here, off
    /// the controller's runtime.
    pub config: SkillConfig,
    /// For a followed plugin's skill: the repository and commit it came
    /// from (`path` is then its folder there); `None`: the source's own.
    pub from: Option<(String, String)>,
}

/// What a source holds at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// 40 hex digits, or the ZIP's `sha256:` digest.
    pub commit: String,
    /// Sorted by name.
    pub skills: Vec<PackagedSkill>,
    /// What kept a skill or a file out, each as `path: why`, at most
    /// [`SOURCE_PROBLEMS_LISTED`] of them.
    pub problems: Vec<String>,
    /// All problems, listed or not.
    pub problem_count: usize,
    /// Plugins of other repositories fetched for the marketplace.
    pub followed: Vec<Followed>,
}

#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Git(#[from] GitSourceError),
    #[error("the ZIP cannot be read as a source: {0}")]
    Zip(#[source] PackageError),
    #[error("`{path}` is not a folder the source can walk: {why}")]
    Path { path: String, why: String },
    #[error(transparent)]
    Follow(#[from] follow::FollowError),
    #[error("a temporary folder for the source: {0}")]
    Io(#[from] std::io::Error),
}

impl SnapshotError {
    /// Whether fetching again later may succeed (the server, not the content).
    pub fn is_transient(&self) -> bool {
        match self {
            SnapshotError::Follow(e) => e.is_transient(),
            other => matches!(other, SnapshotError::Git(GitSourceError::Fetch { .. }) | SnapshotError::Io(_)),
        }
    }
}

/// Fetches `origin` into a private folder and packages each skill in it.
/// Blocking.
pub fn take(origin: &Origin) -> Result<Snapshot, SnapshotError> {
    let scratch = tempfile::tempdir()?;
    let root = scratch.path().join(root_name(origin));
    let mut followed = Vec::new();
    let (commit, mut problems) = match origin {
        Origin::Git { source, access, follow_hosts } => {
            let fetched = git::fetch_tree_with(source, access, &CAPS, &root)?;
            let mut refused = fetched.refused.iter().map(|r| format!("{}: {}", r.path, r.reason)).collect();
            let rules = follow::Rules::new(&source.url, access, follow_hosts);
            followed = follow::follow(&root, &rules, &CAPS, (fetched.files, fetched.bytes), &mut refused)?;
            (fetched.commit, refused)
        }
        Origin::Zip { bytes, digest, path } => {
            if let Some(p) = path {
                RelPath::parse(p).map_err(|why| SnapshotError::Path { path: p.clone(), why: why.to_string() })?;
            }
            let archive = package::zip_folder_archive(bytes, path.as_deref(), &CAPS).map_err(SnapshotError::Zip)?;
            package::unpack_folder_with(&archive, &root, &CAPS).map_err(SnapshotError::Zip)?;
            (digest.clone(), Vec::new())
        }
    };
    let limits = Limits { skills: SOURCE_MAX_SKILLS, ..Limits::default() };
    let catalog = discover_with(std::slice::from_ref(&root), limits, Layout::Recursive);
    let real_root = std::fs::canonicalize(&root)?;
    let shown = |path: &str| relative(Path::new(path), &real_root, &root);
    for p in &catalog.problems {
        problems.push(format!(
            "{}: {} ({})",
            shown(&p.path),
            p.detail,
            serde_json::to_value(p.reason).unwrap_or_default().as_str().unwrap_or("")
        ));
    }
    let notices = root_notices(&real_root);
    let plugin_notices: Vec<_> = followed.iter().map(|f| root_notices(&real_root.join(&f.folder))).collect();
    let mut skills = Vec::with_capacity(catalog.skills.len());
    for skill in &catalog.skills {
        let mut path = relative(&skill.dir, &real_root, &root);
        let mut from = None;
        let mut notices = &notices;
        // A followed plugin's skill: its folder in its own repository, and
        // that repository's notices (not the marketplace's).
        if let Some((i, f)) = followed.iter().enumerate().find(|(_, f)| path.starts_with(&format!("{}/", f.folder))) {
            let rest = &path[f.folder.len() + 1..];
            path = f.path.as_ref().map_or_else(|| rest.to_string(), |p| format!("{p}/{rest}"));
            from = Some((f.url.clone(), f.commit.clone()));
            notices = &plugin_notices[i];
        }
        if skill.dir != real_root {
            for (name, bytes) in notices {
                let target = skill.dir.join(name);
                // Only beside a skill without one: a skill's own licence wins.
                if std::fs::symlink_metadata(&target).is_err() {
                    std::fs::write(&target, bytes)?;
                }
            }
        }
        let leaf = crate::core::spec::leaf_name(&skill.name);
        let version = crate::oci::publish::version_of(&skill.frontmatter);
        let packaged = package::build_from_dir(&skill.dir)
            .and_then(|archive| SkillConfig::for_package(&archive, leaf, skill.meta.description.as_str(), version).map(|c| (archive, c)));
        match packaged {
            Ok((archive, config)) => {
                let content = format!("sha256:{:x}", Sha256::digest(&archive));
                skills.push(PackagedSkill { name: skill.name.clone(), path, archive, content, config, from });
            }
            Err(e) => problems.push(format!("{path}: not packaged: {e}")),
        }
    }
    skills.sort_by(|a, b| a.name.cmp(&b.name));
    let problem_count = problems.len();
    problems.truncate(SOURCE_PROBLEMS_LISTED);
    Ok(Snapshot { commit, skills, problems, problem_count, followed })
}

/// The folder name the tree is fetched under: a root that is itself one
/// skill is named by it (as in `serve`'s standard layout), so it is the
/// source's own last path segment, else the repository's name.
fn root_name(origin: &Origin) -> String {
    let (url, path) = match origin {
        Origin::Git { source, .. } => (source.url.as_str(), source.path.as_ref().map(|p| p.as_str().to_string())),
        Origin::Zip { path, .. } => ("", path.clone()),
    };
    let from_path = path.as_deref().and_then(|p| p.trim_end_matches('/').rsplit('/').next()).map(str::to_string);
    let from_url = url.trim_end_matches('/').rsplit('/').next().map(|s| s.trim_end_matches(".git").to_string());
    from_path.into_iter().chain(from_url).find(|n| crate::core::spec::servable_name(n).is_ok()).unwrap_or_else(|| "skill".to_string())
}

/// `path` below the fetched root, as the repository names it.
fn relative(path: &Path, real_root: &Path, root: &Path) -> String {
    let rel = path.strip_prefix(real_root).or_else(|_| path.strip_prefix(root)).map(PathBuf::from).unwrap_or_else(|_| path.into());
    match rel.to_string_lossy().as_ref() {
        "" => ".".to_string(),
        other => other.to_string(),
    }
}

/// The root's licence and notice files, read once.
fn root_notices(root: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    let mut found: Vec<(String, Vec<u8>)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let lower = name.to_ascii_lowercase();
            ROOT_NOTICES.iter().any(|p| lower.starts_with(p)).then_some(name)
        })
        .filter_map(|name| std::fs::read(root.join(&name)).ok().map(|bytes| (name, bytes)))
        .collect();
    found.sort();
    found
}

/// What changes between two snapshots' skill lists (by name and content
/// digest): added, removed, changed; each sorted.
pub fn diff<'a>(
    old: impl IntoIterator<Item = (&'a str, &'a str)>,
    new: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let old: std::collections::BTreeMap<&str, &str> = old.into_iter().collect();
    let new: std::collections::BTreeMap<&str, &str> = new.into_iter().collect();
    let added = new.keys().filter(|k| !old.contains_key(*k)).map(|k| k.to_string()).collect();
    let removed = old.keys().filter(|k| !new.contains_key(*k)).map(|k| k.to_string()).collect();
    let changed = new.iter().filter(|(k, v)| old.get(*k).is_some_and(|o| o != *v)).map(|(k, _)| k.to_string()).collect();
    (added, removed, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_names_added_removed_and_changed_by_digest() {
        let old = [("a", "sha256:1"), ("b", "sha256:2"), ("c", "sha256:3")];
        let new = [("b", "sha256:2"), ("c", "sha256:9"), ("d", "sha256:4")];
        let (added, removed, changed) = diff(old, new);
        assert_eq!((added, removed, changed), (vec!["d".to_string()], vec!["a".to_string()], vec!["c".to_string()]));
    }

    #[test]
    fn a_root_skill_is_named_by_its_folder_or_repository() {
        let git = |url: &str, path: Option<&str>| Origin::Git {
            source: GitRef { url: url.into(), reference: None, path: path.map(|p| RelPath::parse(p).unwrap()) },
            access: Access::default(),
            follow_hosts: Vec::new(),
        };
        assert_eq!(root_name(&git("https://h/o/pdf-tools.git", None)), "pdf-tools");
        assert_eq!(root_name(&git("https://h/o/repo", Some("skills/xlsx"))), "xlsx");
        assert_eq!(root_name(&git("https://h/o/r%20x", None)), "skill");
        assert_eq!(root_name(&Origin::Zip { bytes: Vec::new(), digest: String::new(), path: None }), "skill");
    }

    /// A ZIP of several skills: walked with the recursive rules, each one
    /// packaged with the root's licence beside it, and a symlink entry
    /// refusing the whole archive (as for packages).
    #[test]
    fn a_zip_of_nested_skills_is_cut_into_packages() {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default();
        for (name, text) in [
            ("LICENSE", "MIT\n"),
            ("plugins/docs/skills/pdf/SKILL.md", "---\nname: pdf\ndescription: PDFs\n---\n"),
            ("skills/tools/lint/SKILL.md", "---\nname: lint\ndescription: lints\n---\n"),
            ("skills/tools/lint/LICENSE", "Apache-2.0\n"),
            ("skills/broken/SKILL.md", "---\nname: broken\n---\n"),
        ] {
            zip.start_file(name, opts).unwrap();
            zip.write_all(text.as_bytes()).unwrap();
        }
        let bytes = zip.finish().unwrap().into_inner();
        let snap = take(&Origin::Zip { bytes, digest: "sha256:x".into(), path: None }).unwrap();
        let names: Vec<_> = snap.skills.iter().map(|s| (s.name.as_str(), s.path.as_str())).collect();
        assert_eq!(names, [("docs/pdf", "plugins/docs/skills/pdf"), ("tools/lint", "skills/tools/lint")]);
        let files = |i: usize| {
            let dir = tempfile::tempdir().unwrap();
            package::unpack(&snap.skills[i].archive, &dir.path().join("p")).unwrap();
            std::fs::read_to_string(dir.path().join("p/LICENSE")).unwrap()
        };
        assert_eq!(files(0), "MIT\n", "the root's licence travels with a nested skill");
        assert_eq!(files(1), "Apache-2.0\n", "a skill's own licence wins");
        assert!(snap.problems.iter().any(|p| p.starts_with("skills/broken") && p.contains("no-description")), "{:?}", snap.problems);
    }
}
