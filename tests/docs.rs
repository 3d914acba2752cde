//! The documentation a newcomer reads, checked like code:
//! - every relative link in README.md and docs/*.md leads to a file that
//!   exists, and a `#heading` to a heading that exists (GitHub's anchors);
//! - the README stays a start page: short, with short paragraphs;
//! - its cluster quickstart is what the real-cluster quickstart script runs,
//!   and its agent code is config/samples/agent/quickstart_agent.py verbatim.
//!
//! Strict on purpose: a link to a page another part of the tree adds fails
//! until that page is there.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

/// The README is a start page: about one screenful of sections.
const README_MAX_LINES: usize = 120;
/// Longer than this and a paragraph is a wall a newcomer skips.
const PARAGRAPH_MAX_CHARS: usize = 600;
const QUICKSTART_BEGIN: &str = "<!-- BEGIN quickstart -->";
const QUICKSTART_END: &str = "<!-- END quickstart -->";
const QUICKSTART_AGENT: &str = "config/samples/agent/quickstart_agent.py";
const QUICKSTART_SCRIPT: &str = "tests/kind/quickstart.sh";
const QUICKSTART_EXTRACTOR: &str = "scripts/quickstart-commands.sh";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every docs/*.md, as paths relative to the checkout.
fn documents() -> Vec<String> {
    let mut docs = vec!["README.md".to_string()];
    let dir = root().join("docs");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    found.sort();
    docs.extend(found);
    docs
}

/// Lines outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A line with its inline code spans removed (a `[x](y)` in code is not a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of `[text](target)` links on one line.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                targets.push(after[..end].trim().to_string());
                rest = &after[end..];
            }
            None => break,
        }
    }
    targets
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (letters,
/// digits, `-` and `_` kept, so a code span keeps its text), each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a Markdown file offers, repeated headings numbered as GitHub does.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// `docs/../README.md` → `README.md`; None when it leaves the checkout.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            _ => return None,
        }
    }
    Some(out)
}

/// What is wrong with one link of `doc`, if anything.
fn broken(doc: &str, target: &str, cache: &mut BTreeMap<PathBuf, Option<Vec<String>>>) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None; // not a file of this tree: the checker stays offline
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let resolved = if file.is_empty() {
        PathBuf::from(doc)
    } else {
        let base = Path::new(doc).parent().unwrap_or(Path::new(""));
        match normalize(&base.join(file)) {
            Some(p) => p,
            None => return Some("leads out of the repository".into()),
        }
    };
    let full = root().join(&resolved);
    if !full.exists() {
        return Some(format!("{} does not exist", resolved.display()));
    }
    let anchor = anchor?;
    if full.extension().and_then(|e| e.to_str()) != Some("md") {
        return Some(format!("an anchor into {}, which is not Markdown", resolved.display()));
    }
    let known = cache.entry(resolved.clone()).or_insert_with(|| std::fs::read_to_string(&full).ok().map(|t| anchors(&t)));
    match known {
        Some(list) if list.iter().any(|a| a == anchor) => None,
        Some(list) => Some(format!("{} has no heading #{anchor} (it has: {})", resolved.display(), list.join(", "))),
        None => Some(format!("{} is not readable as text", resolved.display())),
    }
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading_that_exist() {
    let mut cache = BTreeMap::new();
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        for (n, line) in prose_lines(&text) {
            for target in link_targets(&without_code_spans(line)) {
                checked += 1;
                if let Some(why) = broken(&doc, &target, &mut cache) {
                    problems.push(format!("{doc}:{n}: ({target}): {why}"));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found: is the link parser broken?");
    assert!(problems.is_empty(), "{} broken links:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn the_checker_finds_a_broken_file_and_a_broken_anchor() {
    // The checker itself: a link that is wrong in each way it can be.
    let mut cache = BTreeMap::new();
    assert_eq!(broken("README.md", "docs/serve.md", &mut cache), None);
    assert_eq!(broken("docs/serve.md", "../README.md#set-up", &mut cache), None);
    assert_eq!(broken("docs/serve.md", "#roots-and---watch", &mut cache), None);
    assert!(broken("README.md", "docs/no-such-page.md", &mut cache).unwrap().contains("does not exist"));
    assert!(broken("README.md", "docs/serve.md#no-such-heading", &mut cache).unwrap().contains("no heading"));
    assert!(broken("README.md", "../../etc/passwd", &mut cache).unwrap().contains("out of the repository"));
    assert_eq!(broken("README.md", "https://agentskills.io", &mut cache), None);
    assert_eq!(link_targets(&without_code_spans("a `[x](nowhere.md)` and [y](docs/serve.md)")), vec!["docs/serve.md"]);
    assert_eq!(slug("`skill_run` as a SkillJob"), "skill_run-as-a-skilljob");
    assert_eq!(slug("The operator's own image"), "the-operators-own-image");
    assert_eq!(anchors("# A\n## A\n```\n# not a heading\n```\n"), vec!["a", "a-1"]);
}

/// Paragraphs outside code, tables, headings and HTML comments; a list item
/// starts its own.
fn paragraphs(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        let is_break = trimmed.is_empty() || trimmed.starts_with('|') || trimmed.starts_with('#') || trimmed.starts_with("<!--");
        let is_item = trimmed.starts_with("- ")
            || trimmed.starts_with("* ")
            || trimmed.split_once(". ").is_some_and(|(d, _)| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
        if is_break || is_item {
            out.extend(current.take());
        }
        if is_break {
            continue;
        }
        match current.as_mut() {
            Some((_, text)) => {
                text.push(' ');
                text.push_str(trimmed);
            }
            None => current = Some((n, trimmed.to_string())),
        }
    }
    out.extend(current);
    out
}

#[test]
fn the_readme_is_a_short_start_page() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= README_MAX_LINES, "README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into docs/");
    let long: Vec<String> = paragraphs(&readme)
        .into_iter()
        .filter(|(_, p)| p.chars().count() > PARAGRAPH_MAX_CHARS)
        .map(|(n, p)| format!("README.md:{n}: {} characters: {}…", p.chars().count(), p.chars().take(60).collect::<String>()))
        .collect();
    assert!(
        long.is_empty(),
        "paragraphs over {PARAGRAPH_MAX_CHARS} characters (split them, or move them into docs/):\n{}",
        long.join("\n")
    );
    // The project's rule: a fresh machine needs exactly these two commands.
    for command in ["cargo run --release -- serve", "scripts/test.sh"] {
        assert!(readme.lines().any(|l| l.starts_with(command)), "README.md lost its set-up command `{command}`");
    }
    let toc = read("docs/README.md");
    for doc in documents().iter().filter(|d| d.starts_with("docs/") && *d != "docs/README.md") {
        let name = doc.trim_start_matches("docs/");
        assert!(toc.contains(&format!("]({name})")), "docs/README.md (the table of contents) does not link {doc}");
    }
}

#[test]
fn the_paragraph_splitter_sees_items_and_skips_code_and_tables() {
    let text = "one\ntwo\n\n- item\n  more\n1. first\n| a | b |\n```\nnot prose\n```\nlast\n";
    let got: Vec<String> = paragraphs(text).into_iter().map(|(_, p)| p).collect();
    assert_eq!(got, vec!["one two", "- item more", "1. first", "last"]);
}

/// The quickstart block of the README: its first ```sh block (the commands)
/// and its ```python block (the agent).
fn quickstart(readme: &str) -> (Vec<String>, String) {
    let start = readme.find(QUICKSTART_BEGIN).expect("README.md has no <!-- BEGIN quickstart --> block") + QUICKSTART_BEGIN.len();
    let stop = readme[start..].find(QUICKSTART_END).expect("the README's quickstart block is not closed") + start;
    let block = &readme[start..stop];
    let fenced = |lang: &str| -> Option<String> {
        let open = format!("```{lang}\n");
        let from = block.find(&open)? + open.len();
        let to = block[from..].find("```\n")? + from;
        Some(block[from..to].to_string())
    };
    let commands = fenced("sh").expect("the quickstart block has no ```sh block");
    let agent = fenced("python").expect("the quickstart block has no ```python block");
    (commands.lines().map(String::from).collect(), agent)
}

#[test]
fn the_quickstart_agent_in_the_readme_is_the_sample_file() {
    let (_, agent) = quickstart(&read("README.md"));
    assert_eq!(
        agent,
        read(QUICKSTART_AGENT),
        "the README's quickstart agent differs from {QUICKSTART_AGENT}: copy the file into the block"
    );
}

#[test]
fn the_quickstart_names_only_files_that_exist() {
    let (commands, _) = quickstart(&read("README.md"));
    assert!(!commands.is_empty());
    let missing: Vec<&str> = commands
        .iter()
        .flat_map(|c| c.split_whitespace())
        .filter(|w| w.starts_with("charts/") || w.starts_with("config/"))
        .filter(|w| !root().join(w).exists())
        .collect();
    assert!(missing.is_empty(), "the README's quickstart names files the tree does not have: {missing:?}");
}

#[test]
fn the_extractor_prints_the_readme_quickstart_commands() {
    let (commands, _) = quickstart(&read("README.md"));
    let out = std::process::Command::new("bash").arg(root().join(QUICKSTART_EXTRACTOR)).output().expect("run bash");
    assert!(out.status.success(), "{QUICKSTART_EXTRACTOR}: {}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    assert_eq!(printed, commands);
}

#[test]
fn the_quickstart_script_runs_the_readme_lines() {
    let (commands, _) = quickstart(&read("README.md"));
    let path = root().join(QUICKSTART_SCRIPT);
    let script = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{QUICKSTART_SCRIPT} ({e}): the real-cluster quickstart must run the README's quickstart, and this test compares them")
    });
    // Either it takes the lines from the README itself, or it holds each verbatim.
    let reads_readme = script.contains(QUICKSTART_EXTRACTOR) || script.contains(QUICKSTART_BEGIN);
    if !reads_readme {
        let absent: Vec<&String> = commands.iter().filter(|c| !script.lines().any(|l| l.trim() == c.trim())).collect();
        assert!(
            absent.is_empty(),
            "{QUICKSTART_SCRIPT} does not run these README quickstart lines verbatim (or read them with {QUICKSTART_EXTRACTOR}):\n{}",
            absent.iter().map(|c| c.as_str()).collect::<Vec<_>>().join("\n")
        );
    }
    assert!(script.contains(QUICKSTART_AGENT), "{QUICKSTART_SCRIPT} does not run {QUICKSTART_AGENT}, the README's agent");
}

/// The first line installs the chart this tree releases: where the release
/// pipeline pushes it, at the version Chart.yaml gives.
#[test]
fn the_quickstart_installs_this_charts_release() {
    let (commands, _) = quickstart(&read("README.md"));
    let chart = read("charts/skill-operator/Chart.yaml");
    let version = chart.lines().find_map(|l| l.strip_prefix("version: ")).expect("Chart.yaml has a version").trim();
    let install = format!(
        "helm install skills {} --version {version} -n skill-operator --create-namespace --wait",
        skill_operator::image::self_image::RELEASE_CHART
    );
    assert_eq!(commands.first(), Some(&install), "the README's first quickstart line is not the release's install line");
    // Every page that shows the released chart shows this version of it.
    let chart_ref = skill_operator::image::self_image::RELEASE_CHART;
    for page in ["README.md", "docs/install.md", "charts/skill-operator/README.md"] {
        let text = read(page);
        let shown: Vec<&str> = text
            .match_indices(chart_ref)
            .filter_map(|(i, _)| text[i..].split_whitespace().skip_while(|w| *w != "--version").nth(1))
            .collect();
        assert!(!shown.is_empty(), "{page} does not show `helm install ... {chart_ref} --version`");
        assert!(shown.iter().all(|v| *v == version), "{page} shows chart versions {shown:?}, Chart.yaml says {version}");
    }
}

/// The path without the release registry: build the archive, load it, and
/// install the clone's chart with the flags the build printed; the test
/// script runs these lines too.
#[test]
fn the_archive_quickstart_is_what_the_script_runs() {
    let out =
        std::process::Command::new("bash").arg(root().join(QUICKSTART_EXTRACTOR)).args(["--block", "archive"]).output().expect("run bash");
    assert!(out.status.success(), "{QUICKSTART_EXTRACTOR} --block archive: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].contains("image self --archive skill-operator.tar >helm-flags"), "{}", lines[0]);
    assert!(lines[2].starts_with("helm install skills charts/skill-operator ") && lines[2].ends_with("$(cat helm-flags)"), "{}", lines[2]);
    let script = read(QUICKSTART_SCRIPT);
    assert!(script.contains("--block archive"), "{QUICKSTART_SCRIPT} does not run the README's archive quickstart");
    // Every loader the README names is one `image self --archive` names too.
    let readme = read("README.md");
    for loader in ["kind load image-archive", "k3d image import", "minikube image load", "ctr -n k8s.io images import"] {
        assert!(readme.contains(&format!("{loader} skill-operator.tar")), "the README does not show {loader}");
    }
}

/// The fenced block after `<!-- client: NAME -->` in docs/gateway.md.
fn client_block(doc: &str, name: &str) -> String {
    let marker = format!("<!-- client: {name} -->\n");
    let from = doc.find(&marker).unwrap_or_else(|| panic!("docs/gateway.md has no {marker:?}")) + marker.len();
    let rest = &doc[from..];
    let body = rest.find('\n').map(|i| &rest[i + 1..]).expect("a fenced block after the marker");
    body[..body.find("```\n").expect("the block is closed")].to_string()
}

/// The connection settings docs/gateway.md gives each MCP client, checked
/// by shape: each parses as its client's format (JSON, TOML through
/// Python's tomllib, a command line), names the quick start's endpoint,
/// speaks Streamable HTTP, and takes the token from the environment or a
/// prompt, never a literal.
#[test]
fn the_client_configs_have_each_clients_shape() {
    const URL: &str = "http://localhost:8090/mcp/skills-demo";
    let doc = read("docs/gateway.md");
    let json = |name: &str| -> serde_json::Value {
        serde_json::from_str(&client_block(&doc, name)).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"))
    };

    let claude = json("claude-code-json");
    let s = &claude["mcpServers"]["skills"];
    assert_eq!((s["type"].as_str(), s["url"].as_str()), (Some("http"), Some(URL)), "{claude}");
    assert_eq!(s["headers"]["Authorization"], "Bearer ${SKILLS_TOKEN}");

    let cursor = json("cursor");
    let s = &cursor["mcpServers"]["skills"];
    assert_eq!(s["url"], URL);
    assert!(s.get("command").is_none(), "a URL server, not a command");
    assert_eq!(s["headers"]["Authorization"], "Bearer ${env:SKILLS_TOKEN}");

    let vscode = json("vscode");
    let s = &vscode["servers"]["skills"];
    assert_eq!((s["type"].as_str(), s["url"].as_str()), (Some("http"), Some(URL)), "{vscode}");
    let auth = s["headers"]["Authorization"].as_str().unwrap();
    let input = auth.strip_prefix("Bearer ${input:").and_then(|r| r.strip_suffix('}')).expect("the token from an input");
    let declared = vscode["inputs"].as_array().unwrap().iter().find(|i| i["id"] == input).expect("the input is declared");
    assert_eq!((declared["type"].as_str(), declared["password"].as_bool()), (Some("promptString"), Some(true)));

    let toml = client_block(&doc, "codex");
    let parsed = std::process::Command::new("python3")
        .args(["-c", "import json, sys, tomllib; print(json.dumps(tomllib.loads(sys.stdin.read())))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(toml.as_bytes())?;
            c.wait_with_output()
        })
        .expect("python3 with tomllib");
    assert!(parsed.status.success(), "codex: not TOML");
    let codex: serde_json::Value = serde_json::from_slice(&parsed.stdout).unwrap();
    assert_eq!(codex["mcp_servers"]["skills"], serde_json::json!({"url": URL, "bearer_token_env_var": "SKILLS_TOKEN"}));

    for (name, program, must) in [
        ("claude-code-cli", "claude", &["mcp", "add", "--transport", "http", "skills", URL, "--header"][..]),
        ("inspector", "npx", &["@modelcontextprotocol/inspector", "--cli", URL, "--transport", "http", "--header"][..]),
    ] {
        let line = client_block(&doc, name);
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&program), "{name}: {line}");
        for w in must {
            assert!(words.contains(w), "{name}: no {w} in {line}");
        }
        assert!(line.contains("\"Authorization: Bearer $SKILLS_TOKEN\""), "{name}: the token from the environment: {line}");
    }
}

/// The release workflow cannot run here; its shape can be held to the
/// script it calls: on a version tag, the release binary, then
/// scripts/release.sh to the registry the chart and the code name, then a
/// GitHub release whose notes are the script's.
#[test]
fn the_release_workflow_runs_the_release_script_on_a_version_tag() {
    let text = read(".github/workflows/release.yml");
    let wf: serde_json::Value = serde_norway::from_str(&text).expect(".github/workflows/release.yml is YAML");
    // YAML 1.1's `on` may come back as `true`; serde_norway keeps the key "on".
    assert_eq!(wf["on"]["push"]["tags"], serde_json::json!(["v*"]), "{text}");
    let job = &wf["jobs"]["publish"];
    let env_registry = job["env"]["REGISTRY"].as_str().expect("a REGISTRY for the job");
    let repository = skill_operator::image::self_image::RELEASE_REPOSITORY;
    assert_eq!(format!("{env_registry}/skill-operator"), repository, "the workflow publishes where the chart's default image points");
    assert!(skill_operator::image::self_image::RELEASE_CHART.starts_with(&format!("oci://{env_registry}/charts/")));
    let steps: Vec<String> = job["steps"].as_array().unwrap().iter().filter_map(|s| s["run"].as_str().map(String::from)).collect();
    let at = |needle: &str| steps.iter().position(|r| r.contains(needle)).unwrap_or_else(|| panic!("no step runs {needle}"));
    assert!(at("cargo build --release --locked") < at("scripts/release.sh --registry \"$REGISTRY\""));
    assert!(at("scripts/release.sh") < at("gh release create"));
    assert!(steps[at("gh release create")].contains("--notes-file target/release-out/release-notes.md"));
    let publish =
        job["steps"].as_array().unwrap().iter().find(|s| s["run"].as_str().is_some_and(|r| r.contains("scripts/release.sh"))).unwrap();
    assert_eq!(publish["env"]["RELEASE_TAG"], "${{ github.ref_name }}", "the script checks the tag against the chart version");
    assert!(root().join("scripts/release.sh").exists());
}
