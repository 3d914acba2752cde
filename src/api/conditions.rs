//! Status conditions in the standard Kubernetes shape, and the helpers that
//! keep `lastTransitionTime` honest (it moves only when the status flips).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Now, at the API's precision: `metav1.Time` keeps whole seconds, so a
/// time with nanoseconds never equals its stored copy, and every "has the
/// status changed?" check would say yes.
pub fn now() -> Time {
    let t = Timestamp::now();
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// How long ago `t` was by this machine's clock (zero for a time ahead of it).
pub fn age(t: &Time) -> std::time::Duration {
    std::time::Duration::try_from(Timestamp::now().duration_since(t.0)).unwrap_or_default()
}

/// Set (or replace) a condition; the transition time changes only when the
/// status value changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    set_condition_status(conditions, type_, Some(ok), reason, message, generation)
}

/// [`set_condition`] with `Unknown` for `None`.
pub fn set_condition_status(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: Option<bool>,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    let status = match ok {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    }
    .to_string();
    let message = message.into();
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status != status {
            existing.last_transition_time = now();
        }
        existing.status = status;
        existing.reason = reason.to_string();
        existing.message = message;
        existing.observed_generation = generation;
        return;
    }
    conditions.push(Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        last_transition_time: now(),
        observed_generation: generation,
    });
}

/// Whether a condition is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_survives_a_round_trip_through_json() {
        let t = now();
        let back: Time = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        assert_eq!(t.0.subsec_nanosecond(), 0);
    }

    #[test]
    fn transition_time_moves_only_on_a_flip() {
        let mut c = Vec::new();
        set_condition(&mut c, "Ready", false, "Pending", "waiting", Some(1));
        let first = c[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        set_condition(&mut c, "Ready", false, "StillPending", "still", Some(2));
        assert_eq!(c[0].last_transition_time, first);
        assert_eq!((c[0].reason.as_str(), c[0].observed_generation), ("StillPending", Some(2)));
        // Times have whole seconds: age the condition rather than sleep one.
        c[0].last_transition_time = Time(Timestamp::from_second(first.0.as_second() - 60).unwrap());
        set_condition(&mut c, "Ready", true, "Ready", "ok", Some(2));
        assert!(c[0].last_transition_time.0 >= first.0, "the flip did not move the transition time");
        assert!(is_true(&c, "Ready"));
        assert_eq!(c.len(), 1);
    }
}
