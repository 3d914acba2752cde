//! Rate limits per namespace. With `--namespace-rate-limits`, a namespace's
//! figures come from its Namespace annotation [`ANNOTATION`] (keys as the
//! flags', each one given overriding the flag's figure); without it, or
//! without the annotation, the flags' figures apply. The annotation is on the
//! Namespace object, which an admin edits and a tenant who may create
//! SkillBindings usually may not: a tenant cannot raise its own limits.
//!
//! When a namespace's figures cannot be known (the Namespace watch failing
//! for longer than [`RATE_NAMESPACE_STALE_AFTER`], a namespace the watch has
//! not seen yet, an annotation that does not parse), `--rate-limits-unreadable`
//! decides: `closed` (the default) refuses every call there with the reason,
//! `open` applies the flags' figures.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::core::limits::{RATE_LIMITS_ANNOTATION_MAX, RATE_NAMESPACE_RECHECK, RATE_NAMESPACE_STALE_AFTER};
use crate::mcp::ratelimit::{Policy, RateLimits};
use crate::shutdown::Shutdown;

/// The Namespace annotation setting that namespace's limits, for example
/// `calls-per-minute=120,burst-calls=20,runs-per-minute=6,burst-runs=2`.
pub const ANNOTATION: &str = "skill-operator.dev/rate-limits";

/// What a namespace whose limits cannot be read gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Unreadable {
    /// Every call there is refused, saying why (JSON-RPC -32029, data.status 503).
    #[default]
    Closed,
    /// The flags' figures apply.
    Open,
}

/// The gateway's per-namespace flags.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct NamespaceLimitArgs {
    /// Read each namespace's limits from its `skill-operator.dev/rate-limits`
    /// annotation (the gateway then lists and watches Namespaces).
    #[arg(long)]
    pub namespace_rate_limits: bool,
    /// When a namespace's limits cannot be read (the Namespace watch failing,
    /// a namespace not seen yet, an annotation that does not parse): refuse
    /// every call there (closed) or apply the flags' figures (open).
    #[arg(long, value_enum, default_value = "closed", value_name = "closed|open")]
    pub rate_limits_unreadable: Unreadable,
}

/// Why an annotation's value was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("is {len} bytes long; at most {max} are read")]
    TooLong { len: usize, max: usize },
    #[error("has `{0}`, which is not KEY=VALUE")]
    NotPair(String),
    #[error("has the unknown key `{0}`; the keys are {keys}", keys = KEYS.join(", "))]
    UnknownKey(String),
    #[error("gives `{0}` twice")]
    Twice(String),
    #[error("has `{key}={value}`, which is not a whole number from 0 (unlimited) to {max}", max = u32::MAX)]
    NotANumber { key: String, value: String },
}

const KEYS: [&str; 4] = ["calls-per-minute", "runs-per-minute", "burst-calls", "burst-runs"];

/// `text` (comma-separated `KEY=VALUE`, spaces allowed around each) over
/// `defaults`: the keys given replace the defaults' figures, the others stay.
pub fn parse(text: &str, defaults: RateLimits) -> Result<RateLimits, AnnotationError> {
    if text.len() > RATE_LIMITS_ANNOTATION_MAX {
        return Err(AnnotationError::TooLong { len: text.len(), max: RATE_LIMITS_ANNOTATION_MAX });
    }
    let mut limits = defaults;
    let mut seen = BTreeSet::new();
    for entry in text.split(',').map(str::trim) {
        // An empty value (or a trailing comma) sets nothing.
        if entry.is_empty() {
            continue;
        }
        let Some((key, value)) = entry.split_once('=').map(|(k, v)| (k.trim(), v.trim())) else {
            return Err(AnnotationError::NotPair(entry.chars().take(64).collect()));
        };
        let slot = match key {
            "calls-per-minute" => &mut limits.calls_per_minute,
            "runs-per-minute" => &mut limits.runs_per_minute,
            "burst-calls" => &mut limits.burst_calls,
            "burst-runs" => &mut limits.burst_runs,
            other => return Err(AnnotationError::UnknownKey(other.chars().take(64).collect())),
        };
        if !seen.insert(key) {
            return Err(AnnotationError::Twice(key.to_string()));
        }
        // Digits only: `+5`, `5.0` and `1e3` are refused, not guessed at.
        *slot = value
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| value.parse::<u32>().ok())
            .flatten()
            .ok_or_else(|| AnnotationError::NotANumber { key: key.to_string(), value: value.chars().take(32).collect() })?;
    }
    Ok(limits)
}

/// Whether the Namespace watch has been answering.
#[derive(Debug, Clone)]
enum Health {
    Reading,
    /// Failing since then, with the latest error.
    Failing {
        since: Instant,
        error: String,
    },
}

/// Every namespace's [`Policy`].
pub struct NamespaceLimits {
    defaults: RateLimits,
    unreadable: Unreadable,
    /// The Namespaces' metadata; `None`: annotations are not read.
    store: Option<Store<PartialObjectMeta<Namespace>>>,
    health: Mutex<Health>,
}

impl Default for NamespaceLimits {
    /// Unlimited everywhere.
    fn default() -> Self {
        NamespaceLimits::fixed(RateLimits::default())
    }
}

impl NamespaceLimits {
    /// The flags' figures everywhere, no annotation read.
    pub fn fixed(defaults: RateLimits) -> Self {
        NamespaceLimits { defaults, unreadable: Unreadable::Closed, store: None, health: Mutex::new(Health::Reading) }
    }

    /// Limits read from `store` (filled by a watch: [`watch`], or a test's writer).
    pub fn reading(defaults: RateLimits, unreadable: Unreadable, store: Store<PartialObjectMeta<Namespace>>) -> Self {
        NamespaceLimits { defaults, unreadable, store: Some(store), health: Mutex::new(Health::Reading) }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The watch answered (an event, or a relist).
    pub fn watch_answered(&self) {
        *self.health() = Health::Reading;
    }

    /// The watch failed with `error`; the failure counts from the first one in a row.
    pub fn watch_failed(&self, error: &str) {
        let mut health = self.health();
        match &mut *health {
            Health::Reading => *health = Health::Failing { since: Instant::now(), error: error.to_string() },
            Health::Failing { error: latest, .. } => *latest = error.to_string(),
        }
    }

    /// Whether the store has listed every Namespace once (always, when annotations are not read).
    pub async fn wait_until_ready(&self) -> bool {
        match &self.store {
            Some(store) => store.wait_until_ready().await.is_ok(),
            None => true,
        }
    }

    /// What `namespace` is limited by now.
    pub fn policy(&self, namespace: &str) -> Policy {
        let Some(store) = &self.store else { return Policy::Limits(self.defaults) };
        match self.read(store, namespace) {
            Ok(limits) => Policy::Limits(limits),
            Err(reason) => match self.unreadable {
                Unreadable::Closed => Policy::Closed(reason),
                Unreadable::Open => {
                    tracing::debug!(namespace, %reason, "rate limits unreadable: the flags' figures apply (--rate-limits-unreadable open)");
                    Policy::Limits(self.defaults)
                }
            },
        }
    }

    fn read(&self, store: &Store<PartialObjectMeta<Namespace>>, namespace: &str) -> Result<RateLimits, String> {
        if let Health::Failing { since, error } = &*self.health() {
            let failing = since.elapsed();
            if failing >= RATE_NAMESPACE_STALE_AFTER {
                return Err(format!(
                    "the gateway has not been able to watch Namespaces for {} s ({error}); check its RBAC (list and watch \
                     namespaces) and the API server",
                    failing.as_secs()
                ));
            }
        }
        let Some(meta) = store.get(&ObjectRef::new(namespace)) else {
            return Err(format!("the gateway has not seen namespace `{namespace}` yet (just created?)"));
        };
        match meta.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) {
            None => Ok(self.defaults),
            Some(text) => parse(text, self.defaults).map_err(|err| {
                format!("the annotation {ANNOTATION} of namespace `{namespace}` {err}; an admin corrects it (kubectl annotate namespace {namespace} --overwrite {ANNOTATION}=...)")
            }),
        }
    }
}

/// The Namespaces' metadata watch: the limits reading its store, and the
/// stream to hand to [`drive`] once the namespaces exist.
pub fn watch(
    client: Client,
    defaults: RateLimits,
    unreadable: Unreadable,
) -> (Arc<NamespaceLimits>, impl Stream<Item = Result<watcher::Event<PartialObjectMeta<Namespace>>, watcher::Error>> + Send) {
    let (store, writer) = reflector::store();
    let events = reflector(writer, watcher(Api::<PartialObjectMeta<Namespace>>::all(client), watcher::Config::default()).default_backoff());
    (Arc::new(NamespaceLimits::reading(defaults, unreadable, store)), events)
}

/// Keep every served namespace's limiter on its policy through `apply`
/// (the namespaces named, or all: `Namespaces::apply_rate_limits`): on
/// every change the watch reports, and every [`RATE_NAMESPACE_RECHECK`] (a
/// failing watch reports no change, yet its namespaces must close once it
/// is stale).
pub async fn drive<S, A>(events: S, limits: Arc<NamespaceLimits>, apply: A, shutdown: Shutdown)
where
    S: Stream<Item = Result<watcher::Event<PartialObjectMeta<Namespace>>, watcher::Error>> + Send,
    A: Fn(Option<&BTreeSet<String>>) + Send,
{
    let mut events = std::pin::pin!(events);
    let mut recheck = tokio::time::interval(RATE_NAMESPACE_RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let touched: Option<BTreeSet<String>> = tokio::select! {
            _ = shutdown.wait() => return,
            _ = recheck.tick() => None,
            next = events.next() => match next {
                None => return,
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "the Namespace watch failed; retrying");
                    limits.watch_failed(&err.to_string());
                    continue;
                }
                Some(Ok(event)) => {
                    limits.watch_answered();
                    match event {
                        watcher::Event::Apply(ns) | watcher::Event::Delete(ns) => ns.metadata.name.into_iter().collect::<BTreeSet<_>>().into(),
                        // A relist ends: anything may have changed.
                        watcher::Event::InitDone => None,
                        watcher::Event::Init | watcher::Event::InitApply(_) => continue,
                    }
                }
            },
        };
        apply(touched.as_ref());
    }
}

#[cfg(test)]
#[path = "ratelimits_tests.rs"]
mod tests;
