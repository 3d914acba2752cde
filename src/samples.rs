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

/// One embedded sample as a package: what `package push` of its directory
/// makes (same archive bytes, same artifact config, so the same digest).
pub struct SamplePackage {
    pub name: String,
    pub archive: Vec<u8>,
    pub config: crate::oci::SkillConfig,
}

/// Every embedded sample as a deterministic package, by name.
///
/// The embedded copy keeps contents but not file modes; a file is executable
/// when it starts with `#!`, which is exactly the files the repository marks
/// executable (a unit test holds the two together).
pub fn packages() -> anyhow::Result<Vec<SamplePackage>> {
    let mut out = Vec::new();
    for entry in SAMPLES.dirs() {
        let name = entry.path().to_string_lossy().into_owned();
        let mut tar = tar::Builder::new(Vec::new());
        let mut stack = vec![entry];
        while let Some(dir) = stack.pop() {
            for e in dir.entries() {
                match e {
                    DirEntry::Dir(d) => stack.push(d),
                    DirEntry::File(f) => {
                        let rel = f.path().strip_prefix(entry.path()).unwrap_or(f.path());
                        let mut h = tar::Header::new_gnu();
                        h.set_size(f.contents().len() as u64);
                        h.set_mode(if f.contents().starts_with(b"#!") { 0o755 } else { 0o644 });
                        h.set_entry_type(tar::EntryType::Regular);
                        tar.append_data(&mut h, rel, f.contents())?;
                    }
                }
            }
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar.into_inner()?)?;
        let archive = crate::core::package::build_from_tarball(&gz.finish()?, &crate::core::package::Limits::DEFAULT)?;
        let described = crate::oci::publish::describe(&archive)?;
        out.push(SamplePackage { name, archive, config: described.config });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn embedded_packages_are_what_package_push_builds_from_the_repository() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills");
        let packages = super::packages().unwrap();
        assert_eq!(packages.len(), std::fs::read_dir(&root).unwrap().count());
        for p in packages {
            let from_dir = crate::core::package::build_from_dir(&root.join(&p.name)).unwrap();
            assert!(from_dir == p.archive, "{}: the embedded package differs from `package push` of the directory", p.name);
            assert_eq!(p.config.name, p.name);
        }
    }
}
