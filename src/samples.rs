//! The bundled sample skills: the embedded default that `serve` uses when
//! no root is given, so `cargo run --release -- serve` works from anywhere.
//!
//! The samples are compiled into the binary and written once into a private
//! directory under the system temp dir, named by a digest of their content,
//! so a rebuilt binary with changed samples never reuses stale files.

use std::path::{Path, PathBuf};

use include_dir::{include_dir, Dir, DirEntry};
use sha2::{Digest, Sha256};

static SAMPLES: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/config/samples/skills");

fn digest() -> String {
    let mut hasher = Sha256::new();
    let mut stack = vec![&SAMPLES];
    while let Some(dir) = stack.pop() {
        for entry in dir.entries() {
            match entry {
                DirEntry::Dir(d) => stack.push(d),
                DirEntry::File(f) => {
                    hasher.update(f.path().to_string_lossy().as_bytes());
                    hasher.update([0]);
                    hasher.update(f.contents());
                }
            }
        }
    }
    hex::encode(&hasher.finalize()[..8])
}

/// Write the samples out (once per content digest) and return their root.
pub fn materialize() -> std::io::Result<PathBuf> {
    let root = std::env::temp_dir().join(format!("skill-operator-samples-{}", digest()));
    let ready = root.join(".complete");
    if ready.exists() {
        return Ok(root.join("skills"));
    }
    let staging = std::env::temp_dir().join(format!("skill-operator-samples-{}.{}", digest(), std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    write_dir(&SAMPLES, &staging.join("skills"))?;
    std::fs::write(staging.join(".complete"), b"")?;
    match std::fs::rename(&staging, &root) {
        Ok(()) => {}
        // Another process won the race; its copy is identical.
        Err(_) if ready.exists() => {
            let _ = std::fs::remove_dir_all(&staging);
        }
        Err(err) => return Err(err),
    }
    Ok(root.join("skills"))
}

fn write_dir(dir: &Dir<'_>, target: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(target)?;
    for entry in dir.entries() {
        let name = entry.path().file_name().unwrap_or_default();
        match entry {
            DirEntry::Dir(d) => write_dir(d, &target.join(name))?,
            DirEntry::File(f) => std::fs::write(target.join(name), f.contents())?,
        }
    }
    Ok(())
}
