//! `skill-operator catalog` against real git repositories made with the git
//! CLI (fixed dates, so commits are stable): what a build records, that a
//! cap or a fetch failure leaves the previous output byte for byte, that
//! refresh keeps the previous catalog when the new one is unusable, search
//! ranking and filtering, show and install, and the embedded snapshot.

#[path = "source/repo.rs"]
mod repo_support;
use repo_support::git;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use skill_operator::catalog::build::{build_to_file, BuildCaps, RepositorySpec, REPOSITORY_CAPS};
use skill_operator::catalog::ids::{is_commit_id, RESOURCE_NAME_MAX};
use skill_operator::catalog::model::{Catalog, MAX_ENTRIES};
use skill_operator::catalog::store;

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

/// A repository at `dir` with these files in one commit; its commit id.
fn repo(dir: &Path, files: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    for (rel, text) in files {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", "skills"]);
    git(dir, &["rev-parse", "HEAD"])
}

fn skill_md(name: &str, description: &str, extra: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n{extra}---\nBody.\n")
}

/// Two repositories with nested layouts: `acme/one` (read through a mirror,
/// a plugin marketplace and a category folder) and `team/two` (read from its
/// path: agent homes and hidden groups).
struct Fixture {
    _tmp: tempfile::TempDir,
    one: PathBuf,
    two: PathBuf,
    one_commit: String,
    two_commit: String,
}

const ONE_URL: &str = "https://github.com/acme/one";

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("mirrors/acme+one");
    let pdf = skill_md(
        "pdf",
        "Fill forms and merge documents",
        "license: Apache-2.0\nmetadata:\n  author: Ada Lovelace\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/fill.py\n      interpreter: python\n",
    );
    let one_commit = repo(
        &one,
        &[
            ("README.md", "# one\n"),
            (".claude-plugin/marketplace.json", r#"{"plugins":[{"name":"office","source":"./plugins/office","category":"Productivity"}]}"#),
            ("plugins/office/skills/xlsx/SKILL.md", &skill_md("xlsx", "Edit spreadsheets and workbooks", "")),
            ("plugins/office/skills/xlsx/package.json", "{}\n"),
            ("skills/docs/pdf/SKILL.md", &pdf),
            ("skills/docs/pdf/scripts/fill.py", "print('fill')\n"),
            ("skills/docs/pdf/scripts/requirements.txt", "pypdf\n"),
            ("skills/broken/SKILL.md", "---\nname: broken\n---\nNo description: not an entry.\n"),
        ],
    );
    let two = tmp.path().join("src/team/two");
    let two_commit = repo(
        &two,
        &[
            (".claude/skills/cafe/SKILL.md", &skill_md("cafe", "Écrit le menu du café", "")),
            ("skills/.curated/notes/SKILL.md", &skill_md("notes", "Keeps meeting notes", "metadata:\n  author: Pdf Person\n")),
            ("skills/.curated/reader/SKILL.md", &skill_md("reader", "Reads pdf files aloud", "")),
        ],
    );
    Fixture { _tmp: tmp, one, two, one_commit, two_commit }
}

impl Fixture {
    fn specs(&self) -> Vec<RepositorySpec> {
        let mirrors = [(ONE_URL.to_string(), self.one.display().to_string())].into();
        vec![RepositorySpec::parse(ONE_URL, &mirrors).unwrap(), RepositorySpec::parse(&self.two.display().to_string(), &mirrors).unwrap()]
    }

    /// `catalog build` over both repositories into `out`.
    fn build(&self, out: &Path) -> Output {
        let repositories = format!("{ONE_URL},{}", self.two.display());
        so(
            &["catalog", "build", "--repositories", &repositories, "--mirror", &format!("{ONE_URL}={}", self.one.display()), "--out"],
            Some(out),
            None,
        )
    }
}

/// The binary with `args` (then `last` when given), the local catalog at
/// `catalog` (a path that does not exist means the embedded snapshot).
fn so(args: &[&str], last: Option<&Path>, catalog: Option<&Path>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    if let Some(last) = last {
        cmd.arg(last);
    }
    // Never the user's own catalog.
    let none = std::env::temp_dir().join("skill-operator-tests-no-catalog.json");
    cmd.env(store::CATALOG_ENV, catalog.unwrap_or(&none)).env_remove("XDG_DATA_HOME").env("HOME", "/nonexistent");
    cmd.output().expect("the binary runs")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    assert!(!out.status.success(), "succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[test]
fn a_build_over_two_nested_repositories_records_every_valid_skill() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("catalog.json");
    let printed = stdout(&f.build(&out));
    assert!(printed.contains("wrote 5 entries from 2 repositories"), "{printed}");
    let catalog = Catalog::load(&out).unwrap();
    let two_url = f.two.display().to_string();
    assert_eq!(
        catalog.repositories.iter().map(|r| (r.url.as_str(), r.commit.as_str(), r.skills)).collect::<Vec<_>>(),
        [(ONE_URL, f.one_commit.as_str(), 2), (two_url.as_str(), f.two_commit.as_str(), 3)]
    );
    let ids: Vec<&str> = catalog.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["acme/one/docs/pdf", "acme/one/office/xlsx", "team/two/cafe", "team/two/curated/notes", "team/two/curated/reader"]);

    let pdf = catalog.get("acme/one/docs/pdf").unwrap();
    assert_eq!((pdf.repository.as_str(), pdf.path.as_str(), pdf.commit.as_str()), (ONE_URL, "skills/docs/pdf", f.one_commit.as_str()));
    assert_eq!((pdf.name.as_str(), pdf.description.as_str()), ("docs/pdf", "Fill forms and merge documents"));
    assert_eq!(
        (pdf.author.as_deref(), pdf.license.as_deref(), pdf.category.as_deref()),
        (Some("Ada Lovelace"), Some("Apache-2.0"), Some("docs"))
    );
    assert_eq!(
        (pdf.files.count, pdf.scripts.as_slice(), pdf.requirements.as_slice()),
        (3, &["scripts/fill.py".to_string()][..], &["scripts/requirements.txt".to_string()][..])
    );
    let expected_bytes: u64 = ["SKILL.md", "scripts/fill.py", "scripts/requirements.txt"]
        .iter()
        .map(|file| std::fs::metadata(f.one.join("skills/docs/pdf").join(file)).unwrap().len())
        .sum();
    assert_eq!(pdf.files.bytes, expected_bytes);

    let xlsx = catalog.get("acme/one/office/xlsx").unwrap();
    assert_eq!(
        (xlsx.path.as_str(), xlsx.category.as_deref()),
        ("plugins/office/skills/xlsx", Some("Productivity")),
        "the marketplace's category"
    );
    assert_eq!(xlsx.requirements, ["package.json"]);
    let notes = catalog.get("team/two/curated/notes").unwrap();
    assert_eq!((notes.path.as_str(), notes.repository.as_str()), ("skills/.curated/notes", two_url.as_str()));
    assert_eq!(catalog.get("team/two/cafe").unwrap().path, ".claude/skills/cafe");
}

#[test]
fn a_cap_hit_fails_the_build_and_leaves_the_previous_output_byte_identical() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("catalog.json");
    std::fs::write(&out, b"previous catalog, any bytes").unwrap();
    // acme/one has 8 files, team/two 3: the file cap is per repository.
    let files_cap =
        |max_files| BuildCaps { fetch: skill_operator::source::git::Caps { max_files, ..REPOSITORY_CAPS }, ..BuildCaps::DEFAULT };
    let err = build_to_file(&f.specs(), &files_cap(7), &out).unwrap_err().to_string();
    assert!(err.contains("file count cap of 7") && err.contains(ONE_URL), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"previous catalog, any bytes");
    let entries_cap = BuildCaps { entries: 4, ..BuildCaps::DEFAULT };
    let err = build_to_file(&f.specs(), &entries_cap, &out).unwrap_err().to_string();
    assert!(err.contains("more than 4 entries"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"previous catalog, any bytes");
    // At the edges the build passes.
    build_to_file(&f.specs(), &files_cap(8), &out).unwrap();
    assert_eq!(build_to_file(&f.specs(), &BuildCaps { entries: 5, ..BuildCaps::DEFAULT }, &out).unwrap().entries.len(), 5);
    assert_eq!(BuildCaps::DEFAULT.entries, MAX_ENTRIES);

    // Through the command line: a repository that cannot be read.
    let before = std::fs::read(&out).unwrap();
    let missing = dir.path().join("no/such-repo");
    let err = stderr(&so(&["catalog", "build", "--repositories", &missing.display().to_string(), "--out"], Some(&out), None));
    assert!(err.contains("was not changed") && err.contains("cannot read the git repository"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
}

#[test]
fn refresh_replaces_only_with_a_usable_catalog_and_says_why_not() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let built = dir.path().join("built.json");
    stdout(&f.build(&built));
    let local = dir.path().join("local/catalog.json");

    // Nothing stored yet: the embedded snapshot answers.
    let before = stdout(&so(&["catalog", "search", "--json", "pdf"], None, Some(&local)));
    assert!(!before.contains("acme/one"), "{before}");
    let printed = stdout(&so(&["catalog", "refresh", "--from"], Some(&built), Some(&local)));
    assert!(printed.contains("5 entries from 2 repositories"), "{printed}");
    let after: Value = serde_json::from_str(&stdout(&so(&["catalog", "search", "--json", "pdf"], None, Some(&local)))).unwrap();
    assert_eq!(after["results"][0]["id"], "acme/one/docs/pdf", "the refreshed catalog answers: {after}");
    let kept = std::fs::read(&local).unwrap();

    let wrong_schema = dir.path().join("v9.json");
    std::fs::write(
        &wrong_schema,
        std::fs::read_to_string(&built).unwrap().replace("skill-operator.catalog/v1", "skill-operator.catalog/v9"),
    )
    .unwrap();
    let corrupt = dir.path().join("corrupt.json");
    std::fs::write(&corrupt, &std::fs::read(&built).unwrap()[..200]).unwrap();
    let inconsistent = dir.path().join("inconsistent.json");
    std::fs::write(&inconsistent, std::fs::read_to_string(&built).unwrap().replace("\"skills\": 3", "\"skills\": 4")).unwrap();
    for (from, why) in [
        (wrong_schema.display().to_string(), "catalog/v9"),
        (corrupt.display().to_string(), "not JSON of the catalog format"),
        (inconsistent.display().to_string(), "says 4 skills"),
        (dir.path().join("absent.json").display().to_string(), "cannot read"),
        ("http://example.invalid/catalog.json".to_string(), "plain http"),
    ] {
        let err = stderr(&so(&["catalog", "refresh", "--from", &from], None, Some(&local)));
        assert!(err.contains("refresh failed; the catalog at") && err.contains("5 entries) stays in use"), "{from}: {err}");
        assert!(err.contains(why), "{from}: {err}");
        assert_eq!(std::fs::read(&local).unwrap(), kept, "{from}: the previous catalog is kept byte for byte");
    }
}

/// Search results of the catalog at `catalog`, as ids.
fn search(catalog: &Path, args: &[&str]) -> Vec<String> {
    let out: Value = serde_json::from_str(&stdout(&so(&[&["catalog", "search", "--json"], args].concat(), None, Some(catalog)))).unwrap();
    out["results"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn search_ranks_name_over_description_over_author_and_filters_by_category() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.json");
    stdout(&f.build(&catalog));
    assert_eq!(
        search(&catalog, &["pdf"]),
        ["acme/one/docs/pdf", "team/two/curated/reader", "team/two/curated/notes"],
        "name, description, author"
    );
    assert_eq!(search(&catalog, &["CAFE"]), ["team/two/cafe"], "case and diacritics");
    assert_eq!(search(&catalog, &["ecrit"]), ["team/two/cafe"]);
    assert_eq!(search(&catalog, &["spredsheets"]), ["acme/one/office/xlsx"], "a typo");
    assert_eq!(search(&catalog, &["merge", "forms"]), ["acme/one/docs/pdf"], "every word must match");
    assert_eq!(search(&catalog, &["pdf", "--category", "curated"]), ["team/two/curated/reader", "team/two/curated/notes"]);
    assert_eq!(search(&catalog, &["spreadsheets", "--category", "productivity"]), ["acme/one/office/xlsx"]);
    assert!(search(&catalog, &["pdf", "--category", "productivity"]).is_empty());
    assert_eq!(search(&catalog, &["pdf", "--limit", "1"]).len(), 1);
    let out: Value =
        serde_json::from_str(&stdout(&so(&["catalog", "search", "--json", "pdf", "--limit", "1"], None, Some(&catalog)))).unwrap();
    assert_eq!((out["total"].as_u64(), out["results"][0]["matched"][0].as_str()), (Some(3), Some("name")));
    let text = stdout(&so(&["catalog", "search", "reads", "aloud"], None, Some(&catalog)));
    assert_eq!(text, "team/two/curated/reader  Reads pdf files aloud\n");
}

#[test]
fn show_finds_an_entry_and_an_unknown_id_is_a_clear_error() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.json");
    stdout(&f.build(&catalog));
    let shown: Value =
        serde_json::from_str(&stdout(&so(&["catalog", "show", "--json", "acme/one/office/xlsx"], None, Some(&catalog)))).unwrap();
    assert_eq!((shown["path"].as_str(), shown["commit"].as_str()), (Some("plugins/office/skills/xlsx"), Some(f.one_commit.as_str())));
    let yaml = stdout(&so(&["catalog", "show", "acme/one/office/xlsx"], None, Some(&catalog)));
    assert!(yaml.contains("id: acme/one/office/xlsx\n") && yaml.contains("category: Productivity\n"), "{yaml}");
    let err = stderr(&so(&["catalog", "show", "acme/one/xlsx"], None, Some(&catalog)));
    assert!(err.contains("no skill `acme/one/xlsx` in the catalog (5 entries); did you mean `acme/one/office/xlsx`?"), "{err}");
    let err = stderr(&so(&["catalog", "show", "nobody/none/zzzz"], None, Some(&catalog)));
    assert!(err.contains("find ids with `skill-operator catalog search WORDS`"), "{err}");
}

#[test]
fn install_prints_the_pinned_skillsource() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.json");
    stdout(&f.build(&catalog));
    let yaml = stdout(&so(&["catalog", "install", "acme/one/docs/pdf"], None, Some(&catalog)));
    let doc: serde_norway::Value = serde_norway::from_str(&yaml).unwrap();
    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("acme-one-docs-pdf-") && name.len() == "acme-one-docs-pdf-".len() + 8, "{name}");
    let expected = format!(
        "apiVersion: skill-operator.dev/v1alpha1\nkind: SkillSource\nmetadata:\n  name: {name}\nspec:\n  git:\n    url: {ONE_URL}\n    ref: {}\n    path: skills/docs/pdf\n  updatePolicy: Manual\n",
        f.one_commit
    );
    assert_eq!(yaml, expected);

    let out = dir.path().join("pdf.yaml");
    let err = String::from_utf8(so(&["catalog", "install", "acme/one/docs/pdf", "--out"], Some(&out), Some(&catalog)).stderr).unwrap();
    assert!(err.contains("kubectl apply -f"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), expected);

    // A long id still gives a DNS-1123 label of at most 63 characters.
    for entry in Catalog::load(&catalog).unwrap().entries {
        let doc: serde_norway::Value =
            serde_norway::from_str(&stdout(&so(&["catalog", "install", &entry.id], None, Some(&catalog)))).unwrap();
        let name = doc["metadata"]["name"].as_str().unwrap();
        assert!(is_dns_label(name), "{} -> {name}", entry.id);
        assert_eq!(doc["spec"]["git"]["ref"].as_str(), Some(entry.commit.as_str()));
    }
}

fn is_dns_label(name: &str) -> bool {
    (1..=RESOURCE_NAME_MAX).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[test]
fn the_embedded_snapshot_loads_with_ten_pinned_repositories() {
    let snapshot = store::snapshot().expect("the snapshot is a valid catalog");
    assert!(snapshot.repositories.len() >= 10, "{} repositories", snapshot.repositories.len());
    for repo in &snapshot.repositories {
        assert!(is_commit_id(&repo.commit), "{}: {}", repo.url, repo.commit);
        assert!(repo.url.starts_with("https://github.com/") && repo.skills > 0, "{repo:?}");
    }
    assert!(snapshot.entries.len() >= 3_000, "{} entries", snapshot.entries.len());
    for entry in snapshot.entries.iter().step_by(97) {
        assert!(!entry.description.trim().is_empty() && is_dns_label(&skill_operator::catalog::ids::resource_name(&entry.id)), "{entry:?}");
    }
    // Without a local catalog the commands read it.
    let out: Value = serde_json::from_str(&stdout(&so(&["catalog", "search", "--json", "pdf"], None, None))).unwrap();
    assert!(out["total"].as_u64().unwrap() > 10, "{out}");
    let id = out["results"][0]["id"].as_str().unwrap();
    assert!(snapshot.get(id).is_some());
}

#[test]
fn a_local_catalog_that_does_not_load_is_an_error_not_a_silent_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("catalog.json");
    std::fs::write(&local, b"{\"schema\": \"skill-operator.catalog/v1\", \"built\": ").unwrap();
    let err = stderr(&so(&["catalog", "search", "pdf"], None, Some(&local)));
    assert!(err.contains(&format!("the catalog at {} cannot be used", local.display())), "{err}");
    assert!(err.contains("remove it to use the embedded snapshot"), "{err}");
}
