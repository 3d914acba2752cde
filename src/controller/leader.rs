//! Leader election on a `coordination.k8s.io/v1` Lease, so that several
//! controller replicas run with exactly one of them writing.
//!
//! Why our own and not a crate: kube-runtime has none, and the one crate that
//! follows kube 5 (kube-lease-manager) decides expiry by adding the holder's
//! `renewTime` to the reader's wall clock and takes the lease with apply
//! patches. A holder whose clock runs an hour behind then loses its lease to
//! every standby, and one an hour ahead keeps it for an hour after it died.
//! Here, as in client-go:
//! - a candidate takes the lease only when the lease has stayed *unchanged*
//!   (the same resourceVersion) for its whole duration, timed by the
//!   candidate's own monotonic clock, so no two clocks are ever compared;
//! - every write is a replace guarded by the resourceVersion that was read,
//!   so of two candidates racing for a free lease exactly one wins;
//! - the leader gives up when it has not renewed within `renew_deadline`
//!   (shorter than the duration), counted from the *start* of its last
//!   successful renewal, so it has stopped before any standby can see the
//!   lease as expired; the process then exits (nothing in flight writes on);
//! - on shutdown the leader clears the holder once its controllers have
//!   stopped, and a standby takes over at its next retry.
//!
//! Standbys run every watch and fill every cache; their reconcilers wait at
//! [`Leadership::wait_turn`] until this replica leads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use tokio::sync::watch;

/// The election's settings; the defaults are client-go's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per process: a restarted pod is a new candidate.
    pub identity: String,
    /// How long a lease must stay unchanged before another candidate takes it.
    pub duration: Duration,
    /// How long the leader keeps going without a successful renewal.
    pub renew_deadline: Duration,
    /// The pause between attempts (acquiring and renewing).
    pub retry_period: Duration,
}

pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "leader election timings: need retry period ({retry:?}) < renew deadline ({renew:?}) < lease duration ({duration:?}), \
         so a leader gives up before a standby may take over; fix the --leader-elect-* flags"
    )]
    Timings { retry: Duration, renew: Duration, duration: Duration },
    #[error("leader election: the lease duration must be whole seconds from 1 to 3600 (it is written as leaseDurationSeconds), not {0:?}")]
    Duration(Duration),
    #[error("leader election: --leader-elect-lease-name and the namespace must not be empty")]
    Name,
    #[error(
        "lost the leader lease {namespace}/{name} ({why}); exiting so that no write of this replica follows the new leader's \
         (the pod restarts as a standby)"
    )]
    Lost { namespace: String, name: String, why: String },
}

impl LeaseConfig {
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return Err(LeaderError::Name);
        }
        let secs = self.duration.as_secs();
        if self.duration.subsec_nanos() != 0 || !(1..=3600).contains(&secs) {
            return Err(LeaderError::Duration(self.duration));
        }
        if !(self.retry_period < self.renew_deadline && self.renew_deadline < self.duration) || self.retry_period.is_zero() {
            return Err(LeaderError::Timings { retry: self.retry_period, renew: self.renew_deadline, duration: self.duration });
        }
        Ok(())
    }
}

/// A process-unique candidate name: the pod's name (or host name) and a
/// random suffix, so a restarted pod never mistakes the old lease for its own.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "controller".to_string());
    format!("{host}_{}", uuid::Uuid::new_v4().simple())
}

/// Whether this replica may write, shared by every reconciler.
#[derive(Clone, Debug)]
pub struct Leadership {
    tx: Arc<watch::Sender<bool>>,
    /// How many times this replica has started leading: what it learnt
    /// while leading before may have been undone by another leader since.
    term: Arc<std::sync::atomic::AtomicU64>,
}

impl Leadership {
    /// Leading from the start: one replica, no election.
    pub fn always() -> Leadership {
        Leadership { tx: Arc::new(watch::Sender::new(true)), term: Arc::new(1.into()) }
    }

    /// A standby until an [`Elector`] made with it wins the lease.
    pub fn standby() -> Leadership {
        Leadership { tx: Arc::new(watch::Sender::new(false)), term: Default::default() }
    }

    pub fn is_leading(&self) -> bool {
        *self.tx.borrow()
    }

    /// Every change from standby to leader and back.
    pub fn changes(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    pub async fn until_leading(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|leading| *leading).await;
    }

    /// The first line of every reconciler: `None` when it may go on; on a
    /// standby, waits until this replica leads and then asks for a fresh
    /// reconcile (the object it was handed may be old by then).
    pub async fn wait_turn(&self) -> Option<Action> {
        if self.is_leading() {
            return None;
        }
        self.until_leading().await;
        Some(Action::requeue(Duration::ZERO))
    }

    /// Which stretch of leading this is (0: never led). Memories a
    /// reconciler keeps of what it wrote are good for one term only.
    pub fn term(&self) -> u64 {
        self.term.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set(&self, leading: bool) {
        // The term moves before anyone hears of the lead, so nothing kept
        // from an earlier term is trusted in the new one.
        if leading && !self.is_leading() {
            self.term.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.tx.send_replace(leading);
    }
}

/// What one look at the lease decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Another candidate holds a live lease.
    Wait { holder: String },
    /// Free, expired or ours: write it.
    Write,
}

/// The rule, apart from the API: `unchanged_for` is how long this
/// candidate has seen the lease's current version, by its own clock.
pub fn decide(holder: Option<&str>, me: &str, unchanged_for: Duration, lease_duration: Duration) -> Step {
    match holder.filter(|h| !h.is_empty()) {
        Some(h) if h != me && unchanged_for < lease_duration => Step::Wait { holder: h.to_string() },
        _ => Step::Write,
    }
}

/// The outcome of one attempt.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Held,
    Other(String),
    /// Someone wrote between our read and our write; look again.
    Raced,
}

/// Ends how the election ended.
#[derive(Debug)]
pub enum Ended {
    /// Stopped by the caller while leading or waiting; [`Elector::release`]
    /// hands the lease over.
    Stopped(Box<Elector>),
    /// Lost while leading: the caller must stop writing at once.
    Lost(LeaderError),
}

pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    leadership: Leadership,
    /// The version last seen and when it was first seen.
    seen: Option<(String, Instant)>,
    /// Times this replica went from standby to leader.
    pub acquired: u64,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector").field("config", &self.config).field("acquired", &self.acquired).finish()
    }
}

impl Elector {
    /// `client` should be the election's own (its own connections), so
    /// renewals never queue behind reconcile traffic.
    pub fn new(client: kube::Client, config: LeaseConfig, leadership: Leadership) -> Result<Elector, LeaderError> {
        config.validate()?;
        Ok(Elector { api: Api::namespaced(client, &config.namespace), config, leadership, seen: None, acquired: 0 })
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Campaigns, then renews, until `stop` resolves (then [`Ended::Stopped`])
    /// or the lease is lost (then [`Ended::Lost`], with leadership already
    /// withdrawn).
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) -> Ended {
        tokio::pin!(stop);
        // Campaign.
        loop {
            match self.attempt().await {
                Ok(Attempt::Held) => break,
                Ok(Attempt::Other(holder)) => tracing::debug!(%holder, lease = %self.config.name, "standing by"),
                Ok(Attempt::Raced) => tracing::debug!(lease = %self.config.name, "lost a race for the lease"),
                Err(err) => tracing::warn!(lease = %self.config.name, error = %err, "cannot read or write the leader lease"),
            }
            tokio::select! {
                _ = &mut stop => return Ended::Stopped(Box::new(self)),
                _ = tokio::time::sleep(jittered(self.config.retry_period)) => {}
            }
        }
        let mut renewed = Instant::now();
        self.acquired += 1;
        self.leadership.set(true);
        tracing::info!(identity = %self.config.identity, lease = %format!("{}/{}", self.config.namespace, self.config.name), "leading");

        // Renew.
        loop {
            tokio::select! {
                _ = &mut stop => return Ended::Stopped(Box::new(self)),
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let started = Instant::now();
            let left = self.config.renew_deadline.saturating_sub(renewed.elapsed());
            let why = match tokio::time::timeout(left, self.attempt()).await {
                Ok(Ok(Attempt::Held)) => {
                    renewed = started;
                    continue;
                }
                Ok(Ok(Attempt::Other(holder))) => Some(format!("{holder} holds it now")),
                Ok(Ok(Attempt::Raced)) => None,
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "renewing the leader lease failed");
                    None
                }
                Err(_) => None,
            };
            let why = why.or_else(|| {
                (renewed.elapsed() >= self.config.renew_deadline)
                    .then(|| format!("not renewed for {:?}, the renew deadline", self.config.renew_deadline))
            });
            if let Some(why) = why {
                self.leadership.set(false);
                return Ended::Lost(LeaderError::Lost { namespace: self.config.namespace.clone(), name: self.config.name.clone(), why });
            }
        }
    }

    /// Clears the holder, if it is still us, so a standby takes over at its
    /// next look instead of after the lease duration. Call it only when
    /// nothing of this replica writes any more.
    pub async fn release(mut self: Box<Self>) {
        self.leadership.set(false);
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else { return };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.acquire_time = None;
        // A candidate that reads the lease as it goes still waits at most this.
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = %self.config.name, "released the leader lease"),
            Err(err) => tracing::warn!(error = %err, "could not release the leader lease; a standby takes over when it expires"),
        }
        self.seen = None;
    }

    /// One look and, where [`decide`] says so, one guarded write.
    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        let now = Instant::now();
        let me = self.config.identity.clone();
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.config.name.clone()), ..Default::default() },
                spec: Some(self.spec_for(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(made) => {
                    self.seen = made.metadata.resource_version.map(|v| (v, now));
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Raced),
                Err(err) => Err(err),
            };
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let since = match &self.seen {
            Some((v, at)) if *v == version => *at,
            _ => {
                self.seen = Some((version, now));
                now
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        // The holder's own duration: it promised to renew within it.
        let duration =
            spec.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()).map(Duration::from_secs).unwrap_or(self.config.duration);
        if let Step::Wait { holder } = decide(spec.holder_identity.as_deref(), &me, now.duration_since(since), duration) {
            return Ok(Attempt::Other(holder));
        }
        lease.spec = Some(self.spec_for(Some(&spec)));
        // `lease` keeps the resourceVersion just read: a write in between fails with 409.
        match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            Ok(written) => {
                self.seen = written.metadata.resource_version.map(|v| (v, now));
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Raced),
            Err(err) => Err(err),
        }
    }

    fn spec_for(&self, old: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let ours = old.is_some_and(|o| o.holder_identity.as_deref() == Some(self.config.identity.as_str()));
        let transitions = old.and_then(|o| o.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            // Validated to 1..=3600 seconds.
            lease_duration_seconds: Some(self.config.duration.as_secs() as i32),
            acquire_time: if ours { old.and_then(|o| o.acquire_time.clone()) } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(if ours || old.is_none() { transitions } else { transitions + 1 }),
            ..Default::default()
        }
    }
}

/// Up to 20% more than `d`, so candidates that started together do not
/// keep colliding.
fn jittered(d: Duration) -> Duration {
    let extra = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 200 / 255;
    d + d * extra as u32 / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_live_lease_of_another_is_waited_for_until_unchanged_for_its_duration() {
        let d = 15 * SEC;
        assert_eq!(decide(Some("b"), "a", 14 * SEC, d), Step::Wait { holder: "b".into() });
        assert_eq!(decide(Some("b"), "a", d, d), Step::Write, "unchanged for the whole duration: expired");
        assert_eq!(decide(Some("a"), "a", Duration::ZERO, d), Step::Write, "ours: renew");
        assert_eq!(decide(None, "a", Duration::ZERO, d), Step::Write, "free");
        assert_eq!(decide(Some(""), "a", Duration::ZERO, d), Step::Write, "released");
    }

    #[test]
    fn timings_must_let_the_leader_stop_before_a_standby_starts() {
        let ok = LeaseConfig::new("ns", "lease", "me");
        assert!(ok.validate().is_ok());
        for (retry, renew, duration) in [(2, 15, 15), (10, 10, 15), (2, 20, 15), (0, 10, 15)] {
            let c = LeaseConfig { retry_period: retry * SEC, renew_deadline: renew * SEC, duration: duration * SEC, ..ok.clone() };
            let err = c.validate().unwrap_err();
            assert!(matches!(err, LeaderError::Timings { .. }), "{retry} {renew} {duration}: {err}");
            assert!(err.to_string().contains("--leader-elect"), "{err}");
        }
        let fractional = LeaseConfig { duration: Duration::from_millis(15_500), ..ok.clone() };
        assert!(matches!(fractional.validate(), Err(LeaderError::Duration(_))));
        let huge = LeaseConfig { duration: 3601 * SEC, renew_deadline: 10 * SEC, ..ok.clone() };
        assert!(matches!(huge.validate(), Err(LeaderError::Duration(_))));
        let nameless = LeaseConfig { name: String::new(), ..ok };
        assert!(matches!(nameless.validate(), Err(LeaderError::Name)));
    }

    #[test]
    fn identities_are_unique_per_process_start() {
        assert_ne!(identity(), identity());
    }

    #[tokio::test]
    async fn a_standby_reconcile_waits_for_leadership_then_asks_again() {
        let leadership = Leadership::standby();
        let waiting = tokio::spawn({
            let l = leadership.clone();
            async move { l.wait_turn().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a standby reconciled");
        leadership.set(true);
        assert_eq!(waiting.await.unwrap(), Some(Action::requeue(Duration::ZERO)));
        assert_eq!(Leadership::always().wait_turn().await, None);
    }

    #[test]
    fn each_stretch_of_leading_is_a_new_term() {
        let l = Leadership::standby();
        assert_eq!(l.term(), 0);
        l.set(true);
        assert_eq!(l.term(), 1);
        l.set(true);
        assert_eq!(l.term(), 1, "a renewal is the same term");
        l.set(false);
        assert_eq!(l.term(), 1);
        l.set(true);
        assert_eq!(l.term(), 2, "leading again after a loss must not trust the first term's memories");
        assert_eq!(Leadership::always().term(), 1);
    }
}
