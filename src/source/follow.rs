//! Plugins a fetched marketplace lists from other git repositories
//! (`github`, `url` and `git-subdir` sources), fetched for a SkillSource.
//!
//! Following is opt-in per host (`spec.git.followHosts`): a repository's
//! owner would otherwise choose which servers the controller connects to.
//! Only entries pinned by `sha` are followed, so the source's own commit
//! names everything it publishes (a `ref` could move under an approved
//! commit and change content nobody reviewed). Each followed plugin is
//! fetched with the same rules as the source (nothing runs, refused
//! entries reported) into a folder of the fetched root, and the
//! marketplace entry is pointed at it, so the recursive walk names its
//! skills `<plugin>/<skill>` as it does for a local plugin.
//!
//! What an entry lacks (a pin, an allowed host, a git URL) is a problem
//! line and the entry is skipped. A fetch that fails fails the whole
//! source, never a silent drop of its skills (which would delete their
//! packages). The source's caps cover all trees together; a source's
//! token goes only to its own scheme, host and port.

use std::path::Path;

use super::git::{self, Access, Caps, GitRef, GitSourceError};
use crate::core::limits::SOURCE_MAX_FOLLOWED;
use crate::core::marketplace::{self, RemotePlugin};
use crate::core::paths::RelPath;

/// Why following a marketplace's plugins failed the whole fetch.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("the marketplace lists {count} plugins to follow, more than the {max} a source may fetch; list fewer hosts in spec.git.followHosts or split the marketplace")]
    TooManyPlugins { count: usize, max: usize },
    #[error("a followed plugin: {0}")]
    Git(#[from] GitSourceError),
    #[error("pointing the marketplace at the followed plugins: {0}")]
    Io(#[from] std::io::Error),
}

impl FollowError {
    /// Whether fetching again later may succeed (a plugin's server, not its content).
    pub fn is_transient(&self) -> bool {
        matches!(self, FollowError::Git(GitSourceError::Fetch { .. }) | FollowError::Io(_))
    }
}

/// Where followed plugins are written under the fetched root.
pub const FOLLOW_DIR: &str = ".skill-operator-followed";

/// One followed plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    /// Its name in the marketplace.
    pub plugin: String,
    pub url: String,
    /// Its folder in that repository (`git-subdir`), if any.
    pub path: Option<String>,
    /// The commit fetched (the entry's `sha`).
    pub commit: String,
    /// Its folder below the fetched root.
    pub folder: String,
    /// Its place in the marketplace's `plugins[]`.
    pub index: usize,
}

/// What may be followed.
pub struct Rules<'a> {
    /// The source's own URL: its scheme may be used besides `https`, and its
    /// token goes to its own origin only.
    pub source_url: &'a str,
    pub access: &'a Access,
    /// Hosts plugins may be fetched from (case-insensitive, no port).
    pub hosts: &'a [String],
    /// At most this many plugins ([`SOURCE_MAX_FOLLOWED`] for a SkillSource).
    pub max_plugins: usize,
}

impl Rules<'_> {
    pub fn new<'a>(source_url: &'a str, access: &'a Access, hosts: &'a [String]) -> Rules<'a> {
        Rules { source_url, access, hosts, max_plugins: SOURCE_MAX_FOLLOWED }
    }
}

/// Fetches the followed plugins of the marketplace under `root` (already
/// fetched, `used` files and bytes of `caps`). Problems go to `problems`.
pub fn follow(
    root: &Path,
    rules: &Rules,
    caps: &Caps,
    used: (usize, u64),
    problems: &mut Vec<String>,
) -> Result<Vec<Followed>, FollowError> {
    if rules.hosts.is_empty() {
        return Ok(Vec::new());
    }
    let remotes = marketplace::remote_plugins(root);
    if remotes.is_empty() {
        return Ok(Vec::new());
    }
    let file = marketplace::MARKETPLACE_FILE;
    if std::fs::symlink_metadata(root.join(FOLLOW_DIR)).is_ok() {
        problems.push(format!("{FOLLOW_DIR}: the repository has a folder of this name; its marketplace's remote plugins are not followed"));
        return Ok(Vec::new());
    }
    let source = reqwest::Url::parse(rules.source_url).ok();
    let mut wanted = Vec::new();
    for remote in remotes {
        match admit(&remote, rules, source.as_ref()) {
            Ok(plan) => wanted.push((remote, plan)),
            Err(why) => problems.push(format!("{file}: plugin `{}` (plugins[{}]) is not followed: {why}", remote.name, remote.index)),
        }
    }
    if wanted.len() > rules.max_plugins {
        return Err(FollowError::TooManyPlugins { count: wanted.len(), max: rules.max_plugins });
    }
    if !wanted.is_empty() {
        std::fs::create_dir_all(root.join(FOLLOW_DIR))?;
    }
    let (mut files, mut bytes) = used;
    let mut followed = Vec::with_capacity(wanted.len());
    for (remote, (source, access)) in wanted {
        let folder = format!("{FOLLOW_DIR}/{}", remote.index);
        let left =
            Caps { max_files: caps.max_files.saturating_sub(files), max_total_bytes: caps.max_total_bytes.saturating_sub(bytes), ..*caps };
        let fetched = git::fetch_tree_with(&source, &access, &left, &root.join(&folder))?;
        files += fetched.files;
        bytes += fetched.bytes;
        problems.extend(fetched.refused.iter().map(|r| format!("{folder}/{}: {}", r.path, r.reason)));
        followed.push(Followed {
            plugin: remote.name,
            url: source.url,
            path: source.path.map(|p| p.as_str().to_string()),
            commit: fetched.commit,
            folder,
            index: remote.index,
        });
    }
    let folders: Vec<(usize, String)> = followed.iter().map(|f| (f.index, f.folder.clone())).collect();
    marketplace::point_at_folders(root, &folders)?;
    Ok(followed)
}

/// What to fetch for `remote` and with which access, or why not.
fn admit(remote: &RemotePlugin, rules: &Rules, source: Option<&reqwest::Url>) -> Result<(GitRef, Access), String> {
    let Some(raw) = remote.url.as_deref() else {
        return Err(format!("a `{}` source is not a git repository", remote.kind));
    };
    let Some(sha) = remote.sha.as_deref().filter(|s| git::is_commit_id(s)) else {
        return Err("the marketplace does not pin it with a 40-hex `sha` (a source follows pinned plugins only, so its commit names all it publishes)".into());
    };
    let url = reqwest::Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL ({e})"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{raw:?} carries credentials in the URL"));
    }
    let same_scheme = source.is_some_and(|s| s.scheme() == url.scheme());
    if url.scheme() != "https" && !same_scheme {
        return Err(format!("{raw:?}: only https:// (or the source's own scheme) is followed"));
    }
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    if !rules.hosts.iter().any(|h| h.eq_ignore_ascii_case(&host)) {
        return Err(format!("its host {host:?} is not in spec.git.followHosts"));
    }
    let path = match remote.path.as_deref().map(|p| p.trim_start_matches("./").trim_end_matches('/')) {
        None | Some("") | Some(".") => None,
        Some(p) => Some(RelPath::parse(p).map_err(|why| format!("path {p:?}: {why}"))?),
    };
    // The source's token and plain-HTTP allowance belong to its own origin.
    let same_origin = source.is_some_and(|s| s.origin() == url.origin());
    let access = Access {
        local: false,
        insecure_http: rules.access.insecure_http && same_origin,
        basic: if same_origin { rules.access.basic.clone() } else { None },
        // An ssh:// URL has no comparable origin: a followed plugin never
        // gets the source's SSH key.
        ssh: None,
    };
    Ok((GitRef { url: raw.to_string(), reference: Some(sha.to_string()), path }, access))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(url: &str, sha: Option<&str>) -> RemotePlugin {
        RemotePlugin {
            index: 0,
            name: "p".into(),
            kind: "url".into(),
            url: Some(url.into()),
            path: None,
            sha: sha.map(String::from),
            reference: None,
        }
    }

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn only_pinned_https_entries_on_listed_hosts_are_followed_and_the_token_stays_home() {
        let access = Access { local: false, insecure_http: true, basic: Some(("u".into(), "t".into())), ssh: None };
        let hosts = vec!["github.com".to_string(), "git.example".to_string()];
        let rules = Rules::new("https://git.example/team/market.git", &access, &hosts);
        let source = reqwest::Url::parse(rules.source_url).ok();
        let admit = |r: &RemotePlugin| admit(r, &rules, source.as_ref());

        let (at, access) = admit(&remote("https://github.com/o/r.git", Some(SHA))).unwrap();
        assert_eq!(at.reference.as_deref(), Some(SHA));
        assert!(access.basic.is_none() && !access.insecure_http, "another host gets neither the token nor plain HTTP");
        let (_, home) = admit(&remote("https://git.example/team/plugin.git", Some(SHA))).unwrap();
        assert!(home.basic.is_some(), "the source's own host gets its token");
        let (_, port) = admit(&remote("https://git.example:8443/team/plugin.git", Some(SHA))).unwrap();
        assert!(port.basic.is_none(), "another port is another origin");

        for (url, sha, why) in [
            ("https://github.com/o/r.git", None, "pin"),
            ("https://github.com/o/r.git", Some("main"), "pin"),
            ("https://evil.example/o/r.git", Some(SHA), "followHosts"),
            ("http://github.com/o/r.git", Some(SHA), "https"),
            ("file:///etc", Some(SHA), "https"),
            ("https://u:p@github.com/o/r.git", Some(SHA), "credentials"),
        ] {
            let err = admit(&remote(url, sha)).unwrap_err();
            assert!(err.contains(why), "{url} {sha:?}: {err}");
        }
        let mut escaping = remote("https://github.com/o/r.git", Some(SHA));
        escaping.path = Some("../x".into());
        assert!(admit(&escaping).is_err());
        let npm = RemotePlugin { kind: "npm".into(), url: None, ..remote("", Some(SHA)) };
        assert!(admit(&npm).unwrap_err().contains("not a git repository"));
    }

    /// The plugin cap at its edge: one over refuses the whole fetch before
    /// any server is contacted; at the cap, following goes on (to a port
    /// that refuses, so the fetch error shows it was tried).
    #[test]
    fn more_plugins_than_the_cap_refuse_the_fetch_before_any_connection() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(".claude-plugin")).unwrap();
        let entry = |name: &str| serde_json::json!({ "name": name, "source": { "source": "url", "url": format!("git://127.0.0.1:1/{name}"), "sha": SHA } });
        let market = serde_json::json!({ "plugins": [entry("a"), entry("b")] });
        std::fs::write(root.path().join(marketplace::MARKETPLACE_FILE), market.to_string()).unwrap();
        let access = Access::default();
        let hosts = vec!["127.0.0.1".to_string()];
        let rules = |max_plugins| Rules { max_plugins, ..Rules::new("git://127.0.0.1:1/market", &access, &hosts) };
        let over = follow(root.path(), &rules(1), &Caps::DEFAULT, (0, 0), &mut Vec::new()).unwrap_err();
        assert!(matches!(over, FollowError::TooManyPlugins { count: 2, max: 1 }), "{over}");
        assert!(!root.path().join(FOLLOW_DIR).exists(), "nothing fetched past the cap");
        let at_edge = follow(root.path(), &rules(2), &Caps::DEFAULT, (0, 0), &mut Vec::new()).unwrap_err();
        assert!(matches!(at_edge, FollowError::Git(GitSourceError::Fetch { .. })), "{at_edge}");
        assert!(at_edge.is_transient(), "an unreachable plugin server is worth trying again");
    }

    #[test]
    fn the_sources_own_scheme_is_allowed_besides_https() {
        let access = Access::default();
        let hosts = vec!["127.0.0.1".to_string()];
        let rules = Rules::new("git://127.0.0.1:9418/market", &access, &hosts);
        let source = reqwest::Url::parse(rules.source_url).ok();
        assert!(admit(&remote("git://127.0.0.1:9418/plugin", Some(SHA)), &rules, source.as_ref()).is_ok());
        let https = Rules::new("https://127.0.0.1/market", &access, &hosts);
        let source = reqwest::Url::parse(https.source_url).ok();
        assert!(admit(&remote("git://127.0.0.1:9418/plugin", Some(SHA)), &https, source.as_ref()).is_err());
    }
}
