//! Newtype ids. Each displays the way it appears in keys, messages and logs, and parses back
//! from exactly that form.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! numeric_id {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl FromStr for $name {
            type Err = std::num::ParseIntError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse().map($name)
            }
        }
    };
}

numeric_id!(
    /// A flash-sale activity (one product on sale in one window).
    ActivityId(u64)
);
numeric_id!(
    /// A buyer. Routing to a bucket is a function of this id alone.
    UserId(u64)
);
numeric_id!(
    /// A stock bucket of one activity: `0..n` are business buckets, `n` is the fallback.
    BucketNo(u32)
);

/// One reservation (one purchase attempt that took stock). 128 bits, shown as 32 lowercase hex
/// digits: the idempotency key of the whole pipeline, from Redis through the bus to the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReservationId(pub u128);

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl FromStr for ReservationId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32
            || !s
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        {
            return Err(format!("expected 32 lowercase hex digits, got {s:?}"));
        }
        u128::from_str_radix(s, 16)
            .map(ReservationId)
            .map_err(|e| e.to_string())
    }
}

impl Serialize for ReservationId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ReservationId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_id_round_trips_and_rejects_other_forms() {
        let id = ReservationId(0xdead_beef);
        let s = id.to_string();
        assert_eq!(s, "000000000000000000000000deadbeef");
        assert_eq!(s.parse::<ReservationId>(), Ok(id));
        assert!("DEADBEEF000000000000000000000000"
            .parse::<ReservationId>()
            .is_err());
        assert!("abc".parse::<ReservationId>().is_err());
        assert!("+00000000000000000000000deadbeef"
            .parse::<ReservationId>()
            .is_err());
    }
}
