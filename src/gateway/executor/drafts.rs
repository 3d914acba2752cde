//! Drafts: jobs created (`skill_job_create`) and uploaded to before their
//! script is known. A draft has no SkillJob yet, because a SkillJob's spec
//! is immutable and names its script: the controller would admit and run
//! it. Its inputs are staged at the artifact endpoint under the draft's id
//! (`/jobs/<namespace>/<id>/inputs`), and its record is a ConfigMap in the
//! gateway's own namespace.
//!
//! # Why a ConfigMap in the gateway's namespace
//! - Any replica finds it (the record is in the API server, not in memory),
//!   and a gateway restart loses no draft.
//! - The tenant namespace needs no new RBAC: the gateway gets ConfigMap
//!   rights in its own namespace only (a Role, not a ClusterRole), and
//!   nobody in the tenant namespace can edit or forge a draft record, since
//!   tenants have no rights in the gateway's namespace.
//! - Writes are guarded by `resourceVersion` (a replace carrying it fails
//!   with 409 when another replica wrote in between), which is what closes
//!   uploads at the moment a run starts.
//!
//! The record is named `skill-draft-<namespace>-<id>` and also says its
//! namespace inside, so a draft id of one namespace opens nothing in another.
//! When the draft runs, its SkillJob takes the draft's id as its name (the
//! job id the client holds does not change), the staged inputs are copied
//! under the SkillJob's UID, and the draft's record and staged set go.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

use super::error::{is_status, ExecError, Result};
use super::names::{draft_record_name, owner_label, CREATED_BY, LABEL_CREATED_BY, LABEL_DRAFT_NAMESPACE, LABEL_OWNER};
use crate::jobs::FileInfo;

const RECORD_KEY: &str = "draft.json";

/// Whether a draft still takes uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DraftState {
    /// Uploads go in.
    Open,
    /// A run is creating its SkillJob: uploads are closed.
    Starting,
}

/// A draft's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Draft {
    pub id: String,
    pub namespace: String,
    pub skill: String,
    pub owner: String,
    pub created_at_ms: u64,
    pub state: DraftState,
    /// Sorted by path.
    pub inputs: Vec<FileInfo>,
}

/// A draft as read, with the version a guarded write must name.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub draft: Draft,
    pub resource_version: Option<String>,
}

/// The drafts of one tenant namespace, recorded in the gateway's namespace.
#[derive(Clone)]
pub struct Drafts {
    api: Api<ConfigMap>,
    namespace: String,
}

impl Drafts {
    pub fn new(client: kube::Client, gateway_namespace: &str, namespace: &str) -> Drafts {
        Drafts { api: Api::namespaced(client, gateway_namespace), namespace: namespace.to_string() }
    }

    fn config_map(&self, draft: &Draft, resource_version: Option<String>) -> Result<ConfigMap> {
        let text = serde_json::to_string(draft).map_err(|e| ExecError::BadDraft { name: draft.id.clone(), reason: e.to_string() })?;
        Ok(ConfigMap {
            metadata: ObjectMeta {
                name: Some(draft_record_name(&self.namespace, &draft.id)),
                labels: Some(BTreeMap::from([
                    (LABEL_CREATED_BY.to_string(), CREATED_BY.to_string()),
                    (LABEL_DRAFT_NAMESPACE.to_string(), self.namespace.clone()),
                    (LABEL_OWNER.to_string(), owner_label(&draft.owner)),
                ])),
                resource_version,
                ..Default::default()
            },
            data: Some(BTreeMap::from([(RECORD_KEY.to_string(), text)])),
            ..Default::default()
        })
    }

    fn parse(&self, id: &str, cm: ConfigMap) -> Result<Loaded> {
        let bad = |reason: String| ExecError::BadDraft { name: id.to_string(), reason };
        let text = cm.data.as_ref().and_then(|d| d.get(RECORD_KEY)).ok_or_else(|| bad(format!("no {RECORD_KEY}")))?;
        let draft: Draft = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if draft.id != id || draft.namespace != self.namespace {
            return Err(bad("the record names another job".into()));
        }
        Ok(Loaded { draft, resource_version: cm.metadata.resource_version })
    }

    pub async fn create(&self, draft: &Draft) -> Result<()> {
        let cm = self.config_map(draft, None)?;
        self.api.create(&PostParams::default(), &cm).await.map_err(ExecError::kube("record a new draft job"))?;
        Ok(())
    }

    /// The draft `id` of this namespace, if it exists.
    pub async fn load(&self, id: &str) -> Result<Option<Loaded>> {
        let name = draft_record_name(&self.namespace, id);
        match self.api.get_opt(&name).await.map_err(ExecError::kube(format!("read draft job {id}")))? {
            Some(cm) => self.parse(id, cm).map(Some),
            None => Ok(None),
        }
    }

    /// Write `loaded.draft` if nobody wrote the record since it was read;
    /// `Ok(false)` when somebody did (read it again).
    pub async fn save(&self, loaded: &Loaded) -> Result<bool> {
        let cm = self.config_map(&loaded.draft, loaded.resource_version.clone())?;
        let name = draft_record_name(&self.namespace, &loaded.draft.id);
        match self.api.replace(&name, &PostParams::default(), &cm).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, 409) => Ok(false),
            Err(e) => Err(ExecError::Kube { what: format!("update draft job {}", loaded.draft.id), source: e }),
        }
    }

    pub async fn delete(&self, id: &str) -> Result<()> {
        let name = draft_record_name(&self.namespace, id);
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(ExecError::Kube { what: format!("delete draft job {id}"), source: e }),
        }
    }

    /// Every draft of this namespace (unreadable records left out), and how
    /// many records there are in all (they count toward the cap either way).
    pub async fn list(&self) -> Result<(Vec<Draft>, usize)> {
        let lp = ListParams::default().labels(&format!("{LABEL_DRAFT_NAMESPACE}={}", self.namespace));
        let list = self.api.list(&lp).await.map_err(ExecError::kube("list draft jobs"))?;
        let count = list.items.len();
        let drafts = list
            .items
            .into_iter()
            .filter_map(|cm| {
                let text = cm.data.as_ref()?.get(RECORD_KEY)?;
                serde_json::from_str::<Draft>(text).ok().filter(|d| d.namespace == self.namespace)
            })
            .collect();
        Ok((drafts, count))
    }
}
