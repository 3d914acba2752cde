//! OCI run images (and the operator's own image) composed with registry
//! API calls only: no Docker daemon, no kaniko, no privileged builder.
//! Base layers are never downloaded; new layers are written
//! deterministically, spooled to disk and streamed up, so memory stays
//! flat whatever their size.
//!
//! # Layout (one job per module)
//! - [`layer`]: deterministic gzip'd tar layers from a directory, a package
//!   archive or a list of entries; digest and diff_id computed while
//!   writing. [`gzip`]: the streaming deterministic gzip it uses.
//! - [`base`]: base reference → manifest or index → per-platform manifest
//!   and config (bounded, digest-checked GETs).
//! - [`compose`]: config patch, manifests, index, uploads (HEAD, mount,
//!   streamed copy or upload), the [`Composed`] result.
//! - [`remote`]: the registry calls, on `oci-client`, and the
//!   [`UploadReport`] counters.
//! - [`sbom`]: the CycloneDX SBOM and its OCI 1.1 referrer.
//! - [`deps`]: the dependency step of the build Job (pip wheels only,
//!   `npm ci --ignore-scripts`), no package code run.
//! - [`self_image`]: the operator image on an empty base (ELF → the
//!   libraries it links). [`archive`]: an image written to one tar file
//!   (OCI layout + Docker `manifest.json`) instead of pushed.
//! - [`verify`]: download and check every blob of an image.
//! - [`cli`]: `skill-operator image self|compose|verify` (and hidden `deps`).
//! - [`limits`]: every cap and fixed value; [`error`]: [`ImageError`];
//!   [`json`]: canonical JSON for everything we hash.
//!
//! # For the controller
//! ```text
//! plan(package_dir)                 -> DepsPlan   (needs a build Job? lock digest)
//! deps::install(&DepsOptions)       -> DepsReport (inside the build Job)
//! layer::from_package_archive(r, "skill", …) / layer::from_dir(out, "deps", …) -> Layer
//! compose(&Remote, &ComposeSpec)    -> Composed   (reference = repo@sha256:…)
//! verify(&Remote, reference)        -> VerifyReport
//! ```

pub mod archive;
pub mod base;
pub mod cli;
pub mod compose;
pub mod deps;
pub mod error;
pub mod gzip;
pub mod json;
pub mod layer;
pub mod limits;
pub mod remote;
pub mod sbom;
pub mod self_image;
pub mod verify;

pub use base::{BaseSpec, Platform};
pub use cli::{run, ImageCommand};
pub use compose::{compose, ComposeSpec, Composed, ConfigPatch, SbomInput};
pub use deps::{plan, DepsOptions, DepsPlan, DepsReport};
pub use error::ImageError;
pub use layer::{Layer, LayerOptions, LayerTree};
pub use remote::{Remote, UploadReport};
pub use self_image::{archive_self, push_self, SelfImageOptions};
pub use verify::{verify, VerifyReport};
