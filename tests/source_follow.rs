//! A marketplace's followed plugins share the source's caps: a plugin
//! fetched from a real `git daemon` on loopback fits when the files
//! already fetched plus its own reach the cap exactly, and refuses the
//! whole fetch one file over, writing nothing. A followed plugin is fetched
//! at the commit the marketplace pins, not its branch's newer head, and
//! the marketplace entry is pointed at the folder it was written to.
//!
//! SKIPPED without git daemon.

#[path = "source/repo.rs"]
mod repo_support;
use repo_support::{git, write};

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use skill_operator::core::marketplace::MARKETPLACE_FILE;
use skill_operator::source::follow::{follow, FollowError, Rules, FOLLOW_DIR};
use skill_operator::source::git::{Access, Caps, GitSourceError};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn followed_plugins_share_the_sources_caps_and_are_fetched_at_their_pin() {
    let exec_path = String::from_utf8(std::process::Command::new("git").arg("--exec-path").output().unwrap().stdout).unwrap();
    if !Path::new(exec_path.trim()).join("git-daemon").exists() {
        skill_operator::gated::skip("the followed-plugin caps", "git daemon is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let plugin = tmp.path().join("plugin");
    std::fs::create_dir(&plugin).unwrap();
    git(&plugin, &["init", "-q", "-b", "main"]);
    write(&plugin, "skills/chart/SKILL.md", "---\nname: chart\ndescription: charts\n---\n");
    write(&plugin, "skills/chart/a.txt", "a\n");
    write(&plugin, "skills/chart/b.txt", "b\n");
    git(&plugin, &["add", "."]);
    git(&plugin, &["commit", "-q", "-m", "three files"]);
    let pinned = git(&plugin, &["rev-parse", "main"]);
    write(&plugin, "skills/chart/c.txt", "c\n");
    git(&plugin, &["add", "."]);
    git(&plugin, &["commit", "-q", "-m", "a fourth on the branch"]);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _daemon = Daemon(
        repo_support::git_daemon_command()
            .args(["--export-all", "--reuseaddr", "--listen=127.0.0.1", &format!("--port={port}")])
            .arg(format!("--base-path={}", tmp.path().display()))
            .arg(tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "git daemon did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }

    let market = |name: &str| {
        let root = tmp.path().join(name);
        std::fs::create_dir_all(root.join(".claude-plugin")).unwrap();
        let entry = serde_json::json!({ "plugins": [
            { "name": "kit", "source": { "source": "url", "url": format!("git://127.0.0.1:{port}/plugin"), "ref": "main", "sha": pinned } }
        ]});
        std::fs::write(root.join(MARKETPLACE_FILE), entry.to_string()).unwrap();
        root
    };
    let access = Access::default();
    let hosts = vec!["127.0.0.1".to_string()];
    let rules = Rules::new("git://127.0.0.1:1/market", &access, &hosts);
    let caps = Caps { max_files: 10, ..Caps::DEFAULT };

    // 7 files already fetched + the plugin's 3 at its pin = the cap.
    let fits = market("fits");
    let followed = follow(&fits, &rules, &caps, (7, 0), &mut Vec::new()).unwrap();
    assert_eq!(followed.len(), 1);
    assert_eq!(followed[0].commit, pinned, "the pinned commit, not the branch's head");
    let folder = fits.join(&followed[0].folder);
    assert!(folder.join("skills/chart/b.txt").is_file() && !folder.join("skills/chart/c.txt").exists());
    let rewritten: serde_json::Value = serde_json::from_slice(&std::fs::read(fits.join(MARKETPLACE_FILE)).unwrap()).unwrap();
    assert_eq!(rewritten["plugins"][0]["source"], format!("./{FOLLOW_DIR}/0"));

    // One file more already fetched: the plugin passes the shared cap.
    let over = market("over");
    let err = follow(&over, &rules, &caps, (8, 0), &mut Vec::new()).unwrap_err();
    assert!(matches!(err, FollowError::Git(GitSourceError::Cap { cap: "file count", .. })), "{err}");
    assert!(std::fs::read_dir(over.join(FOLLOW_DIR)).map_or(true, |mut d| d.next().is_none()), "nothing written past the cap");
}
