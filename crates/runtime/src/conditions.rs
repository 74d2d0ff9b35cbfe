//! `metav1.Condition` arithmetic: set a condition without moving `lastTransitionTime` unless the
//! status flips, and compare condition lists while ignoring timestamps (so a status write is
//! skipped when nothing changed).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `True`, `False` or `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It is not known whether the condition holds.
    Unknown,
}

impl Status {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// `True` for `true`, `False` otherwise.
    pub fn from_bool(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// Sets condition `type_` in `conditions`. `lastTransitionTime` becomes `now` only when the
/// condition is new or its status changes; reason, message and observed generation are always
/// updated. Returns true when anything changed (a status write is needed).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) -> bool {
    let status = status.as_str();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status
                || c.reason != reason
                || c.message != message
                || c.observed_generation != observed_generation;
            if c.status != status {
                c.last_transition_time = now;
                c.status = status.into();
            }
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                observed_generation,
                last_transition_time: now,
            });
            true
        }
    }
}

/// The condition of this type, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of this type is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Removes the condition of this type; returns true when one was removed.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// The current time as a `metav1.Time`.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut c = Vec::new();
        assert!(set(
            &mut c,
            "Ready",
            Status::False,
            "WaitingForHost",
            "no host",
            Some(1),
            t(10)
        ));
        assert_eq!(c[0].last_transition_time, t(10));
        // Same status, new reason: changed, but the transition time stays.
        assert!(set(
            &mut c,
            "Ready",
            Status::False,
            "NoMatchingHost",
            "none match",
            Some(1),
            t(20)
        ));
        assert_eq!(c[0].last_transition_time, t(10));
        assert_eq!(c[0].reason, "NoMatchingHost");
        // Nothing new: no change reported, nothing moves.
        assert!(!set(
            &mut c,
            "Ready",
            Status::False,
            "NoMatchingHost",
            "none match",
            Some(1),
            t(30)
        ));
        assert_eq!(c[0].last_transition_time, t(10));
        // Flip: the transition time moves.
        assert!(set(
            &mut c,
            "Ready",
            Status::True,
            "Provisioned",
            "",
            Some(2),
            t(40)
        ));
        assert_eq!(c[0].last_transition_time, t(40));
        assert!(is_true(&c, "Ready"));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn several_types_and_removal() {
        let mut c = Vec::new();
        set(&mut c, "A", Status::True, "R", "", None, t(1));
        set(&mut c, "B", Status::Unknown, "R", "", None, t(1));
        assert!(is_true(&c, "A") && !is_true(&c, "B") && !is_true(&c, "C"));
        assert!(remove(&mut c, "A"));
        assert!(!remove(&mut c, "A"));
        assert_eq!(c.len(), 1);
    }
}
