//! `skill://<skill>/<path>` URIs: every file of a skill is a resource.
//!
//! File paths are percent-encoded in URIs (a file name may hold a space);
//! parsing decodes them and then applies the same string check as every
//! other client path, so `%2e%2e` is refused as `..` would be.
//!
//! A skill name may hold `/` (`serve --layout recursive` serves
//! `document-skills/xlsx`), written as-is, so `skill://a/b/c.md` is split
//! against the served names: the one served name that is a whole-segment
//! prefix is the skill. Discovery never serves both `a` and `a/b` (they
//! are refused as a clash), so at most one prefix matches.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

use crate::core::paths::{PathError, RelPath};

pub const SCHEME: &str = "skill://";

/// Characters escaped in a path segment.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\')
    .add(b'^')
    .add(b'|');

/// The URI of a skill file.
pub fn file_uri(skill: &str, path: &str) -> String {
    let encoded: Vec<String> = path.split('/').map(|seg| utf8_percent_encode(seg, SEGMENT).to_string()).collect();
    format!("{SCHEME}{skill}/{}", encoded.join("/"))
}

/// Why a URI does not name a skill file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UriError {
    #[error("not a skill:// URI")]
    Scheme,
    #[error("the URI names no file (expected skill://<skill>/<path>)")]
    NoPath,
    #[error("the URI has a query or fragment")]
    QueryOrFragment,
    #[error("the path is not valid UTF-8 once decoded")]
    Encoding,
    #[error("bad path: {0}")]
    Path(#[from] PathError),
}

/// Split a `skill://` URI into a skill name and a checked relative path.
/// `is_skill` says whether a name is served; when no prefix is, the first
/// segment is returned as the name (and the caller reports it unknown).
pub fn parse(uri: &str, is_skill: &dyn Fn(&str) -> bool) -> Result<(String, RelPath), UriError> {
    let rest = uri.strip_prefix(SCHEME).ok_or(UriError::Scheme)?;
    if rest.contains(['?', '#']) {
        return Err(UriError::QueryOrFragment);
    }
    let cut = rest.match_indices('/').map(|(i, _)| i).find(|&i| is_skill(&rest[..i]));
    let (skill, path) = match cut {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => rest.split_once('/').ok_or(UriError::NoPath)?,
    };
    if skill.is_empty() || path.is_empty() {
        return Err(UriError::NoPath);
    }
    let decoded = percent_decode_str(path).decode_utf8().map_err(|_| UriError::Encoding)?;
    Ok((skill.to_string(), RelPath::parse(&decoded)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(_: &str) -> bool {
        false
    }

    #[test]
    fn round_trip() {
        for path in ["SKILL.md", "scripts/run.py", "docs/with space.md", "a/ü.md"] {
            let uri = file_uri("pdf", path);
            assert_eq!(parse(&uri, &any).unwrap(), ("pdf".to_string(), RelPath::parse(path).unwrap()), "{uri}");
        }
        assert_eq!(file_uri("pdf", "docs/with space.md"), "skill://pdf/docs/with%20space.md");
    }

    fn parse_any(uri: &str) -> Result<(String, RelPath), UriError> {
        parse(uri, &any)
    }

    #[test]
    fn nested_names_split_at_the_served_prefix() {
        let served = |n: &str| ["document-skills/xlsx", "pdf", "a/b/c"].contains(&n);
        assert_eq!(file_uri("document-skills/xlsx", "SKILL.md"), "skill://document-skills/xlsx/SKILL.md");
        let (skill, path) = parse("skill://document-skills/xlsx/SKILL.md", &served).unwrap();
        assert_eq!((skill.as_str(), path.as_str()), ("document-skills/xlsx", "SKILL.md"));
        let (skill, path) = parse("skill://document-skills/xlsx/scripts/run.py", &served).unwrap();
        assert_eq!((skill.as_str(), path.as_str()), ("document-skills/xlsx", "scripts/run.py"));
        let (skill, path) = parse("skill://pdf/document-skills/xlsx/SKILL.md", &served).unwrap();
        assert_eq!((skill.as_str(), path.as_str()), ("pdf", "document-skills/xlsx/SKILL.md"));
        let (skill, path) = parse("skill://a/b/c/d.md", &served).unwrap();
        assert_eq!((skill.as_str(), path.as_str()), ("a/b/c", "d.md"));
        // An unknown nested name comes back as its first segment (reported unknown).
        let (skill, path) = parse("skill://document-skills/docx/SKILL.md", &served).unwrap();
        assert_eq!((skill.as_str(), path.as_str()), ("document-skills", "docx/SKILL.md"));
        // The path after a nested name gets the same checks.
        assert!(matches!(parse("skill://document-skills/xlsx/../../pdf/SKILL.md", &served), Err(UriError::Path(PathError::DotSegment))));
        assert!(matches!(parse("skill://document-skills/xlsx/%2e%2e/x", &served), Err(UriError::Path(PathError::DotSegment))));
        assert_eq!(parse("skill://document-skills/xlsx/", &served), Err(UriError::NoPath));
    }

    #[test]
    fn hostile_uris() {
        assert_eq!(parse_any("file:///etc/passwd"), Err(UriError::Scheme));
        assert_eq!(parse_any("skill://pdf"), Err(UriError::NoPath));
        assert_eq!(parse_any("skill://pdf/"), Err(UriError::NoPath));
        assert_eq!(parse_any("skill://pdf/a?x=1"), Err(UriError::QueryOrFragment));
        assert!(matches!(parse_any("skill://pdf/../other/SKILL.md"), Err(UriError::Path(PathError::DotSegment))));
        assert!(matches!(parse_any("skill://pdf/%2e%2e/other/SKILL.md"), Err(UriError::Path(PathError::DotSegment))));
        assert!(matches!(parse_any("skill://pdf/%252e%252e/x"), Err(UriError::Path(PathError::PercentEscape))));
        assert!(matches!(parse_any("skill://pdf/a%00b"), Err(UriError::Path(PathError::Nul))));
        assert!(matches!(parse_any("skill://pdf//etc/passwd"), Err(UriError::Path(PathError::Absolute))));
        assert!(matches!(parse_any("skill://pdf/a%5cb"), Err(UriError::Path(PathError::Backslash))));
        assert_eq!(parse_any("skill://pdf/%ff"), Err(UriError::Encoding));
    }
}
