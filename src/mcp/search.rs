//! `skill_search`: skills ranked for a query ([`crate::core::search`]), so
//! an agent facing hundreds of skills asks for the few that fit instead of
//! reading `skill_list` whole.
//!
//! Two scopes, one set of caps (checked once, in [`checked`]):
//! - `bound` (the default): the skills served here;
//! - `catalog`: the catalog of skills in public repositories (the cluster's,
//!   else the embedded snapshot; [`crate::catalog::live`]), with what
//!   installing one takes. It is asked on top of reading skills, as
//!   [`Action::SearchCatalog`]: whoever may create SkillPackages may look
//!   for skills to install; others are refused by name of that permission.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::{codes, ToolError};
use super::executor::Caller;
use super::snapshot::Snapshot;
use super::state::{Action, ServerState};
use crate::catalog::live::Active;
use crate::catalog::model::Entry;
use crate::core::limits::{SEARCH_QUERY_MAX_CHARS, SEARCH_QUERY_MAX_WORDS, SEARCH_RESULTS_DEFAULT, SEARCH_RESULTS_MAX};
use crate::core::search::{self, Field, Searchable};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillSearchInput {
    /// Words to look for in skill names, descriptions and authors (case, accents and small typos do not matter).
    pub query: String,
    /// Only skills of this category (frontmatter `metadata.category`, or the first folder of a nested name).
    #[serde(default)]
    pub category: Option<String>,
    /// How many results at most (the default and the maximum are in the tool's description).
    #[serde(default)]
    pub limit: Option<usize>,
    /// `bound` (default): the skills served here. `catalog`: skills in public repositories that can be installed (needs `create` on skillpackages).
    #[serde(default)]
    pub scope: Scope,
}

/// What `skill_search` searches. Inlined, variants without doc comments:
/// the schema is then a plain string enum every client reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Scope {
    // The skills served here.
    #[default]
    Bound,
    // The catalog of skills in public repositories.
    Catalog,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillSearchOutput {
    pub results: Vec<SearchResult>,
    /// Skills that matched, before `limit`.
    pub total: usize,
    /// Scope `catalog`: which catalog answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogFacts>,
}

/// Which catalog answered a `catalog` search.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogFacts {
    /// Where it came from: the cluster's ConfigMap, or the snapshot embedded in the gateway.
    pub origin: String,
    /// When it was built (RFC 3339): skills newer than that are not in it.
    pub built: String,
    /// Entries in it.
    pub entries: usize,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchResult {
    pub name: String,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Higher is better: 3 for a name matching every word exactly, 2 for a description, 1 for an author.
    pub score: f64,
    /// Where the query's words were found.
    pub matched: Vec<Field>,
    /// Scope `catalog`: the entry's id (`<owner>/<repo>/<name>`), what `skill-operator catalog show|install` take.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Scope `catalog`: the git repository holding the skill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Scope `catalog`: the commit the catalog read it at (what an install pins).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Scope `catalog`: the skill's folder in the repository (empty: the repository is the skill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Scope `catalog`: the command that installs it (a SkillSource pinned to `commit`, applied by someone who may create SkillSources).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub install: Option<String>,
}

fn invalid(message: String) -> ToolError {
    ToolError::new(codes::INVALID_ARGUMENTS, message)
}

/// The search's arguments once checked against the caps, the same for both scopes.
struct Checked<'a> {
    query: &'a str,
    category: Option<&'a str>,
    limit: usize,
}

fn checked(input: &SkillSearchInput) -> Result<Checked<'_>, ToolError> {
    let chars = input.query.chars().count();
    if chars > SEARCH_QUERY_MAX_CHARS {
        return Err(invalid(format!("the query has {chars} characters; at most {SEARCH_QUERY_MAX_CHARS}: use fewer, more telling words")));
    }
    let words = search::words(&input.query).len();
    if words == 0 {
        let hint = match input.scope {
            Scope::Bound => "to see every skill, call skill_list",
            Scope::Catalog => "the catalog is searched by words",
        };
        return Err(invalid(format!("the query has no words to look for; {hint}")));
    }
    if words > SEARCH_QUERY_MAX_WORDS {
        return Err(invalid(format!(
            "the query has {words} words; at most {SEARCH_QUERY_MAX_WORDS} (every word must match, so fewer find more)"
        )));
    }
    let limit = input.limit.unwrap_or(SEARCH_RESULTS_DEFAULT);
    if !(1..=SEARCH_RESULTS_MAX).contains(&limit) {
        return Err(invalid(format!("limit {limit} is out of range: 1 to {SEARCH_RESULTS_MAX}")));
    }
    Ok(Checked { query: &input.query, category: input.category.as_deref(), limit })
}

/// Scores as sent: three decimals are all a ranking needs.
fn rounded(score: f64) -> f64 {
    (score * 1000.0).round() / 1000.0
}

/// `skill_search`, in the scope the input names; `catalog` is authorized
/// first (an unknown or refused caller learns nothing of the arguments).
pub async fn skill_search(
    state: &ServerState,
    snap: &Snapshot,
    caller: &Caller,
    input: SkillSearchInput,
) -> Result<SkillSearchOutput, ToolError> {
    match input.scope {
        Scope::Bound => bound(snap, checked(&input)?),
        Scope::Catalog => {
            state.authorize(caller, Action::SearchCatalog).await?;
            let Some(live) = &state.catalog else {
                return Err(ToolError::new(
                    codes::NO_CATALOG,
                    "this server has no catalog to search: search it from the command line with `skill-operator catalog search WORDS` (the gateway answers scope catalog)",
                ));
            };
            let query = checked(&input)?;
            Ok(catalog(&live.load(), query))
        }
    }
}

fn bound(snap: &Snapshot, query: Checked<'_>) -> Result<SkillSearchOutput, ToolError> {
    let skills = &snap.catalog.skills;
    let searchable: Vec<Searchable> = skills.iter().map(|s| Searchable::of(&s.name, &s.meta.description, &s.frontmatter)).collect();
    let hits = search::rank(&searchable, query.query, query.category);
    let total = hits.len();
    let results = hits
        .into_iter()
        .take(query.limit)
        .map(|hit| {
            let s = &searchable[hit.index];
            SearchResult {
                name: s.name.clone(),
                description: s.description.clone(),
                author: s.author.clone(),
                category: s.category.clone(),
                score: rounded(hit.score),
                matched: hit.matched,
                id: None,
                repository: None,
                commit: None,
                path: None,
                install: None,
            }
        })
        .collect();
    Ok(SkillSearchOutput { results, total, catalog: None })
}

fn catalog(active: &Active, query: Checked<'_>) -> SkillSearchOutput {
    let (found, total) = active.searcher.search(query.query, query.category, query.limit);
    let results = found
        .into_iter()
        .map(|f| {
            let e: &Entry = f.entry;
            SearchResult {
                name: e.name.clone(),
                description: e.description.clone(),
                author: e.author.clone(),
                category: e.category.clone(),
                score: rounded(f.score),
                matched: f.matched,
                id: Some(e.id.clone()),
                repository: Some(e.repository.clone()),
                commit: Some(e.commit.clone()),
                path: Some(e.path.clone()),
                install: Some(install_command(&e.id)),
            }
        })
        .collect();
    let c = active.searcher.catalog();
    let facts = CatalogFacts { origin: active.origin.to_string(), built: c.built.clone(), entries: c.entries.len() };
    SkillSearchOutput { results, total, catalog: Some(facts) }
}

/// The command that installs entry `id` from the cluster's catalog (the
/// one the gateway answers from), the id quoted for a POSIX shell unless
/// it is plain.
pub fn install_command(id: &str) -> String {
    let plain = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b));
    let word = if plain { id.to_string() } else { format!("'{}'", id.replace('\'', "'\\''")) };
    format!("skill-operator catalog install {word} --cluster | kubectl apply -f -")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::discovery::Layout;
    use crate::core::grants::Grants;

    fn write(root: &std::path::Path, dir: &str, frontmatter: &str) {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join("SKILL.md"), format!("---\n{frontmatter}\n---\nbody\n")).unwrap();
    }

    /// A nested tree as `serve --layout recursive` finds it.
    fn snapshot() -> (tempfile::TempDir, Snapshot) {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "plugins/office/skills/xlsx", "name: xlsx\ndescription: Edit Excel spreadsheets and their formulas.");
        write(t.path(), "plugins/office/skills/pdf", "name: pdf\ndescription: Fill PDF forms.\nmetadata:\n  author: Zoë Ames");
        write(
            t.path(),
            "skills/csv-stats",
            "name: csv-stats\ndescription: Column statistics of a spreadsheet exported as CSV.\ncategory: data",
        );
        let snap = Snapshot::scan_with(&[t.path().to_path_buf()], Layout::Recursive, Grants::resolve(&|_| None, None), Default::default());
        (t, snap)
    }

    fn search(snap: &Snapshot, query: &str, category: Option<&str>, limit: Option<usize>) -> Result<SkillSearchOutput, ToolError> {
        let input = SkillSearchInput { query: query.into(), category: category.map(Into::into), limit, scope: Scope::Bound };
        bound(snap, checked(&input)?)
    }

    fn names(out: &SkillSearchOutput) -> Vec<&str> {
        out.results.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn finds_served_skills_by_name_description_author_and_category() {
        let (_t, snap) = snapshot();
        let out = search(&snap, "spreadsheet", None, None).unwrap();
        assert_eq!(names(&out), ["csv-stats", "office/xlsx"], "an exact word (spreadsheet) before a prefix of one (spreadsheets)");
        assert!(out.results[0].score > out.results[1].score);
        assert_eq!(names(&search(&snap, "xlsx", None, None).unwrap()), ["office/xlsx"]);
        let by_author = search(&snap, "zoe", None, None).unwrap();
        assert_eq!(names(&by_author), ["office/pdf"]);
        assert_eq!(by_author.results[0].matched, [Field::Author]);
        assert_eq!(by_author.results[0].author.as_deref(), Some("Zoë Ames"));
        assert_eq!(
            names(&search(&snap, "spreadsheet", Some("office"), None).unwrap()),
            ["office/xlsx"],
            "the first folder is the category"
        );
        assert_eq!(names(&search(&snap, "spreadsheet", Some("Data"), None).unwrap()), ["csv-stats"], "the frontmatter's category");
        assert_eq!(names(&search(&snap, "spreadshet", None, None).unwrap()).len(), 2, "a typo");
        assert!(search(&snap, "kubernetes", None, None).unwrap().results.is_empty());
    }

    #[test]
    fn limit_and_query_are_checked_at_their_edges() {
        let (_t, snap) = snapshot();
        let out = search(&snap, "spreadsheet", None, Some(1)).unwrap();
        assert_eq!((out.results.len(), out.total), (1, 2), "total counts what the limit cut");
        assert!(search(&snap, "pdf", None, Some(SEARCH_RESULTS_MAX)).is_ok());
        for bad in [0, SEARCH_RESULTS_MAX + 1] {
            let e = search(&snap, "pdf", None, Some(bad)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_ARGUMENTS);
            assert!(e.message.contains("limit"), "{}", e.message);
        }
        let at_cap = format!("pdf {}", "a".repeat(SEARCH_QUERY_MAX_CHARS - 4));
        assert!(search(&snap, &at_cap, None, None).is_ok());
        let over = format!("{at_cap}a");
        assert!(search(&snap, &over, None, None).unwrap_err().message.contains(&format!("at most {SEARCH_QUERY_MAX_CHARS}")));
        let words = |n: usize| vec!["pdf"; n].join(" ");
        assert_eq!(names(&search(&snap, &words(SEARCH_QUERY_MAX_WORDS), None, None).unwrap()), ["office/pdf"]);
        assert!(search(&snap, &words(SEARCH_QUERY_MAX_WORDS + 1), None, None).unwrap_err().message.contains("words"));
        for empty in ["", "  ", "--- !!"] {
            assert!(search(&snap, empty, None, None).unwrap_err().message.contains("skill_list"), "{empty:?}");
        }
    }
}
