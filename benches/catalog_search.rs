//! `catalog search` latency over the embedded snapshot: is one query under
//! a millisecond at the 99th percentile with 3,000+ entries?
//!
//! The queries are made from the snapshot itself, deterministically, in
//! five kinds: an entry's last name segment (`xlsx`), one word of a
//! description, two words of one description, a name word with a typo
//! (two letters swapped, or one dropped), and a name word with a category.
//! Each is answered the way the command does ([`Searcher::search`], top 10,
//! the index built once); every query is timed alone. Printed: entries,
//! queries, p50, p99 and max per query, the index build time, how many
//! queries found nothing. Nothing is asserted about time.
//!
//! `cargo bench --bench catalog_search` (release, 1,250 queries x 5
//! rounds); without `--bench` (`cargo test --all-targets`) one small round.

use std::time::{Duration, Instant};

use skill_operator::catalog::model::Entry;
use skill_operator::catalog::query::Searcher;
use skill_operator::catalog::store;
use skill_operator::core::search::words;

/// The goal's catalog size: the snapshot must hold at least this many.
const MIN_ENTRIES: usize = 3_000;
/// Queries per kind in a full run (five kinds).
const PER_KIND: usize = 250;
const QUICK_PER_KIND: usize = 20;
const ROUNDS: usize = 5;
const LIMIT: usize = 10;
/// The goal: p99 per query.
const GOAL_P99: Duration = Duration::from_millis(1);

struct Query {
    text: String,
    category: Option<String>,
}

/// Words of an entry's description long enough to be telling.
fn telling(entry: &Entry) -> Vec<String> {
    words(&entry.description).into_iter().filter(|w| w.chars().count() >= 4).collect()
}

/// `word` with a typo: two inner letters swapped, or one dropped.
fn typo(word: &str, n: usize) -> String {
    let mut chars: Vec<char> = word.chars().collect();
    let at = 1 + n % (chars.len() - 2);
    if n.is_multiple_of(2) {
        chars.swap(at, at + 1);
    } else {
        chars.remove(at);
    }
    chars.into_iter().collect()
}

fn queries(entries: &[Entry], per_kind: usize) -> Vec<Query> {
    // A stride coprime with the entry count visits entries all over the catalog.
    let pick = |i: usize| &entries[(i * 7_919) % entries.len()];
    let leaf = |e: &Entry| e.name.rsplit('/').next().unwrap_or(&e.name).to_string();
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < per_kind * 5 {
        let e = pick(i);
        let desc = telling(e);
        let name_word = words(&leaf(e)).into_iter().find(|w| w.chars().count() >= 5);
        let q = match i % 5 {
            0 => Some(Query { text: leaf(e), category: None }),
            1 => desc.get(i % desc.len().max(1)).map(|w| Query { text: w.clone(), category: None }),
            2 => (desc.len() >= 2).then(|| Query { text: format!("{} {}", desc[0], desc[desc.len() / 2]), category: None }),
            3 => name_word.map(|w| Query { text: typo(&w, i), category: None }),
            _ => e.category.clone().map(|c| Query { text: leaf(e), category: Some(c) }),
        };
        out.extend(q);
        i += 1;
    }
    out
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let (per_kind, rounds) = if quick { (QUICK_PER_KIND, 1) } else { (PER_KIND, ROUNDS) };
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    let catalog = store::snapshot().expect("the embedded snapshot loads");
    let entries = catalog.entries.len();
    assert!(entries >= MIN_ENTRIES, "the snapshot has {entries} entries; the goal is measured over {MIN_ENTRIES}+");
    let queries = queries(&catalog.entries, per_kind);
    let started = Instant::now();
    let searcher = Searcher::new(catalog);
    let build = started.elapsed();

    // One untimed pass: the first touches of the index are page faults, not search.
    let mut empty = 0;
    for q in &queries {
        empty += usize::from(searcher.search(&q.text, q.category.as_deref(), LIMIT).0.is_empty());
    }
    let mut times = Vec::with_capacity(queries.len() * rounds);
    for _ in 0..rounds {
        for q in &queries {
            let t = Instant::now();
            let (found, total) = searcher.search(&q.text, q.category.as_deref(), LIMIT);
            times.push(t.elapsed());
            std::hint::black_box((found, total));
        }
    }
    times.sort();
    let (p50, p99, max) = (percentile(&times, 0.5), percentile(&times, 0.99), times[times.len() - 1]);
    println!("catalog_search ({profile}): {entries} entries (embedded snapshot, no padding), {} queries x {rounds} rounds", queries.len());
    println!("  index build {:.1} ms; queries that found nothing: {empty}", build.as_secs_f64() * 1e3);
    println!(
        "  per query: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; goal p99 <= {} ms: {}",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        GOAL_P99.as_millis(),
        if p99 <= GOAL_P99 { "met" } else { "NOT met" }
    );
}
