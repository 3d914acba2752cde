//! The output listing: every regular file under `work/` after the run.

use crate::core::limits::MAX_DEPTH;
use crate::core::paths::RelPath;
use std::collections::HashMap;
use std::fs::{self};
use std::path::PathBuf;

use super::fsops::*;
use super::*;

impl JobStore {
    /// Every regular file under `work/` once the run is over, with its hash
    /// and whether it is an untouched input. Symlinks are never followed;
    /// they and special files are listed as skipped. Stops (flagged) at
    /// [`JobLimits::files`] files, directories or skipped entries.
    pub fn outputs(&self, id: &str) -> Result<OutputListing> {
        check_id(id)?;
        let record = self.load(id)?;
        self.check_finished(&record)?;
        let dir = self.job_dir_checked(id)?;
        let work = self.work_dir_checked(id, &dir)?;
        let inputs: HashMap<&str, &str> = record.inputs.iter().map(|f| (f.path.as_str(), f.sha256.as_str())).collect();
        let cap = self.limits.files;
        let mut listing = OutputListing { files: Vec::new(), skipped: Vec::new(), total_bytes: 0, truncated: false };
        let mut dirs_seen = 0usize;
        // (real directory, its path relative to work/ ("" for work/), depth)
        let mut stack: Vec<(PathBuf, String, usize)> = vec![(work, String::new(), 0)];
        'walk: while let Some((real_dir, prefix, depth)) = stack.pop() {
            dirs_seen += 1;
            if dirs_seen > cap {
                listing.truncated = true;
                break;
            }
            let mut entries = Vec::new();
            match fs::read_dir(&real_dir) {
                Ok(iter) => {
                    for entry in iter {
                        match entry {
                            Ok(entry) => entries.push(entry),
                            Err(err) => {
                                skip(
                                    &mut listing,
                                    cap,
                                    display_rel(&prefix, "?"),
                                    SkipKind::Unreadable,
                                    format!("directory entry unreadable: {err}"),
                                );
                            }
                        }
                    }
                }
                Err(err) => {
                    skip(&mut listing, cap, display_rel(&prefix, ""), SkipKind::Unreadable, format!("directory unreadable: {err}"));
                    continue;
                }
            }
            entries.sort_by_key(|e| e.file_name());
            let mut subdirs = Vec::new();
            for entry in entries {
                let raw = entry.file_name();
                let shown = display_rel(&prefix, &raw.to_string_lossy());
                let Some(name) = raw.to_str() else {
                    skip(&mut listing, cap, shown, SkipKind::BadName, "the name is not UTF-8, so it cannot be addressed".into());
                    continue;
                };
                let rel = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
                if let Err(err) = RelPath::parse(&rel) {
                    skip(&mut listing, cap, shown, SkipKind::BadName, format!("the path cannot be addressed: {err}"));
                    continue;
                }
                let entry_path = entry.path();
                // lstat: the entry itself, never what a link points to.
                let meta = match fs::symlink_metadata(&entry_path) {
                    Ok(meta) => meta,
                    Err(err) => {
                        skip(&mut listing, cap, rel, SkipKind::Unreadable, format!("cannot stat: {err}"));
                        continue;
                    }
                };
                let file_type = meta.file_type();
                if file_type.is_symlink() {
                    let target = fs::read_link(&entry_path).map(|t| format!("{:?}", t)).unwrap_or_else(|_| "an unreadable target".into());
                    skip(&mut listing, cap, rel, SkipKind::Symlink, format!("symlink to {}; not followed", clip(&target, 200)));
                } else if file_type.is_dir() {
                    if depth + 1 >= MAX_DEPTH {
                        skip(
                            &mut listing,
                            cap,
                            rel,
                            SkipKind::TooDeep,
                            format!("directory nested deeper than {MAX_DEPTH} levels; not walked"),
                        );
                    } else {
                        subdirs.push((entry_path, rel, depth + 1));
                    }
                } else if file_type.is_file() {
                    if listing.files.len() >= cap {
                        listing.truncated = true;
                        break 'walk;
                    }
                    match hash_regular(&entry_path, &meta) {
                        Ok((size, sha256)) => {
                            let input = match inputs.get(rel.as_str()) {
                                None => InputMatch::NotAnInput,
                                Some(h) if *h == sha256 => InputMatch::Unchanged,
                                Some(_) => InputMatch::Changed,
                            };
                            listing.total_bytes += size;
                            listing.files.push(OutputFile { path: rel, size, sha256, input });
                        }
                        Err(reason) => skip(&mut listing, cap, rel, SkipKind::Unreadable, reason),
                    }
                } else {
                    skip(&mut listing, cap, rel, SkipKind::Special, format!("{}; only regular files are served", special_kind(&file_type)));
                }
            }
            // Reverse so the walk pops directories in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        listing.files.sort_by(|a, b| a.path.cmp(&b.path));
        if listing.skipped.len() >= cap {
            listing.truncated = true;
        }
        Ok(listing)
    }
}
