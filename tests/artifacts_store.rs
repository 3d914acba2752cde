//! The artifact endpoint on its built-in store (`artifacts --store DIR`):
//! every test of tests/artifacts.rs again with the store as the backing
//! (the module below), then the store's own rules attacked over its `/v2`
//! API with raw HTTP, the real `oci::Registry` client and the real binary
//! (`artifacts --store`, `package push`).

/// Read by tests/artifacts.rs's `start`: put the endpoint on the built-in store.
const ON_BUILTIN_STORE: bool = true;

#[path = "artifacts.rs"]
mod on_store;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use skill_operator::artifacts::server::{self, AppState, ServerConfig};
use skill_operator::artifacts::{self, sha256_digest};
use skill_operator::core::package;
use skill_operator::core::token::job_token;
use skill_operator::oci::{Auth, OciError, Registry, RegistryOptions, SetFile};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef-store-tests";
const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

struct Store {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    state: AppState,
    _spool: tempfile::TempDir,
}

async fn start_store() -> Store {
    start_store_in(tempfile::tempdir().unwrap()).await
}

async fn start_store_in(dir: tempfile::TempDir) -> Store {
    skill_operator::tls::install_crypto_provider();
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::with_store(dir.path(), KEY.to_vec());
    cfg.seed_samples = false;
    cfg.spool_dir = Some(spool.path().into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    cfg.use_store(addr);
    let state = AppState::new(cfg).unwrap();
    tokio::spawn(server::serve(listener, state.clone(), std::future::pending()));
    Store { addr, dir, state, _spool: spool }
}

fn operator_bearer() -> String {
    format!("Bearer operator:{}", artifacts::operator_token(KEY))
}

fn operator_basic() -> String {
    let pair = format!("operator:{}", artifacts::operator_token(KEY));
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
}

fn job_bearer(ns: &str, uid: &str) -> String {
    artifacts::job_bearer(ns, uid, &job_token(KEY, ns, uid))
}

/// The client the controller and gateway use, with the operator credential.
fn operator_client(s: &Store) -> Registry {
    let mut o = RegistryOptions::plain_http(s.addr.to_string());
    o.auth = Auth::Bearer(format!("operator:{}", artifacts::operator_token(KEY)));
    Registry::new(o).unwrap()
}

/// One raw HTTP/1.1 request (no client-side path normalisation).
async fn raw(addr: SocketAddr, method: &str, target: &str, auth: Option<&str>, body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let head = format!("{method} {target} HTTP/1.1\r\nHost: test\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await.unwrap();
    // A body refused early may meet a closed connection: the answer is what counts.
    let _ = s.write_all(body).await;
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp).await;
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4).unwrap_or(resp.len());
    let head = String::from_utf8_lossy(&resp[..split]).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head, resp[split..].to_vec())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
}

fn error_code(body: &[u8]) -> String {
    let v: serde_json::Value =
        serde_json::from_slice(body).unwrap_or_else(|_| panic!("not a registry error: {}", String::from_utf8_lossy(body)));
    v["errors"][0]["code"].as_str().unwrap_or_default().to_string()
}

/// Everything under the store directory, with sizes (to show nothing changed).
fn tree(root: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(root).unwrap().display().to_string(), e.metadata().unwrap().len());
            }
        }
    }
    out
}

/// Starts an upload and returns its Location path.
async fn begin(s: &Store, repo: &str) -> String {
    let (st, head, body) = raw(s.addr, "POST", &format!("/v2/{repo}/blobs/uploads/"), Some(&operator_bearer()), b"").await;
    assert_eq!(st, 202, "{head}{}", String::from_utf8_lossy(&body));
    header(&head, "location").unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_api_takes_the_operator_credential_and_refuses_job_tokens() {
    let s = start_store().await;
    let client = operator_client(&s);
    let digest = client.push_set_blob(&format!("{}/jobs:t", s.addr), b"secret input of another job").await.unwrap();
    let targets = [
        ("GET", "/v2/".to_string()),
        ("GET", format!("/v2/jobs/blobs/{digest}")),
        ("HEAD", format!("/v2/jobs/blobs/{digest}")),
        ("GET", "/v2/jobs/manifests/job_team-a_x_inputs".to_string()),
        ("POST", "/v2/jobs/blobs/uploads/".to_string()),
        ("DELETE", format!("/v2/jobs/manifests/{digest}")),
        ("GET", "/v2/jobs/tags/list".to_string()),
    ];
    let job = job_bearer("team-a", "3f1c2b9e-0d4a-4c55-9a7e-1b2c3d4e5f60");
    let forged = format!("Bearer operator:{}", "0".repeat(64));
    let wrong_key = format!("Bearer operator:{}", artifacts::operator_token(b"another key of at least thirty-two bytes!"));
    for (method, target) in &targets {
        let (st, _, body) = raw(s.addr, method, target, Some(&job), b"").await;
        assert_eq!(st, 403, "{method} {target} with a valid job token");
        if *method != "HEAD" {
            assert_eq!(error_code(&body), "DENIED");
        }
        let (st, head, _) = raw(s.addr, method, target, None, b"").await;
        assert_eq!(st, 401, "{method} {target} without a credential");
        assert_eq!(header(&head, "www-authenticate"), Some("Basic realm=\"skill-operator\""), "{method} {target}");
        for bad in [&forged, &wrong_key] {
            assert_eq!(raw(s.addr, method, target, Some(bad), b"").await.0, 401, "{method} {target} with {bad}");
        }
    }
    // The operator, as Bearer and as Basic, reads the blob back.
    for auth in [operator_bearer(), operator_basic()] {
        let (st, head, body) = raw(s.addr, "GET", &format!("/v2/jobs/blobs/{digest}"), Some(&auth), b"").await;
        assert_eq!(st, 200, "{head}");
        assert_eq!(body, b"secret input of another job");
        assert_eq!(header(&head, "docker-content-digest"), Some(digest.as_str()));
    }
    let (st, head, body) = raw(s.addr, "HEAD", &format!("/v2/jobs/blobs/{digest}"), Some(&operator_bearer()), b"").await;
    assert_eq!((st, body.len()), (200, 0));
    assert_eq!(header(&head, "content-length"), Some("27"), "HEAD tells the size: {head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_digests_and_tags_touch_nothing_outside_the_store() {
    let s = start_store().await;
    let outside = s.dir.path().parent().unwrap().join(format!("outside-{}", std::process::id()));
    std::fs::write(&outside, b"keep").unwrap();
    let before = tree(s.dir.path());
    let op = operator_bearer();
    let d = format!("sha256:{}", "a".repeat(64));
    let hostile = [
        ("GET", "/v2/../blobs/sha256/x".to_string(), 404),
        ("GET", "/v2/%2e%2e/manifests/latest".to_string(), 400),
        ("GET", "/v2/jobs/%2e%2e/%2e%2e/manifests/latest".to_string(), 400),
        ("GET", format!("/v2/jobs/blobs/sha256:..%2f..%2f{}", "a".repeat(58)), 404),
        ("GET", "/v2/jobs/blobs/sha256:../../outside".to_string(), 404),
        ("GET", "/v2/jobs/manifests/..".to_string(), 400),
        ("PUT", "/v2/jobs/manifests/..%2f..%2foutside".to_string(), 404),
        ("PUT", "/v2/Jobs/manifests/latest".to_string(), 400),
        ("PUT", "/v2/jobs/_tags/manifests/latest".to_string(), 400),
        ("PUT", "/v2/jobs//x/manifests/latest".to_string(), 400),
        ("GET", format!("/v2/jobs/blobs/sha512:{}", "a".repeat(128)), 400),
        ("GET", format!("/v2/jobs/blobs/{}", d.to_uppercase()), 400),
        ("PUT", format!("/v2/jobs/blobs/uploads/..%2f..%2foutside?digest={d}"), 404),
        ("PATCH", "/v2/jobs/blobs/uploads/..%2fblobs".to_string(), 404),
        ("DELETE", "/v2/jobs/manifests/..%2f..%2foutside".to_string(), 404),
    ];
    for (method, target, want) in &hostile {
        let (st, head, body) = raw(s.addr, method, target, Some(&op), b"{}").await;
        assert_eq!(st, *want, "{method} {target}: {head}{}", String::from_utf8_lossy(&body));
    }
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
    assert_eq!(tree(s.dir.path()), before, "a refused request wrote nothing");
    std::fs::remove_file(outside).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_whose_bytes_do_not_match_its_digest_is_not_stored() {
    let s = start_store().await;
    let op = operator_bearer();
    let claimed = sha256_digest(b"what the manifest will say");
    // Monolithic PUT of other bytes under the claimed digest.
    let loc = begin(&s, "jobs").await;
    let (st, _, body) = raw(s.addr, "PUT", &format!("{loc}?digest={claimed}"), Some(&op), b"other bytes").await;
    assert_eq!((st, error_code(&body).as_str()), (400, "DIGEST_INVALID"));
    // Chunked: the right prefix, then a wrong tail.
    let loc = begin(&s, "jobs").await;
    assert_eq!(raw(s.addr, "PATCH", &loc, Some(&op), b"what the manifest").await.0, 202);
    let (st, _, _) = raw(s.addr, "PUT", &format!("{loc}?digest={claimed}"), Some(&op), b" would NOT say").await;
    assert_eq!(st, 400);
    // POST ?digest= (single request) too.
    let (st, _, _) = raw(s.addr, "POST", &format!("/v2/jobs/blobs/uploads/?digest={claimed}"), Some(&op), b"nope").await;
    assert_eq!(st, 400);
    let (st, _, _) = raw(s.addr, "HEAD", &format!("/v2/jobs/blobs/{claimed}"), Some(&op), b"").await;
    assert_eq!(st, 404, "no blob under the claimed digest");
    assert!(std::fs::read_dir(s.dir.path().join("uploads")).unwrap().next().is_none(), "refused uploads leave no bytes behind");
    // A manifest naming a blob the store does not have is refused.
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": claimed, "size": 2}, "layers": []
    });
    let (st, _, body) = raw(s.addr, "PUT", "/v2/jobs/manifests/x", Some(&op), manifest.to_string().as_bytes()).await;
    assert_eq!((st, error_code(&body).as_str()), (400, "MANIFEST_BLOB_UNKNOWN"));
    // A manifest put under a digest it does not hash to is refused.
    let (st, _, _) = raw(s.addr, "PUT", &format!("/v2/jobs/manifests/{claimed}"), Some(&op), b"{\"schemaVersion\":2}").await;
    assert_eq!(st, 400);
    // Continuing an upload at the wrong offset is refused.
    let loc = begin(&s, "jobs").await;
    let mut req = format!("PATCH {loc} HTTP/1.1\r\nHost: t\r\nAuthorization: {op}\r\nContent-Range: 5-9\r\nContent-Length: 5\r\nConnection: close\r\n\r\nabcde");
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    c.write_all(req.as_bytes()).await.unwrap();
    req.clear();
    let mut resp = String::new();
    c.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 416"), "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_blobs_and_manifests_are_refused() {
    use skill_operator::core::limits::{STORE_BLOB_MAX_BYTES, STORE_MANIFEST_MAX_BYTES};
    let s = start_store().await;
    let op = operator_bearer();
    // A declared body over the cap: refused before a byte is read.
    let loc = begin(&s, "jobs").await;
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "PATCH {loc} HTTP/1.1\r\nHost: t\r\nAuthorization: {op}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        STORE_BLOB_MAX_BYTES + 1
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let mut resp = vec![0u8; 12];
    c.read_exact(&mut resp).await.unwrap();
    assert_eq!(&resp, b"HTTP/1.1 413");
    // An undeclared (chunked) body that passes the cap while streaming.
    let loc = begin(&s, "jobs").await;
    let chunk = bytes::Bytes::from(vec![7u8; 4 * 1024 * 1024]);
    let n = STORE_BLOB_MAX_BYTES / chunk.len() as u64 + 1;
    let body = futures::stream::iter((0..n).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    let resp = reqwest::Client::new()
        .patch(format!("http://{}{loc}", s.addr))
        .header("authorization", &op)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await;
    if let Ok(r) = resp {
        assert_eq!(r.status().as_u16(), 413);
    }
    // The upload was given up and its bytes freed.
    assert!(std::fs::read_dir(s.dir.path().join("uploads")).unwrap().next().is_none());
    assert_eq!(raw(s.addr, "GET", &loc, Some(&op), b"").await.0, 404, "the upload is gone");
    // A manifest over its cap.
    let big = vec![b' '; STORE_MANIFEST_MAX_BYTES as usize + 1];
    let (st, _, _) = raw(s.addr, "PUT", "/v2/jobs/manifests/big", Some(&op), &big).await;
    assert_eq!(st, 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_uploads_of_one_blob_all_succeed_and_store_it_once() {
    let s = start_store().await;
    let data: Vec<u8> = (0..(3 * 1024 * 1024 + 17)).map(|i| (i % 251) as u8).collect();
    let digest = sha256_digest(&data);
    // Separate clients: each HEADs, finds nothing and uploads (the client's own
    // one-upload-per-blob lock is per client).
    let pushes = (0..8).map(|i| {
        let (data, addr) = (data.clone(), s.addr);
        async move {
            let mut o = RegistryOptions::plain_http(addr.to_string());
            o.auth = Auth::Bearer(format!("operator:{}", artifacts::operator_token(KEY)));
            let client = Registry::new(o).unwrap();
            let reference = format!("{addr}/jobs:job_ns_{i}_inputs");
            let got = client.push_set_blob(&reference, &data).await.unwrap();
            let files = vec![SetFile { path: "in.bin".into(), size: data.len() as u64, digest: got.clone() }];
            let ann = BTreeMap::from([("dev.skill-operator.job".to_string(), format!("ns/{i}"))]);
            client.push_set_manifest(&reference, files, ann).await.unwrap();
            (reference, got)
        }
    });
    let results = futures::future::join_all(pushes).await;
    let client = operator_client(&s);
    for (reference, got) in results {
        assert_eq!(got, digest);
        let set = client.blob_set(&reference).await.unwrap();
        assert_eq!(client.pull_set_file(&reference, &set.files[0]).await.unwrap(), data);
    }
    let blob = s.dir.path().join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    assert_eq!(std::fs::read(blob).unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_pointing_at_another_jobs_manifest_is_refused() {
    let s = start_store().await;
    let http = reqwest::Client::new();
    let base = format!("http://{}/v1/jobs", s.addr);
    let op = artifacts::operator_bearer(KEY);
    let (ns, a, b) = ("team-a", "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002");
    for uid in [a, b] {
        let r = http
            .put(format!("{base}/{ns}/{uid}/inputs/in.txt"))
            .header("authorization", &op)
            .body(format!("input of {uid}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // Re-tag A's inputs manifest as B's inputs, through the store's own API.
    let client = operator_client(&s);
    let a_ref = format!("{}/jobs:{}", s.addr, artifacts::tag(ns, a, artifacts::ArtifactKind::Inputs));
    let a_digest = client.blob_set(&a_ref).await.unwrap().digest;
    let (st, _, body) = raw(s.addr, "GET", &format!("/v2/jobs/manifests/{a_digest}"), Some(&operator_bearer()), b"").await;
    assert_eq!(st, 200);
    let b_tag = artifacts::tag(ns, b, artifacts::ArtifactKind::Inputs);
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "PUT /v2/jobs/manifests/{b_tag} HTTP/1.1\r\nHost: t\r\nAuthorization: {}\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        operator_bearer(),
        body.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(&body).await.unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 201"), "{resp}");
    let r = http.get(format!("{base}/{ns}/{b}/inputs/in.txt")).header("authorization", job_bearer(ns, b)).send().await.unwrap();
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "wrong_artifact", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_seed_idempotently_and_survive_a_restart_on_the_same_directory() {
    let s = start_store().await;
    let first = s.state.seed_samples().await.unwrap();
    assert_eq!(first.len(), 5);
    let again = s.state.seed_samples().await.unwrap();
    assert_eq!(first, again, "seeding twice gives the same digests");
    let client = operator_client(&s);
    let pulled = client.pull(&first.iter().find(|(r, _)| r.contains("/csv-stats:")).unwrap().0).await.unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills/csv-stats");
    assert_eq!(pulled.package, package::build_from_dir(&repo).unwrap());
    // Stage a job's input, then start a new endpoint on the same directory
    // (an upgrade's new pod on the same volume): everything is still there.
    let http = reqwest::Client::new();
    let url = |addr: SocketAddr| format!("http://{addr}/v1/jobs/team-a/cccccccc-0000-4000-8000-000000000003/inputs/in.txt");
    let r = http.put(url(s.addr)).header("authorization", artifacts::operator_bearer(KEY)).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let Store { dir, .. } = s;
    let s2 = start_store_in(dir).await;
    let r = http.get(url(s2.addr)).header("authorization", artifacts::operator_bearer(KEY)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "kept");
    let client = operator_client(&s2);
    for (reference, digest) in &first {
        let moved = reference.replacen(&reference[..reference.find('/').unwrap()], &s2.addr.to_string(), 1);
        assert_eq!(&client.pull(&moved).await.unwrap().digest, digest);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_removes_old_unreferenced_blobs_only() {
    let s = start_store().await;
    let client = operator_client(&s);
    let reference = format!("{}/jobs:kept", s.addr);
    let kept = client.push_set_blob(&reference, b"named by a manifest").await.unwrap();
    let files = vec![SetFile { path: "a".into(), size: 19, digest: kept.clone() }];
    client.push_set_manifest(&reference, files, BTreeMap::new()).await.unwrap();
    let orphan_old = client.push_set_blob(&reference, b"nobody names me, and I am old").await.unwrap();
    let orphan_new = client.push_set_blob(&reference, b"nobody names me yet").await.unwrap();
    let path = |d: &str| s.dir.path().join("blobs/sha256").join(d.trim_start_matches("sha256:"));
    let past = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
    for d in [&kept, &orphan_old] {
        std::fs::File::options().write(true).open(path(d)).unwrap().set_modified(past).unwrap();
    }
    let store = s.state.store().unwrap().clone();
    assert_eq!(tokio::task::spawn_blocking(move || store.collect_garbage()).await.unwrap().unwrap(), 1);
    assert!(path(&kept).exists(), "a named blob stays, however old");
    assert!(!path(&orphan_old).exists(), "an old unnamed blob goes");
    assert!(path(&orphan_new).exists(), "a young unnamed blob stays (a push may be about to name it)");
    assert!(client.blob_set(&reference).await.is_ok());
    // Deleting the manifest leaves its blobs to the next sweep.
    assert!(client.delete(&reference).await.unwrap());
    assert!(matches!(client.blob_set(&reference).await, Err(OciError::NotFound { .. })));
}

/// `package push` to the built-in store of a real `artifacts --store` process,
/// with the operator credential derived from the token key; refused without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_push_reaches_the_store_of_the_real_binary_with_the_operator_credential() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("token-key");
    std::fs::write(&key, KEY).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut endpoint = Command::new(BIN)
        .args(["artifacts", "--listen", &format!("127.0.0.1:{port}"), "--metrics-auth", "none", "--store"])
        .arg(dir.path().join("store"))
        .arg("--token-key-file")
        .arg(&key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = {
        let mut o = RegistryOptions::plain_http(addr.to_string());
        o.auth = Auth::Bearer(format!("operator:{}", artifacts::operator_token(KEY)));
        Registry::new(o).unwrap()
    };
    // The seeded samples appear once the endpoint is up.
    let deadline = Instant::now() + Duration::from_secs(30);
    let seeded = loop {
        match client.resolve(&format!("{addr}/samples/csv-stats:latest")).await {
            Ok(d) => break d,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("the endpoint never served the seeded csv-stats: {e}"),
        }
    };
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills/csv-stats");
    let push = |extra: &[&str]| {
        Command::new(BIN)
            .args(["package", "push"])
            .arg(&sample)
            .args(["--registry", &format!("{addr}/skills"), "--tag", "1.0.0", "--plain-http"])
            .args(extra)
            .env_remove("SKILL_OPERATOR_REGISTRY_PASSWORD")
            .output()
            .unwrap()
    };
    let refused = push(&[]);
    assert!(!refused.status.success(), "an anonymous push must fail");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("refused access"), "{}", String::from_utf8_lossy(&refused.stderr));
    let out = push(&["--token-key-file", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let digest = stdout.lines().find_map(|l| l.strip_prefix("# digest: ")).unwrap();
    assert_eq!(digest, seeded, "the seeded sample has the digest `package push` gives the repository's directory");
    let _ = endpoint.kill();
    let _ = endpoint.wait();
}

/// The controller's resolver, configured from the artifact endpoint URL as
/// `controller` does, resolves a SkillPackage naming the store (the chart's
/// samples); without the operator credential the store refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_resolver_reads_the_store_with_the_credential_derived_from_the_endpoint_url() {
    use skill_operator::controller::context::PackageResolver;
    use skill_operator::controller::resolver::OciResolver;
    let s = start_store().await;
    let seeded = s.state.seed_samples().await.unwrap();
    let (reference, digest) = seeded.iter().find(|(r, _)| r.contains("/csv-stats:")).unwrap().clone();
    let source: skill_operator::api::package::OciSource =
        serde_json::from_value(serde_json::json!({ "reference": reference, "insecure": true })).unwrap();
    let store = skill_operator::artifacts::operator::store_access(&format!("http://{}", s.addr), KEY).unwrap();
    let with = OciResolver { plain_http: vec![store.registry.clone()], credentials: vec![(store.registry, store.auth)] };
    let fetched = with.fetch(&source).await.unwrap();
    assert_eq!(fetched.digest, digest);
    let without = OciResolver { plain_http: Vec::new(), credentials: Vec::new() };
    let err = without.fetch(&source).await.unwrap_err();
    assert!(err.to_string().contains("refused access"), "{err}");
}

/// `Registry::list_tags` against the built-in store: the same answers as
/// distribution's (tests/registry.rs), pages with `?n=&last=` and a `Link`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_lists_tags_in_pages_and_an_unknown_repository_has_none() {
    let s = start_store().await;
    let client = operator_client(&s);
    let repo = format!("{}/jobs", s.addr);
    assert_eq!(client.list_tags(&repo).await.unwrap(), Vec::<String>::new());
    let mut want: Vec<String> = (0..7).map(|i| format!("t{i}")).collect();
    want.push(format!("team-a.{}", "a".repeat(64)));
    for tag in &want {
        client.push_blob_set(&format!("{repo}:{tag}"), vec![("f".into(), tag.as_bytes().to_vec())]).await.unwrap();
    }
    want.sort();
    for page in [1, 2, 3, 8, 9, skill_operator::oci::TAGS_PAGE] {
        assert_eq!(client.list_tags_paged(&repo, page).await.unwrap(), want, "pages of {page}");
    }
    // The raw pages.
    let (st, head, body) = raw(s.addr, "GET", "/v2/jobs/tags/list?n=3", Some(&operator_bearer()), b"").await;
    assert_eq!(st, 200);
    let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(page["tags"], serde_json::json!(["t0", "t1", "t2"]));
    assert_eq!(header(&head, "link"), Some("</v2/jobs/tags/list?last=t2&n=3>; rel=\"next\""));
    let (_, head, body) = raw(s.addr, "GET", "/v2/jobs/tags/list?last=t5&n=3", Some(&operator_bearer()), b"").await;
    let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(page["tags"], serde_json::json!(["t6", format!("team-a.{}", "a".repeat(64))]));
    assert_eq!(header(&head, "link"), None, "the last page");
    let (_, head, body) = raw(s.addr, "GET", "/v2/jobs/tags/list", Some(&operator_bearer()), b"").await;
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&body).unwrap()["tags"].as_array().unwrap().len(), want.len());
    assert_eq!(header(&head, "link"), None, "no n: everything at once");
    // A job token lists nothing.
    let (st, _, _) = raw(s.addr, "GET", "/v2/jobs/tags/list", Some(&job_bearer("team-a", "uid")), b"").await;
    assert_eq!(st, 403);
    // Deleting takes the tag out.
    client.delete(&format!("{repo}:t3")).await.unwrap();
    want.retain(|t| t != "t3");
    assert_eq!(client.list_tags_paged(&repo, 2).await.unwrap(), want);
}
