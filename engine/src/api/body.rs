//! Request bodies, decoded by hand from JSON so that every refusal names its field: not JSON,
//! not an object, a missing field, an unknown field, a wrong type, a negative or out-of-range
//! number. Nothing here touches a store; a body that does not decode never reaches one.

use crate::domain::{ActivityId, ActivitySpec};
use serde_json::{Map, Value};

/// A refused input: the field it came from (`body` for the body as a whole) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

pub fn field_error(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_string(),
        message: message.into(),
    }
}

/// The body as a JSON object whose keys are all in `allowed`.
fn object(bytes: &[u8], allowed: &[&str]) -> Result<Map<String, Value>, FieldError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| field_error("body", format!("not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(field_error("body", "must be a JSON object"));
    };
    if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        // A key is echoed back as the field only if it reads as one (found by the fuzzer: `{"": 1}`).
        let readable = !unknown.is_empty() && unknown.len() <= 64 && !unknown.chars().any(char::is_control);
        return Err(if readable {
            field_error(unknown, "unknown field")
        } else {
            let shown: String = unknown.chars().take(64).collect();
            field_error("body", format!("unknown field {shown:?}"))
        });
    }
    Ok(map)
}

fn u64_field(
    map: &Map<String, Value>,
    name: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>, FieldError> {
    // An optional field given as null is absent.
    let Some(v) = map.get(name).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let n = match v {
        Value::Number(n) => n.as_u64().ok_or_else(|| {
            field_error(
                name,
                format!(
                    "must be a whole number in {}..={}, got {n}",
                    range.start(),
                    range.end()
                ),
            )
        })?,
        other => {
            return Err(field_error(
                name,
                format!("must be a number, got {}", kind(other)),
            ))
        }
    };
    if !range.contains(&n) {
        return Err(field_error(
            name,
            format!("must be in {}..={}, got {n}", range.start(), range.end()),
        ));
    }
    Ok(Some(n))
}

fn required_u64(
    map: &Map<String, Value>,
    name: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, FieldError> {
    u64_field(map, name, range)?.ok_or_else(|| field_error(name, "missing"))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// User ids are positive 63-bit integers (they travel through MySQL BIGINT and JSON safely).
const USER_IDS: std::ops::RangeInclusive<u64> = 1..=i64::MAX as u64;

/// `POST /api/v1/activities/{id}/token`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    pub user_id: u64,
}

/// The common case — a well-formed body — decoded straight into its struct (no map); anything
/// else goes through the field-by-field decoder, which accepts the same bodies and names the
/// field of the others.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FastToken {
    user_id: u64,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FastPurchase {
    user_id: u64,
    token: String,
    qty: Option<u64>,
}

pub fn token_request(bytes: &[u8]) -> Result<TokenRequest, FieldError> {
    if let Ok(f) = serde_json::from_slice::<FastToken>(bytes) {
        if USER_IDS.contains(&f.user_id) {
            return Ok(TokenRequest { user_id: f.user_id });
        }
    }
    let map = object(bytes, &["user_id"])?;
    Ok(TokenRequest {
        user_id: required_u64(&map, "user_id", USER_IDS)?,
    })
}

/// `POST /api/v1/activities/{id}/purchase`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurchaseRequest {
    pub user_id: u64,
    pub token: String,
    pub qty: u32,
}

pub fn purchase_request(bytes: &[u8]) -> Result<PurchaseRequest, FieldError> {
    if let Ok(f) = serde_json::from_slice::<FastPurchase>(bytes) {
        let qty = f.qty.unwrap_or(1);
        if USER_IDS.contains(&f.user_id) && (1..=1_000).contains(&qty) {
            return Ok(PurchaseRequest {
                user_id: f.user_id,
                token: f.token,
                qty: qty as u32,
            });
        }
    }
    purchase_fields(bytes)
}

/// The field-by-field decoder of a purchase body.
fn purchase_fields(bytes: &[u8]) -> Result<PurchaseRequest, FieldError> {
    let map = object(bytes, &["user_id", "token", "qty"])?;
    let user_id = required_u64(&map, "user_id", USER_IDS)?;
    let token = match map.get("token") {
        None => return Err(field_error("token", "missing")),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(field_error(
                "token",
                format!("must be a string, got {}", kind(other)),
            ))
        }
    };
    // The per-user limit is checked against the activity later; this bounds the number.
    let qty = u64_field(&map, "qty", 1..=1_000)?.unwrap_or(1) as u32;
    Ok(PurchaseRequest { user_id, token, qty })
}

/// `POST /api/v1/admin/activities`: an `ActivitySpec` (validated by `Activity::new` after this).
pub fn activity_spec(bytes: &[u8]) -> Result<ActivitySpec, FieldError> {
    let fields = [
        "id",
        "total_stock",
        "buckets",
        "fallback_pct",
        "per_user_limit",
        "start_ms",
        "end_ms",
        "pay_timeout_ms",
    ];
    let map = object(bytes, &fields)?;
    let all = 0..=u64::MAX;
    Ok(ActivitySpec {
        id: ActivityId(required_u64(&map, "id", 1..=i64::MAX as u64)?),
        total_stock: required_u64(&map, "total_stock", all.clone())?,
        buckets: required_u64(&map, "buckets", 0..=u32::MAX as u64)? as u32,
        fallback_pct: required_u64(&map, "fallback_pct", 0..=u8::MAX as u64)? as u8,
        per_user_limit: u64_field(&map, "per_user_limit", 0..=u32::MAX as u64)?.unwrap_or(1) as u32,
        start_ms: required_u64(&map, "start_ms", all.clone())?,
        end_ms: required_u64(&map, "end_ms", all.clone())?,
        pay_timeout_ms: required_u64(&map, "pay_timeout_ms", all)?,
    })
}

/// A path segment that must be a positive integer id.
pub fn path_id(field: &str, segment: &str) -> Result<u64, FieldError> {
    if segment.is_empty() || segment.len() > 19 || !segment.bytes().all(|c| c.is_ascii_digit()) {
        return Err(field_error(
            field,
            format!("must be a positive integer, got {segment:?}"),
        ));
    }
    match segment.parse::<u64>() {
        Ok(n) if (1..=i64::MAX as u64).contains(&n) => Ok(n),
        _ => Err(field_error(
            field,
            format!("must be in 1..={}, got {segment}", i64::MAX),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: Result<PurchaseRequest, FieldError>) -> String {
        r.unwrap_err().field
    }

    #[test]
    fn purchase_bodies_are_refused_by_field() {
        let ok = purchase_request(br#"{"user_id": 7, "token": "t"}"#).unwrap();
        assert_eq!((ok.user_id, ok.qty), (7, 1));
        assert_eq!(field_of(purchase_request(b"{not json")), "body");
        assert_eq!(field_of(purchase_request(b"[1]")), "body");
        assert_eq!(field_of(purchase_request(br#"{"token": "t"}"#)), "user_id");
        assert_eq!(field_of(purchase_request(br#"{"user_id": 1}"#)), "token");
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 1, "token": "t", "x": 1}"#)),
            "x"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": "1", "token": "t"}"#)),
            "user_id"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": -1, "token": "t"}"#)),
            "user_id"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 0, "token": "t"}"#)),
            "user_id"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 1.5, "token": "t"}"#)),
            "user_id"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 1e30, "token": "t"}"#)),
            "user_id"
        );
        assert_eq!(
            field_of(purchase_request(
                br#"{"user_id": 99999999999999999999999, "token": "t"}"#
            )),
            "user_id"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 1, "token": 5}"#)),
            "token"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 1, "token": "t", "qty": 0}"#)),
            "qty"
        );
    }

    #[test]
    fn unknown_keys_that_do_not_read_as_field_names_are_blamed_on_the_body() {
        assert_eq!(
            field_of(purchase_request(b"  {\"\":\r11\r}")),
            "body",
            "an empty key (fuzzer crash)"
        );
        assert_eq!(field_of(purchase_request(b"{\"a\\nb\": 1}")), "body");
        let long = format!("{{\"{}\": 1}}", "k".repeat(100));
        assert_eq!(field_of(purchase_request(long.as_bytes())), "body");
    }

    #[test]
    fn the_fast_path_and_the_field_decoder_agree() {
        let bodies: [&[u8]; 8] = [
            br#"{"user_id": 7, "token": "t"}"#,
            br#"{"user_id": 7, "token": "t", "qty": 1}"#,
            br#"{"user_id": 7, "token": "t", "qty": null}"#,
            br#"{"user_id": 0, "token": "t"}"#,
            br#"{"user_id": 7, "token": "t", "qty": 1001}"#,
            br#"{"user_id": 9223372036854775808, "token": "t"}"#,
            br#"{"user_id": 7, "token": "t", "x": 1}"#,
            br#"{"user_id": 7, "user_id": 8, "token": "t"}"#,
        ];
        for b in bodies {
            let fields = purchase_fields(b);
            let fast = serde_json::from_slice::<FastPurchase>(b)
                .ok()
                .filter(|f| USER_IDS.contains(&f.user_id) && (1..=1_000).contains(&f.qty.unwrap_or(1)));
            match (&fast, &fields) {
                (Some(f), Ok(p)) => assert_eq!(
                    (f.user_id, f.token.as_str(), f.qty.unwrap_or(1) as u32),
                    (p.user_id, p.token.as_str(), p.qty)
                ),
                // Duplicate keys: serde refuses them; the field decoder takes the last one.
                (None, Ok(_)) => assert!(std::str::from_utf8(b).unwrap().matches("user_id").count() == 2),
                (Some(_), Err(e)) => panic!("the fast path accepts what the decoder refuses ({e}): {b:?}"),
                (None, Err(_)) => {}
            }
        }
    }

    #[test]
    fn path_ids_are_positive_integers() {
        assert_eq!(path_id("id", "42"), Ok(42));
        for bad in ["", "0", "-1", "+1", "1.0", "abc", "99999999999999999999"] {
            assert_eq!(path_id("id", bad).unwrap_err().field, "id", "{bad}");
        }
    }
}
