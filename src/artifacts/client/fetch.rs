//! `skill-operator fetch`: the package and the inputs into the pod, and this binary for the launcher.

use super::super::{ArtifactLimits, InputsManifest, SetFile};
use crate::core::package::{self};
use crate::core::paths::RelPath;
use futures::StreamExt;
use percent_encoding::utf8_percent_encode;
use sha2::{Digest, Sha256};
use std::io::{self};
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

use super::*;

// -- fetch --------------------------------------------------------------------

/// What `fetch` does (the `skill-operator fetch` flags).
#[derive(Debug, Clone)]
pub struct FetchOptions {
    pub endpoint: Endpoint,
    /// Empty directory (or missing, its parent existing) for the package;
    /// `None` when the run's image holds the package (a prepared one):
    /// then only the inputs and the launcher are fetched.
    pub package_dir: Option<PathBuf>,
    /// Where input files go (an empty emptyDir in the pod).
    pub work_dir: PathBuf,
    /// Where to copy this executable as `skill-operator`; `None` to skip.
    pub tools_dir: Option<PathBuf>,
    /// Refuse a package whose sha256 differs (`--package-digest`).
    pub expect_package_digest: Option<String>,
    /// Fetch the package staged for the job's namespace at this digest (the
    /// SkillPackage's pinned manifest digest, `sha256:<64 hex>`) instead of
    /// the job's own (`--staged-package`): `GET .../package?digest=`. The
    /// bytes are still checked against the announced sha256 (and
    /// `expect_package_digest`). Ignored without a `package_dir`.
    pub staged_package: Option<String>,
    /// Fetch no inputs (`--no-inputs`): a warm pod's fetch, before any run
    /// has claimed it; its sidecar brings the claimed run's inputs later.
    pub skip_inputs: bool,
    pub limits: ArtifactLimits,
    /// How long an endpoint that cannot be reached is waited out, per
    /// request ([`super::ENDPOINT_PATIENCE`] in the pod).
    pub patience: Duration,
}

/// What `fetch` did.
#[derive(Debug, Clone)]
pub struct FetchReport {
    /// sha256 of the package bytes (`None`: no package was fetched).
    pub package_digest: Option<String>,
    pub package_files: usize,
    /// The inputs' set digest, when any were staged.
    pub inputs_digest: Option<String>,
    pub inputs: Vec<SetFile>,
    /// The copied launcher.
    pub tools: Option<PathBuf>,
}

/// The init container's work; see the module docs.
pub async fn fetch(opts: &FetchOptions) -> Result<FetchReport, ClientError> {
    if let Some(d) = &opts.staged_package {
        check_digest(d).map_err(|e| {
            ClientError::Config(format!("--staged-package: {e} (give the SkillPackage's pinned digest, sha256:<64 lowercase hex>)"))
        })?;
    }
    let http = http_client()?;
    let ep = &opts.endpoint;
    let l = opts.limits;

    // 1. The package, unless the image holds it.
    let (package_digest, package_files) = match &opts.package_dir {
        Some(dir) => {
            let (digest, files) = fetch_package(&http, opts, dir).await?;
            (Some(digest), files)
        }
        None => (None, 0),
    };

    // 2. The inputs.
    let manifest = if opts.skip_inputs {
        InputsManifest { digest: None, files: Vec::new() }
    } else {
        let manifest = read_inputs_manifest(&http, ep, &l, opts.patience).await?;
        download_inputs(&http, ep, &opts.work_dir, &manifest, opts.patience).await?;
        manifest
    };

    // 3. The launcher.
    let tools = match &opts.tools_dir {
        Some(dir) => Some(copy_self(dir)?),
        None => None,
    };
    Ok(FetchReport { package_digest, package_files, inputs_digest: manifest.digest, inputs: manifest.files, tools })
}

/// `GET .../inputs`, checked whole against the caps and path rules.
pub(super) async fn read_inputs_manifest(
    http: &reqwest::Client,
    ep: &Endpoint,
    l: &ArtifactLimits,
    patience: Duration,
) -> Result<InputsManifest, ClientError> {
    let resp = get(http, ep, &ep.url("inputs"), patience).await?;
    let body = read_capped(resp, l.max_manifest_bytes).await?;
    let manifest: InputsManifest = serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(format!("inputs manifest: {e}")))?;
    check_inputs(&manifest, l)?;
    Ok(manifest)
}

/// Every file of a checked manifest into `work`, each verified (pinned to the set).
pub(super) async fn download_inputs(
    http: &reqwest::Client,
    ep: &Endpoint,
    work: &Path,
    manifest: &InputsManifest,
    patience: Duration,
) -> Result<(), ClientError> {
    make_parent_dirs(work, &manifest.files)?;
    let set = manifest.digest.as_deref();
    // The futures made first (not in a `map` over the stream): the whole
    // future stays `Send`, so the warm sidecar's can be spawned.
    let fetches: Vec<_> = manifest.files.iter().map(|f| fetch_input(http, ep, work, f, set, patience)).collect();
    let results = futures::stream::iter(fetches).buffer_unordered(4).collect::<Vec<_>>().await;
    results.into_iter().collect::<Result<Vec<()>, _>>().map(drop)
}

/// Downloads, verifies and unpacks the package into `dest`: (sha256, files).
async fn fetch_package(http: &reqwest::Client, opts: &FetchOptions, dest: &Path) -> Result<(String, usize), ClientError> {
    let ep = &opts.endpoint;
    let l = opts.limits;
    let url = match &opts.staged_package {
        Some(digest) => format!("{}?digest={}", ep.url("package"), utf8_percent_encode(digest, SEGMENT)),
        None => ep.url("package"),
    };
    let resp = get(http, ep, &url, opts.patience).await?;
    let announced = announced_digest(&resp, "package")?;
    if let Some(want) = &opts.expect_package_digest {
        if want != &announced {
            return Err(ClientError::DigestMismatch {
                what: "package (--package-digest)".into(),
                expected: want.clone(),
                actual: announced,
            });
        }
    }
    if resp.content_length().is_some_and(|n| n > l.max_package_bytes) {
        return Err(ClientError::TooLarge { what: "the package".into(), limit: l.max_package_bytes });
    }
    let bytes = read_capped(resp, l.max_package_bytes).await?;
    let actual = super::super::sha256_digest(&bytes);
    if actual != announced {
        return Err(ClientError::DigestMismatch { what: "package".into(), expected: announced, actual });
    }
    let dest = dest.to_path_buf();
    let unpacked = tokio::task::spawn_blocking(move || package::unpack(&bytes, &dest))
        .await
        .map_err(|e| ClientError::Protocol(format!("unpack task: {e}")))??;
    Ok((actual, unpacked.len()))
}

/// The whole inputs manifest against the caps and path rules, before any download.
pub(super) fn check_inputs(m: &InputsManifest, l: &ArtifactLimits) -> Result<(), ClientError> {
    let bad = |m: String| ClientError::Protocol(format!("inputs manifest: {m}"));
    if m.files.len() > l.max_files {
        return Err(bad(format!("{} files, over the {}-file cap", m.files.len(), l.max_files)));
    }
    if m.digest.is_none() && !m.files.is_empty() {
        return Err(bad("files without a set digest".into()));
    }
    let mut total = 0u64;
    for f in &m.files {
        RelPath::parse(&f.path).map_err(|e| bad(format!("path {:?}: {e}", f.path)))?;
        check_digest(&f.digest).map_err(bad)?;
        if f.size > l.max_file_bytes {
            return Err(ClientError::TooLarge { what: format!("input {}", f.path), limit: l.max_file_bytes });
        }
        total += f.size;
    }
    if total > l.max_total_bytes {
        return Err(ClientError::TooLarge { what: "the inputs together".into(), limit: l.max_total_bytes });
    }
    package::check_file_set(m.files.iter().map(|f| (f.path.as_str(), f.size)), &l.file_set())?;
    Ok(())
}

/// Creates every parent directory (0755) below `work`; an existing entry
/// must be a real directory (never a symlink).
pub(super) fn make_parent_dirs(work: &Path, files: &[SetFile]) -> Result<(), ClientError> {
    use std::os::unix::fs::DirBuilderExt;
    let mut made = std::collections::BTreeSet::new();
    for f in files {
        let mut acc = String::new();
        let mut parts: Vec<&str> = f.path.split('/').collect();
        parts.pop();
        for p in parts {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(p);
            if !made.insert(acc.clone()) {
                continue;
            }
            let dir = work.join(&acc);
            match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let meta = std::fs::symlink_metadata(&dir).map_err(io_err(format!("checking {}", dir.display())))?;
                    if !meta.is_dir() {
                        return Err(ClientError::Protocol(format!("{} exists and is not a directory", dir.display())));
                    }
                }
                Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
            }
        }
    }
    Ok(())
}

pub(super) async fn fetch_input(
    http: &reqwest::Client,
    ep: &Endpoint,
    work: &Path,
    f: &SetFile,
    set: Option<&str>,
    patience: Duration,
) -> Result<(), ClientError> {
    let mut url = ep.url(&format!("inputs/{}", encode_path(&f.path)));
    if let Some(set) = set {
        url.push_str("?set=");
        url.push_str(&utf8_percent_encode(set, SEGMENT).to_string());
    }
    let what = format!("input {}", f.path);
    let mut resp = get(http, ep, &url, patience).await?;
    let announced = announced_digest(&resp, &what)?;
    if announced != f.digest {
        return Err(ClientError::DigestMismatch { what, expected: f.digest.clone(), actual: announced });
    }
    if let Some(n) = resp.content_length() {
        if n != f.size {
            return Err(ClientError::SizeMismatch { what, expected: f.size, actual: n });
        }
    }
    let path = work.join(&f.path);
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .await
        .map_err(io_err(format!("creating {}", path.display())))?;
    let mut file = tokio::io::BufWriter::with_capacity(256 * 1024, file);
    let result: Result<(), ClientError> = async {
        let mut h = Sha256::new();
        let mut n = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| ClientError::Protocol(format!("{what}: {e}")))? {
            n += chunk.len() as u64;
            if n > f.size {
                return Err(ClientError::SizeMismatch { what: what.clone(), expected: f.size, actual: n });
            }
            h.update(&chunk);
            file.write_all(&chunk).await.map_err(io_err(format!("writing {}", path.display())))?;
        }
        file.flush().await.map_err(io_err(format!("writing {}", path.display())))?;
        if n != f.size {
            return Err(ClientError::SizeMismatch { what: what.clone(), expected: f.size, actual: n });
        }
        let actual = format!("sha256:{}", hex::encode(h.finalize()));
        if actual != f.digest {
            return Err(ClientError::DigestMismatch { what: what.clone(), expected: f.digest.clone(), actual });
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&path).await;
    }
    result
}

/// Copies this executable to `<dir>/skill-operator`, 0755.
pub(super) fn copy_self(dir: &Path) -> Result<PathBuf, ClientError> {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe().map_err(io_err("finding this executable"))?;
    let dest = dir.join("skill-operator");
    let tmp = dir.join(".skill-operator.partial");
    let _ = std::fs::remove_file(&tmp);
    std::fs::copy(&exe, &tmp).map_err(io_err(format!("copying {} to {}", exe.display(), tmp.display())))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(io_err(format!("chmod {}", tmp.display())))?;
    std::fs::rename(&tmp, &dest).map_err(io_err(format!("renaming to {}", dest.display())))?;
    Ok(dest)
}
