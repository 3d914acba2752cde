//! The Kubernetes controller: SkillPackage, SkillBinding and SkillJob
//! reconcilers. Decisions live in [`decide`] (pure, unit-tested); the
//! reconcilers fetch, decide and apply.

pub mod decide;
pub mod context;
pub mod lookups;
pub mod metrics;
pub mod package;
pub mod builders;
pub mod binding;
pub mod skilljob;
pub mod run;

#[cfg(test)]
mod mock_tests;
pub mod resolver;
