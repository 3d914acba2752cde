//! Giving back the executable's pages that only start-up touched.
//!
//! One binary carries every subcommand (35 MB of code). The kernel maps a
//! file's pages 64 KiB at a time around each fault ("fault-around"), so a
//! controller that executed 7.1 MiB of that code at start-up had 19 MiB of
//! it mapped, and kept it mapped while idle: most of its resident set. Once a
//! long-running process is up, [`release_startup_code`] drops those
//! mappings; what it goes on running is mapped back by the next faults,
//! from the page cache, which keeps the pages until the kernel needs the
//! memory (the measurement: docs/benchmarks.md#code-only-start-up-ran).
//!
//! Only clean, read-only mappings of the executable file are released: for
//! a private file mapping `MADV_DONTNEED` throws away the process's own
//! copies of written pages, so a mapping that holds any (the relocated
//! RELRO segment, a debugger's breakpoints) is left alone.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("cannot read {0}: {1} (is /proc mounted?)")]
    Read(&'static str, std::io::Error),
    #[error("madvise(MADV_DONTNEED) on {start:#x}..{end:#x} failed: {source}")]
    Advise { start: usize, end: usize, source: std::io::Error },
}

/// What [`release_startup_code`] gave back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Mappings released.
    pub mappings: usize,
    /// Their resident bytes just before.
    pub resident_bytes: u64,
}

/// A mapping of `/proc/self/smaps` as far as the rule needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    range: Range<usize>,
    writable: bool,
    device: (u32, u32),
    inode: u64,
    rss_kib: u64,
    anonymous_kib: u64,
}

/// The rule, on the text of `/proc/self/smaps`: the ranges of mappings of
/// the file `(device, inode)` that are not writable, hold no page of the
/// process's own (`Anonymous: 0 kB`) and have something resident.
fn releasable(smaps: &str, device: (u32, u32), inode: u64) -> Vec<(Range<usize>, u64)> {
    parse(smaps)
        .into_iter()
        .filter(|m| m.device == device && m.inode == inode && !m.writable && m.anonymous_kib == 0 && m.rss_kib > 0)
        .map(|m| (m.range, m.rss_kib * 1024))
        .collect()
}

fn parse(smaps: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        if let Some(mapping) = header(line) {
            out.push(mapping);
            continue;
        }
        let Some(last) = out.last_mut() else { continue };
        let field =
            |name: &str| line.strip_prefix(name).and_then(|v| v.trim().strip_suffix("kB")).and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(kib) = field("Rss:") {
            last.rss_kib = kib;
        } else if let Some(kib) = field("Anonymous:") {
            last.anonymous_kib = kib;
        }
    }
    out
}

/// `start-end perms offset major:minor inode [path]`; `None` for field lines.
/// A header whose `Anonymous:` line never comes counts as holding pages of
/// its own, so a format this does not know releases nothing.
fn header(line: &str) -> Option<Mapping> {
    let mut parts = line.split_ascii_whitespace();
    let (start, end) = parts.next()?.split_once('-')?;
    let range = usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?;
    let perms = parts.next()?;
    if perms.len() != 4 {
        return None;
    }
    let _offset = parts.next()?;
    let (major, minor) = parts.next()?.split_once(':')?;
    let device = (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    let inode = parts.next()?.parse().ok()?;
    Some(Mapping { range, writable: perms.as_bytes()[1] == b'w', device, inode, rss_kib: 0, anonymous_kib: u64::MAX })
}

/// Drops this process's mappings of its executable's clean, read-only
/// pages. Call it once a long-running process has started: what it runs
/// afterwards comes back at the next faults.
pub fn release_startup_code() -> Result<Released, MemoryError> {
    let exe = std::fs::metadata("/proc/self/exe").map_err(|e| MemoryError::Read("/proc/self/exe", e))?;
    let device = (rustix::fs::major(exe.dev()), rustix::fs::minor(exe.dev()));
    let smaps = std::fs::read_to_string("/proc/self/smaps").map_err(|e| MemoryError::Read("/proc/self/smaps", e))?;
    let mut released = Released::default();
    for (range, resident) in releasable(&smaps, device, exe.ino()) {
        // SAFETY: the range is a whole mapping of the executable that is not
        // writable and holds no private page (checked just above from
        // smaps): discarding its page table entries loses nothing, and the
        // next access faults the same bytes back in from the file.
        unsafe { rustix::mm::madvise(range.start as *mut std::ffi::c_void, range.len(), rustix::mm::Advice::LinuxDontNeed) }
            .map_err(|e| MemoryError::Advise { start: range.start, end: range.end, source: e.into() })?;
        released.mappings += 1;
        released.resident_bytes += resident;
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55681b7f7000-55681c1cd000 r--p 00000000 fd:01 4242 /usr/bin/skill-operator
Size:              10072 kB
Rss:                3428 kB
Anonymous:             0 kB
55681c1cd000-55681e3f6000 r-xp 009d5000 fd:01 4242 /usr/bin/skill-operator
Size:              34980 kB
Rss:               18328 kB
Anonymous:             0 kB
55681e3f6000-55681e512000 r--p 02bfd000 fd:01 4242 /usr/bin/skill-operator
Size:               1136 kB
Rss:                1136 kB
Anonymous:          1100 kB
55681e512000-55681e54a000 rw-p 02d18000 fd:01 4242 /usr/bin/skill-operator
Size:                224 kB
Rss:                 224 kB
Anonymous:             0 kB
7f4f69962000-7f4f69ab8000 r-xp 00026000 fd:01 777 /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1368 kB
Rss:                1016 kB
Anonymous:             0 kB
7f4f69ab9000-7f4f69aba000 r--p 00000000 fd:01 4242 /usr/bin/skill-operator (deleted)
Size:                  4 kB
Rss:                   0 kB
Anonymous:             0 kB
";

    #[test]
    fn only_clean_read_only_mappings_of_the_executable_are_released() {
        let got = releasable(SMAPS, (0xfd, 1), 4242);
        assert_eq!(
            got,
            vec![(0x55681b7f7000..0x55681c1cd000, 3428 * 1024), (0x55681c1cd000..0x55681e3f6000, 18328 * 1024)],
            "the relocated RELRO mapping (private pages), the writable data, another file and nothing resident stay"
        );
    }

    #[test]
    fn the_same_inode_on_another_device_is_another_file() {
        assert!(releasable(SMAPS, (0xfd, 2), 4242).is_empty());
    }

    #[test]
    fn a_mapping_without_an_anonymous_line_is_never_released() {
        let smaps = "55681b7f7000-55681c1cd000 r-xp 00000000 fd:01 4242 /usr/bin/skill-operator\nRss: 3428 kB\n";
        assert!(releasable(smaps, (0xfd, 1), 4242).is_empty());
    }

    #[test]
    fn a_malformed_header_is_no_mapping() {
        for line in ["zz-10 r-xp 0 fd:01 1 /x", "10-20 r-x 0 fd:01 1 /x", "10-20 r-xp 0 fd01 1 /x", "10-20 r-xp 0 fd:01 x /x"] {
            assert_eq!(header(line), None, "{line}");
        }
    }
}
