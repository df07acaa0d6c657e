//! One-time purchase tokens: issued only inside the activity window, short-lived, bound to one
//! (activity, user), signed with HMAC-SHA256 and verified in constant time. The nonce makes each
//! token single-use: the purchase route claims it in a `NonceStore` before anything else runs.
//!
//! Wire form (ASCII, no padding): `<activity>.<user>.<expires_ms>.<nonce: 16 hex>.<mac: base64url>`
//! where mac = HMAC-SHA256(secret, "seckill-token-v1|<activity>|<user>|<expires_ms>|<nonce>").

use base64::Engine;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use seckill_core::domain::{ActivityId, UserId};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;
/// The longest token we accept; anything longer is refused before it is parsed.
pub const MAX_TOKEN_LEN: usize = 160;
/// A secret shorter than this is refused at start-up (HMAC-SHA256 wants 256 bits).
pub const MIN_SECRET_LEN: usize = 32;

/// A decoded, not yet verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub activity: ActivityId,
    pub user: UserId,
    pub expires_ms: u64,
    pub nonce: u64,
    mac: Vec<u8>,
}

/// Why a token is refused; `code` is the API error code, the field is always `token`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token: {reason}")]
pub struct TokenError {
    pub code: &'static str,
    pub reason: String,
}

fn malformed(reason: impl Into<String>) -> TokenError {
    TokenError {
        code: "token_malformed",
        reason: reason.into(),
    }
}

fn message(activity: ActivityId, user: UserId, expires_ms: u64, nonce: u64) -> String {
    format!("seckill-token-v1|{activity}|{user}|{expires_ms}|{nonce:016x}")
}

/// Parse the wire form. Every way it can be wrong is named.
pub fn decode(s: &str) -> Result<Token, TokenError> {
    if s.is_empty() {
        return Err(malformed("empty"));
    }
    if s.len() > MAX_TOKEN_LEN {
        return Err(malformed(format!("longer than {MAX_TOKEN_LEN} characters")));
    }
    let parts: Vec<&str> = s.split('.').collect();
    let [activity, user, expires, nonce, mac] = parts.as_slice() else {
        return Err(malformed(format!(
            "expected 5 dot-separated parts, got {}",
            parts.len()
        )));
    };
    let number = |name: &str, v: &str| -> Result<u64, TokenError> {
        if v.is_empty()
            || v.len() > 20
            || !v.bytes().all(|c| c.is_ascii_digit())
            || (v.len() > 1 && v.starts_with('0'))
        {
            return Err(malformed(format!("{name} is not a decimal number")));
        }
        v.parse()
            .map_err(|_| malformed(format!("{name} is out of range")))
    };
    let activity = ActivityId(number("activity", activity)?);
    let user = UserId(number("user", user)?);
    let expires_ms = number("expiry", expires)?;
    if nonce.len() != 16
        || !nonce
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    {
        return Err(malformed("nonce is not 16 lowercase hex digits"));
    }
    let nonce = u64::from_str_radix(nonce, 16).map_err(|_| malformed("nonce is not hex"))?;
    let mac = B64
        .decode(mac)
        .map_err(|_| malformed("signature is not base64url"))?;
    if mac.len() != 32 {
        return Err(malformed("signature has the wrong length"));
    }
    Ok(Token {
        activity,
        user,
        expires_ms,
        nonce,
        mac,
    })
}

pub struct TokenSigner {
    /// The HMAC keyed once: each token's MAC starts from a clone of it, not from the key (whose
    /// two padded blocks would be hashed again on every issue and check).
    keyed: HmacSha256,
    ttl_ms: u64,
}

impl TokenSigner {
    pub fn new(secret: &[u8], ttl_ms: u64) -> Result<TokenSigner, String> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(format!(
                "must be at least {MIN_SECRET_LEN} bytes, got {}",
                secret.len()
            ));
        }
        Ok(TokenSigner {
            keyed: <HmacSha256 as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length"),
            ttl_ms,
        })
    }

    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    fn mac(&self) -> HmacSha256 {
        self.keyed.clone()
    }

    /// A token for `user` in `activity`, valid until `now_ms + ttl`.
    pub fn issue(&self, activity: ActivityId, user: UserId, now_ms: u64, nonce: u64) -> (String, u64) {
        let expires_ms = now_ms.saturating_add(self.ttl_ms);
        let mut mac = self.mac();
        mac.update(message(activity, user, expires_ms, nonce).as_bytes());
        let sig = B64.encode(mac.finalize().into_bytes());
        (
            format!("{activity}.{user}.{expires_ms}.{nonce:016x}.{sig}"),
            expires_ms,
        )
    }

    /// Decode and verify a token presented by `user` for `activity` at `now_ms`. The signature is
    /// checked first (in constant time), so nothing about an unsigned token is trusted.
    pub fn verify(
        &self,
        s: &str,
        activity: ActivityId,
        user: UserId,
        now_ms: u64,
    ) -> Result<Token, TokenError> {
        let t = decode(s)?;
        let mut mac = self.mac();
        mac.update(message(t.activity, t.user, t.expires_ms, t.nonce).as_bytes());
        mac.verify_slice(&t.mac).map_err(|_| TokenError {
            code: "token_invalid",
            reason: "signature does not match".into(),
        })?;
        if t.activity != activity {
            return Err(TokenError {
                code: "token_invalid",
                reason: format!("issued for activity {}, not {activity}", t.activity),
            });
        }
        if t.user != user {
            return Err(TokenError {
                code: "token_invalid",
                reason: "issued for another user".into(),
            });
        }
        if now_ms >= t.expires_ms {
            return Err(TokenError {
                code: "token_expired",
                reason: format!("expired at {} ms", t.expires_ms),
            });
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> TokenSigner {
        TokenSigner::new(&[7u8; 32], 1_000).unwrap()
    }

    #[test]
    fn a_token_verifies_only_for_its_activity_user_and_lifetime() {
        let s = signer();
        let (tok, exp) = s.issue(ActivityId(5), UserId(9), 10_000, 0xabc);
        assert_eq!(exp, 11_000);
        let t = s.verify(&tok, ActivityId(5), UserId(9), 10_500).unwrap();
        assert_eq!(t.nonce, 0xabc);
        let code = |r: Result<Token, TokenError>| r.unwrap_err().code;
        assert_eq!(
            code(s.verify(&tok, ActivityId(6), UserId(9), 10_500)),
            "token_invalid"
        );
        assert_eq!(
            code(s.verify(&tok, ActivityId(5), UserId(8), 10_500)),
            "token_invalid"
        );
        assert_eq!(
            code(s.verify(&tok, ActivityId(5), UserId(9), 11_000)),
            "token_expired"
        );
        let other = TokenSigner::new(&[8u8; 32], 1_000).unwrap();
        assert_eq!(
            code(other.verify(&tok, ActivityId(5), UserId(9), 10_500)),
            "token_invalid"
        );
    }

    #[test]
    fn tampering_with_any_part_breaks_the_signature() {
        let s = signer();
        let (tok, _) = s.issue(ActivityId(5), UserId(9), 10_000, 1);
        for (i, c) in tok.char_indices() {
            if c == '.' {
                continue;
            }
            let swapped = if c == '1' { '2' } else { '1' };
            let mut bad = tok.clone();
            bad.replace_range(i..i + 1, &swapped.to_string());
            assert!(
                s.verify(&bad, ActivityId(5), UserId(9), 10_500).is_err(),
                "accepted {bad}"
            );
        }
    }

    #[test]
    fn malformed_tokens_are_named() {
        for bad in [
            "",
            "a.b",
            "1.2.3.0000000000000001.",
            "01.2.3.0000000000000001.AA",
            "1.2.3.XYZ.AA",
        ] {
            let e = decode(bad).unwrap_err();
            assert_eq!(e.code, "token_malformed", "{bad}: {e}");
        }
        assert!(decode(&"9".repeat(MAX_TOKEN_LEN + 1)).is_err());
        assert!(TokenSigner::new(b"short", 1).is_err());
    }
}
