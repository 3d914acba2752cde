//! `skill://<skill>/<path>` URIs: every file of a skill is a resource.
//!
//! File paths are percent-encoded in URIs (a file name may hold a space);
//! parsing decodes them and then applies the same string check as every
//! other client path, so `%2e%2e` is refused as `..` would be.

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
pub fn parse(uri: &str) -> Result<(String, RelPath), UriError> {
    let rest = uri.strip_prefix(SCHEME).ok_or(UriError::Scheme)?;
    if rest.contains(['?', '#']) {
        return Err(UriError::QueryOrFragment);
    }
    let (skill, path) = rest.split_once('/').ok_or(UriError::NoPath)?;
    if skill.is_empty() || path.is_empty() {
        return Err(UriError::NoPath);
    }
    let decoded = percent_decode_str(path).decode_utf8().map_err(|_| UriError::Encoding)?;
    Ok((skill.to_string(), RelPath::parse(&decoded)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for path in ["SKILL.md", "scripts/run.py", "docs/with space.md", "a/ü.md"] {
            let uri = file_uri("pdf", path);
            assert_eq!(parse(&uri).unwrap(), ("pdf".to_string(), RelPath::parse(path).unwrap()), "{uri}");
        }
        assert_eq!(file_uri("pdf", "docs/with space.md"), "skill://pdf/docs/with%20space.md");
    }

    #[test]
    fn hostile_uris() {
        assert_eq!(parse("file:///etc/passwd"), Err(UriError::Scheme));
        assert_eq!(parse("skill://pdf"), Err(UriError::NoPath));
        assert_eq!(parse("skill://pdf/"), Err(UriError::NoPath));
        assert_eq!(parse("skill://pdf/a?x=1"), Err(UriError::QueryOrFragment));
        assert!(matches!(parse("skill://pdf/../other/SKILL.md"), Err(UriError::Path(PathError::DotSegment))));
        assert!(matches!(parse("skill://pdf/%2e%2e/other/SKILL.md"), Err(UriError::Path(PathError::DotSegment))));
        assert!(matches!(parse("skill://pdf/%252e%252e/x"), Err(UriError::Path(PathError::PercentEscape))));
        assert!(matches!(parse("skill://pdf/a%00b"), Err(UriError::Path(PathError::Nul))));
        assert!(matches!(parse("skill://pdf//etc/passwd"), Err(UriError::Path(PathError::Absolute))));
        assert!(matches!(parse("skill://pdf/a%5cb"), Err(UriError::Path(PathError::Backslash))));
        assert_eq!(parse("skill://pdf/%ff"), Err(UriError::Encoding));
    }
}
