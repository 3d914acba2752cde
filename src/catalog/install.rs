//! `catalog install`: the SkillSource that serves one catalog entry,
//! pinned to the commit the catalog read.
//!
//! Written as a YAML value, not through the SkillSource Rust type: the
//! manifest is the documented interface, and this keeps the catalog free
//! of the controller's types. The update policy is `Manual` because the
//! point of a pin is that nothing moves until someone moves it.

use serde_norway::{Mapping, Value};

use super::ids::resource_name;
use super::model::Entry;

pub const API_VERSION: &str = "skill-operator.dev/v1alpha1";
pub const KIND: &str = "SkillSource";

/// The SkillSource manifest of `entry`: its repository, pinned to its
/// commit, at its folder (no `path` for a repository that is one skill).
pub fn manifest(entry: &Entry) -> Value {
    let mut git = Mapping::new();
    git.insert("url".into(), entry.repository.as_str().into());
    git.insert("ref".into(), entry.commit.as_str().into());
    if !entry.path.is_empty() {
        git.insert("path".into(), entry.path.as_str().into());
    }
    let mut spec = Mapping::new();
    spec.insert("git".into(), Value::Mapping(git));
    spec.insert("updatePolicy".into(), "Manual".into());
    let mut metadata = Mapping::new();
    metadata.insert("name".into(), resource_name(&entry.id).into());
    let mut doc = Mapping::new();
    doc.insert("apiVersion".into(), API_VERSION.into());
    doc.insert("kind".into(), KIND.into());
    doc.insert("metadata".into(), Value::Mapping(metadata));
    doc.insert("spec".into(), Value::Mapping(spec));
    Value::Mapping(doc)
}

/// [`manifest`] as YAML text.
pub fn manifest_yaml(entry: &Entry) -> String {
    // A mapping of strings always serializes.
    serde_norway::to_string(&manifest(entry)).expect("a mapping of strings is YAML")
}
