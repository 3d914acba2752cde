//! Splitting `SKILL.md` into its YAML frontmatter and its Markdown body.
//!
//! The block must open the file with a `---` line and close with another
//! `---` line; a UTF-8 BOM and CRLF line ends are accepted because real
//! repositories have both. The body is kept verbatim: `skill_load` and the
//! prompts hand the author's exact text to the agent.

use serde_json::{Map, Value};
use thiserror::Error;

use super::limits::FRONTMATTER_CAP;
use super::yaml::{self, YamlError};

/// A parsed `SKILL.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillMd {
    /// The frontmatter mapping, every key as written.
    pub frontmatter: Map<String, Value>,
    /// Everything after the closing `---` line, verbatim.
    pub body: String,
}

/// Why a `SKILL.md` has no usable frontmatter.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrontmatterError {
    #[error("SKILL.md is not UTF-8 text (invalid byte at offset {0})")]
    NotUtf8(usize),
    #[error("SKILL.md must start with a `---` line opening the YAML frontmatter")]
    NoOpening,
    #[error("the frontmatter is not closed by a `---` line")]
    Unterminated,
    #[error("the frontmatter is larger than {} KiB", FRONTMATTER_CAP / 1024)]
    TooLarge,
    #[error("the frontmatter is not valid YAML: {0} of SKILL.md")]
    Yaml(YamlError),
    #[error("the frontmatter must be a YAML mapping (key: value lines), found {0}")]
    NotMapping(&'static str),
}

/// Decode the (possibly truncated) bytes of a `SKILL.md`. When `truncated`,
/// a multi-byte character cut by the read cap is dropped rather than refused.
pub fn decode(bytes: &[u8], truncated: bool) -> Result<&str, FrontmatterError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(err) if truncated && err.error_len().is_none() => {
            // Only the last, incomplete character is missing.
            Ok(std::str::from_utf8(&bytes[..err.valid_up_to()]).unwrap_or_default())
        }
        Err(err) => Err(FrontmatterError::NotUtf8(err.valid_up_to())),
    }
}

/// Split and parse the frontmatter of a decoded `SKILL.md`.
pub fn parse(text: &str) -> Result<SkillMd, FrontmatterError> {
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().ok_or(FrontmatterError::NoOpening)?;
    if first.trim_end() != "---" {
        return Err(FrontmatterError::NoOpening);
    }
    let start = first.len();
    let mut offset = start;
    for line in lines {
        if line.trim_end() == "---" {
            let yaml_text = &text[start..offset];
            let body = &text[offset + line.len()..];
            return Ok(SkillMd { frontmatter: parse_mapping(yaml_text)?, body: body.to_string() });
        }
        offset += line.len();
        if offset - start > FRONTMATTER_CAP {
            return Err(FrontmatterError::TooLarge);
        }
    }
    Err(FrontmatterError::Unterminated)
}

fn parse_mapping(yaml_text: &str) -> Result<Map<String, Value>, FrontmatterError> {
    let value = yaml::parse(yaml_text).map_err(|mut err| {
        // The YAML starts on the file's second line.
        err.line += 1;
        FrontmatterError::Yaml(err)
    })?;
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Err(FrontmatterError::NotMapping("an empty block")),
        Value::Array(_) => Err(FrontmatterError::NotMapping("a list")),
        _ => Err(FrontmatterError::NotMapping("a single value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_frontmatter_and_keeps_body_verbatim() {
        let md = parse("---\nname: a\ndescription: b\n---\n# Title\n\nBody  \n").unwrap();
        assert_eq!(md.frontmatter["name"], "a");
        assert_eq!(md.body, "# Title\n\nBody  \n");
    }

    #[test]
    fn accepts_bom_and_crlf() {
        let text = decode(b"\xEF\xBB\xBF---\r\nname: a\r\ndescription: b\r\n---\r\nBody\r\n", false).unwrap();
        let md = parse(text).unwrap();
        assert_eq!(md.frontmatter["description"], "b");
        assert_eq!(md.body, "Body\r\n");
    }

    #[test]
    fn opening_and_closing_rules() {
        assert_eq!(parse("name: a\n"), Err(FrontmatterError::NoOpening));
        assert_eq!(parse("\n---\nname: a\n---\n"), Err(FrontmatterError::NoOpening));
        assert_eq!(parse("---\nname: a\n"), Err(FrontmatterError::Unterminated));
        assert_eq!(parse("---\nname: a\n----\n"), Err(FrontmatterError::Unterminated));
        assert!(parse("---\nname: a\n---").is_ok(), "closing line at EOF without newline");
    }

    #[test]
    fn must_be_a_mapping() {
        assert_eq!(parse("---\n---\n"), Err(FrontmatterError::NotMapping("an empty block")));
        assert_eq!(parse("---\n- a\n---\n"), Err(FrontmatterError::NotMapping("a list")));
        assert_eq!(parse("---\njust text\n---\n"), Err(FrontmatterError::NotMapping("a single value")));
    }

    #[test]
    fn yaml_errors_report_file_lines() {
        let err = parse("---\nname: a\ndescription: [x\n---\n").unwrap_err();
        let FrontmatterError::Yaml(yaml) = err else { panic!("{err:?}") };
        assert!(yaml.line >= 3, "{yaml:?}");
        let err = parse("---\nname: a\nname: b\n---\n").unwrap_err();
        let FrontmatterError::Yaml(yaml) = err else { panic!("{err:?}") };
        assert_eq!(yaml.line, 3);
    }

    #[test]
    fn frontmatter_cap_edge() {
        // A block of exactly the cap parses; one line more is refused.
        let filler_line = format!("# {}\n", "x".repeat(98)); // 101 bytes
        let head = "name: a\ndescription: b\n";
        let mut block = head.to_string();
        while block.len() + filler_line.len() <= FRONTMATTER_CAP {
            block.push_str(&filler_line);
        }
        let pad = FRONTMATTER_CAP - block.len();
        if pad > 0 {
            block.push_str(&format!("#{}\n", "y".repeat(pad.saturating_sub(2))));
        }
        assert_eq!(block.len(), FRONTMATTER_CAP);
        assert!(parse(&format!("---\n{block}---\n")).is_ok());
        let over = format!("---\n{block}#\n---\n");
        assert_eq!(parse(&over), Err(FrontmatterError::TooLarge));
    }

    #[test]
    fn truncated_multibyte_tail_is_dropped_only_when_truncated() {
        let bytes = "---\nname: é".as_bytes();
        let cut = &bytes[..bytes.len() - 1];
        assert!(decode(cut, true).is_ok());
        assert!(matches!(decode(cut, false), Err(FrontmatterError::NotUtf8(_))));
        assert!(matches!(decode(b"\xff\xfe", true), Err(FrontmatterError::NotUtf8(0))));
    }
}
