//! Packages pulled by digest into a bounded on-disk cache; a namespace's snapshot from its bindings.
//!
//! - [`cache`]: [`PackageCache`], SkillPackage content pulled by its pinned
//!   digest, verified, unpacked once per digest, leased to the snapshots
//!   serving it, evicted least recently used past its cap;
//! - [`policy`]: [`BindingPolicy`], what may run per skill (the binding's
//!   grant, the package's runtime profile), the same decision the
//!   controller makes when it admits a SkillJob;
//! - [`build`]: [`NamespaceCatalog::build`], the namespace's
//!   [`crate::mcp::snapshot::Snapshot`], and [`NamespaceCatalog::fingerprint`]
//!   of its inputs;
//! - [`served`]: [`ServedIndex`], the binding each built snapshot serves
//!   each skill from (what a run's SkillJob names);
//! - [`secrets`]: registry credentials from a package's pull secret.

pub mod build;
pub mod cache;
pub mod limits;
pub mod policy;
pub mod secrets;
pub mod served;

pub use build::{binding_verdict, package_location, Fingerprint, NamespaceCatalog, ServedNamespace, ServedSkill};
pub use cache::{CacheError, CacheOptions, CacheStats, PackageCache, PackageLease, Unpacked};
pub use policy::{BindingPolicy, BoundSkill};
pub use secrets::{KubeSecrets, PullSecrets, StaticSecrets};
pub use served::ServedIndex;
