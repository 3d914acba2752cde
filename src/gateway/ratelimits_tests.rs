use std::collections::BTreeMap;

use kube::core::ObjectMeta;
use kube::runtime::reflector::store::Writer;

use super::*;
use crate::gateway::namespaces::testing::Trees;
use crate::gateway::namespaces::{Namespaces, ServiceOptions};
use crate::mcp::ratelimit::{Limited, Policy};

const FLAGS: RateLimits = RateLimits { calls_per_minute: 600, runs_per_minute: 60, burst_calls: 60, burst_runs: 10 };

#[test]
fn an_annotation_overrides_only_the_keys_it_gives() {
    assert_eq!(parse("", FLAGS), Ok(FLAGS));
    assert_eq!(parse("calls-per-minute=5", FLAGS), Ok(RateLimits { calls_per_minute: 5, ..FLAGS }));
    assert_eq!(
        parse(" calls-per-minute = 5 , burst-calls=1,runs-per-minute=0, burst-runs=2,", FLAGS),
        Ok(RateLimits { calls_per_minute: 5, burst_calls: 1, runs_per_minute: 0, burst_runs: 2 }),
        "spaces and a trailing comma are fine; 0 is unlimited, as for the flags"
    );
    assert_eq!(parse(&format!("calls-per-minute={}", u32::MAX), FLAGS).map(|l| l.calls_per_minute), Ok(u32::MAX));
}

#[test]
fn a_bad_annotation_says_what_is_wrong_with_it() {
    let err = |text: &str| parse(text, FLAGS).unwrap_err();
    assert_eq!(err("calls=5"), AnnotationError::UnknownKey("calls".into()));
    assert!(err("calls=5").to_string().contains("the keys are calls-per-minute, runs-per-minute, burst-calls, burst-runs"));
    assert_eq!(err("calls-per-minute"), AnnotationError::NotPair("calls-per-minute".into()));
    assert_eq!(err("burst-runs=1,burst-runs=2"), AnnotationError::Twice("burst-runs".into()));
    for value in ["-1", "+5", "5.0", "1e3", "", "five", &(u64::from(u32::MAX) + 1).to_string()] {
        assert_eq!(
            err(&format!("runs-per-minute={value}")),
            AnnotationError::NotANumber { key: "runs-per-minute".into(), value: value.into() },
            "{value}"
        );
    }
    let at_cap = format!("calls-per-minute=5{}", " ".repeat(RATE_LIMITS_ANNOTATION_MAX - 18));
    assert_eq!(at_cap.len(), RATE_LIMITS_ANNOTATION_MAX);
    assert!(parse(&at_cap, FLAGS).is_ok(), "the cap itself is read");
    let over = format!("{at_cap} ");
    assert_eq!(err(&over), AnnotationError::TooLong { len: RATE_LIMITS_ANNOTATION_MAX + 1, max: RATE_LIMITS_ANNOTATION_MAX });
}

fn namespace(name: &str, annotation: Option<&str>) -> PartialObjectMeta<Namespace> {
    let annotations = annotation.map(|a| BTreeMap::from([(ANNOTATION.to_string(), a.to_string())]));
    PartialObjectMeta { metadata: ObjectMeta { name: Some(name.into()), annotations, ..Default::default() }, ..Default::default() }
}

/// Limits reading a store this test fills, as the watch would.
fn reading(unreadable: Unreadable, namespaces: &[PartialObjectMeta<Namespace>]) -> (NamespaceLimits, Writer<PartialObjectMeta<Namespace>>) {
    let mut writer = Writer::default();
    writer.apply_watcher_event(&watcher::Event::Init);
    for ns in namespaces {
        writer.apply_watcher_event(&watcher::Event::InitApply(ns.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (NamespaceLimits::reading(FLAGS, unreadable, writer.as_reader()), writer)
}

fn closed_reason(policy: Policy) -> String {
    match policy {
        Policy::Closed(reason) => reason,
        other => panic!("expected closed, got {other:?}"),
    }
}

#[test]
fn each_namespace_gets_its_own_annotation_or_the_flags() {
    let (limits, _writer) =
        reading(Unreadable::Closed, &[namespace("strict", Some("calls-per-minute=6,burst-calls=1")), namespace("plain", None)]);
    assert_eq!(limits.policy("strict"), Policy::Limits(RateLimits { calls_per_minute: 6, burst_calls: 1, ..FLAGS }));
    assert_eq!(limits.policy("plain"), Policy::Limits(FLAGS), "another namespace's annotation does not reach it");
    assert_eq!(NamespaceLimits::fixed(FLAGS).policy("strict"), Policy::Limits(FLAGS), "annotations are read only when asked");
}

#[test]
fn closed_refuses_an_unknown_namespace_and_a_bad_annotation_open_applies_the_flags() {
    let namespaces = [namespace("typo", Some("calls-per-minut=6"))];
    let (closed, _w) = reading(Unreadable::Closed, &namespaces);
    let reason = closed_reason(closed.policy("typo"));
    assert!(
        reason.contains("the annotation skill-operator.dev/rate-limits of namespace `typo` has the unknown key `calls-per-minut`"),
        "{reason}"
    );
    assert!(reason.contains("kubectl annotate namespace typo --overwrite"), "{reason}");
    let reason = closed_reason(closed.policy("new"));
    assert!(reason.contains("has not seen namespace `new` yet"), "{reason}");

    let (open, _w) = reading(Unreadable::Open, &namespaces);
    assert_eq!(open.policy("typo"), Policy::Limits(FLAGS));
    assert_eq!(open.policy("new"), Policy::Limits(FLAGS));
}

#[tokio::test(start_paused = true)]
async fn a_watch_failing_past_its_grace_closes_every_namespace_until_it_answers() {
    let (limits, _w) = reading(Unreadable::Closed, &[namespace("team", Some("calls-per-minute=6"))]);
    let team = Policy::Limits(RateLimits { calls_per_minute: 6, ..FLAGS });
    limits.watch_failed("403 Forbidden");
    tokio::time::advance(RATE_NAMESPACE_STALE_AFTER - std::time::Duration::from_millis(1)).await;
    limits.watch_failed("403 Forbidden, again");
    assert_eq!(limits.policy("team"), team, "within the grace the last figures hold (a later error does not restart it)");
    tokio::time::advance(std::time::Duration::from_millis(1)).await;
    let reason = closed_reason(limits.policy("team"));
    assert!(reason.contains("has not been able to watch Namespaces for 30 s (403 Forbidden, again)"), "{reason}");
    assert!(reason.contains("list and watch namespaces"), "{reason}");
    limits.watch_answered();
    assert_eq!(limits.policy("team"), team);

    let (open, _w) = reading(Unreadable::Open, &[namespace("team", Some("calls-per-minute=6"))]);
    open.watch_failed("connection refused");
    tokio::time::advance(RATE_NAMESPACE_STALE_AFTER).await;
    assert_eq!(open.policy("team"), Policy::Limits(FLAGS), "open: the flags' figures, not the last annotation's");
}

/// A served namespace follows its annotation through [`drive`]: a change
/// takes effect (fresh buckets), an unchanged re-read keeps the buckets, a
/// closed namespace refuses with data.status 503, and nothing reaches a
/// namespace whose annotation did not change.
#[tokio::test]
async fn drive_keeps_served_namespaces_on_their_policy() {
    let mut writer = Writer::default();
    let store = writer.as_reader();
    let limits = Arc::new(NamespaceLimits::reading(FLAGS, Unreadable::Closed, store));
    let trees = Arc::new(Trees::default());
    trees.put("team", &["one"]);
    trees.put("other", &["two"]);
    let options = ServiceOptions {
        http: Default::default(),
        max_sessions: 4,
        max_namespaces: 4,
        rate_limits: limits.clone(),
        audit: Default::default(),
    };
    let served = Arc::new(Namespaces::new(trees, options));
    let (team, other) = (served.get("team").await.unwrap(), served.get("other").await.unwrap());
    assert!(matches!(team.state.rate_limits.current().policy(), Policy::Closed(_)), "not listed yet: closed");

    let (tx, rx) = futures::channel::mpsc::unbounded();
    let shutdown = Shutdown::default();
    let applying = served.clone();
    let driving = tokio::spawn(drive(rx, limits.clone(), move |which| applying.apply_rate_limits(which), shutdown.clone()));
    let send = |writer: &mut Writer<_>, event: watcher::Event<PartialObjectMeta<Namespace>>| {
        writer.apply_watcher_event(&event);
        tx.unbounded_send(Ok(event)).unwrap();
    };
    send(&mut writer, watcher::Event::Init);
    send(&mut writer, watcher::Event::InitApply(namespace("team", Some("calls-per-minute=60,burst-calls=2"))));
    send(&mut writer, watcher::Event::InitApply(namespace("other", None)));
    send(&mut writer, watcher::Event::InitDone);
    let strict = Policy::Limits(RateLimits { calls_per_minute: 60, burst_calls: 2, ..FLAGS });
    wait_for(|| *team.state.rate_limits.current().policy() == strict).await;
    wait_for(|| *other.state.rate_limits.current().policy() == Policy::Limits(FLAGS)).await;

    team.state.rate_limits.check_call("alice").unwrap();
    team.state.rate_limits.check_call("alice").unwrap();
    assert!(matches!(team.state.rate_limits.check_call("alice"), Err(Limited::Exhausted { .. })), "the annotation's burst of 2");
    // The same figures again (a resync, another annotation changed): the empty bucket stays empty.
    send(&mut writer, watcher::Event::Apply(namespace("team", Some("burst-calls=2, calls-per-minute=60"))));
    send(&mut writer, watcher::Event::Apply(namespace("other", Some("calls-per-minute=1,burst-calls=1"))));
    wait_for(|| matches!(other.state.rate_limits.current().policy(), Policy::Limits(l) if l.calls_per_minute == 1)).await;
    assert!(team.state.rate_limits.check_call("alice").is_err(), "an unchanged policy keeps its buckets");

    // A typo: closed, with the reason, as JSON-RPC -32029 and data.status 503.
    send(&mut writer, watcher::Event::Apply(namespace("team", Some("calls-per-minute=sixty"))));
    wait_for(|| matches!(team.state.rate_limits.current().policy(), Policy::Closed(_))).await;
    let refused = team.state.rate_limits.check_call("bob").unwrap_err();
    assert_eq!(refused.retry_after_secs(), crate::core::limits::RATE_CLOSED_RETRY.as_secs());
    let err = rmcp::ErrorData::from(refused);
    assert_eq!(err.code, crate::mcp::ratelimit::RATE_LIMITED);
    assert!(err.message.contains("fail closed") && err.message.contains("`calls-per-minute=sixty`"), "{}", err.message);
    assert_eq!(err.data.as_ref().unwrap()["status"], 503);
    assert_eq!(err.data.as_ref().unwrap()["retryAfterSeconds"], crate::core::limits::RATE_CLOSED_RETRY.as_secs());

    // Corrected: new figures, fresh buckets.
    send(&mut writer, watcher::Event::Apply(namespace("team", Some("calls-per-minute=60,burst-calls=3"))));
    wait_for(|| matches!(team.state.rate_limits.current().policy(), Policy::Limits(l) if l.burst_calls == 3)).await;
    for _ in 0..3 {
        team.state.rate_limits.check_call("alice").unwrap();
    }
    assert!(team.state.rate_limits.check_call("alice").is_err());
    shutdown.trigger();
    driving.await.unwrap();
}

async fn wait_for(mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("never reached");
}
