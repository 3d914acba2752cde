//! The dependency step for real: pip against a local index of wheels the
//! test writes (served on loopback), an sdist refused; `npm ci` against a
//! loopback registry serving an `npm pack` tarball whose postinstall would
//! write a marker file.

#[path = "image/common.rs"]
mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use sha2::{Digest, Sha256, Sha512};
use skill_operator::image::deps::{self, DepsError, DepsOptions, Ecosystem};

/// `python3 -m http.server` on a loopback port, serving `root`.
struct StaticServer {
    url: String,
    child: Child,
}

impl StaticServer {
    fn start(root: &Path) -> StaticServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "http.server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        StaticServer { url: format!("http://127.0.0.1:{port}"), child }
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pure-Python wheel written by hand (PEP 427): one module, METADATA,
/// WHEEL, RECORD.
fn write_wheel(dir: &Path, name: &str, version: &str, requires: &[&str]) -> PathBuf {
    let dist = format!("{name}-{version}.dist-info");
    let mut meta = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    for r in requires {
        meta.push_str(&format!("Requires-Dist: {r}\n"));
    }
    meta.push('\n');
    let files: Vec<(String, String)> = vec![
        (format!("{name}/__init__.py"), format!("VALUE = {:?}\n", format!("{name} {version}"))),
        (format!("{dist}/METADATA"), meta),
        (format!("{dist}/WHEEL"), "Wheel-Version: 1.0\nGenerator: skill-operator-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n".into()),
    ];
    let mut record = String::new();
    for (p, c) in &files {
        let h = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(c.as_bytes()));
        record.push_str(&format!("{p},sha256={h},{}\n", c.len()));
    }
    record.push_str(&format!("{dist}/RECORD,,\n"));
    let path = dir.join(format!("{name}-{version}-py3-none-any.whl"));
    let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let opts = zip::write::SimpleFileOptions::default();
    for (p, c) in files.iter().chain(std::iter::once(&(format!("{dist}/RECORD"), record))) {
        z.start_file(p.as_str(), opts).unwrap();
        z.write_all(c.as_bytes()).unwrap();
    }
    z.finish().unwrap();
    path
}

/// `simple/<name>/<files>`: python's directory listings are valid PEP 503
/// project pages.
fn pypi_index(root: &Path, marker: &Path) {
    for (name, requires) in [("tinypkg", vec!["tinydep"]), ("tinydep", vec![])] {
        let d = root.join("simple").join(name);
        std::fs::create_dir_all(&d).unwrap();
        write_wheel(&d, name, "1.0", &requires);
    }
    // An sdist whose setup.py would leave a marker if anything ran it.
    let d = root.join("simple/sdistonly");
    std::fs::create_dir_all(&d).unwrap();
    let setup = format!(
        "open({:?}, 'w').write('ran')\nfrom setuptools import setup\nsetup(name='sdistonly', version='1.0')\n",
        marker.display().to_string()
    );
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(setup.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "sdistonly-1.0/setup.py", setup.as_bytes()).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&b.into_inner().unwrap()).unwrap();
    std::fs::write(d.join("sdistonly-1.0.tar.gz"), gz.finish().unwrap()).unwrap();
}

#[test]
fn pip_installs_wheels_from_a_local_index_through_the_cli() {
    if !have_tools("pip_installs_wheels_from_a_local_index_through_the_cli", &["python3"]) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("marker");
    pypi_index(root.path(), &marker);
    let server = StaticServer::start(root.path());

    let pkg = skill_dir("py");
    std::fs::write(pkg.path().join("requirements.txt"), "# our deps\ntinypkg==1.0\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().join("deps");
    let report_json = run(Command::new(env!("CARGO_BIN_EXE_skill-operator"))
        .args(["image", "deps", "--package"])
        .arg(pkg.path())
        .arg("--out")
        .arg(&out_dir)
        .args(["--index-url", &format!("{}/simple/", server.url)]));
    let report: deps::DepsReport = serde_json::from_str(&report_json).unwrap();
    let names: Vec<(Ecosystem, &str, &str)> =
        report.dependencies.iter().map(|d| (d.ecosystem, d.name.as_str(), d.version.as_str())).collect();
    assert_eq!(names, vec![(Ecosystem::Pypi, "tinydep", "1.0"), (Ecosystem::Pypi, "tinypkg", "1.0")], "the requirement and its dependency");
    assert_eq!(report.lock_digest, deps::plan(pkg.path()).unwrap().lock_digest);
    assert!(report.lock_digest.is_some());
    assert_eq!(report.env(), vec![("PYTHONPATH".to_string(), "/deps/python".to_string())]);

    let py = out_dir.join("python");
    assert!(py.join("tinypkg/__init__.py").is_file());
    let pyc: Vec<_> = files_under(&py).into_keys().filter(|k| k.ends_with(".pyc")).collect();
    assert!(pyc.is_empty(), "--no-compile: {pyc:?}");
    // The tree works as PYTHONPATH.
    let v = run(Command::new("python3").env("PYTHONPATH", &py).args(["-c", "import tinypkg, tinydep; print(tinypkg.VALUE)"]));
    assert_eq!(v.trim(), "tinypkg 1.0");
    // And it becomes a layer under /deps.
    let layer = skill_operator::image::layer::from_dir(&out_dir, "deps", &[], "deps", &Default::default()).unwrap();
    assert!(layer.files.iter().any(|f| f.path == "/deps/python/tinypkg/__init__.py"));
}

#[test]
fn pip_refuses_a_package_with_only_an_sdist_and_names_it() {
    if !have_tools("pip_refuses_a_package_with_only_an_sdist_and_names_it", &["python3"]) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("marker");
    pypi_index(root.path(), &marker);
    let server = StaticServer::start(root.path());
    let pkg = skill_dir("sd");
    std::fs::write(pkg.path().join("requirements.txt"), "tinypkg==1.0\nsdistonly==1.0\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut opts = DepsOptions::new(pkg.path(), out.path().join("deps"));
    opts.index_url = Some(format!("{}/simple/", server.url));
    let err = deps::install(&opts).unwrap_err();
    match &err {
        DepsError::NoWheel { package, .. } => assert!(package.starts_with("sdistonly"), "{err}"),
        other => panic!("expected NoWheel, got {other}"),
    }
    assert!(err.to_string().contains("sdist"), "{err}");
    assert!(!marker.exists(), "the sdist's setup.py ran");
}

#[test]
fn requirement_options_and_urls_are_refused_before_pip_runs() {
    let pkg = skill_dir("opt");
    std::fs::write(pkg.path().join("requirements.txt"), "--extra-index-url https://elsewhere.example/simple\ntinypkg\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut opts = DepsOptions::new(pkg.path(), out.path().join("deps"));
    opts.python = "/nonexistent/python3".into(); // would fail differently if reached
    assert!(matches!(deps::install(&opts), Err(DepsError::BadRequirement { .. })));
}

/// An npm registry on loopback: the packument at `/<name>` and the tarball
/// under `/tarballs/`, for a package whose postinstall writes `marker`.
fn npm_registry(root: &Path, marker: &Path) -> (StaticServer, String) {
    let src = root.join("src/tinylib");
    std::fs::create_dir_all(&src).unwrap();
    let script = format!("node -e \"require('fs').writeFileSync('{}', 'ran')\"", marker.display());
    let manifest = serde_json::json!({"name": "tinylib", "version": "1.0.0", "main": "index.js", "scripts": {"postinstall": script}});
    std::fs::write(src.join("package.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    std::fs::write(src.join("index.js"), "module.exports = 'tinylib';\n").unwrap();
    let cache = root.join("npm-cache");
    let packed = run(Command::new("npm")
        .current_dir(&src)
        .args(["pack", "--silent", "--ignore-scripts"])
        .arg(format!("--cache={}", cache.display())));
    let tgz_name = packed.trim().lines().last().unwrap().to_string();
    let tgz = std::fs::read(src.join(&tgz_name)).unwrap();
    let serve = root.join("serve");
    std::fs::create_dir_all(serve.join("tarballs")).unwrap();
    std::fs::write(serve.join("tarballs").join(&tgz_name), &tgz).unwrap();
    let server = StaticServer::start(&serve);
    let integrity = format!("sha512-{}", base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&tgz)));
    let mut version = manifest.clone();
    version["dist"] = serde_json::json!({"tarball": format!("{}/tarballs/{tgz_name}", server.url), "integrity": integrity});
    let packument = serde_json::json!({"name": "tinylib", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}});
    std::fs::write(serve.join("tinylib"), serde_json::to_vec(&packument).unwrap()).unwrap();
    let url = format!("{}/", server.url);
    (server, url)
}

/// A skill package depending on tinylib, with its lockfile made by npm.
fn node_package(registry: &str, cache: &Path) -> tempfile::TempDir {
    let pkg = skill_dir("js");
    let pj = serde_json::json!({"name": "js-skill", "version": "1.0.0", "private": true, "dependencies": {"tinylib": "1.0.0"}});
    std::fs::write(pkg.path().join("package.json"), serde_json::to_vec_pretty(&pj).unwrap()).unwrap();
    run(Command::new("npm")
        .current_dir(pkg.path())
        .args(["install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund"])
        .arg(format!("--registry={registry}"))
        .arg(format!("--cache={}", cache.display())));
    assert!(pkg.path().join("package-lock.json").is_file());
    pkg
}

#[test]
fn npm_ci_installs_from_the_lock_without_running_lifecycle_scripts_and_reports_them() {
    if !have_tools("npm_ci_installs_from_the_lock_without_running_lifecycle_scripts_and_reports_them", &["npm", "node", "python3"]) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("marker");
    let (_server, registry) = npm_registry(root.path(), &marker);
    let pkg = node_package(&registry, &root.path().join("lock-cache"));

    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().join("deps");
    let mut opts = DepsOptions::new(pkg.path(), &out_dir);
    opts.npm_registry = Some(registry.clone());
    let report = deps::install(&opts).unwrap();
    assert!(out_dir.join("node/node_modules/tinylib/index.js").is_file(), "installed");
    assert!(!marker.exists(), "the postinstall script ran");
    assert_eq!(report.lifecycle_scripts.len(), 1, "{:?}", report.lifecycle_scripts);
    let s = &report.lifecycle_scripts[0];
    assert_eq!((s.package.as_str(), s.version.as_str()), ("tinylib", "1.0.0"));
    assert!(s.scripts.get("postinstall").is_some_and(|c| c.contains("writeFileSync")));
    assert!(report.dependencies.iter().any(|d| d.ecosystem == Ecosystem::Npm && d.name == "tinylib" && d.purl == "pkg:npm/tinylib@1.0.0"));
    assert_eq!(report.env(), vec![("NODE_PATH".to_string(), "/deps/node/node_modules".to_string())]);
    // The tree works as NODE_PATH.
    let v = run(Command::new("node").env("NODE_PATH", out_dir.join("node/node_modules")).args(["-e", "console.log(require('tinylib'))"]));
    assert_eq!(v.trim(), "tinylib");

    // Refusing instead of reporting, when asked.
    let out2 = tempfile::tempdir().unwrap();
    let mut strict = DepsOptions::new(pkg.path(), out2.path().join("deps"));
    strict.npm_registry = Some(registry.clone());
    strict.refuse_lifecycle_scripts = true;
    let err = deps::install(&strict).unwrap_err();
    assert!(matches!(&err, DepsError::LifecycleScripts { list } if list.contains("tinylib@1.0.0 (postinstall)")), "{err}");

    // Control: the same lock installed with scripts enabled does write the
    // marker, so its absence above is --ignore-scripts at work.
    let control = tempfile::tempdir().unwrap();
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(pkg.path().join(f), control.path().join(f)).unwrap();
    }
    run(Command::new("npm")
        .current_dir(control.path())
        .args(["ci", "--no-audit", "--no-fund"])
        .arg(format!("--registry={registry}"))
        .arg(format!("--cache={}", root.path().join("control-cache").display())));
    assert!(marker.exists(), "control run: the postinstall should have written the marker");
}

#[test]
fn npm_package_json_without_a_lockfile_is_refused() {
    let pkg = skill_dir("nolock");
    std::fs::write(pkg.path().join("package.json"), r#"{"name":"x","dependencies":{"left-pad":"*"}}"#).unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = deps::install(&DepsOptions::new(pkg.path(), out.path().join("deps"))).unwrap_err();
    assert!(matches!(err, DepsError::NoLockfile { .. }), "{err}");
    assert!(err.to_string().contains("package-lock.json"), "{err}");
    assert!(!out.path().join("deps/node").exists(), "nothing installed");
}
