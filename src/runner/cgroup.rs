//! One cgroup per run, so the run's limits hold for the run as a whole:
//! every process and thread it starts, and the shared memory and tmpfs
//! pages it touches, count against one memory, process and CPU budget
//! ([`RUN_MEMORY_BYTES`], [`RUN_PIDS`], [`RUN_CPUS`]). Per-process rlimits
//! cannot do that: `RLIMIT_DATA` does not count shared mappings, and
//! `RLIMIT_NPROC` counts a uid, not a run.
//!
//! # Where the run cgroups live (what the server needs)
//!
//! Under a subtree the server owns: its own cgroup, as the kernel reports
//! it in `/proc/self/cgroup`, or `--cgroup-parent` (cgroup v2).
//!
//! - **cgroup v2** (`cgroup2` mounted, the `memory` and `pids` controllers
//!   available in that cgroup): the server must be able to write there,
//!   as root or through delegation (systemd `Delegate=yes`, or a container
//!   runtime's cgroup namespace). The kernel lets controllers be enabled
//!   for children only in a cgroup without processes of its own, so when
//!   the server's cgroup holds the server itself, the server first moves
//!   itself into a `supervisor` leaf (what systemd expects of a delegated
//!   service), then enables `+memory +pids +cpu` and creates `runs/`.
//!   Other processes in that cgroup make this fail (EBUSY); give the
//!   server a cgroup of its own then.
//! - **cgroup v1** (hybrid hosts, where `memory` and `pids` hierarchies are
//!   v1): one `skill-operator.<pid>` directory under the server's cgroup
//!   in each of the `memory`, `pids` and (when mounted) `cpu` hierarchies;
//!   root or a chown'ed subtree.
//!
//! Anything else falls back to per-process rlimits only, and says so in
//! every preview and in `skill_list` (`--cgroup required` refuses runs
//! instead). The fallback is never silent.
//!
//! # Joining
//!
//! The server opens the run's `cgroup.procs` files before the fork; the
//! child writes `0` (itself) into each of them after the fork and before
//! it drops privileges and execs ([`super::process`]). So the run is in
//! its cgroup before it can start anything: there is no window in which a
//! child could fork outside it, which moving a pid in after the spawn
//! would leave.
//!
//! # Limits and how a hit is seen
//!
//! - memory: v2 `memory.max` (and `memory.swap.max` 0), v1
//!   `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap
//!   is accounted). Page cache, shared memory (`/dev/shm`, `memfd`,
//!   `MAP_SHARED|MAP_ANONYMOUS`) and tmpfs pages are charged to the cgroup
//!   of the process that touches them. A hit is the kernel's OOM kill,
//!   counted in `memory.events` (v2) or `memory.oom_control` (v1,
//!   `oom_kill`).
//! - processes: `pids.max`; a refused fork is counted in `pids.events`
//!   (`max`).
//! - CPU: `cpu.max` (v2) or `cpu.cfs_quota_us`/`cpu.cfs_period_us` (v1):
//!   throttling, never a failure.
//!
//! The runner reads these counters while the run goes on and after it
//! ends ([`super::watch`]) and stops the whole run on the first hit.
//!
//! # What joining costs, and `favordynmods`
//!
//! Moving a process into a cgroup takes the kernel's cgroup migration lock
//! for writing, and its first writer after a quiet spell waits for an RCU
//! grace period: one write to `cgroup.procs` then takes 5-8 ms on this
//! project's 2-core host (0.02 ms when another migration just happened),
//! and every run pays it once, on its start. The kernel's `favordynmods`
//! option removes that wait, "at the cost of making hot path operations
//! such as forks and exits more expensive" (its cgroup-v2 documentation;
//! since Linux 6.18 the migration lock is per thread group then, and the
//! option cannot be switched off again until reboot). Any cgroup
//! hierarchy mounted with it switches it on, so unless told not to
//! (`--cgroup-favor-dynmods false`) the server makes one: a detached mount
//! (the new mount API, attached to no path; on v1 it shows only as one
//! more line in `/proc/<pid>/cgroup`) of its own named v1 hierarchy, or of
//! the v2 hierarchy,
//! held for the server's lifetime. Where the kernel refuses, runs pay the
//! wait and `skill_list` says so.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::core::limits::{bytes_text, RUN_CPUS, RUN_CPU_PERIOD_US, RUN_MEMORY_BYTES, RUN_PIDS};

/// The operator's cgroup choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// Refuse to run anything without a cgroup per run.
    Required,
    /// A cgroup per run when the host allows it; per-process limits otherwise (said so).
    Auto,
    /// Never make cgroups: per-process limits only.
    Off,
}

impl CgroupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMode::Required => "required",
            CgroupMode::Auto => "auto",
            CgroupMode::Off => "off",
        }
    }
}

/// The limits one run's cgroup gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub memory_bytes: u64,
    pub pids: u64,
    pub cpus: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits { memory_bytes: RUN_MEMORY_BYTES, pids: RUN_PIDS, cpus: RUN_CPUS }
    }
}

impl RunLimits {
    /// The limits in words, for previews.
    pub fn words(&self) -> Vec<String> {
        vec![
            format!("memory {} for the whole run (shared memory and tmpfs included)", bytes_text(self.memory_bytes)),
            format!("{} processes and threads", self.pids),
            format!("{} CPU", self.cpus),
        ]
    }
}

/// Why the server cannot make cgroups here (the fallback's reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// `runs` is the directory run cgroups are made in.
    V2 { runs: PathBuf },
    /// Per hierarchy, the directory run cgroups are made in.
    V1 { memory: PathBuf, pids: PathBuf, cpu: Option<PathBuf> },
}

/// Whether the kernel's cgroup migrations skip the RCU grace period (see
/// the module docs).
#[derive(Debug, Clone)]
enum Migrations {
    /// The detached `favordynmods` mount, held open so the option stays on.
    Favored(#[allow(dead_code)] Arc<OwnedFd>),
    /// Not asked for (`--cgroup-favor-dynmods false`).
    Default,
    /// Asked for and refused: why.
    Refused(String),
}

/// The server's subtree of run cgroups.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: Layout,
    limits: RunLimits,
    migrations: Migrations,
}

/// One entry of `/proc/self/mountinfo` that is a cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    /// The hierarchy path mounted there (`/` unless in a cgroup namespace view).
    root: String,
    mount_point: PathBuf,
    v2: bool,
    /// v1: the controllers of this hierarchy.
    controllers: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let fields: Vec<&str> = left.split(' ').collect();
        let rest: Vec<&str> = right.split(' ').collect();
        if fields.len() < 5 || rest.len() < 3 {
            continue;
        }
        let fstype = rest[0];
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let controllers = if fstype == "cgroup" {
            rest[2].split(',').filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('=')).map(str::to_string).collect()
        } else {
            Vec::new()
        };
        out.push(CgroupMount {
            root: unescape(fields[3]),
            mount_point: PathBuf::from(unescape(fields[4])),
            v2: fstype == "cgroup2",
            controllers,
        });
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v as char);
            i += 4;
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

/// `/proc/self/cgroup`: (hierarchy id, controllers, path).
fn parse_self_cgroup(text: &str) -> Vec<(String, Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.to_string();
            let controllers = parts.next()?.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect();
            let path = parts.next()?.to_string();
            Some((id, controllers, path))
        })
        .collect()
}

/// The directory of `path` (as `/proc/self/cgroup` names it) under `mount`.
fn under_mount(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rel =
        if mount.root == "/" { path.trim_start_matches('/') } else { path.strip_prefix(mount.root.as_str())?.trim_start_matches('/') };
    Some(if rel.is_empty() { mount.mount_point.clone() } else { mount.mount_point.join(rel) })
}

fn read_small(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    File::open(path)?.take(64 * 1024).read_to_string(&mut text)?;
    Ok(text)
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("write {value:?} to {}: {e}", path.display())))
}

/// `name N` from a flat-keyed cgroup file (`memory.events`, `pids.events`, `memory.oom_control`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

impl Cgroups {
    /// Find and prepare the server's subtree. `parent` (cgroup v2 only)
    /// replaces the server's own cgroup as the place runs are made in;
    /// `favor_dynmods` asks the kernel for migrations without a grace
    /// period (see the module docs).
    pub fn detect(parent: Option<&Path>, limits: RunLimits, favor_dynmods: bool) -> Result<Cgroups, Unavailable> {
        let mut cg = Self::detect_layout(parent, limits)?;
        if favor_dynmods {
            cg.migrations = match favor_migrations(matches!(cg.layout, Layout::V2 { .. })) {
                Ok(fd) => {
                    tracing::info!("cgroup favordynmods on: a run joins its cgroup without waiting for an RCU grace period (--cgroup-favor-dynmods false leaves the host as it is)");
                    Migrations::Favored(Arc::new(fd))
                }
                Err(e) => {
                    let why = format!("the kernel refused a favordynmods cgroup mount ({e}; it needs root and Linux 6.1 or later)");
                    tracing::warn!(reason = %why, "every run waits for an RCU grace period (about 5-8 ms) as it joins its cgroup");
                    Migrations::Refused(why)
                }
            };
        }
        Ok(cg)
    }

    fn detect_layout(parent: Option<&Path>, limits: RunLimits) -> Result<Cgroups, Unavailable> {
        let mountinfo =
            read_small(Path::new("/proc/self/mountinfo")).map_err(|e| Unavailable(format!("cannot read /proc/self/mountinfo: {e}")))?;
        let own = read_small(Path::new("/proc/self/cgroup")).map_err(|e| Unavailable(format!("cannot read /proc/self/cgroup: {e}")))?;
        let mounts = parse_mountinfo(&mountinfo);
        let own = parse_self_cgroup(&own);
        let mut reasons = Vec::new();
        if let Some(parent) = parent {
            return Self::v2_at(parent, limits, false).map_err(|e| Unavailable(format!("--cgroup-parent {}: {e}", parent.display())));
        }
        // v2 first: where the memory controller lives in the unified
        // hierarchy, that is the one to use.
        if let (Some(mount), Some((_, _, path))) = (mounts.iter().find(|m| m.v2), own.iter().find(|(id, _, _)| id == "0")) {
            if let Some(dir) = under_mount(mount, path) {
                match Self::v2_at(&dir, limits, true) {
                    Ok(cg) => return Ok(cg),
                    Err(e) => reasons.push(format!("cgroup v2 at {}: {e}", dir.display())),
                }
            }
        }
        match Self::v1(&mounts, &own, limits) {
            Ok(cg) => Ok(cg),
            Err(e) => {
                reasons.push(format!("cgroup v1: {e}"));
                Err(Unavailable(reasons.join("; ")))
            }
        }
    }

    fn v2_at(dir: &Path, limits: RunLimits, own: bool) -> Result<Cgroups, String> {
        let controllers = read_small(&dir.join("cgroup.controllers")).map_err(|e| format!("not a cgroup v2 directory ({e})"))?;
        let have: Vec<&str> = controllers.split_whitespace().collect();
        for needed in ["memory", "pids"] {
            if !have.contains(&needed) {
                return Err(format!("the {needed} controller is not available here (cgroup.controllers: {:?})", controllers.trim()));
            }
        }
        let wanted: Vec<&str> = ["memory", "pids", "cpu"].into_iter().filter(|c| have.contains(c)).collect();
        let enable = wanted.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
        let enabled = |d: &Path| -> bool {
            read_small(&d.join("cgroup.subtree_control"))
                .map(|t| wanted.iter().all(|c| t.split_whitespace().any(|x| x == *c)))
                .unwrap_or(false)
        };
        if !enabled(dir) {
            // Controllers can be enabled for children only where no
            // process lives: move ourselves into a leaf first.
            let procs = read_small(&dir.join("cgroup.procs")).map_err(|e| format!("cannot read cgroup.procs: {e}"))?;
            if own && !procs.trim().is_empty() {
                let leaf = dir.join("supervisor");
                match fs::create_dir(&leaf) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("cannot create {} (the server's own leaf): {e}", leaf.display())),
                }
                write_file(&leaf.join("cgroup.procs"), "0").map_err(|e| format!("cannot move the server into its own leaf: {e}"))?;
            }
            write_file(&dir.join("cgroup.subtree_control"), &enable).map_err(|e| {
                format!("cannot enable {enable} for child cgroups ({e}); other processes in this cgroup block it: give the server a delegated cgroup of its own")
            })?;
        }
        let runs = dir.join(format!("skill-operator-runs.{}", std::process::id()));
        match fs::create_dir(&runs) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", runs.display())),
        }
        if !enabled(&runs) {
            write_file(&runs.join("cgroup.subtree_control"), &enable).map_err(|e| e.to_string())?;
        }
        sweep_stale(dir, "skill-operator-runs.");
        let cg = Cgroups { layout: Layout::V2 { runs }, limits, migrations: Migrations::Default };
        cg.probe()?;
        Ok(cg)
    }

    fn v1(mounts: &[CgroupMount], own: &[(String, Vec<String>, String)], limits: RunLimits) -> Result<Cgroups, String> {
        let place = |controller: &str| -> Result<PathBuf, String> {
            let mount = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
                .ok_or_else(|| format!("no {controller} hierarchy is mounted"))?;
            let (_, _, path) = own
                .iter()
                .find(|(_, cs, _)| cs.iter().any(|c| c == controller))
                .ok_or_else(|| format!("/proc/self/cgroup names no {controller} cgroup"))?;
            let base = under_mount(mount, path).ok_or_else(|| format!("the {controller} cgroup {path} is outside its mount"))?;
            sweep_stale(&base, "skill-operator.");
            let ours = base.join(format!("skill-operator.{}", std::process::id()));
            match fs::create_dir(&ours) {
                Ok(()) => Ok(ours),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(ours),
                Err(e) => Err(format!("cannot create {}: {e}", ours.display())),
            }
        };
        let memory = place("memory")?;
        let pids = place("pids")?;
        let cpu = place("cpu").ok();
        let cg = Cgroups { layout: Layout::V1 { memory, pids, cpu }, limits, migrations: Migrations::Default };
        cg.probe()?;
        Ok(cg)
    }

    /// Make, limit and remove one cgroup now, so a host that lets us
    /// create directories but not set limits is found at start-up.
    fn probe(&self) -> Result<(), String> {
        // A name of its own: several executors of one process probe at once,
        // and a dead process whose PID this one reuses may have left a probe
        // in the directory this one adopts.
        let name = format!("probe-{}", uuid::Uuid::new_v4().simple());
        let run = self.create(&name).map_err(|e| format!("a test cgroup could not be set up: {e}"))?;
        run.remove();
        Ok(())
    }

    /// `v2` or `v1`, where, and what joining costs, for `skill_list`.
    pub fn describe(&self) -> String {
        let joins = match &self.migrations {
            Migrations::Favored(_) => "; runs join without an RCU grace period (favordynmods)".to_string(),
            Migrations::Default => "; each run waits for an RCU grace period as it joins (favordynmods not asked for)".to_string(),
            Migrations::Refused(why) => format!("; each run waits for an RCU grace period as it joins: {why}"),
        };
        let place = match &self.layout {
            Layout::V2 { runs } => format!("a cgroup v2 per run under {}", runs.display()),
            Layout::V1 { memory, pids, cpu } => format!(
                "a cgroup v1 per run under {} and {}{}",
                memory.display(),
                pids.display(),
                cpu.as_ref().map(|c| format!(" and {}", c.display())).unwrap_or_default()
            ),
        };
        place + &joins
    }

    /// Whether runs join without waiting for a grace period.
    pub fn migrations_favored(&self) -> bool {
        matches!(self.migrations, Migrations::Favored(_))
    }

    pub fn limits(&self) -> RunLimits {
        self.limits
    }

    /// A new cgroup for one run, with its limits set and its
    /// `cgroup.procs` files open for the child to join.
    pub fn create(&self, name: &str) -> io::Result<RunCgroup> {
        let l = self.limits;
        let quota = l.cpus.saturating_mul(RUN_CPU_PERIOD_US);
        let mut run = RunCgroup { v2: false, dirs: Vec::new(), procs: Vec::new(), memory: None, pids: None };
        let result = (|| -> io::Result<()> {
            match &self.layout {
                Layout::V2 { runs } => {
                    run.v2 = true;
                    let dir = make_dir(&runs.join(name))?;
                    run.dirs.push(dir.clone());
                    write_file(&dir.join("memory.max"), &l.memory_bytes.to_string())?;
                    // Swap would let a run hold more than memory.max.
                    if dir.join("memory.swap.max").exists() {
                        write_file(&dir.join("memory.swap.max"), "0")?;
                    }
                    write_file(&dir.join("pids.max"), &l.pids.to_string())?;
                    if dir.join("cpu.max").exists() {
                        write_file(&dir.join("cpu.max"), &format!("{quota} {RUN_CPU_PERIOD_US}"))?;
                    }
                    run.memory = Some(dir.clone());
                    run.pids = Some(dir.clone());
                    run.procs.push(open_procs(&dir)?);
                }
                Layout::V1 { memory, pids, cpu } => {
                    let mem = make_dir(&memory.join(name))?;
                    run.dirs.push(mem.clone());
                    write_file(&mem.join("memory.limit_in_bytes"), &l.memory_bytes.to_string())?;
                    // memsw (memory + swap) must be set after the memory limit, and only exists with swap accounting.
                    if mem.join("memory.memsw.limit_in_bytes").exists() {
                        write_file(&mem.join("memory.memsw.limit_in_bytes"), &l.memory_bytes.to_string())?;
                    }
                    run.procs.push(open_procs(&mem)?);
                    run.memory = Some(mem);
                    let pid = make_dir(&pids.join(name))?;
                    run.dirs.push(pid.clone());
                    write_file(&pid.join("pids.max"), &l.pids.to_string())?;
                    run.procs.push(open_procs(&pid)?);
                    run.pids = Some(pid);
                    if let Some(cpu) = cpu {
                        let c = make_dir(&cpu.join(name))?;
                        run.dirs.push(c.clone());
                        write_file(&c.join("cpu.cfs_period_us"), &RUN_CPU_PERIOD_US.to_string())?;
                        write_file(&c.join("cpu.cfs_quota_us"), &quota.to_string())?;
                        run.procs.push(open_procs(&c)?);
                    }
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(run),
            Err(e) => {
                run.remove();
                Err(e)
            }
        }
    }
}

/// The name of the server's own v1 hierarchy that carries `favordynmods`
/// (no controllers; one per server, so its options are always its own).
const FAVOR_HIERARCHY: &str = "skill-operator-favordynmods";

/// A detached mount of a cgroup hierarchy with `favordynmods`: the option
/// is on while the descriptor is held (and on Linux 6.18 or later, until
/// reboot). v2 sets it on the one unified hierarchy; v1 makes a named
/// hierarchy of the server's own, so an existing hierarchy's options are
/// never touched.
fn favor_migrations(v2: bool) -> io::Result<OwnedFd> {
    use rustix::mount::{
        fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags, MountAttrFlags,
    };
    use std::os::fd::AsFd;
    let fs = fsopen(if v2 { "cgroup2" } else { "cgroup" }, FsOpenFlags::FSOPEN_CLOEXEC)?;
    if !v2 {
        fsconfig_set_flag(fs.as_fd(), "none")?;
        fsconfig_set_string(fs.as_fd(), "name", format!("{FAVOR_HIERARCHY}.{}", std::process::id()))?;
    }
    fsconfig_set_flag(fs.as_fd(), "favordynmods")?;
    fsconfig_create(fs.as_fd())?;
    Ok(fsmount(fs.as_fd(), FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())?)
}

fn make_dir(dir: &Path) -> io::Result<PathBuf> {
    fs::create_dir(dir).map_err(|e| io::Error::new(e.kind(), format!("create {}: {e}", dir.display())))?;
    Ok(dir.to_path_buf())
}

fn open_procs(dir: &Path) -> io::Result<Arc<OwnedFd>> {
    let path = dir.join("cgroup.procs");
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
    Ok(Arc::new(file.into()))
}

/// Remove the empty run directories of servers that are gone
/// (`<prefix><pid>` whose pid no longer exists).
fn sweep_stale(base: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(prefix).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(children) = fs::read_dir(entry.path()) {
            for child in children.flatten() {
                if child.path().is_dir() {
                    let _ = fs::remove_dir(child.path());
                }
            }
        }
        let _ = fs::remove_dir(entry.path());
    }
}

/// What a run's cgroup counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Processes the kernel killed because the run passed its memory limit.
    pub oom_kills: u64,
    /// Forks and clones refused because the run was at its process limit.
    pub pids_refused: u64,
}

/// The server's run cgroups with the next run's made ahead of it.
///
/// Making a run's cgroup is a directory per hierarchy and a write per
/// limit: a few hundred microseconds of a `skill_run` that is waited on.
/// One cgroup is made off the caller's path (at start-up, and after each
/// run as its own is removed) and handed to the next run. A spare is as
/// good as a fresh one: the server made it with the same limits, nothing
/// has joined it (its `cgroup.procs` are the server's), and its counters
/// are zero. A run that finds none (several at once) makes its own.
#[derive(Debug)]
pub struct RunCgroups {
    cgroups: Cgroups,
    spare: std::sync::Mutex<Option<RunCgroup>>,
}

impl RunCgroups {
    pub fn new(cgroups: Cgroups) -> RunCgroups {
        RunCgroups { cgroups, spare: std::sync::Mutex::new(None) }
    }

    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    /// The cgroup made ahead, if there is one (takes no filesystem call).
    pub fn take_spare(&self) -> Option<RunCgroup> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Make the next run's cgroup if none is waiting (blocking: creates
    /// directories). A failure is only logged: the next run makes its own
    /// and reports why if it cannot.
    pub fn refill(&self) {
        if self.spare.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return;
        }
        match self.cgroups.create(&format!("run-{}", uuid::Uuid::new_v4().simple())) {
            Ok(made) => {
                let mut slot = self.spare.lock().unwrap_or_else(|p| p.into_inner());
                // Another refill may have filled the slot meanwhile.
                if slot.is_none() {
                    *slot = Some(made);
                } else {
                    drop(slot);
                    made.remove();
                }
            }
            Err(e) => tracing::debug!(error = %e, "the next run's cgroup could not be made ahead; it will be made for it"),
        }
    }
}

impl RunCgroups {
    /// A run's cgroup after its run (blocking, off the caller's path):
    /// removed, and the next run's made. One still shared elsewhere is only
    /// emptied; the next start's sweep removes it.
    pub fn retire(&self, run: Arc<RunCgroup>) {
        match Arc::try_unwrap(run) {
            Ok(run) => run.remove(),
            Err(run) => {
                run.kill_all();
            }
        }
        self.refill();
    }
}

impl Drop for RunCgroups {
    fn drop(&mut self) {
        if let Some(spare) = self.take_spare() {
            spare.remove();
        }
    }
}

/// One run's cgroup (a directory per v1 hierarchy, or one v2 directory).
#[derive(Debug)]
pub struct RunCgroup {
    v2: bool,
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each directory, open for writing (close-on-exec).
    procs: Vec<Arc<OwnedFd>>,
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
}

impl RunCgroup {
    /// The descriptors the child writes `0` into to join (see the module docs).
    pub fn join_fds(&self) -> Vec<Arc<OwnedFd>> {
        self.procs.clone()
    }

    /// The counters as they are now.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        if let Some(mem) = &self.memory {
            let (file, key) = if self.v2 { ("memory.events", "oom_kill") } else { ("memory.oom_control", "oom_kill") };
            c.oom_kills = read_small(&mem.join(file)).ok().and_then(|t| keyed(&t, key)).unwrap_or(0);
        }
        if let Some(pids) = &self.pids {
            c.pids_refused = read_small(&pids.join("pids.events")).ok().and_then(|t| keyed(&t, "max")).unwrap_or(0);
        }
        c
    }

    /// Processes in the run's cgroup now.
    pub fn members(&self) -> Vec<libc::pid_t> {
        let mut out = Vec::new();
        for dir in &self.dirs {
            if let Ok(text) = read_small(&dir.join("cgroup.procs")) {
                out.extend(text.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// SIGKILL every process of the run, wherever it went (another
    /// process group, another session). Returns how many were signalled.
    pub fn kill_all(&self) -> usize {
        if self.v2 {
            if let Some(dir) = self.dirs.first() {
                if write_file(&dir.join("cgroup.kill"), "1").is_ok() {
                    return self.members().len();
                }
            }
        }
        // v1 (or v2 before cgroup.kill): signal every member; a fork
        // racing this lands in the same cgroup and is caught by the
        // caller's next call.
        let members = self.members();
        for pid in &members {
            // SAFETY: plain syscall; the pid was a member of the run's cgroup.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        members.len()
    }

    /// SIGKILL every process of the run and wait (up to `within`) until
    /// none is left: `true` once the cgroup is empty. Every process of a
    /// run is born in its cgroup (the child joins it before it drops to the
    /// run's uid) and cannot leave it (the cgroup files are root's), so an
    /// empty cgroup means nothing of the run is alive: the same guarantee
    /// as sweeping the run's uid, for a read of `cgroup.procs` instead of
    /// a fork of the server.
    pub fn kill_and_wait_empty(&self, within: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + within;
        loop {
            if self.members().is_empty() {
                return true;
            }
            self.kill_all();
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Kill what is left and remove the directories. A directory that
    /// still has processes (they take a moment to exit after SIGKILL) is
    /// retried briefly, then left for the next start's sweep.
    pub fn remove(self) {
        for attempt in 0..50 {
            self.kill_all();
            let mut left = false;
            for dir in self.dirs.iter().rev() {
                match fs::remove_dir(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(_) => left = true,
                }
            }
            if !left {
                return;
            }
            if attempt == 49 {
                tracing::warn!(dirs = ?self.dirs, "a run's cgroup could not be removed (processes still exiting); the next start removes it");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_and_self_cgroup() {
        let info = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n\
35 31 0:32 /kubepods/x /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
50 31 0:40 / /mnt/with\\040space rw - cgroup2 cgroup2 rw\n";
        let m = parse_mountinfo(info);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(m[2].controllers, vec!["xattr"]);
        assert!(m[3].v2 && m[3].mount_point == Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(m[4].mount_point, Path::new("/mnt/with space"));
        let own = parse_self_cgroup("4:memory:/kubepods/x/pod1\n2:cpu,cpuacct:/\n0::/user.slice/s.service\n");
        assert_eq!(own[0], ("4".into(), vec!["memory".into()], "/kubepods/x/pod1".into()));
        assert_eq!(under_mount(&m[1], "/kubepods/x/pod1"), Some(PathBuf::from("/sys/fs/cgroup/memory/pod1")));
        assert_eq!(under_mount(&m[1], "/elsewhere"), None);
        assert_eq!(under_mount(&m[0], "/"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(under_mount(&m[3], "/user.slice/s.service"), Some(PathBuf::from("/sys/fs/cgroup/unified/user.slice/s.service")));
    }

    /// A dead process whose PID this one reuses left its probe behind in
    /// the directory this one adopts (its sweep skips its own PID): the next
    /// start-up must still find cgroups usable. Gated on a machine where
    /// this process may make cgroups at all.
    #[test]
    fn a_probe_left_in_the_adopted_directory_does_not_block_start_up() {
        let Ok(first) = Cgroups::detect(None, RunLimits::default(), false) else {
            crate::gated::skip("cgroup probe leftovers", "this process may not create cgroups here (root and a writable hierarchy)");
            return;
        };
        let leftover = first.create("probe").expect("a leftover cgroup named as the old probe was");
        let again = Cgroups::detect(None, RunLimits::default(), false);
        leftover.remove();
        assert!(again.is_ok(), "{:?}", again.err().map(|e| e.0));
    }

    /// The cgroup made ahead is one cgroup, handed out once, limited as a
    /// fresh one is, empty and with zero counters; the slot holds at most
    /// one, and dropping the runner's cgroups removes a spare nobody took.
    /// Gated on a machine where this process may make cgroups at all.
    #[test]
    fn a_spare_is_handed_out_once_and_is_as_good_as_a_fresh_one() {
        let Ok(cgroups) = Cgroups::detect(None, RunLimits::default(), false) else {
            crate::gated::skip("cgroup spare", "this process may not create cgroups here (root and a writable hierarchy)");
            return;
        };
        let limits = cgroups.limits();
        let runs = RunCgroups::new(cgroups);
        assert!(runs.take_spare().is_none(), "nothing is made until asked");
        runs.refill();
        runs.refill();
        let spare = runs.take_spare().expect("a refill makes one");
        assert!(runs.take_spare().is_none(), "two refills in a row keep one, and it is handed out once");
        assert!(spare.members().is_empty());
        assert_eq!(spare.counters(), Counters::default());
        let mem = spare.memory.clone().unwrap();
        let limit = if spare.v2 { read_small(&mem.join("memory.max")) } else { read_small(&mem.join("memory.limit_in_bytes")) };
        assert_eq!(limit.unwrap().trim(), limits.memory_bytes.to_string());
        assert_eq!(read_small(&spare.pids.clone().unwrap().join("pids.max")).unwrap().trim(), limits.pids.to_string());
        spare.remove();

        runs.refill();
        let left: Vec<PathBuf> = runs.spare.lock().unwrap().as_ref().unwrap().dirs.clone();
        assert!(left.iter().all(|d| d.is_dir()));
        drop(runs);
        assert!(left.iter().all(|d| !d.exists()), "a spare nobody took is removed with the runner's cgroups: {left:?}");
    }

    #[test]
    fn counters_parse() {
        assert_eq!(keyed("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n", "oom_kill"), Some(2));
        assert_eq!(keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", "oom_kill"), Some(7));
        assert_eq!(keyed("max 12\n", "max"), Some(12));
        assert_eq!(keyed("max_x 12\n", "max"), None);
    }
}
