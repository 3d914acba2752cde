//! The catalog document: what one entry says about a skill, the versioned
//! JSON file that holds them, and loading and saving it.
//!
//! A catalog is read from files and URLs this process does not control, so
//! [`Catalog::from_bytes`] trusts nothing: it caps the size (gzip is
//! inflated under the same cap), checks the schema string, and checks the
//! document against itself (ids derived from their repository and name,
//! unique, commits that are commit ids, per-repository counts). Saving
//! writes a temporary file beside the target and renames it over, so a
//! reader sees the old catalog or the new one, never half of one.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::ids;
use crate::core::limits::{bytes_text, count_text, MIB};

/// The schema string of this format; a breaking change gets a new one.
pub const SCHEMA: &str = "skill-operator.catalog/v1";
/// The largest catalog read (after gzip is inflated): ~8x the snapshot of
/// twelve large repositories, and small enough to hold in memory anywhere.
pub const MAX_CATALOG_BYTES: u64 = 64 * MIB;
/// The most entries one catalog holds (build and load): ~3x the largest
/// public skill collections together; past it a catalog is a mistake (a
/// vendored tree, a generated mirror) rather than a listing.
pub const MAX_ENTRIES: usize = 20_000;
/// The mode of a written catalog or manifest: what `cp` gives a file.
#[cfg(unix)]
const PUBLIC_FILE_MODE: u32 = 0o644;
/// The first bytes of a gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A catalog of skills in public repositories.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    pub schema: String,
    /// When it was built, RFC 3339 in UTC.
    pub built: String,
    pub repositories: Vec<Repository>,
    pub entries: Vec<Entry>,
}

/// One repository a catalog was built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repository {
    /// The public URL (what installs point at), not where the build read it.
    pub url: String,
    /// The commit every entry of this repository was read at (40 hex digits).
    pub commit: String,
    /// How many entries it gave.
    pub skills: usize,
}

/// One skill of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `<owner>/<repo>/<name>` (see [`ids::entry_id`]).
    pub id: String,
    /// The repository's public URL.
    pub repository: String,
    /// The skill's folder inside the repository (`""` for a repository that is one skill).
    pub path: String,
    pub commit: String,
    /// The name `serve --layout recursive` serves it under (`document-skills/xlsx`).
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// Frontmatter `metadata.category` / `category`, else the plugin's
    /// category in the marketplace, else the first folder of the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    pub files: Files,
    /// Declared scripts (`mcp-host.scripts`), as paths inside the skill.
    #[serde(default)]
    pub scripts: Vec<String>,
    /// Dependency files the skill ships (`requirements.txt`, `package.json`,
    /// `package-lock.json`), as paths inside the skill.
    #[serde(default)]
    pub requirements: Vec<String>,
}

/// The files of a skill, `SKILL.md` included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Files {
    pub count: usize,
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(
        "the catalog is larger than {} (after decompression); it is not a skill catalog, or was built with other caps",
        bytes_text(MAX_CATALOG_BYTES)
    )]
    TooLarge,
    #[error("the catalog's gzip stream is broken: {0}; download it again")]
    Gzip(std::io::Error),
    #[error("the catalog is not JSON of the catalog format: {0}")]
    Json(serde_json::Error),
    #[error(
        "the catalog's schema is {found:?}; this version reads {SCHEMA:?} (use a skill-operator that reads it, or rebuild the catalog)"
    )]
    Schema { found: String },
    #[error("the catalog is inconsistent: {0}; rebuild it with `skill-operator catalog build`")]
    Invalid(String),
    #[error("cannot read {}: {cause}", path.display())]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("cannot write {}: {cause}", path.display())]
    Write { path: PathBuf, cause: std::io::Error },
}

impl Catalog {
    /// A catalog of this schema, built now (whole seconds, UTC).
    pub fn new(repositories: Vec<Repository>, entries: Vec<Entry>) -> Catalog {
        let now = Timestamp::now();
        let built = Timestamp::from_second(now.as_second()).unwrap_or(now).to_string();
        Catalog { schema: SCHEMA.into(), built, repositories, entries }
    }

    /// Parse and check a catalog: JSON, or gzip of it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Catalog, CatalogError> {
        let inflated;
        let json = if bytes.starts_with(&GZIP_MAGIC) {
            inflated = inflate(bytes)?;
            &inflated[..]
        } else {
            bytes
        };
        if json.len() as u64 > MAX_CATALOG_BYTES {
            return Err(CatalogError::TooLarge);
        }
        // The schema first, so an old or future file says so rather than
        // failing on whichever field changed.
        #[derive(Deserialize)]
        struct Head {
            schema: Option<String>,
        }
        let head: Head = serde_json::from_slice(json).map_err(CatalogError::Json)?;
        if head.schema.as_deref() != Some(SCHEMA) {
            return Err(CatalogError::Schema { found: head.schema.unwrap_or_else(|| "(none)".into()) });
        }
        let catalog: Catalog = serde_json::from_slice(json).map_err(CatalogError::Json)?;
        catalog.check()?;
        Ok(catalog)
    }

    /// Read and check the catalog at `path`.
    pub fn load(path: &Path) -> Result<Catalog, CatalogError> {
        let read = |cause| CatalogError::Read { path: path.into(), cause };
        let file = std::fs::File::open(path).map_err(read)?;
        let mut bytes = Vec::new();
        file.take(MAX_CATALOG_BYTES + 1).read_to_end(&mut bytes).map_err(read)?;
        if bytes.len() as u64 > MAX_CATALOG_BYTES {
            return Err(CatalogError::TooLarge);
        }
        Catalog::from_bytes(&bytes)
    }

    /// The document as written: pretty JSON, or gzip of compact JSON.
    pub fn to_bytes(&self, gzip: bool) -> Vec<u8> {
        // Strings and numbers into memory: neither step can fail.
        const INFALLIBLE: &str = "a catalog is strings and numbers, written to memory";
        if !gzip {
            let mut json = serde_json::to_vec_pretty(self).expect(INFALLIBLE);
            json.push(b'\n');
            return json;
        }
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        serde_json::to_writer(&mut encoder, self).expect(INFALLIBLE);
        encoder.finish().expect(INFALLIBLE)
    }

    /// Write the catalog to `path` (gzip when it ends in `.gz`) through a
    /// temporary file beside it and a rename: `path` is the old catalog
    /// or the new one at every moment.
    pub fn save(&self, path: &Path) -> Result<(), CatalogError> {
        let gzip = path.extension().is_some_and(|e| e == "gz");
        write_atomically(path, &self.to_bytes(gzip))
    }

    /// The entry `id`.
    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// The checks of the module docs.
    pub fn check(&self) -> Result<(), CatalogError> {
        let invalid = |why: String| Err(CatalogError::Invalid(why));
        if self.built.parse::<Timestamp>().is_err() {
            return invalid(format!("`built` is {:?}, not an RFC 3339 time", self.built));
        }
        if self.entries.len() > MAX_ENTRIES {
            return invalid(format!("{} entries; at most {} are read", count_text(self.entries.len()), count_text(MAX_ENTRIES)));
        }
        let mut counts = std::collections::HashMap::new();
        for repo in &self.repositories {
            if !ids::is_commit_id(&repo.commit) {
                return invalid(format!("repository {} has commit {:?}, not 40 hex digits", repo.url, repo.commit));
            }
            if counts.insert(repo.url.as_str(), (repo, 0usize)).is_some() {
                return invalid(format!("repository {} is listed twice", repo.url));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for entry in &self.entries {
            let Some((repo, count)) = counts.get_mut(entry.repository.as_str()) else {
                return invalid(format!("entry {} names repository {}, which is not listed", entry.id, entry.repository));
            };
            if entry.commit != repo.commit {
                return invalid(format!("entry {} is at commit {}, its repository at {}", entry.id, entry.commit, repo.commit));
            }
            match ids::entry_id(&entry.repository, &entry.name) {
                Ok(id) if id == entry.id => {}
                Ok(id) => return invalid(format!("entry {} should have the id {id} (repository and name)", entry.id)),
                Err(e) => return invalid(format!("entry {}: {e}", entry.id)),
            }
            if !seen.insert(entry.id.as_str()) {
                return invalid(format!("the id {} is used twice", entry.id));
            }
            *count += 1;
        }
        for (repo, count) in counts.values() {
            if repo.skills != *count {
                return invalid(format!("repository {} says {} skills and has {count} entries", repo.url, repo.skills));
            }
        }
        Ok(())
    }
}

/// Inflate a gzip stream, reading at most one byte past the cap.
fn inflate(bytes: &[u8]) -> Result<Vec<u8>, CatalogError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).take(MAX_CATALOG_BYTES + 1).read_to_end(&mut out).map_err(CatalogError::Gzip)?;
    if out.len() as u64 > MAX_CATALOG_BYTES {
        return Err(CatalogError::TooLarge);
    }
    Ok(out)
}

/// Write `bytes` to `path` through a synced temporary file beside it, renamed over it.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CatalogError> {
    let write = |cause| CatalogError::Write { path: path.into(), cause };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(write)?;
    let mut temp = tempfile::Builder::new().prefix(".catalog-").tempfile_in(dir).map_err(write)?;
    temp.write_all(bytes).map_err(write)?;
    // A catalog is public listing, readable like any file written here
    // (the temporary file starts owner-only).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        temp.as_file().set_permissions(std::fs::Permissions::from_mode(PUBLIC_FILE_MODE)).map_err(write)?;
    }
    temp.as_file().sync_all().map_err(write)?;
    temp.persist(path).map_err(|e| write(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    fn entry(name: &str) -> Entry {
        Entry {
            id: format!("acme/skills/{name}"),
            repository: "https://github.com/acme/skills".into(),
            path: format!("skills/{name}"),
            commit: COMMIT.into(),
            name: name.into(),
            description: "d".into(),
            author: None,
            license: None,
            category: None,
            files: Files { count: 1, bytes: 10 },
            scripts: Vec::new(),
            requirements: Vec::new(),
        }
    }

    fn catalog(names: &[&str]) -> Catalog {
        let repo = Repository { url: "https://github.com/acme/skills".into(), commit: COMMIT.into(), skills: names.len() };
        Catalog::new(vec![repo], names.iter().map(|n| entry(n)).collect())
    }

    fn refused(mut c: Catalog, change: impl FnOnce(&mut Catalog)) -> String {
        change(&mut c);
        Catalog::from_bytes(&c.to_bytes(false)).expect_err("refused").to_string()
    }

    #[test]
    fn a_catalog_round_trips_as_json_and_as_gzip() {
        let c = catalog(&["pdf", "docx"]);
        assert_eq!(Catalog::from_bytes(&c.to_bytes(false)).unwrap(), c);
        let gz = c.to_bytes(true);
        assert!(gz.starts_with(&GZIP_MAGIC));
        assert_eq!(Catalog::from_bytes(&gz).unwrap(), c);
    }

    #[test]
    fn an_inconsistent_catalog_is_refused_with_what_is_wrong() {
        let c = catalog(&["pdf", "docx"]);
        assert!(refused(c.clone(), |c| c.schema = "skill-operator.catalog/v2".into()).contains("catalog/v2"));
        assert!(refused(c.clone(), |c| c.built = "yesterday".into()).contains("RFC 3339"));
        assert!(refused(c.clone(), |c| c.entries[1].id = "acme/skills/pdf".into()).contains("should have the id"));
        assert!(refused(c.clone(), |c| c.entries[1] = entry("pdf")).contains("used twice"));
        assert!(refused(c.clone(), |c| c.repositories[0].skills = 3).contains("says 3 skills"));
        assert!(refused(c.clone(), |c| c.repositories[0].commit = "main".into()).contains("not 40 hex"));
        assert!(refused(c.clone(), |c| c.entries[0].commit = "f".repeat(40)).contains("at commit"));
        assert!(refused(c, |c| c.entries[0].repository = "https://github.com/acme/other".into()).contains("not listed"));
        let no_schema = Catalog::from_bytes(br#"{"entries": []}"#).unwrap_err().to_string();
        assert!(no_schema.contains("(none)"), "{no_schema}");
    }

    #[test]
    fn the_entry_cap_holds_at_its_edge() {
        let names: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("s{i}")).collect();
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(Catalog::from_bytes(&catalog(&all[..MAX_ENTRIES]).to_bytes(false)).is_ok());
        let over = Catalog::from_bytes(&catalog(&all).to_bytes(false)).unwrap_err().to_string();
        assert!(over.contains("20,001 entries"), "{over}");
    }

    #[test]
    fn the_size_cap_holds_for_plain_and_inflated_bytes() {
        let padding = format!(r#"{{"schema":"{SCHEMA}","pad":"{}"}}"#, " ".repeat(MAX_CATALOG_BYTES as usize));
        assert!(matches!(Catalog::from_bytes(padding.as_bytes()), Err(CatalogError::TooLarge)));
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(padding.as_bytes()).unwrap();
        let bomb = encoder.finish().unwrap();
        assert!(bomb.len() < 1024 * 1024, "a small file that inflates past the cap");
        assert!(matches!(Catalog::from_bytes(&bomb), Err(CatalogError::TooLarge)));
    }

    #[test]
    fn saving_replaces_the_file_whole_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.json");
        catalog(&["pdf"]).save(&path).unwrap();
        let second = catalog(&["pdf", "docx"]);
        second.save(&path).unwrap();
        assert_eq!(Catalog::load(&path).unwrap(), second);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["catalog.json"]);
    }
}
