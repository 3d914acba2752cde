//! Status conditions in the standard Kubernetes shape, and the helpers that
//! keep `lastTransitionTime` honest (it moves only when the status flips).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Set (or replace) a condition; the transition time changes only when the
/// status value changes.
pub fn set_condition(conditions: &mut Vec<Condition>, type_: &str, ok: bool, reason: &str, message: impl Into<String>, generation: Option<i64>) {
    let status = if ok { "True" } else { "False" }.to_string();
    let message = message.into();
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status != status {
            existing.last_transition_time = Time(Timestamp::now());
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
        last_transition_time: Time(Timestamp::now()),
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
    fn transition_time_moves_only_on_a_flip() {
        let mut c = Vec::new();
        set_condition(&mut c, "Ready", false, "Pending", "waiting", Some(1));
        let first = c[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        set_condition(&mut c, "Ready", false, "StillPending", "still", Some(2));
        assert_eq!(c[0].last_transition_time, first);
        assert_eq!((c[0].reason.as_str(), c[0].observed_generation), ("StillPending", Some(2)));
        set_condition(&mut c, "Ready", true, "Ready", "ok", Some(2));
        assert_ne!(c[0].last_transition_time, first);
        assert!(is_true(&c, "Ready"));
        assert_eq!(c.len(), 1);
    }
}
