//! `artifacts --sample-packages FILE`: the cluster-scoped SkillPackages of
//! the embedded samples, applied by the endpoint once it has seeded them into
//! its store.
//!
//! Why here and not as chart templates: the chart's CRDs are templates (so
//! upgrades update them), and Helm maps every manifest of a release before
//! it creates any, so a custom resource in the same release as its CRD fails
//! a first install ("no matches for kind SkillPackage"). The chart renders
//! the packages into a ConfigMap instead and the endpoint applies them
//! (server-side apply, its own field manager: an upgrade that changes a run
//! image updates the profile; the source, immutable, never changes). Helm
//! does not own them, so `helm uninstall` leaves them, like the CRDs.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kube::api::{Api, Patch, PatchParams};

use crate::api::package::SkillPackage;

/// The field manager of the applied samples.
pub const MANAGER: &str = "skill-operator-samples";
/// Tries before giving up (the CRDs of a first install may not be served yet).
const TRIES: u32 = 60;
const PAUSE: Duration = Duration::from_secs(5);

/// Reads the JSON list of SkillPackages the chart renders.
pub fn read(path: &Path) -> anyhow::Result<Vec<SkillPackage>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the sample packages {}", path.display()))?;
    let packages: Vec<SkillPackage> =
        serde_json::from_str(&text).with_context(|| format!("{} is not a JSON list of SkillPackages", path.display()))?;
    for p in &packages {
        anyhow::ensure!(p.metadata.name.as_deref().is_some_and(|n| !n.is_empty()), "a sample package in {} has no name", path.display());
    }
    Ok(packages)
}

/// Applies every package, retrying while the API server is not ready for them.
pub async fn apply(packages: Vec<SkillPackage>) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await.context("cannot reach the Kubernetes API to create the sample SkillPackages")?;
    let api: Api<SkillPackage> = Api::all(client);
    for p in packages {
        let name = p.metadata.name.clone().unwrap_or_default();
        let mut tries = 0;
        loop {
            tries += 1;
            match api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&p)).await {
                Ok(_) => {
                    tracing::info!(package = %name, "sample SkillPackage applied");
                    break;
                }
                Err(e) if tries < TRIES => {
                    tracing::debug!(package = %name, error = %e, "applying a sample SkillPackage failed; trying again");
                    tokio::time::sleep(PAUSE).await;
                }
                Err(e) => return Err(anyhow::anyhow!("cannot apply the sample SkillPackage {name}: {e}; check the CRDs are installed and the artifacts ServiceAccount may patch skillpackages")),
            }
        }
    }
    Ok(())
}
