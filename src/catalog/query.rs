//! Answering from a loaded catalog: search (the one ranker of
//! [`crate::core::search`], over an index built once) and look-up by id.

use super::model::{Catalog, Entry};
use crate::core::search::{Field, Index, Searchable};

/// How many ids an unknown-id error suggests.
const SUGGESTIONS: usize = 3;
/// How many ranked names are looked at for them (those of the id's own
/// repository come first among these).
const SUGGESTION_POOL: usize = 50;

/// A catalog with its search index.
pub struct Searcher {
    catalog: Catalog,
    index: Index,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Found<'a> {
    #[serde(flatten)]
    pub entry: &'a Entry,
    pub score: f64,
    pub matched: Vec<Field>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no skill `{id}` in the catalog ({entries} entries){}", suggest(.suggestions))]
pub struct UnknownId {
    pub id: String,
    pub entries: usize,
    pub suggestions: Vec<String>,
}

fn suggest(ids: &[String]) -> String {
    if ids.is_empty() {
        return "; find ids with `skill-operator catalog search WORDS`".into();
    }
    format!("; did you mean {}?", ids.iter().map(|i| format!("`{i}`")).collect::<Vec<_>>().join(", "))
}

impl Searcher {
    pub fn new(catalog: Catalog) -> Searcher {
        let searchable: Vec<Searchable> = catalog
            .entries
            .iter()
            .map(|e| Searchable {
                name: e.name.clone(),
                description: e.description.clone(),
                author: e.author.clone(),
                category: e.category.clone(),
            })
            .collect();
        Searcher { index: Index::new(&searchable), catalog }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The entries matching `query` (in `category` when given), best first:
    /// the first `limit`, and how many matched in all.
    pub fn search(&self, query: &str, category: Option<&str>, limit: usize) -> (Vec<Found<'_>>, usize) {
        let hits = self.index.rank(query, category);
        let total = hits.len();
        let found = hits
            .into_iter()
            .take(limit)
            .map(|h| Found { entry: &self.catalog.entries[h.index], score: h.score, matched: h.matched })
            .collect();
        (found, total)
    }

    /// The entry `id`, or an error suggesting the nearest ids: those whose
    /// name ranks best for the id's last segment, the id's own repository
    /// (`owner/repo/`) first.
    pub fn get(&self, id: &str) -> Result<&Entry, UnknownId> {
        if let Some(entry) = self.catalog.get(id) {
            return Ok(entry);
        }
        let last = id.rsplit('/').next().unwrap_or(id);
        let repository: String = id.split('/').take(2).map(|s| format!("{s}/")).collect();
        let (mut near, _) = self.search(last, None, SUGGESTION_POOL);
        // Stable: the ranking holds within each group.
        near.sort_by_key(|f| !f.entry.id.starts_with(&repository));
        Err(UnknownId {
            id: id.to_string(),
            entries: self.catalog.entries.len(),
            suggestions: near.into_iter().take(SUGGESTIONS).map(|f| f.entry.id.clone()).collect(),
        })
    }
}
