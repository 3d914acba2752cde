//! Warm run pods: a pool per SkillBinding (`spec.warm`) of pods started
//! before their runs, each claimed by exactly one run and then gone.
//!
//! - [`shape`]: what a pool's pods depend on (the package digest, the run
//!   image and its delivery, the quantities), and its key. A run claims a
//!   pod only of its own shape's key, so a package or profile that changes
//!   changes the key, and the old pods are drained, never claimed.
//! - [`claim`]: a run takes one waiting pod by a patch the API server
//!   applies only at the resourceVersion the pod had when it was seen waiting,
//!   so two runs (two reconciles, two controllers) never get one pod. The
//!   patch relabels the pod as the run's and makes the SkillJob its owner;
//!   then the run is handed over through the artifact endpoint, where a
//!   claim is written once.
//! - [`pool`]: the leader keeps each pool at its size: `min` pods while the
//!   binding was used within its idle timeout, more (up to `max`) after
//!   runs found it empty, none after the timeout; within the namespace's
//!   budget; pods of another shape, ended ones and those of deleted
//!   bindings go.
//!
//! - [`secrets`]: a run granted variables has them read at its claim and
//!   sealed to the claimed pod's own key, where the namespace lets the
//!   controller read those Secrets; else it starts cold.
//!
//! What a waiting warm pod never has: a granted variable (a Secret's value
//! would be in the pod before any run asked for it) and a network beyond
//! the artifact endpoint. Both are bound at the claim, for the run that
//! claimed it; a run that cannot have them so starts cold, counted as a
//! miss with its reason.

pub mod claim;
pub mod memory;
pub mod pool;
pub mod secrets;
pub mod shape;

pub use memory::WarmPools;
pub use shape::PoolShape;
