//! The skill core: discovery, frontmatter, paths, declarations, grants and
//! file reading. No async and no Kubernetes in here: the standalone server,
//! the runners, the controller and the gateway all reuse it unchanged.
//!
//! Layout:
//! - [`limits`]: every bound, in one place.
//! - [`paths`]: the string check and the resolved check for client paths.
//! - [`yaml`], [`frontmatter`]: strict YAML and the `SKILL.md` split.
//! - [`spec`]: Agent Skills spec checks (reported, not refused).
//! - [`declaration`]: the `mcp-host:` block.
//! - [`discovery`], [`catalog`]: roots to served skills plus `problems`.
//! - [`grants`], [`policy`]: what may run.
//! - [`content`]: capped reads, encodings, digests.

pub mod catalog;
pub mod confirm;
pub mod content;
pub mod declaration;
pub mod discovery;
pub mod fence;
pub mod frontmatter;
pub mod grants;
pub mod jobs;
pub mod limits;
pub mod package;
pub mod paths;
pub mod policy;
pub mod problems;
pub mod spec;
pub mod token;
pub mod yaml;
