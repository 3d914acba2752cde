//! The skill catalog: skills in public git repositories, listed with what
//! an operator needs to choose one (name, description, author, license,
//! category, files, scripts, requirements) and the commit that pins it.
//!
//! - [`model`]: the versioned JSON document, loaded with checks, saved atomically.
//! - [`ids`]: entry ids (`<owner>/<repo>/<name>`) and Kubernetes names.
//! - [`build`]: `catalog build`, fetching trees and discovering skills as `serve --layout recursive` does.
//! - [`query`]: search (the ranker of [`crate::core::search`]) and look-up.
//! - [`install`]: the pinned SkillSource manifest of an entry.
//! - [`store`]: which catalog is in use (a refreshed one, else the embedded snapshot).
//! - [`cluster`]: the catalog kept in a ConfigMap, the one every gateway replica reads.
//! - [`live`]: the catalog a server answers from, swapped when the cluster's changes.
//! - [`refresh`]: replacing the stored catalog, only with one checked whole.
//! - [`command`]: the `catalog` subcommands.
//!
//! The format, caps and snapshot are described in docs/catalog.md.

pub mod build;
pub mod cluster;
pub mod command;
pub mod ids;
pub mod install;
pub mod live;
pub mod model;
pub mod query;
pub mod refresh;
pub mod store;

pub use command::{run, CatalogCommand};
