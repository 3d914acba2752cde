//! Fetch the files of one commit's (sub)tree from a git repository, running
//! nothing from it.
//!
//! Safety is by construction rather than by configuration: the repository is
//! read object by object with `gix` (pure Rust, no git CLI) and no working
//! tree or index is ever made. Hooks, `.gitattributes` filters (smudge, LFS),
//! `core.fsmonitor` and submodule updates are all parts of a checkout; since
//! there is none, none of them has a place to run. Blobs are written with the
//! bytes the object database holds, so a `.gitattributes` file is just
//! another file. Symlinks and submodules are recorded as refused entries and
//! never followed; an LFS pointer is refused rather than fetched.
//!
//! URLs: `file://` (or a plain path) opens the repository in place, with
//! gix's isolated options (no system or user configuration is read), because
//! gix's own `file://` transport would spawn `git upload-pack`; only the
//! command line may name one ([`Access::local`]), never a SkillSource.
//! `https://` and `git://` (and `http://` where [`Access::insecure_http`]
//! allows it) are fetched into a temporary bare repository with gix's
//! blocking client, again with isolated options. A private repository's
//! token goes into that fetch's in-memory `http.extraHeader`, so it is sent
//! to the URL's own host only: gix refuses to follow any redirect of a
//! request that carries configured headers.
//! `ssh://` is refused (see docs/design.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use gix::object::tree::EntryKind;
use gix::ObjectId;
use thiserror::Error;

use crate::core::paths::RelPath;

/// The caps of a fetched tree are the package caps: what is fetched is
/// packaged next, so a larger tree could never be pushed anyway.
pub type Caps = crate::core::package::Limits;

/// The first line of a Git LFS pointer file.
const LFS_POINTER: &[u8] = b"version https://git-lfs.github.com/spec/v1";
/// Refs named in a "no such ref" error.
const REFS_LISTED: usize = 10;

/// A tree in a git repository: a URL, a branch, tag or commit (default:
/// the remote's HEAD) and a folder inside it (default: the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRef {
    pub url: String,
    pub reference: Option<String>,
    pub path: Option<RelPath>,
}

/// Which URLs may be read, and with what credential.
#[derive(Clone, Default)]
pub struct Access {
    /// Local paths and `file://` (the command line's own files; never a
    /// cluster object's, which would read the controller's file system).
    pub local: bool,
    /// `http://` besides `https://` (test servers on loopback or in-cluster).
    pub insecure_http: bool,
    /// HTTP Basic user and token for the URL's host.
    pub basic: Option<(String, String)>,
    /// The client key and pinned host keys for an `ssh://` URL.
    pub ssh: Option<super::ssh::SshKey>,
}

impl Access {
    /// What `package push --git` may read: anything its user can.
    pub fn command_line() -> Access {
        Access { local: true, insecure_http: true, basic: None, ssh: None }
    }
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("local", &self.local)
            .field("insecure_http", &self.insecure_http)
            .field("basic", &self.basic.as_ref().map(|(user, _)| (user, "<redacted>")))
            .field("ssh", &self.ssh)
            .finish()
    }
}

/// A tree entry that was not written, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub path: String,
    pub reason: &'static str,
}

/// What [`fetch_tree`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The resolved commit id (40 hex digits).
    pub commit: String,
    pub refused: Vec<Refused>,
    pub files: usize,
    pub bytes: u64,
}

pub const REFUSED_SYMLINK: &str = "a symlink; not followed";
pub const REFUSED_SUBMODULE: &str = "a submodule; not fetched";
pub const REFUSED_LFS: &str = "a Git LFS pointer; LFS content is not fetched";
pub const REFUSED_NAME: &str = "a name the path rules refuse (a space at an end, `%`, a drive letter, or too long); not fetched";

#[derive(Debug, Error)]
pub enum GitSourceError {
    #[error("{url}: {why}")]
    Url { url: String, why: String },
    #[error("cannot read the git repository {url}: {detail}")]
    Open { url: String, detail: String },
    #[error("cannot fetch {url}: {detail}")]
    Fetch { url: String, detail: String },
    #[error("`{reference}` is not a branch, tag or commit of {url}; it has {}", list_refs(.existing))]
    NoSuchRef { url: String, reference: String, existing: Vec<String> },
    #[error("{url} has no HEAD to fetch; name a branch, tag or commit with --ref")]
    NoHead { url: String },
    #[error("`{path}` does not exist at commit {commit}; give a folder of that commit")]
    NoSuchPath { path: String, commit: String },
    #[error("`{path}` at commit {commit} is not a folder; give the folder that holds SKILL.md")]
    NotATree { path: String, commit: String },
    #[error("the tree entry {path:?} cannot be written safely: {why}")]
    UnsafeName { path: String, why: String },
    #[error("the tree passes the {cap} cap of {limit} (at {path:?}); nothing was written")]
    Cap { cap: &'static str, limit: u64, path: String },
    #[error("cannot read object {id}: {detail}")]
    Object { id: String, detail: String },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{} exists and is not an empty folder; give a fresh destination", .0.display())]
    DestExists(PathBuf),
}

fn list_refs(existing: &[String]) -> String {
    if existing.is_empty() {
        return "no branches or tags".into();
    }
    let mut text = existing.iter().take(REFS_LISTED).map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", ");
    if existing.len() > REFS_LISTED {
        text.push_str(&format!(" and {} more", existing.len() - REFS_LISTED));
    }
    text
}

/// Writes the files of `source`'s (sub)tree at the resolved commit into
/// `dest`, which must not exist or be an empty folder. The files are written
/// into a temporary folder beside `dest` and renamed into place at the end,
/// so an error leaves `dest` as it was. Blocking: call it off the runtime.
pub fn fetch_tree(source: &GitRef, caps: &Caps, dest: &Path) -> Result<Fetched, GitSourceError> {
    fetch_tree_with(source, &Access::command_line(), caps, dest)
}

/// [`fetch_tree`] under `access`'s rules.
pub fn fetch_tree_with(source: &GitRef, access: &Access, caps: &Caps, dest: &Path) -> Result<Fetched, GitSourceError> {
    check_dest(dest)?;
    // Kept alive until the tree is read: a fetched repository lives in it.
    let scratch = tempfile::Builder::new().prefix(".git-fetch-").tempdir_in(parent_of(dest)).map_err(write_err(dest))?;
    let repo = open(source, access, &scratch.path().join("repo"))?;
    let commit = resolve(&repo, source)?;
    let tree = subtree(&repo, commit, source.path.as_ref())?;
    let plan = plan(&repo, tree, caps)?;
    let staging = scratch.path().join("tree");
    write(&repo, &plan, &staging)?;
    if dest.exists() {
        std::fs::remove_dir(dest).map_err(write_err(dest))?;
    }
    std::fs::rename(&staging, dest).map_err(write_err(dest))?;
    tracing::info!(url = %source.url, commit = %commit, files = plan.files.len(), bytes = plan.bytes, refused = plan.refused.len(), "fetched a git tree");
    Ok(Fetched { commit: commit.to_string(), refused: plan.refused, files: plan.files.len(), bytes: plan.bytes })
}

fn parent_of(dest: &Path) -> &Path {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> GitSourceError {
    let path = path.to_path_buf();
    move |source| GitSourceError::Write { path, source }
}

fn check_dest(dest: &Path) -> Result<(), GitSourceError> {
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(GitSourceError::Write { path: dest.into(), source: e }),
        Ok(meta) if meta.is_dir() && std::fs::read_dir(dest).map_err(write_err(dest))?.next().is_none() => Ok(()),
        Ok(_) => Err(GitSourceError::DestExists(dest.into())),
    }
}

/// The repository to read: opened in place for a local one, fetched into
/// `scratch` for a remote one.
fn open(source: &GitRef, access: &Access, scratch: &Path) -> Result<gix::Repository, GitSourceError> {
    let url = source.url.as_str();
    let open_err = |detail: String| GitSourceError::Open { url: url.into(), detail };
    let refuse = |why: &str| GitSourceError::Url { url: url.into(), why: why.into() };
    if let Some(local) = local_path(url) {
        if !access.local {
            return Err(refuse("local paths and file:// are not a source here; give an https:// or git:// URL"));
        }
        // Isolated: no system, user or environment configuration, so nothing
        // from outside the repository changes what is read.
        return gix::open_opts(local, gix::open::Options::isolated()).map_err(|e| open_err(e.to_string()));
    }
    // `user@host:path` is SSH too.
    let scp_like = !url.contains("://") && super::ssh::is_ssh(url);
    let scheme = if scp_like { "ssh" } else { url.split_once("://").map_or("", |(scheme, _)| scheme) };
    let mut over_ssh = None;
    match scheme {
        "https" | "git" => {}
        "ssh" => {
            let Some(key) = access.ssh.clone() else {
                return Err(refuse(
                    "an SSH repository needs a client key and the host's pinned key: give the SkillSource a secretRef whose Secret has `ssh-privatekey` and `known_hosts`",
                ));
            };
            over_ssh = Some((super::ssh::target(url).map_err(|why| refuse(&why))?, key));
        }
        "http" if access.insecure_http => {}
        "http" => {
            return Err(refuse(
                "http:// carries the repository and any token unprotected; use https:// (or mark the source insecure for a test server)",
            ))
        }
        _ => return Err(refuse("only https://, ssh:// and git:// repositories are supported")),
    }
    let mut overrides = Vec::new();
    if let Some((user, token)) = &access.basic {
        if scheme == "git" {
            return Err(refuse("git:// has no authentication; give the https:// URL for a repository that needs a token"));
        }
        use base64::Engine;
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"));
        overrides.push(format!("http.extraHeader=Authorization: Basic {pair}"));
    }
    // Why an SSH connection failed, kept for the error: gix reports only
    // that configuring the connection failed.
    let ssh_failure: Arc<Mutex<Option<super::ssh::SshError>>> = Default::default();
    let prepare = |path: &Path| {
        // Isolated like a local open: no system or user git configuration
        // (credential helpers, proxies, url rewrites) takes part.
        let options = gix::open::Options::isolated().config_overrides(overrides.clone());
        let prepared = gix::clone::PrepareFetch::new(url, path, gix::create::Kind::Bare, gix::create::Options::default(), options)
            .map_err(|e| GitSourceError::Fetch { url: url.into(), detail: e.to_string() })?;
        let Some((target, key)) = over_ssh.clone() else { return Ok(prepared) };
        // gix would spawn an `ssh` program; the channel of our own client
        // takes its place before anything is sent.
        let failure = ssh_failure.clone();
        Ok(prepared.configure_connection(move |connection| {
            let (read, write) = super::ssh::upload_pack(&target, &key).map_err(|e| {
                let text = e.to_string();
                *failure.lock().expect("lock poisoned") = Some(e);
                gix::Error::from_error(std::io::Error::other(text))
            })?;
            *connection.transport_mut() = Box::new(gix::protocol::transport::client::git::blocking_io::Connection::new(
                read,
                write,
                gix::protocol::transport::Protocol::V1,
                target.path.clone(),
                None::<(String, Option<u16>)>,
                gix::protocol::transport::client::git::ConnectMode::Process,
                false,
            ));
            Ok(())
        }))
    };
    let fetch_err = |detail: String| match ssh_failure.lock().expect("lock poisoned").take() {
        Some(super::ssh::SshError::Refused(why)) => GitSourceError::Url { url: url.into(), why },
        Some(super::ssh::SshError::Unreachable(why)) => GitSourceError::Fetch { url: url.into(), detail: why },
        None => GitSourceError::Fetch { url: url.into(), detail },
    };
    let mut fetch = prepare(scratch)?;
    if let Some(name) = source.reference.as_deref().filter(|r| !is_commit_id(r)) {
        // One ref, one commit deep: the least a named branch or tag needs.
        // A commit id needs the history that holds it, so it fetches all.
        fetch = fetch
            .with_ref_name(Some(name))
            .map_err(|e| fetch_err(e.to_string()))?
            .with_shallow(gix::remote::fetch::Shallow::DepthAtRemote(std::num::NonZeroU32::MIN));
    }
    match fetch.fetch_only(gix::progress::Discard, &AtomicBool::new(false)) {
        Ok((repo, _)) => Ok(repo),
        // The named ref is not on the remote: list what is, from a fetch of
        // all refs (no objects are read beyond what that fetch brings).
        Err(e) if source.reference.is_some() => {
            tracing::debug!(error = %e, "fetching the named ref failed; listing the remote's refs");
            let (repo, _) = prepare(&scratch.with_extension("all"))?
                .fetch_only(gix::progress::Discard, &AtomicBool::new(false))
                .map_err(|e| fetch_err(e.to_string()))?;
            Ok(repo)
        }
        Err(e) => Err(fetch_err(e.to_string())),
    }
}

/// `file:///x` or a path: the local directory; `None` for a remote URL.
fn local_path(url: &str) -> Option<PathBuf> {
    if let Some(rest) = url.strip_prefix("file://") {
        return Some(PathBuf::from(rest));
    }
    (!url.contains("://")).then(|| PathBuf::from(url))
}

/// A full 40-hex commit id (not a branch, tag or abbreviation).
pub fn is_commit_id(reference: &str) -> bool {
    reference.len() == 40 && reference.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The commit `source.reference` names: a commit id, then a branch, a tag
/// or a fetched remote branch of that name; HEAD when none is given.
fn resolve(repo: &gix::Repository, source: &GitRef) -> Result<ObjectId, GitSourceError> {
    let url = &source.url;
    let Some(reference) = source.reference.as_deref() else {
        let mut head = repo.head().map_err(|e| GitSourceError::Open { url: url.clone(), detail: e.to_string() })?;
        return head.peel_to_commit().map(|c| c.id).map_err(|_| GitSourceError::NoHead { url: url.clone() });
    };
    let no_such_ref = || GitSourceError::NoSuchRef { url: url.clone(), reference: reference.into(), existing: existing_refs(repo) };
    if is_commit_id(reference) {
        let id = ObjectId::from_hex(reference.as_bytes()).map_err(|_| no_such_ref())?;
        return match repo.try_find_object(id) {
            Ok(Some(object)) => object.peel_to_commit().map(|c| c.id).map_err(|_| no_such_ref()),
            _ => Err(no_such_ref()),
        };
    }
    for full in [format!("refs/heads/{reference}"), format!("refs/tags/{reference}"), format!("refs/remotes/origin/{reference}")] {
        if let Ok(Some(mut found)) = repo.try_find_reference(full.as_str()) {
            return found.peel_to_commit().map(|c| c.id).map_err(|_| no_such_ref());
        }
    }
    Err(no_such_ref())
}

/// Branch and tag names, short form, sorted.
fn existing_refs(repo: &gix::Repository) -> Vec<String> {
    let Ok(platform) = repo.references() else { return Vec::new() };
    let Ok(all) = platform.all() else { return Vec::new() };
    let mut names: Vec<String> = all
        .filter_map(Result::ok)
        .map(|r| r.name().as_bstr().to_string())
        .filter_map(|n| {
            n.strip_prefix("refs/heads/")
                .or_else(|| n.strip_prefix("refs/tags/"))
                .or_else(|| n.strip_prefix("refs/remotes/origin/").filter(|b| *b != "HEAD"))
                .map(String::from)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The tree of `commit`, or of the folder `path` in it.
fn subtree(repo: &gix::Repository, commit: ObjectId, path: Option<&RelPath>) -> Result<ObjectId, GitSourceError> {
    let commit_obj = repo.find_commit(commit).map_err(|e| GitSourceError::Object { id: commit.to_string(), detail: e.to_string() })?;
    let root = commit_obj.tree_id().map_err(|e| GitSourceError::Object { id: commit.to_string(), detail: e.to_string() })?.detach();
    let Some(path) = path else { return Ok(root) };
    let mut id = root;
    for segment in path.as_str().split('/') {
        let tree = repo.find_tree(id).map_err(|e| GitSourceError::Object { id: id.to_string(), detail: e.to_string() })?;
        let decoded = tree.decode().map_err(|e| GitSourceError::Object { id: id.to_string(), detail: e.to_string() })?;
        let entry = decoded
            .entries
            .iter()
            .find(|e| e.filename == segment.as_bytes())
            .ok_or_else(|| GitSourceError::NoSuchPath { path: path.to_string(), commit: commit.to_string() })?;
        if !entry.mode.is_tree() {
            return Err(GitSourceError::NotATree { path: path.to_string(), commit: commit.to_string() });
        }
        id = entry.oid.to_owned();
    }
    Ok(id)
}

/// Every file to write, checked against the names rule and the caps before
/// a byte is written.
struct Plan {
    dirs: Vec<String>,
    files: Vec<(String, ObjectId, bool)>,
    refused: Vec<Refused>,
    bytes: u64,
}

fn plan(repo: &gix::Repository, root: ObjectId, caps: &Caps) -> Result<Plan, GitSourceError> {
    let mut plan = Plan { dirs: Vec::new(), files: Vec::new(), refused: Vec::new(), bytes: 0 };
    // (tree id, path of the tree, depth in folders)
    let mut stack = vec![(root, String::new(), 0usize)];
    while let Some((id, prefix, depth)) = stack.pop() {
        let tree = repo.find_tree(id).map_err(|e| GitSourceError::Object { id: id.to_string(), detail: e.to_string() })?;
        let decoded = tree.decode().map_err(|e| GitSourceError::Object { id: id.to_string(), detail: e.to_string() })?;
        for entry in &decoded.entries {
            let name = check_name(&prefix, entry.filename)?;
            let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            // A name that could escape failed `check_name` above and fails the
            // fetch; one that only breaks the served-path rules (a space at
            // an end, `%`, a drive letter, a path over the length cap) is a
            // refused entry, so one odd file does not lose a repository.
            if RelPath::parse(&path).is_err() {
                plan.refused.push(Refused { path, reason: REFUSED_NAME });
                continue;
            }
            let oid = entry.oid.to_owned();
            match entry.mode.kind() {
                EntryKind::Tree => {
                    if depth + 1 > caps.max_depth {
                        return Err(cap("folder depth", caps.max_depth as u64, path));
                    }
                    plan.dirs.push(path.clone());
                    if plan.dirs.len() > caps.max_dirs {
                        return Err(cap("folder count", caps.max_dirs as u64, path));
                    }
                    stack.push((oid, path, depth + 1));
                }
                EntryKind::Link => plan.refused.push(Refused { path, reason: REFUSED_SYMLINK }),
                EntryKind::Commit => plan.refused.push(Refused { path, reason: REFUSED_SUBMODULE }),
                kind @ (EntryKind::Blob | EntryKind::BlobExecutable) => {
                    let size =
                        repo.find_header(oid).map_err(|e| GitSourceError::Object { id: oid.to_string(), detail: e.to_string() })?.size();
                    if size > caps.max_file_bytes {
                        return Err(cap("file size", caps.max_file_bytes, path));
                    }
                    if is_lfs_pointer(repo, oid, size)? {
                        plan.refused.push(Refused { path, reason: REFUSED_LFS });
                        continue;
                    }
                    plan.bytes += size;
                    if plan.bytes > caps.max_total_bytes {
                        return Err(cap("total bytes", caps.max_total_bytes, path));
                    }
                    if plan.files.len() + 1 > caps.max_files {
                        return Err(cap("file count", caps.max_files as u64, path));
                    }
                    plan.files.push((path, oid, kind == EntryKind::BlobExecutable));
                }
            }
        }
    }
    Ok(plan)
}

fn cap(cap: &'static str, limit: u64, path: String) -> GitSourceError {
    GitSourceError::Cap { cap, limit, path }
}

/// The per-entry name rule, checked on the raw bytes before anything else:
/// a name git itself would refuse to check out can still be in a crafted tree.
pub fn check_name(prefix: &str, raw: &[u8]) -> Result<String, GitSourceError> {
    let shown = String::from_utf8_lossy(raw).into_owned();
    let unsafe_name = |why: &str| GitSourceError::UnsafeName {
        path: if prefix.is_empty() { shown.clone() } else { format!("{prefix}/{shown}") },
        why: why.into(),
    };
    if raw.is_empty() || raw == b"." || raw == b".." {
        return Err(unsafe_name("an empty, `.` or `..` name"));
    }
    if raw.contains(&b'/') || raw.contains(&b'\\') {
        return Err(unsafe_name("a name with a path separator"));
    }
    if raw.contains(&0) {
        return Err(unsafe_name("a name with a NUL byte"));
    }
    if raw.eq_ignore_ascii_case(b".git") {
        return Err(unsafe_name("a `.git` entry"));
    }
    let name = std::str::from_utf8(raw).map_err(|_| unsafe_name("a name that is not UTF-8"))?;
    if name.chars().any(char::is_control) {
        return Err(unsafe_name("a name with a control character"));
    }
    Ok(name.to_string())
}

/// An LFS pointer is small text; only small blobs are read to find out.
fn is_lfs_pointer(repo: &gix::Repository, oid: ObjectId, size: u64) -> Result<bool, GitSourceError> {
    // The spec caps a pointer file at 1024 bytes.
    if size > 1024 || size < LFS_POINTER.len() as u64 {
        return Ok(false);
    }
    let blob = repo.find_object(oid).map_err(|e| GitSourceError::Object { id: oid.to_string(), detail: e.to_string() })?;
    Ok(blob.data.starts_with(LFS_POINTER))
}

fn write(repo: &gix::Repository, plan: &Plan, staging: &Path) -> Result<(), GitSourceError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(staging).map_err(write_err(staging))?;
    for dir in &plan.dirs {
        let path = staging.join(dir);
        std::fs::create_dir_all(&path).map_err(write_err(&path))?;
    }
    for (rel, oid, executable) in &plan.files {
        let path = staging.join(rel);
        let blob = repo.find_object(*oid).map_err(|e| GitSourceError::Object { id: oid.to_string(), detail: e.to_string() })?;
        // create_new: the staging folder is ours and fresh, so an existing
        // entry means the plan is wrong; never write through one.
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(write_err(&path))?;
        std::io::Write::write_all(&mut file, &blob.data).map_err(write_err(&path))?;
        let mode = if *executable { 0o755 } else { 0o644 };
        file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(write_err(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_that_could_escape_are_refused() {
        for bad in [&b".."[..], b".", b"", b"a/b", b"a\\b", b"x\0y", b".git", b".GIT", b"tab\there", b"\xff"] {
            assert!(matches!(check_name("", bad), Err(GitSourceError::UnsafeName { .. })), "{bad:?}");
        }
        assert_eq!(check_name("scripts", b"run.py").unwrap(), "run.py");
        assert_eq!(check_name("", b".gitattributes").unwrap(), ".gitattributes");
    }

    #[test]
    fn a_missing_ref_lists_at_most_ten() {
        let refs: Vec<String> = (0..12).map(|i| format!("b{i:02}")).collect();
        let text = GitSourceError::NoSuchRef { url: "u".into(), reference: "nope".into(), existing: refs }.to_string();
        assert!(text.contains("`b09`") && !text.contains("`b10`") && text.contains("and 2 more"), "{text}");
    }

    #[test]
    fn only_local_and_git_urls_are_read() {
        assert_eq!(local_path("file:///srv/r"), Some(PathBuf::from("/srv/r")));
        assert_eq!(local_path("./r"), Some(PathBuf::from("./r")));
        assert_eq!(local_path("git://h/r"), None);
        let refused = |url: &str, access: &Access| {
            let source = GitRef { url: url.into(), reference: None, path: None };
            matches!(open(&source, access, Path::new("/nonexistent")), Err(GitSourceError::Url { .. }))
        };
        let cluster = Access::default();
        assert!(refused("ssh://example.invalid/r", &Access::command_line()));
        assert!(refused("file:///etc", &cluster) && refused("/etc", &cluster) && refused("./r", &cluster));
        assert!(refused("http://example.invalid/r", &cluster));
        let token = Access { basic: Some(("x-access-token".into(), "t".into())), ..Access::default() };
        assert!(refused("git://example.invalid/r", &token), "a token is never sent over git://");
        assert!(format!("{token:?}").contains("redacted") && !format!("{token:?}").contains("\"t\""));
    }
}
