//! The catalog kept in the cluster: one ConfigMap in the operator's
//! namespace, so every gateway replica (and every `catalog … --cluster`
//! command) reads the same one.
//!
//! The catalog is stored as gzip of its compact JSON under one
//! `binaryData` key. The API server refuses objects past 1 MiB, so a
//! catalog whose gzip is over [`MAX_CONFIGMAP_GZIP_BYTES`] is refused here,
//! before anything is written, with what to do instead. A replace is one
//! write: an update carrying the `resourceVersion` that was read (409 if
//! another writer came in between), or a create when there is none; a
//! reader sees the old catalog or the new one, never half of one.
//!
//! This store is async (it talks to the API server), unlike the
//! [`CatalogStore`](super::store::CatalogStore) of local files; the refresh
//! command uses [`super::refresh::fetch`] and then [`ClusterStore::replace`].
//! The encoding ([`encode`], [`decode`], [`config_map`]) is pure and tested
//! without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};

use super::model::{Catalog, CatalogError};
use crate::core::limits::{bytes_text, KIB};

/// The ConfigMap holding the active catalog, in the operator's namespace.
pub const CONFIGMAP_NAME: &str = "skill-operator-catalog";
/// The `binaryData` key of the catalog's gzip.
pub const CONFIGMAP_KEY: &str = "catalog.json.gz";
/// The largest gzip stored: the API server refuses a ConfigMap past 1 MiB
/// (its whole object, base64 of binaryData included in etcd's limit on
/// some setups), so this leaves room for metadata and encoding. The
/// embedded snapshot of 3,105 entries is about a third of it.
pub const MAX_CONFIGMAP_GZIP_BYTES: usize = 900 * KIB as usize;
/// The annotations saying what a stored catalog is, for `kubectl get -o yaml`.
pub const BUILT_ANNOTATION: &str = "skill-operator.dev/catalog-built";
pub const ENTRIES_ANNOTATION: &str = "skill-operator.dev/catalog-entries";

#[derive(Debug, thiserror::Error)]
pub enum ClusterStoreError {
    #[error(
        "the catalog is {} as gzip; a ConfigMap holds at most {} of it (the API server refuses objects over 1 MiB): \
         build a catalog of fewer repositories, or keep this one in a file (`--catalog FILE`)",
        bytes_text(*gzip_bytes as u64),
        bytes_text(MAX_CONFIGMAP_GZIP_BYTES as u64)
    )]
    TooLarge { gzip_bytes: usize },
    #[error("ConfigMap {at} has no binaryData key {CONFIGMAP_KEY:?}; write it with `skill-operator catalog refresh --from URL --cluster`")]
    MissingKey { at: String },
    #[error(
        "ConfigMap {at} does not hold a usable catalog: {cause}; refresh it with `skill-operator catalog refresh --from URL --cluster`"
    )]
    Invalid { at: String, cause: CatalogError },
    #[error("ConfigMap {at} changed while it was being replaced (another refresh at the same time?); run the refresh again")]
    Conflict { at: String },
    #[error("cannot {verb} ConfigMap {at}: {cause}; check KUBECONFIG (or the in-cluster config) and that you may {verb} configmaps in that namespace")]
    Api { verb: &'static str, at: String, cause: Box<kube::Error> },
    #[error("cannot reach the Kubernetes API server: {0}; set KUBECONFIG or run in a cluster")]
    Connect(Box<kube::Error>),
}

/// `namespace/name` of the catalog's ConfigMap, for messages.
pub fn describe(namespace: &str) -> String {
    format!("{namespace}/{CONFIGMAP_NAME}")
}

/// Refuse a gzip the ConfigMap cannot hold; the one place the cap is checked.
pub fn check_size(gzip_bytes: usize) -> Result<(), ClusterStoreError> {
    if gzip_bytes > MAX_CONFIGMAP_GZIP_BYTES {
        return Err(ClusterStoreError::TooLarge { gzip_bytes });
    }
    Ok(())
}

/// The catalog as stored: gzip of its JSON, within the cap.
pub fn encode(catalog: &Catalog) -> Result<Vec<u8>, ClusterStoreError> {
    let gzip = catalog.to_bytes(true);
    check_size(gzip.len())?;
    Ok(gzip)
}

/// The ConfigMap holding `gzip` (from [`encode`]); `resource_version` makes
/// it an update of exactly the object read.
pub fn config_map(namespace: &str, catalog: &Catalog, gzip: Vec<u8>, resource_version: Option<String>) -> ConfigMap {
    let labels = BTreeMap::from([("app.kubernetes.io/part-of".to_string(), "skill-operator".to_string())]);
    let annotations = BTreeMap::from([
        (BUILT_ANNOTATION.to_string(), catalog.built.clone()),
        (ENTRIES_ANNOTATION.to_string(), catalog.entries.len().to_string()),
    ]);
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIGMAP_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            annotations: Some(annotations),
            resource_version,
            ..ObjectMeta::default()
        },
        binary_data: Some(BTreeMap::from([(CONFIGMAP_KEY.to_string(), ByteString(gzip))])),
        ..ConfigMap::default()
    }
}

/// The catalog a ConfigMap holds, checked whole like any other catalog.
pub fn decode(cm: &ConfigMap) -> Result<Catalog, ClusterStoreError> {
    let at = describe(cm.metadata.namespace.as_deref().unwrap_or_default());
    let bytes =
        cm.binary_data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)).ok_or_else(|| ClusterStoreError::MissingKey { at: at.clone() })?;
    // A hand-edited ConfigMap past the cap is refused like a written one
    // would have been, before it is inflated.
    check_size(bytes.0.len())?;
    Catalog::from_bytes(&bytes.0).map_err(|cause| ClusterStoreError::Invalid { at, cause })
}

/// The catalog's ConfigMap in one namespace.
#[derive(Clone)]
pub struct ClusterStore {
    api: Api<ConfigMap>,
    namespace: String,
}

impl ClusterStore {
    pub fn new(client: kube::Client, namespace: &str) -> ClusterStore {
        ClusterStore { api: Api::namespaced(client, namespace), namespace: namespace.into() }
    }

    /// The store in `namespace`, through KUBECONFIG or the in-cluster config.
    pub async fn connect(namespace: &str) -> Result<ClusterStore, ClusterStoreError> {
        let client = kube::Client::try_default().await.map_err(|e| ClusterStoreError::Connect(Box::new(e)))?;
        Ok(ClusterStore::new(client, namespace))
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `ConfigMap namespace/name`, for messages.
    pub fn describe(&self) -> String {
        format!("ConfigMap {}", describe(&self.namespace))
    }

    fn api_error(&self, verb: &'static str, cause: kube::Error) -> ClusterStoreError {
        ClusterStoreError::Api { verb, at: describe(&self.namespace), cause: Box::new(cause) }
    }

    /// The ConfigMap as it is, `None` when there is none.
    async fn get(&self) -> Result<Option<ConfigMap>, ClusterStoreError> {
        self.api.get_opt(CONFIGMAP_NAME).await.map_err(|e| self.api_error("get", e))
    }

    /// The stored catalog, checked; `None` when none was stored.
    pub async fn load(&self) -> Result<Option<Catalog>, ClusterStoreError> {
        match self.get().await? {
            Some(cm) => decode(&cm).map(Some),
            None => Ok(None),
        }
    }

    /// Store a checked catalog in place of the current one, in one write;
    /// over the cap, nothing is written.
    pub async fn replace(&self, catalog: &Catalog) -> Result<(), ClusterStoreError> {
        let gzip = encode(catalog)?;
        let conflict = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409);
        let params = PostParams { field_manager: Some("skill-operator-catalog".into()), ..PostParams::default() };
        match self.get().await? {
            Some(current) => {
                let cm = config_map(&self.namespace, catalog, gzip, current.metadata.resource_version);
                match self.api.replace(CONFIGMAP_NAME, &params, &cm).await {
                    Ok(_) => Ok(()),
                    Err(e) if conflict(&e) => Err(ClusterStoreError::Conflict { at: describe(&self.namespace) }),
                    Err(e) => Err(self.api_error("update", e)),
                }
            }
            None => match self.api.create(&params, &config_map(&self.namespace, catalog, gzip, None)).await {
                Ok(_) => Ok(()),
                Err(e) if conflict(&e) => Err(ClusterStoreError::Conflict { at: describe(&self.namespace) }),
                Err(e) => Err(self.api_error("create", e)),
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::catalog::model::{Entry, Files, Repository};

    pub(crate) const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A consistent catalog of `names` in one repository, each with `description`.
    pub(crate) fn catalog(names: &[&str], description: impl Fn(usize) -> String) -> Catalog {
        let url = "https://github.com/acme/skills";
        let entries = names
            .iter()
            .enumerate()
            .map(|(i, name)| Entry {
                id: format!("acme/skills/{name}"),
                repository: url.into(),
                path: format!("skills/{name}"),
                commit: COMMIT.into(),
                name: (*name).into(),
                description: description(i),
                author: Some("Acme".into()),
                license: None,
                category: Some("office".into()),
                files: Files { count: 1, bytes: 10 },
                scripts: Vec::new(),
                requirements: Vec::new(),
            })
            .collect();
        Catalog::new(vec![Repository { url: url.into(), commit: COMMIT.into(), skills: names.len() }], entries)
    }

    #[test]
    fn a_catalog_round_trips_through_its_config_map() {
        let c = catalog(&["pdf", "xlsx"], |_| "Edit documents.".into());
        let cm = config_map("ops", &c, encode(&c).unwrap(), Some("42".into()));
        assert_eq!(cm.metadata.name.as_deref(), Some(CONFIGMAP_NAME));
        assert_eq!(cm.metadata.resource_version.as_deref(), Some("42"), "an update of exactly what was read");
        assert!(cm.data.is_none(), "binary only: one key, gzip");
        assert_eq!(cm.metadata.annotations.as_ref().unwrap()[ENTRIES_ANNOTATION], "2");
        assert_eq!(decode(&cm).unwrap(), c);
    }

    #[test]
    fn the_size_cap_holds_at_its_edge() {
        assert!(check_size(MAX_CONFIGMAP_GZIP_BYTES).is_ok());
        let over = check_size(MAX_CONFIGMAP_GZIP_BYTES + 1).unwrap_err();
        assert!(matches!(over, ClusterStoreError::TooLarge { gzip_bytes } if gzip_bytes == MAX_CONFIGMAP_GZIP_BYTES + 1));
        assert!(over.to_string().contains("--catalog FILE"), "{over}");
        // Descriptions gzip cannot shrink: a real catalog over the cap is
        // refused by encode, before any write could happen.
        let noise = |i: usize| {
            use sha2::Digest;
            (0..40).map(|j| hex::encode(sha2::Sha256::digest(format!("{i}/{j}")))).collect::<String>()
        };
        let names: Vec<String> = (0..800).map(|i| format!("s{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let big = catalog(&refs, noise);
        assert!(matches!(encode(&big), Err(ClusterStoreError::TooLarge { gzip_bytes }) if gzip_bytes > MAX_CONFIGMAP_GZIP_BYTES));
    }

    #[test]
    fn the_embedded_snapshot_fits_a_config_map() {
        let snapshot = crate::catalog::store::snapshot().unwrap();
        let gzip = encode(&snapshot).expect("the snapshot fits");
        assert!(gzip.len() < MAX_CONFIGMAP_GZIP_BYTES / 2, "{} bytes: the cap leaves room to grow", gzip.len());
    }

    #[test]
    fn a_config_map_without_a_usable_catalog_is_refused_saying_why() {
        let c = catalog(&["pdf"], |_| "d".into());
        let mut cm = config_map("ops", &c, encode(&c).unwrap(), None);
        cm.binary_data.as_mut().unwrap().insert(CONFIGMAP_KEY.into(), ByteString(b"\x1f\x8bnot gzip".to_vec()));
        let broken = decode(&cm).unwrap_err();
        assert!(matches!(broken, ClusterStoreError::Invalid { .. }), "{broken}");
        assert!(broken.to_string().contains("ops/skill-operator-catalog"), "{broken}");
        cm.binary_data = None;
        assert!(matches!(decode(&cm), Err(ClusterStoreError::MissingKey { .. })));
        let mut huge = config_map("ops", &c, vec![0; MAX_CONFIGMAP_GZIP_BYTES + 1], None);
        assert!(matches!(decode(&huge), Err(ClusterStoreError::TooLarge { .. })), "refused before inflating");
        huge.binary_data.as_mut().unwrap().insert(CONFIGMAP_KEY.into(), ByteString(c.to_bytes(false)));
        assert_eq!(decode(&huge).unwrap(), c, "plain JSON is read too, like a catalog file");
    }
}
