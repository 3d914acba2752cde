//! The package cache's bounds (the gateway's own; file and package caps are
//! the shared ones in [`crate::core::limits`]).

use crate::core::limits::MIB;

/// Unpacked bytes the package cache keeps on disk by default: sixteen
/// packages at the 128 MiB package cap, or a few hundred ordinary ones.
pub const DEFAULT_CACHE_BYTES: u64 = 2048 * MIB;

/// Packages pulled at once while one namespace's snapshot is built (the
/// rest wait their turn; a digest already pulling is shared, not repeated).
pub const PULLS_PER_BUILD: usize = 8;
