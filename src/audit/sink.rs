//! Where audit lines go: stdout, an appended file, or (tests, embedders) a
//! shared buffer. Each line is one `write_all` under the sink's lock.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// An audit file that cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the audit file {path}: {source}; check that its directory exists and is writable by this process")]
pub struct SinkError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// In-memory lines, for tests and for embedding the server.
#[derive(Clone, Default)]
pub struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    /// Every record written so far, parsed.
    pub fn records(&self) -> Vec<serde_json::Value> {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).filter_map(|l| serde_json::from_slice(l).ok()).collect()
    }
}

pub struct Sink {
    kind: Kind,
}

enum Kind {
    Stdout,
    File { path: PathBuf, file: Mutex<File> },
    Buffer(SharedBuffer),
}

impl Sink {
    pub fn stdout() -> Sink {
        Sink { kind: Kind::Stdout }
    }

    /// Appends to `path` (created with mode 0600: records name principals and skills).
    pub fn file(path: &Path) -> Result<Sink, SinkError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| SinkError { path: path.to_path_buf(), source })?;
        Ok(Sink { kind: Kind::File { path: path.to_path_buf(), file: Mutex::new(file) } })
    }

    pub fn buffer(buffer: SharedBuffer) -> Sink {
        Sink { kind: Kind::Buffer(buffer) }
    }

    pub(super) fn write_line(&self, line: &[u8]) -> std::io::Result<()> {
        match &self.kind {
            // Stdout's own lock keeps lines whole against other writers in this process.
            Kind::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(line)?;
                out.flush()
            }
            Kind::File { file, .. } => file.lock().unwrap_or_else(|p| p.into_inner()).write_all(line),
            Kind::Buffer(buffer) => {
                buffer.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(line);
                Ok(())
            }
        }
    }
}

impl fmt::Display for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Stdout => f.write_str("stdout"),
            Kind::File { path, .. } => write!(f, "{}", path.display()),
            Kind::Buffer(_) => f.write_str("buffer"),
        }
    }
}
