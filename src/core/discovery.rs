//! Finding skills under the roots the server was given.
//!
//! Three layouts under each root: `<root>/SKILL.md` (the root is one skill,
//! named by the root directory), `<root>/<name>/SKILL.md`, and
//! `<root>/skills/<name>/SKILL.md`. Inside a `skills/` container a hidden
//! folder without a `SKILL.md` (`skills/.curated/<name>`) is a group whose
//! children are skills; hidden folders at the root itself (`.git`, `.github`,
//! `.agents`) are tooling and are not scanned, since `.agents/skills ->
//! ../skills` would serve every skill twice (one holding a `SKILL.md` is
//! reported as `hidden-skipped`). Version-control folders inside a skill are
//! not indexed.
//!
//! That is [`Layout::Standard`], the default. [`Layout::Recursive`]
//! (`serve --layout recursive`) walks each root deeper and names a nested
//! skill by its path; its rules are in [`recursive`].
//!
//! A skill is served under its directory name, never its frontmatter name:
//! a grant names a skill, so a package that could pick its own name could
//! claim its neighbour's grant. Two different directories contributing one
//! name are both refused. Symlinks are followed while they stay inside the
//! root (for skill directories) or the skill (for files); the same real
//! directory is served once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::catalog::{read_capped, Catalog, DeclaredScript, FileEntry, Root, Shown, Skill};
use super::declaration;
use super::frontmatter;
use super::limits::{MAX_DEPTH, MAX_DIRS, MAX_FILES, SKILLS_TOTAL, SKILL_MD_READ_CAP};
use super::paths::{resolve_inside, RelPath, ResolveError};
use super::problems::{Problem, Reason};
use super::spec;

/// Caps used by a scan; [`Limits::default`] is the production set.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub skills: usize,
    pub files_per_skill: usize,
    pub dirs_per_skill: usize,
    pub skill_md_cap: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { skills: SKILLS_TOTAL, files_per_skill: MAX_FILES, dirs_per_skill: MAX_DIRS, skill_md_cap: SKILL_MD_READ_CAP }
    }
}

/// How skills are laid out under each root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// `<root>/SKILL.md`, `<root>/<name>`, `<root>/skills/<name>` (and hidden groups).
    #[default]
    Standard,
    /// Any depth up to the recursive limit, named by path (`document-skills/xlsx`).
    Recursive,
}

/// Folders inside a skill that are never indexed.
const VCS_DIRS: &[&str] = &[".git", ".hg", ".svn"];

/// A directory that may be a skill, before it is read.
struct Candidate {
    name: String,
    root: PathBuf,
    root_index: usize,
    /// Where it was found (as seen, for messages).
    seen_at: PathBuf,
    real: PathBuf,
    via_symlink: bool,
}

/// Scan every root in the standard layout and build the catalog.
pub fn discover(roots: &[PathBuf], limits: Limits) -> Catalog {
    discover_with(roots, limits, Layout::Standard)
}

/// Scan every root in `layout` and build the catalog.
pub fn discover_with(roots: &[PathBuf], limits: Limits, layout: Layout) -> Catalog {
    let mut problems = Vec::new();
    let mut candidates = Vec::new();
    for (index, root) in roots.iter().enumerate() {
        match layout {
            Layout::Standard => collect_root(index, root, &mut candidates, &mut problems),
            Layout::Recursive => recursive::collect_root(index, root, &mut candidates, &mut problems),
        }
    }

    // The same real directory is served once: prefer the entry whose name
    // is the directory's own (not a symlink alias), then scan order.
    candidates.sort_by_key(|c| (c.via_symlink, c.root_index));
    let mut by_real: HashMap<PathBuf, usize> = HashMap::new();
    let mut unique = Vec::new();
    for cand in candidates {
        if let Some(&first) = by_real.get(&cand.real) {
            let kept: &Candidate = &unique[first];
            problems.push(Problem::new(
                &cand.seen_at,
                Reason::DuplicatePath,
                format!("same directory as {} (served as `{}`); served once", kept.seen_at.display(), kept.name),
            ));
            continue;
        }
        by_real.insert(cand.real.clone(), unique.len());
        unique.push(cand);
    }

    // A name contributed by two directories refuses both.
    let mut by_name: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
    for cand in unique {
        by_name.entry(cand.name.clone()).or_default().push(cand);
    }
    let mut accepted = Vec::new();
    for (name, group) in by_name {
        if group.len() > 1 {
            let places: Vec<String> = group.iter().map(|c| c.seen_at.display().to_string()).collect();
            for cand in &group {
                problems.push(
                    Problem::new(
                        &cand.seen_at,
                        Reason::DuplicateName,
                        format!("`{name}` is contributed by {} directories ({}); all are refused", group.len(), places.join(", ")),
                    )
                    .for_skill(&name),
                );
            }
            continue;
        }
        accepted.extend(group);
    }
    let mut accepted = refuse_prefix_clashes(accepted, &mut problems);
    accepted.sort_by(|a, b| (a.root_index, &a.name).cmp(&(b.root_index, &b.name)));
    if accepted.len() > limits.skills {
        for cand in accepted.drain(limits.skills..) {
            problems.push(
                Problem::new(&cand.seen_at, Reason::SkillLimit, format!("more than {} skills; not served", limits.skills))
                    .for_skill(&cand.name),
            );
        }
    }

    let loaded = load_all(&accepted, limits);
    let mut skills = Vec::with_capacity(loaded.len());
    let mut root_counts = vec![0usize; roots.len()];
    for (cand, (skill, mut found)) in accepted.iter().zip(loaded) {
        problems.append(&mut found);
        if let Some(skill) = skill {
            root_counts[cand.root_index] += 1;
            skills.push(skill);
        }
    }
    skills.sort_by(|a, b| a.name.cmp(&b.name));
    Catalog { roots: roots.iter().zip(root_counts).map(|(path, skills)| Root::on_disk(path.clone(), skills)).collect(), skills, problems }
}

/// A name that is a whole-segment prefix of another (`a` and `a/b`, only
/// in the recursive layout) would make `skill://a/b/SKILL.md` name two
/// files, so both are refused, like two directories claiming one name.
fn refuse_prefix_clashes(accepted: Vec<Candidate>, problems: &mut Vec<Problem>) -> Vec<Candidate> {
    let names: HashSet<&str> = accepted.iter().map(|c| c.name.as_str()).collect();
    let mut clashing: BTreeMap<String, String> = BTreeMap::new();
    for cand in &accepted {
        for (cut, _) in cand.name.match_indices('/') {
            let prefix = &cand.name[..cut];
            if names.contains(prefix) {
                clashing.insert(prefix.to_string(), cand.name.clone());
                clashing.insert(cand.name.clone(), prefix.to_string());
            }
        }
    }
    if clashing.is_empty() {
        return accepted;
    }
    let (refused, kept): (Vec<Candidate>, Vec<Candidate>) = accepted.into_iter().partition(|c| clashing.contains_key(&c.name));
    for cand in refused {
        let other = &clashing[&cand.name];
        problems.push(
            Problem::new(
                &cand.seen_at,
                Reason::DuplicateName,
                format!(
                    "`{}` and `{other}` would share skill:// URIs (one name is a folder of the other); both are refused, rename or move one",
                    cand.name
                ),
            )
            .for_skill(&cand.name),
        );
    }
    kept
}

/// Read every accepted candidate; on two or more cores the work is split
/// across threads (each skill is independent, and most of the time is
/// spent in syscalls).
fn load_all(cands: &[Candidate], limits: Limits) -> Vec<(Option<Skill>, Vec<Problem>)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if threads < 2 || cands.len() < 64 {
        return cands.iter().map(|c| load_skill(c, limits)).collect();
    }
    let chunk = cands.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            cands.chunks(chunk).map(|part| scope.spawn(move || part.iter().map(|c| load_skill(c, limits)).collect::<Vec<_>>())).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    })
}

fn collect_root(index: usize, root: &Path, out: &mut Vec<Candidate>, problems: &mut Vec<Problem>) {
    let Some(real_root) = open_root(root, problems) else { return };
    if real_root.join("SKILL.md").exists() {
        out.push(root_skill(index, root, real_root));
        return;
    }
    scan_container(index, root, &real_root, root, ContainerKind::Root, out, problems);
}

/// The real path of a root that is a directory; otherwise the problem saying why not.
fn open_root(root: &Path, problems: &mut Vec<Problem>) -> Option<PathBuf> {
    match root.canonicalize() {
        Ok(real) if real.is_dir() => Some(real),
        Ok(_) => {
            problems.push(Problem::new(root, Reason::RootUnreadable, "not a directory"));
            None
        }
        Err(err) => {
            problems.push(Problem::new(root, Reason::RootUnreadable, err.to_string()));
            None
        }
    }
}

/// A root that holds a `SKILL.md` is one skill, named by the root directory.
fn root_skill(index: usize, root: &Path, real_root: PathBuf) -> Candidate {
    let name = real_root.file_name().and_then(OsStr::to_str).unwrap_or("").to_string();
    Candidate { name, root: root.to_path_buf(), root_index: index, seen_at: root.to_path_buf(), real: real_root, via_symlink: false }
}

#[derive(Clone, Copy, PartialEq)]
enum ContainerKind {
    /// The root itself: holds skills and maybe a `skills/` container.
    Root,
    /// `<root>/skills`: holds skills and hidden groups.
    Skills,
    /// `<root>/skills/.group`: holds skills only.
    Group,
}

fn scan_container(
    index: usize,
    root: &Path,
    real_root: &Path,
    dir: &Path,
    kind: ContainerKind,
    out: &mut Vec<Candidate>,
    problems: &mut Vec<Problem>,
) {
    let entries = match sorted_entries(dir) {
        Ok(entries) => entries,
        Err(err) => {
            let reason = if kind == ContainerKind::Root { Reason::RootUnreadable } else { Reason::UnusablePath };
            problems.push(Problem::new(dir, reason, err.to_string()));
            return;
        }
    };
    for (name, seen_at) in entries {
        let Some(name_str) = name.to_str() else {
            problems.push(Problem::new(&seen_at, Reason::UnusableName, "the directory name is not UTF-8"));
            continue;
        };
        let meta = match fs::symlink_metadata(&seen_at) {
            Ok(meta) => meta,
            Err(err) => {
                problems.push(Problem::new(&seen_at, Reason::UnusablePath, err.to_string()));
                continue;
            }
        };
        let via_symlink = meta.file_type().is_symlink();
        let real = if via_symlink {
            match seen_at.canonicalize() {
                Ok(real) => real,
                Err(_) => {
                    if name_str.starts_with('.') {
                        continue;
                    }
                    problems.push(Problem::new(&seen_at, Reason::BrokenSymlink, "the symlink points nowhere"));
                    continue;
                }
            }
        } else {
            seen_at.clone()
        };
        if !real.is_dir() {
            continue; // README.md, LICENSE and other files next to skills.
        }
        let hidden = name_str.starts_with('.');
        let has_skill_md = real.join("SKILL.md").exists();
        if hidden {
            if kind == ContainerKind::Skills && !has_skill_md && !via_symlink {
                scan_container(index, root, real_root, &seen_at, ContainerKind::Group, out, problems);
            } else if has_skill_md {
                problems.push(Problem::new(
                    &seen_at,
                    Reason::HiddenSkipped,
                    "a hidden folder holds a SKILL.md; hidden folders are not served (add it as a root to serve it)",
                ));
            }
            continue;
        }
        if via_symlink && !real.starts_with(real_root) {
            problems.push(Problem::new(
                &seen_at,
                Reason::SymlinkEscape,
                format!("the symlink leads outside the root to {}", real.display()),
            ));
            continue;
        }
        if kind == ContainerKind::Root && name_str == "skills" && !has_skill_md {
            scan_container(index, root, real_root, &seen_at, ContainerKind::Skills, out, problems);
            continue;
        }
        if !has_skill_md {
            let detail = if kind == ContainerKind::Root {
                "no SKILL.md in this folder".to_string()
            } else {
                format!("no SKILL.md; a nested layout is served when you add {} as a root", seen_at.display())
            };
            problems.push(Problem::new(&seen_at, Reason::NoSkillMd, detail));
            continue;
        }
        out.push(Candidate { name: name_str.to_string(), root: root.to_path_buf(), root_index: index, seen_at, real, via_symlink });
    }
}

fn sorted_entries(dir: &Path) -> io::Result<Vec<(std::ffi::OsString, PathBuf)>> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.filter_map(Result::ok).map(|e| (e.file_name(), e.path())).collect();
    entries.sort();
    Ok(entries)
}

/// Like [`sorted_entries`] but with the entry type from `getdents` (no stat per entry).
fn typed_entries(dir: &Path) -> io::Result<Vec<(std::ffi::OsString, PathBuf, Option<fs::FileType>)>> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.filter_map(Result::ok).map(|e| (e.file_name(), e.path(), e.file_type().ok())).collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// Read one candidate: name check, `SKILL.md`, frontmatter, spec checks,
/// declaration, file index. Returns the skill (when it can be served) and
/// every problem found, each tagged with the skill's name.
fn load_skill(cand: &Candidate, limits: Limits) -> (Option<Skill>, Vec<Problem>) {
    let mut problems = Vec::new();
    let name = cand.name.clone();
    let at = |p: &Path, reason: Reason, detail: String| Problem::new(p, reason, detail).for_skill(&name);
    if let Err(why) = spec::servable_path_name(&name) {
        problems.push(at(&cand.seen_at, Reason::UnusableName, format!("directory name {name:?} {why}")));
        return (None, problems);
    }
    let skill_md = cand.seen_at.join("SKILL.md");
    // A plain file needs no resolution; only a symlinked SKILL.md is resolved.
    let plain = fs::symlink_metadata(cand.real.join("SKILL.md")).is_ok_and(|m| m.file_type().is_file());
    match if plain { Ok(PathBuf::new()) } else { resolve_inside(&cand.real, &RelPath::parse("SKILL.md").expect("literal")) } {
        Ok(_) => {}
        Err(ResolveError::Escapes) => {
            problems.push(at(&skill_md, Reason::SymlinkEscape, "SKILL.md is a symlink leading outside the skill".into()));
            return (None, problems);
        }
        Err(err) => {
            problems.push(at(&skill_md, Reason::UnreadableSkillMd, err.to_string()));
            return (None, problems);
        }
    }
    let (bytes, truncated) = match read_capped(&cand.real.join("SKILL.md"), limits.skill_md_cap) {
        Ok(read) => read,
        Err(err) => {
            problems.push(at(&skill_md, Reason::UnreadableSkillMd, err.to_string()));
            return (None, problems);
        }
    };
    if truncated {
        problems.push(at(
            &skill_md,
            Reason::SkillMdTruncated,
            format!(
                "SKILL.md is larger than {} KiB; only the first {} KiB are served",
                limits.skill_md_cap / 1024,
                limits.skill_md_cap / 1024
            ),
        ));
    }
    let md = match frontmatter::decode(&bytes, truncated).and_then(frontmatter::parse) {
        Ok(md) => md,
        Err(err @ frontmatter::FrontmatterError::NotUtf8(_)) => {
            problems.push(at(&skill_md, Reason::UnreadableSkillMd, err.to_string()));
            return (None, problems);
        }
        Err(err) => {
            problems.push(at(&skill_md, Reason::MalformedFrontmatter, err.to_string()));
            return (None, problems);
        }
    };
    drop(bytes);
    let (meta, findings) = match spec::check(&name, &md.frontmatter) {
        Ok(checked) => checked,
        Err((reason, detail)) => {
            problems.push(at(&skill_md, reason, detail));
            return (None, problems);
        }
    };
    problems.extend(findings.into_iter().map(|(reason, detail)| at(&skill_md, reason, detail)));

    let (files, bytes_total) = walk_files(&cand.real, &cand.seen_at, limits, &mut |p| problems.push(p.for_skill(&name)));

    let mut scripts = Vec::new();
    let mut egress = Vec::new();
    let mut has_declaration = false;
    if let Some(block) = md.frontmatter.get("mcp-host") {
        let (decl, findings) = declaration::parse(block);
        problems.extend(findings.into_iter().map(|(reason, detail)| at(&skill_md, reason, detail)));
        if let Some(decl) = decl {
            has_declaration = true;
            egress = decl.egress.clone();
            for script in decl.scripts {
                // The file index already followed symlinks and dropped escapes;
                // only a script missing from it is resolved for the exact reason.
                let indexed = files.binary_search_by(|f| f.path.cmp(&script.script)).is_ok();
                let resolved = if indexed { Ok(PathBuf::new()) } else { resolve_inside(&cand.real, &script.script) };
                let unavailable = match resolved {
                    Ok(_) => script.refused.clone(),
                    Err(ResolveError::Escapes) => {
                        problems.push(at(
                            &cand.seen_at.join(script.script.as_str()),
                            Reason::SymlinkEscape,
                            format!("declared script {} leads outside the skill", script.script),
                        ));
                        Some(format!("{} leads outside the skill directory", script.script))
                    }
                    Err(err) => {
                        problems.push(at(
                            &cand.seen_at.join(script.script.as_str()),
                            Reason::DeclaredScriptMissing,
                            format!("declared script {}: {err}", script.script),
                        ));
                        Some(format!("{} is not in the package ({err})", script.script))
                    }
                };
                scripts.push(DeclaredScript { decl: script, unavailable });
            }
        }
    }

    let skill = Skill {
        name: name.clone(),
        root: cand.root.clone(),
        dir: cand.real.clone(),
        meta,
        frontmatter: md.frontmatter,
        files,
        bytes: bytes_total,
        skill_md_truncated: truncated,
        scripts,
        egress,
        has_declaration,
        problems: problems.clone(),
        shown: Shown::on_disk(&cand.root, &cand.real),
    };
    (Some(skill), problems)
}

/// Index the files of one skill: symlinks followed while they stay inside
/// the skill, loops and aliases cut, caps enforced and reported.
fn walk_files(real_dir: &Path, seen_dir: &Path, limits: Limits, report: &mut dyn FnMut(Problem)) -> (Vec<FileEntry>, u64) {
    let mut files = Vec::new();
    let mut total = 0u64;
    let mut dirs_seen = 1usize;
    let mut visited: HashSet<PathBuf> = HashSet::from([real_dir.to_path_buf()]);
    let mut file_limit_hit = false;
    let mut dir_limit_hit = false;
    // (real dir, path relative to the skill, depth)
    let mut stack = vec![(real_dir.to_path_buf(), PathBuf::new(), 0usize)];
    while let Some((dir, rel, depth)) = stack.pop() {
        let entries = match typed_entries(&dir) {
            Ok(entries) => entries,
            Err(err) => {
                report(Problem::new(seen_dir.join(&rel), Reason::UnusablePath, format!("cannot list: {err}")));
                continue;
            }
        };
        let mut subdirs = Vec::new();
        for (name, path, file_type) in entries {
            let rel_child = rel.join(&name);
            let seen = seen_dir.join(&rel_child);
            // Plain directories need no stat: getdents gave their type.
            let plain_dir = file_type.is_some_and(|t| t.is_dir());
            let (real, meta, via_symlink) = if plain_dir {
                (path, None, false)
            } else {
                let Ok(meta) = fs::symlink_metadata(&path) else { continue };
                if meta.file_type().is_symlink() {
                    let Ok(real) = path.canonicalize() else {
                        report(Problem::new(&seen, Reason::BrokenSymlink, "the symlink points nowhere; not served"));
                        continue;
                    };
                    if !real.starts_with(real_dir) {
                        report(Problem::new(&seen, Reason::SymlinkEscape, "the symlink leads outside the skill; not served"));
                        continue;
                    }
                    let Ok(meta) = fs::metadata(&real) else { continue };
                    (real, Some(meta), true)
                } else {
                    (path, Some(meta), false)
                }
            };
            if plain_dir || meta.as_ref().is_some_and(|m| m.is_dir()) {
                if VCS_DIRS.iter().any(|v| OsStr::new(v) == name) {
                    continue;
                }
                if via_symlink && dir.starts_with(&real) {
                    report(Problem::new(&seen, Reason::SymlinkLoop, "the symlink leads back to one of its own parents; not followed"));
                    continue;
                }
                if via_symlink && visited.contains(&real) {
                    report(Problem::new(&seen, Reason::DuplicatePath, "this folder is reached twice through symlinks; indexed once"));
                    continue;
                }
                if depth + 1 > MAX_DEPTH {
                    report(Problem::new(&seen, Reason::DirLimit, format!("nested deeper than {MAX_DEPTH} levels; not indexed")));
                    continue;
                }
                if dirs_seen >= limits.dirs_per_skill {
                    if !dir_limit_hit {
                        dir_limit_hit = true;
                        report(Problem::new(
                            &seen,
                            Reason::DirLimit,
                            format!("more than {} folders in this skill; folders from here on are not indexed", limits.dirs_per_skill),
                        ));
                    }
                    continue;
                }
                dirs_seen += 1;
                visited.insert(real.clone());
                subdirs.push((real, rel_child, depth + 1));
                continue;
            }
            let Some(meta) = meta else { continue };
            if meta.is_file() {
                let rel_path = match RelPath::from_walk(&rel_child) {
                    Ok(p) => p,
                    Err(err) => {
                        report(Problem::new(
                            &seen,
                            Reason::UnusablePath,
                            format!("this name cannot be addressed by the read tools ({err}); not served"),
                        ));
                        continue;
                    }
                };
                if files.len() >= limits.files_per_skill {
                    if !file_limit_hit {
                        file_limit_hit = true;
                        report(Problem::new(
                            &seen,
                            Reason::FileLimit,
                            format!("more than {} files in this skill; files from here on are not served", limits.files_per_skill),
                        ));
                    }
                    continue;
                }
                total += meta.len();
                files.push(FileEntry { path: rel_path, size: meta.len() });
            } else {
                report(Problem::new(&seen, Reason::UnusablePath, "not a regular file or folder (socket, pipe or device); not served"));
            }
        }
        // Depth-first in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    (files, total)
}

#[path = "discovery_recursive.rs"]
pub mod recursive;

#[cfg(test)]
#[path = "discovery_tests.rs"]
mod tests;
