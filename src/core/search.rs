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
//!
//! [`rank`] ranks a set once; an [`Index`] folds a set once and ranks it
//! for many queries (the skill catalog's thousands of entries).

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
        let folder = name.split_once('/').map(|(first, _)| first.to_string());
        Searchable {
            name: name.into(),
            description: description.into(),
            author: frontmatter_text(frontmatter, "author"),
            category: frontmatter_text(frontmatter, "category").or(folder),
        }
    }
}

/// A text field of a frontmatter: `metadata.<key>`, else `<key>`; `None`
/// when absent, blank or not text.
pub fn frontmatter_text(frontmatter: &Map<String, Value>, key: &str) -> Option<String> {
    let nested = frontmatter.get("metadata").and_then(Value::as_object).and_then(|m| m.get(key));
    nested.or_else(|| frontmatter.get(key)).and_then(Value::as_str).map(str::to_string).filter(|s| !s.trim().is_empty())
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
    let Some(allowed) = edit_budget(q) else { return 0.0 };
    let distance = strsim::osa_distance(query, word);
    if distance <= allowed {
        0.6 - 0.1 * distance as f64
    } else {
        0.0
    }
}

/// The edits a query word of `chars` characters may be away from a field
/// word; `None` when no typo is guessed at. Short words have too many
/// neighbours one edit away to guess at.
fn edit_budget(chars: usize) -> Option<usize> {
    match chars {
        0..=3 => None,
        4..=7 => Some(1),
        _ => Some(2),
    }
}

/// Rank `skills` for `query`, best first (equal scores by name), only those
/// in `category` when one is given (compared folded). An empty query
/// matches nothing: list skills with `skill_list`. The one-shot form of
/// [`Index::rank`]: callers that rank one set many times keep an [`Index`].
pub fn rank(skills: &[Searchable], query: &str, category: Option<&str>) -> Vec<Hit> {
    Index::new(skills).rank(query, category)
}

/// A folded word of the index, with what the typo filter needs.
#[derive(Debug)]
struct Word {
    text: String,
    chars: usize,
    /// One bit per character (hashed to 64): an edit adds or removes at
    /// most one character, so two words `d` edits apart differ in at most
    /// `d` bits each way. Cheaper than an edit distance, and it rules out
    /// almost every word of a large vocabulary.
    mask: u64,
}

impl Word {
    fn new(text: String) -> Word {
        let mask = text.chars().fold(0u64, |m, c| m | 1 << (c as u32 % 64));
        Word { chars: text.chars().count(), text, mask }
    }
}

/// The fields in weight order (index = `Field as usize`).
const FIELDS: [(Field, f64); 3] = [(Field::Name, NAME_WEIGHT), (Field::Description, DESCRIPTION_WEIGHT), (Field::Author, AUTHOR_WEIGHT)];

/// Skills folded once and ranked many times (a catalog of thousands): each
/// distinct word is scored against a query word once, and only the skills
/// holding a matching word are looked at. Ranks exactly as [`rank`] did
/// when it compared every word of every skill.
#[derive(Debug)]
pub struct Index {
    /// Every distinct folded word, sorted, so the words a query word is a
    /// prefix of are one range.
    vocabulary: Vec<Word>,
    /// For each word of `vocabulary`: the (skill, field) pairs holding it.
    postings: Vec<Vec<(u32, u8)>>,
    /// Each skill's category, folded.
    categories: Vec<Option<Vec<String>>>,
    /// Each skill's place in name order (equal names, equal places): the
    /// tie-break, compared as a number rather than as text.
    name_order: Vec<u32>,
}

impl Index {
    pub fn new(skills: &[Searchable]) -> Index {
        let mut ids: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
        let mut texts: Vec<String> = Vec::new();
        let mut pairs: Vec<(u32, u32, u8)> = Vec::new();
        for (skill, s) in skills.iter().enumerate() {
            let fields = [Some(s.name.as_str()), Some(s.description.as_str()), s.author.as_deref()];
            for (field, text) in fields.iter().enumerate() {
                for word in words(text.unwrap_or_default()) {
                    let next = texts.len() as u32;
                    let id = *ids.entry(word).or_insert_with_key(|w| {
                        texts.push(w.clone());
                        next
                    });
                    pairs.push((id, skill as u32, field as u8));
                }
            }
        }
        // Sort the vocabulary and renumber the postings to match.
        let mut order: Vec<u32> = (0..texts.len() as u32).collect();
        order.sort_by(|a, b| texts[*a as usize].cmp(&texts[*b as usize]));
        let mut place = vec![0u32; texts.len()];
        for (at, id) in order.iter().enumerate() {
            place[*id as usize] = at as u32;
        }
        let mut postings = vec![Vec::new(); texts.len()];
        for (id, skill, field) in pairs {
            let list: &mut Vec<(u32, u8)> = &mut postings[place[id as usize] as usize];
            if list.last() != Some(&(skill, field)) {
                list.push((skill, field));
            }
        }
        let mut texts: Vec<Option<String>> = texts.into_iter().map(Some).collect();
        let vocabulary = order.iter().map(|id| Word::new(texts[*id as usize].take().unwrap_or_default())).collect();
        let mut by_name: Vec<usize> = (0..skills.len()).collect();
        by_name.sort_by(|a, b| skills[*a].name.cmp(&skills[*b].name));
        let mut name_order = vec![0u32; skills.len()];
        let mut place_of_name = 0u32;
        for (at, skill) in by_name.iter().enumerate() {
            if at > 0 && skills[by_name[at - 1]].name != skills[*skill].name {
                place_of_name = at as u32;
            }
            name_order[*skill] = place_of_name;
        }
        let categories = skills.iter().map(|s| s.category.as_deref().map(words)).collect();
        Index { vocabulary, postings, categories, name_order }
    }

    /// How many skills are indexed.
    pub fn len(&self) -> usize {
        self.name_order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.name_order.is_empty()
    }

    /// The vocabulary words `query` matches, with their [`word_score`].
    fn matches(&self, query: &str) -> Vec<(usize, f64)> {
        let chars = query.chars().count();
        let mut found = Vec::new();
        // Equal or a prefix: one sorted range starting at `query`.
        let start = self.vocabulary.partition_point(|w| w.text.as_str() < query);
        let mut prefix_end = start;
        for (at, word) in self.vocabulary[start..].iter().enumerate() {
            if !word.text.starts_with(query) {
                break;
            }
            prefix_end = start + at + 1;
            let score = word_score(query, &word.text);
            if score > 0.0 {
                found.push((start + at, score));
            }
        }
        let Some(allowed) = edit_budget(chars) else { return found };
        let mask = query.chars().fold(0u64, |m, c| m | 1 << (c as u32 % 64));
        for (at, word) in self.vocabulary.iter().enumerate() {
            if (start..prefix_end).contains(&at)
                || word.chars.abs_diff(chars) > allowed
                || (mask & !word.mask).count_ones() as usize > allowed
                || (word.mask & !mask).count_ones() as usize > allowed
            {
                continue;
            }
            let score = word_score(query, &word.text);
            if score > 0.0 {
                found.push((at, score));
            }
        }
        found
    }

    /// [`rank`] over the indexed skills; `Hit::index` is a skill's place in
    /// the slice the index was built from.
    pub fn rank(&self, query: &str, category: Option<&str>) -> Vec<Hit> {
        let query: Vec<String> =
            words(&query.chars().take(QUERY_MAX_CHARS).collect::<String>()).into_iter().take(QUERY_MAX_WORDS).collect();
        if query.is_empty() {
            return Vec::new();
        }
        let category = category.map(words);
        let wanted = |skill: usize| category.as_ref().is_none_or(|want| self.categories[skill].as_ref() == Some(want));
        // Per skill: the sum of its query words' weighted scores, how many
        // query words it matched, and the fields they matched in (bits).
        let mut totals: Vec<(f64, usize, u8)> = vec![(0.0, 0, 0); self.len()];
        // Per skill, for the current query word: its best score per field.
        let mut best: Vec<[f64; 3]> = vec![[0.0; 3]; self.len()];
        let mut touched: Vec<usize> = Vec::new();
        for q in &query {
            for (word, score) in self.matches(q) {
                for &(skill, field) in &self.postings[word] {
                    let (skill, field) = (skill as usize, field as usize);
                    if !wanted(skill) {
                        continue;
                    }
                    if best[skill] == [0.0; 3] {
                        touched.push(skill);
                    }
                    best[skill][field] = best[skill][field].max(score);
                }
            }
            for skill in touched.drain(..) {
                // The best weighted field; the heavier field on a tie.
                let (field, weighted) = FIELDS
                    .iter()
                    .zip(best[skill])
                    .map(|((field, weight), score)| (*field, weight * score))
                    .fold((Field::Name, 0.0), |acc, next| if next.1 > acc.1 { next } else { acc });
                best[skill] = [0.0; 3];
                let total = &mut totals[skill];
                total.0 += weighted;
                total.1 += 1;
                total.2 |= 1 << field as u8;
            }
        }
        let mut hits: Vec<Hit> = totals
            .into_iter()
            .enumerate()
            .filter(|(_, (_, matched, _))| *matched == query.len())
            .map(|(index, (score, _, fields))| Hit {
                index,
                score: score / query.len() as f64,
                matched: FIELDS.iter().map(|(f, _)| *f).filter(|f| fields & (1 << *f as u8) != 0).collect(),
            })
            .collect();
        hits.sort_by(|a, b| {
            b.score
                .partial_cmp(&a.score)
                .unwrap_or(Ordering::Equal)
                .then_with(|| self.name_order[a.index].cmp(&self.name_order[b.index]))
                .then_with(|| a.index.cmp(&b.index))
        });
        hits
    }
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

    /// The ranking as it was before the index: every query word against
    /// every word of every field of every skill. The index must agree.
    fn reference_rank(skills: &[Searchable], query: &str, category: Option<&str>) -> Vec<Hit> {
        let query: Vec<String> =
            words(&query.chars().take(QUERY_MAX_CHARS).collect::<String>()).into_iter().take(QUERY_MAX_WORDS).collect();
        if query.is_empty() {
            return Vec::new();
        }
        let best = |q: &str, field: &[String]| field.iter().map(|w| word_score(q, w)).fold(0.0, f64::max);
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

    #[test]
    fn the_index_ranks_exactly_as_every_word_against_every_word() {
        // A vocabulary with near neighbours (one and two edits apart,
        // transpositions, prefixes, shared letters, accents) in every field.
        let vocab = [
            "pdf",
            "pdfs",
            "form",
            "forms",
            "format",
            "spreadsheet",
            "spredsheet",
            "sheets",
            "sheet",
            "workbook",
            "wrokbook",
            "café",
            "cafe",
            "menu",
            "merge",
            "merger",
            "emerge",
            "docx",
            "docs",
            "document",
            "documents",
            "xlsx",
            "slack",
            "stack",
            "track",
            "tracker",
            "review",
            "reviewer",
            "rewiev",
            "data",
            "date",
            "dates",
            "ada",
            "lovelace",
            "über",
        ];
        let pick = |seed: usize, n: usize| (0..n).map(|i| vocab[(seed * 7 + i * 13) % vocab.len()]).collect::<Vec<_>>().join(" ");
        let skills: Vec<Searchable> = (0..120)
            .map(|i| Searchable {
                name: format!("{}-{}", vocab[i % vocab.len()], vocab[(i * 5) % vocab.len()]),
                description: pick(i, 1 + i % 6),
                author: (i % 3 != 0).then(|| pick(i + 11, 1 + i % 2)),
                category: (i % 4 != 0).then(|| ["office", "Office", "data"][i % 3].to_string()),
            })
            .collect();
        let index = Index::new(&skills);
        let mut compared = 0;
        for query in
            vocab.iter().map(|w| w.to_string()).chain((0..60).map(|i| pick(i, 1 + i % 3))).chain(["", "zz", "  ", "pd"].map(String::from))
        {
            for category in [None, Some("office"), Some("data"), Some("none")] {
                let want = reference_rank(&skills, &query, category);
                let got = index.rank(&query, category);
                assert_eq!(got, want, "query {query:?} category {category:?}");
                compared += want.len();
            }
        }
        assert!(compared > 1_000, "the queries must find things to compare: {compared}");
    }

    #[test]
    fn the_typo_filter_lets_through_every_word_within_the_budget() {
        // Words `d` edits away in every way an edit can be made, at each budget's edge.
        let skills = [skill("abcdefgh", "abcd", None)];
        let index = Index::new(&skills);
        for (query, found) in [
            ("abce", true),       // a substitution, budget 1
            ("abdc", true),       // a transposition, budget 1
            ("abcdx", true),      // one insertion
            ("axyd", false),      // two substitutions, budget 1
            ("abcdefxy", true),   // two substitutions, budget 2
            ("bacdefgx", true),   // a transposition and a substitution, budget 2
            ("abcdexyz", false),  // three substitutions, budget 2
            ("abcdefghij", true), // two insertions
        ] {
            assert_eq!(!index.rank(query, None).is_empty(), found, "{query}");
            assert_eq!(index.rank(query, None), reference_rank(&skills, query, None), "{query}");
        }
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
