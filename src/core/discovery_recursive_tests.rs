//! The recursive layout, each rule on real directories.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::super::{discover, discover_with, Layout, Limits};
use super::*;
use crate::core::catalog::Catalog;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// A skill at `dir` whose frontmatter name is its folder name.
fn skill(dir: &Path) {
    let leaf = dir.file_name().unwrap().to_str().unwrap();
    write(&dir.join("SKILL.md"), &format!("---\nname: {leaf}\ndescription: The {leaf} skill.\n---\n# {leaf}\n"));
}

fn scan(root: &Path) -> Catalog {
    discover_with(&[root.to_path_buf()], Limits::default(), Layout::Recursive)
}

fn names(c: &Catalog) -> Vec<&str> {
    c.names()
}

fn reasons(c: &Catalog, needle: &str) -> Vec<Reason> {
    c.problems.iter().filter(|p| p.path.contains(needle) || p.skill.as_deref() == Some(needle)).map(|p| p.reason).collect()
}

fn details(c: &Catalog, reason: Reason) -> Vec<String> {
    c.problems.iter().filter(|p| p.reason == reason).map(|p| p.detail.clone()).collect()
}

#[test]
fn naming_rule_table() {
    let table: &[(&str, &str)] = &[
        ("skills/pdf", "pdf"),
        ("skills/.system/skill-creator", "system/skill-creator"),
        ("skills/.curated/gh-fix-ci", "curated/gh-fix-ci"),
        ("plugins/document-skills/skills/xlsx", "document-skills/xlsx"),
        ("engineering-skills/code-review", "engineering-skills/code-review"),
        (".claude/skills/foo", "foo"),
        (".agents/skills/bar", "bar"),
        (".codex/skills/baz", "baz"),
        ("skills/devops/terraform", "devops/terraform"),
        ("top", "top"),
    ];
    for (path, want) in table {
        let segments: Vec<&str> = path.split('/').collect();
        assert_eq!(served_name(&segments).as_deref(), Some(*want), "{path}");
    }
    assert_eq!(served_name(&["skills"]), None);
    assert_eq!(served_name(&["plugins", "skills"]), None);
}

#[test]
fn every_layout_is_found_and_named_by_its_path() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    for path in [
        "skills/pdf",
        "skills/devops/terraform",
        "skills/.curated/gh-fix-ci",
        "skills/.experimental/draft",
        "skills/.system/skill-creator",
        "engineering-skills/code-review",
        "plugins/document-skills/skills/xlsx",
        ".claude/skills/foo",
        ".agents/skills/bar",
        ".codex/skills/baz",
        ".cursor/skills/cur",
        ".gemini/skills/gem",
        ".opencode/skills/oc",
        "top",
    ] {
        skill(&root.join(path));
    }
    let c = scan(root);
    assert_eq!(
        names(&c),
        vec![
            "bar",
            "baz",
            "cur",
            "curated/gh-fix-ci",
            "devops/terraform",
            "document-skills/xlsx",
            "engineering-skills/code-review",
            "experimental/draft",
            "foo",
            "gem",
            "oc",
            "pdf",
            "system/skill-creator",
            "top",
        ]
    );
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    let xlsx = c.get("document-skills/xlsx").unwrap();
    assert_eq!(xlsx.dir, root.canonicalize().unwrap().join("plugins/document-skills/skills/xlsx"));
}

#[test]
fn standard_layout_is_unchanged_by_the_mode() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/devops/terraform"));
    skill(&t.path().join("skills/pdf"));
    let standard = discover(&[t.path().to_path_buf()], Limits::default());
    assert_eq!(names(&standard), vec!["pdf"]);
    assert_eq!(reasons(&standard, "skills/devops"), vec![Reason::NoSkillMd]);
    assert_eq!(names(&scan(t.path())), vec!["devops/terraform", "pdf"]);
}

#[test]
fn a_skill_folder_is_not_searched_further() {
    let t = tempfile::tempdir().unwrap();
    let outer = t.path().join("skills/outer");
    skill(&outer);
    skill(&outer.join("examples/inner"));
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["outer"]);
    assert!(c.get("outer").unwrap().file("examples/inner/SKILL.md").is_some());
}

#[test]
fn a_root_that_is_a_skill_is_named_by_the_root() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("my-skill");
    skill(&root);
    skill(&root.join("skills/nested"));
    assert_eq!(names(&scan(&root)), vec!["my-skill"]);
}

#[test]
fn equal_leaves_in_different_folders_are_distinct_skills() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/a/pdf"));
    skill(&t.path().join("skills/b/pdf"));
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["a/pdf", "b/pdf"]);
    assert!(c.problems.is_empty(), "{:?}", c.problems);
}

#[test]
fn one_full_name_from_two_folders_refuses_both() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/foo"));
    skill(&t.path().join(".claude/skills/foo"));
    skill(&t.path().join("skills/other"));
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["other"]);
    let dupes: Vec<_> = c.problems.iter().filter(|p| p.reason == Reason::DuplicateName).collect();
    assert_eq!(dupes.len(), 2, "{dupes:?}");
    assert!(dupes.iter().all(|p| p.skill.as_deref() == Some("foo")));
}

#[test]
fn a_name_that_is_a_folder_of_another_refuses_both() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/pdf"));
    skill(&t.path().join("plugins/pdf/skills/forms"));
    skill(&t.path().join("skills/pdf-tools"));
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["pdf-tools"]);
    assert_eq!(reasons(&c, "pdf/forms"), vec![Reason::DuplicateName]);
    assert!(details(&c, Reason::DuplicateName).iter().all(|d| d.contains("skill:// URIs")));
}

#[test]
fn the_frontmatter_name_is_compared_with_the_last_segment() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/devops/terraform"));
    let wrong = t.path().join("skills/devops/helm");
    write(&wrong.join("SKILL.md"), "---\nname: devops\ndescription: d\n---\n");
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["devops/helm", "devops/terraform"]);
    assert_eq!(reasons(&c, "devops/helm"), vec![Reason::NameMismatch]);
    assert!(reasons(&c, "devops/terraform").is_empty());
}

#[test]
fn folder_symlinks_are_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    skill(&root.join("skills/real"));
    symlink("real", root.join("skills/alias")).unwrap();
    let outside = t.path().join("outside");
    skill(&outside.join("evil"));
    symlink(&outside, root.join("linked")).unwrap();
    // The usual agent alias: hidden, so silent, and not served twice.
    fs::create_dir_all(root.join(".agents")).unwrap();
    symlink("../skills", root.join(".agents/skills")).unwrap();
    // A file symlink next to skills is not a folder: nothing to say.
    write(&root.join("README.md"), "r");
    symlink("README.md", root.join("README-link.md")).unwrap();
    let c = scan(&root);
    assert_eq!(names(&c), vec!["real"]);
    assert_eq!(reasons(&c, "skills/alias"), vec![Reason::SymlinkNotFollowed]);
    assert_eq!(reasons(&c, "root/linked"), vec![Reason::SymlinkNotFollowed]);
    assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
}

#[test]
fn depth_six_is_found_and_seven_is_reported() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("a/b/c/d/e/six"));
    skill(&t.path().join("a/b/c/d/e/f/seven"));
    skill(&t.path().join("a/b/c/d/e/f/g/eight"));
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["a/b/c/d/e/six"]);
    assert_eq!(reasons(&c, "f/seven"), vec![Reason::DirLimit]);
    // Nothing below the reported depth is looked at.
    assert!(reasons(&c, "eight").is_empty());
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    assert_eq!(RECURSIVE_DEPTH, 6);
}

#[test]
fn tooling_and_other_hidden_folders_are_skipped() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    for dir in TOOLING_DIRS {
        skill(&root.join(dir).join("vendored"));
    }
    skill(&root.join("node_modules/pkg/skills/x"));
    skill(&root.join(".hidden/skills/y"));
    skill(&root.join("docs/.curated/z"));
    // A hidden folder that is itself a skill is reported, as in the standard layout.
    skill(&root.join(".secret"));
    // A skill may be called like a tooling folder.
    skill(&root.join("skills/build"));
    let c = scan(root);
    assert_eq!(names(&c), vec!["build"]);
    assert_eq!(reasons(&c, ".secret"), vec![Reason::HiddenSkipped]);
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
}

fn marketplace(root: &Path, json: &str) {
    write(&root.join(".claude-plugin/marketplace.json"), json);
}

#[test]
fn marketplace_local_sources_are_named_by_plugin() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    skill(&root.join("skills/xlsx"));
    skill(&root.join("skills/docx"));
    skill(&root.join("skills/loose"));
    skill(&root.join("plugins/tools/skills/lint"));
    skill(&root.join("plugins/tools/skills/fmt"));
    skill(&root.join("plugins/tools/extra/hello"));
    write(&root.join("plugins/tools/.claude-plugin/plugin.json"), r#"{"name":"tools","skills":"./extra","version":"1"}"#);
    marketplace(
        root,
        r#"{"name":"m","owner":{"name":"o"},"plugins":[
            {"name":"document-skills","source":"./","strict":false,"skills":["./skills/xlsx","./skills/docx"]},
            {"name":"dev-tools","source":"./plugins/tools","description":"unknown fields are ignored"}
        ]}"#,
    );
    let c = scan(root);
    assert_eq!(
        names(&c),
        vec!["dev-tools/fmt", "dev-tools/hello", "dev-tools/lint", "document-skills/docx", "document-skills/xlsx", "loose"]
    );
    // Found by both the marketplace and the walk, served once and quietly.
    assert!(c.problems.is_empty(), "{:?}", c.problems);
}

#[test]
fn marketplace_remote_sources_are_reported() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/local"));
    marketplace(
        t.path(),
        r#"{"plugins":[
            {"name":"gh","source":{"source":"github","repo":"acme/skills"}},
            {"name":"web","source":{"source":"url","url":"https://example.com/p.git","ref":"main","sha":"abc"}},
            {"name":"sub","source":{"source":"git-subdir","url":"https://example.com/mono.git","path":"tools/p"}}
        ]}"#,
    );
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["local"]);
    let found = details(&c, Reason::Marketplace);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].contains("`gh`") && found[0].contains("acme/skills") && found[0].contains("is not fetched here"), "{}", found[0]);
    assert!(found[1].contains("https://example.com/p.git"), "{}", found[1]);
    assert!(found[2].contains("git-subdir") && found[2].contains("tools/p"), "{}", found[2]);
}

#[test]
fn marketplace_paths_escaping_the_root_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    skill(&t.path().join("outside/skills/evil"));
    skill(&root.join("skills/ok"));
    symlink(t.path().join("outside"), root.join("link-out")).unwrap();
    marketplace(
        &root,
        &format!(
            r#"{{"plugins":[
                {{"name":"up","source":"../outside"}},
                {{"name":"abs","source":"{}"}},
                {{"name":"via-link","source":"./link-out"}},
                {{"name":"listed","source":"./","skills":["../outside/skills/evil"]}},
                {{"name":"bad name","source":"./"}}
            ]}}"#,
            t.path().join("outside").display()
        ),
    );
    let c = scan(&root);
    assert_eq!(names(&c), vec!["ok"]);
    let found = details(&c, Reason::Marketplace);
    assert_eq!(found.len(), 5, "{found:?}");
    assert!(found[0].contains("`up`") && found[0].contains("refused"), "{}", found[0]);
    assert!(found[1].contains("`abs`"), "{}", found[1]);
    assert!(found[2].contains("`via-link`") && found[2].contains("outside the root"), "{}", found[2]);
    assert!(found[3].contains("`listed`"), "{}", found[3]);
    assert!(found[4].contains("\"bad name\""), "{}", found[4]);
    assert_eq!(reasons(&c, "link-out"), vec![Reason::SymlinkNotFollowed]);
}

#[test]
fn bad_marketplace_files_are_reported_never_fatal() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/still-served"));
    marketplace(t.path(), "{ not json");
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["still-served"]);
    assert_eq!(reasons(&c, "marketplace.json"), vec![Reason::Marketplace]);

    marketplace(t.path(), r#"{"plugins":[{"source":"./"},{"name":"ok","source":"./"},7]}"#);
    let c = scan(t.path());
    assert_eq!(names(&c), vec!["ok/still-served"]);
    let found = details(&c, Reason::Marketplace);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("plugins[0]") && found[1].starts_with("plugins[2]"), "{found:?}");

    write(&t.path().join(".claude-plugin/marketplace.json"), r#"{"plugins":{"not":"a list"}}"#);
    assert_eq!(reasons(&scan(t.path()), "marketplace.json"), vec![Reason::Marketplace]);
}

#[test]
fn hostile_folder_names_are_refused_and_harm_nothing_else() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    skill(&root.join("skills/good"));
    skill(&root.join("skills/has space/pdf"));
    skill(&root.join("skills/uni\u{e9}/pdf"));
    skill(&root.join("skills/pct%2e%2e/pdf"));
    skill(&root.join("skills/..dots/pdf"));
    skill(&root.join("skills/ok/..x"));
    let long = "x".repeat(60);
    skill(&root.join(format!("skills/{long}/{long}/{long}")));
    // A category folder named like a name elsewhere does not collide with it.
    skill(&root.join("skills/a/b"));
    skill(&root.join("skills/a-b"));
    skill(&root.join("skills/ab"));
    let c = scan(root);
    assert_eq!(names(&c), vec!["a-b", "a/b", "ab", "good"]);
    let refused: Vec<_> = c.problems.iter().filter(|p| p.reason == Reason::UnusableName).collect();
    assert_eq!(refused.len(), 4, "{:?}", c.problems);
    let text: Vec<&str> = refused.iter().map(|p| p.detail.as_str()).collect();
    assert!(text.iter().any(|d| d.contains("\"has space\"")), "{text:?}");
    assert!(text.iter().any(|d| d.contains("\"uni\u{e9}\"")), "{text:?}");
    assert!(text.iter().any(|d| d.contains("\"pct%2e%2e\"")), "{text:?}");
    assert!(text.iter().any(|d| d.contains("128")), "{text:?}");
    // Hidden segments (`..dots`, `..x`) are never searched, so never served.
    assert!(c.problems.iter().any(|p| p.path.ends_with("..x") && p.reason == Reason::HiddenSkipped));
    for skill in &c.skills {
        assert!(skill.dir.starts_with(root.canonicalize().unwrap()), "{}", skill.dir.display());
    }
}

/// Repository shapes as they are published: anthropics/skills (a
/// marketplace over `skills/`), openai/skills (hidden groups), and a
/// plugin marketplace (`plugins/<p>/skills/<n>`).
#[test]
fn published_repository_shapes() {
    let t = tempfile::tempdir().unwrap();
    let anthropic = t.path().join("anthropics-skills");
    for n in ["xlsx", "docx", "pptx", "pdf", "skill-creator", "mcp-builder", "brand-guidelines"] {
        skill(&anthropic.join("skills").join(n));
    }
    write(&anthropic.join("README.md"), "# Skills");
    write(&anthropic.join("spec/agent-skills-spec.md"), "spec");
    skill(&anthropic.join("template"));
    marketplace(
        &anthropic,
        r#"{"name":"anthropic-agent-skills","owner":{"name":"Anthropic"},"metadata":{"version":"1.0.0"},"plugins":[
            {"name":"document-skills","description":"d","source":"./","strict":false,"skills":["./skills/xlsx","./skills/docx","./skills/pptx","./skills/pdf"]},
            {"name":"example-skills","description":"e","source":"./","strict":false,"skills":["./skills/skill-creator","./skills/mcp-builder","./skills/brand-guidelines"]}
        ]}"#,
    );
    let openai = t.path().join("openai-skills");
    for n in ["gh-fix-ci", "notion-knowledge-capture"] {
        skill(&openai.join("skills/.curated").join(n));
    }
    skill(&openai.join("skills/.system/skill-creator"));
    skill(&openai.join("skills/.system/skill-installer"));
    skill(&openai.join("skills/.experimental/create-plan"));
    fs::create_dir_all(openai.join(".github/workflows")).unwrap();
    let plugins = t.path().join("plugin-market");
    skill(&plugins.join("plugins/devops/skills/terraform"));
    skill(&plugins.join("plugins/devops/skills/helm"));
    skill(&plugins.join("plugins/writing/skills/editor"));
    write(&plugins.join("plugins/devops/.claude-plugin/plugin.json"), r#"{"name":"devops","version":"0.1.0"}"#);
    marketplace(&plugins, r#"{"name":"m","plugins":[{"name":"devops","source":"./plugins/devops"}]}"#);

    let c = discover_with(&[anthropic, openai, plugins], Limits::default(), Layout::Recursive);
    assert_eq!(
        names(&c),
        vec![
            "curated/gh-fix-ci",
            "curated/notion-knowledge-capture",
            "devops/helm",
            "devops/terraform",
            "document-skills/docx",
            "document-skills/pdf",
            "document-skills/pptx",
            "document-skills/xlsx",
            "example-skills/brand-guidelines",
            "example-skills/mcp-builder",
            "example-skills/skill-creator",
            "experimental/create-plan",
            "system/skill-creator",
            "system/skill-installer",
            "template",
            "writing/editor",
        ]
    );
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!(c.roots.iter().map(|r| r.skills).collect::<Vec<_>>(), vec![8, 5, 3]);
}

#[test]
fn seen_paths_are_under_the_root_as_given() {
    let t = tempfile::tempdir().unwrap();
    skill(&t.path().join("skills/pdf"));
    let given: PathBuf = t.path().join("skills/../.");
    let c = discover_with(&[given], Limits::default(), Layout::Recursive);
    assert_eq!(names(&c), vec!["pdf"]);
}
