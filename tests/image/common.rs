//! Shared by the image tests: a real `docker-registry` on loopback with its
//! access log on (to count requests), base images the tests build
//! themselves (an OCI layout pushed with skopeo), and independent readers
//! (skopeo, umoci). Tools missing → `SKIPPED: …`, or a failure when
//! `SKILL_OPERATOR_REQUIRE_GATED=1`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub(crate) const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// True when every tool is on PATH; otherwise prints `SKIPPED: …` and
/// returns false, or panics under `SKILL_OPERATOR_REQUIRE_GATED=1`.
pub(crate) fn have_tools(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!("{test}: {} not installed (scripts/install-test-deps.sh installs them)", missing.join(", "));
    if std::env::var("SKILL_OPERATOR_REQUIRE_GATED").as_deref() == Ok("1") {
        panic!("SKILL_OPERATOR_REQUIRE_GATED=1 and {why}");
    }
    println!("SKIPPED: {why}");
    false
}

pub(crate) fn on_path(tool: &str) -> bool {
    if tool.contains('/') {
        return Path::new(tool).exists();
    }
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// One request as the registry's access log recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    pub path: String,
    pub status: u16,
}

impl Request {
    /// A blob upload's data (monolithic PUT or chunk PATCH).
    pub(crate) fn is_blob_write(&self) -> bool {
        self.path.contains("/blobs/uploads/") && (self.method == "PUT" || self.method == "PATCH")
    }
    pub(crate) fn is_mount(&self) -> bool {
        self.method == "POST" && self.path.contains("mount=")
    }
    pub(crate) fn is_manifest_put(&self) -> bool {
        self.method == "PUT" && self.path.contains("/manifests/")
    }
    pub(crate) fn is_write(&self) -> bool {
        matches!(self.method.as_str(), "PUT" | "POST" | "PATCH" | "DELETE")
    }
    /// `GET /v2/<repo>/blobs/<digest>`: a blob download.
    pub(crate) fn downloads_blob(&self, digest: &str) -> bool {
        self.method == "GET" && self.path.contains("/blobs/") && !self.path.contains("/uploads/") && self.path.contains(digest)
    }
}

pub(crate) struct TestRegistry {
    /// `127.0.0.1:<port>`.
    pub addr: String,
    pub dir: tempfile::TempDir,
    child: Child,
}

impl TestRegistry {
    pub(crate) async fn start() -> TestRegistry {
        skill_operator::tls::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let data = dir.path().join("data");
        // The access log (combined format, on stdout) is what the tests
        // count requests from.
        let config = format!(
            "version: 0.1\n\
             log:\n  level: error\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
             maintenance:\n    uploadpurging:\n      enabled: false\n\
             http:\n  addr: {addr}\n",
            data.display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start /usr/bin/docker-registry (apt-get install docker-registry)");
        let reg = TestRegistry { addr, dir, child };
        reg.wait_ready().await;
        reg
    }

    async fn wait_ready(&self) {
        let url = format!("http://{}/v2/", self.addr);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("registry at {} did not answer /v2/ within 15 s:\n{}", self.addr, self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Every request logged so far, in order. The log line is written
    /// after the response, so wait a moment first.
    pub(crate) async fn requests(&self) -> Vec<Request> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.log()
            .lines()
            .filter_map(|l| {
                // 127.0.0.1 - - [date] "GET /v2/ HTTP/1.1" 200 2 "" "agent"
                let q = l.find('"')?;
                let rest = &l[q + 1..];
                let end = rest.find('"')?;
                let mut req = rest[..end].split(' ');
                let method = req.next()?.to_string();
                let path = req.next()?.to_string();
                let status = rest[end + 1..].split_whitespace().next()?.parse().ok()?;
                Some(Request { method, path, status })
            })
            .collect()
    }

    pub(crate) fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path().join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }

    pub(crate) fn reference(&self, repo: &str) -> String {
        format!("{}/{repo}", self.addr)
    }

    /// A `Remote` for this registry (plain HTTP).
    pub(crate) fn remote(&self) -> skill_operator::image::Remote {
        skill_operator::image::Remote::new(skill_operator::oci::RegistryOptions::plain_http(self.addr.clone())).unwrap()
    }

    /// The digest `repo:tag` resolves to, read by HEAD (not our client).
    pub(crate) async fn digest_of(&self, repo_tag: &str) -> String {
        let (repo, tag) = repo_tag.rsplit_once(':').unwrap();
        let url = format!("http://{}/v2/{repo}/manifests/{tag}", self.addr);
        let accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
                      application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";
        let r = reqwest::Client::new().head(&url).header("Accept", accept).send().await.unwrap();
        assert!(r.status().is_success(), "HEAD {url}: {}", r.status());
        r.headers().get("Docker-Content-Digest").unwrap().to_str().unwrap().to_string()
    }

    /// A blob's bytes, by plain GET.
    pub(crate) async fn blob(&self, repo: &str, digest: &str) -> Vec<u8> {
        let url = format!("http://{}/v2/{repo}/blobs/{digest}", self.addr);
        let r = reqwest::Client::new().get(&url).send().await.unwrap();
        assert!(r.status().is_success(), "GET {url}: {}", r.status());
        r.bytes().await.unwrap().to_vec()
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// -- base images, built by the tests --------------------------------------

pub(crate) fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A rootfs tarball (uncompressed tar, gzip'd) of `files` (path, content);
/// returns (gzip bytes, diff_id).
pub(crate) fn rootfs_layer(files: &[(&str, &[u8])]) -> (Vec<u8>, String) {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for (path, _) in files {
        let mut acc = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for p in &parts[..parts.len() - 1] {
            acc = if acc.is_empty() { p.to_string() } else { format!("{acc}/{p}") };
            dirs.insert(acc.clone());
        }
    }
    for d in &dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, format!("{d}/"), std::io::empty()).unwrap();
    }
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, *data).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let diff_id = sha256(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).unwrap();
    (gz.finish().unwrap(), diff_id)
}

/// One platform image of a test base.
pub(crate) struct BaseImageSpec<'a> {
    pub os: &'a str,
    pub arch: &'a str,
    /// Layers, bottom to top, each a list of files.
    pub layers: Vec<Vec<(&'a str, &'a [u8])>>,
    /// Index entry annotations (e.g. an attestation marker).
    pub annotations: BTreeMap<String, String>,
}

fn write_blob(layout: &Path, data: &[u8]) -> (String, u64) {
    let d = sha256(data);
    let p = layout.join("blobs/sha256").join(d.trim_start_matches("sha256:"));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    (d, data.len() as u64)
}

/// Writes an OCI layout at `layout` holding `images` as `tag`: one
/// manifest when `index` is false (and there is one image), else an index.
pub(crate) fn write_layout(layout: &Path, tag: &str, images: &[BaseImageSpec<'_>], index: bool) {
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let mut entries = Vec::new();
    for img in images {
        let mut layers = Vec::new();
        let mut diff_ids = Vec::new();
        let mut history = Vec::new();
        for files in &img.layers {
            let (gz, diff_id) = rootfs_layer(files);
            let (d, s) = write_blob(layout, &gz);
            layers.push(serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": s}));
            diff_ids.push(diff_id);
            history.push(serde_json::json!({"created": "2024-01-01T00:00:00Z", "created_by": "test base layer"}));
        }
        let config = serde_json::json!({
            "architecture": img.arch, "os": img.os, "created": "2024-01-01T00:00:00Z",
            "config": {"Env": ["PATH=/usr/bin:/bin", "PYTHONPATH=/old"], "Cmd": ["/bin/sh"], "Labels": {"base.label": "kept"}},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": history,
        });
        let (cd, cs) = write_blob(layout, serde_json::to_vec(&config).unwrap().as_slice());
        let manifest = serde_json::json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
            "layers": layers,
        });
        let (md, ms) = write_blob(layout, serde_json::to_vec(&manifest).unwrap().as_slice());
        let mut e = serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
            "platform": {"os": img.os, "architecture": img.arch}});
        if !img.annotations.is_empty() {
            e["annotations"] = serde_json::to_value(&img.annotations).unwrap();
        }
        entries.push(e);
    }
    let top = if index {
        let idx = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries});
        let (d, s) = write_blob(layout, serde_json::to_vec(&idx).unwrap().as_slice());
        serde_json::json!({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": d, "size": s})
    } else {
        assert_eq!(entries.len(), 1);
        let mut e = entries.remove(0);
        e.as_object_mut().unwrap().remove("platform");
        e
    };
    let mut top = top;
    top["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
    let index_json = serde_json::json!({"schemaVersion": 2, "manifests": [top]});
    std::fs::write(layout.join("index.json"), serde_json::to_vec(&index_json).unwrap()).unwrap();
}

pub(crate) fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}\n{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `skopeo copy` from an OCI layout to the registry (`extra`: `--all`,
/// `--format v2s2`…).
pub(crate) fn skopeo_push(layout: &Path, tag: &str, dest: &str, extra: &[&str]) {
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .args(extra)
        .arg(format!("oci:{}:{tag}", layout.display()))
        .arg(format!("docker://{dest}")));
}

/// `skopeo inspect --raw` (the manifest or index as stored).
pub(crate) fn skopeo_raw(reference: &str) -> serde_json::Value {
    let out = run(Command::new("skopeo").args(["inspect", "--raw", "--tls-verify=false"]).arg(format!("docker://{reference}")));
    serde_json::from_str(&out).unwrap()
}

/// `skopeo inspect --config` for one architecture.
pub(crate) fn skopeo_config(reference: &str, arch: &str) -> serde_json::Value {
    let out = run(Command::new("skopeo")
        .args(["--override-arch", arch, "--override-os", "linux", "inspect", "--config", "--tls-verify=false"])
        .arg(format!("docker://{reference}")));
    serde_json::from_str(&out).unwrap()
}

/// Pulls `reference` (one architecture) with skopeo into an OCI layout and
/// unpacks it with umoci; returns the rootfs.
pub(crate) fn pull_and_unpack(reference: &str, arch: &str, work: &Path) -> PathBuf {
    let layout = work.join(format!("layout-{arch}"));
    run(Command::new("skopeo")
        .args(["--override-arch", arch, "--override-os", "linux", "copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .arg(format!("oci:{}:img", layout.display())));
    let bundle = work.join(format!("bundle-{arch}"));
    run(Command::new("umoci").args(["unpack", "--rootless", "--image"]).arg(format!("{}:img", layout.display())).arg(&bundle));
    bundle.join("rootfs")
}

/// A small skill tree.
pub(crate) fn skill_dir(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("SKILL.md"), format!("---\nname: {name}\ndescription: test skill\n---\n# {name}\n")).unwrap();
    std::fs::create_dir_all(d.path().join("scripts")).unwrap();
    std::fs::write(d.path().join("scripts/run.py"), "print('hi')\n").unwrap();
    set_mode(&d.path().join("scripts/run.py"), 0o755);
    std::fs::write(d.path().join("reference.txt"), "some reference text\n".repeat(50)).unwrap();
    d
}

/// A dependency tree as `image deps` lays it out (without running pip).
pub(crate) fn deps_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("python/tinypkg")).unwrap();
    std::fs::write(d.path().join("python/tinypkg/__init__.py"), "VALUE = 42\n").unwrap();
    std::fs::create_dir_all(d.path().join("node/node_modules/tinylib")).unwrap();
    std::fs::write(d.path().join("node/node_modules/tinylib/index.js"), "module.exports = 1;\n").unwrap();
    d
}

pub(crate) fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every regular file under `root`, relative path → bytes.
pub(crate) fn files_under(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                walk(root, &e.path(), out);
            } else if ft.is_file() {
                out.insert(e.path().strip_prefix(root).unwrap().display().to_string(), std::fs::read(e.path()).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}
