//! Which catalog the commands read: a refreshed one where it is kept, else
//! the snapshot embedded in this binary.
//!
//! [`CatalogStore`] is the seam for where a refreshed catalog lives on this
//! machine ([`LocalFile`]). The catalog kept in the cluster (a ConfigMap
//! the gateway reads) is [`super::cluster::ClusterStore`]: the same three
//! operations, async because each is a call to the API server.

use std::path::{Path, PathBuf};

use super::model::{Catalog, CatalogError};

/// Overrides where the local catalog is kept (the `--catalog` default).
pub const CATALOG_ENV: &str = "SKILL_OPERATOR_CATALOG";
/// The catalog this binary was built with (see docs/catalog.md).
pub const SNAPSHOT: &[u8] = include_bytes!("snapshot.json.gz");

/// The embedded snapshot, checked like any other catalog.
pub fn snapshot() -> Result<Catalog, CatalogError> {
    Catalog::from_bytes(SNAPSHOT)
}

/// Where a refreshed catalog is kept when neither `--catalog` nor
/// [`CATALOG_ENV`] says: `$XDG_DATA_HOME/skill-operator/catalog.json`, else
/// `~/.local/share/skill-operator/catalog.json`; `None` without a home.
pub fn default_path() -> Option<PathBuf> {
    let env_dir = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let data = env_dir("XDG_DATA_HOME").or_else(|| env_dir("HOME").map(|home| home.join(".local/share")))?;
    Some(data.join("skill-operator").join("catalog.json"))
}

/// Where a refreshed catalog is kept.
pub trait CatalogStore {
    /// Where, for messages.
    fn describe(&self) -> String;
    /// The stored catalog, checked; `None` when none was stored.
    fn load(&self) -> Result<Option<Catalog>, CatalogError>;
    /// Store a checked catalog in place of the current one, all at once.
    fn replace(&self, catalog: &Catalog) -> Result<(), CatalogError>;
}

/// A catalog kept in a local file.
#[derive(Debug, Clone)]
pub struct LocalFile {
    pub path: PathBuf,
}

impl CatalogStore for LocalFile {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn load(&self) -> Result<Option<Catalog>, CatalogError> {
        if !self.path.try_exists().map_err(|cause| CatalogError::Read { path: self.path.clone(), cause })? {
            return Ok(None);
        }
        Catalog::load(&self.path).map(Some)
    }

    fn replace(&self, catalog: &Catalog) -> Result<(), CatalogError> {
        catalog.save(&self.path)
    }
}

/// Where the catalog in use came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Stored(String),
    Snapshot,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Stored(at) => write!(f, "{at}"),
            Origin::Snapshot => f.write_str("the embedded snapshot"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the catalog at {at} cannot be used: {cause}; refresh it (`skill-operator catalog refresh --from URL`) or remove it to use the embedded snapshot")]
pub struct StoredUnusable {
    pub at: String,
    pub cause: CatalogError,
}

/// The catalog in use: the stored one when there is one, else the snapshot.
/// A stored catalog that does not load is an error, not a silent fallback:
/// whoever refreshed it expects to be searching it.
pub fn active(store: &dyn CatalogStore) -> Result<(Catalog, Origin), StoredUnusable> {
    match store.load() {
        Ok(Some(catalog)) => Ok((catalog, Origin::Stored(store.describe()))),
        Ok(None) => snapshot().map(|c| (c, Origin::Snapshot)).map_err(|cause| StoredUnusable { at: "the embedded snapshot".into(), cause }),
        Err(cause) => Err(StoredUnusable { at: store.describe(), cause }),
    }
}

/// The local store at `path`, or at [`default_path`].
pub fn local(path: Option<&Path>) -> Option<LocalFile> {
    path.map(Path::to_path_buf).or_else(default_path).map(|path| LocalFile { path })
}
