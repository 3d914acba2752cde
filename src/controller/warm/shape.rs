//! What a pool's pods depend on, and the key that names it.

use sha2::{Digest, Sha256};

use crate::api::binding::SkillBinding;
use crate::api::package::{OciSource, SkillPackage};
use crate::controller::builders::job::PackageDelivery;
use crate::controller::decide::{self, Admission};

/// Why a binding keeps no warm pods now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotWarm {
    /// The binding or its package is not ready to run anything.
    NotReady,
}

/// Everything a warm pod of a pool is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolShape {
    /// The pinned package digest (`sha256:<hex>`).
    pub digest: String,
    /// Where the package is staged from, pinned to [`Self::digest`].
    pub source: OciSource,
    pub image: String,
    pub delivery: PackageDelivery,
    pub cpu: String,
    pub memory: String,
    pub ephemeral_storage: String,
}

impl PoolShape {
    /// The shape the binding's runs have now: the parts of
    /// [`decide::admit`] that do not depend on the run.
    pub fn of_binding(binding: &SkillBinding, package: &SkillPackage) -> Result<Self, NotWarm> {
        let ready = binding.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let pstatus = package.status.clone().unwrap_or_default();
        let digest = pstatus.digest.clone().ok_or(NotWarm::NotReady)?;
        let profile = package.spec.runtime.as_ref().ok_or(NotWarm::NotReady)?;
        // A binding granting egress keeps a pool too: its pods wait with no
        // network, and a run's grant is bound at its claim (see `claim`).
        if !ready {
            return Err(NotWarm::NotReady);
        }
        let (image, delivery) = decide::delivery(package).map_err(|_| NotWarm::NotReady)?;
        let mut source = package.spec.source.oci.clone();
        source.reference = decide::pinned_reference(&source.reference, &digest);
        Ok(PoolShape {
            digest,
            source,
            image,
            delivery,
            cpu: profile.resources.cpu.clone(),
            memory: profile.resources.memory.clone(),
            ephemeral_storage: profile.resources.ephemeral_storage.clone(),
        })
    }

    /// The shape an admitted run needs. Its egress grant and its variables
    /// do not shape the pod: both are bound at the claim.
    pub fn of_admission(a: &Admission) -> Self {
        PoolShape {
            digest: a.digest.clone(),
            source: a.source.clone(),
            image: a.image.clone(),
            delivery: a.delivery.clone(),
            cpu: a.cpu.clone(),
            memory: a.memory.clone(),
            ephemeral_storage: a.ephemeral_storage.clone(),
        }
    }

    /// 20 hex digits of SHA-256 over every field: equal keys, equal pods.
    /// The source is left out: it is the digest's, pinned.
    pub fn key(&self) -> String {
        let mut h = Sha256::new();
        let delivery = format!("{:?}", self.delivery);
        for field in [&self.digest, &self.image, &delivery, &self.cpu, &self.memory, &self.ephemeral_storage] {
            h.update((field.len() as u64).to_be_bytes());
            h.update(field.as_bytes());
        }
        hex::encode(h.finalize())[..20].to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> PoolShape {
        PoolShape {
            digest: format!("sha256:{}", "a".repeat(64)),
            source: OciSource { reference: "r/p@sha256:aa".into(), pull_secret: None, insecure: false },
            image: "python@sha256:bb".into(),
            delivery: PackageDelivery::Fetched,
            cpu: "1".into(),
            memory: "512Mi".into(),
            ephemeral_storage: "1Gi".into(),
        }
    }

    fn admission(s: &PoolShape) -> Admission {
        Admission {
            skill: "k".into(),
            digest: s.digest.clone(),
            source: s.source.clone(),
            image: s.image.clone(),
            interpreter_path: "/usr/bin/python3".into(),
            script: "scripts/a.py".into(),
            args: vec![],
            env: vec![],
            timeout_secs: 60,
            cpu: s.cpu.clone(),
            memory: s.memory.clone(),
            ephemeral_storage: s.ephemeral_storage.clone(),
            egress: false,
            egress_allowed: vec![],
            egress_proposed: vec![],
            delivery: s.delivery.clone(),
            warm: None,
        }
    }

    /// Egress and variables are bound at the claim, so a run granted either
    /// takes a pod of the same pool.
    #[test]
    fn a_run_granted_egress_or_variables_has_the_pools_shape() {
        let s = shape();
        assert_eq!(PoolShape::of_admission(&admission(&s)).key(), s.key());
        let egress = Admission { egress: true, egress_allowed: vec!["10.0.0.1:80".into()], ..admission(&s) };
        assert_eq!(PoolShape::of_admission(&egress).key(), s.key());
        let env = Admission { env: vec![("TOKEN".into(), "s".into(), "k".into())], ..admission(&s) };
        assert_eq!(PoolShape::of_admission(&env).key(), s.key());
    }

    #[test]
    fn every_field_that_shapes_the_pod_changes_the_key() {
        let base = shape().key();
        assert_eq!(base.len(), 20);
        assert_eq!(base, shape().key());
        type Change = Box<dyn Fn(&mut PoolShape)>;
        let changes: Vec<Change> = vec![
            Box::new(|s| s.digest = format!("sha256:{}", "b".repeat(64))),
            Box::new(|s| s.image = "python@sha256:cc".into()),
            Box::new(|s| s.delivery = PackageDelivery::InImage { env: vec![] }),
            Box::new(|s| s.cpu = "2".into()),
            Box::new(|s| s.memory = "1Gi".into()),
            Box::new(|s| s.ephemeral_storage = "2Gi".into()),
        ];
        for change in changes {
            let mut s = shape();
            change(&mut s);
            assert_ne!(s.key(), base, "{s:?}");
        }
    }
}
