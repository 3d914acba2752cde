//! `ssh://` repositories against a real OpenSSH server (Debian's sshd,
//! started here on loopback with its own host key and authorized key):
//! a fetch with the pinned host key and the right client key gets
//! `git rev-parse`'s commit (by branch and by commit id); a host key that
//! differs from the pinned one, a host known_hosts does not list, a client
//! key the server does not accept, and a source without a key are each
//! refused with their own reason, and a refused host key is refused before
//! the client authenticates (the server's log shows no login).
//!
//! SKIPPED without /usr/sbin/sshd (scripts/install-test-deps.sh installs it).

#[path = "source/repo.rs"]
mod repo_support;
use repo_support::{git, write};
#[path = "source/sshd.rs"]
mod sshd_support;
use sshd_support::{keygen, sshd, user};

use std::path::{Path, PathBuf};

use skill_operator::source::git::{fetch_tree_with, Access, Caps, GitRef, GitSourceError};
use skill_operator::source::ssh::SshKey;

fn repo(dir: &Path) -> (PathBuf, String) {
    let repo = dir.join("skills");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    write(&repo, "skills/demo/SKILL.md", "---\nname: demo\ndescription: over ssh\n---\nHello.\n");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    let commit = git(&repo, &["rev-parse", "main"]);
    (repo, commit)
}

#[test]
fn ssh_sources_need_the_pinned_host_key_and_an_accepted_client_key() {
    let tmp = tempfile::tempdir().unwrap();
    let client = tmp.path().join("client_ed25519");
    let client_pub = keygen(&client);
    let Some(server) = sshd(tmp.path(), &client_pub) else { return };
    let (repo, commit) = repo(tmp.path());
    let url = format!("ssh://{}@127.0.0.1:{}{}", user(), server.port, repo.display());
    let pinned = server.known_hosts();
    let host_pub = std::fs::read_to_string(tmp.path().join("host_ed25519.pub")).unwrap();
    let host_key: Vec<&str> = host_pub.split_whitespace().take(2).collect();
    let key = |private: &Path, known_hosts: &str| Access {
        ssh: Some(SshKey { private_key: std::fs::read_to_string(private).unwrap(), known_hosts: known_hosts.into() }),
        ..Access::default()
    };
    let fetch = |access: &Access, reference: Option<&str>, dest: &str| {
        let source = GitRef { url: url.clone(), reference: reference.map(String::from), path: None };
        fetch_tree_with(&source, access, &Caps::DEFAULT, &tmp.path().join(dest))
    };

    // The pinned key and an accepted client key: by branch, and by commit id.
    let good = key(&client, &pinned);
    let fetched = fetch(&good, Some("main"), "by-branch").unwrap();
    assert_eq!(fetched.commit, commit);
    assert!(tmp.path().join("by-branch/skills/demo/SKILL.md").is_file());
    assert_eq!(fetch(&good, Some(&commit), "by-commit").unwrap().commit, commit);
    let logins = server.logins();
    assert!(logins >= 2, "the server logged the logins");

    // Another key pinned for this very host: refused before logging in.
    let other_host = tmp.path().join("other_host");
    let other: Vec<String> = keygen(&other_host).split_whitespace().take(2).map(String::from).collect();
    let changed = format!("[127.0.0.1]:{} {} {}\n", server.port, other[0], other[1]);
    let err = fetch(&key(&client, &changed), Some("main"), "changed").unwrap_err();
    assert!(matches!(&err, GitSourceError::Url { why, .. } if why.contains("differs from the one pinned")), "{err}");
    // A host known_hosts does not list: refused, nothing learned.
    let elsewhere = format!("[git.example]:22 {} {}\n", host_key[0], host_key[1]);
    let err = fetch(&key(&client, &elsewhere), Some("main"), "unlisted").unwrap_err();
    assert!(matches!(&err, GitSourceError::Url { why, .. } if why.contains("does not list")), "{err}");
    assert_eq!(server.logins(), logins, "no login after a refused host key");

    // A client key the server does not know.
    let stranger = tmp.path().join("stranger");
    keygen(&stranger);
    let err = fetch(&key(&stranger, &pinned), Some("main"), "stranger-tree").unwrap_err();
    assert!(matches!(&err, GitSourceError::Url { why, .. } if why.contains("refused the key")), "{err}");

    // No key at all: the message says what the Secret needs.
    let err = fetch(&Access::default(), Some("main"), "keyless").unwrap_err();
    assert!(err.to_string().contains("ssh-privatekey") && err.to_string().contains("known_hosts"), "{err}");
    for dest in ["changed", "unlisted", "stranger-tree", "keyless"] {
        assert!(!tmp.path().join(dest).exists(), "{dest}: nothing written");
    }
}
