//! Ranking skills for a free-text query: what `skill_search` answers with.
//!
//! Text is folded before it is compared: Unicode compatibility
//! decomposition with the combining marks dropped (`Ã©` is `e`), then
//! lowercase, then split into words at anything not a letter or digit. Each
//! query word is matched against the words of each field: equal, a prefix
//! of one (two letters at least), or within a small edit distance
//! (transpositions count once: `pfd` finds `pdf`). Every query word must
//! match some field, so adding words narrows the answer. A field's weight
//! makes a name match outrank a description match, which outranks an
//! author match: [`NAME_WEIGHT`], [`DESCRIPTION_WEIGHT`], [`AUTHOR_WEIGHT`].

use std::cmp::Ordering;

use super::limits::{SEARCH_QUERY_MAX_CHARS as QUERY_MAX_CHARS, SEARCH_QUERY_MAX_WORDS as QUERY_MAX_WORDS};
use serde_json::{Map, Value};
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

pub const NAME_WEIGHT: f64 = 3.0;
pub const DESCRIPTION_WEIGHT: f64 = 2.0;
pub const AUTHOR_WEIGHT: f64 = 1.0;

/// What is searched of one skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Searchable {
    pub name: String,
    pub description: String,
    pub author: Option<String>,
    pub category: Option<String>,
}

impl Searchable {
    /// The fields of a served skill: the author and category from its
    /// frontmatter (`metadata.author` or `author`; `metadata.category` or
    /// `category`), else the category is the first folder of a nested
    /// name (`document-skills/xlsx` is in `document-skills`).
    pub fn of(name: &str, description: &str, frontmatter: &Map<String, Value>) -> Searchable {
        let text = |key: &str| {
            let nested = frontmatter.get("metadata").and_then(Value::as_object).and_then(|m| m.get(key));
            nested.or_else(|| frontmatter.get(key)).and_then(Value::as_str).map(str::to_string).filter(|s| !s.trim().is_empty())
        };
        let folder = name.split_once('/').map(|(first, _)| first.to_string());
        Searchable { name: name.into(), description: description.into(), author: text("author"), category: text("category").or(folder) }
    }
}

/// Which field a query word matched best in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Field {
    Name,
    Description,
    Author,
}

/// One ranked skill.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// Index into the searched slice.
    pub index: usize,
    pub score: f64,
    /// The fields any query word matched in, name first.
    pub matched: Vec<Field>,
}

/// `text` folded as the module docs say, as its words.
pub fn words(text: &str) -> Vec<String> {
    let folded: String = text.nfkd().filter(|c| !is_combining_mark(*c)).flat_map(char::to_lowercase).collect();
    folded.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_string).collect()
}

/// How well one query word matches one field word, in 0..=1.
fn word_score(query: &str, word: &str) -> f64 {
    if query == word {
        return 1.0;
    }
    let q = query.chars().count();
    if q >= 2 && word.starts_with(query) {
        return 0.8;
    }
    // Short words have too many neighbours one edit away to guess at.
    let allowed = match q {
        0..=3 => return 0.0,
        4..=7 => 1,
        _ => 2,
    };
    let distance = strsim::osa_distance(query, word);
    if distance <= allowed {
        0.6 - 0.1 * distance as f64
    } else {
        0.0
    }
}

fn best(query: &str, field: &[String]) -> f64 {
    field.iter().map(|w| word_score(query, w)).fold(0.0, f64::max)
}

/// Rank `skills` for `query`, best first (equal scores by name), only those
/// in `category` when one is given (compared folded). An empty query
/// matches nothing: list skills with `skill_list`.
pub fn rank(skills: &[Searchable], query: &str, category: Option<&str>) -> Vec<Hit> {
    let query: Vec<String> = words(&query.chars().take(QUERY_MAX_CHARS).collect::<String>()).into_iter().take(QUERY_MAX_WORDS).collect();
    if query.is_empty() {
        return Vec::new();
    }
    let category = category.map(words);
    let mut hits: Vec<Hit> = skills
        .iter()
        .enumerate()
        .filter(|(_, s)| category.as_ref().is_none_or(|want| s.category.as_deref().map(words).as_ref() == Some(want)))
        .filter_map(|(index, s)| {
            let fields = [
                (Field::Name, NAME_WEIGHT, words(&s.name)),
                (Field::Description, DESCRIPTION_WEIGHT, words(&s.description)),
                (Field::Author, AUTHOR_WEIGHT, s.author.as_deref().map(words).unwrap_or_default()),
            ];
            let mut score = 0.0;
            let mut matched = Vec::new();
            for q in &query {
                let (field, weighted) = fields
                    .iter()
                    .map(|(field, weight, ws)| (*field, weight * best(q, ws)))
                    .max_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(Ordering::Equal).then(b.0.cmp(&a.0)))?;
                if weighted <= 0.0 {
                    return None;
                }
                score += weighted;
                if !matched.contains(&field) {
                    matched.push(field);
                }
            }
            matched.sort();
            Some(Hit { index, score: score / query.len() as f64, matched })
        })
        .collect();
    hits.sort_by(|a, b| {
        b.score.partial_cmp(&a.score).unwrap_or(Ordering::Equal).then_with(|| skills[a.index].name.cmp(&skills[b.index].name))
    });
    hits
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn skill(name: &str, description: &str, author: Option<&str>) -> Searchable {
        Searchable { name: name.into(), description: description.into(), author: author.map(Into::into), category: None }
    }

    fn names(skills: &[Searchable], query: &str) -> Vec<String> {
        rank(skills, query, None).into_iter().map(|h| skills[h.index].name.clone()).collect()
    }

    #[test]
    fn a_name_outranks_a_description_which_outranks_an_author() {
        let skills = [
            skill("notes", "Keeps meeting notes", Some("pdf")),
            skill("reader", "Reads pdf files", None),
            skill("pdf", "Fills forms", None),
        ];
        assert_eq!(names(&skills, "pdf"), ["pdf", "reader", "notes"]);
        let hits = rank(&skills, "pdf", None);
        assert_eq!(
            hits.iter().map(|h| h.matched.clone()).collect::<Vec<_>>(),
            [vec![Field::Name], vec![Field::Description], vec![Field::Author]]
        );
    }

    #[test]
    fn case_and_diacritics_do_not_matter() {
        let skills = [skill("cafe-menu", "Crée le menu du café", None), skill("other", "Nothing here", None)];
        assert_eq!(names(&skills, "CAFÉ"), ["cafe-menu"]);
        assert_eq!(names(&skills, "cree"), ["cafe-menu"]);
        assert_eq!(words("Ｆｕｌｌ-width ＰＤＦ"), ["full", "width", "pdf"], "compatibility forms fold too");
    }

    #[test]
    fn typos_within_the_edit_budget_are_found_and_beyond_it_not() {
        let skills = [skill("spreadsheet", "Edits xlsx workbooks", None), skill("pdf", "Fills forms", None)];
        assert_eq!(names(&skills, "spredsheet"), ["spreadsheet"], "one deletion");
        assert_eq!(
            names(&skills, "sperdasheet"),
            ["spreadsheet"],
            "a transposition and a substitution: two edits, allowed at eight letters"
        );
        assert!(names(&skills, "spraadshiit").is_empty(), "three edits");
        assert_eq!(names(&skills, "wrokbooks"), ["spreadsheet"], "a transposition is one edit");
        assert!(names(&skills, "pfd").is_empty(), "three letters: no guessing");
        assert!(names(&skills, "form").contains(&"pdf".to_string()), "a prefix");
    }

    #[test]
    fn every_query_word_must_match_and_the_exact_match_ranks_first() {
        let skills = [skill("pdf-forms", "Fill PDF forms", None), skill("pdf-merge", "Merge PDF files", None)];
        assert_eq!(names(&skills, "pdf merge"), ["pdf-merge"]);
        assert_eq!(names(&skills, "pdf"), ["pdf-forms", "pdf-merge"], "equal scores by name");
        assert!(names(&skills, "   ").is_empty() && names(&skills, "").is_empty());
    }

    #[test]
    fn a_category_narrows_and_comes_from_metadata_or_the_first_folder() {
        let fm = json!({"metadata": {"author": "Ada", "category": "Documents"}});
        let a = Searchable::of("pdf", "Fill PDF forms", fm.as_object().unwrap());
        assert_eq!((a.author.as_deref(), a.category.as_deref()), (Some("Ada"), Some("Documents")));
        let b = Searchable::of("office/xlsx", "Edit PDF exports of sheets", &Map::new());
        assert_eq!(b.category.as_deref(), Some("office"));
        let flat = Searchable::of("plain", "d", json!({"category": "misc", "author": 7}).as_object().unwrap());
        assert_eq!((flat.author, flat.category.as_deref()), (None, Some("misc")), "a non-text author is no author");
        let skills = [a, b];
        let only = |c| rank(&skills, "pdf", Some(c)).into_iter().map(|h| skills[h.index].name.clone()).collect::<Vec<_>>();
        assert_eq!(only("documents"), ["pdf"]);
        assert_eq!(only("OFFICE"), ["office/xlsx"]);
        assert!(only("none").is_empty());
    }

    #[test]
    fn a_long_query_is_cut_at_its_caps() {
        let skills = [skill("pdf", "d", None)];
        let long = format!("pdf {}", "x".repeat(QUERY_MAX_CHARS));
        assert!(names(&skills, &long).is_empty(), "the cut word still has to match");
        let many = format!("pdf{}", " pdf".repeat(QUERY_MAX_WORDS * 4));
        assert_eq!(names(&skills, &many), ["pdf"]);
    }
}
