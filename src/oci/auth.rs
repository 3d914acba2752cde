//! Registry credentials: anonymous, basic, bearer, or a docker config JSON.

use oci_client::secrets::RegistryAuth;
use serde::Deserialize;
use std::collections::BTreeMap;

use super::*;

/// Registry credentials.
#[derive(Clone, Default)]
pub enum Auth {
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
    /// A ready bearer token (e.g. from a token service or a k8s secret).
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Anonymous => f.write_str("Anonymous"),
            Auth::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
            Auth::Bearer(_) => f.write_str("Bearer(***)"),
        }
    }
}

impl Auth {
    /// Credentials for `registry` (`host[:port]`) from a docker config JSON:
    /// a `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`
    /// (`{"auths": {...}}`) or an old `.dockercfg` (the map alone). Keys may
    /// carry a scheme or path (`https://index.docker.io/v1/`); Docker Hub's
    /// aliases match each other. `username`/`password` or `auth`
    /// (base64 `user:pass`) give Basic, `registrytoken` gives Bearer; no
    /// entry gives Anonymous.
    pub fn from_docker_config(json: &[u8], registry: &str) -> Result<Auth, OciError> {
        use base64::Engine as _;
        #[derive(Deserialize)]
        struct Entry {
            username: Option<String>,
            password: Option<String>,
            auth: Option<String>,
            registrytoken: Option<String>,
        }
        let invalid = |detail: String| OciError::InvalidConfig { detail: format!("docker config: {detail}") };
        let mut v: serde_json::Value = serde_json::from_slice(json).map_err(|e| invalid(e.to_string()))?;
        let auths = match v.get_mut("auths") {
            Some(a) => a.take(),
            None => v,
        };
        let auths: BTreeMap<String, Entry> = serde_json::from_value(auths).map_err(|e| invalid(e.to_string()))?;
        let host = |k: &str| {
            let k = k.split_once("://").map_or(k, |(_, rest)| rest);
            let k = k.split('/').next().unwrap_or(k);
            match k {
                "docker.io" | "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
                other => other.to_ascii_lowercase(),
            }
        };
        let want = host(registry);
        let Some(e) = auths.into_iter().find(|(k, _)| host(k) == want).map(|(_, e)| e) else {
            return Ok(Auth::Anonymous);
        };
        if let Some(t) = e.registrytoken.filter(|t| !t.is_empty()) {
            return Ok(Auth::Bearer(t));
        }
        if let (Some(username), Some(password)) = (e.username.clone(), e.password.clone()) {
            return Ok(Auth::Basic { username, password });
        }
        if let Some(a) = e.auth.filter(|a| !a.is_empty()) {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .map_err(|e| invalid(format!("auth for {registry} is not base64: {e}")))?;
            let pair = String::from_utf8(raw).map_err(|_| invalid(format!("auth for {registry} is not UTF-8")))?;
            let (username, password) = pair.split_once(':').ok_or_else(|| invalid(format!("auth for {registry} is not user:password")))?;
            return Ok(Auth::Basic { username: username.into(), password: password.into() });
        }
        Ok(Auth::Anonymous)
    }

    pub(super) fn to_oci(&self) -> RegistryAuth {
        match self {
            Auth::Anonymous => RegistryAuth::Anonymous,
            Auth::Basic { username, password } => RegistryAuth::Basic(username.clone(), password.clone()),
            Auth::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        }
    }
}
