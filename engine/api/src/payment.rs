//! The payment provider's callback (DESIGN §12): the only way an order becomes paid. The
//! provider signs each callback: header `X-Seckill-Signature: t=<unix seconds>,v1=<hex of
//! HMAC-SHA256(secret, "<t>.<body>")>`; a signature older or newer than `WINDOW_S` is refused, so
//! a captured callback cannot be replayed later (and a replay inside the window is idempotent by
//! payment id). A key is rotated without refusing a callback: during the rotation the engine
//! believes the old key beside the new one (`payment_secret_previous`), and a provider may send
//! one `v1=` per key it signs with (the first that matches a believed key is enough).

use super::body::{field_error, FieldError};
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use seckill_core::domain::ReservationId;
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
    /// The current key first (the one `sign` uses), then the one being retired, if any.
    keys: Vec<Vec<u8>>,
}

impl CallbackVerifier {
    pub fn new(secret: &[u8]) -> Self {
        CallbackVerifier {
            keys: vec![secret.to_vec()],
        }
    }

    /// Also believe `previous` (a key being rotated out).
    pub fn with_previous(mut self, previous: Option<&[u8]>) -> Self {
        self.keys.extend(previous.map(<[u8]>::to_vec));
        self
    }

    fn mac(key: &[u8], t: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
        mac.update(t.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The header value a provider sends for `body` at `t` (tests, `seckill` tools).
    pub fn sign(&self, t_unix_s: u64, body: &[u8]) -> String {
        let t = t_unix_s.to_string();
        let tag = Self::mac(&self.keys[0], &t, body).finalize().into_bytes();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        format!("t={t},v1={hex}")
    }

    /// Check `header` against `body` at `now_ms` (constant-time comparison of the tag).
    pub fn verify(&self, header: Option<&[u8]>, body: &[u8], now_ms: u64) -> Result<(), SignatureError> {
        let header = header.ok_or_else(|| SignatureError("missing: the callback must be signed".into()))?;
        let header = std::str::from_utf8(header).map_err(|_| SignatureError("not text".into()))?;
        // A bound on the signatures tried: each costs an HMAC of the body.
        const MAX_SIGNATURES: usize = 4;
        let (mut t, mut v1) = (None, Vec::new());
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", v)) => t = Some(v),
                Some(("v1", v)) => v1.push(v),
                _ => {} // other schemes may follow (a provider rotating its scheme)
            }
        }
        let Some(t) = t.filter(|_| !v1.is_empty()) else {
            return Err(SignatureError("must be \"t=<unix seconds>,v1=<hex>\"".into()));
        };
        if v1.len() > MAX_SIGNATURES {
            return Err(SignatureError(format!(
                "{} v1 signatures: at most {MAX_SIGNATURES} are read",
                v1.len()
            )));
        }
        let ts: u64 = t
            .parse()
            .map_err(|_| SignatureError(format!("t={t:?} is not a unix time in seconds")))?;
        let now_s = now_ms / 1_000;
        if ts.abs_diff(now_s) > WINDOW_S {
            return Err(SignatureError(format!(
                "t={ts} is more than {WINDOW_S} s from now ({now_s}): too old to be believed"
            )));
        }
        let tags = (v1.iter())
            .map(|v| decode_hex(v))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| SignatureError("v1 is not hex".into()))?;
        // Every (key, signature) pair is tried, constant-time each: which key matched is not
        // told by the time taken.
        let matched = (self.keys.iter())
            .flat_map(|key| {
                tags.iter()
                    .map(move |tag| Self::mac(key, t, body).verify_slice(tag).is_ok())
            })
            .fold(false, |any, ok| any | ok);
        if matched {
            Ok(())
        } else {
            Err(SignatureError("the signature does not match the body".into()))
        }
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
    /// What the buyer paid, in the currency's minor unit (signed with the rest of the body).
    pub amount_minor: u64,
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
    /// What the buyer paid, in the currency's minor unit (cents): the order's quantity times
    /// the activity's `unit_price_minor`, or the callback is refused and nothing is paid.
    amount_minor: u64,
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
        amount_minor: raw.amount_minor,
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
    fn a_rotated_key_is_believed_beside_the_new_one_until_it_is_dropped() {
        let body = br#"{"payment_id":"p1","reservation_id":"00000000000000000000000000000001"}"#;
        let (old, new) = (&b"provider-old-key-0123"[..], &b"provider-new-key-4567"[..]);
        let t = NOW_MS / 1_000;
        let by_old = CallbackVerifier::new(old).sign(t, body);
        let by_new = CallbackVerifier::new(new).sign(t, body);
        let rotating = CallbackVerifier::new(new).with_previous(Some(old));
        assert_eq!(rotating.verify(Some(by_old.as_bytes()), body, NOW_MS), Ok(()));
        assert_eq!(rotating.verify(Some(by_new.as_bytes()), body, NOW_MS), Ok(()));
        // A provider that signs with both keys at once: one matching v1 is enough, in any order.
        let v1 = |sig: &str| sig.split_once(",v1=").unwrap().1.to_string();
        let forged = CallbackVerifier::new(b"somebody-else-0123").sign(t, body);
        let both = format!("t={t},v1={},v1={}", v1(&forged), v1(&by_new));
        assert_eq!(rotating.verify(Some(both.as_bytes()), body, NOW_MS), Ok(()));
        // Once the rotation is over, the old key is not believed any more.
        let rotated = CallbackVerifier::new(new).with_previous(None);
        assert!(rotated.verify(Some(by_old.as_bytes()), body, NOW_MS).is_err());
        assert!(rotated.verify(Some(forged.as_bytes()), body, NOW_MS).is_err());
        let many = format!("t={t}{}", ",v1=00".repeat(5));
        let e = rotating.verify(Some(many.as_bytes()), body, NOW_MS).unwrap_err();
        assert!(e.0.contains("at most 4"), "{e}");
    }

    #[test]
    fn callback_bodies_name_their_field() {
        let ok = callback(
            br#"{"payment_id":"p-1","reservation_id":"0000000000000000000000000000000a","amount_minor":1999}"#,
        )
        .unwrap();
        assert_eq!((ok.payment_id.as_str(), ok.amount_minor), ("p-1", 1999));
        let field = |b: &[u8]| callback(b).unwrap_err().field;
        assert_eq!(
            field(br#"{"payment_id":"p 1","reservation_id":"0a","amount_minor":1}"#),
            "payment_id"
        );
        assert_eq!(
            field(br#"{"payment_id":"p1","reservation_id":"xyz","amount_minor":1}"#),
            "reservation_id"
        );
        assert_eq!(
            field(br#"{"payment_id":"p1","amount_minor":1}"#),
            "reservation_id"
        );
        assert_eq!(
            field(br#"{"payment_id":"p1","reservation_id":"0a"}"#),
            "amount_minor",
            "the amount is part of what the provider signs"
        );
        assert_eq!(
            field(br#"{"payment_id":"p1","reservation_id":"0a","amount_minor":-1}"#),
            "amount_minor"
        );
        assert_eq!(
            field(br#"{"payment_id":5,"reservation_id":"0a","amount_minor":1}"#),
            "payment_id"
        );
        assert_eq!(
            field(br#"{"payment_id":"p1","reservation_id":"0a","amount_minor":1,"x":1}"#),
            "x"
        );
        assert_eq!(field(b"nope"), "body");
    }
}
