//! The payment provider's callback (DESIGN §12): the only way an order becomes paid. The
//! provider signs each callback: header `X-Seckill-Signature: t=<unix seconds>,v1=<hex of
//! HMAC-SHA256(secret, "<t>.<body>")>`; a signature older or newer than `WINDOW_S` is refused, so
//! a captured callback cannot be replayed later (and a replay inside the window is idempotent by
//! payment id).

use super::body::{field_error, FieldError};
use crate::domain::ReservationId;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far a callback's timestamp may be from the engine's clock.
pub const WINDOW_S: u64 = 300;
pub const SIGNATURE_HEADER: &str = "x-seckill-signature";

/// Why a callback was not believed (401, naming the header).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SignatureError(pub String);

pub struct CallbackVerifier {
    key: Vec<u8>,
}

impl CallbackVerifier {
    pub fn new(secret: &[u8]) -> Self {
        CallbackVerifier { key: secret.to_vec() }
    }

    fn mac(&self, t: &str, body: &[u8]) -> HmacSha256 {
        let mut mac =
            <HmacSha256 as KeyInit>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(t.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The header value a provider sends for `body` at `t` (tests, `seckill` tools).
    pub fn sign(&self, t_unix_s: u64, body: &[u8]) -> String {
        let t = t_unix_s.to_string();
        let tag = self.mac(&t, body).finalize().into_bytes();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        format!("t={t},v1={hex}")
    }

    /// Check `header` against `body` at `now_ms` (constant-time comparison of the tag).
    pub fn verify(&self, header: Option<&[u8]>, body: &[u8], now_ms: u64) -> Result<(), SignatureError> {
        let header = header.ok_or_else(|| SignatureError("missing: the callback must be signed".into()))?;
        let header = std::str::from_utf8(header).map_err(|_| SignatureError("not text".into()))?;
        let (mut t, mut v1) = (None, None);
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", v)) => t = Some(v),
                Some(("v1", v)) => v1 = Some(v),
                _ => {} // other schemes may follow (a provider rotating its scheme)
            }
        }
        let (Some(t), Some(v1)) = (t, v1) else {
            return Err(SignatureError("must be \"t=<unix seconds>,v1=<hex>\"".into()));
        };
        let ts: u64 = t
            .parse()
            .map_err(|_| SignatureError(format!("t={t:?} is not a unix time in seconds")))?;
        let now_s = now_ms / 1_000;
        if ts.abs_diff(now_s) > WINDOW_S {
            return Err(SignatureError(format!(
                "t={ts} is more than {WINDOW_S} s from now ({now_s}): too old to be believed"
            )));
        }
        let tag = decode_hex(v1).ok_or_else(|| SignatureError("v1 is not hex".into()))?;
        self.mac(t, body)
            .verify_slice(&tag)
            .map_err(|_| SignatureError("the signature does not match the body".into()))
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `POST /api/v1/payments/callback`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callback {
    pub payment_id: String,
    pub reservation: ReservationId,
}

// As sent, and as the OpenAPI document describes it (doc comments are its descriptions).
/// The payment provider's confirmation that a reservation was paid.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PaymentCallback)]
pub(crate) struct CallbackBody {
    /// The provider's id of the payment: a repeat of one is answered as the first was.
    #[schema(pattern = "^[A-Za-z0-9_.:-]{1,64}$")]
    payment_id: String,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    reservation_id: String,
}

/// Decoded with `serde_path_to_error`-style naming: every refusal names its field.
pub fn callback(bytes: &[u8]) -> Result<Callback, FieldError> {
    let raw: CallbackBody = super::body::decode(bytes)?;
    let p = &raw.payment_id;
    if p.is_empty()
        || p.len() > 64
        || !p
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(&c))
    {
        return Err(field_error(
            "payment_id",
            "must be 1 to 64 characters of letters, digits and -_.:",
        ));
    }
    let reservation = raw
        .reservation_id
        .parse()
        .map_err(|e: String| field_error("reservation_id", e))?;
    Ok(Callback {
        payment_id: raw.payment_id,
        reservation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 1_800_000_000_000;

    #[test]
    fn a_signed_callback_verifies_inside_the_window_only() {
        let v = CallbackVerifier::new(b"provider-secret-0123");
        let body = br#"{"payment_id":"p1","reservation_id":"00000000000000000000000000000001"}"#;
        let sig = v.sign(NOW_MS / 1_000, body);
        assert_eq!(v.verify(Some(sig.as_bytes()), body, NOW_MS), Ok(()));
        assert!(
            v.verify(Some(sig.as_bytes()), body, NOW_MS + (WINDOW_S + 1) * 1_000)
                .is_err(),
            "replayed late"
        );
        assert!(
            v.verify(Some(sig.as_bytes()), b"{}", NOW_MS).is_err(),
            "another body"
        );
        let forged = CallbackVerifier::new(b"not-the-secret-0123").sign(NOW_MS / 1_000, body);
        assert!(
            v.verify(Some(forged.as_bytes()), body, NOW_MS).is_err(),
            "another key"
        );
        for bad in [
            &b""[..],
            b"t=1",
            b"v1=00",
            b"t=x,v1=00",
            b"t=1800000000,v1=zz",
            b"\xff",
        ] {
            assert!(v.verify(Some(bad), body, NOW_MS).is_err(), "{bad:?}");
        }
        assert!(v.verify(None, body, NOW_MS).is_err());
    }

    #[test]
    fn callback_bodies_name_their_field() {
        let ok =
            callback(br#"{"payment_id":"p-1","reservation_id":"0000000000000000000000000000000a"}"#).unwrap();
        assert_eq!(ok.payment_id, "p-1");
        let field = |b: &[u8]| callback(b).unwrap_err().field;
        assert_eq!(
            field(br#"{"payment_id":"p 1","reservation_id":"0a"}"#),
            "payment_id"
        );
        assert_eq!(
            field(br#"{"payment_id":"p1","reservation_id":"xyz"}"#),
            "reservation_id"
        );
        assert_eq!(field(br#"{"payment_id":"p1"}"#), "reservation_id");
        assert_eq!(field(br#"{"payment_id":5,"reservation_id":"0a"}"#), "payment_id");
        assert_eq!(field(br#"{"payment_id":"p1","reservation_id":"0a","x":1}"#), "x");
        assert_eq!(field(b"nope"), "body");
    }
}
