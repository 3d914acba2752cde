//! Discovery rules, each at its edge, on real directories.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn skill_at(dir: &Path, frontmatter: &str) {
    write(&dir.join("SKILL.md"), &format!("---\n{frontmatter}\n---\n# Body of {}\n", dir.display()));
}

fn simple(dir: &Path, name: &str) {
    skill_at(dir, &format!("name: {name}\ndescription: The {name} skill."));
}

fn scan(roots: &[&Path]) -> Catalog {
    discover(&roots.iter().map(|p| p.to_path_buf()).collect::<Vec<PathBuf>>(), Limits::default())
}

fn names(c: &Catalog) -> Vec<&str> {
    c.names()
}

fn reasons_for(c: &Catalog, needle: &str) -> Vec<Reason> {
    c.problems.iter().filter(|p| p.path.contains(needle) || p.skill.as_deref() == Some(needle)).map(|p| p.reason).collect()
}

fn has(c: &Catalog, reason: Reason) -> bool {
    c.problems.iter().any(|p| p.reason == reason)
}

#[test]
fn three_layouts_and_hidden_groups() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("repo-a");
    simple(&a.join("alpha"), "alpha");
    simple(&a.join("skills/beta"), "beta");
    simple(&a.join("skills/.curated/gamma"), "gamma");
    let single = t.path().join("delta");
    simple(&single, "delta");
    let c = scan(&[&a, &single]);
    assert_eq!(names(&c), vec!["alpha", "beta", "delta", "gamma"]);
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!(c.roots[0].skills, 3);
    assert_eq!(c.roots[1].skills, 1);
}

#[test]
fn hidden_root_folders_are_not_scanned_and_agents_alias_is_not_double_counted() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    simple(&root.join("skills/one"), "one");
    fs::create_dir_all(root.join(".agents")).unwrap();
    symlink("../skills", root.join(".agents/skills")).unwrap();
    simple(&root.join(".hidden-skill"), "hidden-skill");
    fs::create_dir_all(root.join(".git/objects")).unwrap();
    let c = scan(&[root]);
    assert_eq!(names(&c), vec!["one"]);
    assert_eq!(reasons_for(&c, ".hidden-skill"), vec![Reason::HiddenSkipped]);
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
}

#[test]
fn served_under_directory_name_never_frontmatter_name() {
    let t = tempfile::tempdir().unwrap();
    skill_at(&t.path().join("weather"), "name: billing\ndescription: Claims a neighbour's name.");
    let c = scan(&[t.path()]);
    assert_eq!(names(&c), vec!["weather"]);
    assert_eq!(reasons_for(&c, "weather"), vec![Reason::NameMismatch]);
    assert!(c.get("billing").is_none());
}

#[test]
fn root_that_is_a_skill_is_named_by_the_root_directory() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("my-skill");
    skill_at(&root, "name: other\ndescription: d");
    simple(&root.join("nested"), "nested");
    let c = scan(&[&root]);
    assert_eq!(names(&c), vec!["my-skill"]);
    // The nested folder is a file tree of the root skill, not a second skill.
    assert!(c.get("my-skill").unwrap().file("nested/SKILL.md").is_some());
}

#[test]
fn one_name_from_two_roots_refuses_both() {
    let t = tempfile::tempdir().unwrap();
    simple(&t.path().join("a/pdf"), "pdf");
    simple(&t.path().join("b/pdf"), "pdf");
    simple(&t.path().join("b/other"), "other");
    let c = scan(&[&t.path().join("a"), &t.path().join("b")]);
    assert_eq!(names(&c), vec!["other"]);
    let dupes: Vec<_> = c.problems.iter().filter(|p| p.reason == Reason::DuplicateName).collect();
    assert_eq!(dupes.len(), 2);
    assert!(dupes.iter().all(|p| p.skill.as_deref() == Some("pdf")));
}

#[test]
fn same_directory_twice_is_served_once() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    simple(&root.join("docx-official"), "docx-official");
    symlink("docx-official", root.join("docx")).unwrap();
    // The same root given twice, and a root nested in another.
    let c = scan(&[root, root]);
    assert_eq!(names(&c), vec!["docx-official"]);
    assert!(reasons_for(&c, "docx").contains(&Reason::DuplicatePath));
    assert!(!has(&c, Reason::DuplicateName));
}

#[test]
fn symlinked_skill_dirs_inside_the_root_are_served_outside_are_reported() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    simple(&root.join("shared/foo"), "foo");
    fs::create_dir_all(root.join("skills")).unwrap();
    symlink("../shared/foo", root.join("skills/foo")).unwrap();
    let outside = t.path().join("outside");
    simple(&outside.join("evil"), "evil");
    symlink(outside.join("evil"), root.join("skills/evil")).unwrap();
    symlink("../nowhere", root.join("skills/broken")).unwrap();
    let c = scan(&[&root]);
    assert_eq!(names(&c), vec!["foo"]);
    assert_eq!(reasons_for(&c, "skills/evil"), vec![Reason::SymlinkEscape]);
    assert_eq!(reasons_for(&c, "skills/broken"), vec![Reason::BrokenSymlink]);
    // `shared` itself has no SKILL.md and is reported, not silently skipped.
    assert_eq!(reasons_for(&c, "root/shared"), vec![Reason::NoSkillMd]);
}

#[test]
fn file_symlinks_escapes_loops_and_aliases() {
    let t = tempfile::tempdir().unwrap();
    let secret = t.path().join("secret.txt");
    write(&secret, "secret");
    let s = t.path().join("root/s");
    simple(&s, "s");
    write(&s.join("docs/a.md"), "a");
    symlink("a.md", s.join("docs/b.md")).unwrap();
    fs::create_dir_all(s.join("links")).unwrap();
    symlink("../docs/a.md", s.join("links/inside.md")).unwrap();
    symlink(&secret, s.join("links/escape.txt")).unwrap();
    symlink("/nonexistent/x", s.join("links/broken.txt")).unwrap();
    symlink("..", s.join("links/loop")).unwrap();
    symlink("../docs", s.join("links/docs-again")).unwrap();
    let c = scan(&[&t.path().join("root")]);
    let skill = c.get("s").unwrap();
    let files: Vec<&str> = skill.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(files, vec!["SKILL.md", "docs/a.md", "docs/b.md", "links/inside.md"]);
    let reasons = reasons_for(&c, "links/");
    for expected in [Reason::SymlinkEscape, Reason::BrokenSymlink, Reason::SymlinkLoop, Reason::DuplicatePath] {
        assert!(reasons.contains(&expected), "{expected:?} missing from {reasons:?}");
    }
}

#[test]
fn a_bad_skill_harms_only_itself() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    simple(&root.join("good"), "good");
    fs::create_dir_all(root.join("empty")).unwrap();
    write(&root.join("nofm/SKILL.md"), "# just markdown\n");
    write(&root.join("badyaml/SKILL.md"), "---\nname: x\ndescription: [oops\n---\n");
    write(&root.join("nodesc/SKILL.md"), "---\nname: nodesc\n---\nbody\n");
    write(&root.join("anchors/SKILL.md"), "---\nname: &n anchors\ndescription: *n\n---\n");
    fs::create_dir_all(root.join("binary")).unwrap();
    fs::write(root.join("binary/SKILL.md"), b"---\nname: b\xff\n---\n").unwrap();
    let c = scan(&[root]);
    assert_eq!(names(&c), vec!["good"]);
    assert_eq!(reasons_for(&c, "empty"), vec![Reason::NoSkillMd]);
    assert_eq!(reasons_for(&c, "nofm"), vec![Reason::MalformedFrontmatter]);
    assert_eq!(reasons_for(&c, "nodesc"), vec![Reason::NoDescription]);
    assert_eq!(reasons_for(&c, "anchors"), vec![Reason::MalformedFrontmatter]);
    assert_eq!(reasons_for(&c, "binary"), vec![Reason::UnreadableSkillMd]);
    let bad = c.problems.iter().find(|p| p.path.contains("badyaml")).unwrap();
    assert!(bad.detail.contains("(line 4, column 1) of SKILL.md"), "{}", bad.detail);
}

#[test]
fn unreadable_root_is_reported() {
    let c = scan(&[Path::new("/nonexistent/skills-root")]);
    assert!(c.skills.is_empty());
    assert_eq!(c.problems[0].reason, Reason::RootUnreadable);
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("file");
    write(&file, "x");
    assert_eq!(scan(&[&file]).problems[0].reason, Reason::RootUnreadable);
}

#[test]
fn unusable_names_and_paths() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    simple(&root.join("has space"), "has-space");
    simple(&root.join("ok"), "ok");
    write(&root.join("ok/back\\slash.md"), "x");
    write(&root.join("ok/pct%2e.md"), "x");
    write(&root.join("ok/ctl\u{1}.md"), "x");
    fs::create_dir_all(root.join("ok/.git/objects")).unwrap();
    write(&root.join("ok/.git/HEAD"), "ref");
    write(&root.join("ok/.env.example"), "X=1");
    let c = scan(&[root]);
    assert_eq!(names(&c), vec!["ok"]);
    assert_eq!(reasons_for(&c, "has space"), vec![Reason::UnusableName]);
    let unusable = c.problems.iter().filter(|p| p.reason == Reason::UnusablePath).count();
    assert_eq!(unusable, 3, "{:?}", c.problems);
    let files: Vec<&str> = c.get("ok").unwrap().files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(files, vec![".env.example", "SKILL.md"], "VCS folders are not indexed, other hidden files are");
}

#[test]
fn declared_scripts_missing_or_escaping() {
    let t = tempfile::tempdir().unwrap();
    let s = t.path().join("s");
    skill_at(
        &s,
        "name: s\ndescription: d\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/ok.py\n      interpreter: python\n    - script: scripts/missing.py\n      interpreter: python\n    - script: scripts/link.py\n      interpreter: python\n    - script: scripts\n      interpreter: bash",
    );
    write(&s.join("scripts/ok.py"), "print(1)");
    write(&t.path().join("evil.py"), "print(2)");
    symlink(t.path().join("evil.py"), s.join("scripts/link.py")).unwrap();
    let c = scan(&[t.path()]);
    let skill = c.get("s").unwrap();
    let status: Vec<(&str, bool)> = skill.scripts.iter().map(|s| (s.decl.script.as_str(), s.unavailable.is_none())).collect();
    assert_eq!(status, vec![("scripts/ok.py", true), ("scripts/missing.py", false), ("scripts/link.py", false), ("scripts", false)]);
    let reasons = reasons_for(&c, "s");
    assert_eq!(reasons.iter().filter(|r| **r == Reason::DeclaredScriptMissing).count(), 2);
    assert!(reasons.contains(&Reason::SymlinkEscape));
}

#[test]
fn broken_declaration_keeps_instructions() {
    let t = tempfile::tempdir().unwrap();
    skill_at(&t.path().join("s"), "name: s\ndescription: d\nmcp-host:\n  version: 1\n  run: scripts/x.py");
    let c = scan(&[t.path()]);
    let skill = c.get("s").expect("still served");
    assert!(skill.scripts.is_empty() && !skill.has_declaration);
    assert_eq!(reasons_for(&c, "s"), vec![Reason::Declaration]);
    assert!(skill.load_body().unwrap().0.contains("Body of"));
}

#[test]
fn skill_md_read_cap_edge_and_sparse_file() {
    // The peak RSS below is the whole process's: measured in a process of
    // its own, so another test allocating at the same moment cannot count.
    const CHILD: &str = "SKILL_OPERATOR_SPARSE_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "core::discovery::tests::skill_md_read_cap_edge_and_sparse_file", "--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let head = "---\nname: exact\ndescription: d\n---\n";
    let exact = format!("{head}{}", "x".repeat(SKILL_MD_READ_CAP as usize - head.len()));
    assert_eq!(exact.len() as u64, SKILL_MD_READ_CAP);
    write(&t.path().join("exact/SKILL.md"), &exact);
    let head = "---\nname: over\ndescription: d\n---\n";
    write(&t.path().join("over/SKILL.md"), &format!("{head}{}", "x".repeat(SKILL_MD_READ_CAP as usize - head.len() + 1)));
    // 256 MiB sparse file: memory must stay bounded by the cap.
    let sparse = t.path().join("sparse/SKILL.md");
    write(&sparse, "---\nname: sparse\ndescription: d\n---\n");
    fs::OpenOptions::new().write(true).open(&sparse).unwrap().set_len(256 * 1024 * 1024).unwrap();
    let c = scan(&[t.path()]);
    assert_eq!(names(&c), vec!["exact", "over", "sparse"]);
    assert!(!c.get("exact").unwrap().skill_md_truncated);
    assert!(c.get("over").unwrap().skill_md_truncated);
    assert!(c.get("sparse").unwrap().skill_md_truncated);
    assert_eq!(reasons_for(&c, "over"), vec![Reason::SkillMdTruncated]);
    let (body, truncated) = c.get("sparse").unwrap().load_body().unwrap();
    assert!(truncated && body.len() < SKILL_MD_READ_CAP as usize);
    let hwm_kib: u64 = fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(hwm_kib < 200 * 1024, "peak RSS {hwm_kib} KiB: the sparse file was read whole");
}

#[test]
fn files_per_skill_cap_edge() {
    let t = tempfile::tempdir().unwrap();
    for (name, count) in [("at-cap", MAX_FILES - 1), ("over-cap", MAX_FILES)] {
        let s = t.path().join(name);
        simple(&s, name);
        fs::create_dir_all(s.join("f")).unwrap();
        for i in 0..count {
            fs::write(s.join(format!("f/{i:05}.txt")), "x").unwrap();
        }
    }
    let c = scan(&[t.path()]);
    // SKILL.md counts: at-cap has exactly MAX_FILES files.
    assert_eq!(c.get("at-cap").unwrap().files.len(), MAX_FILES);
    assert!(reasons_for(&c, "at-cap").is_empty());
    assert_eq!(c.get("over-cap").unwrap().files.len(), MAX_FILES);
    assert_eq!(reasons_for(&c, "over-cap"), vec![Reason::FileLimit]);
}

#[test]
fn dirs_per_skill_cap_edge() {
    let t = tempfile::tempdir().unwrap();
    for (name, count) in [("at-cap", MAX_DIRS - 1), ("over-cap", MAX_DIRS)] {
        let s = t.path().join(name);
        simple(&s, name);
        for i in 0..count {
            fs::create_dir_all(s.join(format!("d{i:05}"))).unwrap();
        }
    }
    let c = scan(&[t.path()]);
    assert!(reasons_for(&c, "at-cap").is_empty(), "{:?}", reasons_for(&c, "at-cap"));
    assert_eq!(reasons_for(&c, "over-cap"), vec![Reason::DirLimit]);
}

#[test]
fn skills_cap_edge() {
    let t = tempfile::tempdir().unwrap();
    for i in 0..4 {
        simple(&t.path().join(format!("s{i}")), &format!("s{i}"));
    }
    let limits = Limits { skills: 4, ..Limits::default() };
    let c = discover(&[t.path().to_path_buf()], limits);
    assert_eq!(c.skills.len(), 4);
    assert!(c.problems.is_empty());
    let limits = Limits { skills: 3, ..Limits::default() };
    let c = discover(&[t.path().to_path_buf()], limits);
    assert_eq!(c.skills.len(), 3);
    assert_eq!(c.problems.iter().filter(|p| p.reason == Reason::SkillLimit).count(), 1);
}

// The default cap must sit far above real repositories (400-900 skills).
const _: () = assert!(SKILLS_TOTAL >= 10 * 400);

/// Several hundred generated skills with the deviations real corpora have.
#[test]
fn messy_corpus_is_served_with_problems_not_refusals() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("skills");
    let total = 600;
    let mut expect_refused = 0;
    for i in 0..total {
        let dir = root.join(format!("skill-{i:03}"));
        let mut fm = String::new();
        match i % 10 {
            0 => fm.push_str(&format!("name: Skill {i}\n")), // capitals, spaces
            1 => fm.push_str("name: someone-else\n"),        // name mismatch
            2 => fm.push_str(&format!("name: skill-{i:03}\nrequires: [python]\nversion: 2\ntags: [a, b]\n")), // unknown keys
            3 => fm.push_str(&format!("name: skill-{i:03}\nmetadata:\n  version: 1.2\n  author: me\n")), // non-string metadata
            4 => fm.push_str(&format!("name: skill-{i:03}\nallowed-tools:\n  - Read\n  - Bash\n")), // list
            _ => fm.push_str(&format!("name: skill-{i:03}\n")),
        }
        if i % 10 == 5 {
            fm.push_str(&format!("description: {}\n", "long ".repeat(260))); // > 1024 chars
        } else if i % 50 == 7 {
            expect_refused += 1; // no description
        } else {
            fm.push_str(&format!("description: Skill number {i}.\n"));
        }
        let mut text = format!("---\n{fm}---\n# Skill {i}\n");
        if i % 10 == 6 {
            text = text.replace('\n', "\r\n");
        }
        let mut bytes = text.into_bytes();
        if i % 10 == 8 {
            bytes.splice(0..0, *b"\xEF\xBB\xBF");
        }
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("SKILL.md"), bytes).unwrap();
        write(&dir.join("references/notes.md"), "notes");
    }
    let c = scan(&[t.path()]);
    assert_eq!(c.skills.len(), total - expect_refused);
    let count = |r: Reason| c.problems.iter().filter(|p| p.reason == r).count();
    assert_eq!(count(Reason::NoDescription), expect_refused);
    assert_eq!(count(Reason::NameMismatch), 120, "case 0 and case 1");
    assert_eq!(count(Reason::UnknownKey), 60);
    assert_eq!(count(Reason::SpecViolation), 60 + 60 + 60 + 60, "name form, metadata, list, long description");
    assert!(!c.problems.iter().any(|p| p.reason.refuses_skill() && p.reason != Reason::NoDescription));
    // CRLF and BOM skills parse like any other.
    assert!(c.get("skill-006").is_some() && c.get("skill-008").is_some());
}

#[test]
fn serve_shows_its_directories_as_they_are() {
    let t = tempfile::tempdir().unwrap();
    simple(&t.path().join("alpha"), "alpha");
    let c = scan(&[t.path()]);
    let alpha = c.get("alpha").unwrap();
    assert_eq!(alpha.shown.root, t.path().display().to_string());
    assert_eq!(alpha.shown.dir, t.path().canonicalize().unwrap().join("alpha").display().to_string());
    assert_eq!(alpha.shown.file("SKILL.md"), alpha.dir.join("SKILL.md").display().to_string());
    assert_eq!(c.roots[0].shown, t.path().display().to_string());
}

#[test]
fn a_relocated_root_shows_its_label_everywhere_and_reads_from_disk() {
    let t = tempfile::tempdir().unwrap();
    // The root is the skill (the gateway's layout), reached through a symlink
    // so the canonical spelling differs from the one discovery was given.
    let real = t.path().join("entries/0123abcd/alpha");
    skill_at(&real, "name: alpha\ndescription: The alpha skill.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/gone.py\n      interpreter: python");
    write(&real.join("ref.md"), "r\n");
    symlink(t.path().join("entries"), t.path().join("via")).unwrap();
    let given = t.path().join("via/0123abcd/alpha");
    // A second root, not relocated.
    let other = t.path().join("other");
    simple(&other.join("beta"), "beta");
    let mut c = scan(&[&given, &other]);
    assert!(c.problems.iter().any(|p| p.detail.contains(&real.display().to_string()) || p.path.contains(&given.display().to_string())));

    c.relocate(&given, "alpha-1@sha256:ff");
    let alpha = c.get("alpha").unwrap();
    assert_eq!((alpha.shown.root.as_str(), alpha.shown.dir.as_str()), ("alpha-1@sha256:ff", "."));
    assert_eq!(alpha.shown.file("SKILL.md"), "alpha-1@sha256:ff/SKILL.md");
    assert_eq!(alpha.dir, real.canonicalize().unwrap(), "files are still read from the real directory");
    let gone = c.problems.iter().find(|p| p.reason == Reason::DeclaredScriptMissing).unwrap();
    assert_eq!(gone.path, "alpha-1@sha256:ff/scripts/gone.py");
    for p in c.problems.iter().chain(&alpha.problems) {
        for spelling in [&given, &real] {
            let s = spelling.display().to_string();
            assert!(!p.path.contains(&s) && !p.detail.contains(&s), "{p:?} still names {s}");
        }
    }
    assert_eq!(c.roots.iter().map(|r| r.shown.as_str()).collect::<Vec<_>>(), vec!["alpha-1@sha256:ff", &other.display().to_string()]);
    let beta = c.get("beta").unwrap();
    assert_eq!(beta.shown.root, other.display().to_string(), "another root keeps its own location");
}

#[test]
fn relocating_replaces_whole_paths_only() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("alpha");
    simple(&root, "alpha");
    let mut c = scan(&[&root]);
    let r = root.display().to_string();
    c.problems = vec![
        Problem::new(&root, Reason::Grant, format!("see {r}/x, {r}. and {r}2 and {r}-b and {r}.d")),
        Problem::new(format!("{r}-sibling/f"), Reason::Grant, "d"),
    ];
    c.relocate(&root, "L");
    assert_eq!(c.problems[0].path, "L");
    assert_eq!(c.problems[0].detail, format!("see L/x, L. and {r}2 and {r}-b and {r}.d"));
    assert_eq!(c.problems[1].path, format!("{r}-sibling/f"), "a sibling directory is not under the root");
}
