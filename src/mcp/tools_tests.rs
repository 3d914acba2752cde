//! The read tools against real directories, each limit at its edge.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use super::*;
use crate::core::grants::Grants;

const MIB: usize = 1024 * 1024;

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn state_for(root: &Path, env: &[(&str, &str)], interpreters: &[Interpreter]) -> Snapshot {
    let map: std::collections::HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let grants = Grants::resolve(&move |k| map.get(k).cloned(), None);
    Snapshot::scan(&[root.to_path_buf()], grants, interpreters.iter().copied().collect::<BTreeSet<_>>())
}

/// `skill_list` on a read-only server holding `snap`.
fn list_of(snap: Snapshot, input: SkillListInput) -> Result<SkillListOutput, ToolError> {
    let state = ServerState::new(snap);
    let current = state.snapshot();
    skill_list(&state, &current, input)
}

fn fixture() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let s = t.path().join("docs");
    write(
        &s.join("SKILL.md"),
        b"---\nname: docs\ndescription: Docs skill.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/a.py\n      interpreter: python\n      env: [TOKEN]\n    - script: scripts/b.js\n      interpreter: node\n  env:\n    - name: TOKEN\n      secret: true\n---\n# Docs\r\n\r\nUse it.  \n",
    );
    write(&s.join("scripts/a.py"), b"print('a')\n");
    write(&s.join("scripts/b.js"), b"console.log('b')\n");
    write(&s.join("text.txt"), "héllo wörld".as_bytes());
    write(&s.join("image.png"), &[0x89, b'P', b'N', b'G', 0, 0, 0, 13]);
    write(&s.join("big/exact.txt"), &vec![b'a'; MIB]);
    write(&s.join("big/over.txt"), &vec![b'b'; MIB + 1]);
    for i in 0..4 {
        write(&s.join(format!("big/m{i}.txt")), &vec![b'c'; MIB]);
    }
    fs::create_dir_all(t.path().join("other")).unwrap();
    write(&t.path().join("other/SKILL.md"), b"---\nname: other\ndescription: Other.\n---\nother body\n");
    write(&t.path().join("outside.txt"), b"secret");
    t
}

fn paths(skill: &str, p: &[&str]) -> SkillFileInput {
    SkillFileInput { skill: skill.into(), paths: p.iter().map(|s| s.to_string()).collect() }
}

fn ok(r: &FileResult) -> &FileOk {
    match r {
        FileResult::Ok(ok) => ok,
        FileResult::Err(e) => panic!("{} failed: {} {}", e.path, e.error.code, e.error.message),
    }
}

fn err(r: &FileResult) -> &ErrorBody {
    match r {
        FileResult::Err(e) => &e.error,
        FileResult::Ok(o) => panic!("{} should have failed", o.path),
    }
}

#[test]
fn skill_file_batch_keeps_order_and_isolates_bad_slots() {
    let t = fixture();
    let state = state_for(t.path(), &[], &Interpreter::ALL);
    let out = skill_file(&state, paths("docs", &["text.txt", "../other/SKILL.md", "missing.txt", "image.png", "%2e%2e/x", "scripts/a.py"]))
        .unwrap();
    let got: Vec<&str> = out
        .results
        .iter()
        .map(|r| match r {
            FileResult::Ok(o) => o.path.as_str(),
            FileResult::Err(e) => e.path.as_str(),
        })
        .collect();
    assert_eq!(got, vec!["text.txt", "../other/SKILL.md", "missing.txt", "image.png", "%2e%2e/x", "scripts/a.py"]);
    let text = ok(&out.results[0]);
    assert_eq!((text.encoding.as_str(), text.content.as_str(), text.media_type.as_str()), ("utf-8", "héllo wörld", "text/plain"));
    assert_eq!(err(&out.results[1]).code, "bad-path");
    assert_eq!(err(&out.results[2]).code, "not-found");
    let png = ok(&out.results[3]);
    assert_eq!((png.encoding.as_str(), png.media_type.as_str(), png.size), ("base64", "image/png", 8));
    assert_eq!(err(&out.results[4]).code, "bad-path");
    assert_eq!(ok(&out.results[5]).content, "print('a')\n");
}

#[test]
fn skill_file_path_count_edges() {
    let t = fixture();
    let state = state_for(t.path(), &[], &Interpreter::ALL);
    assert_eq!(skill_file(&state, paths("docs", &[])).unwrap_err().code, "no-paths");
    let eight = vec!["text.txt"; FILE_PATHS_PER_CALL];
    assert_eq!(skill_file(&state, paths("docs", &eight)).unwrap().results.len(), 8);
    let nine = vec!["text.txt"; FILE_PATHS_PER_CALL + 1];
    let e = skill_file(&state, paths("docs", &nine)).unwrap_err();
    assert_eq!(e.code, "too-many-paths");
    assert!(e.message.contains("9 paths"));
}

#[test]
fn skill_file_entry_cap_edge() {
    let t = fixture();
    let state = state_for(t.path(), &[], &Interpreter::ALL);
    let out = skill_file(&state, paths("docs", &["big/exact.txt", "big/over.txt"])).unwrap();
    let exact = ok(&out.results[0]);
    assert_eq!((exact.size, exact.returned, exact.truncated), (MIB as u64, MIB as u64, false));
    let over = ok(&out.results[1]);
    assert_eq!((over.size, over.returned, over.truncated), (MIB as u64 + 1, MIB as u64, true));
}

#[test]
fn skill_file_call_cap_edge() {
    let t = fixture();
    let state = state_for(t.path(), &[], &Interpreter::ALL);
    // Four 1 MiB files plus small ones: exactly 4 MiB of large content fits.
    let four = skill_file(&state, paths("docs", &["big/m0.txt", "big/m1.txt", "big/m2.txt", "big/m3.txt"])).unwrap();
    assert_eq!(four.results.len(), 4);
    // One byte more (a small text file) tips the call over: refused whole.
    let e = skill_file(&state, paths("docs", &["big/m0.txt", "big/m1.txt", "big/m2.txt", "big/m3.txt", "text.txt"])).unwrap_err();
    assert_eq!(e.code, "call-too-large");
    // An over-size file counts only its 1 MiB entry cap.
    let e = skill_file(&state, paths("docs", &["big/over.txt", "big/m1.txt", "big/m2.txt", "big/m3.txt"]));
    assert!(e.is_ok());
}

#[test]
fn skill_file_resolved_check_catches_a_symlink_planted_after_the_scan() {
    let t = fixture();
    let state = state_for(t.path(), &[], &Interpreter::ALL);
    let target = t.path().join("docs/text.txt");
    fs::remove_file(&target).unwrap();
    std::os::unix::fs::symlink(t.path().join("outside.txt"), &target).unwrap();
    let out = skill_file(&state, paths("docs", &["text.txt"])).unwrap();
    let e = err(&out.results[0]);
    assert_eq!(e.code, "unreadable");
    assert!(e.message.contains("leaves the skill"), "{}", e.message);
}

#[test]
fn unknown_skill_lists_served_names() {
    let t = fixture();
    let state = state_for(t.path(), &[], &Interpreter::ALL);
    let e = skill_load(&state, SkillLoadInput { name: "nope".into() }).unwrap_err();
    assert_eq!(e.code, "unknown-skill");
    assert!(e.message.contains("docs, other"), "{}", e.message);
    assert_eq!(skill_file(&state, paths("nope", &["x"])).unwrap_err().code, "unknown-skill");
}

#[test]
fn skill_load_returns_body_verbatim_and_script_status() {
    let t = fixture();
    let state = state_for(t.path(), &[], &[Interpreter::Python]);
    let out = skill_load(&state, SkillLoadInput { name: "docs".into() }).unwrap();
    assert_eq!(out.body, "# Docs\r\n\r\nUse it.  \n");
    assert!(!out.body_truncated);
    assert!(out.files.iter().any(|f| f.path == "big/over.txt" && f.size == MIB as u64 + 1));
    let statuses: Vec<(&str, &str)> = out.scripts.iter().map(|s| (s.script.as_str(), s.status.as_str())).collect();
    assert_eq!(statuses, vec![("scripts/a.py", "runnable"), ("scripts/b.js", "unavailable")]);
    assert!(out.scripts[1].reason.as_deref().unwrap().contains("not available in this deployment (it runs: python)"));
    assert_eq!(out.scripts[0].env, vec!["TOKEN"]);
}

#[test]
fn skill_list_reports_grant_source_and_ungranted_scripts() {
    let t = fixture();
    let standalone = list_of(state_for(t.path(), &[], &Interpreter::ALL), SkillListInput::default()).unwrap();
    assert_eq!(standalone.grant_from, "declaration");
    let docs = standalone.skills.iter().find(|s| s.name == "docs").unwrap();
    assert_eq!(docs.scripts.runnable, vec!["scripts/a.py", "scripts/b.js"]);

    let hosted = list_of(state_for(t.path(), &[("MCP_DATA_DIR", "/data")], &Interpreter::ALL), SkillListInput::default()).unwrap();
    assert_eq!(hosted.grant_from, "hosted-default");
    assert!(hosted.grant_note.as_deref().unwrap().contains("nothing runs"));
    let docs = hosted.skills.iter().find(|s| s.name == "docs").unwrap();
    assert!(docs.scripts.runnable.is_empty());
    assert_eq!(docs.scripts.declared.len(), 2, "declared is still shown");
    assert_eq!(docs.scripts.ungranted.len(), 2);

    let granted = state_for(
        t.path(),
        &[(
            "MCP_SKILL_RUN",
            r#"[{"skill":"docs","script":"scripts/a.py","env":["TOKEN","NOPE"]},{"skill":"docs","script":"scripts/zzz.py"}]"#,
        )],
        &Interpreter::ALL,
    );
    let out = list_of(granted, SkillListInput::default()).unwrap();
    let docs = out.skills.iter().find(|s| s.name == "docs").unwrap();
    assert_eq!(docs.scripts.runnable, vec!["scripts/a.py"]);
    assert_eq!(docs.scripts.ungranted[0].script, "scripts/b.js");
    let grant_problems: Vec<&Problem> = out.problems.iter().filter(|p| p.reason == crate::core::problems::Reason::Grant).collect();
    assert_eq!(grant_problems.len(), 2, "{grant_problems:?}");
    assert!(grant_problems.iter().any(|p| p.detail.contains("NOPE")));
    assert!(grant_problems.iter().any(|p| p.detail.contains("zzz.py")));
}

#[test]
fn skill_list_query_filters() {
    let t = fixture();
    let state = state_for(t.path(), &[], &Interpreter::ALL);
    let out = list_of(state, SkillListInput { query: Some("OTHER".into()) }).unwrap();
    assert_eq!(out.skills.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["other"]);
}

#[test]
fn tool_schemas_are_objects_and_annotations_are_honest() {
    for tool in definitions() {
        assert_eq!(tool.input_schema.get("type").and_then(|v| v.as_str()), Some("object"), "{}", tool.name);
        assert!(tool.output_schema.is_some());
        let a = tool.annotations.as_ref().unwrap();
        assert_eq!((a.read_only_hint, a.destructive_hint, a.open_world_hint), (Some(true), Some(false), Some(false)));
    }
}

#[test]
fn skill_list_of_serve_shows_its_directories() {
    let t = fixture();
    let out = list_of(state_for(t.path(), &[], &Interpreter::ALL), SkillListInput::default()).unwrap();
    assert_eq!(out.roots.iter().map(|r| (r.path.clone(), r.skills)).collect::<Vec<_>>(), vec![(t.path().display().to_string(), 2)]);
    let docs = out.skills.iter().find(|s| s.name == "docs").unwrap();
    assert_eq!(docs.root, t.path().display().to_string());
    assert_eq!(docs.path, t.path().canonicalize().unwrap().join("docs").display().to_string());
}
