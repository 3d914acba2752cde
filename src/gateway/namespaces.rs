//! The namespaces the gateway serves, each made on its first request: its
//! [`ServerState`] (snapshot, SkillJob executor, authorizer) and its own
//! MCP service with its own session store. A legacy session therefore
//! belongs to the namespace that created it: its id means nothing on
//! another namespace's path. A namespace nobody asked for costs nothing;
//! once made, it is kept current by [`Namespaces::refresh`] (called by
//! the watches on every binding or package change).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::file_url::JobFiles;
use crate::mcp::snapshot::Snapshot;
use crate::mcp::state::{Authorize, Execution, ServerState};
use crate::mcp::SkillServer;
use crate::serve::sessions::BoundedSessions;

/// What a namespace is made of; the gateway's wiring to the cluster.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// The skills bound in `namespace` right now (an empty snapshot when none).
    async fn snapshot(&self, namespace: &str) -> Snapshot;
    /// How runs are carried out there (`None`: read tools only).
    fn execution(&self, namespace: &str) -> Option<Execution>;
    /// Who may do what there (`None` only in tests and anonymous mode).
    fn authorizer(&self, namespace: &str) -> Option<Arc<dyn Authorize>>;
    /// The file route's jobs there (`None`: the route finds no jobs).
    fn files(&self, _namespace: &str) -> Option<Arc<dyn JobFiles>> {
        None
    }
    /// The catalog `skill_search` scope `catalog` answers from (one for
    /// every namespace; `None`: that scope says there is none).
    fn catalog(&self) -> Option<Arc<crate::catalog::live::LiveCatalog>> {
        None
    }
}

/// Why a namespace cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NamespaceError {
    #[error("`{0}` is not a namespace name (lowercase letters, digits and '-', at most 63, starting and ending alphanumeric): use /mcp/<namespace>")]
    BadName(String),
    #[error("the gateway already serves {max} namespaces; retry later (or raise --max-namespaces)")]
    Full { max: usize },
}

/// One served namespace.
pub struct Namespace {
    pub name: String,
    pub state: Arc<ServerState>,
    pub service: StreamableHttpService<SkillServer, BoundedSessions>,
    pub sessions: Arc<BoundedSessions>,
    /// The file route's jobs ([`Backend::files`]).
    pub files: Option<Arc<dyn JobFiles>>,
}

/// How every namespace's MCP service is set up.
#[derive(Clone)]
pub struct ServiceOptions {
    pub http: StreamableHttpServerConfig,
    /// Sessions held per namespace.
    pub max_sessions: usize,
    /// Namespaces held at once.
    pub max_namespaces: usize,
    /// Each namespace's figures per principal (its own buckets: namespace × principal).
    pub rate_limits: Arc<super::ratelimits::NamespaceLimits>,
    /// The gateway's audit writer; each namespace stamps its name on its records.
    pub audit: crate::audit::Audit,
}

/// The namespaces made so far.
pub struct Namespaces {
    backend: Arc<dyn Backend>,
    options: ServiceOptions,
    held: Mutex<HashMap<String, Arc<Namespace>>>,
    /// One first build per namespace at a time (two first requests, one scan).
    making: tokio::sync::Mutex<()>,
}

/// A Kubernetes namespace name (RFC 1123 label).
pub fn check_name(name: &str) -> Result<(), NamespaceError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(NamespaceError::BadName(name.chars().take(80).collect()))
    }
}

impl Namespaces {
    pub fn new(backend: Arc<dyn Backend>, options: ServiceOptions) -> Self {
        Namespaces { backend, options, held: Mutex::new(HashMap::new()), making: tokio::sync::Mutex::new(()) }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Namespace>>> {
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The namespace, made on first use.
    pub async fn get(&self, name: &str) -> Result<Arc<Namespace>, NamespaceError> {
        check_name(name)?;
        if let Some(ns) = self.held().get(name) {
            return Ok(ns.clone());
        }
        let _one = self.making.lock().await;
        if let Some(ns) = self.held().get(name) {
            return Ok(ns.clone());
        }
        if self.held().len() >= self.options.max_namespaces {
            return Err(NamespaceError::Full { max: self.options.max_namespaces });
        }
        let snapshot = self.backend.snapshot(name).await;
        let mut state = ServerState::new(snapshot)
            .tools_only_when_bound()
            .with_rate_limits(self.options.rate_limits.policy(name))
            .with_audit(self.options.audit.for_namespace(name));
        if let Some(execution) = self.backend.execution(name) {
            state = state.with_execution(execution);
        }
        if let Some(authorizer) = self.backend.authorizer(name) {
            state = state.with_authorizer(authorizer);
        }
        if let Some(catalog) = self.backend.catalog() {
            state = state.with_catalog(catalog);
        }
        let state = Arc::new(state);
        let sessions = Arc::new(BoundedSessions::new(self.options.max_sessions));
        let server = SkillServer::new(state.clone());
        let service = StreamableHttpService::new(move || Ok(server.clone()), sessions.clone(), self.options.http.clone());
        let files = self.backend.files(name);
        let ns = Arc::new(Namespace { name: name.to_string(), state, service, sessions, files });
        self.held().insert(name.to_string(), ns.clone());
        tracing::info!(namespace = name, "serving a new namespace");
        Ok(ns)
    }

    /// The names served so far.
    pub fn names(&self) -> BTreeSet<String> {
        self.held().keys().cloned().collect()
    }

    /// Rebuild the snapshots of `which` (those served; others cost nothing)
    /// and swap each in. A namespace whose skills did not change is left
    /// alone, so its sessions hear nothing. Returns the names that changed.
    pub async fn refresh(&self, which: &BTreeSet<String>) -> Vec<String> {
        let targets: Vec<Arc<Namespace>> = self.held().iter().filter(|(n, _)| which.contains(*n)).map(|(_, ns)| ns.clone()).collect();
        let mut changed = Vec::new();
        for ns in targets {
            let next = self.backend.snapshot(&ns.name).await;
            if ns.state.snapshots.replace(next) {
                tracing::info!(namespace = %ns.name, skills = ns.state.snapshot().catalog.skills.len(), "namespace skills changed");
                changed.push(ns.name.clone());
            }
        }
        changed
    }

    /// Put each served namespace of `which` (`None`: all) on its current
    /// rate-limit policy; a namespace whose policy did not change keeps its buckets.
    pub fn apply_rate_limits(&self, which: Option<&BTreeSet<String>>) {
        let targets: Vec<Arc<Namespace>> =
            self.held().iter().filter(|(n, _)| which.is_none_or(|w| w.contains(*n))).map(|(_, ns)| ns.clone()).collect();
        for ns in targets {
            let policy = self.options.rate_limits.policy(&ns.name);
            let closed = matches!(policy, crate::mcp::ratelimit::Policy::Closed(_));
            if ns.state.rate_limits.set(policy) {
                if closed {
                    tracing::warn!(namespace = %ns.name, "rate limits unknown: calls there are refused until they can be read");
                } else {
                    tracing::info!(namespace = %ns.name, "rate limits changed");
                }
            }
        }
    }

    /// Every namespace served (a package change may touch any of them).
    pub async fn refresh_all(&self) -> Vec<String> {
        let all = self.names();
        self.refresh(&all).await
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::core::grants::Grants;

    /// Skill trees per namespace, on disk (the real discovery reads them).
    #[derive(Default)]
    pub(crate) struct Trees(Mutex<HashMap<String, tempfile::TempDir>>);

    impl Trees {
        pub(crate) fn put(&self, ns: &str, skills: &[&str]) {
            let dir = tempfile::tempdir().unwrap();
            for s in skills {
                std::fs::create_dir_all(dir.path().join(s)).unwrap();
                std::fs::write(dir.path().join(s).join("SKILL.md"), format!("---\nname: {s}\ndescription: d\n---\nbody\n")).unwrap();
            }
            self.0.lock().unwrap().insert(ns.to_string(), dir);
        }
    }

    #[async_trait::async_trait]
    impl Backend for Trees {
        async fn snapshot(&self, namespace: &str) -> Snapshot {
            let root = self.0.lock().unwrap().get(namespace).map(|d| d.path().to_path_buf());
            let roots: Vec<_> = root.into_iter().collect();
            Snapshot::scan(&roots, Grants::resolve(&|_| None, None), Default::default())
        }
        fn execution(&self, _: &str) -> Option<Execution> {
            None
        }
        fn authorizer(&self, _: &str) -> Option<Arc<dyn Authorize>> {
            None
        }
    }

    pub(crate) fn registry(max_namespaces: usize) -> (Arc<Trees>, Namespaces) {
        let trees = Arc::new(Trees(Mutex::new(HashMap::new())));
        let options = ServiceOptions {
            http: StreamableHttpServerConfig::default(),
            max_sessions: 4,
            max_namespaces,
            rate_limits: Default::default(),
            audit: Default::default(),
        };
        (trees.clone(), Namespaces::new(trees, options))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn namespace_names_are_dns_labels() {
        for good in ["a", "team-1", "x".repeat(63).as_str()] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "../x", "a/b", "x".repeat(64).as_str(), "é"] {
            assert!(matches!(check_name(bad), Err(NamespaceError::BadName(_))), "{bad}");
        }
    }

    #[tokio::test]
    async fn made_once_on_first_use_and_only_within_the_cap() {
        let (trees, reg) = registry(2);
        trees.put("a", &["one"]);
        let first = reg.get("a").await.unwrap();
        assert!(Arc::ptr_eq(&first, &reg.get("a").await.unwrap()));
        reg.get("b").await.unwrap();
        assert_eq!(reg.get("c").await.err(), Some(NamespaceError::Full { max: 2 }));
        assert!(reg.get("a").await.is_ok(), "a held namespace is still served at the cap");
        assert_eq!(reg.names(), set(&["a", "b"]));
    }

    #[tokio::test]
    async fn a_refresh_swaps_only_namespaces_that_changed_and_wakes_only_their_sessions() {
        let (trees, reg) = registry(10);
        trees.put("a", &["one"]);
        trees.put("b", &["two"]);
        let (a, b) = (reg.get("a").await.unwrap(), reg.get("b").await.unwrap());
        let (wake_a, wake_b) = (a.state.snapshots.subscribe(), b.state.snapshots.subscribe());
        // Unchanged: nothing swapped, nobody woken.
        assert!(reg.refresh_all().await.is_empty());
        assert!(!wake_a.has_changed().unwrap() && !wake_b.has_changed().unwrap());
        // A change in `a` wakes `a` only.
        trees.put("a", &["one", "three"]);
        assert_eq!(reg.refresh_all().await, vec!["a".to_string()]);
        assert!(wake_a.has_changed().unwrap());
        assert!(!wake_b.has_changed().unwrap());
        assert_eq!(a.state.snapshot().catalog.names(), vec!["one", "three"]);
        // A namespace not yet served is not built by a refresh.
        trees.put("c", &["x"]);
        assert!(reg.refresh(&set(&["c"])).await.is_empty());
        assert!(!reg.names().contains("c"));
    }
}
