//! The output listing: every regular file under `work/` after the run.

use crate::core::limits::{MAX_DEPTH, OUTPUT_HASH_BUDGET};
use crate::core::paths::RelPath;
use std::collections::HashMap;
use std::fs::{self};
use std::io::Read;
use std::path::PathBuf;

use super::error::IoContext;
use super::fsops::*;
use super::*;

impl JobStore {
    /// The output listing stored when the run ended (never hashed again).
    /// A finished job without one (finished before listings were stored)
    /// is listed now, once, and the listing stored.
    pub fn outputs(&self, id: &str) -> Result<OutputListing> {
        check_id(id)?;
        let record = self.load(id)?;
        self.check_finished(&record)?;
        let dir = self.job_dir_checked(id)?;
        match open_own_file(&dir.join(OUTPUTS)) {
            Ok(file) => {
                let mut text = Vec::new();
                file.take(crate::core::limits::JOB_RECORD_CAP + 1).read_to_end(&mut text).ctx(|| format!("read job {id}'s {OUTPUTS}"))?;
                serde_json::from_slice(&text).map_err(|err| JobError::Corrupt { id: id.to_string(), reason: format!("{OUTPUTS}: {err}") })
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let listing = self.scan_outputs(id)?;
                self.save_outputs(id, &listing)?;
                Ok(listing)
            }
            Err(err) => Err(err).ctx(|| format!("open job {id}'s {OUTPUTS}")),
        }
    }

    /// Store the listing made when the run ended (see [`Self::scan_outputs`]).
    pub fn save_outputs(&self, id: &str, listing: &OutputListing) -> Result<()> {
        check_id(id)?;
        let dir = self.job_dir_checked(id)?;
        let json =
            serde_json::to_vec(listing).map_err(|err| JobError::Io { what: "encode the output listing".into(), source: err.into() })?;
        write_atomic(&dir, OUTPUTS, &json, self.limits.durable)
    }

    /// List every regular file under `work/` now, with its hash (within
    /// [`OUTPUT_HASH_BUDGET`] bytes: files past it are listed with their
    /// size and no digest) and whether it is an untouched input. Symlinks
    /// are never followed; they and special files are listed as skipped.
    /// Stops (flagged) at [`JobLimits::files`] files, directories or
    /// skipped entries. Call when the script has stopped (the job is
    /// `Running` until the runner records the end, so nothing else writes
    /// `work/`), off the async threads: it reads up to the budget.
    pub fn scan_outputs(&self, id: &str) -> Result<OutputListing> {
        check_id(id)?;
        let record = self.load(id)?;
        if record.state == JobState::Created {
            return Err(JobError::NotRunYet { id: id.to_string() });
        }
        let dir = self.job_dir_checked(id)?;
        let work = self.work_dir_checked(id, &dir)?;
        let inputs: HashMap<&str, &str> = record.inputs.iter().map(|f| (f.path.as_str(), f.sha256.as_str())).collect();
        let cap = self.limits.files;
        let mut listing = OutputListing { files: Vec::new(), skipped: Vec::new(), total_bytes: 0, truncated: false };
        let mut dirs_seen = 0usize;
        let mut budget = OUTPUT_HASH_BUDGET;
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
                    if meta.len() > budget {
                        // Past the budget: listed by size only, never read.
                        listing.total_bytes += meta.len();
                        listing.files.push(OutputFile {
                            path: rel,
                            size: meta.len(),
                            sha256: String::new(),
                            input: InputMatch::Unhashed,
                            download: None,
                        });
                        continue;
                    }
                    match hash_regular(&entry_path, &meta) {
                        Ok((size, sha256)) => {
                            budget = budget.saturating_sub(size);
                            let input = match inputs.get(rel.as_str()) {
                                None => InputMatch::NotAnInput,
                                Some(h) if *h == sha256 => InputMatch::Unchanged,
                                Some(_) => InputMatch::Changed,
                            };
                            listing.total_bytes += size;
                            listing.files.push(OutputFile { path: rel, size, sha256, input, download: None });
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
