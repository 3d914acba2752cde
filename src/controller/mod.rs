//! The Kubernetes controller: SkillPackage, SkillBinding and SkillJob
//! reconcilers. Decisions live in [`decide`] (pure, unit-tested); the
//! reconcilers fetch, decide and apply.

pub mod api_client;
pub mod binding;
pub mod builders;
pub mod cilium;
pub mod context;
pub mod decide;
pub mod egress;
pub mod leader;
pub mod lean_list;
pub mod lookups;
pub mod metrics;
pub mod netpol_probe;
pub mod package;
pub mod prepare;
pub mod run;
pub mod skilljob;
pub mod source;
pub mod staged;
pub mod triggers;
pub mod warm;

#[cfg(test)]
mod mock_tests;
pub mod resolver;
