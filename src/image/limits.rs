//! Every cap and fixed value of the image composer, in one place.
//!
//! Caps bound what we read from registries and from disk; fixed values make
//! layers, configs and manifests byte-for-byte reproducible. Changing a
//! fixed value changes every digest this module produces.

use std::time::Duration;

/// A manifest or index body we GET (distribution's own limit is 4 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// A base image config blob. Real ones are a few KiB; long histories reach
/// a few hundred KiB.
pub const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;
/// Entries of a base index we look at (python:3.12-slim has 16, half of
/// them attestations).
pub const MAX_INDEX_ENTRIES: usize = 64;
/// Layers of one base image. overlayfs stacks at most ~128 lower dirs on
/// the usual page size; more than this is not a base we can run anyway.
pub const MAX_BASE_LAYERS: usize = 127;

/// Entries (files, dirs, symlinks) of one new layer. Paths and per-file
/// hashes of every entry stay in memory (sorting, SBOM), ~200 bytes each.
pub const MAX_LAYER_ENTRIES: usize = 500_000;
/// Uncompressed bytes of one new layer: far above any package or dependency
/// tree we expect; the layer itself is spooled to disk, never held in memory.
pub const MAX_LAYER_BYTES: u64 = 16 * 1024 * 1024 * 1024;
/// One path inside a layer (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Directory depth inside a layer.
pub const MAX_DEPTH: usize = 128;
/// One symlink target (Linux `PATH_MAX`).
pub const MAX_LINK_TARGET_BYTES: usize = 4096;

/// Read and write buffer of the layer writer and of uploads: big enough for
/// throughput, small enough that memory stays flat whatever the layer size.
pub const IO_CHUNK_BYTES: usize = 256 * 1024;
/// deflate level of new layers: the same level as skill packages.
pub const DEFLATE_LEVEL: u8 = 6;
/// Blob uploads, mounts and HEADs in flight at once.
pub const UPLOAD_CONCURRENCY: usize = 4;

/// `created` of the history entries we append (and of the config made on
/// an empty base): fixed, so that the same inputs give the same digest.
/// The Unix epoch, as `SOURCE_DATE_EPOCH=0` would give.
pub const FIXED_CREATED: &str = "1970-01-01T00:00:00Z";
/// The numeric non-root user composed images run as (distroless `nonroot`).
pub const DEFAULT_USER: &str = "65532:65532";
/// Its uid/gid, for `/etc/passwd` of the operator image.
pub const NONROOT_ID: u32 = 65532;

/// A login (the `/v2/` challenge and any token) is reused this long.
pub const LOGIN_REUSE: Duration = Duration::from_secs(20);
/// TCP connect timeout towards registries.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle read timeout towards registries (a stalled upload or download).
pub const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// ELF files we follow for the operator image (the binary and its
/// libraries, transitively).
pub const MAX_SHARED_LIBS: usize = 256;
/// `/etc/ld.so.cache`: a few hundred KiB on a full distribution.
pub const MAX_LD_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// `requirements.txt` of a package.
pub const MAX_REQUIREMENTS_BYTES: u64 = 1024 * 1024;
/// `package-lock.json` of a package.
pub const MAX_LOCKFILE_BYTES: u64 = 64 * 1024 * 1024;
/// One `METADATA` or `package.json` read for the dependency list.
pub const MAX_METADATA_BYTES: u64 = 4 * 1024 * 1024;
/// Installed packages we list (pip + npm).
pub const MAX_DEPENDENCIES: usize = 20_000;
/// The tail of pip's or npm's output kept for an error message.
pub const TOOL_OUTPUT_TAIL_BYTES: usize = 16 * 1024;
/// pip or npm may run this long before the step is abandoned.
pub const DEPS_TIMEOUT: Duration = Duration::from_secs(30 * 60);
