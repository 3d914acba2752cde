use std::time::Duration;

use governor::clock::FakeRelativeClock;

use super::*;

fn limiter(config: RateLimits, cap: usize) -> (RateLimiter<FakeRelativeClock>, FakeRelativeClock) {
    let clock = FakeRelativeClock::default();
    (RateLimiter::with_clock(Policy::Limits(config), clock.clone(), cap), clock)
}

fn calls(per_minute: u32, burst: u32) -> RateLimits {
    RateLimits { calls_per_minute: per_minute, burst_calls: burst, ..RateLimits::default() }
}

#[test]
fn a_burst_of_n_allows_exactly_n_and_refuses_the_next_with_a_retry_time() {
    let (l, _clock) = limiter(calls(60, 5), 100);
    for i in 0..5 {
        assert_eq!(l.check_call("a"), Ok(()), "call {i} of the burst");
    }
    let err = l.check_call("a").unwrap_err();
    assert_eq!(err.limit(), Limit::Calls);
    assert!(matches!(err, Limited::Exhausted { .. }), "{err:?}");
    // 60 per minute: the next token comes in 1 s.
    assert_eq!(err.retry_after_secs(), 1);
    assert!(err.to_string().contains("retry after 1 s; the limit is 60 calls per minute for principal a"), "{err}");
}

#[test]
fn a_retry_time_below_a_second_is_rounded_up_and_a_long_one_is_whole_seconds() {
    let (l, clock) = limiter(calls(600, 1), 100);
    l.check_call("a").unwrap();
    clock.advance(Duration::from_millis(99));
    // 1 ms left: still says 1 s, never 0 (a client told 0 would spin).
    assert_eq!(l.check_call("a").unwrap_err().retry_after_secs(), 1);
    let (l, _clock) = limiter(calls(1, 1), 100);
    l.check_call("a").unwrap();
    assert_eq!(l.check_call("a").unwrap_err().retry_after_secs(), 60);
}

#[test]
fn a_bucket_refills_after_its_interval_and_not_before() {
    let (l, clock) = limiter(calls(60, 2), 100);
    l.check_call("a").unwrap();
    l.check_call("a").unwrap();
    assert!(l.check_call("a").is_err());
    clock.advance(Duration::from_millis(999));
    assert!(l.check_call("a").is_err(), "a token appeared early");
    clock.advance(Duration::from_millis(1));
    assert_eq!(l.check_call("a"), Ok(()), "one token after one interval");
    assert!(l.check_call("a").is_err(), "only one");
    clock.advance(Duration::from_secs(60));
    l.check_call("a").unwrap();
    l.check_call("a").unwrap();
    assert!(l.check_call("a").is_err(), "refilled to the burst, not beyond");
}

#[test]
fn runs_are_limited_independently_of_calls() {
    let config = RateLimits { calls_per_minute: 600, burst_calls: 100, runs_per_minute: 60, burst_runs: 1 };
    let (l, _clock) = limiter(config, 100);
    l.check_run("a").unwrap();
    let err = l.check_run("a").unwrap_err();
    assert_eq!(err.limit(), Limit::Runs);
    for _ in 0..50 {
        l.check_call("a").expect("an exhausted runs bucket leaves calls alone");
    }
    let (l, _clock) = limiter(calls(60, 1), 100);
    l.check_call("a").unwrap();
    assert!(l.check_call("a").is_err());
    for _ in 0..50 {
        l.check_run("a").expect("runs unlimited here");
    }
}

#[test]
fn one_principals_exhaustion_leaves_anothers_budget_untouched() {
    let (l, _clock) = limiter(calls(60, 3), 100);
    for _ in 0..3 {
        l.check_call("a").unwrap();
    }
    for _ in 0..10 {
        assert!(l.check_call("a").is_err());
    }
    for i in 0..3 {
        assert_eq!(l.check_call("b"), Ok(()), "b's call {i}");
    }
    assert!(l.check_call("b").is_err());
}

#[test]
fn the_principal_cap_refuses_a_newcomer_and_keeps_memory_bounded() {
    let (l, clock) = limiter(calls(60, 2), 3);
    for p in ["a", "b", "c"] {
        l.check_call(p).unwrap();
    }
    let err = l.check_call("d").unwrap_err();
    assert!(matches!(err, Limited::TooManyPrincipals { .. }), "fail closed: {err:?}");
    assert!(err.retry_after_secs() >= 1);
    assert_eq!(l.tracked().0, 3, "a refused newcomer takes no place");
    // Tracked principals keep their budget while the newcomer is refused.
    l.check_call("a").unwrap();
    // A flood of new principals never grows the map.
    for i in 0..1_000 {
        assert!(l.check_call(&format!("p{i}")).is_err());
    }
    assert_eq!(l.tracked().0, 3);
    // Once the tracked buckets have refilled they are swept and room is made.
    clock.advance(Duration::from_secs(3));
    assert_eq!(l.check_call("d"), Ok(()));
    assert!(l.tracked().0 <= 3, "{:?}", l.tracked());
}

#[test]
fn refilled_buckets_are_swept_periodically() {
    let (l, clock) = limiter(calls(6_000, 1), usize::MAX);
    for i in 0..100 {
        l.check_call(&format!("p{i}")).unwrap();
    }
    assert_eq!(l.tracked().0, 100);
    clock.advance(Duration::from_secs(1));
    for _ in 0..RATE_SWEEP_EVERY {
        let _ = l.check_call("steady");
    }
    assert!(l.tracked().0 <= 2, "idle principals still tracked: {:?}", l.tracked());
}

#[test]
fn unlimited_never_refuses_and_tracks_nothing() {
    let (l, _clock) = limiter(RateLimits::default(), 1);
    for i in 0..10_000 {
        l.check_call(&format!("p{}", i % 7)).unwrap();
        l.check_run("a").unwrap();
    }
    assert_eq!(l.tracked(), (0, 0));
    let l = RateLimiter::default();
    l.check_call("a").unwrap();
    l.check_run("a").unwrap();
}

#[test]
fn a_refusal_is_a_json_rpc_error_with_a_429_shape() {
    let (l, _clock) = limiter(calls(60, 1), 100);
    l.check_call("alice").unwrap();
    let err: McpError = l.check_call("alice").unwrap_err().into();
    assert_eq!(err.code, RATE_LIMITED);
    let data = err.data.expect("data");
    assert_eq!(data["status"], 429);
    assert_eq!(data["limit"], "calls");
    assert_eq!(data["principal"], "alice");
    assert_eq!(data["retryAfterSeconds"], 1);
    assert!(err.message.contains("retry after 1 s"), "{}", err.message);
}

#[test]
fn a_closed_policy_refuses_calls_and_runs_alike_with_its_reason() {
    let l = RateLimiter::with_clock(Policy::Closed("the figures are unknown".into()), FakeRelativeClock::default(), 100);
    let before = refusals().2;
    for (err, limit) in [(l.check_call("a").unwrap_err(), Limit::Calls), (l.check_run("a").unwrap_err(), Limit::Runs)] {
        assert_eq!(err.limit(), limit);
        assert!(matches!(&err, Limited::Unknown { reason, .. } if reason == "the figures are unknown"), "{err:?}");
        assert_eq!(err.retry_after_secs(), crate::core::limits::RATE_CLOSED_RETRY.as_secs());
    }
    assert!(refusals().2 >= before + 2, "counted as limit=\"unknown\"");
    assert_eq!(l.tracked(), (0, 0), "nothing tracked");
}
