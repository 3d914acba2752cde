//! Strict YAML for frontmatter: YAML 1.2 core schema into `serde_json::Value`.
//!
//! `saphyr-parser` does the parsing; this module only turns its event stream
//! into JSON and refuses what a frontmatter block never needs and an attacker
//! would love: anchors and aliases (so a billion-laughs expansion cannot
//! exist), custom tags, complex or duplicate keys, several documents and
//! runaway nesting. Every error carries the parser's line and column.

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};
use serde_json::{Map, Number, Value};
use thiserror::Error;

/// Deepest nesting of sequences and mappings accepted.
pub const MAX_NESTING: usize = 64;

/// A YAML error with its position (1-based line and column in the parsed text).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message} (line {line}, column {column})")]
pub struct YamlError {
    pub message: String,
    pub line: usize,
    pub column: usize,
}

impl YamlError {
    fn at(span: &Span, message: impl Into<String>) -> Self {
        YamlError { message: message.into(), line: span.start.line(), column: span.start.col() + 1 }
    }
}

enum Frame {
    Seq(Vec<Value>),
    Map { map: Map<String, Value>, key: Option<String> },
}

/// Parse one YAML document into JSON under the rules above. An empty input is `null`.
pub fn parse(text: &str) -> Result<Value, YamlError> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Value> = None;
    let mut documents = 0usize;
    for item in Parser::new_from_str(text) {
        let (event, span) =
            item.map_err(|err| YamlError { message: err.info().to_string(), line: err.marker().line(), column: err.marker().col() + 1 })?;
        match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(YamlError::at(&span, "more than one YAML document"));
                }
            }
            Event::Alias(_) => return Err(YamlError::at(&span, "aliases (*name) are not allowed")),
            Event::Scalar(text, style, anchor, tag) => {
                refuse_anchor(anchor, &span)?;
                // A mapping key is kept as written, whatever it would resolve to.
                if let Some(Frame::Map { key: key @ None, map }) = stack.last_mut() {
                    if tag.is_some() {
                        return Err(YamlError::at(&span, "tags on mapping keys are not allowed"));
                    }
                    if map.contains_key(text.as_ref()) {
                        return Err(YamlError::at(&span, format!("duplicate key `{text}`")));
                    }
                    *key = Some(text.into_owned());
                    continue;
                }
                let value = resolve_scalar(&text, style, tag.as_deref(), &span)?;
                attach(&mut stack, &mut root, value, &span)?;
            }
            Event::SequenceStart(anchor, tag) => {
                refuse_anchor(anchor, &span)?;
                refuse_collection_tag(tag.as_deref(), "seq", &span)?;
                refuse_complex_key(&stack, &span)?;
                if stack.len() >= MAX_NESTING {
                    return Err(YamlError::at(&span, format!("nesting deeper than {MAX_NESTING} levels")));
                }
                stack.push(Frame::Seq(Vec::new()));
            }
            Event::MappingStart(anchor, tag) => {
                refuse_anchor(anchor, &span)?;
                refuse_collection_tag(tag.as_deref(), "map", &span)?;
                refuse_complex_key(&stack, &span)?;
                if stack.len() >= MAX_NESTING {
                    return Err(YamlError::at(&span, format!("nesting deeper than {MAX_NESTING} levels")));
                }
                stack.push(Frame::Map { map: Map::new(), key: None });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let value = match stack.pop() {
                    Some(Frame::Seq(items)) => Value::Array(items),
                    Some(Frame::Map { map, .. }) => Value::Object(map),
                    None => return Err(YamlError::at(&span, "unbalanced collection end")),
                };
                attach(&mut stack, &mut root, value, &span)?;
            }
        }
    }
    Ok(root.unwrap_or(Value::Null))
}

fn refuse_anchor(anchor: usize, span: &Span) -> Result<(), YamlError> {
    if anchor != 0 {
        return Err(YamlError::at(span, "anchors (&name) are not allowed"));
    }
    Ok(())
}

fn refuse_complex_key(stack: &[Frame], span: &Span) -> Result<(), YamlError> {
    if let Some(Frame::Map { key: None, .. }) = stack.last() {
        return Err(YamlError::at(span, "mapping keys must be plain scalars"));
    }
    Ok(())
}

fn is_core(tag: &Tag) -> bool {
    tag.handle == "tag:yaml.org,2002:" || tag.handle == "!!"
}

fn refuse_collection_tag(tag: Option<&Tag>, expected: &str, span: &Span) -> Result<(), YamlError> {
    match tag {
        None => Ok(()),
        Some(tag) if is_core(tag) && tag.suffix == expected => Ok(()),
        Some(tag) => Err(YamlError::at(span, format!("tag `{}{}` is not allowed", tag.handle, tag.suffix))),
    }
}

fn attach(stack: &mut [Frame], root: &mut Option<Value>, value: Value, span: &Span) -> Result<(), YamlError> {
    match stack.last_mut() {
        None => {
            *root = Some(value);
            Ok(())
        }
        Some(Frame::Seq(items)) => {
            items.push(value);
            Ok(())
        }
        Some(Frame::Map { map, key }) => match key.take() {
            Some(k) => {
                map.insert(k, value);
                Ok(())
            }
            None => Err(YamlError::at(span, "mapping keys must be plain scalars")),
        },
    }
}

/// YAML 1.2 core schema resolution of one scalar.
fn resolve_scalar(text: &str, style: ScalarStyle, tag: Option<&Tag>, span: &Span) -> Result<Value, YamlError> {
    if let Some(tag) = tag {
        if !is_core(tag) {
            return Err(YamlError::at(span, format!("tag `{}{}` is not allowed", tag.handle, tag.suffix)));
        }
        return match tag.suffix.as_str() {
            "str" => Ok(Value::String(text.to_string())),
            "null" | "bool" | "int" | "float" => {
                let value = resolve_plain(text);
                let matches = matches!(
                    (tag.suffix.as_str(), &value),
                    ("null", Value::Null) | ("bool", Value::Bool(_)) | ("int", Value::Number(_)) | ("float", Value::Number(_))
                );
                if matches {
                    Ok(value)
                } else {
                    Err(YamlError::at(span, format!("`{text}` is not a valid !!{}", tag.suffix)))
                }
            }
            other => Err(YamlError::at(span, format!("tag `!!{other}` is not allowed"))),
        };
    }
    if style != ScalarStyle::Plain {
        return Ok(Value::String(text.to_string()));
    }
    Ok(resolve_plain(text))
}

fn resolve_plain(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if let Some(n) = parse_int(text) {
        return Value::Number(n);
    }
    if is_float(text) {
        if let Some(n) = text.parse::<f64>().ok().and_then(Number::from_f64) {
            return Value::Number(n);
        }
    }
    // `.inf` and `.nan` have no JSON form: kept as the author's text.
    Value::String(text.to_string())
}

fn parse_int(text: &str) -> Option<Number> {
    if let Some(oct) = text.strip_prefix("0o") {
        return i64::from_str_radix(oct, 8).ok().map(Number::from);
    }
    if let Some(hex) = text.strip_prefix("0x") {
        return i64::from_str_radix(hex, 16).ok().map(Number::from);
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let text = text.strip_prefix('+').unwrap_or(text);
    text.parse::<i64>().ok().map(Number::from).or_else(|| text.parse::<u64>().ok().map(Number::from))
}

fn is_float(text: &str) -> bool {
    // [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
    let s = text.strip_prefix(['-', '+']).unwrap_or(text).as_bytes();
    let mut i = 0;
    let int_digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    i += int_digits;
    let mut frac_digits = 0;
    if i < s.len() && s[i] == b'.' {
        i += 1;
        frac_digits = s[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        i += frac_digits;
    }
    if int_digits == 0 && frac_digits == 0 {
        return false;
    }
    if i < s.len() && (s[i] == b'e' || s[i] == b'E') {
        i += 1;
        if i < s.len() && (s[i] == b'-' || s[i] == b'+') {
            i += 1;
        }
        let exp = s[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if exp == 0 {
            return false;
        }
        i += exp;
    }
    i == s.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn core_schema_scalars() {
        let v = parse("a: yes\nb: no\nc: on\nd: true\ne: ~\nf: 012\ng: 0x1F\nh: 0o17\ni: 1.5e3\nj: '1'\nk: .inf\nl: -7\nm: 1_000").unwrap();
        assert_eq!(
            v,
            json!({"a":"yes","b":"no","c":"on","d":true,"e":null,"f":12,"g":31,"h":15,"i":1500.0,"j":"1","k":".inf","l":-7,"m":"1_000"})
        );
    }

    #[test]
    fn anchors_and_aliases_are_refused() {
        let err = parse("a: &x [1]\nb: *x\n").unwrap_err();
        assert!(err.message.contains("anchors"), "{err}");
        assert_eq!(err.line, 1);
        let laughs = "a: &a [\"lol\",\"lol\"]\nb: &b [*a,*a]\nc: [*b,*b]\n";
        assert!(parse(laughs).is_err());
    }

    #[test]
    fn errors_carry_line_and_column() {
        let err = parse("name: ok\ndescription: [unclosed\n").unwrap_err();
        assert!(err.line >= 2, "{err:?}");
        let err = parse("a: 1\na: 2\n").unwrap_err();
        assert_eq!((err.line, err.column), (2, 1), "{err:?}");
        assert!(err.message.contains("duplicate key"));
    }

    #[test]
    fn tags_and_complex_keys() {
        assert_eq!(parse("a: !!str 12").unwrap(), json!({"a":"12"}));
        assert!(parse("a: !custom x").is_err());
        assert!(parse("a: !!binary aGk=").is_err());
        assert!(parse("? [a]\n: b").is_err());
        assert!(parse("a: !!int nope").is_err());
    }

    #[test]
    fn several_documents_are_refused() {
        assert!(parse("a: 1\n---\nb: 2\n").is_err());
    }

    #[test]
    fn nesting_is_bounded() {
        let ok = format!("{}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        assert!(parse(&ok).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_NESTING + 1), "]".repeat(MAX_NESTING + 1));
        assert!(parse(&deep).unwrap_err().message.contains("nesting"));
        // Far past the cap must not overflow the stack either.
        assert!(parse(&"[".repeat(60_000)).is_err());
    }
}
