//! The Kubernetes controller: SkillPackage, SkillBinding and SkillJob
//! reconcilers. Decisions live in [`decide`] (pure, unit-tested); the
//! reconcilers fetch, decide and apply.

pub mod decide;
