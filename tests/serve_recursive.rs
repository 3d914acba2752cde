//! `skill-operator serve --layout recursive` over stdio, end to end: the
//! real binary serves a nested tree, and every surface that names a skill
//! (tools, resources, the SEP-2640 extension) takes a name holding `/`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

struct Stdio2 {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Drop for Stdio2 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Stdio2 {
    fn start(root: &Path, layout: &str) -> Stdio2 {
        let mut child = Command::new(BIN)
            .args(["serve", "--read-only", "--layout", layout, "--skills"])
            .arg(root)
            .env_remove("MCP_SKILLS_PATH")
            .env_remove("SKILLS_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut s = Stdio2 { child, stdin, stdout, next_id: 1 };
        let init = s.call(
            "initialize",
            json!({"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"recursive-test","version":"1"}}),
        );
        assert!(init.get("result").is_some(), "{init}");
        s.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        s
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// One request; its response (notifications in between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the server closed stdout");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("id") == Some(&json!(id)) {
                return message;
            }
        }
    }

    /// A tool's structured result.
    fn tool(&mut self, name: &str, arguments: Value) -> Value {
        let response = self.call("tools/call", json!({"name": name, "arguments": arguments}));
        let result = &response["result"];
        assert_ne!(result["isError"], json!(true), "{name}: {response}");
        result["structuredContent"].clone()
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn skill(dir: &Path) {
    let leaf = dir.file_name().unwrap().to_str().unwrap();
    write(&dir.join("SKILL.md"), &format!("---\nname: {leaf}\ndescription: The {leaf} skill.\n---\n# {leaf} body\n"));
}

fn tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    skill(&root.join("plugins/document-skills/skills/xlsx"));
    write(&root.join("plugins/document-skills/skills/xlsx/reference/formulas.md"), "SUM and friends\n");
    skill(&root.join("skills/xlsx"));
    skill(&root.join("skills/.system/skill-creator"));
    skill(&root.join(".claude/skills/local"));
    t
}

#[test]
fn nested_names_work_on_every_surface() {
    let t = tree();
    let mut s = Stdio2::start(t.path(), "recursive");

    let list = s.tool("skill_list", json!({}));
    let mut names: Vec<&str> = list["skills"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["document-skills/xlsx", "local", "system/skill-creator", "xlsx"], "{list}");

    let loaded = s.tool("skill_load", json!({"name": "document-skills/xlsx"}));
    assert!(loaded.to_string().contains("xlsx body"), "{loaded}");
    assert!(loaded.to_string().contains("reference/formulas.md"), "{loaded}");

    let file = s.tool("skill_file", json!({"skill": "document-skills/xlsx", "paths": ["reference/formulas.md"]}));
    assert!(file.to_string().contains("SUM and friends"), "{file}");

    let uri = "skill://document-skills/xlsx/SKILL.md";
    let read = s.call("resources/read", json!({"uri": uri}));
    assert_eq!(read["result"]["contents"][0]["uri"], uri, "{read}");
    assert!(read["result"]["contents"][0]["text"].as_str().unwrap().contains("xlsx body"), "{read}");
    let nested = s.call("resources/read", json!({"uri": "skill://document-skills/xlsx/reference/formulas.md"}));
    assert!(nested["result"]["contents"][0]["text"].as_str().unwrap().contains("SUM"), "{nested}");
    // The plain `xlsx` is another skill, and a path cannot climb into it.
    let plain = s.call("resources/read", json!({"uri": "skill://xlsx/SKILL.md"}));
    assert!(plain["result"]["contents"][0]["text"].as_str().unwrap().contains("xlsx body"), "{plain}");
    let climb = s.call("resources/read", json!({"uri": "skill://document-skills/xlsx/../../xlsx/SKILL.md"}));
    assert!(climb.get("error").is_some(), "{climb}");

    let resources = s.call("resources/list", json!({}));
    assert!(resources.to_string().contains("skill://document-skills/xlsx/reference/formulas.md"), "{resources}");

    let got = s.call("skills/get", json!({"uri": uri}));
    assert_eq!(got["result"]["skill"]["uri"], uri, "{got}");
    assert_eq!(got["result"]["skill"]["frontmatter"]["name"], "xlsx", "{got}");

    let prompt = s.call("prompts/get", json!({"name": "document-skills/xlsx"}));
    assert!(prompt.to_string().contains("xlsx body"), "{prompt}");
}

#[test]
fn the_standard_layout_is_the_default() {
    let t = tree();
    let mut s = Stdio2::start(t.path(), "standard");
    let list = s.tool("skill_list", json!({}));
    let names: Vec<&str> = list["skills"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    // Today's rules: hidden groups flattened, plugin trees and agent homes not searched.
    assert_eq!(names, vec!["skill-creator", "xlsx"], "{list}");
}
