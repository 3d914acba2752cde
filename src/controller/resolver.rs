//! The production [`PackageResolver`]: pull a package from its OCI
//! registry (this project's format or a ToolHive skill artifact), verifying
//! every digest, and hand back the pinned digest and the archive.

use futures::future::BoxFuture;

use super::context::{FetchedPackage, PackageResolver};
use crate::api::package::OciSource;
use crate::oci::{registry_of, Registry, RegistryOptions};

/// Pulls packages from registries.
pub struct OciResolver {
    /// Registries always reached over plain HTTP (in-cluster test registries).
    pub plain_http: Vec<String>,
}

impl PackageResolver for OciResolver {
    fn fetch<'a>(&'a self, source: &'a OciSource) -> BoxFuture<'a, Result<FetchedPackage, String>> {
        Box::pin(async move {
            let mut options = RegistryOptions { plain_http: self.plain_http.clone(), ..Default::default() };
            if source.insecure {
                options.plain_http.push(registry_of(&source.reference).map_err(|e| e.to_string())?);
            }
            let registry = Registry::new(options);
            let pulled = registry.pull(&source.reference).await.map_err(|e| format!("pulling {}: {e}", source.reference))?;
            Ok(FetchedPackage { digest: pulled.digest, archive: pulled.package })
        })
    }
}
