//! Request bodies, decoded so that every refusal names its field: not JSON, not an object, a
//! missing field, an unknown field, a wrong type, a negative or out-of-range number. User bodies
//! go through serde with `serde_path_to_error` (`decode`); the admin activity spec keeps its
//! field-by-field decoder. Nothing here touches a store; a body that does not decode never
//! reaches one.

use seckill_core::domain::{ActivityId, ActivitySpec};
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

/// A body decoded by serde into `T`, every refusal naming its field: `serde_path_to_error` gives
/// the path of a value of the wrong type; a missing, unknown or repeated field is named by serde
/// in its message (the path then is the object itself); anything else is the body's fault.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, FieldError> {
    // serde's derived structs also read a JSON array, field by field in order (`[]` would be a
    // request with every optional field absent): every body here is an object, nothing else.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => field_error("body", format!("must be a JSON object, got {}", kind(&v))),
            Err(e) => field_error("body", format!("not valid JSON: {e}")),
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        if inner.is_syntax() || inner.is_eof() {
            return field_error("body", format!("not valid JSON: {message}"));
        }
        // A key is echoed back as the field only if it reads as one (found by the fuzzer).
        let readable = |k: &str| !k.is_empty() && k.len() <= 64 && !k.chars().any(char::is_control);
        let named = ["missing field `", "unknown field `", "duplicate field `"]
            .iter()
            .find_map(|p| message.strip_prefix(p))
            .and_then(|rest| rest.split('`').next());
        let field = match named {
            Some(field) if path == "." => field.to_string(),
            _ => path,
        };
        if field == "." || !readable(&field) {
            field_error("body", message)
        } else {
            field_error(&field, message)
        }
    })?;
    de.end()
        .map_err(|e| field_error("body", format!("not valid JSON: {e}")))?;
    Ok(value)
}

/// User ids are positive 63-bit integers (they travel through MySQL BIGINT and JSON safely).
const USER_IDS: std::ops::RangeInclusive<u64> = 1..=i64::MAX as u64;

fn user_id(v: Option<u64>) -> Result<Option<u64>, FieldError> {
    match v {
        Some(u) if !USER_IDS.contains(&u) => Err(field_error(
            "user_id",
            format!("must be in {}..={}, got {u}", USER_IDS.start(), USER_IDS.end()),
        )),
        other => Ok(other),
    }
}

/// `POST /api/v1/activities/{id}/token`. The caller is who the JWT says; a `user_id`, if sent,
/// must be that user (checked by the route).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// Optional; must be the caller (the JWT's `sub`).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub user_id: Option<u64>,
}

pub fn token_request(bytes: &[u8]) -> Result<TokenRequest, FieldError> {
    // No body at all is an empty request.
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(TokenRequest { user_id: None });
    }
    let r: TokenRequest = decode(bytes)?;
    user_id(r.user_id)?;
    Ok(r)
}

/// `POST /api/v1/activities/{id}/purchase`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurchaseRequest {
    pub user_id: Option<u64>,
    pub token: String,
    pub qty: u32,
}

// As sent, and as the OpenAPI document describes it (doc comments are its descriptions).
/// A purchase: the token for this activity and user, and how many units.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PurchaseRequest)]
pub(crate) struct PurchaseBody {
    /// Optional; must be the caller (the JWT's `sub`).
    #[serde(default)]
    #[schema(minimum = 1)]
    user_id: Option<u64>,
    /// The one-time token from `POST .../token`.
    token: String,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000, default = 1)]
    qty: Option<u64>,
}

pub fn purchase_request(bytes: &[u8]) -> Result<PurchaseRequest, FieldError> {
    let r: PurchaseBody = decode(bytes)?;
    // The per-user limit is checked against the activity later; this bounds the number.
    let qty = r.qty.unwrap_or(1);
    if !(1..=1_000).contains(&qty) {
        return Err(field_error("qty", format!("must be in 1..=1000, got {qty}")));
    }
    Ok(PurchaseRequest {
        user_id: user_id(r.user_id)?,
        token: r.token,
        qty: qty as u32,
    })
}

/// The fields of `POST /api/v1/admin/activities` (`api::openapi`'s schema must list exactly these).
pub(crate) const ACTIVITY_SPEC_FIELDS: [&str; 9] = [
    "id",
    "total_stock",
    "buckets",
    "fallback_pct",
    "per_user_limit",
    "start_ms",
    "end_ms",
    "pay_timeout_ms",
    "unit_price_minor",
];

/// `POST /api/v1/admin/activities`: an `ActivitySpec` (validated by `Activity::new` after this).
pub fn activity_spec(bytes: &[u8]) -> Result<ActivitySpec, FieldError> {
    let map = object(bytes, &ACTIVITY_SPEC_FIELDS)?;
    let all = 0..=u64::MAX;
    Ok(ActivitySpec {
        id: ActivityId(required_u64(&map, "id", 1..=i64::MAX as u64)?),
        total_stock: required_u64(&map, "total_stock", all.clone())?,
        buckets: required_u64(&map, "buckets", 0..=u32::MAX as u64)? as u32,
        fallback_pct: required_u64(&map, "fallback_pct", 0..=u8::MAX as u64)? as u8,
        per_user_limit: u64_field(&map, "per_user_limit", 0..=u32::MAX as u64)?.unwrap_or(1) as u32,
        start_ms: required_u64(&map, "start_ms", all.clone())?,
        end_ms: required_u64(&map, "end_ms", all.clone())?,
        pay_timeout_ms: required_u64(&map, "pay_timeout_ms", all.clone())?,
        unit_price_minor: u64_field(&map, "unit_price_minor", all)?.unwrap_or(0),
    })
}

/// A path segment that must be a positive integer id.
pub fn path_id(field: &str, segment: &str) -> Result<u64, FieldError> {
    path_number(field, segment, 1..=i64::MAX as u64, "a positive integer")
}

/// A path or query value that must be a whole number in `range` (`what` it must be, if not
/// digits at all).
fn path_number(
    field: &str,
    segment: &str,
    range: std::ops::RangeInclusive<u64>,
    what: &str,
) -> Result<u64, FieldError> {
    if segment.is_empty() || segment.len() > 19 || !segment.bytes().all(|c| c.is_ascii_digit()) {
        return Err(field_error(field, format!("must be {what}, got {segment:?}")));
    }
    match segment.parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(field_error(
            field,
            format!("must be in {}..={}, got {segment}", range.start(), range.end()),
        )),
    }
}

/// A place in the dead-letter topic, as the path `/{partition}/{offset}` names it.
pub fn dead_letter_position(partition: &str, offset: &str) -> Result<(u32, u64), FieldError> {
    let p = path_number("partition", partition, 0..=i32::MAX as u64, "a whole number")?;
    let o = path_number("offset", offset, 0..=i64::MAX as u64, "a whole number")?;
    Ok((p as u32, o))
}

/// The most dead letters one listing returns.
pub const DEAD_LETTERS_PAGE_MAX: usize = 1_000;

/// `GET /api/v1/admin/dead-letters?limit=&partition=&offset=`: where to start (default the
/// beginning) and how many (default 100).
pub fn dead_letter_query(query: Option<&str>) -> Result<((u32, u64), usize), FieldError> {
    let (mut from, mut limit) = ((0u32, 0u64), 100usize);
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "limit" => {
                let max = DEAD_LETTERS_PAGE_MAX as u64;
                limit = path_number("limit", v, 1..=max, "a whole number")? as usize
            }
            "partition" => {
                from.0 = path_number("partition", v, 0..=i32::MAX as u64, "a whole number")? as u32
            }
            "offset" => from.1 = path_number("offset", v, 0..=i64::MAX as u64, "a whole number")?,
            _ => {
                let shown: String = k.chars().take(64).collect();
                return Err(field_error(
                    "query",
                    format!("unknown parameter {shown:?} (limit, partition, offset)"),
                ));
            }
        }
    }
    Ok((from, limit))
}

/// `POST /api/v1/admin/dead-letters/replay`: one dead letter, or every one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// Replay every dead letter the topic holds now (then leave out partition and offset).
    #[serde(default)]
    pub all: bool,
    /// The dead letter's partition in the dead-letter topic.
    #[schema(minimum = 0)]
    pub partition: Option<u32>,
    /// The dead letter's offset in its partition.
    #[schema(minimum = 0)]
    pub offset: Option<u64>,
}

/// What a replay names: every dead letter, or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayTarget {
    All,
    One(u32, u64),
}

/// Kafka's bounds: a partition is an int32, an offset an int64 (as the OpenAPI formats say).
fn in_kafka_bounds(field: &str, (partition, offset): (u32, u64)) -> Result<(u32, u64), FieldError> {
    if partition > i32::MAX as u32 {
        return Err(field_error(
            &format!("{field}partition"),
            format!("must be in 0..={}, got {partition}", i32::MAX),
        ));
    }
    if offset > i64::MAX as u64 {
        return Err(field_error(
            &format!("{field}offset"),
            format!("must be in 0..={}, got {offset}", i64::MAX),
        ));
    }
    Ok((partition, offset))
}

pub fn replay_request(bytes: &[u8]) -> Result<ReplayTarget, FieldError> {
    let r: ReplayRequest = decode(bytes)?;
    if let (Some(p), Some(o)) = (r.partition, r.offset) {
        in_kafka_bounds("", (p, o))?;
    }
    match (r.all, r.partition, r.offset) {
        (true, None, None) => Ok(ReplayTarget::All),
        (true, _, _) => Err(field_error(
            "all",
            "replays every dead letter: leave out partition and offset",
        )),
        (false, Some(p), Some(o)) => Ok(ReplayTarget::One(p, o)),
        (false, None, _) => Err(field_error("partition", "missing (or \"all\": true)")),
        (false, Some(_), None) => Err(field_error("offset", "missing")),
    }
}

/// A place in the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Position {
    pub partition: u32,
    pub offset: u64,
}

/// `POST /api/v1/admin/dead-letters/purge`: delete the dead letters below these positions (as a
/// listing's `purge_before` gives them: what arrived since stays).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurgeRequest {
    pub before: Vec<Position>,
}

pub fn purge_request(bytes: &[u8]) -> Result<Vec<(u32, u64)>, FieldError> {
    let r: PurgeRequest = decode(bytes)?;
    if r.before.is_empty() {
        return Err(field_error(
            "before",
            "at least one position (a listing's purge_before)",
        ));
    }
    (r.before.iter().enumerate())
        .map(|(i, p)| in_kafka_bounds(&format!("before[{i}]."), (p.partition, p.offset)))
        .collect()
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
        assert_eq!((ok.user_id, ok.qty), (Some(7), 1));
        let ok = purchase_request(br#"{"token": "t", "qty": null}"#).unwrap();
        assert_eq!(
            (ok.user_id, ok.qty),
            (None, 1),
            "the user is the caller's identity"
        );
        assert_eq!(field_of(purchase_request(b"{not json")), "body");
        assert_eq!(field_of(purchase_request(b"[1]")), "body");
        assert_eq!(field_of(purchase_request(br#"{"token": "t"} x"#)), "body");
        assert_eq!(field_of(purchase_request(br#"{"user_id": 1}"#)), "token");
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 1, "token": "t", "x": 1}"#)),
            "x"
        );
        for bad in [
            r#""1""#,
            "-1",
            "0",
            "1.5",
            "1e30",
            "99999999999999999999999",
            "9223372036854775808",
        ] {
            let body = format!(r#"{{"user_id": {bad}, "token": "t"}}"#);
            assert_eq!(field_of(purchase_request(body.as_bytes())), "user_id", "{bad}");
        }
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 1, "token": 5}"#)),
            "token"
        );
        assert_eq!(field_of(purchase_request(br#"{"token": "t", "qty": 0}"#)), "qty");
        assert_eq!(
            field_of(purchase_request(br#"{"token": "t", "qty": 1001}"#)),
            "qty"
        );
        assert_eq!(
            field_of(purchase_request(br#"{"user_id": 7, "user_id": 8, "token": "t"}"#)),
            "user_id",
            "a repeated field is refused, not resolved"
        );
    }

    #[test]
    fn token_bodies_may_be_empty() {
        assert_eq!(token_request(b"").unwrap().user_id, None);
        assert_eq!(token_request(b"{}").unwrap().user_id, None);
        assert_eq!(token_request(br#"{"user_id": 8}"#).unwrap().user_id, Some(8));
        assert_eq!(token_request(br#"{"user_id": 0}"#).unwrap_err().field, "user_id");
        assert_eq!(token_request(br#"{"user": 8}"#).unwrap_err().field, "user");
        // serde would read an array as the struct's fields in order (found by schemathesis: `[]`
        // was a token request).
        for array in [&b"[]"[..], b" [8]", b"[null]", b"8", b"\"x\""] {
            let e = token_request(array).unwrap_err();
            assert_eq!(e.field, "body", "{}", String::from_utf8_lossy(array));
            assert!(e.message.contains("must be a JSON object"), "{e}");
        }
        let e = purchase_request(br#"["t", 1]"#).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("body", "must be a JSON object, got an array")
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
    fn path_ids_are_positive_integers() {
        assert_eq!(path_id("id", "42"), Ok(42));
        for bad in ["", "0", "-1", "+1", "1.0", "abc", "99999999999999999999"] {
            assert_eq!(path_id("id", bad).unwrap_err().field, "id", "{bad}");
        }
    }
}
