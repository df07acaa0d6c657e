//! An activity: what is on sale, how much, when, and how the stock is split. An `Activity` can
//! only be built through validation, so every other layer may trust its fields.

use super::ids::ActivityId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The most buckets one activity may have: enough to spread a hot item over a large Redis
/// Cluster, few enough that a full audit reads every bucket quickly.
pub const MAX_BUCKETS: u32 = 1024;
/// The fallback share is a safety net for unlucky buckets, not a second sale: at most half.
pub const MAX_FALLBACK_PCT: u8 = 50;

/// The fields of an activity as given (by an admin, a config file, the demo's flags).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivitySpec {
    pub id: ActivityId,
    pub total_stock: u64,
    pub buckets: u32,
    pub fallback_pct: u8,
    pub per_user_limit: u32,
    pub start_ms: u64,
    pub end_ms: u64,
    pub pay_timeout_ms: u64,
    /// The price of one unit in the currency's minor unit (cents): what the payment provider's
    /// callback must say was paid for an order (its quantity times this). 0: free.
    #[serde(default)]
    pub unit_price_minor: u64,
}

/// A validated activity (deserializing validates too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ActivitySpec")]
pub struct Activity(ActivitySpec);

impl TryFrom<ActivitySpec> for Activity {
    type Error = InvalidField;

    fn try_from(spec: ActivitySpec) -> Result<Activity, InvalidField> {
        Activity::new(spec)
    }
}

/// A bad input, naming the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: &'static str,
    pub reason: String,
}

impl InvalidField {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        InvalidField {
            field,
            reason: reason.into(),
        }
    }
}

impl Activity {
    pub fn new(spec: ActivitySpec) -> Result<Activity, InvalidField> {
        if spec.total_stock < 1 {
            return Err(InvalidField::new("total_stock", "must be at least 1"));
        }
        if !(1..=MAX_BUCKETS).contains(&spec.buckets) {
            return Err(InvalidField::new(
                "buckets",
                format!("must be 1..={MAX_BUCKETS}, got {}", spec.buckets),
            ));
        }
        if spec.fallback_pct > MAX_FALLBACK_PCT {
            return Err(InvalidField::new(
                "fallback_pct",
                format!("must be 0..={MAX_FALLBACK_PCT}, got {}", spec.fallback_pct),
            ));
        }
        if spec.per_user_limit != 1 {
            return Err(InvalidField::new(
                "per_user_limit",
                format!(
                    "only 1 is supported (one order per user), got {}",
                    spec.per_user_limit
                ),
            ));
        }
        if spec.start_ms >= spec.end_ms {
            return Err(InvalidField::new(
                "end_ms",
                format!("must be after start_ms ({} >= {})", spec.start_ms, spec.end_ms),
            ));
        }
        if spec.pay_timeout_ms == 0 {
            return Err(InvalidField::new("pay_timeout_ms", "must be greater than 0"));
        }
        Ok(Activity(spec))
    }

    pub fn spec(&self) -> &ActivitySpec {
        &self.0
    }

    pub fn id(&self) -> ActivityId {
        self.0.id
    }

    /// Where `now_ms` falls relative to the sale window.
    pub fn window_at(&self, now_ms: u64) -> std::cmp::Ordering {
        if now_ms < self.0.start_ms {
            std::cmp::Ordering::Less
        } else if now_ms >= self.0.end_ms {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }
}

/// An activity's sale state. The registry holds the operator's intent (open / paused / closed);
/// a bucket's gate holds what the reserve obeys, which is also `recovering` during a recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActivityState {
    Open,
    Paused,
    Recovering,
    Closed,
}

impl ActivityState {
    pub fn as_str(self) -> &'static str {
        match self {
            ActivityState::Open => "open",
            ActivityState::Paused => "paused",
            ActivityState::Recovering => "recovering",
            ActivityState::Closed => "closed",
        }
    }

    pub fn parse(s: &str) -> Option<ActivityState> {
        Some(match s {
            "open" => ActivityState::Open,
            "paused" => ActivityState::Paused,
            "recovering" => ActivityState::Recovering,
            "closed" => ActivityState::Closed,
            _ => return None,
        })
    }
}

impl fmt::Display for ActivityState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec() -> ActivitySpec {
        ActivitySpec {
            id: ActivityId(1),
            total_stock: 1000,
            buckets: 32,
            fallback_pct: 10,
            per_user_limit: 1,
            start_ms: 1_000,
            end_ms: 2_000,
            pay_timeout_ms: 900_000,
            unit_price_minor: 0,
        }
    }

    #[test]
    fn every_bad_field_is_named() {
        type Mutation = fn(&mut ActivitySpec);
        let cases: Vec<(Mutation, &str)> = vec![
            (|s| s.total_stock = 0, "total_stock"),
            (|s| s.buckets = 0, "buckets"),
            (|s| s.buckets = 1025, "buckets"),
            (|s| s.fallback_pct = 51, "fallback_pct"),
            (|s| s.per_user_limit = 2, "per_user_limit"),
            (|s| s.per_user_limit = 0, "per_user_limit"),
            (|s| s.end_ms = s.start_ms, "end_ms"),
            (|s| s.pay_timeout_ms = 0, "pay_timeout_ms"),
        ];
        for (mutate, field) in cases {
            let mut s = spec();
            mutate(&mut s);
            assert_eq!(Activity::new(s).unwrap_err().field, field);
        }
        assert!(Activity::new(spec()).is_ok());
    }

    #[test]
    fn window_is_half_open() {
        let a = Activity::new(spec()).unwrap();
        assert_eq!(a.window_at(999), std::cmp::Ordering::Less);
        assert_eq!(a.window_at(1_000), std::cmp::Ordering::Equal);
        assert_eq!(a.window_at(2_000), std::cmp::Ordering::Greater);
    }
}
