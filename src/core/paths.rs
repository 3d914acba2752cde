//! The two path checks that govern every read and every run.
//!
//! A path a client names is checked twice: first as a string, before any
//! filesystem access ([`RelPath::parse`]), then after resolution
//! ([`resolve_inside`]): the real path, symlinks followed, must still lie
//! inside the real skill directory and be a regular file. Both, because the
//! string check alone misses a symlink planted in the package, and the
//! resolved check alone accepts forms that should never have been joined.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::limits::PATH_MAX_BYTES;

/// A relative path that passed the string check: plain `/`-separated segments.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(String);

/// Why a path string was refused before touching the filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("the path is empty")]
    Empty,
    #[error("the path is longer than {PATH_MAX_BYTES} bytes")]
    TooLong,
    #[error("the path contains a NUL byte")]
    Nul,
    #[error("the path contains a control character")]
    Control,
    #[error("the path is absolute; give it relative to the skill directory, e.g. scripts/run.py")]
    Absolute,
    #[error("the path names a drive ({0}); give it relative to the skill directory")]
    Drive(String),
    #[error("the path contains a backslash; use / between segments")]
    Backslash,
    #[error("the path contains a percent escape; give the name literally")]
    PercentEscape,
    #[error("the path has an empty segment (a doubled or trailing /)")]
    EmptySegment,
    #[error("the path contains a `.` or `..` segment")]
    DotSegment,
    #[error("a path segment starts or ends with whitespace")]
    Whitespace,
}

impl RelPath {
    /// The string check. Accepts `scripts/run.py`; refuses `..`, `./x`, `/x`,
    /// `a//b`, `a\b`, `%2e%2e`, `C:x`, NUL, control characters and segments
    /// padded with whitespace.
    pub fn parse(raw: &str) -> Result<RelPath, PathError> {
        if raw.is_empty() {
            return Err(PathError::Empty);
        }
        if raw.len() > PATH_MAX_BYTES {
            return Err(PathError::TooLong);
        }
        if raw.contains('\0') {
            return Err(PathError::Nul);
        }
        if raw.chars().any(char::is_control) {
            return Err(PathError::Control);
        }
        if raw.starts_with('/') {
            return Err(PathError::Absolute);
        }
        if raw.contains('\\') {
            return Err(PathError::Backslash);
        }
        let bytes = raw.as_bytes();
        if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
            return Err(PathError::Drive(raw[..2].to_string()));
        }
        if raw.contains('%') {
            return Err(PathError::PercentEscape);
        }
        for segment in raw.split('/') {
            if segment.is_empty() {
                return Err(PathError::EmptySegment);
            }
            if segment == "." || segment == ".." {
                return Err(PathError::DotSegment);
            }
            if segment.trim() != segment {
                return Err(PathError::Whitespace);
            }
        }
        Ok(RelPath(raw.to_string()))
    }

    /// Build from a path found while walking a skill (already relative).
    /// Names the read tools could not address come back as an error so the
    /// walker reports them instead of serving something unreachable.
    pub fn from_walk(rel: &Path) -> Result<RelPath, PathError> {
        let mut joined = String::new();
        for component in rel.components() {
            let part = component.as_os_str().to_str().ok_or(PathError::Control)?;
            if !joined.is_empty() {
                joined.push('/');
            }
            joined.push_str(part);
        }
        RelPath::parse(&joined)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The file name (last segment).
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<Path> for RelPath {
    fn as_ref(&self) -> &Path {
        Path::new(&self.0)
    }
}

/// Why a checked path did not resolve to a regular file inside its base.
#[derive(Debug, Error)]
pub enum ResolveError {
    #[error("no such file")]
    NotFound,
    #[error("the path leaves the skill directory (through a symlink)")]
    Escapes,
    #[error("not a regular file")]
    NotAFile,
    #[error("cannot read: {0}")]
    Io(#[source] io::Error),
}

/// The resolved check: `base/rel` with symlinks followed must stay inside
/// `real_base` (which the caller has already canonicalised) and be a regular
/// file. Returns the real path to open.
pub fn resolve_inside(real_base: &Path, rel: &RelPath) -> Result<PathBuf, ResolveError> {
    let joined = real_base.join(rel.as_str());
    let real = match joined.canonicalize() {
        Ok(real) => real,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(ResolveError::NotFound),
        Err(err) => return Err(ResolveError::Io(err)),
    };
    if !real.starts_with(real_base) {
        return Err(ResolveError::Escapes);
    }
    let meta = std::fs::metadata(&real).map_err(ResolveError::Io)?;
    if !meta.is_file() {
        return Err(ResolveError::NotAFile);
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile strings, each refused by the string check alone (no filesystem
    /// access happens: the base directory below does not exist).
    const HOSTILE: &[&str] = &[
        "",
        "..",
        "../etc/passwd",
        "scripts/../../x",
        "./SKILL.md",
        "scripts/./run.py",
        "/etc/passwd",
        "//server/share",
        "%2e%2e/x",
        "%2E%2E%2Fsecret",
        "scripts%2frun.py",
        "a\0b",
        "scripts\\run.py",
        "..\\..\\windows",
        "C:\\Windows\\win.ini",
        "c:evil",
        "a//b",
        "scripts/",
        " SKILL.md",
        "SKILL.md ",
        "scripts/ run.py",
        "a/\tb",
        "line\nbreak",
        "esc\u{1b}[31m",
        "\u{7f}",
    ];

    #[test]
    fn hostile_paths_are_refused_by_the_string_check() {
        assert!(HOSTILE.len() >= 20);
        for raw in HOSTILE {
            assert!(RelPath::parse(raw).is_err(), "accepted {raw:?}");
        }
    }

    #[test]
    fn each_hostile_path_gets_its_specific_error() {
        assert_eq!(RelPath::parse(""), Err(PathError::Empty));
        assert_eq!(RelPath::parse(".."), Err(PathError::DotSegment));
        assert_eq!(RelPath::parse("/x"), Err(PathError::Absolute));
        assert_eq!(RelPath::parse("%2e%2e"), Err(PathError::PercentEscape));
        assert_eq!(RelPath::parse("a\0"), Err(PathError::Nul));
        assert_eq!(RelPath::parse("a\\b"), Err(PathError::Backslash));
        assert_eq!(RelPath::parse("C:x"), Err(PathError::Drive("C:".into())));
        assert_eq!(RelPath::parse("a//b"), Err(PathError::EmptySegment));
        assert_eq!(RelPath::parse(" a"), Err(PathError::Whitespace));
        assert_eq!(RelPath::parse("a\nb"), Err(PathError::Control));
    }

    #[test]
    fn plain_paths_pass() {
        for ok in ["SKILL.md", "scripts/run.py", "a/b/c/d.txt", "with space/in name.md", ".hidden", "x..y", "ünï/cödé.md"] {
            assert_eq!(RelPath::parse(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn path_length_edge() {
        let at_cap = "a".repeat(PATH_MAX_BYTES);
        assert!(RelPath::parse(&at_cap).is_ok());
        let over = "a".repeat(PATH_MAX_BYTES + 1);
        assert_eq!(RelPath::parse(&over), Err(PathError::TooLong));
    }

    #[test]
    fn string_check_runs_before_any_filesystem_access() {
        // The base does not exist: a string-check failure must be reported as
        // such, never as "not found".
        let base = Path::new("/nonexistent-skill-operator-base");
        for raw in HOSTILE {
            match RelPath::parse(raw) {
                Err(_) => {}
                Ok(rel) => panic!("{raw:?} passed; resolve gave {:?}", resolve_inside(base, &rel).err()),
            }
        }
    }

    #[test]
    fn resolved_check_refuses_symlink_escapes() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
        let skill = tempfile::tempdir().unwrap();
        let real = skill.path().canonicalize().unwrap();
        std::fs::write(real.join("ok.txt"), "ok").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), real.join("link.txt")).unwrap();
        std::os::unix::fs::symlink(outside.path(), real.join("dirlink")).unwrap();
        std::fs::create_dir(real.join("sub")).unwrap();
        std::os::unix::fs::symlink("../ok.txt", real.join("sub/inside.txt")).unwrap();

        assert!(resolve_inside(&real, &RelPath::parse("ok.txt").unwrap()).is_ok());
        assert!(resolve_inside(&real, &RelPath::parse("sub/inside.txt").unwrap()).is_ok());
        assert!(matches!(resolve_inside(&real, &RelPath::parse("link.txt").unwrap()), Err(ResolveError::Escapes)));
        assert!(matches!(resolve_inside(&real, &RelPath::parse("dirlink/secret.txt").unwrap()), Err(ResolveError::Escapes)));
        assert!(matches!(resolve_inside(&real, &RelPath::parse("sub").unwrap()), Err(ResolveError::NotAFile)));
        assert!(matches!(resolve_inside(&real, &RelPath::parse("missing").unwrap()), Err(ResolveError::NotFound)));
    }
}
