//! The artifact endpoint against a real registry (`/usr/bin/docker-registry`
//! on a loopback port per test), with `fetch` and `upload` as library calls
//! and, where the process matters (round trip, SIGTERM), as the real binary.
//! `tests/artifacts_store.rs` runs every test here again with the endpoint on
//! its built-in store (`--store`) instead of the registry.

#[path = "oci/common.rs"]
mod common;

use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::TestRegistry;
use serde_json::Value;
use skill_operator::api::outcome::{LaunchResult, RunOutcome};
use skill_operator::artifacts::client::{self, ClientError, Endpoint, FetchOptions, UploadOptions};
use skill_operator::artifacts::server::{self, AppState, ServerConfig};
use skill_operator::artifacts::verdict::{Verdict, VerdictSender};
use skill_operator::artifacts::{self, sha256_digest, ArtifactLimits, InputsManifest, OutputManifest, SetFile, SkipReason};
use skill_operator::core::package;
use skill_operator::core::token::job_token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef-artifact-tests";
const NS: &str = "team-a";
const UID: &str = "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60";
const OTHER_UID: &str = "9a8b7c6d-0000-4000-8000-000000000001";
const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");
const MIB: u64 = 1024 * 1024;

/// Whether `start` puts the endpoint on its built-in store; the including
/// crate's value wins (tests/artifacts_store.rs sets it).
#[allow(dead_code)]
const ON_BUILTIN_STORE: bool = false;

struct Env {
    reg: Option<TestRegistry>,
    /// The built-in store's directory, when the endpoint runs on it.
    store: Option<tempfile::TempDir>,
    addr: SocketAddr,
    base: String,
    http: reqwest::Client,
    limits: ArtifactLimits,
    state: AppState,
    _spool: tempfile::TempDir,
}

async fn start() -> Env {
    start_with(ArtifactLimits::DEFAULT).await
}

async fn start_with(limits: ArtifactLimits) -> Env {
    start_tuned(move |cfg| cfg.limits = limits).await
}

/// The endpoint with its configuration changed by `tune`.
async fn start_tuned(tune: impl FnOnce(&mut ServerConfig)) -> Env {
    if crate::ON_BUILTIN_STORE {
        return serve_on_store(tune).await;
    }
    let reg = TestRegistry::start().await;
    let registry = format!("{}/jobs", reg.addr);
    serve(Some(reg), registry, tune).await
}

/// An endpoint whose registry is a closed port: any registry access is a 503.
async fn start_without_registry() -> Env {
    serve(None, "127.0.0.1:1/jobs".into(), |_| {}).await
}

async fn serve(reg: Option<TestRegistry>, registry: String, tune: impl FnOnce(&mut ServerConfig)) -> Env {
    skill_operator::tls::install_crypto_provider();
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::new(registry, KEY.to_vec());
    cfg.plain_http = true;
    tune(&mut cfg);
    cfg.spool_dir = Some(spool.path().into());
    let limits = cfg.limits;
    let state = AppState::new(cfg).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve(listener, state.clone(), std::future::pending()));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    Env { reg, store: None, addr, base: format!("http://{addr}/v1"), http, limits, state, _spool: spool }
}

/// The endpoint on its built-in store, as `artifacts --store DIR` runs it.
async fn serve_on_store(tune: impl FnOnce(&mut ServerConfig)) -> Env {
    skill_operator::tls::install_crypto_provider();
    let spool = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::with_store(store.path(), KEY.to_vec());
    cfg.seed_samples = false;
    tune(&mut cfg);
    cfg.spool_dir = Some(spool.path().into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    cfg.use_store(addr);
    let limits = cfg.limits;
    let state = AppState::new(cfg).unwrap();
    tokio::spawn(server::serve(listener, state.clone(), std::future::pending()));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    Env { reg: None, store: Some(store), addr, base: format!("http://{addr}/v1"), http, limits, state, _spool: spool }
}

fn op() -> String {
    artifacts::operator_bearer(KEY)
}

fn job(ns: &str, uid: &str) -> String {
    artifacts::job_bearer(ns, uid, &job_token(KEY, ns, uid))
}

fn csv_stats_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills/csv-stats")
}

impl Env {
    /// Where the backing keeps a blob's bytes.
    fn blob_path(&self, digest: &str) -> PathBuf {
        match (&self.reg, &self.store) {
            (Some(reg), _) => reg.blob_path(digest),
            (None, Some(store)) => store.path().join("blobs/sha256").join(digest.strip_prefix("sha256:").unwrap()),
            (None, None) => panic!("this endpoint has no backing"),
        }
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/jobs/{tail}", self.base)
    }

    fn endpoint(&self, ns: &str, uid: &str) -> Endpoint {
        Endpoint::new(&self.base, ns, uid, job_token(KEY, ns, uid)).unwrap()
    }

    async fn send(&self, method: reqwest::Method, tail: &str, auth: Option<&str>, body: Option<Vec<u8>>) -> (u16, Vec<u8>) {
        let mut req = self.http.request(method, self.url(tail));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.bytes().await.unwrap().to_vec())
    }

    async fn get(&self, tail: &str, auth: &str) -> (u16, Vec<u8>) {
        self.send(reqwest::Method::GET, tail, Some(auth), None).await
    }

    async fn put(&self, tail: &str, auth: &str, body: Vec<u8>) -> (u16, Value) {
        let (s, b) = self.send(reqwest::Method::PUT, tail, Some(auth), Some(body)).await;
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    async fn stage_package(&self, ns: &str, uid: &str) -> Vec<u8> {
        let pkg = package::build_from_dir(&csv_stats_dir()).unwrap();
        let (s, v) = self.put(&format!("{ns}/{uid}/package"), &op(), pkg.clone()).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["packageDigest"], package::digest(&pkg));
        pkg
    }

    async fn put_input(&self, ns: &str, uid: &str, path: &str, data: Vec<u8>) -> (u16, Value) {
        self.put(&format!("{ns}/{uid}/inputs/{path}"), &op(), data).await
    }
}

fn error_code(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or_else(|_| panic!("not a JSON error: {}", String::from_utf8_lossy(body)));
    v["error"]["code"].as_str().unwrap_or_else(|| panic!("no error.code in {v}")).to_string()
}

fn tar_of(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap()
}

/// The manifest `upload` would write for these entries.
fn manifest_for(ns: &str, uid: &str, entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut files: Vec<SetFile> =
        entries.iter().map(|(p, d)| SetFile { path: p.clone(), size: d.len() as u64, digest: sha256_digest(d) }).collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let m = OutputManifest {
        schema_version: 1,
        namespace: ns.into(),
        uid: uid.into(),
        complete: true,
        files,
        skipped: vec![],
        skipped_omitted: 0,
    };
    serde_json::to_vec(&m).unwrap()
}

/// An outputs batch whose manifest matches its entries.
fn outputs_tar(ns: &str, uid: &str, entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut all = entries.to_vec();
    all.push(("manifest.json".into(), manifest_for(ns, uid, entries)));
    tar_of(&all)
}

struct PodDirs {
    _root: tempfile::TempDir,
    /// The verdict channel's socket name, this pod's alone.
    verdict: String,
    package: PathBuf,
    work: PathBuf,
    tools: PathBuf,
    result: PathBuf,
    token: PathBuf,
    termination_log: PathBuf,
}

fn pod_dirs(ns: &str, uid: &str) -> PodDirs {
    let root = tempfile::tempdir().unwrap();
    let p = |n: &str| root.path().join(n);
    for d in ["package", "work", "tools", "result", "token"] {
        std::fs::create_dir(p(d)).unwrap();
    }
    std::fs::write(p("token/token"), job_token(KEY, ns, uid)).unwrap();
    PodDirs {
        package: p("package"),
        work: p("work"),
        tools: p("tools"),
        result: p("result"),
        token: p("token/token"),
        termination_log: p("termination-log"),
        verdict: format!("skill-operator-test/artifacts/{}", uuid::Uuid::new_v4().simple()),
        _root: root,
    }
}

/// The launcher's end of `d`'s verdict channel, connected as the launcher
/// connects at its start (the sidecar must be listening).
async fn launcher_connects(d: &PodDirs) -> VerdictSender {
    let name = d.verdict.clone();
    tokio::task::spawn_blocking(move || VerdictSender::connect(&name, Duration::from_secs(20))).await.unwrap().expect("the sidecar listens")
}

/// The launcher's verdict, sent as the launcher sends it.
async fn send_verdict(sender: VerdictSender, result: &LaunchResult, stdout: &[u8], stderr: &[u8]) {
    let verdict = Verdict { result: result.clone(), stdout: stdout.to_vec(), stderr: stderr.to_vec() };
    tokio::task::spawn_blocking(move || sender.send(&verdict)).await.unwrap().expect("the sidecar acknowledged the verdict");
}

/// `skill-operator fetch` as the init container runs it, into `d`.
fn fetch_command(endpoint: &str, ns: &str, uid: &str, d: &PodDirs) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(BIN);
    c.args(["fetch", "--endpoint", endpoint, "--namespace", ns, "--job", uid])
        .arg("--package")
        .arg(&d.package)
        .arg("--work")
        .arg(&d.work)
        .arg("--tools")
        .arg(&d.tools)
        .arg("--token-file")
        .arg(&d.token);
    c
}

fn fetch_opts(env: &Env, ns: &str, uid: &str, d: &PodDirs) -> FetchOptions {
    FetchOptions {
        endpoint: env.endpoint(ns, uid),
        package_dir: Some(d.package.clone()),
        work_dir: d.work.clone(),
        tools_dir: Some(d.tools.clone()),
        expect_package_digest: None,
        staged_package: None,
        skip_inputs: false,
        limits: env.limits,
        patience: Duration::ZERO,
    }
}

fn upload_opts(env: &Env, ns: &str, uid: &str, d: &PodDirs) -> UploadOptions {
    let mut o = UploadOptions::new(env.endpoint(ns, uid), d.work.clone(), d.result.join("result.json"));
    o.termination_log = Some(d.termination_log.clone());
    o.limits = env.limits;
    o.verdict_socket = d.verdict.clone();
    o.patience = Duration::ZERO;
    o
}

/// A shutdown that never fires (the result file is already there).
fn no_stop() -> skill_operator::shutdown::Shutdown {
    skill_operator::shutdown::Shutdown::new()
}

async fn outputs_manifest(env: &Env, ns: &str, uid: &str) -> (OutputManifest, Vec<u8>) {
    let (s, body) = env.get(&format!("{ns}/{uid}/outputs"), &op()).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    (serde_json::from_slice(&body).unwrap(), body)
}

/// What the launcher would do: a real run of the csv-stats script, its
/// verdict sent over the channel it connected to first.
async fn simulate_launch(d: &PodDirs, input: &str) -> std::process::Output {
    let sender = launcher_connects(d).await;
    let started = Instant::now();
    let out = tokio::process::Command::new("python3")
        .arg(d.package.join("scripts/stats.py"))
        .arg(input)
        .current_dir(&d.work)
        .output()
        .await
        .expect("python3");
    // The script's "output file": what a skill would leave in /work.
    std::fs::create_dir_all(d.work.join("out")).unwrap();
    std::fs::write(d.work.join("out/stats.json"), &out.stdout).unwrap();
    let r = LaunchResult {
        outcome: RunOutcome {
            exit_code: out.status.code(),
            duration_ms: started.elapsed().as_millis() as u64,
            stdout_bytes: out.stdout.len() as u64,
            stderr_bytes: out.stderr.len() as u64,
            ..RunOutcome::default()
        },
        error: None,
        times: None,
    };
    send_verdict(sender, &r, &out.stdout, &out.stderr).await;
    out
}

/// `upload` for job `ns/uid` on the pod directories `d`.
fn upload_command(base: &str, ns: &str, uid: &str, d: &PodDirs) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["upload", "--endpoint", base, "--namespace", ns, "--job", uid])
        .arg("--work")
        .arg(&d.work)
        .arg("--result")
        .arg(d.result.join("result.json"))
        .arg("--verdict-socket")
        .arg(&d.verdict)
        .arg("--token-file")
        .arg(&d.token)
        .arg("--termination-log")
        .arg(&d.termination_log);
    cmd
}

fn spawn_upload(env: &Env, ns: &str, uid: &str, d: &PodDirs) -> tokio::process::Child {
    upload_command(&env.base, ns, uid, d).stderr(std::process::Stdio::piped()).kill_on_drop(true).spawn().unwrap()
}

/// Wait until the sidecar says it is waiting for the result (its signal
/// handlers are installed by then), keeping its stderr drained.
async fn wait_until_waiting(child: &mut tokio::process::Child) {
    use tokio::io::AsyncBufReadExt;
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let ready = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("waiting for") {
                return;
            }
        }
        panic!("the sidecar exited before it said it was waiting");
    };
    tokio::time::timeout(Duration::from_secs(20), ready).await.expect("the sidecar did not start");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
}

fn sigterm(child: &tokio::process::Child) {
    let pid = child.id().expect("running") as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
}

async fn wait_for_file(p: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} did not appear within {within:?}", p.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// -- the round trip -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_stage_fetch_run_upload_read_back() {
    let env = start().await;
    let pkg = env.stage_package(NS, UID).await;
    let csv = std::fs::read(csv_stats_dir().join("assets/example.csv")).unwrap();
    let (s, v) = env.put_input(NS, UID, "data/input.csv", csv.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["file"]["digest"], sha256_digest(&csv));

    // fetch: the real binary, as the init container runs it.
    let d = pod_dirs(NS, UID);
    let out = fetch_command(&env.base, NS, UID, &d).arg("--package-digest").arg(package::digest(&pkg)).output().await.unwrap();
    assert!(out.status.success(), "fetch failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(d.work.join("data/input.csv")).unwrap(), csv);
    assert_eq!(
        std::fs::read(d.package.join("scripts/stats.py")).unwrap(),
        std::fs::read(csv_stats_dir().join("scripts/stats.py")).unwrap()
    );
    assert_eq!(std::fs::metadata(d.package.join("scripts/stats.py")).unwrap().permissions().mode() & 0o777, 0o755);
    let tool = d.tools.join("skill-operator");
    assert_eq!(std::fs::metadata(&tool).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read(&tool).unwrap(), std::fs::read(BIN).unwrap());

    // upload starts before the run (native sidecar) and waits for result.json
    // (had it uploaded before, the result read back below would be missing).
    let mut upload = spawn_upload(&env, NS, UID, &d);
    wait_until_waiting(&mut upload).await;
    let run = simulate_launch(&d, "data/input.csv").await;
    assert!(run.status.success(), "stats.py: {}", String::from_utf8_lossy(&run.stderr));
    let stats: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(stats["rows"], 6);

    // After uploading it stays up until the kubelet's SIGTERM: the only way
    // out of its wait is the signal, so it is still running once the log is written.
    wait_for_file(&d.termination_log, Duration::from_secs(20)).await;
    assert!(upload.try_wait().unwrap().is_none(), "the sidecar must linger until SIGTERM");
    sigterm(&upload);
    let status = tokio::time::timeout(Duration::from_secs(10), upload.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");

    // Read back through the endpoint: manifest digest = termination message.
    let line = std::fs::read_to_string(&d.termination_log).unwrap();
    let (manifest, manifest_bytes) = outputs_manifest(&env, NS, UID).await;
    assert!(line.starts_with(&format!("{} ", sha256_digest(&manifest_bytes))), "{line}");
    assert!(manifest.complete);
    assert!(manifest.skipped.is_empty(), "{:?}", manifest.skipped);
    let expected: Vec<(&str, PathBuf)> = vec![
        ("result/result.json", d.result.join("result.json")),
        ("result/stderr", d.result.join("stderr")),
        ("result/stdout", d.result.join("stdout")),
        ("work/data/input.csv", d.work.join("data/input.csv")),
        ("work/out/stats.json", d.work.join("out/stats.json")),
    ];
    assert_eq!(manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), expected.iter().map(|e| e.0).collect::<Vec<_>>());
    for (path, local) in &expected {
        let (s, body) = env.get(&format!("{NS}/{UID}/outputs/{path}"), &op()).await;
        assert_eq!(s, 200, "{path}");
        assert_eq!(body, std::fs::read(local).unwrap(), "{path} differs");
    }
    let result: LaunchResult = serde_json::from_slice(&env.get(&format!("{NS}/{UID}/outputs/result/result.json"), &op()).await.1).unwrap();
    assert_eq!(result.outcome.exit_code, Some(0));
}

// -- integrity ----------------------------------------------------------------

fn tamper(env: &Env, digest: &str) {
    let p = env.blob_path(digest);
    let mut b = std::fs::read(&p).unwrap();
    let last = b.len() - 1;
    b[last] ^= 0xff;
    std::fs::write(&p, b).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_input_blob_fails_fetch_with_a_digest_error() {
    let env = start().await;
    env.stage_package(NS, UID).await;
    let data = b"a,b\n1,2\n".to_vec();
    assert_eq!(env.put_input(NS, UID, "in.csv", data.clone()).await.0, 200);
    tamper(&env, &sha256_digest(&data));

    let d = pod_dirs(NS, UID);
    let err = client::fetch(&fetch_opts(&env, NS, UID, &d)).await.unwrap_err();
    match &err {
        ClientError::Endpoint { status: 502, code, .. } => assert_eq!(code, "digest_mismatch"),
        other => panic!("expected a digest error, got {other}"),
    }
    assert!(err.to_string().contains("digest"), "{err}");
    assert!(!d.work.join("in.csv").exists(), "nothing of a corrupt file is left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_package_blob_fails_fetch_with_a_digest_error() {
    let env = start().await;
    let pkg = env.stage_package(NS, UID).await;
    tamper(&env, &package::digest(&pkg));
    let d = pod_dirs(NS, UID);
    let err = client::fetch(&fetch_opts(&env, NS, UID, &d)).await.unwrap_err();
    assert!(matches!(&err, ClientError::Endpoint { status: 502, code, .. } if code == "digest_mismatch"), "{err}");
    assert!(std::fs::read_dir(&d.package).unwrap().next().is_none(), "nothing unpacked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_checks_the_expected_package_digest() {
    let env = start().await;
    env.stage_package(NS, UID).await;
    let d = pod_dirs(NS, UID);
    let mut o = fetch_opts(&env, NS, UID, &d);
    o.expect_package_digest = Some(format!("sha256:{}", "0".repeat(64)));
    let err = client::fetch(&o).await.unwrap_err();
    assert!(matches!(err, ClientError::DigestMismatch { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_pinned_to_a_replaced_set_are_409() {
    let env = start().await;
    assert_eq!(env.put_input(NS, UID, "a.txt", b"one".to_vec()).await.0, 200);
    let (_, body) = env.get(&format!("{NS}/{UID}/inputs"), &job(NS, UID)).await;
    let m: InputsManifest = serde_json::from_slice(&body).unwrap();
    let pin = m.digest.unwrap();
    let (s, _) = env.get(&format!("{NS}/{UID}/inputs/a.txt?set={pin}"), &job(NS, UID)).await;
    assert_eq!(s, 200);
    assert_eq!(env.put_input(NS, UID, "a.txt", b"two".to_vec()).await.0, 200);
    let (s, body) = env.get(&format!("{NS}/{UID}/inputs/a.txt?set={pin}"), &job(NS, UID)).await;
    assert_eq!((s, error_code(&body).as_str()), (409, "set_changed"));
    let (s, body) = env.get(&format!("{NS}/{UID}/inputs/a.txt"), &job(NS, UID)).await;
    assert_eq!((s, body.as_slice()), (200, b"two".as_slice()));
}

/// Issue 14: an operator PUT that names its body's digest in
/// `X-Content-Digest` is refused (400, both digests named) when the body
/// differs, and nothing is stored; the right digest is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_with_a_wrong_content_digest_is_refused_before_anything_is_stored() {
    let env = start().await;
    let body = b"the real bytes".to_vec();
    let real = sha256_digest(&body);
    let claimed = sha256_digest(b"something else");
    let put = |digest: String, body: Vec<u8>, path: &'static str| {
        let req = env
            .http
            .put(env.url(&format!("{NS}/{UID}/inputs/{path}")))
            .header("authorization", op())
            .header(artifacts::HEADER_CONTENT_DIGEST, digest)
            .body(body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, v) = put(claimed.clone(), body.clone(), "a.txt").await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "content_digest_mismatch");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(&real) && message.contains(&claimed), "both digests named: {message}");
    // Nothing reached the registry: the job has no inputs at all.
    let (_, listed) = env.get(&format!("{NS}/{UID}/inputs"), &op()).await;
    let m: InputsManifest = serde_json::from_slice(&listed).unwrap();
    assert!(m.digest.is_none() && m.files.is_empty(), "{m:?}");
    // A header that is no digest is refused too; the right one passes.
    let (s, v) = put("md5:abc".into(), body.clone(), "a.txt").await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("content_digest_mismatch")), "{v}");
    let (s, v) = put(real.clone(), body.clone(), "a.txt").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["file"]["digest"], real);
    // The package route checks it the same way.
    let pkg = package::build_from_dir(&csv_stats_dir()).unwrap();
    let req = env
        .http
        .put(env.url(&format!("{NS}/{UID}/package")))
        .header("authorization", op())
        .header(artifacts::HEADER_CONTENT_DIGEST, claimed.clone())
        .body(pkg);
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let (s, _) = env.get(&format!("{NS}/{UID}/package"), &op()).await;
    assert_eq!(s, 404, "no package was stored");
}

// -- caps ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_file_cap_at_the_real_32_mib_edge() {
    let env = start().await;
    let (s, v) = env.put_input(NS, UID, "exact.bin", vec![7u8; (32 * MIB) as usize]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["file"]["size"], 32 * MIB);
    let (s, v) = env.put_input(NS, UID, "over.bin", vec![7u8; (32 * MIB + 1) as usize]).await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["error"]["code"], "body_too_large");
    // Nothing of the refused file reached the set.
    let (_, body) = env.get(&format!("{NS}/{UID}/inputs"), &op()).await;
    let m: InputsManifest = serde_json::from_slice(&body).unwrap();
    assert_eq!(m.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["exact.bin"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_file_cap_at_the_real_32_mib_edge() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    std::fs::File::create(d.work.join("exact.bin")).unwrap().set_len(32 * MIB).unwrap();
    std::fs::File::create(d.work.join("over.bin")).unwrap().set_len(32 * MIB + 1).unwrap();
    write_result(&d.result, b"{}").unwrap();
    let r = client::upload(&upload_opts(&env, NS, UID, &d), &no_stop()).await.unwrap().expect("uploaded");
    let paths: Vec<&str> = r.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["result/result.json", "work/exact.bin"]);
    assert_eq!(r.manifest.files[1].size, 32 * MIB);
    assert_eq!(r.manifest.skipped.len(), 1);
    assert_eq!(r.manifest.skipped[0].path, "work/over.bin");
    assert_eq!(r.manifest.skipped[0].reason, SkipReason::FileTooLarge);
    assert_eq!(r.manifest.skipped[0].size, Some(32 * MIB + 1));
    let (stored, _) = outputs_manifest(&env, NS, UID).await;
    assert_eq!(stored, r.manifest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_count_cap_at_the_real_2000_edge_for_inputs_and_fetch() {
    let env = start().await;
    env.stage_package(NS, UID).await;
    let files = |n: usize| (0..n).map(|i| (format!("d{}/f{i:04}.txt", i % 10), b"x\n".to_vec())).collect::<Vec<_>>();
    let (s, v) = env.put(&format!("{NS}/{UID}/inputs"), &op(), tar_of(&files(2001))).await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["error"]["code"], "too_many_files");
    let (s, v) = env.put(&format!("{NS}/{UID}/inputs"), &op(), tar_of(&files(2000))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["files"].as_array().unwrap().len(), 2000);

    let started = Instant::now();
    let d = pod_dirs(NS, UID);
    let r = client::fetch(&fetch_opts(&env, NS, UID, &d)).await.unwrap();
    assert_eq!(r.inputs.len(), 2000);
    assert_eq!(std::fs::read(d.work.join("d9/f1999.txt")).unwrap(), b"x\n");
    eprintln!("fetched 2,000 inputs in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_file_count_cap_at_the_real_2000_edge() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    for i in 0..2001 {
        let dir = d.work.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i:04}.txt")), b"y").unwrap();
    }
    write_result(&d.result, b"{}").unwrap();
    let r = client::upload(&upload_opts(&env, NS, UID, &d), &no_stop()).await.unwrap().expect("uploaded");
    let work = r.manifest.files.iter().filter(|f| f.path.starts_with("work/")).count();
    assert_eq!(work, 2000, "2,000 files are accepted by the endpoint");
    assert_eq!(r.manifest.skipped.len(), 1);
    assert_eq!(r.manifest.skipped[0].reason, SkipReason::FileLimit);
    assert_eq!(r.manifest.skipped[0].path, "work/d9/f1999.txt", "the last in walk order");
    assert_eq!(outputs_manifest(&env, NS, UID).await.0, r.manifest);
}

fn small_limits() -> ArtifactLimits {
    ArtifactLimits { max_file_bytes: 600, max_total_bytes: 1000, max_files: 3, ..ArtifactLimits::DEFAULT }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_caps_at_small_configured_edges() {
    let env = start_with(small_limits()).await;
    let e = |p: &str, n: usize| (p.to_string(), vec![b'z'; n]);
    let inputs = format!("{NS}/{UID}/inputs");
    let outputs = format!("{NS}/{UID}/outputs");
    let work = |v: Vec<(String, Vec<u8>)>| v.into_iter().map(|(p, d)| (format!("work/{p}"), d)).collect::<Vec<_>>();
    let jb = job(NS, UID);
    // total: 1000 ok, 1001 refused
    assert_eq!(env.put(&inputs, &op(), tar_of(&[e("a", 600), e("b", 400)])).await.0, 200);
    let (s, v) = env.put(&inputs, &op(), tar_of(&[e("a", 600), e("b", 401)])).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("total_too_large")));
    assert_eq!(env.put(&outputs, &jb, outputs_tar(NS, UID, &work(vec![e("a", 600), e("b", 400)]))).await.0, 200);
    let (s, v) = env.put(&outputs, &jb, outputs_tar(NS, UID, &work(vec![e("a", 600), e("b", 401)]))).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("total_too_large")));
    // per file: 600 ok, 601 refused
    let (s, v) = env.put(&outputs, &jb, outputs_tar(NS, UID, &work(vec![e("a", 601)]))).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("file_too_large")));
    let (s, v) = env.put_input(NS, UID, "one", vec![1; 601]).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("body_too_large")));
    // count: 3 ok, 4 refused
    let three = vec![e("a", 1), e("b", 1), e("c", 1)];
    let mut four = three.clone();
    four.push(e("d", 1));
    assert_eq!(env.put(&inputs, &op(), tar_of(&three)).await.0, 200);
    let (s, v) = env.put(&inputs, &op(), tar_of(&four)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("too_many_files")));
    assert_eq!(env.put(&outputs, &jb, outputs_tar(NS, UID, &work(three))).await.0, 200);
    let (s, v) = env.put(&outputs, &jb, outputs_tar(NS, UID, &work(four))).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("too_many_files")));
    // a single input PUT that would make a fourth file
    let (s, v) = env.put_input(NS, UID, "d", vec![1]).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("too_many_files")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_reports_total_and_count_caps_at_small_configured_edges() {
    let env = start_with(small_limits()).await;
    let d = pod_dirs(NS, UID);
    std::fs::write(d.work.join("a"), vec![1u8; 600]).unwrap();
    std::fs::write(d.work.join("b"), vec![2u8; 401]).unwrap(); // 1001 > total
    std::fs::write(d.work.join("c"), vec![3u8; 400]).unwrap(); // fits: 1000
    std::fs::write(d.work.join("d"), vec![4u8; 0]).unwrap();
    std::fs::write(d.work.join("e"), vec![5u8; 0]).unwrap(); // fourth file
    std::fs::write(d.work.join("f"), vec![5u8; 601]).unwrap(); // over per-file
    write_result(&d.result, b"{}").unwrap();
    let r = client::upload(&upload_opts(&env, NS, UID, &d), &no_stop()).await.unwrap().expect("uploaded");
    let taken: Vec<&str> = r.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(taken, ["result/result.json", "work/a", "work/c", "work/d"]);
    let skipped: Vec<(&str, SkipReason)> = r.manifest.skipped.iter().map(|s| (s.path.as_str(), s.reason)).collect();
    assert_eq!(skipped, [("work/b", SkipReason::TotalTooLarge), ("work/e", SkipReason::FileLimit), ("work/f", SkipReason::FileTooLarge)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_refuses_an_announced_set_over_its_own_caps_before_downloading() {
    let env = start().await;
    env.stage_package(NS, UID).await;
    assert_eq!(env.put_input(NS, UID, "big.bin", vec![0; 700]).await.0, 200);
    let d = pod_dirs(NS, UID);
    let mut o = fetch_opts(&env, NS, UID, &d);
    o.limits = small_limits();
    let err = client::fetch(&o).await.unwrap_err();
    assert!(matches!(err, ClientError::TooLarge { .. }), "{err}");
    assert!(!d.work.join("big.bin").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_batch_must_match_its_manifest() {
    let env = start().await;
    let jb = job(NS, UID);
    let url = format!("{NS}/{UID}/outputs");
    let good = vec![("work/a".to_string(), b"aaa".to_vec())];
    let manifest = manifest_for(NS, UID, &good);
    // an entry the manifest does not list
    let unlisted = vec![
        ("work/a".to_string(), b"aaa".to_vec()),
        ("work/unlisted".to_string(), b"x".to_vec()),
        ("manifest.json".to_string(), manifest.clone()),
    ];
    let (s, v) = env.put(&url, &jb, tar_of(&unlisted)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("manifest_mismatch")));
    // changed content under the same manifest
    let (s, v) = env.put(&url, &jb, tar_of(&[("work/a".into(), b"aab".to_vec()), ("manifest.json".into(), manifest)])).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("manifest_mismatch")));
    // no manifest
    let (s, v) = env.put(&url, &jb, tar_of(&good)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_manifest")));
    // a manifest about another job
    let (s, v) = env.put(&url, &jb, outputs_tar(NS, OTHER_UID, &good)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_manifest")));
    // entries outside result/ and work/
    let (s, v) = env.put(&url, &jb, outputs_tar(NS, UID, &[("etc/x".into(), b"x".to_vec())])).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_path")));
    // not a tar
    let (s, v) = env.put(&url, &jb, b"not a tar at all".repeat(64)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_tar")));
    // and the good one passes
    assert_eq!(env.put(&url, &jb, outputs_tar(NS, UID, &good)).await.0, 200);
}

// -- credentials --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_are_401() {
    let env = start().await;
    let url = format!("{NS}/{UID}/inputs");
    let (s, body) = env.send(reqwest::Method::GET, &url, None, None).await;
    assert_eq!((s, error_code(&body).as_str()), (401, "unauthorized"));
    let other_key = job_token(b"another key, another cluster, 32+ bytes", NS, UID);
    let mismatched = job_token(KEY, NS, OTHER_UID);
    for bad in [
        "Bearer".to_string(),
        "Bearer garbage".to_string(),
        format!("Basic {}", job_token(KEY, NS, UID)),
        format!("Bearer job:{NS}:{UID}:{other_key}"),
        format!("Bearer job:{NS}:{UID}:{mismatched}"),
        format!("Bearer job:{NS}:{UID}"),
        format!("Bearer {other_key}"),
        format!("Bearer operator:{}", job_token(KEY, NS, UID)),
        format!("Bearer operator:{}", artifacts::operator_token(b"another key, another cluster, 32+ bytes")),
    ] {
        let (s, body) = env.get(&url, &bad).await;
        assert_eq!((s, error_code(&body).as_str()), (401, "unauthorized"), "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_jobs_token_and_the_wrong_role_are_403() {
    let env = start().await;
    let mine = format!("{NS}/{UID}");
    // a genuine token of another job (named form)
    for (tail, method) in [("inputs", reqwest::Method::GET), ("package", reqwest::Method::GET), ("outputs", reqwest::Method::PUT)] {
        let (s, body) = env.send(method, &format!("{mine}/{tail}"), Some(&job(NS, OTHER_UID)), Some(vec![])).await;
        assert_eq!((s, error_code(&body).as_str()), (403, "forbidden"), "{tail}");
    }
    let (s, _) = env.get(&format!("{mine}/inputs"), &job("team-b", UID)).await;
    assert_eq!(s, 403, "same uid, other namespace");
    // a job's own token on operator routes
    let jb = job(NS, UID);
    for (method, tail) in [
        (reqwest::Method::PUT, format!("{mine}/inputs/x")),
        (reqwest::Method::PUT, format!("{mine}/inputs")),
        (reqwest::Method::PUT, format!("{mine}/package")),
        (reqwest::Method::GET, format!("{mine}/outputs")),
        (reqwest::Method::GET, format!("{mine}/outputs/work/x")),
        (reqwest::Method::DELETE, mine.clone()),
    ] {
        let (s, body) = env.send(method.clone(), &tail, Some(&jb), Some(b"x".to_vec())).await;
        assert_eq!((s, error_code(&body).as_str()), (403, "forbidden"), "{method} {tail}");
    }
    // the operator does not write outputs
    let (s, body) = env.send(reqwest::Method::PUT, &format!("{mine}/outputs"), Some(&op()), Some(vec![])).await;
    assert_eq!((s, error_code(&body).as_str()), (403, "forbidden"));
    // the right credentials pass (bare token too)
    assert_eq!(env.get(&format!("{mine}/inputs"), &jb).await.0, 200);
    assert_eq!(env.get(&format!("{mine}/inputs"), &format!("Bearer {}", job_token(KEY, NS, UID))).await.0, 200);
    assert_eq!(env.get(&format!("{mine}/inputs"), &op()).await.0, 200);
}

// -- paths --------------------------------------------------------------------

async fn raw_request(addr: SocketAddr, method: &str, target: &str, auth: &str) -> (u16, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req =
        format!("{method} {target} HTTP/1.1\r\nHost: test\r\nAuthorization: {auth}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.unwrap();
    let text = String::from_utf8_lossy(&resp);
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").as_bytes().to_vec();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_paths_are_400_before_any_registry_access() {
    // The registry is a closed port: reaching it would answer 503.
    let env = start_without_registry().await;
    let (s, _) = env.get(&format!("{NS}/{UID}/inputs/ok.txt"), &job(NS, UID)).await;
    assert_eq!(s, 503, "a good path does reach the (absent) registry");
    let jb = job(NS, UID);
    let hostile = [
        "../../etc/passwd",
        "a/../../b",
        "%2e%2e/etc/passwd",
        "a/%2E%2E/%2e%2e/b",
        "..%2fsecret",
        "%2fetc%2fpasswd",
        "a//b",
        "./a",
        "a%5c..%5cb",
        "a%00b",
        "%252e%252e/x",
        "C:%5cwin.ini",
        "%ff%fe",
    ];
    for p in hostile {
        for (method, prefix, auth) in [("GET", "inputs", &jb), ("PUT", "inputs", &op()), ("GET", "outputs", &op())] {
            let target = format!("/v1/jobs/{NS}/{UID}/{prefix}/{p}");
            let (s, body) = raw_request(env.addr, method, &target, auth).await;
            assert_eq!(s, 400, "{method} {target}: {}", String::from_utf8_lossy(&body));
            assert_eq!(error_code(&body), "bad_path", "{method} {target}");
        }
    }
    // Bad names in the job segments, too.
    for target in ["/v1/jobs/Team_A/uid/inputs", "/v1/jobs/team/a:b/inputs", "/v1/jobs/team/%2e%2e/inputs"] {
        let (s, body) = raw_request(env.addr, "GET", target, &jb).await;
        assert_eq!((s, error_code(&body).as_str()), (400, "bad_job"), "{target}");
    }
}

// -- upload -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_skips_symlinks_and_special_files_and_reports_them() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    std::os::unix::fs::symlink("/etc/passwd", d.work.join("out")).unwrap();
    std::os::unix::fs::symlink("/etc", d.work.join("etc-link")).unwrap();
    std::os::unix::fs::symlink(&d.token, d.work.join("token")).unwrap();
    std::fs::create_dir(d.work.join("real")).unwrap();
    std::fs::write(d.work.join("real/kept.txt"), b"kept").unwrap();
    let fifo = std::ffi::CString::new(d.work.join("real/pipe").as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    // A symlinked stdout next to the result (the run container could plant it).
    std::os::unix::fs::symlink(&d.token, d.result.join("stdout")).unwrap();
    write_result(&d.result, b"{}").unwrap();

    let r = client::upload(&upload_opts(&env, NS, UID, &d), &no_stop()).await.unwrap().expect("uploaded");
    let taken: Vec<&str> = r.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(taken, ["result/result.json", "work/real/kept.txt"]);
    let mut skipped: Vec<(&str, SkipReason)> = r.manifest.skipped.iter().map(|s| (s.path.as_str(), s.reason)).collect();
    skipped.sort_by_key(|s| s.0);
    assert_eq!(
        skipped,
        [
            ("result/stdout", SkipReason::Symlink),
            ("work/etc-link", SkipReason::Symlink),
            ("work/out", SkipReason::Symlink),
            ("work/real/pipe", SkipReason::NotRegular),
            ("work/token", SkipReason::Symlink),
        ]
    );
    let (s, _) = env.get(&format!("{NS}/{UID}/outputs/work/out"), &op()).await;
    assert_eq!(s, 404);
    let (stored, _) = outputs_manifest(&env, NS, UID).await;
    assert_eq!(stored, r.manifest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_skips_names_it_could_not_serve_back_and_case_collisions() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    // `cafe\u{301}.txt` (NFD) and `caf\u{e9}.txt` (NFC) are one name to the endpoint.
    for name in ["100%.txt", " padded", "line\nbreak", "A.txt", "a.txt", "ok.txt", "cafe\u{301}.txt", "caf\u{e9}.txt"] {
        std::fs::write(d.work.join(name), name.as_bytes()).unwrap();
    }
    let bad_utf8 = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
    std::fs::write(d.work.join(bad_utf8), b"latin-1").unwrap();
    std::fs::create_dir(d.work.join("Dir")).unwrap();
    std::fs::write(d.work.join("Dir/x"), b"x").unwrap();
    std::fs::create_dir(d.work.join("dir")).unwrap();
    std::fs::write(d.work.join("dir/y"), b"y").unwrap();
    write_result(&d.result, b"{}").unwrap();
    let r = client::upload(&upload_opts(&env, NS, UID, &d), &no_stop()).await.unwrap().expect("uploaded");
    let taken: Vec<&str> = r.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(taken, ["result/result.json", "work/A.txt", "work/Dir/x", "work/cafe\u{301}.txt", "work/ok.txt"]);
    let mut skipped: Vec<(String, SkipReason)> = r.manifest.skipped.iter().map(|s| (s.path.clone(), s.reason)).collect();
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        skipped,
        [
            ("work/ padded".to_string(), SkipReason::BadName),
            ("work/100%.txt".to_string(), SkipReason::BadName),
            ("work/a.txt".to_string(), SkipReason::CaseCollision),
            ("work/caf\u{e9}.txt".to_string(), SkipReason::CaseCollision),
            ("work/caf\u{fffd}.txt".to_string(), SkipReason::BadName),
            ("work/dir/y".to_string(), SkipReason::CaseCollision),
            ("work/line\nbreak".to_string(), SkipReason::BadName),
        ]
    );
    // Everything taken reads back.
    for f in &r.manifest.files {
        let (s, _) = env.get(&format!("{NS}/{UID}/outputs/{}", f.path), &op()).await;
        assert_eq!(s, 200, "{}", f.path);
    }
}

/// The launcher's result, written as the launcher writes it: whole, by a
/// rename, so the sidecar polling for it never reads half of it.
fn write_result(dir: &std::path::Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    let tmp = dir.join(".result.json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, dir.join("result.json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_on_sigterm_of_a_cancelled_run_uploads_nothing_and_exits_0() {
    // Issue 8: a cancelled run's outputs were still uploaded as a result.
    let env = start().await;
    let d = pod_dirs(NS, UID);
    std::fs::write(d.work.join("partial.txt"), b"half done").unwrap();
    let mut upload = spawn_upload(&env, NS, UID, &d);
    wait_until_waiting(&mut upload).await;
    let launcher = launcher_connects(&d).await;
    sigterm(&upload);
    // The launcher, stopped at the same moment, sends its cancelled verdict a little later.
    let cancelled = LaunchResult { outcome: RunOutcome { cancelled: true, ..RunOutcome::default() }, error: None, times: None };
    send_verdict(launcher, &cancelled, b"", b"killed?").await;
    let status = tokio::time::timeout(Duration::from_secs(15), upload.wait()).await.expect("exits after SIGTERM").unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let (s, _) = env.get(&format!("{NS}/{UID}/outputs"), &op()).await;
    assert_eq!(s, 404, "nothing was stored for a cancelled run");
    let line = std::fs::read_to_string(&d.termination_log).unwrap();
    assert!(line.starts_with("cancelled:"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_stopped_with_no_result_at_all_uploads_nothing() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    std::fs::write(d.work.join("partial.txt"), b"half done").unwrap();
    let stop = skill_operator::shutdown::Shutdown::new();
    stop.trigger();
    let o = upload_opts(&env, NS, UID, &d);
    assert!(client::upload(&o, &stop).await.unwrap().is_none());
    let (s, _) = env.get(&format!("{NS}/{UID}/outputs"), &op()).await;
    assert_eq!(s, 404);
    assert!(std::fs::read_to_string(&d.termination_log).unwrap().starts_with("no result:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_message_stays_under_4_kib() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    // Many skipped files with long names: the manifest grows, the line does not.
    for i in 0..1200 {
        let name = format!("{i:04}-{}", "n".repeat(200));
        std::os::unix::fs::symlink("/etc/passwd", d.work.join(name)).unwrap();
    }
    write_result(&d.result, b"{}").unwrap();
    let r = client::upload(&upload_opts(&env, NS, UID, &d), &no_stop()).await.unwrap().expect("uploaded");
    assert_eq!(r.manifest.skipped.len(), ArtifactLimits::DEFAULT.max_skipped_listed);
    assert_eq!(r.manifest.skipped_omitted, 200);
    let line = std::fs::read_to_string(&d.termination_log).unwrap();
    assert!(line.len() < 4096, "{} bytes", line.len());
    assert!(line.ends_with("skipped=1200 complete=true"), "{line}");

    // A failure's message is cut below 4 KiB as well.
    let down = start_without_registry().await;
    let long_uid = "u".repeat(48);
    let d2 = pod_dirs(NS, &long_uid);
    std::fs::write(d2.result.join("result.json"), b"{}").unwrap();
    let mut o = upload_opts(&down, NS, &long_uid, &d2);
    o.endpoint =
        Endpoint::new(format!("http://127.0.0.1:1/v1/{}", "p".repeat(8000)), NS, &long_uid, job_token(KEY, NS, &long_uid)).unwrap();
    let err = client::upload(&o, &no_stop()).await.unwrap_err();
    let line = std::fs::read_to_string(&d2.termination_log).unwrap();
    assert!(line.starts_with("error: "), "{line}");
    assert!(line.len() < 4096, "{} bytes for {err}", line.len());
}

// -- an endpoint that is down ---------------------------------------------------

/// A port in front of the endpoint that first drops every connection it
/// accepts (an endpoint whose pod is going: the Service still routes, the
/// process is gone), and from `up` on forwards to the real endpoint.
/// Counts the connections it dropped.
async fn flaky_front(env: &Env, up: tokio::sync::watch::Receiver<bool>) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap();
    let dropped = std::sync::Arc::new(AtomicUsize::new(0));
    let (target, counter) = (env.addr, dropped.clone());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            if !*up.borrow() {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(conn);
                continue;
            }
            tokio::spawn(async move {
                let mut back = tokio::net::TcpStream::connect(target).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut back).await;
            });
        }
    });
    (format!("http://{front}/v1"), dropped)
}

/// Whether the front has dropped `n` connections within 10 s.
async fn dropped_at_least(dropped: &std::sync::atomic::AtomicUsize, n: usize) -> bool {
    for _ in 0..400 {
        if dropped.load(std::sync::atomic::Ordering::SeqCst) >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_waits_out_an_endpoint_that_is_down_and_stores_the_outputs_once_it_is_back() {
    let env = start().await;
    let (up_tx, up_rx) = tokio::sync::watch::channel(false);
    let (base, dropped) = flaky_front(&env, up_rx).await;
    let d = pod_dirs(NS, UID);
    std::fs::write(d.work.join("out.txt"), b"the run's work").unwrap();
    write_result(&d.result, b"{}").unwrap();
    let mut o = upload_opts(&env, NS, UID, &d);
    o.endpoint = Endpoint::new(base, NS, UID, job_token(KEY, NS, UID)).unwrap();
    o.patience = client::ENDPOINT_PATIENCE;
    let upload = tokio::spawn(async move { client::upload(&o, &no_stop()).await });
    // Down for three attempts (one at once, then after 0.5 s and 1 s), then back.
    assert!(dropped_at_least(&dropped, 3).await, "the upload was not retried while the endpoint was down");
    up_tx.send(true).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(30), upload).await.unwrap().unwrap().unwrap().expect("uploaded");
    assert_eq!(r.manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["result/result.json", "work/out.txt"]);
    let (s, body) = env.get(&format!("{NS}/{UID}/outputs/work/out.txt"), &op()).await;
    assert_eq!((s, body.as_slice()), (200, b"the run's work".as_slice()));
    let line = std::fs::read_to_string(&d.termination_log).unwrap();
    assert!(line.starts_with("sha256:"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_waits_out_an_endpoint_that_is_down_and_gets_the_package_once_it_is_back() {
    let env = start().await;
    let pkg = env.stage_package(NS, UID).await;
    assert_eq!(env.put_input(NS, UID, "in.txt", b"an input".to_vec()).await.0, 200);
    let (up_tx, up_rx) = tokio::sync::watch::channel(false);
    let (base, dropped) = flaky_front(&env, up_rx).await;
    let d = pod_dirs(NS, UID);
    let mut o = fetch_opts(&env, NS, UID, &d);
    o.endpoint = Endpoint::new(base, NS, UID, job_token(KEY, NS, UID)).unwrap();
    o.patience = client::ENDPOINT_PATIENCE;
    // Polled together in this task (the fetch borrows its options).
    let bring_up = async {
        let retried = dropped_at_least(&dropped, 3).await;
        up_tx.send(true).unwrap();
        retried
    };
    let (fetched, retried) =
        tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(client::fetch(&o), bring_up) }).await.unwrap();
    assert!(retried, "the fetch was not retried while the endpoint was down");
    let r = fetched.unwrap();
    assert_eq!(r.package_digest.as_deref(), Some(package::digest(&pkg).as_str()));
    assert_eq!(std::fs::read(d.work.join("in.txt")).unwrap(), b"an input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_gives_up_after_its_patience_naming_the_endpoint() {
    use std::sync::atomic::Ordering;
    let env = start().await;
    env.stage_package(NS, UID).await;
    let (_never_up, up_rx) = tokio::sync::watch::channel(false);
    let (base, dropped) = flaky_front(&env, up_rx).await;
    let d = pod_dirs(NS, UID);
    let mut o = fetch_opts(&env, NS, UID, &d);
    o.endpoint = Endpoint::new(base, NS, UID, job_token(KEY, NS, UID)).unwrap();
    o.patience = Duration::from_millis(3000);
    let err = client::fetch(&o).await.unwrap_err();
    assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
    assert!(err.to_string().starts_with("cannot reach the artifact endpoint"), "{err}");
    assert_eq!(dropped.load(Ordering::SeqCst), 3, "attempts within the patience");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_gives_up_after_its_patience_and_says_the_endpoint_cannot_be_reached() {
    use std::sync::atomic::Ordering;
    let env = start().await;
    let (_never_up, up_rx) = tokio::sync::watch::channel(false);
    let (base, dropped) = flaky_front(&env, up_rx).await;
    let d = pod_dirs(NS, UID);
    write_result(&d.result, b"{}").unwrap();
    let mut o = upload_opts(&env, NS, UID, &d);
    o.endpoint = Endpoint::new(base, NS, UID, job_token(KEY, NS, UID)).unwrap();
    // Room for the attempts at 0, 0.5 and 1.5 s; the next (at 3.5 s) is past it.
    o.patience = Duration::from_millis(3000);
    let err = client::upload(&o, &no_stop()).await.unwrap_err();
    assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
    assert_eq!(dropped.load(Ordering::SeqCst), 3, "attempts within the patience");
    let line = std::fs::read_to_string(&d.termination_log).unwrap();
    assert!(line.starts_with("error: cannot reach the artifact endpoint"), "{line}");
    // Nothing was stored: the run cannot be recorded as having outputs.
    let (s, _) = env.get(&format!("{NS}/{UID}/outputs"), &op()).await;
    assert_eq!(s, 404);
}

// -- lifecycle ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_one_jobs_artifacts_only() {
    let env = start().await;
    for uid in [UID, OTHER_UID] {
        env.stage_package(NS, uid).await;
        // identical content in both jobs
        assert_eq!(env.put_input(NS, uid, "same.txt", b"same".to_vec()).await.0, 200);
        let (s, v) =
            env.put(&format!("{NS}/{uid}/outputs"), &job(NS, uid), outputs_tar(NS, uid, &[("work/o".into(), b"o".to_vec())])).await;
        assert_eq!(s, 200, "{v}");
    }
    let (s, body) = env.send(reqwest::Method::DELETE, &format!("{NS}/{UID}"), Some(&op()), None).await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["deleted"], serde_json::json!(["package", "inputs", "outputs"]));
    assert_eq!(env.get(&format!("{NS}/{UID}/package"), &op()).await.0, 404);
    assert_eq!(env.get(&format!("{NS}/{UID}/outputs"), &op()).await.0, 404);
    let (_, body) = env.get(&format!("{NS}/{UID}/inputs"), &op()).await;
    assert_eq!(serde_json::from_slice::<InputsManifest>(&body).unwrap(), InputsManifest { digest: None, files: vec![] });
    // The other job keeps everything.
    assert_eq!(env.get(&format!("{NS}/{OTHER_UID}/package"), &op()).await.0, 200);
    assert_eq!(env.get(&format!("{NS}/{OTHER_UID}/inputs/same.txt"), &op()).await, (200, b"same".to_vec()));
    assert_eq!(env.get(&format!("{NS}/{OTHER_UID}/outputs/work/o"), &op()).await, (200, b"o".to_vec()));
    // Deleting again is fine and deletes nothing.
    let (s, body) = env.send(reqwest::Method::DELETE, &format!("{NS}/{UID}"), Some(&op()), None).await;
    assert_eq!(s, 200);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["deleted"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_without_a_staged_package_is_a_clear_404() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    let err = client::fetch(&fetch_opts(&env, NS, UID, &d)).await.unwrap_err();
    assert!(matches!(&err, ClientError::Endpoint { status: 404, .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness() {
    let env = start().await;
    let http = &env.http;
    let get = |p: &'static str, a: SocketAddr| async move { http.get(format!("http://{a}{p}")).send().await.unwrap().status().as_u16() };
    assert_eq!(get("/healthz", env.addr).await, 200);
    assert_eq!(get("/readyz", env.addr).await, 200);
    let down = start_without_registry().await;
    assert_eq!(get("/healthz", down.addr).await, 200);
    assert_eq!(get("/readyz", down.addr).await, 503);
    // Not ready while the sample SkillPackages are on their way: `helm
    // install --wait` returns once they exist.
    env.state.samples_pending();
    let pending = http.get(format!("http://{}/readyz", env.addr)).send().await.unwrap();
    assert_eq!(pending.status().as_u16(), 503);
    assert_eq!(error_code(&pending.bytes().await.unwrap()), "starting");
    assert_eq!(get("/healthz", env.addr).await, 200, "alive all along");
    env.state.samples_applied();
    assert_eq!(get("/readyz", env.addr).await, 200);
    let (s, body) = env.get("x/y/z/w", &op()).await;
    assert_eq!((s, error_code(&body).as_str()), (404, "not_found"));
}

/// The controller's view of a job's inputs, through the real endpoint and
/// registry, is what it compares with `spec.inputs` before a Job may start.
#[tokio::test]
async fn the_controller_reads_staged_inputs_and_matches_them_against_the_spec() {
    use skill_operator::controller::context::{ArtifactStore, HttpArtifacts};
    use skill_operator::controller::decide::inputs_mismatch;
    let env = start().await;
    let store = HttpArtifacts::new(&env.base, KEY);
    assert!(store.staged_inputs(NS, UID).await.unwrap().is_empty(), "a job with nothing staged has no inputs");
    let data = b"a,b\n1,2\n".to_vec();
    let (s, v) = env.put_input(NS, UID, "data.csv", data.clone()).await;
    assert_eq!(s, 200, "{v}");
    let staged = store.staged_inputs(NS, UID).await.unwrap();
    let named = skill_operator::api::job::InputFile { path: "data.csv".into(), digest: package::digest(&data), size: data.len() as u64 };
    assert_eq!(inputs_mismatch(std::slice::from_ref(&named), &staged), None);
    let other = skill_operator::api::job::InputFile { digest: package::digest(b"other"), ..named };
    assert!(inputs_mismatch(&[other], &staged).unwrap().contains("data.csv differs"));
}

/// `fetch` with `argv` inside a bubblewrap view of this machine that has no
/// CA bundle anywhere rustls or OpenSSL would look for one.
fn fetch_without_ca_bundle(args: &[String]) -> Option<std::process::Output> {
    let Some(bwrap) = skill_operator::runner::sandbox::detect_bwrap() else {
        skill_operator::gated::skip("fetch without a CA bundle", "bwrap not installed (apt-get install bubblewrap)");
        return None;
    };
    let mut cmd = std::process::Command::new(bwrap);
    cmd.args(["--dev-bind", "/", "/"]);
    for dir in ["/etc/ssl", "/usr/lib/ssl", "/usr/share/ca-certificates", "/etc/pki", "/usr/local/share/ca-certificates"] {
        if Path::new(dir).exists() {
            cmd.args(["--tmpfs", dir]);
        }
    }
    cmd.env_remove("SSL_CERT_FILE").env_remove("SSL_CERT_DIR");
    cmd.args(["--", BIN, "fetch"]).args(args);
    Some(cmd.output().unwrap())
}

/// Issue 8: the fetch container panicked (exit 101, "No CA certificates were
/// loaded from the system") even over plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_without_a_ca_bundle_works_over_plain_http_and_fails_cleanly_over_https() {
    let env = start().await;
    env.stage_package(NS, UID).await;
    let d = pod_dirs(NS, UID);
    let args = |endpoint: &str| -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        vec![
            "--endpoint".into(),
            endpoint.into(),
            "--namespace".into(),
            NS.into(),
            "--job".into(),
            UID.into(),
            "--package".into(),
            path(&d.package),
            "--work".into(),
            path(&d.work),
            "--tools".into(),
            path(&d.tools),
            "--token-file".into(),
            path(&d.token),
            "--termination-log".into(),
            path(&d.termination_log),
        ]
    };
    let Some(out) = fetch_without_ca_bundle(&args(&env.base)) else { return };
    // (The binary before the fix panicked in exactly this view.)
    assert!(out.status.success(), "fetch over plain HTTP failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(d.package.join("SKILL.md").exists());
    // Over TLS it fails with an error and a termination message, never a panic.
    let tls = fetch_without_ca_bundle(&args("https://127.0.0.1:9/v1")).unwrap();
    assert_eq!(tls.status.code(), Some(2), "stderr: {}", String::from_utf8_lossy(&tls.stderr));
    assert!(!String::from_utf8_lossy(&tls.stderr).contains("panicked"));
    let line = std::fs::read_to_string(&d.termination_log).unwrap();
    assert!(line.starts_with("error: "), "{line}");
}

/// Every run's verdict waits for this upload: the sidecar takes the
/// launcher's verdict the moment it is sent (no poll), and nothing before:
/// files the script left where the result goes are not a verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_takes_the_verdict_when_it_is_sent_and_nothing_before() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    std::fs::write(d.work.join("out.txt"), b"done").unwrap();
    let o = upload_opts(&env, NS, UID, &d);
    let stop = no_stop();
    let mut upload = Box::pin(async move { client::upload(&o, &stop).await });
    assert!(futures::poll!(upload.as_mut()).is_pending(), "nothing to upload yet");
    let launcher = launcher_connects(&d).await;
    assert!(futures::poll!(upload.as_mut()).is_pending(), "connected, no verdict yet");
    let result = LaunchResult { outcome: RunOutcome { exit_code: Some(3), ..RunOutcome::default() }, error: None, times: None };
    let (sent, report) = tokio::join!(send_verdict(launcher, &result, b"real\n", b""), async {
        tokio::time::timeout(Duration::from_secs(60), upload).await.expect("the upload took the verdict").unwrap().expect("uploaded")
    });
    let () = sent;
    assert!(report.manifest.files.iter().any(|f| f.path == "work/out.txt"), "{:?}", report.manifest.files);
    let stored: LaunchResult = serde_json::from_slice(&env.get(&format!("{NS}/{UID}/outputs/result/result.json"), &op()).await.1).unwrap();
    assert_eq!(stored.outcome.exit_code, Some(3));
    assert_eq!(env.get(&format!("{NS}/{UID}/outputs/result/stdout"), &op()).await.1, b"real\n");
}

/// The controller hears of each job's stored outputs as they are stored,
/// over one stream, through the real endpoint and registry; a job's own
/// token cannot follow it (it would learn of other jobs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_outputs_are_announced_to_the_operator_only() {
    use futures::StreamExt;
    use skill_operator::controller::context::{ArtifactStore, HttpArtifacts};
    let env = start().await;
    let (s, body) = env.send(reqwest::Method::GET, "../outputs/stored", Some(&job(NS, UID)), None).await;
    assert_eq!((s, error_code(&body).as_str()), (403, "forbidden"), "{}", String::from_utf8_lossy(&body));
    let (s, _) = env.send(reqwest::Method::GET, "../outputs/stored", None, None).await;
    assert_eq!(s, 401);
    let store = HttpArtifacts::new(&env.base, KEY);
    let mut stored = store.follow_stored().await.expect("the operator follows");
    for uid in [UID, OTHER_UID] {
        let d = pod_dirs(NS, uid);
        let result = LaunchResult { outcome: RunOutcome { exit_code: Some(0), ..RunOutcome::default() }, error: None, times: None };
        write_result(&d.result, serde_json::to_vec(&result).unwrap()).unwrap();
        client::upload(&upload_opts(&env, NS, uid, &d), &no_stop()).await.unwrap().expect("uploaded");
        let event = tokio::time::timeout(Duration::from_secs(30), stored.next()).await.expect("announced").expect("stream open").unwrap();
        assert_eq!((event.namespace.as_str(), event.uid.as_str()), (NS, uid));
    }
    // A refused upload stores nothing and announces nothing: the next
    // announcement is the next stored job's.
    let (s, _) = env.put(&format!("{NS}/{UID}/outputs"), &job(NS, UID), b"not a tar".to_vec()).await;
    assert_eq!(s, 400);
    let third = "9a8b7c6d-0000-4000-8000-000000000003";
    let d = pod_dirs(NS, third);
    write_result(&d.result, b"{}").unwrap();
    client::upload(&upload_opts(&env, NS, third, &d), &no_stop()).await.unwrap().expect("uploaded");
    let event = tokio::time::timeout(Duration::from_secs(30), stored.next()).await.expect("announced").expect("stream open").unwrap();
    assert_eq!(event.uid, third, "a refused upload was announced");
}

// -- namespace packages ---------------------------------------------------------
//
// A package staged once per (namespace, pinned SkillPackage digest), which
// every run of the namespace fetches with `--staged-package`.

const NS_B: &str = "team-b";

/// A pinned SkillPackage digest (the endpoint takes the operator's word for it).
fn pinned(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn csv_stats_package() -> Vec<u8> {
    package::build_from_dir(&csv_stats_dir()).unwrap()
}

fn operator_store(env: &Env) -> skill_operator::artifacts::operator::HttpArtifacts {
    skill_operator::artifacts::operator::HttpArtifacts::new(&env.base, KEY)
}

impl Env {
    /// `/v1/namespaces/<tail>`.
    async fn ns_send(&self, method: reqwest::Method, tail: &str, auth: Option<&str>, body: Option<Vec<u8>>) -> (u16, Vec<u8>) {
        self.send(method, &format!("../namespaces/{tail}"), auth, body).await
    }

    async fn stage_for(&self, ns: &str, digest: &str, pkg: &[u8]) -> Value {
        let (s, body) = self.ns_send(reqwest::Method::PUT, &format!("{ns}/packages/{digest}"), Some(&op()), Some(pkg.to_vec())).await;
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    async fn listed(&self) -> Vec<artifacts::NamespacePackage> {
        let (s, body) = self.ns_send(reqwest::Method::GET, "packages", Some(&op()), None).await;
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    /// The repository behind the endpoint and a client that writes it as the endpoint does.
    fn backing(&self) -> (String, skill_operator::oci::Registry) {
        match (&self.reg, &self.store) {
            (Some(reg), _) => (format!("{}/jobs", reg.addr), reg.registry()),
            (None, Some(_)) => {
                let mut o = skill_operator::oci::RegistryOptions::plain_http(self.addr.to_string());
                o.auth = skill_operator::oci::Auth::Bearer(format!("operator:{}", artifacts::operator_token(KEY)));
                (format!("{}/{}", self.addr, server::STORE_JOBS_REPO), skill_operator::oci::Registry::new(o).unwrap())
            }
            (None, None) => panic!("this endpoint has no backing"),
        }
    }
}

fn staged_fetch_opts(env: &Env, ns: &str, uid: &str, d: &PodDirs, digest: &str) -> FetchOptions {
    FetchOptions { staged_package: Some(digest.to_string()), ..fetch_opts(env, ns, uid, d) }
}

fn ns_package(ns: &str, digest: &str) -> artifacts::NamespacePackage {
    artifacts::NamespacePackage { namespace: ns.into(), digest: digest.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_package_staged_once_is_fetched_by_every_job_of_the_namespace() {
    use skill_operator::artifacts::operator::ArtifactStore;
    let env = start().await;
    let pkg = csv_stats_package();
    let sha = package::digest(&pkg);
    let digest = pinned('1');
    // As the controller stages it (the digest's `:` as is in the path).
    operator_store(&env).stage_namespace_package(NS, &digest, pkg.clone()).await.unwrap();
    assert_eq!(operator_store(&env).namespace_packages().await.unwrap(), [ns_package(NS, &digest)]);

    // Job one: the library fetch. Nothing is staged for the job itself.
    assert_eq!(env.get(&format!("{NS}/{UID}/package"), &job(NS, UID)).await.0, 404);
    let d1 = pod_dirs(NS, UID);
    let mut o = staged_fetch_opts(&env, NS, UID, &d1, &digest);
    o.expect_package_digest = Some(sha.clone());
    let r = client::fetch(&o).await.unwrap();
    assert_eq!(r.package_digest.as_deref(), Some(sha.as_str()), "the bytes' sha256, verified");
    assert_eq!(
        std::fs::read(d1.package.join("scripts/stats.py")).unwrap(),
        std::fs::read(csv_stats_dir().join("scripts/stats.py")).unwrap()
    );

    // Job two: the real binary, as the init container runs it.
    let d2 = pod_dirs(NS, OTHER_UID);
    let out = fetch_command(&env.base, NS, OTHER_UID, &d2)
        .arg("--termination-log")
        .arg(&d2.termination_log)
        .args(["--staged-package", &digest, "--package-digest", &sha])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "fetch failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&sha), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(d2.package.join("SKILL.md")).unwrap(), std::fs::read(csv_stats_dir().join("SKILL.md")).unwrap());

    // `--package-digest` still refuses other bytes, `--staged-package` or not.
    let d3 = pod_dirs(NS, UID);
    let mut o = staged_fetch_opts(&env, NS, UID, &d3, &digest);
    o.expect_package_digest = Some(format!("sha256:{}", "0".repeat(64)));
    let err = client::fetch(&o).await.unwrap_err();
    assert!(matches!(err, ClientError::DigestMismatch { .. }), "{err}");
    assert!(std::fs::read_dir(&d3.package).unwrap().next().is_none(), "nothing unpacked");

    // Another pinned digest of the namespace was never staged.
    let d4 = pod_dirs(NS, UID);
    let err = client::fetch(&staged_fetch_opts(&env, NS, UID, &d4, &pinned('2'))).await.unwrap_err();
    match &err {
        ClientError::Endpoint { status: 404, code, message, .. } => {
            assert_eq!(code, "not_found");
            assert!(message.contains("not staged for namespace team-a"), "{message}");
        }
        other => panic!("expected a 404, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_a_namespace_package_again_is_idempotent_and_each_namespace_keeps_its_own_copy() {
    let env = start().await;
    let pkg = csv_stats_package();
    let digest = pinned('a');
    let first = env.stage_for(NS, &digest, &pkg).await;
    // Again: answered from the validation memo, blobs looked for first.
    let again = env.stage_for(NS, &digest, &pkg).await;
    assert_eq!(first, again, "the same manifest, the same answer");
    assert_eq!(first["packageDigest"], package::digest(&pkg));
    assert!(first["files"].as_u64().unwrap() > 0);
    assert_eq!(env.listed().await, [ns_package(NS, &digest)]);
    // The same bytes for another namespace, or another digest: another manifest.
    let other_ns = env.stage_for(NS_B, &digest, &pkg).await;
    let other_digest = env.stage_for(NS, &pinned('b'), &pkg).await;
    assert_ne!(other_ns["digest"], first["digest"]);
    assert_ne!(other_digest["digest"], first["digest"]);
    assert_eq!(env.listed().await, [ns_package(NS, &digest), ns_package(NS, &pinned('b')), ns_package(NS_B, &digest)]);
    // Deleting one copy leaves the others whole.
    let (s, body) = env.ns_send(reqwest::Method::DELETE, &format!("{NS}/packages/{digest}"), Some(&op()), None).await;
    assert_eq!((s, serde_json::from_slice::<Value>(&body).unwrap()), (200, serde_json::json!({ "deleted": true })));
    let (s, body) = env.get(&format!("{NS_B}/{UID}/package?digest={digest}"), &job(NS_B, UID)).await;
    assert_eq!((s, body), (200, pkg.clone()));
    let (s, body) = env.get(&format!("{NS}/{UID}/package?digest={}", pinned('b')), &job(NS, UID)).await;
    assert_eq!((s, body), (200, pkg.clone()));
}

/// The attack: a job of team-a asks for team-b's package. It must fail if
/// `admit` were skipped on the package route with `?digest=`, or if the tag
/// were built from anything but the route's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_of_another_namespace_never_gets_the_namespace_package() {
    let env = start().await;
    let pkg = csv_stats_package();
    let digest = pinned('c');
    env.stage_for(NS_B, &digest, &pkg).await;
    // It is there: team-b's jobs (and the operator) read it.
    assert_eq!(env.get(&format!("{NS_B}/{UID}/package?digest={digest}"), &job(NS_B, UID)).await, (200, pkg.clone()));
    assert_eq!(env.get(&format!("{NS_B}/{UID}/package?digest={digest}"), &op()).await, (200, pkg.clone()));

    let mine = job(NS, UID);
    // team-a's token on team-b's route: 403, whichever job of team-b is named.
    for uid in [UID, OTHER_UID] {
        let (s, body) = env.get(&format!("{NS_B}/{uid}/package?digest={digest}"), &mine).await;
        assert_eq!((s, error_code(&body).as_str()), (403, "forbidden"), "{uid}");
    }
    // The bare token, or none: 401.
    let (s, body) = env.get(&format!("{NS_B}/{UID}/package?digest={digest}"), &format!("Bearer {}", job_token(KEY, NS, UID))).await;
    assert_eq!((s, error_code(&body).as_str()), (401, "unauthorized"));
    let (s, _) = env.send(reqwest::Method::GET, &format!("{NS_B}/{UID}/package?digest={digest}"), None, None).await;
    assert_eq!(s, 401);
    // Its own namespace's route: the tag is team-a's, where nothing is staged.
    let (s, body) = env.get(&format!("{NS}/{UID}/package?digest={digest}"), &mine).await;
    assert_eq!((s, error_code(&body).as_str()), (404, "not_found"), "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("not staged for namespace team-a"));
    // The fetch client of a team-a job, however it is pointed.
    let d = pod_dirs(NS, UID);
    let err = client::fetch(&staged_fetch_opts(&env, NS, UID, &d, &digest)).await.unwrap_err();
    assert!(matches!(&err, ClientError::Endpoint { status: 404, .. }), "{err}");
    let mut o = staged_fetch_opts(&env, NS, UID, &d, &digest);
    o.endpoint = Endpoint::new(&env.base, NS_B, UID, job_token(KEY, NS, UID)).unwrap();
    let err = client::fetch(&o).await.unwrap_err();
    assert!(matches!(&err, ClientError::Endpoint { status: 401 | 403, .. }), "{err}");
    assert!(std::fs::read_dir(&d.package).unwrap().next().is_none(), "nothing of team-b's package reached team-a's pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_token_cannot_stage_list_or_delete_namespace_packages() {
    let env = start().await;
    let pkg = csv_stats_package();
    let digest = pinned('d');
    env.stage_for(NS, &digest, &pkg).await;
    let route = format!("{NS}/packages/{digest}");
    let other = format!("{NS}/packages/{}", pinned('e'));
    let bare = format!("Bearer {}", job_token(KEY, NS, UID));
    let forged = format!("Bearer operator:{}", "0".repeat(64));
    for (method, tail, body) in [
        (reqwest::Method::PUT, other.as_str(), Some(pkg.clone())),
        (reqwest::Method::PUT, route.as_str(), Some(b"not a package".to_vec())),
        (reqwest::Method::DELETE, route.as_str(), None),
        (reqwest::Method::GET, "packages", None),
    ] {
        let (s, b) = env.ns_send(method.clone(), tail, Some(&job(NS, UID)), body.clone()).await;
        assert_eq!((s, error_code(&b).as_str()), (403, "forbidden"), "{method} {tail}: {}", String::from_utf8_lossy(&b));
        for auth in [Some(bare.as_str()), Some(forged.as_str()), None] {
            let (s, b) = env.ns_send(method.clone(), tail, auth, body.clone()).await;
            assert_eq!((s, error_code(&b).as_str()), (401, "unauthorized"), "{method} {tail} {auth:?}");
        }
    }
    // Nothing changed: the staged one is still there, the other never was.
    assert_eq!(env.listed().await, [ns_package(NS, &digest)]);
    assert_eq!(env.get(&format!("{NS}/{UID}/package?digest={digest}"), &job(NS, UID)).await, (200, pkg));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_package_digests_and_namespaces_are_400_before_any_registry_access() {
    // The registry is a closed port: reaching it would answer 503.
    let env = start_without_registry().await;
    let good = pinned('f');
    let (s, _) = env.ns_send(reqwest::Method::PUT, &format!("{NS}/packages/{good}"), Some(&op()), Some(csv_stats_package())).await;
    assert_eq!(s, 503, "a good route does reach the (absent) registry");
    // Percent-encoded `:` is the same digest.
    let encoded = good.replace(':', "%3A");
    let (s, _) = env.ns_send(reqwest::Method::DELETE, &format!("{NS}/packages/{encoded}"), Some(&op()), None).await;
    assert_eq!(s, 503);
    let bad_digests = [
        format!("sha256:{}", "F".repeat(64)),
        format!("sha256:{}", "f".repeat(63)),
        format!("sha256:{}", "f".repeat(65)),
        format!("sha512:{}", "f".repeat(64)),
        "f".repeat(64),
        "sha256:".to_string(),
        "latest".to_string(),
        format!("sha256%3A{}%2E", "f".repeat(64)),
    ];
    for bad in &bad_digests {
        for method in [reqwest::Method::PUT, reqwest::Method::DELETE] {
            let (s, body) = env.ns_send(method.clone(), &format!("{NS}/packages/{bad}"), Some(&op()), Some(b"x".to_vec())).await;
            assert_eq!((s, error_code(&body).as_str()), (400, "bad_digest"), "{method} {bad}: {}", String::from_utf8_lossy(&body));
        }
        let (s, body) = env.get(&format!("{NS}/{UID}/package?digest={bad}"), &job(NS, UID)).await;
        assert_eq!((s, error_code(&body).as_str()), (400, "bad_digest"), "GET ?digest={bad}");
    }
    let (s, body) = env.get(&format!("{NS}/{UID}/package?digest="), &job(NS, UID)).await;
    assert_eq!((s, error_code(&body).as_str()), (400, "bad_digest"), "an empty ?digest=");
    let long = "a".repeat(64);
    for ns in ["Team-A", "team_a", "team.a", "-team", long.as_str()] {
        let (s, body) = env.ns_send(reqwest::Method::PUT, &format!("{ns}/packages/{good}"), Some(&op()), Some(b"x".to_vec())).await;
        assert_eq!((s, error_code(&body).as_str()), (400, "bad_job"), "{ns}");
    }
    // A good digest still refuses a body that is no package (the store is not touched first).
    let env = start().await;
    let (s, body) = env.ns_send(reqwest::Method::PUT, &format!("{NS}/packages/{good}"), Some(&op()), Some(b"not a package".to_vec())).await;
    assert_eq!((s, error_code(&body).as_str()), (400, "bad_package"));
    assert!(env.listed().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_shows_exactly_the_namespace_packages() {
    use skill_operator::artifacts::operator::ArtifactStore;
    let env = start().await;
    // Nothing pushed yet (distribution: 404 NAME_UNKNOWN): an empty list.
    assert!(env.listed().await.is_empty());
    assert!(operator_store(&env).namespace_packages().await.unwrap().is_empty());
    // Job tags are not namespace packages.
    env.stage_package(NS, UID).await;
    assert_eq!(env.put_input(NS, UID, "a.txt", b"a".to_vec()).await.0, 200);
    assert!(env.listed().await.is_empty());
    let pkg = csv_stats_package();
    env.stage_for(NS_B, &pinned('2'), &pkg).await;
    env.stage_for(NS, &pinned('3'), &pkg).await;
    env.stage_for(NS, &pinned('1'), &pkg).await;
    let want = [ns_package(NS, &pinned('1')), ns_package(NS, &pinned('3')), ns_package(NS_B, &pinned('2'))];
    assert_eq!(env.listed().await, want);
    assert_eq!(operator_store(&env).namespace_packages().await.unwrap(), want);
    // A tag that merely looks close is not listed.
    let (repo, registry) = env.backing();
    let config = skill_operator::oci::SkillConfig::for_package(&pkg, "planted", "", None).unwrap();
    for tag in [format!("{NS}.{}", "A".repeat(64)), format!("{NS}_{}", "a".repeat(64))] {
        registry.push(&format!("{repo}:{tag}"), &pkg, &config).await.unwrap();
    }
    assert_eq!(env.listed().await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_package_removes_it_and_a_later_fetch_is_404() {
    use skill_operator::artifacts::operator::ArtifactStore;
    let env = start().await;
    let store = operator_store(&env);
    let pkg = csv_stats_package();
    let digest = pinned('4');
    assert!(!store.delete_namespace_package(NS, &digest).await.unwrap(), "nothing to delete yet");
    store.stage_namespace_package(NS, &digest, pkg.clone()).await.unwrap();
    store.stage_namespace_package(NS, &pinned('5'), pkg.clone()).await.unwrap();
    let d = pod_dirs(NS, UID);
    client::fetch(&staged_fetch_opts(&env, NS, UID, &d, &digest)).await.unwrap();
    assert!(store.delete_namespace_package(NS, &digest).await.unwrap());
    assert!(!store.delete_namespace_package(NS, &digest).await.unwrap(), "deleted already");
    assert_eq!(store.namespace_packages().await.unwrap(), [ns_package(NS, &pinned('5'))]);
    let d = pod_dirs(NS, OTHER_UID);
    let err = client::fetch(&staged_fetch_opts(&env, NS, OTHER_UID, &d, &digest)).await.unwrap_err();
    match &err {
        ClientError::Endpoint { status: 404, message, .. } => assert!(message.contains("not staged for namespace"), "{message}"),
        other => panic!("expected a 404, got {other}"),
    }
    // The other digest's copy (same blobs) is still whole.
    client::fetch(&staged_fetch_opts(&env, NS, OTHER_UID, &pod_dirs(NS, OTHER_UID), &pinned('5'))).await.unwrap();
    // Staged again after a delete, it is served again.
    store.stage_namespace_package(NS, &digest, pkg.clone()).await.unwrap();
    assert_eq!(env.get(&format!("{NS}/{UID}/package?digest={digest}"), &job(NS, UID)).await, (200, pkg));
}

/// A tag of team-a holding team-b's copy (or a job's package) is refused,
/// on read and on delete, and the delete removes nothing of the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_tag_holding_another_copy_is_refused_as_the_wrong_artifact() {
    let env = start().await;
    let pkg = csv_stats_package();
    let digest = pinned('6');
    let b_copy = env.stage_for(NS_B, &digest, &pkg).await;
    let (repo, registry) = env.backing();
    let tag = artifacts::namespace_package_tag(NS, &digest).unwrap();
    let config = skill_operator::oci::SkillConfig::for_package(&pkg, "staged-package", "", None).unwrap();
    // Byte for byte team-b's manifest, at team-a's tag.
    let planted = registry
        .push_annotated(
            &format!("{repo}:{tag}"),
            &pkg,
            &config,
            std::collections::BTreeMap::from([(artifacts::ANNOTATION_PACKAGE.to_string(), format!("{NS_B}/{digest}"))]),
        )
        .await
        .unwrap();
    assert_eq!(b_copy["digest"], planted, "the same manifest as team-b's");
    let (s, body) = env.get(&format!("{NS}/{UID}/package?digest={digest}"), &job(NS, UID)).await;
    assert_eq!((s, error_code(&body).as_str()), (502, "wrong_artifact"), "{}", String::from_utf8_lossy(&body));
    let d = pod_dirs(NS, UID);
    let err = client::fetch(&staged_fetch_opts(&env, NS, UID, &d, &digest)).await.unwrap_err();
    assert!(matches!(&err, ClientError::Endpoint { status: 502, code, .. } if code == "wrong_artifact"), "{err}");
    // Deleting team-a's would delete that manifest, team-b's tag with it: refused.
    let (s, body) = env.ns_send(reqwest::Method::DELETE, &format!("{NS}/packages/{digest}"), Some(&op()), None).await;
    assert_eq!((s, error_code(&body).as_str()), (502, "wrong_artifact"));
    assert_eq!(env.get(&format!("{NS_B}/{UID}/package?digest={digest}"), &job(NS_B, UID)).await, (200, pkg.clone()));
    // A job's package at the tag: refused the same way.
    let job_annotation = std::collections::BTreeMap::from([(artifacts::ANNOTATION_JOB.to_string(), format!("{NS}/{UID}"))]);
    registry.push_annotated(&format!("{repo}:{tag}"), &pkg, &config, job_annotation).await.unwrap();
    let (s, body) = env.get(&format!("{NS}/{UID}/package?digest={digest}"), &job(NS, UID)).await;
    assert_eq!((s, error_code(&body).as_str()), (502, "wrong_artifact"));
    // Staging it properly replaces the tag; then it reads and deletes.
    env.stage_for(NS, &digest, &pkg).await;
    assert_eq!(env.get(&format!("{NS}/{UID}/package?digest={digest}"), &job(NS, UID)).await, (200, pkg.clone()));
    let (s, body) = env.ns_send(reqwest::Method::DELETE, &format!("{NS}/packages/{digest}"), Some(&op()), None).await;
    assert_eq!((s, serde_json::from_slice::<Value>(&body).unwrap()), (200, serde_json::json!({ "deleted": true })));
    assert_eq!(env.get(&format!("{NS_B}/{UID}/package?digest={digest}"), &job(NS_B, UID)).await, (200, pkg));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_staged_package_digest_fails_fetch_before_any_request() {
    let env = start().await;
    let d = pod_dirs(NS, UID);
    let mut o = staged_fetch_opts(&env, NS, UID, &d, "sha256:NOTHEX");
    // A closed port: any request would be an unreachable endpoint instead.
    o.endpoint = Endpoint::new("http://127.0.0.1:1/v1", NS, UID, job_token(KEY, NS, UID)).unwrap();
    let err = client::fetch(&o).await.unwrap_err();
    assert!(matches!(&err, ClientError::Config(m) if m.contains("--staged-package")), "{err}");
    // The binary says so in the termination log.
    let out = fetch_command("http://127.0.0.1:1/v1", NS, UID, &d)
        .arg("--termination-log")
        .arg(&d.termination_log)
        .args(["--staged-package", "md5:abc"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let line = std::fs::read_to_string(&d.termination_log).unwrap();
    assert!(line.contains("--staged-package") && line.contains("md5:abc"), "{line}");
}

// -- warm pods' claims ----------------------------------------------------------

use skill_operator::artifacts::client::warm::{self, WarmEnd, WarmOptions};
use skill_operator::artifacts::operator::ArtifactStore as _;
use skill_operator::artifacts::{Claim, ClaimInput, CLAIM_FILE, CLAIM_HEADER};
use skill_operator::core::limits::{MAX_ARGS, MAX_ARG_BYTES, MAX_TIMEOUT_SECS};

const WARM: &str = "warm-0123456789abcdef0123456789abcdef";
const OTHER_WARM: &str = "warm-fedcba9876543210fedcba9876543210";

/// The `n`th warm uid of a test (each takes one claim only).
fn warm_uid(n: u32) -> String {
    format!("warm-{n:032x}")
}

/// A run's proxy URL as the controller puts it in a claim.
fn proxy_of(uid: &str) -> String {
    skill_operator::egress::proxy_url("10.96.0.9:3128", &[7u8; 32], &skill_operator::egress::JobId::new(NS, uid))
}

fn a_claim(uid: &str) -> Claim {
    Claim {
        skilljob_uid: uid.into(),
        interpreter: "/usr/bin/python3".into(),
        script: "/package/scripts/stats.py".into(),
        args: vec!["data/input.csv".into()],
        timeout_secs: 60,
        inputs: vec![],
        proxy: None,
        env: None,
    }
}

impl Env {
    async fn put_claim(&self, ns: &str, warm: &str, auth: Option<&str>, body: Vec<u8>) -> (u16, Vec<u8>) {
        self.send(reqwest::Method::PUT, &format!("{ns}/{warm}/claim"), auth, Some(body)).await
    }

    async fn get_claim(&self, ns: &str, warm: &str, auth: &str, query: &str) -> (u16, Vec<u8>) {
        self.get(&format!("{ns}/{warm}/claim{query}"), auth).await
    }

    /// A request on a job's route with the claim header naming `warm`.
    async fn claimed(&self, method: reqwest::Method, tail: &str, auth: &str, warm: &str, body: Option<Vec<u8>>) -> (u16, Vec<u8>) {
        let mut req = self.http.request(method, self.url(tail)).header("authorization", auth).header(CLAIM_HEADER, warm);
        if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.bytes().await.unwrap().to_vec())
    }

    /// Another endpoint replica on this one's backing store: its base URL.
    async fn replica(&self) -> (String, tempfile::TempDir) {
        let (repo, _) = self.backing();
        let spool = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig::new(repo, KEY.to_vec());
        cfg.plain_http = true;
        if self.store.is_some() {
            cfg.registry_auth = skill_operator::oci::Auth::Bearer(format!("operator:{}", artifacts::operator_token(KEY)));
        }
        cfg.spool_dir = Some(spool.path().into());
        let state = AppState::new(cfg).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(server::serve(listener, state, std::future::pending()));
        (format!("http://{addr}/v1"), spool)
    }

    /// A `GET .../claim?wait=<secs>` of `warm`'s own, running on its own.
    fn waiting_claim(&self, base: &str, warm: &str, secs: u64) -> tokio::task::JoinHandle<(u16, Vec<u8>)> {
        let req = self.http.get(format!("{base}/jobs/{NS}/{warm}/claim?wait={secs}")).header("authorization", job(NS, warm));
        tokio::spawn(async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
        })
    }

    /// Until this replica has a request waiting for a claim (its own sign, not a fixed sleep).
    async fn until_a_claim_is_awaited(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.state.claim_waiters() == 0 {
            assert!(Instant::now() < deadline, "no request ever waited for the claim");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn parsed_claim(body: &[u8]) -> Claim {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("not a claim ({e}): {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_claims_a_warm_pod_once_and_the_pod_reads_its_claim() {
    let env = start().await;
    let store = operator_store(&env);
    let mine = job(NS, WARM);
    assert_eq!(env.get_claim(NS, WARM, &mine, "").await.0, 204, "nothing claimed yet");
    let claim = Claim { inputs: vec![ClaimInput { path: "data/input.csv".into(), digest: pinned('a') }], ..a_claim(UID) };
    store.claim(NS, WARM, &claim).await.unwrap();
    let (s, body) = env.get_claim(NS, WARM, &mine, "").await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(parsed_claim(&body), claim);
    // The controller retries: the same claim again is fine and changes nothing.
    store.claim(NS, WARM, &claim).await.unwrap();
    let (s, body) = env.put_claim(NS, WARM, Some(&op()), serde_json::to_vec(&claim).unwrap()).await;
    assert_eq!((s, serde_json::from_slice::<Value>(&body).unwrap()), (200, serde_json::json!({ "created": false })));
    // Another claim (another run, or another command for the same run): 409.
    for other in [a_claim(OTHER_UID), Claim { args: vec!["other.csv".into()], ..claim.clone() }] {
        let err = store.claim(NS, WARM, &other).await.unwrap_err();
        assert!(err.is_already_claimed(), "{err}");
        assert!(!err.is_outage());
        let (s, body) = env.put_claim(NS, WARM, Some(&op()), serde_json::to_vec(&other).unwrap()).await;
        assert_eq!((s, error_code(&body).as_str()), (409, "already_claimed"));
    }
    assert_eq!(parsed_claim(&env.get_claim(NS, WARM, &mine, "?wait=0").await.1), claim, "the first claim stands");
    // Another warm pod is another claim.
    let (s, body) = env.put_claim(NS, OTHER_WARM, Some(&op()), serde_json::to_vec(&a_claim(OTHER_UID)).unwrap()).await;
    assert_eq!((s, serde_json::from_slice::<Value>(&body).unwrap()), (200, serde_json::json!({ "created": true })));
}

/// A claim stored on this replica answers a waiting request at once. The
/// store is read again only once an hour here, so nothing but the wake-up
/// can answer it within the test's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_request_is_answered_the_moment_the_claim_is_stored() {
    let env = start_tuned(|cfg| cfg.claim_recheck = Duration::from_secs(3600)).await;
    let waiting = env.waiting_claim(&env.base, WARM, 60);
    env.until_a_claim_is_awaited().await;
    assert!(!waiting.is_finished(), "it waits");
    operator_store(&env).claim(NS, WARM, &a_claim(UID)).await.unwrap();
    let (s, body) = tokio::time::timeout(Duration::from_secs(20), waiting).await.expect("the stored claim woke the wait").unwrap();
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(parsed_claim(&body), a_claim(UID));
    assert_eq!(env.state.claim_waiters(), 0, "the waiter is gone with its request");
}

/// A claim another replica stored is found by the store's reread (every
/// second), well within the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_stored_by_another_replica_answers_a_wait_within_the_recheck() {
    let env = start().await;
    let (other, _spool) = env.replica().await;
    let waiting = env.waiting_claim(&env.base, WARM, 60);
    env.until_a_claim_is_awaited().await;
    let stored = Instant::now();
    skill_operator::artifacts::operator::HttpArtifacts::new(&other, KEY).claim(NS, WARM, &a_claim(UID)).await.unwrap();
    let (s, body) = tokio::time::timeout(Duration::from_secs(20), waiting).await.unwrap().unwrap();
    assert_eq!((s, parsed_claim(&body)), (200, a_claim(UID)));
    assert!(stored.elapsed() < Duration::from_secs(5), "found after {:?}", stored.elapsed());
    // The other replica reads it too (from the store).
    let resp = env.http.get(format!("{other}/jobs/{NS}/{WARM}/claim")).header("authorization", job(NS, WARM)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_claim_within_the_wait_is_204_and_the_wait_is_at_most_60_seconds() {
    let env = start().await;
    let mine = job(NS, WARM);
    let asked = Instant::now();
    assert_eq!(env.get_claim(NS, WARM, &mine, "?wait=1").await.0, 204);
    let took = asked.elapsed();
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(10), "{took:?}");
    for query in ["?wait=61", "?wait=3600", "?wait=-1", "?wait=x", "?wait=1.5"] {
        let (s, body) = env.get_claim(NS, WARM, &mine, query).await;
        assert_eq!((s, error_code(&body).as_str()), (400, "bad_query"), "{query}");
    }
    assert_eq!(env.state.claim_waiters(), 0, "a refused wait never waited");
    operator_store(&env).claim(NS, WARM, &a_claim(UID)).await.unwrap();
    let asked = Instant::now();
    assert_eq!(env.get_claim(NS, WARM, &mine, "?wait=60").await.0, 200);
    assert!(asked.elapsed() < Duration::from_secs(5), "a stored claim is answered at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_claims_and_only_the_warm_pod_itself_reads_its_claim() {
    let env = start().await;
    let body = serde_json::to_vec(&a_claim(UID)).unwrap();
    let bare = format!("Bearer {}", job_token(KEY, NS, WARM));
    // Job tokens (the warm pod's own, a run's, another namespace's) cannot claim: 403.
    for auth in [job(NS, WARM), job(NS, UID), job(NS, OTHER_WARM), job(NS_B, WARM)] {
        let (s, b) = env.put_claim(NS, WARM, Some(&auth), body.clone()).await;
        assert_eq!((s, error_code(&b).as_str()), (403, "forbidden"), "{auth}");
    }
    // A bare token is that route's job (403 for claiming); none, or a forged one, is 401.
    assert_eq!(env.put_claim(NS, WARM, Some(&bare), body.clone()).await.0, 403);
    assert_eq!(env.put_claim(NS, WARM, None, body.clone()).await.0, 401);
    assert_eq!(env.put_claim(NS, WARM, Some(&format!("Bearer operator:{}", "0".repeat(64))), body.clone()).await.0, 401);
    assert_eq!(env.get_claim(NS, WARM, &job(NS, WARM), "").await.0, 204, "nothing was stored by the refused ones");

    operator_store(&env).claim(NS, WARM, &a_claim(UID)).await.unwrap();
    assert_eq!(env.get_claim(NS, WARM, &job(NS, WARM), "").await.0, 200);
    assert_eq!(env.get_claim(NS, WARM, &bare, "").await.0, 200);
    // Another warm pod's token, a run's, another namespace's, the operator's: 403.
    for auth in [job(NS, OTHER_WARM), job(NS, UID), job(NS_B, WARM), op()] {
        let (s, b) = env.get_claim(NS, WARM, &auth, "").await;
        assert_eq!((s, error_code(&b).as_str()), (403, "forbidden"), "{auth}");
    }
    // Another namespace's route, with its own token, holds no claim.
    assert_eq!(env.get_claim(NS_B, WARM, &job(NS_B, WARM), "").await.0, 204);
    // A route that is no warm uid: 400 before the credential counts.
    for (ns, uid) in [(NS, UID), (NS, "warm-ABC"), ("Team", WARM)] {
        let (s, b) = env.put_claim(ns, uid, Some(&op()), body.clone()).await;
        assert_eq!((s, error_code(&b).as_str()), (400, "bad_job"), "PUT {ns}/{uid}");
        let (s, b) = env.get_claim(ns, uid, &job(NS, UID), "").await;
        assert_eq!((s, error_code(&b).as_str()), (400, "bad_job"), "GET {ns}/{uid}");
    }
}

/// Each rule of a claim at its edge: exactly allowed is stored, one over is
/// 400 `bad_claim` and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_claims_are_400_at_each_rules_edge() {
    let env = start().await;
    let base = a_claim(UID);
    let allowed = [
        Claim { args: vec!["a".into(); MAX_ARGS], ..base.clone() },
        Claim { args: vec!["x".repeat(MAX_ARG_BYTES)], ..base.clone() },
        Claim { timeout_secs: 1, ..base.clone() },
        Claim { timeout_secs: MAX_TIMEOUT_SECS as u32, ..base.clone() },
        Claim { proxy: Some(proxy_of(UID)), ..base.clone() },
    ];
    for (n, claim) in allowed.iter().enumerate() {
        let (s, b) = env.put_claim(NS, &warm_uid(n as u32), Some(&op()), serde_json::to_vec(claim).unwrap()).await;
        assert_eq!(s, 200, "{n}: {}", String::from_utf8_lossy(&b));
    }
    let digest = pinned('d');
    let refused = [
        ("too many args", Claim { args: vec!["a".into(); MAX_ARGS + 1], ..base.clone() }),
        ("args too large", Claim { args: vec!["x".repeat(MAX_ARG_BYTES + 1)], ..base.clone() }),
        ("timeout 0", Claim { timeout_secs: 0, ..base.clone() }),
        ("timeout over", Claim { timeout_secs: MAX_TIMEOUT_SECS as u32 + 1, ..base.clone() }),
        ("`..` script", Claim { script: "/package/../etc/passwd".into(), ..base.clone() }),
        ("relative script", Claim { script: "scripts/stats.py".into(), ..base.clone() }),
        ("relative interpreter", Claim { interpreter: "python3".into(), ..base.clone() }),
        ("a warm uid as the run", Claim { skilljob_uid: OTHER_WARM.into(), ..base.clone() }),
        ("a bad run uid", Claim { skilljob_uid: "a/b".into(), ..base.clone() }),
        ("an input outside /work", Claim { inputs: vec![ClaimInput { path: "../x".into(), digest: digest.clone() }], ..base.clone() }),
        ("a bad input digest", Claim { inputs: vec![ClaimInput { path: "x".into(), digest: "sha256:abc".into() }], ..base.clone() }),
        ("another run's proxy credential", Claim { proxy: Some(proxy_of("another-run")), ..base.clone() }),
        ("a proxy by name", Claim { proxy: Some(proxy_of(UID).replace("10.96.0.9", "proxy.local")), ..base.clone() }),
    ];
    let target = warm_uid(100);
    for (what, claim) in &refused {
        let (s, b) = env.put_claim(NS, &target, Some(&op()), serde_json::to_vec(claim).unwrap()).await;
        assert_eq!((s, error_code(&b).as_str()), (400, "bad_claim"), "{what}: {}", String::from_utf8_lossy(&b));
    }
    let mut unknown = serde_json::to_value(&base).unwrap();
    unknown["env"] = serde_json::json!({ "TOKEN": "x" });
    for (what, body) in [("an unknown field", serde_json::to_vec(&unknown).unwrap()), ("not JSON", b"claim".to_vec()), ("empty", vec![])] {
        let (s, b) = env.put_claim(NS, &target, Some(&op()), body).await;
        assert_eq!((s, error_code(&b).as_str()), (400, "bad_claim"), "{what}");
    }
    let huge = vec![b' '; artifacts::MAX_CLAIM_BYTES as usize + 1];
    let (s, b) = env.put_claim(NS, &target, Some(&op()), huge).await;
    assert_eq!((s, error_code(&b).as_str()), (413, "body_too_large"));
    assert_eq!(env.get_claim(NS, &target, &job(NS, &target), "").await.0, 204, "nothing refused was stored");
}

/// With the header and its claim, the warm pod's own token reads the
/// run's inputs and stores its outputs, announced under the run's uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_warm_pod_reads_its_runs_inputs_and_stores_its_outputs() {
    use futures::StreamExt;
    let env = start().await;
    let data = b"a,b\n1,2\n".to_vec();
    assert_eq!(env.put_input(NS, UID, "data/input.csv", data.clone()).await.0, 200);
    let warm = job(NS, WARM);
    let claim = Claim { inputs: vec![ClaimInput { path: "data/input.csv".into(), digest: sha256_digest(&data) }], ..a_claim(UID) };
    operator_store(&env).claim(NS, WARM, &claim).await.unwrap();
    let mut stored = operator_store(&env).follow_stored().await.unwrap();

    let (s, body) = env.claimed(reqwest::Method::GET, &format!("{NS}/{UID}/inputs"), &warm, WARM, None).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    let manifest: InputsManifest = serde_json::from_slice(&body).unwrap();
    assert_eq!(manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["data/input.csv"]);
    let bare = format!("Bearer {}", job_token(KEY, NS, WARM));
    for auth in [&warm, &bare] {
        assert_eq!(
            env.claimed(reqwest::Method::GET, &format!("{NS}/{UID}/inputs/data/input.csv"), auth, WARM, None).await,
            (200, data.clone())
        );
    }
    let outputs = outputs_tar(NS, UID, &[("work/out.txt".into(), b"out".to_vec())]);
    let (s, body) = env.claimed(reqwest::Method::PUT, &format!("{NS}/{UID}/outputs"), &warm, WARM, Some(outputs)).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    let event = tokio::time::timeout(Duration::from_secs(30), stored.next()).await.expect("announced").expect("open").unwrap();
    assert_eq!((event.namespace.as_str(), event.uid.as_str()), (NS, UID), "announced as the run's outputs");
    assert_eq!(env.get(&format!("{NS}/{UID}/outputs/work/out.txt"), &op()).await, (200, b"out".to_vec()));
    // Without the header, the warm token is another job's on the run's routes, as ever.
    let (s, _) = env.get(&format!("{NS}/{UID}/inputs"), &warm).await;
    assert_eq!(s, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_header_is_refused_without_the_matching_claim() {
    let env = start().await;
    assert_eq!(env.put_input(NS, UID, "in.txt", b"in".to_vec()).await.0, 200);
    let inputs = format!("{NS}/{UID}/inputs");
    let outputs = format!("{NS}/{UID}/outputs");
    let tar = || Some(outputs_tar(NS, UID, &[("work/x".into(), b"x".to_vec())]));
    let forbidden = |(s, b): (u16, Vec<u8>), what: &str| assert_eq!((s, error_code(&b).as_str()), (403, "forbidden"), "{what}");
    // No claim at all.
    forbidden(env.claimed(reqwest::Method::GET, &inputs, &job(NS, WARM), WARM, None).await, "unclaimed: inputs");
    forbidden(env.claimed(reqwest::Method::PUT, &outputs, &job(NS, WARM), WARM, tar()).await, "unclaimed: outputs");
    // A claim for another run.
    operator_store(&env).claim(NS, WARM, &a_claim(OTHER_UID)).await.unwrap();
    forbidden(env.claimed(reqwest::Method::GET, &inputs, &job(NS, WARM), WARM, None).await, "another run's claim: inputs");
    forbidden(
        env.claimed(reqwest::Method::GET, &format!("{inputs}/in.txt"), &job(NS, WARM), WARM, None).await,
        "another run's claim: file",
    );
    forbidden(env.claimed(reqwest::Method::PUT, &outputs, &job(NS, WARM), WARM, tar()).await, "another run's claim: outputs");
    // A header naming another warm pod (claimed for this run) than the token's.
    operator_store(&env).claim(NS, OTHER_WARM, &a_claim(UID)).await.unwrap();
    forbidden(env.claimed(reqwest::Method::GET, &inputs, &job(NS, WARM), OTHER_WARM, None).await, "another warm uid's header");
    forbidden(env.claimed(reqwest::Method::PUT, &outputs, &job(NS, WARM), OTHER_WARM, tar()).await, "another warm uid's header");
    // The operator, or the run's own token, with the header: not the warm pod.
    forbidden(env.claimed(reqwest::Method::GET, &inputs, &op(), OTHER_WARM, None).await, "the operator with the header");
    forbidden(env.claimed(reqwest::Method::GET, &inputs, &job(NS, UID), OTHER_WARM, None).await, "the run's token with the header");
    // Another namespace's warm pod of the same uid.
    forbidden(env.claimed(reqwest::Method::GET, &inputs, &job(NS_B, OTHER_WARM), OTHER_WARM, None).await, "another namespace's");
    // A header that is no warm uid.
    let (s, b) = env.claimed(reqwest::Method::GET, &inputs, &job(NS, UID), UID, None).await;
    assert_eq!((s, error_code(&b).as_str()), (400, "bad_job"));
    // The matching pair passes (nothing above was refused for another reason).
    assert_eq!(env.claimed(reqwest::Method::GET, &inputs, &job(NS, OTHER_WARM), OTHER_WARM, None).await.0, 200);
    assert_eq!(env.claimed(reqwest::Method::PUT, &outputs, &job(NS, OTHER_WARM), OTHER_WARM, tar()).await.0, 200);
    // The header opens the inputs and outputs only: not the package, nor another job's claim.
    env.stage_package(NS, UID).await;
    forbidden(env.claimed(reqwest::Method::GET, &format!("{NS}/{UID}/package"), &job(NS, OTHER_WARM), OTHER_WARM, None).await, "package");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_warm_uid_removes_its_claim() {
    let env = start().await;
    operator_store(&env).claim(NS, WARM, &a_claim(UID)).await.unwrap();
    assert_eq!(env.put_input(NS, UID, "in.txt", b"in".to_vec()).await.0, 200);
    // Read once: the claimed routes now know the claim from memory.
    assert_eq!(env.claimed(reqwest::Method::GET, &format!("{NS}/{UID}/inputs"), &job(NS, WARM), WARM, None).await.0, 200);
    let (s, body) = env.send(reqwest::Method::DELETE, &format!("{NS}/{WARM}"), Some(&op()), None).await;
    assert_eq!((s, serde_json::from_slice::<Value>(&body).unwrap()["deleted"].clone()), (200, serde_json::json!(["claim"])));
    assert_eq!(env.get_claim(NS, WARM, &job(NS, WARM), "").await.0, 204);
    assert_eq!(env.claimed(reqwest::Method::GET, &format!("{NS}/{UID}/inputs"), &job(NS, WARM), WARM, None).await.0, 403);
    // The run's own artifacts were not the warm uid's.
    assert_eq!(env.get(&format!("{NS}/{UID}/inputs/in.txt"), &op()).await, (200, b"in".to_vec()));
}

/// A warm pod's sidecar: waits for its claim, brings the run's inputs,
/// hands the claim to the launcher, and uploads the run's outputs under the
/// run's uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pods_sidecar_hands_its_claim_over_and_uploads_the_runs_outputs() {
    let env = start().await;
    let data = b"a,b\n1,2\n".to_vec();
    assert_eq!(env.put_input(NS, UID, "data/input.csv", data.clone()).await.0, 200);
    let d = pod_dirs(NS, WARM);
    let (claim_dir, proc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut w = WarmOptions::new(upload_opts(&env, NS, WARM, &d), claim_dir.path().into());
    (w.proc_root, w.wait_secs) = (proc.path().into(), 5);
    let stop = no_stop();
    let sidecar = tokio::spawn({
        let (stop, w) = (stop.clone(), w.clone());
        async move { warm::run_warm_upload_sidecar(&w, &stop).await }
    });
    let launcher = launcher_connects(&d).await;
    let claim = Claim { inputs: vec![ClaimInput { path: "data/input.csv".into(), digest: sha256_digest(&data) }], ..a_claim(UID) };
    operator_store(&env).claim(NS, WARM, &claim).await.unwrap();
    wait_for_file(&claim_dir.path().join(CLAIM_FILE), Duration::from_secs(20)).await;
    assert_eq!(warm::read_claim_file(&claim_dir.path().join(CLAIM_FILE)).unwrap(), claim);
    assert_eq!(std::fs::read(d.work.join("data/input.csv")).unwrap(), data, "the inputs are in before the claim is handed over");
    // The launcher's part.
    std::fs::write(d.work.join("out.txt"), b"out").unwrap();
    let result = LaunchResult { outcome: RunOutcome { exit_code: Some(0), ..RunOutcome::default() }, error: None, times: None };
    send_verdict(launcher, &result, b"", b"").await;
    wait_for_file(&d.termination_log, Duration::from_secs(20)).await;
    assert!(!sidecar.is_finished(), "it lingers until stopped, as a run's sidecar");
    stop.trigger();
    match sidecar.await.unwrap().unwrap() {
        WarmEnd::Ran { claim: ran, report: Some(report) } => {
            assert_eq!(*ran, claim);
            assert_eq!(report.manifest.uid, UID);
        }
        other => panic!("{other:?}"),
    }
    let (manifest, bytes) = outputs_manifest(&env, NS, UID).await;
    let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    // The launcher's verdict always carries both streams (empty here).
    assert_eq!(paths, ["result/result.json", "result/stderr", "result/stdout", "work/data/input.csv", "work/out.txt"]);
    assert!(std::fs::read_to_string(&d.termination_log).unwrap().starts_with(&sha256_digest(&bytes)));
    assert_eq!(env.get(&format!("{NS}/{WARM}/outputs"), &op()).await.0, 404, "nothing under the warm uid");
    // Restarted after the verdict came (a native sidecar that exits is), it
    // carries on as the run's sidecar with the verdict it keeps: no second
    // check, no second fetch, no channel.
    std::fs::remove_file(&d.termination_log).unwrap();
    let stop = no_stop();
    let again = tokio::spawn({
        let stop = stop.clone();
        async move { warm::run_warm_upload_sidecar(&w, &stop).await }
    });
    wait_for_file(&d.termination_log, Duration::from_secs(20)).await;
    stop.trigger();
    assert!(matches!(again.await.unwrap().unwrap(), WarmEnd::Ran { report: Some(_), .. }));
    assert_eq!(outputs_manifest(&env, NS, UID).await.1, bytes, "the same outputs again");
}

/// Something left in the pod before the claim (a process in the
/// container: here a fake proc directory; a file in /work) makes the
/// sidecar refuse: the run's stored result says why, nothing ran, and a
/// restarted sidecar refuses again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pods_sidecar_refuses_a_claim_when_something_was_left_in_the_pod() {
    let env = start().await;
    for (n, left) in ["a process", "a work file"].into_iter().enumerate() {
        let (warm, run) = (warm_uid(n as u32 + 1), format!("9a8b7c6d-0000-4000-8000-00000000010{n}"));
        assert_eq!(env.put_input(NS, &run, "in.txt", b"in".to_vec()).await.0, 200);
        let d = pod_dirs(NS, &warm);
        let (claim_dir, proc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let found = match left {
            "a process" => {
                std::fs::create_dir(proc.path().join("4242")).unwrap();
                "pid 4242"
            }
            _ => {
                std::fs::write(d.work.join("in.txt"), b"planted").unwrap();
                "in.txt"
            }
        };
        let mut w = WarmOptions::new(upload_opts(&env, NS, &warm, &d), claim_dir.path().into());
        (w.proc_root, w.wait_secs) = (proc.path().into(), 5);
        let claim = Claim { inputs: vec![ClaimInput { path: "in.txt".into(), digest: sha256_digest(b"in") }], ..a_claim(&run) };
        operator_store(&env).claim(NS, &warm, &claim).await.unwrap();
        let err = run_warm(&w, &d).await.unwrap_err();
        let why = match &err {
            ClientError::Refused(why) => why.clone(),
            other => panic!("{left}: {other}"),
        };
        assert!(why.starts_with(warm::TAMPERED) && why.contains(found), "{left}: {why}");
        let result: LaunchResult =
            serde_json::from_slice(&env.get(&format!("{NS}/{run}/outputs/result/result.json"), &op()).await.1).unwrap();
        assert_eq!(result.error.as_deref(), Some(why.as_str()), "{left}");
        assert_eq!(result.outcome, RunOutcome::default(), "nothing ran");
        let (manifest, _) = outputs_manifest(&env, NS, &run).await;
        assert_eq!(
            manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            ["result/result.json", "result/stderr", "result/stdout"]
        );
        assert_eq!(env.get(&format!("{NS}/{run}/outputs/result/stdout"), &op()).await, (200, vec![]));
        assert!(!claim_dir.path().join(CLAIM_FILE).exists(), "{left}: the launcher was never handed the claim");
        if left != "a work file" {
            assert!(!d.work.join("in.txt").exists(), "{left}: the run's inputs never came into the pod");
        }
        assert!(std::fs::read_to_string(&d.termination_log).unwrap().starts_with("sha256:"), "the refusal's upload");
        // Restarted (a native sidecar that exits is), it never hands the claim
        // over, and sends the refusal again (should the first upload have failed).
        assert_eq!(env.send(reqwest::Method::DELETE, &format!("{NS}/{run}"), Some(&op()), None).await.0, 200);
        let err = warm::run_warm_upload_sidecar(&w, &no_stop()).await.unwrap_err();
        assert!(matches!(&err, ClientError::Refused(m) if m.contains("refused its claim before")), "{err}");
        assert!(!claim_dir.path().join(CLAIM_FILE).exists());
        let again: LaunchResult =
            serde_json::from_slice(&env.get(&format!("{NS}/{run}/outputs/result/result.json"), &op()).await.1).unwrap();
        assert_eq!(again.error.as_deref(), Some(why.as_str()), "{left}: the refusal stored again");
    }
}

/// A claim whose inputs are not what is staged for the run (the staging
/// changed, or the claim is wrong) runs nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pods_sidecar_refuses_a_claim_whose_inputs_are_not_staged() {
    let env = start().await;
    assert_eq!(env.put_input(NS, UID, "in.txt", b"staged".to_vec()).await.0, 200);
    let d = pod_dirs(NS, WARM);
    let (claim_dir, proc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut w = WarmOptions::new(upload_opts(&env, NS, WARM, &d), claim_dir.path().into());
    w.proc_root = proc.path().into();
    let claim = Claim { inputs: vec![ClaimInput { path: "in.txt".into(), digest: sha256_digest(b"claimed") }], ..a_claim(UID) };
    operator_store(&env).claim(NS, WARM, &claim).await.unwrap();
    let err = run_warm(&w, &d).await.unwrap_err();
    assert!(matches!(&err, ClientError::Refused(m) if m.contains("inputs could not be fetched") && m.contains("not the claim's")), "{err}");
    assert!(std::fs::read_dir(&d.work).unwrap().next().is_none(), "nothing was fetched");
    assert!(!claim_dir.path().join(CLAIM_FILE).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_with_no_inputs_brings_the_package_and_the_launcher_only() {
    let env = start().await;
    let digest = pinned('9');
    env.stage_for(NS, &digest, &csv_stats_package()).await;
    assert_eq!(env.put_input(NS, WARM, "in.txt", b"not for a warm pod".to_vec()).await.0, 200);
    let d = pod_dirs(NS, WARM);
    let out = fetch_command(&env.base, NS, WARM, &d).args(["--staged-package", &digest, "--no-inputs"]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(d.package.join("SKILL.md").exists());
    assert!(d.tools.join("skill-operator").exists());
    assert!(std::fs::read_dir(&d.work).unwrap().next().is_none(), "no inputs");
    // Without the flag the same fetch brings them.
    let d = pod_dirs(NS, WARM);
    let out = fetch_command(&env.base, NS, WARM, &d).args(["--staged-package", &digest]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(d.work.join("in.txt").exists());
}

/// A warm pod's sidecar with its launcher connected (as it connects at
/// its start), to its end.
async fn run_warm(w: &WarmOptions, d: &PodDirs) -> Result<WarmEnd, ClientError> {
    let sidecar = tokio::spawn({
        let w = w.clone();
        async move { warm::run_warm_upload_sidecar(&w, &no_stop()).await }
    });
    let _launcher = launcher_connects(d).await;
    sidecar.await.unwrap()
}

/// A sidecar restarted after the launcher connected and before its verdict
/// came has lost the launcher's channel: a connection now could only be
/// the script's. It takes none, and a claim it is handed is refused (the
/// run fails saying why) instead of run with no one to report it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_sidecar_restarted_before_the_verdict_takes_no_channel_and_refuses_its_claim() {
    let env = start().await;
    let d = pod_dirs(NS, WARM);
    let (claim_dir, proc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut w = WarmOptions::new(upload_opts(&env, NS, WARM, &d), claim_dir.path().into());
    (w.proc_root, w.wait_secs) = (proc.path().into(), 5);
    // The first sidecar took the launcher's channel, then died (stopped here, before any claim).
    let stop = no_stop();
    let first = tokio::spawn({
        let (stop, w) = (stop.clone(), w.clone());
        async move { warm::run_warm_upload_sidecar(&w, &stop).await }
    });
    let launcher = launcher_connects(&d).await;
    env.until_a_claim_is_awaited().await;
    stop.trigger();
    assert!(matches!(first.await.unwrap().unwrap(), WarmEnd::Unclaimed));
    // Restarted: whoever connects now is refused at once, and the claim is refused.
    operator_store(&env).claim(NS, WARM, &a_claim(UID)).await.unwrap();
    let again = tokio::spawn(async move { warm::run_warm_upload_sidecar(&w, &no_stop()).await });
    let name = d.verdict.clone();
    let script = tokio::task::spawn_blocking(move || VerdictSender::connect(&name, Duration::ZERO)).await.unwrap();
    assert!(script.is_err(), "nobody listens on a restarted sidecar's channel");
    let why = match again.await.unwrap().unwrap_err() {
        ClientError::Refused(why) => why,
        other => panic!("{other}"),
    };
    assert!(why.starts_with(warm::TAMPERED) && why.contains("restarted after the launcher connected"), "{why}");
    let result: LaunchResult = serde_json::from_slice(&env.get(&format!("{NS}/{UID}/outputs/result/result.json"), &op()).await.1).unwrap();
    assert_eq!(result.error.as_deref(), Some(why.as_str()), "the run fails saying why");
    assert!(!claim_dir.path().join(CLAIM_FILE).exists(), "the launcher was never handed the claim");
    drop(launcher);
}

/// `upload` in warm mode for `job`, on the pod directories `d`.
fn warm_upload(base: &str, job: &str, d: &PodDirs, claim_dir: &std::path::Path) -> tokio::process::Command {
    let mut cmd = upload_command(base, NS, job, d);
    cmd.arg("--claim-dir").arg(claim_dir);
    cmd
}

/// An idle warm pod is deleted: its sidecar ends quietly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclaimed_warm_pods_sidecar_exits_0_on_sigterm() {
    let env = start().await;
    let d = pod_dirs(NS, WARM);
    let (claim_dir, proc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut upload = warm_upload(&env.base, WARM, &d, claim_dir.path())
        .arg("--proc-root")
        .arg(proc.path())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until_waiting(&mut upload).await;
    let _launcher = launcher_connects(&d).await;
    env.until_a_claim_is_awaited().await;
    sigterm(&upload);
    let status = tokio::time::timeout(Duration::from_secs(15), upload.wait()).await.expect("exits after SIGTERM").unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!d.termination_log.exists(), "nothing to say");
    assert!(std::fs::read_dir(claim_dir.path()).unwrap().next().is_none());
    // A run uid for --claim-dir is refused, with its reason in the termination log.
    let out = warm_upload(&env.base, UID, &d, claim_dir.path()).output().await.unwrap();
    assert!(!out.status.success());
    assert!(std::fs::read_to_string(&d.termination_log).unwrap().contains("warm uid"));
}

// -- warm pods' keys (what a run's variables are sealed to) ----------------------

use skill_operator::artifacts::sealed::{self, ClaimKey};

impl Env {
    async fn put_key(&self, ns: &str, warm: &str, auth: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
        self.send(reqwest::Method::PUT, &format!("{ns}/{warm}/claim-key"), Some(auth), Some(body)).await
    }
}

fn a_key() -> ClaimKey {
    sealed::PodKey::generate().unwrap().public()
}

/// Only the warm pod itself publishes its key, once; only the operator
/// reads it, from any replica; a second, different key is refused (whoever
/// got into the pod later cannot swap what a run's values are sealed to);
/// deleting the warm uid's artifacts removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_publishes_its_key_once_and_only_the_operator_reads_it() {
    let env = start().await;
    let store = operator_store(&env);
    let key = a_key();
    let body = serde_json::to_vec(&key).unwrap();
    let mine = job(NS, WARM);
    assert_eq!(store.claim_key(NS, WARM).await.unwrap(), None, "nothing published yet");
    let (s, b) = env.get(&format!("{NS}/{WARM}/claim-key"), &op()).await;
    assert_eq!((s, error_code(&b).as_str()), (404, "not_found"));

    // Publishing: the pod's own credential, nobody else's.
    for (who, auth, status, code) in [
        ("the operator", op(), 403, "forbidden"),
        ("another warm pod", job(NS, OTHER_WARM), 403, "forbidden"),
        ("a run", job(NS, UID), 403, "forbidden"),
    ] {
        let (s, b) = env.put_key(NS, WARM, &auth, body.clone()).await;
        assert_eq!((s, error_code(&b).as_str()), (status, code), "{who}: {}", String::from_utf8_lossy(&b));
    }
    assert_eq!(store.claim_key(NS, WARM).await.unwrap(), None, "none of them stored a key");
    let (s, b) = env.put_key(NS, WARM, &mine, body.clone()).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    assert_eq!(serde_json::from_slice::<Value>(&b).unwrap()["created"], true);
    // A restarted sidecar sends the same key again: a no-op.
    let (s, b) = env.put_key(NS, WARM, &mine, body.clone()).await;
    assert_eq!((s, serde_json::from_slice::<Value>(&b).unwrap()["created"].clone()), (200, Value::Bool(false)));
    // Another key, even from the pod's own credential: 409.
    let (s, b) = env.put_key(NS, WARM, &mine, serde_json::to_vec(&a_key()).unwrap()).await;
    assert_eq!((s, error_code(&b).as_str()), (409, "key_published"));

    // Reading: the operator only, from this replica and from another on the same store.
    assert_eq!(store.claim_key(NS, WARM).await.unwrap(), Some(key.clone()));
    let (other_base, _spool) = env.replica().await;
    let other = skill_operator::artifacts::operator::HttpArtifacts::new(&other_base, KEY);
    assert_eq!(other.claim_key(NS, WARM).await.unwrap(), Some(key.clone()), "stored, not only remembered");
    let (s, b) = env.get(&format!("{NS}/{WARM}/claim-key"), &mine).await;
    assert_eq!((s, error_code(&b).as_str()), (403, "forbidden"), "the pod does not read keys");

    // Deleting the warm uid's artifacts removes it (the pod is gone by then).
    store.delete(NS, WARM).await.unwrap();
    assert_eq!(store.claim_key(NS, WARM).await.unwrap(), None);
    let (s, _) = env.put_key(NS, WARM, &mine, serde_json::to_vec(&a_key()).unwrap()).await;
    assert_eq!(s, 200, "a new key after the delete");
}

/// Malformed keys, bodies over the cap and routes of no warm pod are
/// refused before anything is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_warm_pod_keys_are_refused() {
    let env = start().await;
    let mine = job(NS, WARM);
    let good = a_key();
    for (what, body) in [
        ("not JSON", b"not json".to_vec()),
        ("no key", b"{}".to_vec()),
        ("a short key", br#"{"x25519":"short"}"#.to_vec()),
        ("not base64url", serde_json::to_vec(&serde_json::json!({ "x25519": "*".repeat(sealed::CLAIM_KEY_CHARS) })).unwrap()),
        ("an unknown field", serde_json::to_vec(&serde_json::json!({ "x25519": good.x25519, "private": "x" })).unwrap()),
    ] {
        let (s, b) = env.put_key(NS, WARM, &mine, body).await;
        assert_eq!((s, error_code(&b).as_str()), (400, "bad_claim_key"), "{what}: {}", String::from_utf8_lossy(&b));
    }
    let mut big = serde_json::to_vec(&good).unwrap();
    big.resize(sealed::CLAIM_KEY_MAX_BYTES + 1, b' ');
    let (s, b) = env.put_key(NS, WARM, &mine, big).await;
    assert_eq!((s, error_code(&b).as_str()), (413, "body_too_large"));
    let (s, b) = env.put_key(NS, UID, &job(NS, UID), serde_json::to_vec(&good).unwrap()).await;
    assert_eq!((s, error_code(&b).as_str()), (400, "bad_job"), "a run's uid has no key");
    assert_eq!(operator_store(&env).claim_key(NS, WARM).await.unwrap(), None, "nothing stored");
}

/// A claim carrying sealed variables is stored and read back as it came:
/// the endpoint checks its shape and never holds them in the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_sealed_variables_is_stored_sealed() {
    let env = start().await;
    let pod = sealed::PodKey::generate().unwrap();
    let vars = vec![("WEATHER_API_KEY".to_string(), "s3cret-value-for-the-store".to_string())];
    let claim = Claim { env: Some(sealed::seal(&pod.public(), UID, &vars).unwrap()), ..a_claim(UID) };
    operator_store(&env).claim(NS, WARM, &claim).await.unwrap();
    let (s, body) = env.get_claim(NS, WARM, &job(NS, WARM), "").await;
    assert_eq!(s, 200);
    let stored = parsed_claim(&body);
    assert_eq!(stored, claim);
    assert!(!String::from_utf8_lossy(&body).contains("s3cret-value"), "nothing in the clear");
    assert_eq!(pod.open(stored.env.as_ref().unwrap(), UID).unwrap(), vars, "it opens in the pod");
    // A box that is not one is refused at the door.
    let bad = Claim { env: Some(sealed::SealedEnv { key: a_key().x25519, sealed: "AAAA".into() }), ..a_claim(OTHER_UID) };
    let (s, b) = env.put_claim(NS, OTHER_WARM, Some(&op()), serde_json::to_vec(&bad).unwrap()).await;
    assert_eq!((s, error_code(&b).as_str()), (400, "bad_claim"), "{}", String::from_utf8_lossy(&b));
}

/// The sidecar publishes the key the launcher leaves (waiting for the file
/// if it is not there yet), before it waits for its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pods_sidecar_publishes_the_launchers_key_before_it_waits() {
    let env = start().await;
    let d = pod_dirs(NS, WARM);
    let (claim_dir, key_dir, proc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let key_file = key_dir.path().join("key.json");
    let mut w = WarmOptions::new(upload_opts(&env, NS, WARM, &d), claim_dir.path().into());
    (w.proc_root, w.wait_secs, w.claim_key) = (proc.path().into(), 5, Some(key_file.clone()));
    let stop = no_stop();
    let sidecar = tokio::spawn({
        let (stop, w) = (stop.clone(), w.clone());
        async move { warm::run_warm_upload_sidecar(&w, &stop).await }
    });
    // The launcher starts after the sidecar: its channel and its key come later.
    let _launcher = launcher_connects(&d).await;
    let key = a_key();
    warm::write_key_file(&key_file, &key).unwrap();
    env.until_a_claim_is_awaited().await;
    assert_eq!(operator_store(&env).claim_key(NS, WARM).await.unwrap(), Some(key), "published before the wait");
    stop.trigger();
    assert!(matches!(sidecar.await.unwrap().unwrap(), WarmEnd::Unclaimed));
}

/// Another key published under the pod's identity before its sidecar's
/// could only come from inside the pod, with its token: the sidecar
/// refuses the claim as tampered, and the launcher is never handed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_published_before_the_sidecars_refuses_the_claim() {
    let env = start().await;
    let d = pod_dirs(NS, WARM);
    let (claim_dir, key_dir, proc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let key_file = key_dir.path().join("key.json");
    warm::write_key_file(&key_file, &a_key()).unwrap();
    let (s, _) = env.put_key(NS, WARM, &job(NS, WARM), serde_json::to_vec(&a_key()).unwrap()).await;
    assert_eq!(s, 200, "someone in the pod publishes a key of their own first");
    let mut w = WarmOptions::new(upload_opts(&env, NS, WARM, &d), claim_dir.path().into());
    (w.proc_root, w.wait_secs, w.claim_key) = (proc.path().into(), 5, Some(key_file));
    operator_store(&env).claim(NS, WARM, &a_claim(UID)).await.unwrap();
    let sidecar = tokio::spawn(async move { warm::run_warm_upload_sidecar(&w, &no_stop()).await });
    let _launcher = launcher_connects(&d).await;
    let why = match sidecar.await.unwrap().unwrap_err() {
        ClientError::Refused(why) => why,
        other => panic!("{other}"),
    };
    assert!(why.starts_with(warm::TAMPERED) && why.contains("another key was published"), "{why}");
    let result: LaunchResult = serde_json::from_slice(&env.get(&format!("{NS}/{UID}/outputs/result/result.json"), &op()).await.1).unwrap();
    assert_eq!(result.error.as_deref(), Some(why.as_str()));
    assert!(!claim_dir.path().join(CLAIM_FILE).exists(), "the launcher was never handed the claim");
}
