//! Every bound the skill core enforces, in one place so the README, the tests
//! and the code quote the same numbers.
//!
//! The caps are limits on this server's own heap, not only on response size:
//! a skill package can be larger than the memory a hosted server may use, so
//! each read is bounded before bytes are allocated.

/// Bytes of `SKILL.md` read; anything past this is not read and the skill is
/// flagged `skill-md-truncated`.
pub const SKILL_MD_READ_CAP: u64 = 256 * 1024;
/// Bytes of the frontmatter block between the two `---` lines.
pub const FRONTMATTER_CAP: usize = 64 * 1024;
/// Files indexed per skill; the rest are reported (`file-limit`), not served.
pub const FILES_PER_SKILL: usize = 2_000;
/// Directories walked per skill; the rest are reported (`dir-limit`).
pub const DIRS_PER_SKILL: usize = 2_000;
/// Skills served across all roots. Real repositories hold 400-900 skills;
/// skill-mcp stops at 32.
pub const SKILLS_TOTAL: usize = 5_000;
/// Longest relative path (bytes) a read tool accepts.
pub const PATH_MAX_BYTES: usize = 1_024;
/// Deepest directory nesting walked inside one skill.
pub const MAX_DEPTH: usize = 32;

/// `skill_file`: paths per call.
pub const FILE_PATHS_PER_CALL: usize = 8;
/// `skill_file`: bytes returned per entry (the rest is cut and flagged).
pub const FILE_ENTRY_CAP: u64 = 1024 * 1024;
/// `skill_file`: bytes per call, checked from file sizes before reading.
pub const FILE_CALL_CAP: u64 = 4 * 1024 * 1024;
/// `resources/read`: largest file served whole (SEP-2640's per-skill limit).
pub const RESOURCE_READ_CAP: u64 = 16 * 1024 * 1024;

/// Agent Skills spec: name length.
pub const SPEC_NAME_MAX: usize = 64;
/// Agent Skills spec: description length.
pub const SPEC_DESCRIPTION_MAX: usize = 1_024;
/// Agent Skills spec: compatibility length.
pub const SPEC_COMPATIBILITY_MAX: usize = 500;

/// SEP-2640: files per skill in a `skills/list` manifest.
pub const EXTENSION_FILES_MAX: usize = 512;
/// SEP-2640: bytes per skill in a `skills/list` manifest.
pub const EXTENSION_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Script timeout when the declaration names none (seconds).
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// Hard ceiling on any script timeout (seconds).
pub const MAX_TIMEOUT_SECS: u64 = 300;
