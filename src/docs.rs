//! Reference tables generated from the real types, so the documentation
//! cannot drift: a test checks that docs/reference.md holds exactly these
//! blocks, and `skill-operator docs` prints them for pasting there.

use serde_json::Value;

use crate::core::problems::Reason;

/// The problem-reason table, from the `Reason` schema (codes and doc comments).
pub fn reasons_table() -> String {
    let schema = serde_json::to_value(schemars::schema_for!(Reason)).unwrap_or_default();
    let mut out = String::from("| reason | refuses the skill | meaning |\n|---|---|---|\n");
    let items = schema.get("oneOf").and_then(Value::as_array).cloned().unwrap_or_default();
    for reason in Reason::ALL {
        let description = items
            .iter()
            .find(|i| i.get("const").and_then(Value::as_str) == Some(reason.code()))
            .and_then(|i| i.get("description"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let refuses = if reason.refuses_skill() { "yes" } else { "no" };
        out.push_str(&format!("| `{}` | {refuses} | {} |\n", reason.code(), description.replace('\n', " ").replace('|', "\\|")));
    }
    out
}

/// The tool reference, from the real tool definitions and input schemas.
pub fn tools_reference() -> String {
    let mut out = String::from("| tool | arguments | annotations | what it does |\n|---|---|---|---|\n");
    for tool in crate::mcp::tool_definitions() {
        let schema = Value::Object((*tool.input_schema).clone());
        let required: Vec<&str> =
            schema.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let mut args = Vec::new();
        if let Some(Value::Object(props)) = schema.get("properties") {
            for (name, prop) in props {
                let ty = prop.get("type").map(|t| t.to_string().replace('"', "")).unwrap_or_else(|| "any".into());
                let req = if required.contains(&name.as_str()) { ", required" } else { "" };
                args.push(format!("`{name}` ({ty}{req})"));
            }
        }
        let args = if args.is_empty() { "none".to_string() } else { args.join(", ") };
        let a = tool.annotations.clone().unwrap_or_default();
        let flag = |name: &str, v: Option<bool>| v.map(|v| format!("{name}={v}"));
        let annotations: Vec<String> = [
            flag("readOnly", a.read_only_hint),
            flag("destructive", a.destructive_hint),
            flag("idempotent", a.idempotent_hint),
            flag("openWorld", a.open_world_hint),
        ]
        .into_iter()
        .flatten()
        .collect();
        out.push_str(&format!(
            "| `{}` | {args} | {} | {} |\n",
            tool.name,
            annotations.join(" "),
            tool.description.as_deref().unwrap_or("").replace('|', "\\|")
        ));
    }
    out
}

/// The file the generated blocks live in, relative to the repository root.
pub const REFERENCE_FILE: &str = "docs/reference.md";

/// `skill-operator docs`: the generated blocks, ready to paste into docs/reference.md.
pub fn print() {
    println!("<!-- BEGIN tools (generated: skill-operator docs) -->\n{}<!-- END tools -->\n", tools_reference());
    println!("<!-- BEGIN reasons (generated: skill-operator docs) -->\n{}<!-- END reasons -->", reasons_table());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block<'a>(doc: &'a str, name: &str) -> &'a str {
        let begin = format!("<!-- BEGIN {name} (generated: skill-operator docs) -->\n");
        let end = format!("<!-- END {name} -->");
        let start = doc.find(&begin).unwrap_or_else(|| panic!("{REFERENCE_FILE} has no {name} block")) + begin.len();
        let stop = doc[start..].find(&end).unwrap_or_else(|| panic!("{REFERENCE_FILE} {name} block is not closed")) + start;
        &doc[start..stop]
    }

    fn reference() -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE_FILE);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn reference_tables_match_the_code() {
        let doc = reference();
        let hint = format!("run `skill-operator docs` and paste its output into {REFERENCE_FILE}");
        assert_eq!(block(&doc, "reasons"), reasons_table(), "the reason table drifted: {hint}");
        assert_eq!(block(&doc, "tools"), tools_reference(), "the tool table drifted: {hint}");
    }

    #[test]
    fn the_readme_holds_no_generated_block() {
        // One copy of each table: a second one in the README would drift unchecked.
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        assert!(!readme.contains("(generated: skill-operator docs)"), "README.md holds a generated block: it belongs in {REFERENCE_FILE}");
    }

    #[test]
    fn every_reason_has_a_description() {
        for line in reasons_table().lines().skip(2) {
            assert!(!line.ends_with("|  |"), "undocumented reason: {line}");
        }
    }
}
