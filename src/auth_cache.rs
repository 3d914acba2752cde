//! A bounded map of answers that expire, with one fetch per key at a time.
//!
//! The gateway's authenticator keeps two of these (token reviews by token
//! hash, access decisions by who/where/what), the artifact endpoint one (run
//! pods' token reviews by token hash and audience). Two properties matter
//! more than speed:
//!
//! - **Bounded.** An entry lives for its own TTL, and at most `max_entries`
//!   are kept: inserting one more evicts the oldest insertion. Anyone can
//!   send tokens, so nothing a request sends may grow memory without bound.
//!   Refusals (a garbage token, a denial) are kept apart from answers, each
//!   bounded on its own: a flood of garbage tokens evicts other refusals,
//!   never a verified token, so it cannot turn every legitimate request
//!   into a miss.
//! - **Single-flight.** Concurrent misses for the same key share one fetch:
//!   a burst of requests carrying one new token costs the API server one
//!   TokenReview, not one per request. The fetch is a [`OnceCell`]
//!   initialisation, so if the request driving it is dropped (its client
//!   went away) the next waiter takes it over instead of everyone failing.
//!
//! The lock is a std mutex: it is never held across an `.await`.
//!
//! Time is tokio's clock, so tests can pause and advance it.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

/// What a fetch produced and how long it may be reused (`None`: not at all,
/// e.g. a transient failure that must be retried by the next request), and
/// whether it is a refusal (kept in the refusals' own bounded store).
pub(crate) struct Fetched<V> {
    pub(crate) value: V,
    pub(crate) ttl: Option<Duration>,
    pub(crate) refusal: bool,
}

/// Whether an answer came from the cache (for tracing and the counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Cache,
    /// This call (or a concurrent one for the same key) asked the API server.
    Fetched,
}

pub(crate) struct Cache<K, V> {
    max_entries: usize,
    inner: Mutex<Inner<K, V>>,
}

struct Inner<K, V> {
    answers: Store<K, V>,
    refusals: Store<K, V>,
    /// Fetches in progress, one per key.
    flights: HashMap<K, Arc<OnceCell<Fetched<V>>>>,
}

/// One bounded map, evicting by insertion order.
struct Store<K, V> {
    entries: HashMap<K, Entry<V>>,
    /// Insertion order: sequence number → key. Evicting the oldest is
    /// popping the first; re-inserting a key removes its old number.
    order: BTreeMap<u64, K>,
    next_seq: u64,
}

struct Entry<V> {
    value: V,
    expires: Instant,
    seq: u64,
}

impl<K: Eq + Hash + Clone, V: Clone> Cache<K, V> {
    /// A cache of at most `max_entries` answers (at least one).
    pub(crate) fn new(max_entries: usize) -> Self {
        Cache {
            max_entries: max_entries.max(1),
            inner: Mutex::new(Inner { answers: Store::default(), refusals: Store::default(), flights: HashMap::new() }),
        }
    }

    /// The cached answer for `key` if it has not expired, else the answer of
    /// `fetch` (shared with every concurrent caller asking for the same key),
    /// stored for the TTL it names.
    pub(crate) async fn get_or_fetch<F, Fut>(&self, key: &K, fetch: F) -> (V, Source)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Fetched<V>>,
    {
        let flight = {
            let mut locked = self.lock();
            let inner = &mut *locked;
            let now = Instant::now();
            for store in [&mut inner.answers, &mut inner.refusals] {
                match store.entries.get(key) {
                    Some(entry) if entry.expires > now => return (entry.value.clone(), Source::Cache),
                    Some(_) => store.remove(key),
                    None => {}
                }
            }
            inner.flights.entry(key.clone()).or_default().clone()
        };
        let guard = FlightGuard { cache: self, key, flight };
        let fetched = guard.flight.get_or_init(fetch).await;
        let value = fetched.value.clone();
        let mut locked = self.lock();
        let inner = &mut *locked;
        // Whoever gets here first for this flight files its answer; the
        // others find the flight gone (or a newer one) and leave it alone.
        if inner.flights.get(key).is_some_and(|current| Arc::ptr_eq(current, &guard.flight)) {
            inner.flights.remove(key);
            if let Some(ttl) = fetched.ttl.filter(|ttl| !ttl.is_zero()) {
                let (store, other) =
                    if fetched.refusal { (&mut inner.refusals, &mut inner.answers) } else { (&mut inner.answers, &mut inner.refusals) };
                other.remove(key);
                store.insert(key.clone(), value.clone(), Instant::now() + ttl, self.max_entries);
            }
        }
        drop(locked);
        (value, Source::Fetched)
    }

    /// Entries currently held (answers and refusals; expired ones included
    /// until touched or evicted) and fetches in progress.
    #[cfg(test)]
    pub(crate) fn len(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.answers.entries.len() + inner.refusals.entries.len(), inner.flights.len())
    }

    /// Callers waiting on the fetch in progress for `key` (0: none).
    #[cfg(test)]
    pub(crate) fn waiters(&self, key: &K) -> usize {
        self.lock().flights.get(key).map_or(0, |flight| Arc::strong_count(flight) - 1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K, V>> {
        // A panic while holding the lock leaves the maps consistent (every
        // mutation is a single map call), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Removes a flight nobody waits for any more when its last waiter is
/// dropped mid-fetch (the client went away): otherwise every abandoned
/// token would leave a key behind in `flights`.
struct FlightGuard<'a, K: Eq + Hash + Clone, V: Clone> {
    cache: &'a Cache<K, V>,
    key: &'a K,
    flight: Arc<OnceCell<Fetched<V>>>,
}

impl<K: Eq + Hash + Clone, V: Clone> Drop for FlightGuard<'_, K, V> {
    fn drop(&mut self) {
        if self.flight.initialized() {
            return;
        }
        let mut inner = self.cache.lock();
        // Two references: the map's and ours. More means another waiter
        // will take the fetch over; new waiters clone under this same lock.
        let abandoned =
            inner.flights.get(self.key).is_some_and(|current| Arc::ptr_eq(current, &self.flight)) && Arc::strong_count(&self.flight) <= 2;
        if abandoned {
            inner.flights.remove(self.key);
        }
    }
}

impl<K, V> Default for Store<K, V> {
    fn default() -> Self {
        Store { entries: HashMap::new(), order: BTreeMap::new(), next_seq: 0 }
    }
}

impl<K: Eq + Hash + Clone, V> Store<K, V> {
    fn remove(&mut self, key: &K) {
        if let Some(old) = self.entries.remove(key) {
            self.order.remove(&old.seq);
        }
    }

    fn insert(&mut self, key: K, value: V, expires: Instant, max_entries: usize) {
        self.remove(&key);
        while self.entries.len() >= max_entries {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            self.entries.remove(&oldest);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key.clone());
        self.entries.insert(key, Entry { value, expires, seq });
    }
}

/// `text` cut to `max` characters (an ellipsis marks the cut): reasons an
/// API server gives are shown to callers, and are not theirs to size.
pub(crate) fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// What went wrong asking the API server to create a `resource` review as
/// `who`, with what to do about the usual cause (`who`'s own RBAC).
pub(crate) fn review_failure(who: &str, resource: &str, err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => format!(
            "{who} may not create {resource} (HTTP {}: {}); grant its ServiceAccount `create` on {resource} in its ClusterRole",
            status.code, status.message
        ),
        kube::Error::Api(status) => format!("creating a {resource} answered HTTP {}: {}", status.code, status.message),
        other => format!("creating a {resource} failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    async fn answer(value: u32, ttl: u64) -> Fetched<u32> {
        Fetched { value, ttl: Some(Duration::from_secs(ttl)), refusal: false }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_reused_until_its_ttl_then_fetched_again() {
        let cache: Cache<&str, u32> = Cache::new(8);
        assert_eq!(cache.get_or_fetch(&"a", || answer(1, 10)).await, (1, Source::Fetched));
        assert_eq!(cache.get_or_fetch(&"a", || answer(2, 10)).await, (1, Source::Cache));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(cache.get_or_fetch(&"a", || answer(3, 10)).await, (3, Source::Fetched));
    }

    #[tokio::test]
    async fn an_answer_without_a_ttl_is_not_kept() {
        let cache: Cache<&str, u32> = Cache::new(8);
        let none = || async { Fetched { value: 1, ttl: None, refusal: false } };
        assert_eq!(cache.get_or_fetch(&"a", none).await.1, Source::Fetched);
        assert_eq!(cache.get_or_fetch(&"a", none).await.1, Source::Fetched);
        let zero = || async { Fetched { value: 1, ttl: Some(Duration::ZERO), refusal: false } };
        assert_eq!(cache.get_or_fetch(&"a", zero).await.1, Source::Fetched);
        assert_eq!(cache.get_or_fetch(&"a", zero).await.1, Source::Fetched);
        assert_eq!(cache.len(), (0, 0));
    }

    #[tokio::test]
    async fn the_oldest_insertion_is_evicted_at_the_bound() {
        let cache: Cache<u32, u32> = Cache::new(2);
        for key in [1, 2, 3] {
            cache.get_or_fetch(&key, || answer(key, 60)).await;
        }
        assert_eq!(cache.len(), (2, 0));
        assert_eq!(cache.get_or_fetch(&1, || answer(10, 60)).await, (10, Source::Fetched), "1 was the oldest");
        // 1 came back, evicting 2; 3 is still there.
        assert_eq!(cache.get_or_fetch(&3, || answer(30, 60)).await, (3, Source::Cache));
        assert_eq!(cache.get_or_fetch(&2, || answer(20, 60)).await, (20, Source::Fetched));
    }

    #[tokio::test]
    async fn refusals_never_evict_answers() {
        let cache: Cache<u32, u32> = Cache::new(2);
        cache.get_or_fetch(&1, || answer(1, 60)).await;
        cache.get_or_fetch(&2, || answer(2, 60)).await;
        for garbage in 100..200 {
            let refused =
                cache.get_or_fetch(&garbage, || async move { Fetched { value: 0, ttl: Some(Duration::from_secs(60)), refusal: true } });
            assert_eq!(refused.await, (0, Source::Fetched));
        }
        assert_eq!(cache.len(), (4, 0), "two answers and the two newest refusals");
        assert_eq!(cache.get_or_fetch(&1, || answer(10, 60)).await, (1, Source::Cache));
        assert_eq!(cache.get_or_fetch(&2, || answer(20, 60)).await, (2, Source::Cache));
        assert_eq!(cache.get_or_fetch(&199, || answer(9, 60)).await, (0, Source::Cache));
        assert_eq!(cache.get_or_fetch(&100, || answer(9, 60)).await, (9, Source::Fetched), "the oldest refusal was evicted");
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_fetch() {
        let cache: Arc<Cache<&str, u32>> = Arc::new(Cache::new(8));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let call = |cache: Arc<Cache<&'static str, u32>>| {
            let fetches = fetches.clone();
            let mut released = released.clone();
            async move {
                cache
                    .get_or_fetch(&"a", || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        let _ = released.wait_for(|r| *r).await;
                        Fetched { value: 7, ttl: Some(Duration::from_secs(60)), refusal: false }
                    })
                    .await
            }
        };
        let first = tokio::spawn(call(cache.clone()));
        let second = tokio::spawn(call(cache.clone()));
        // Both are parked on the one flight before it is released.
        while fetches.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.send_replace(true);
        assert_eq!(first.await.unwrap().0, 7);
        assert_eq!(second.await.unwrap().0, 7);
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_abandoned_fetch_leaves_nothing_behind() {
        let cache: Cache<&str, u32> = Cache::new(8);
        let stuck = cache.get_or_fetch(&"a", || async {
            std::future::pending::<()>().await;
            Fetched { value: 0, ttl: None, refusal: false }
        });
        // Poll it so it owns the flight, then drop it (its client left).
        assert!(tokio::time::timeout(Duration::from_millis(10), stuck).await.is_err());
        assert_eq!(cache.len(), (0, 0));
        assert_eq!(cache.get_or_fetch(&"a", || answer(5, 60)).await, (5, Source::Fetched));
    }

    #[tokio::test]
    async fn a_dropped_fetch_is_taken_over_by_a_waiting_caller() {
        let cache: Cache<&str, u32> = Cache::new(8);
        let leader = cache.get_or_fetch(&"a", || async {
            std::future::pending::<()>().await;
            Fetched { value: 0, ttl: None, refusal: false }
        });
        let follower = cache.get_or_fetch(&"a", || answer(5, 60));
        let mut leader = Box::pin(leader);
        let mut follower = Box::pin(follower);
        // Both join the flight; the leader owns the fetch.
        assert!(futures::poll!(leader.as_mut()).is_pending());
        assert!(futures::poll!(follower.as_mut()).is_pending());
        drop(leader);
        assert_eq!(follower.await, (5, Source::Fetched));
        assert_eq!(cache.get_or_fetch(&"a", || answer(6, 60)).await, (5, Source::Cache));
        assert_eq!(cache.len(), (1, 0));
    }
}
