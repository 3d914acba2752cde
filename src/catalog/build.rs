//! `catalog build`: fetch each repository's tree, find its skills the way
//! `serve --layout recursive` does, and turn every valid one into an entry.
//!
//! Nothing in a repository runs: trees come through
//! [`crate::source::git::fetch_tree`] (objects read one by one, no
//! checkout) and discovery only reads files. A cap reached anywhere (the
//! fetch caps, discovery's folder or skill caps, the entry cap) fails the
//! whole build: a catalog that silently lacks part of a repository would
//! mislead every search, so there is no partial result, and the output
//! file is written only once everything succeeded.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde_json::Value;

use super::ids;
use super::model::{Catalog, CatalogError, Entry, Files, Repository, MAX_ENTRIES};
use crate::core::catalog::{read_capped, Skill};
use crate::core::discovery::{self, Layout};
use crate::core::limits::{count_text, MARKETPLACE_READ_CAP};
use crate::core::marketplace::MARKETPLACE_FILE;
use crate::core::problems::{Problem, Reason};
use crate::core::search::frontmatter_text;
use crate::source::git::{self, Caps, GitRef, GitSourceError};

/// The fetch caps of a catalog build: a SkillSource's, since both read
/// whole repositories (the largest public skill collections hold ~20,000
/// files in ~300 MiB) and a catalog entry is installed as a source.
pub const REPOSITORY_CAPS: Caps = crate::source::snapshot::CAPS;

/// Files whose presence says what a skill needs installed.
pub const REQUIREMENT_FILES: &[&str] = &["requirements.txt", "package.json", "package-lock.json"];

/// Every cap of a build; [`BuildCaps::DEFAULT`] is the production set,
/// tests shrink it to reach the edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildCaps {
    pub fetch: Caps,
    pub entries: usize,
}

impl BuildCaps {
    pub const DEFAULT: BuildCaps = BuildCaps { fetch: REPOSITORY_CAPS, entries: MAX_ENTRIES };
}

/// One repository to build from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositorySpec {
    /// The public URL recorded in the catalog.
    pub url: String,
    /// A branch, tag or commit (`URL#ref`); the remote's HEAD when `None`.
    pub reference: Option<String>,
    /// Where the build reads it: the URL itself, or a local mirror of it.
    pub read_from: String,
}

impl RepositorySpec {
    /// `URL` or `URL#ref`, read from `mirrors[URL]` when there is one.
    pub fn parse(text: &str, mirrors: &HashMap<String, String>) -> Result<RepositorySpec, BuildError> {
        let (url, reference) = match text.split_once('#') {
            Some((url, reference)) if !reference.is_empty() => (url, Some(reference.to_string())),
            Some(_) => return Err(BuildError::Spec(format!("{text:?} has an empty ref after `#`; give URL#branch, tag or commit"))),
            None => (text, None),
        };
        ids::repository_slug(url).map_err(|e| BuildError::Spec(e.to_string()))?;
        let read_from = mirrors.get(url).cloned().unwrap_or_else(|| url.to_string());
        Ok(RepositorySpec { url: url.to_string(), reference, read_from })
    }
}

/// `URL=LOCALPATH`, as `--mirror` takes it.
pub fn parse_mirror(text: &str) -> Result<(String, String), BuildError> {
    match text.split_once('=') {
        Some((url, path)) if !url.is_empty() && !path.is_empty() => Ok((url.to_string(), path.to_string())),
        _ => Err(BuildError::Spec(format!("--mirror {text:?}: give URL=LOCALPATH (the public URL, then a local git directory of it)"))),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Spec(String),
    #[error("{url} and {earlier} are both `{slug}`, and entry ids start with it; give each repository once")]
    Duplicate { url: String, earlier: String, slug: String },
    #[error("{url}: {cause}")]
    Fetch { url: String, cause: GitSourceError },
    #[error("{url}: {detail}; the catalog was not written (a partial catalog would hide skills)")]
    DiscoveryCap { url: String, detail: String },
    #[error("more than {} entries (at {url}); the catalog was not written: build from fewer repositories", count_text(*limit))]
    TooManyEntries { url: String, limit: usize },
    #[error("cannot make a scratch folder: {0}")]
    Scratch(std::io::Error),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

/// Build a catalog from `repositories` (blocking: fetches and file reads).
pub fn build(repositories: &[RepositorySpec], caps: &BuildCaps) -> Result<Catalog, BuildError> {
    check_distinct(repositories)?;
    let scratch = tempfile::Builder::new().prefix("skill-operator-catalog-").tempdir().map_err(BuildError::Scratch)?;
    let mut listed = Vec::new();
    let mut entries = Vec::new();
    for (at, spec) in repositories.iter().enumerate() {
        let tree = scratch.path().join(at.to_string());
        let source = GitRef { url: spec.read_from.clone(), reference: spec.reference.clone(), path: None };
        let fetched = git::fetch_tree(&source, &caps.fetch, &tree).map_err(|cause| BuildError::Fetch { url: spec.url.clone(), cause })?;
        let found = repository_entries(spec, &fetched.commit, &tree, caps.entries)?;
        // Trees are read once: free the disk before the next repository.
        if let Err(e) = std::fs::remove_dir_all(&tree) {
            tracing::warn!(path = %tree.display(), error = %e, "cannot remove a fetched tree; it goes with the scratch folder");
        }
        tracing::info!(url = %spec.url, commit = %fetched.commit, files = fetched.files, skills = found.len(), "catalogued a repository");
        if entries.len() + found.len() > caps.entries {
            return Err(BuildError::TooManyEntries { url: spec.url.clone(), limit: caps.entries });
        }
        listed.push(Repository { url: spec.url.clone(), commit: fetched.commit, skills: found.len() });
        entries.extend(found);
    }
    let catalog = Catalog::new(listed, entries);
    catalog.check()?;
    Ok(catalog)
}

/// Ids start with `<owner>/<repo>`: two URLs giving one would clash.
/// Checked before anything is fetched.
fn check_distinct(repositories: &[RepositorySpec]) -> Result<(), BuildError> {
    let mut seen: HashMap<String, &str> = HashMap::new();
    for spec in repositories {
        let slug = ids::repository_slug(&spec.url).map_err(|e| BuildError::Spec(e.to_string()))?;
        if let Some(earlier) = seen.insert(slug.clone(), &spec.url) {
            return Err(BuildError::Duplicate { url: spec.url.clone(), earlier: earlier.to_string(), slug });
        }
    }
    Ok(())
}

/// [`build`], then write the catalog to `out` atomically: on any error
/// `out` keeps what it held.
pub fn build_to_file(repositories: &[RepositorySpec], caps: &BuildCaps, out: &Path) -> Result<Catalog, BuildError> {
    let catalog = build(repositories, caps)?;
    catalog.save(out)?;
    Ok(catalog)
}

/// The entries of one fetched tree, in served-name order.
fn repository_entries(spec: &RepositorySpec, commit: &str, tree: &Path, max_entries: usize) -> Result<Vec<Entry>, BuildError> {
    let root = tree.canonicalize().map_err(BuildError::Scratch)?;
    // Discovery loads at most one skill past the cap: enough to know the
    // cap was passed, without reading every skill of a huge tree.
    let limits = discovery::Limits { skills: max_entries + 1, ..discovery::Limits::default() };
    let found = discovery::discover_with(std::slice::from_ref(&root), limits, Layout::Recursive);
    if let Some(hit) = found.problems.iter().find(|p| is_cap(p, &root)) {
        if hit.reason == Reason::SkillLimit {
            return Err(BuildError::TooManyEntries { url: spec.url.clone(), limit: max_entries });
        }
        return Err(BuildError::DiscoveryCap { url: spec.url.clone(), detail: hit.detail.clone() });
    }
    // Skills discovery refused are simply not entries; `serve --layout
    // recursive` on a checkout lists why.
    tracing::debug!(url = %spec.url, problems = found.problems.len(), "discovery problems (not catalogued)");
    if found.skills.len() > max_entries {
        return Err(BuildError::TooManyEntries { url: spec.url.clone(), limit: max_entries });
    }
    let categories = plugin_categories(&root);
    found.skills.iter().map(|skill| entry(spec, commit, &root, skill, &categories)).collect()
}

/// A problem that means discovery stopped short: the walk's folder cap
/// (reported on the root itself) or the skill cap.
fn is_cap(problem: &Problem, root: &Path) -> bool {
    match problem.reason {
        Reason::SkillLimit => true,
        Reason::DirLimit => Path::new(&problem.path) == root,
        _ => false,
    }
}

fn entry(
    spec: &RepositorySpec,
    commit: &str,
    root: &Path,
    skill: &Skill,
    categories: &HashMap<String, String>,
) -> Result<Entry, BuildError> {
    let path = skill.dir.strip_prefix(root).map(|p| p.to_string_lossy().replace('\\', "/")).unwrap_or_default();
    let category = frontmatter_text(&skill.frontmatter, "category")
        .or_else(|| skill.name.split_once('/').and_then(|(plugin, _)| categories.get(plugin).cloned()))
        .or_else(|| skill.name.split_once('/').map(|(folder, _)| folder.to_string()));
    let requirements: BTreeSet<String> = skill
        .files
        .iter()
        .filter(|f| REQUIREMENT_FILES.contains(&f.path.as_str().rsplit('/').next().unwrap_or_default()))
        .map(|f| f.path.as_str().to_string())
        .collect();
    Ok(Entry {
        id: ids::entry_id(&spec.url, &skill.name).map_err(|e| BuildError::Spec(e.to_string()))?,
        repository: spec.url.clone(),
        path,
        commit: commit.to_string(),
        name: skill.name.clone(),
        description: skill.meta.description.clone(),
        author: frontmatter_text(&skill.frontmatter, "author"),
        license: skill.meta.license.clone(),
        category,
        files: Files { count: skill.files.len(), bytes: skill.bytes },
        scripts: skill.scripts.iter().map(|s| s.decl.script.as_str().to_string()).collect(),
        requirements: requirements.into_iter().collect(),
    })
}

/// Plugin name to category, from the root's marketplace (`plugins[].category`).
/// Discovery already reported a broken marketplace; here it only means no
/// categories.
fn plugin_categories(root: &Path) -> HashMap<String, String> {
    let Ok((bytes, false)) = read_capped(&root.join(MARKETPLACE_FILE), MARKETPLACE_READ_CAP) else { return HashMap::new() };
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(&bytes) else { return HashMap::new() };
    let plugins = doc.get("plugins").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    plugins
        .iter()
        .filter_map(|p| {
            let name = p.get("name")?.as_str()?;
            let category = p.get("category")?.as_str().filter(|c| !c.trim().is_empty())?;
            Some((name.to_string(), category.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A fetched tree with these files; the canonical root.
    fn fixture(files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        for (rel, text) in files {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let root = dir.path().canonicalize().unwrap();
        (dir, root)
    }

    fn spec() -> RepositorySpec {
        RepositorySpec::parse("https://github.com/acme/kit", &HashMap::new()).unwrap()
    }

    #[test]
    fn specs_take_a_ref_and_a_mirror() {
        let mirrors = HashMap::from([("https://github.com/a/b".to_string(), "/m/a+b".to_string())]);
        let s = RepositorySpec::parse("https://github.com/a/b#v1", &mirrors).unwrap();
        assert_eq!((s.reference.as_deref(), s.read_from.as_str()), (Some("v1"), "/m/a+b"));
        assert!(RepositorySpec::parse("https://github.com/a/b#", &mirrors).is_err());
        assert!(RepositorySpec::parse("https://github.com/b", &mirrors).unwrap_err().to_string().contains("/<owner>/<repo>"));
        assert_eq!(parse_mirror("https://x/a/b=/m").unwrap(), ("https://x/a/b".into(), "/m".into()));
        assert!(parse_mirror("https://x/a/b").is_err() && parse_mirror("=/m").is_err());
        let twice = [
            RepositorySpec::parse("https://github.com/a/b", &mirrors).unwrap(),
            RepositorySpec::parse("https://gitlab.com/a/b.git", &mirrors).unwrap(),
        ];
        let err = build(&twice, &BuildCaps::DEFAULT).unwrap_err().to_string();
        assert!(err.contains("are both `a/b`"), "{err}");
    }

    #[test]
    fn categories_come_from_frontmatter_then_the_marketplace_then_the_folder() {
        let (_dir, root) = fixture(&[
            (".claude-plugin/marketplace.json", r#"{"plugins":[{"name":"docs","source":"./plugins/docs","category":"Office"}]}"#),
            ("plugins/docs/skills/xlsx/SKILL.md", "---\nname: xlsx\ndescription: sheets\n---\n"),
            (
                "plugins/docs/skills/pdf/SKILL.md",
                "---\nname: pdf\ndescription: pdfs\nmetadata:\n  category: Documents\n  author: Ada\n---\n",
            ),
            ("skills/devops/terraform/SKILL.md", "---\nname: terraform\ndescription: infra\nlicense: MIT\n---\n"),
            ("skills/devops/terraform/requirements.txt", "x\n"),
            ("skills/devops/terraform/web/package.json", "{}\n"),
            ("skills/lonely/SKILL.md", "---\nname: lonely\ndescription: alone\n---\n"),
            ("skills/broken/SKILL.md", "---\nname: broken\n---\nno description\n"),
        ]);
        let entries = repository_entries(&spec(), COMMIT, &root, 10).unwrap();
        let by = |name: &str| entries.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("{name} in {entries:?}"));
        assert_eq!(by("docs/xlsx").category.as_deref(), Some("Office"));
        assert_eq!((by("docs/pdf").category.as_deref(), by("docs/pdf").author.as_deref()), (Some("Documents"), Some("Ada")));
        let tf = by("devops/terraform");
        assert_eq!(
            (tf.category.as_deref(), tf.license.as_deref(), tf.path.as_str()),
            (Some("devops"), Some("MIT"), "skills/devops/terraform")
        );
        assert_eq!(tf.requirements, ["requirements.txt", "web/package.json"]);
        assert_eq!((tf.id.as_str(), tf.commit.as_str(), tf.files.count), ("acme/kit/devops/terraform", COMMIT, 3));
        assert_eq!(by("lonely").category, None, "a top-level skill has no folder to be in");
        assert_eq!(entries.len(), 4, "the skill without a description is not an entry");
    }

    #[test]
    fn a_walk_cut_short_by_the_folder_cap_fails_the_build() {
        use crate::core::limits::RECURSIVE_DIRS;
        let (dir, root) = fixture(&[("skills/a/SKILL.md", "---\nname: a\ndescription: d\n---\n")]);
        // The root and `skills` are listed, so this many more folders fit exactly.
        for i in 0..RECURSIVE_DIRS - 2 {
            std::fs::create_dir(dir.path().join(format!("f{i}"))).unwrap();
        }
        assert_eq!(repository_entries(&spec(), COMMIT, &root, 10).unwrap().len(), 1);
        std::fs::create_dir(dir.path().join("one-more")).unwrap();
        let err = repository_entries(&spec(), COMMIT, &root, 10).unwrap_err();
        assert!(matches!(&err, BuildError::DiscoveryCap { detail, .. } if detail.contains("folders")), "{err}");
    }

    #[test]
    fn the_skill_cap_holds_at_its_edge() {
        let files: Vec<(String, String)> =
            (0..3).map(|i| (format!("skills/s{i}/SKILL.md"), format!("---\nname: s{i}\ndescription: d\n---\n"))).collect();
        let files: Vec<(&str, &str)> = files.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let (_dir, root) = fixture(&files);
        assert_eq!(repository_entries(&spec(), COMMIT, &root, 3).unwrap().len(), 3);
        let over = repository_entries(&spec(), COMMIT, &root, 2).unwrap_err();
        assert!(matches!(over, BuildError::TooManyEntries { limit: 2, .. }), "{over}");
    }
}
