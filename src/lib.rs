//! skill-operator: serves Agent Skills over MCP and runs the scripts they
//! declare inside a fence.
//!
//! Layout:
//! - [`core`]: the pure skill core (discovery, frontmatter, paths, grants).
//! - [`mcp`]: the MCP surface (tools, prompts, resources, SEP-2640 skills).
//! - [`serve`]: the standalone server's transports (stdio, streamable HTTP).
//! - [`cli`]: the `skill-operator` command line.
//! - [`catalog`]: the skill catalog (build, search, install pinned SkillSources).
//! - [`image`]: OCI run images and the operator image, composed with registry calls only.

pub mod api;
pub mod audit;
pub(crate) mod auth_cache;
pub mod catalog;
pub mod cli;
pub mod controller;
pub mod core;
pub mod docs;
pub mod download;
pub mod egress;
pub mod gated;
pub mod gateway;
pub mod mcp;
pub mod memory;
pub mod metrics_access;
pub mod samples;
pub mod serve;
pub mod shutdown;
pub mod source;
pub mod telemetry;
pub mod tls;

pub mod runner;

pub mod oci;

pub mod artifacts;
pub mod image;
pub mod jobs;
pub mod listener;
