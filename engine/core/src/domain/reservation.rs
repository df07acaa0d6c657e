//! A reservation — units taken from one bucket for one user — and its wire form on the bus
//! (DESIGN §5): `{"v":2,"reservation_id","activity_id","user_id","bucket","qty","reserved_at_ms",
//! "generation"}`. A v1 message (no `generation`) still decodes, as generation 0.
//!
//! Decoding is strict: an unknown version, a missing or extra field, a wrong type or a zero
//! quantity is an error naming the field, and such a message goes to the dead-letter topic.

use super::ids::{ActivityId, BucketNo, ReservationId, UserId};
use serde::{Deserialize, Serialize};

pub const ORDER_EVENT_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub id: ReservationId,
    pub activity: ActivityId,
    pub user: UserId,
    /// The bucket the units were taken from: where they go back on release.
    pub bucket: BucketNo,
    pub qty: u32,
    pub reserved_at_ms: u64,
    /// The activity's generation when the units were reserved (the gate's, DESIGN §11.3): the
    /// ledger refuses an order of an older generation than the registry's.
    pub generation: u64,
}

#[derive(Serialize)]
struct Wire {
    v: u32,
    reservation_id: ReservationId,
    activity_id: ActivityId,
    user_id: UserId,
    bucket: BucketNo,
    qty: u32,
    reserved_at_ms: u64,
    generation: u64,
}

const FIELDS: [&str; 8] = [
    "v",
    "reservation_id",
    "activity_id",
    "user_id",
    "bucket",
    "qty",
    "reserved_at_ms",
    "generation",
];

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed order event: {0}")]
pub struct DecodeError(pub String);

impl Reservation {
    /// The bus key: `A.b`, so one bucket's events stay in order on one partition.
    pub fn bus_key(&self) -> String {
        format!("{}.{}", self.activity, self.bucket)
    }

    pub fn encode(&self) -> Vec<u8> {
        let wire = Wire {
            v: ORDER_EVENT_VERSION,
            reservation_id: self.id,
            activity_id: self.activity,
            user_id: self.user,
            bucket: self.bucket,
            qty: self.qty,
            reserved_at_ms: self.reserved_at_ms,
            generation: self.generation,
        };
        serde_json::to_vec(&wire).expect("serializing plain numbers and strings cannot fail")
    }

    /// Field by field, so every error names its field (serde's own messages do not).
    pub fn decode(bytes: &[u8]) -> Result<Reservation, DecodeError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| DecodeError(format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| DecodeError("expected a JSON object".into()))?;
        if let Some(extra) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(DecodeError(format!("unknown field `{extra}`")));
        }
        let uint = |name: &'static str| -> Result<u64, DecodeError> {
            match obj.get(name) {
                None => Err(DecodeError(format!("missing field `{name}`"))),
                Some(v) => v.as_u64().ok_or_else(|| {
                    DecodeError(format!(
                        "field `{name}`: expected a non-negative integer, got {v}"
                    ))
                }),
            }
        };
        let small = |name: &'static str| -> Result<u32, DecodeError> {
            let n = uint(name)?;
            u32::try_from(n).map_err(|_| DecodeError(format!("field `{name}`: {n} is too large")))
        };
        // The version first, so a v2 message says "unsupported version", not "unknown field".
        let generation = match uint("v")? {
            1 if obj.contains_key("generation") => {
                return Err(DecodeError("unknown field `generation` (a v1 message)".into()))
            }
            1 => 0,
            2 => uint("generation")?,
            v => return Err(DecodeError(format!("field `v`: unsupported version {v}"))),
        };
        let id = match obj.get("reservation_id") {
            None => return Err(DecodeError("missing field `reservation_id`".into())),
            Some(serde_json::Value::String(s)) => s
                .parse()
                .map_err(|e| DecodeError(format!("field `reservation_id`: {e}")))?,
            Some(v) => {
                return Err(DecodeError(format!(
                    "field `reservation_id`: expected a string, got {v}"
                )))
            }
        };
        let qty = small("qty")?;
        if qty == 0 {
            return Err(DecodeError("field `qty`: must be at least 1".into()));
        }
        Ok(Reservation {
            id,
            activity: ActivityId(uint("activity_id")?),
            user: UserId(uint("user_id")?),
            bucket: BucketNo(small("bucket")?),
            qty,
            reserved_at_ms: uint("reserved_at_ms")?,
            generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Reservation {
        Reservation {
            id: ReservationId(0xabc),
            activity: ActivityId(3),
            user: UserId(77),
            bucket: BucketNo(5),
            qty: 1,
            reserved_at_ms: 1_700_000_000_000,
            generation: 4,
        }
    }

    #[test]
    fn round_trip_and_exact_wire_shape() {
        let r = sample();
        let bytes = r.encode();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"v":2,"reservation_id":"00000000000000000000000000000abc","activity_id":3,"user_id":77,"bucket":5,"qty":1,"reserved_at_ms":1700000000000,"generation":4}"#
        );
        assert_eq!(Reservation::decode(&bytes), Ok(r.clone()));
        assert_eq!(r.bus_key(), "3.5");
        // A v1 message (before generations) is generation 0.
        let v1 = r#"{"v":1,"reservation_id":"00000000000000000000000000000abc","activity_id":3,"user_id":77,"bucket":5,"qty":1,"reserved_at_ms":1700000000000}"#;
        assert_eq!(
            Reservation::decode(v1.as_bytes()),
            Ok(Reservation { generation: 0, ..r })
        );
    }

    #[test]
    fn bad_messages_name_their_field() {
        let good = String::from_utf8(sample().encode()).unwrap();
        let cases = [
            ("{", "not JSON"),
            (r#"{"reservation_id":"x"}"#, "`v`"),
            (&good.replace(r#""v":2"#, r#""v":3"#), "unsupported version 3"),
            (&good.replace(r#""v":2"#, r#""v":"2""#), "field `v`"),
            (
                &good.replace(r#","generation":4"#, ""),
                "missing field `generation`",
            ),
            (
                &good.replace(r#""v":2"#, r#""v":1"#),
                "unknown field `generation`",
            ),
            (
                &good.replace(r#""generation":4"#, r#""generation":-4"#),
                "field `generation`",
            ),
            (&good.replace(r#","qty":1"#, ""), "missing field `qty`"),
            (
                &good.replace(r#""qty":1"#, r#""qty":0"#),
                "field `qty`: must be at least 1",
            ),
            (&good.replace(r#""qty":1"#, r#""qty":-1"#), "field `qty`"),
            (
                &good.replace(r#""qty":1"#, r#""qty":4294967296"#),
                "field `qty`: 4294967296 is too large",
            ),
            (
                &good.replace(r#""user_id":77"#, r#""user_id":"77""#),
                "field `user_id`",
            ),
            (
                &good.replace(r#""bucket":5"#, r#""bucket":1.5"#),
                "field `bucket`",
            ),
            (
                &good.replace("abc\"", "abz\""),
                "field `reservation_id`: expected 32 lowercase hex",
            ),
            (
                &good.replace(r#""00000000000000000000000000000abc""#, "7"),
                "field `reservation_id`: expected a string",
            ),
            ("[1]", "expected a JSON object"),
            (&good.replace('}', r#","extra":1}"#), "unknown field `extra`"),
        ];
        for (input, expect) in cases {
            let err = Reservation::decode(input.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(expect), "{input}: {err}");
        }
    }
}
