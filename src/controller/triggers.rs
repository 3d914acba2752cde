//! How the controllers' watches back off after an error.
//!
//! kube-runtime's `Controller` backs off its merged trigger stream: an error
//! from any one of a controller's watches pauses all of them, and the pause
//! grows (to 30-60 s with jitter) until a reconcile request resets it. A
//! watch of a kind with no objects never makes one, so under a lossy API
//! server one flapping watch held every trigger of its controller for up to
//! a minute at a time: a new SkillPackage went unseen for over two minutes.
//!
//! Here each watch backs off by itself, reset by anything it delivers (its
//! relist's events included), and a controller's merged stream never waits.
//! So every trigger stream handed to [`controller`] must back off itself
//! (`.default_backoff()` on the watcher, before any filter).

use std::time::Duration;

use futures::Stream;
use kube::runtime::reflector::Store;
use kube::runtime::utils::Backoff;
use kube::runtime::{watcher, Controller};
use kube::Resource;

/// The merged trigger stream's backoff: none, as each watch has its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct EachWatchBacksOff;

impl Iterator for EachWatchBacksOff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for EachWatchBacksOff {
    fn reset(&mut self) {}
}

/// A controller of `K` woken by `triggers`, whose watches back off one by one.
pub fn controller<K>(triggers: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static, store: Store<K>) -> Controller<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + std::fmt::Debug + Unpin,
{
    Controller::for_stream(triggers, store).trigger_backoff(EachWatchBacksOff)
}

/// The objects of `api` as a trigger stream that backs off by itself.
pub fn touched<K>(api: kube::Api<K>, config: watcher::Config) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::WatchStreamExt as _;
    watcher(api, config).default_backoff().touched_objects()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::controller::Action;
    use kube::runtime::reflector::{self, reflector};
    use kube::runtime::watcher::Event;
    use kube::runtime::WatchStreamExt;
    use tokio::time::Instant;

    use super::*;

    type Build = fn(Box<dyn Stream<Item = Result<ConfigMap, watcher::Error>> + Send + Unpin>, Store<ConfigMap>) -> Controller<ConfigMap>;

    /// A ConfigMap appears 5 s in, while another watch of the same controller
    /// failed eight times in a row at the start: how long after its
    /// appearance the controller built by `build` reconciles it (virtual time).
    async fn first_reconcile_delay(build: Build) -> Duration {
        let appears = Instant::now() + Duration::from_secs(5);
        let (store, writer) = reflector::store::<ConfigMap>();
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("appears".into());
        cm.metadata.namespace = Some("default".into());
        // The first list (empty) makes the store ready, as a real watch's does.
        let listed = futures::stream::iter([Ok(Event::Init), Ok(Event::InitDone)]);
        let arrival = listed
            .chain(futures::stream::once(async move {
                tokio::time::sleep_until(appears).await;
                Ok(Event::Apply(cm))
            }))
            .chain(futures::stream::pending());
        let own = reflector(writer, arrival).default_backoff().applied_objects();
        let failing = futures::stream::iter((0..8).map(|_| Err(watcher::Error::NoResourceVersion)))
            .chain(futures::stream::pending::<Result<Event<ConfigMap>, watcher::Error>>())
            .touched_objects();
        let mut reconciled = std::pin::pin!(build(Box::new(own.boxed()), store)
            .watches_stream(failing, |cm: ConfigMap| Some(reflector::ObjectRef::from_obj(&cm)))
            .run(|_, _: Arc<()>| async { Ok::<_, std::io::Error>(Action::await_change()) }, |_, _, _| Action::await_change(), Arc::new(()))
            .filter_map(|item| std::future::ready(item.ok())));
        let within = Duration::from_secs(600);
        tokio::time::timeout(within, reconciled.next()).await.expect("never reconciled").expect("the controller ended");
        Instant::now() - appears
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_does_not_hold_back_another_watchs_objects() {
        let delay = first_reconcile_delay(controller).await;
        assert!(delay < Duration::from_millis(100), "reconciled {delay:?} after it appeared");
    }

    /// Why this module exists: with kube-runtime's own merged backoff the
    /// object waits for the end of the pause the other watch's errors put
    /// the whole controller in. Pauses of 0.8, 1.6 and 3.2 s (each up to
    /// twice that with jitter) put the third one over the 5 s mark: it ends
    /// 5.6 s in at the earliest.
    #[tokio::test(start_paused = true)]
    async fn kube_runtimes_merged_backoff_holds_every_watch_back() {
        let delay = first_reconcile_delay(Controller::for_stream).await;
        assert!(delay >= Duration::from_millis(600), "reconciled {delay:?} after it appeared");
    }
}
