//! Names derived from a repository URL and a served name: the catalog id
//! and the Kubernetes object name an install gives it.
//!
//! An id is `<owner>/<repo>/<served name>`, the owner and repository being
//! the last two segments of the URL's path (`.git` dropped):
//! `https://github.com/anthropics/skills` + `pdf` is
//! `anthropics/skills/pdf`. It depends only on the public URL and the
//! path-derived name, so it stays the same across rebuilds and commits.

use sha2::{Digest, Sha256};

use crate::core::search::words;

/// Kubernetes object names are DNS-1123 labels: at most 63 characters.
pub const RESOURCE_NAME_MAX: usize = 63;
/// Hex digits of the id's SHA-256 that end every resource name: two ids
/// that read alike once folded (`a/b-c`, `a-b/c`) still get two names.
const RESOURCE_HASH_HEX: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot take an owner and a repository name from {url:?}; give a URL ending in /<owner>/<repo> (https://github.com/anthropics/skills)"
)]
pub struct NoOwner {
    pub url: String,
}

/// `<owner>/<repo>` of a repository URL (https, git, ssh, scp-like, file).
pub fn repository_slug(url: &str) -> Result<String, NoOwner> {
    let no_owner = || NoOwner { url: url.into() };
    let path = match url.split_once("://") {
        // Skip the host (and any user or port) after the scheme.
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, path)| path),
        // scp-like `git@host:owner/repo`, or a local path.
        None => url.split_once(':').filter(|(host, _)| !host.contains('/')).map_or(url, |(_, path)| path),
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    let (Some(repo), Some(owner)) = (segments.next_back(), segments.next_back()) else { return Err(no_owner()) };
    let repo = repo.strip_suffix(".git").unwrap_or(repo);
    if repo.is_empty() || [owner, repo].iter().any(|s| *s == "." || *s == "..") {
        return Err(no_owner());
    }
    Ok(format!("{owner}/{repo}"))
}

/// The catalog id of the skill served as `name` from `url`.
pub fn entry_id(url: &str, name: &str) -> Result<String, NoOwner> {
    Ok(format!("{}/{name}", repository_slug(url)?))
}

/// 40 hex digits, lowercase: what a resolved commit is written as.
pub fn is_commit_id(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A DNS-1123 label for `id`: its folded words joined by `-` (ASCII
/// letters and digits only), cut so that `-` and [`RESOURCE_HASH_HEX`]
/// digits of the id's SHA-256 fit in [`RESOURCE_NAME_MAX`]. The same id
/// always gives the same name.
pub fn resource_name(id: &str) -> String {
    let hash = hex::encode(Sha256::digest(id.as_bytes()));
    let hash = &hash[..RESOURCE_HASH_HEX];
    let mut slug = String::new();
    for word in words(id) {
        let ascii: String = word.chars().filter(char::is_ascii_alphanumeric).collect();
        if ascii.is_empty() {
            continue;
        }
        if !slug.is_empty() {
            slug.push('-');
        }
        slug.push_str(&ascii);
    }
    slug.truncate(RESOURCE_NAME_MAX - 1 - RESOURCE_HASH_HEX);
    let slug = slug.trim_end_matches('-');
    if slug.is_empty() {
        // Still a label: hex digits start with a letter or a digit.
        return hash.to_string();
    }
    format!("{slug}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= RESOURCE_NAME_MAX
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-')
    }

    #[test]
    fn the_owner_and_repository_come_from_the_url_path() {
        for url in [
            "https://github.com/anthropics/skills",
            "https://github.com/anthropics/skills.git",
            "https://github.com/anthropics/skills/",
            "git://example.org:9418/anthropics/skills",
            "ssh://git@github.com/anthropics/skills.git",
            "git@github.com:anthropics/skills.git",
            "file:///srv/mirrors/anthropics/skills",
            "/srv/mirrors/anthropics/skills",
        ] {
            assert_eq!(repository_slug(url).as_deref(), Ok("anthropics/skills"), "{url}");
        }
        for url in ["https://github.com/skills", "https://github.com", "skills", "https://x/a/.git", "file:///a/.."] {
            assert!(repository_slug(url).is_err(), "{url}");
        }
        assert_eq!(entry_id("https://github.com/o/r", "document-skills/xlsx").as_deref(), Ok("o/r/document-skills/xlsx"));
    }

    #[test]
    fn commit_ids_are_forty_lowercase_hex_digits() {
        assert!(is_commit_id(&"a1".repeat(20)));
        assert!(!is_commit_id(&"a1".repeat(19)), "39..40");
        assert!(!is_commit_id(&format!("{}0", "a1".repeat(20))), "41");
        assert!(!is_commit_id(&"A1".repeat(20)), "uppercase");
        assert!(!is_commit_id(&"g1".repeat(20)));
    }

    #[test]
    fn resource_names_are_stable_dns_labels_that_keep_alike_ids_apart() {
        let name = resource_name("anthropics/skills/document-skills/xlsx");
        assert!(name.starts_with("anthropics-skills-document-skills-xlsx-"), "{name}");
        assert_eq!(name, resource_name("anthropics/skills/document-skills/xlsx"), "stable");
        assert_ne!(resource_name("a/b-c/d"), resource_name("a-b/c/d"));
        assert!(resource_name("Ünïcode/Crème/Brûlée").starts_with("unicode-creme-brulee-"));
        let long = format!("o/r/{}", "x".repeat(200));
        for id in [long.as_str(), "o/r/____", "K-Dense-AI/claude-scientific-skills/scientific-skills/rdkit", "日本/語/名"] {
            let name = resource_name(id);
            assert!(is_dns_label(&name), "{id} -> {name}");
        }
        assert_eq!(resource_name(&long).len(), RESOURCE_NAME_MAX, "cut at the edge");
        assert_eq!(resource_name(&"y".repeat(54)).len(), RESOURCE_NAME_MAX, "54 + 1 + 8 fits exactly");
        assert!(resource_name(&format!("{}-", "y".repeat(53))).len() <= RESOURCE_NAME_MAX);
    }
}
