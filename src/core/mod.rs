//! The skill core: discovery, frontmatter, paths, declarations, grants, the
//! fence and file reading. Synchronous code with no network and no
//! Kubernetes (it reads skill directories and package archives, so it is
//! not free of the filesystem): the standalone server, the runners, the
//! controller and the gateway all reuse it unchanged.
//!
//! Layout:
//! - [`limits`]: every bound, in one place.
//! - [`paths`]: the string check and the resolved check for client paths.
//! - [`yaml`], [`frontmatter`]: strict YAML and the `SKILL.md` split.
//! - [`spec`]: Agent Skills spec checks (reported, not refused).
//! - [`declaration`], [`env`]: the `mcp-host:` block and reserved variable names.
//! - [`discovery`], [`catalog`]: roots to served skills plus `problems`.
//! - [`grants`], [`fence`], [`confirm`]: what may run, and the confirmation gate.
//! - [`content`]: capped reads, encodings, digests.
//! - [`package`]: the deterministic package archive (build, check, unpack).
//! - [`marketplace`]: Claude Code plugin marketplaces (`serve --layout recursive`).
//! - [`search`]: ranking skills for a query (`skill_search`).
//! - [`token`]: per-job HMAC credentials; [`owner`]: the gateway's seal on whose run a SkillJob is.

pub mod catalog;
pub mod confirm;
pub mod content;
pub mod declaration;
pub mod discovery;
pub mod env;
pub mod fence;
pub mod frontmatter;
pub mod grants;
pub mod limits;
pub mod marketplace;
pub mod owner;
pub mod package;
pub mod paths;
pub mod problems;
pub mod search;
pub mod spec;
pub mod token;
pub mod yaml;
