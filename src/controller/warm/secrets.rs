//! A run's granted values, read for its warm claim and sealed to the pod.
//!
//! A cold run's pod gets its granted variables from the kubelet
//! (`secretKeyRef`); the controller never reads them. A warm pod was made
//! before its run, so its variables can only come with the claim: the
//! controller reads them here, at the claim, seals them to the pod's own
//! key ([`crate::artifacts::sealed`]) and forgets them. It can only where
//! the namespace lets it: the chart grants no `get` on Secrets, and a
//! namespace admin who wants warm runs for bindings with variables grants
//! it on exactly those Secrets with a Role (`docs/kubernetes.md`). Where it
//! may not, or a value cannot travel sealed (not text, over the size a
//! claim carries), the run starts cold, as before: counted as a miss of
//! kind `env`, with the reason in the log.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

/// The values of `grants` (`(variable, secret, key)`, as admission gives
/// them) in `ns`, each Secret read once; the error says why the run cannot
/// have them at a claim.
pub async fn granted_values(client: &kube::Client, ns: &str, grants: &[(String, String, String)]) -> Result<Vec<(String, String)>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut secrets: BTreeMap<&str, Secret> = BTreeMap::new();
    let mut values = Vec::with_capacity(grants.len());
    for (name, secret, key) in grants {
        if !secrets.contains_key(secret.as_str()) {
            let read = api.get(secret).await.map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 403 => format!(
                    "the controller may not read Secret {ns}/{secret} (grant its ServiceAccount get on that Secret with a Role in {ns} for warm runs with variables)"
                ),
                kube::Error::Api(s) if s.code == 404 => format!("Secret {ns}/{secret} does not exist"),
                _ => format!("Secret {ns}/{secret} could not be read: {e}"),
            })?;
            secrets.insert(secret.as_str(), read);
        }
        let bytes = secrets[secret.as_str()]
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| format!("Secret {ns}/{secret} has no key {key:?}"))?;
        let value = String::from_utf8(bytes.0.clone()).map_err(|_| format!("the value of {ns}/{secret} key {key:?} is not UTF-8 text"))?;
        values.push((name.clone(), value));
    }
    Ok(values)
}

/// [`granted_values`], and only if they can travel sealed in a claim
/// ([`crate::artifacts::sealed::sealable`]): checked before any pod is
/// looked at.
pub async fn sealable_values(
    client: &kube::Client,
    ns: &str,
    grants: &[(String, String, String)],
) -> Result<Vec<(String, String)>, String> {
    let values = granted_values(client, ns, grants).await?;
    crate::artifacts::sealed::sealable(&values).map_err(|e| e.to_string())?;
    Ok(values)
}
