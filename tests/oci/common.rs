//! A real `docker-registry` (distribution v2.8, Debian package) on a
//! loopback port, one per test: started, polled until `/v2/` answers, killed
//! on drop.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

pub(crate) struct TestRegistry {
    /// `127.0.0.1:<port>`, as written in references.
    pub addr: String,
    pub dir: tempfile::TempDir,
    child: Child,
}

impl TestRegistry {
    pub(crate) async fn start() -> TestRegistry {
        Self::start_with(None).await
    }

    /// With htpasswd (Basic) auth: `htpasswd` is one `user:bcrypt` line.
    pub(crate) async fn start_with_htpasswd(htpasswd: &str) -> TestRegistry {
        Self::start_with(Some(htpasswd)).await
    }

    async fn start_with(htpasswd: Option<&str>) -> TestRegistry {
        skill_operator::tls::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        // Port 0 would be better, but the registry does not report its
        // port; a just-freed port is good enough on loopback.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let data = dir.path().join("data");
        let auth = match htpasswd {
            None => String::new(),
            Some(line) => {
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, format!("{line}\n")).unwrap();
                format!("auth:\n  htpasswd:\n    realm: test\n    path: {}\n", path.display())
            }
        };
        let config = format!(
            "version: 0.1\n\
             log:\n  level: error\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
             maintenance:\n    uploadpurging:\n      enabled: false\n\
             http:\n  addr: {addr}\n{auth}",
            data.display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let child = spawn(dir.path());
        let reg = TestRegistry { addr, dir, child };
        reg.wait_ready().await;
        reg
    }

    /// Stops the registry, its data kept: an outage.
    pub(crate) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same address and data, once it answers.
    pub(crate) async fn restart(&mut self) {
        self.stop();
        self.child = spawn(self.dir.path());
        self.wait_ready().await;
    }

    async fn wait_ready(&self) {
        let url = format!("http://{}/v2/", self.addr);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() || r.status() == reqwest::StatusCode::UNAUTHORIZED {
                    return;
                }
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
                panic!("registry at {} did not answer /v2/ within 15 s; log:\n{log}", self.addr);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Where the filesystem driver keeps a blob's bytes.
    pub(crate) fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path().join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }

    pub(crate) fn reference(&self, repo_and_tag: &str) -> String {
        format!("{}/{repo_and_tag}", self.addr)
    }

    pub(crate) fn registry(&self) -> skill_operator::oci::Registry {
        skill_operator::oci::Registry::new(skill_operator::oci::RegistryOptions::plain_http(self.addr.clone())).unwrap()
    }

    pub(crate) fn registry_with(&self, limits: skill_operator::oci::OciLimits) -> skill_operator::oci::Registry {
        let mut o = skill_operator::oci::RegistryOptions::plain_http(self.addr.clone());
        o.limits = limits;
        skill_operator::oci::Registry::new(o).unwrap()
    }
}

fn spawn(dir: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("registry.log")).unwrap();
    Command::new(REGISTRY_BIN)
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start /usr/bin/docker-registry (apt-get install docker-registry)")
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small skill tree on disk.
pub(crate) fn skill_dir(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("SKILL.md"), format!("---\nname: {name}\ndescription: test skill\n---\n# {name}\n")).unwrap();
    std::fs::create_dir_all(d.path().join("scripts")).unwrap();
    std::fs::write(d.path().join("scripts/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    set_mode(&d.path().join("scripts/run.sh"), 0o755);
    std::fs::write(d.path().join("reference.txt"), "some reference text\n".repeat(50)).unwrap();
    d
}

pub(crate) fn set_mode(p: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}
