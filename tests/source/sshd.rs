//! A real OpenSSH server for the ssh:// source tests: Debian's sshd on a
//! free loopback port, with a fresh host key and one authorized client key,
//! serving this machine's repositories to the current user.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The user the tests run as (the one sshd lets in).
pub(crate) fn user() -> String {
    String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap().trim().to_string()
}

pub(crate) const SSHD: &str = "/usr/sbin/sshd";

pub(crate) struct Sshd {
    child: Child,
    log: PathBuf,
    pub(crate) port: u16,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    /// The known_hosts line that pins this server's host key.
    pub(crate) fn known_hosts(&self) -> String {
        let host_pub = std::fs::read_to_string(self.log.with_file_name("host_ed25519.pub")).unwrap();
        let key: Vec<&str> = host_pub.split_whitespace().take(2).collect();
        format!("[127.0.0.1]:{} {} {}\n", self.port, key[0], key[1])
    }

    pub(crate) fn logins(&self) -> usize {
        std::fs::read_to_string(&self.log).unwrap_or_default().matches("Accepted publickey").count()
    }
}

pub(crate) fn keygen(path: &Path) -> String {
    let ok = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "test", "-f"]).arg(path).status().unwrap();
    assert!(ok.success());
    std::fs::read_to_string(path.with_extension("pub")).unwrap().trim().to_string()
}

/// An sshd on a free loopback port, accepting `client_pub` for this user.
pub(crate) fn sshd(dir: &Path, client_pub: &str) -> Option<Sshd> {
    if !Path::new(SSHD).exists() {
        skill_operator::gated::skip("the ssh:// source suite", &format!("{SSHD} is not installed"));
        return None;
    }
    // sshd insists on its privilege separation folder.
    let _ = std::fs::create_dir_all("/run/sshd");
    let host_key = dir.join("host_ed25519");
    keygen(&host_key);
    let authorized = dir.join("authorized_keys");
    std::fs::write(&authorized, format!("{client_pub}\n")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let user = user();
    let config = dir.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}/sshd.pid\nAuthorizedKeysFile {}\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PermitRootLogin prohibit-password\nAllowUsers {user}\nLogLevel VERBOSE\n",
            host_key.display(),
            dir.display(),
            authorized.display()
        ),
    )
    .unwrap();
    let log = dir.join("sshd.log");
    let child = Command::new(SSHD)
        .arg("-D")
        .arg("-f")
        .arg(&config)
        .arg("-E")
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "sshd did not listen; log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Sshd { child, log, port })
}
