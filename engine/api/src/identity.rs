//! Who is calling (DESIGN §12): a bearer JWT on every user route, verified with `jsonwebtoken`.
//! `sub` is the decimal user id, `exp` is required, `iss` / `aud` are checked when configured.
//! Keys: an HS256 secret, or the public keys of a JWKS file (RS256 / ES256 / EdDSA …), picked by
//! the token's `kid`. A JWKS is reloaded while serving (`reload_jwks`): a login service that
//! rotates its keys publishes the new one beside the old, and no pod needs a restart.
//!
//! Expiry is checked here against the engine's clock (`tokio::time` through `Clock`), not by the
//! crate (which reads the system clock), so that paused-time tests and the wall clock agree.

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use seckill_core::domain::UserId;

/// Tolerated clock difference between the login service and this engine.
const LEEWAY_S: u64 = 30;
/// The shortest HS256 secret accepted (RFC 7518 §3.2: at least the hash size).
pub const MIN_SECRET_LEN: usize = 32;
/// The smallest RSA modulus a JWKS key may have (NIST SP 800-131A: 1024-bit keys are broken).
const MIN_RSA_BITS: usize = 2048;

/// The verified caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller(pub UserId);

/// Why a request has no identity: answered 401 with `WWW-Authenticate: Bearer`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct AuthError {
    /// `missing` (no credential at all) or `invalid_token`.
    pub kind: &'static str,
    pub reason: String,
}

fn invalid(reason: impl Into<String>) -> AuthError {
    AuthError {
        kind: "invalid_token",
        reason: reason.into(),
    }
}

enum Keys {
    Secret(DecodingKey),
    /// (kid, algorithm, key) of each JWKS entry.
    Set(Vec<(Option<String>, Algorithm, DecodingKey)>),
}

pub struct Identity {
    /// Swapped whole by a reload; a std lock, held for one verification (no await inside), so a
    /// request verifies against one consistent key set.
    keys: std::sync::RwLock<Keys>,
    issuer: Option<String>,
    audience: Option<String>,
}

#[derive(serde::Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    /// Not before (seconds): a token issued for later is refused until then.
    nbf: Option<u64>,
}

/// A JWKS key too weak to verify with: an "oct" (shared) key shorter than `MIN_SECRET_LEN`, or
/// an RSA key under `MIN_RSA_BITS`.
fn weak(jwk: &jsonwebtoken::jwk::Jwk) -> Option<String> {
    use base64::Engine;
    use jsonwebtoken::jwk::AlgorithmParameters;
    let bytes = |b64: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(b64.trim_end_matches('='))
            .map(|b| b.len())
            .unwrap_or(0)
    };
    match &jwk.algorithm {
        AlgorithmParameters::OctetKey(k) if bytes(&k.value) < MIN_SECRET_LEN => Some(format!(
            "an \"oct\" key of {} bytes (at least {MIN_SECRET_LEN})",
            bytes(&k.value)
        )),
        AlgorithmParameters::RSA(k) => {
            let n = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(k.n.trim_end_matches('='))
                .unwrap_or_default();
            let bits = n.iter().position(|b| *b != 0).map_or(0, |first| {
                (n.len() - first) * 8 - n[first].leading_zeros() as usize
            });
            (bits < MIN_RSA_BITS).then(|| format!("an RSA key of {bits} bits (at least {MIN_RSA_BITS})"))
        }
        _ => None,
    }
}

impl Identity {
    pub fn hs256(
        secret: &[u8],
        issuer: Option<String>,
        audience: Option<String>,
    ) -> Result<Identity, String> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(format!("must be at least {MIN_SECRET_LEN} bytes"));
        }
        Ok(Identity {
            keys: std::sync::RwLock::new(Keys::Secret(DecodingKey::from_secret(secret))),
            issuer,
            audience,
        })
    }

    /// From the text of a JWKS file: every key needs an `alg` (a key is not used for an
    /// algorithm it was not published for); `kid` picks the key when there are several.
    pub fn jwks(text: &str, issuer: Option<String>, audience: Option<String>) -> Result<Identity, String> {
        Ok(Identity {
            keys: std::sync::RwLock::new(Keys::Set(Self::key_set(text)?)),
            issuer,
            audience,
        })
    }

    /// Verify with the keys of `text` (a JWKS document) from now on; the number of keys. A
    /// document that does not load changes nothing (the keys in use stay): a half-written file
    /// or a bad key must not lock every buyer out.
    pub fn reload_jwks(&self, text: &str) -> Result<usize, String> {
        if matches!(
            *self.keys.read().unwrap_or_else(|p| p.into_inner()),
            Keys::Secret(_)
        ) {
            return Err("this identity verifies with a shared secret, not a JWKS".into());
        }
        let set = Self::key_set(text)?;
        let n = set.len();
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Keys::Set(set);
        Ok(n)
    }

    /// (kid, algorithm, key) of each key of a JWKS document.
    fn key_set(text: &str) -> Result<Vec<(Option<String>, Algorithm, DecodingKey)>, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
        if set.keys.is_empty() {
            return Err("the key set is empty".into());
        }
        let mut keys = Vec::with_capacity(set.keys.len());
        for (i, jwk) in set.keys.iter().enumerate() {
            let name = jwk.common.key_id.clone().unwrap_or_else(|| format!("#{i}"));
            let alg = jwk
                .common
                .key_algorithm
                .ok_or_else(|| format!("key {name}: no \"alg\""))?;
            let alg: Algorithm = alg
                .to_string()
                .parse()
                .map_err(|_| format!("key {name}: \"alg\" {alg} is not a signature algorithm"))?;
            if let Some(why) = weak(jwk) {
                return Err(format!("key {name}: {why}"));
            }
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {name}: {e}"))?;
            keys.push((jwk.common.key_id.clone(), alg, key));
        }
        Ok(keys)
    }

    /// The caller named by an `Authorization: Bearer <JWT>` header value.
    pub fn verify(&self, authorization: Option<&[u8]>, now_ms: u64) -> Result<Caller, AuthError> {
        let Some(value) = authorization else {
            return Err(AuthError {
                kind: "missing",
                reason: "this route needs an identity: Authorization: Bearer <JWT>".into(),
            });
        };
        let token = std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| invalid("the Authorization header is not \"Bearer <JWT>\""))?;
        let header = jsonwebtoken::decode_header(token).map_err(|e| invalid(format!("not a JWT: {e}")))?;
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let (alg, key) = match &*keys {
            Keys::Secret(key) => (Algorithm::HS256, key),
            Keys::Set(keys) => {
                let found = match &header.kid {
                    Some(kid) => keys.iter().find(|(k, _, _)| k.as_deref() == Some(kid)),
                    None if keys.len() == 1 => keys.first(),
                    None => None,
                };
                let (_, alg, key) = found.ok_or_else(|| invalid("no key for this token's \"kid\""))?;
                (*alg, key)
            }
        };
        if header.alg != alg {
            return Err(invalid(format!(
                "signed with {:?}, the key is for {alg:?}",
                header.alg
            )));
        }
        let mut v = Validation::new(alg);
        v.validate_exp = false; // checked below against the engine's clock
        v.set_required_spec_claims(&["exp", "sub"]);
        v.validate_aud = self.audience.is_some();
        if let Some(aud) = &self.audience {
            v.set_audience(&[aud]);
            v.required_spec_claims.insert("aud".into());
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
            v.required_spec_claims.insert("iss".into());
        }
        let data = jsonwebtoken::decode::<Claims>(token, key, &v).map_err(|e| invalid(e.to_string()))?;
        if data.claims.exp.saturating_add(LEEWAY_S).saturating_mul(1_000) < now_ms {
            return Err(invalid("the token has expired"));
        }
        if (data.claims.nbf).is_some_and(|nbf| nbf.saturating_sub(LEEWAY_S).saturating_mul(1_000) > now_ms) {
            return Err(invalid("the token is not valid yet (\"nbf\")"));
        }
        user_of(&data.claims.sub).map(Caller).map_err(invalid)
    }
}

/// The user a `sub` claim names: a decimal user id.
fn user_of(sub: &str) -> Result<UserId, String> {
    (!sub.is_empty() && sub.len() <= 19 && sub.bytes().all(|c| c.is_ascii_digit()))
        .then(|| sub.parse::<u64>().ok())
        .flatten()
        .filter(|u| (1..=i64::MAX as u64).contains(u))
        .map(UserId)
        .ok_or_else(|| format!("\"sub\" must be a user id (a positive integer), got {sub:?}"))
}

/// The user a JWT names, read without checking its signature or times — for a client holding
/// tokens the login service issued (`seckill load --jwts-file`), never to let anyone in.
pub fn subject_unverified(token: &str) -> Result<UserId, String> {
    #[derive(serde::Deserialize)]
    struct Subject {
        sub: String,
    }
    let data = jsonwebtoken::dangerous::insecure_decode::<Subject>(token).map_err(|e| e.to_string())?;
    user_of(&data.claims.sub)
}

/// An HS256 user JWT, as a login service would issue it (`seckill jwt`, `load`, `demo`, tests).
pub fn mint(
    secret: &[u8],
    user: UserId,
    exp_unix_s: u64,
    issuer: Option<&str>,
    audience: Option<&str>,
) -> String {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        sub: String,
        exp: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        iss: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        aud: Option<&'a str>,
    }
    let claims = Out {
        sub: user.0.to_string(),
        exp: exp_unix_s,
        iss: issuer,
        aud: audience,
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .expect("HS256 over plain claims cannot fail")
}

/// Where `serve` on the embedded default keeps its development key, and where `seckill jwt`
/// finds it: one file per machine user, reused across restarts (JWTs minted before still work).
pub fn dev_secret_path() -> std::path::PathBuf {
    std::env::temp_dir().join("seckill-dev-jwt-secret")
}

/// The development key: read from `dev_secret_path()`, or made (hex of 32 random bytes, file
/// mode 0600) if there is none yet. The file sits in a directory everyone may write to (`/tmp`):
/// it is created exclusively (never through a link somebody planted) and a file found there is
/// used only if it is this user's own, a plain file, and readable by nobody else — otherwise
/// anyone on the machine could choose the key and mint any user's JWT.
pub fn dev_secret(rng: &mut impl rand::RngCore) -> Result<String, String> {
    let path = dev_secret_path();
    if let Some(secret) = read_dev_secret(&path)? {
        return Ok(secret);
    }
    let mut b = [0u8; 32];
    rng.fill_bytes(&mut b);
    let secret: String = b.iter().map(|b| format!("{b:02x}")).collect();
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path);
    match created {
        Ok(mut f) => f
            .write_all(secret.as_bytes())
            .map(|()| secret)
            .map_err(|e| format!("{}: {e}", path.display())),
        // Another process made it between the read and the create: use its key.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_dev_secret(&path)?
            .ok_or_else(|| format!("{}: exists but holds no key; remove it", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The key in an existing development key file; `None` if there is no file (or it holds too
/// short a key, as a file being written does). Refused by name: a link, a file of another user, a
/// file others may read or write.
fn read_dev_secret(path: &std::path::Path) -> Result<Option<String>, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = |e: std::io::Error| format!("{}: {e}", path.display());
    let refused = |why: &str| {
        format!(
            "the development JWT key {} {why}: whoever made it could mint any user's JWT; \
             remove it (a new one is made) or set SECKILL_JWT_SECRET",
            path.display()
        )
    };
    // The file read is the file checked: opened without following a link, then its own metadata.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refused("is not a plain file (a link?)"))
        }
        Err(e) => return Err(shown(e)),
    };
    let m = file.metadata().map_err(shown)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.file_type().is_file() {
        return Err(refused("is not a plain file (a link?)"));
    } else if m.uid() != me {
        return Err(refused(&format!(
            "belongs to uid {}, not to this user (uid {me})",
            m.uid()
        )));
    } else if m.mode() & 0o077 != 0 {
        return Err(refused(&format!(
            "may be read or written by others (mode {:o})",
            m.mode() & 0o777
        )));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(shown)?;
    let text = text.trim();
    Ok((text.len() >= MIN_SECRET_LEN).then(|| text.to_string()))
}

/// The HS256 secret a tool mints user JWTs with (`seckill jwt`, `seckill load`): the
/// `SECKILL_JWT_SECRET` of the server, or else the development key a `serve` on the embedded
/// default made.
pub fn minting_secret(env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    if let Some(s) = env("SECKILL_JWT_SECRET").filter(|s| !s.is_empty()) {
        if s.len() < MIN_SECRET_LEN {
            return Err(format!(
                "SECKILL_JWT_SECRET: must be at least {MIN_SECRET_LEN} bytes"
            ));
        }
        return Ok(s);
    }
    let path = dev_secret_path();
    read_dev_secret(&path)?.ok_or_else(|| {
        format!(
            "SECKILL_JWT_SECRET is not set and there is no development key in {} yet: \
             start `seckill serve` on the embedded default first, or set the server's secret",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW_MS: u64 = 1_800_000_000_000;

    fn bearer(t: &str) -> Vec<u8> {
        format!("Bearer {t}").into_bytes()
    }

    #[test]
    fn a_user_jwt_names_its_user_until_it_expires() {
        let id = Identity::hs256(SECRET, None, None).unwrap();
        let t = mint(SECRET, UserId(8), NOW_MS / 1_000 + 60, None, None);
        assert_eq!(id.verify(Some(&bearer(&t)), NOW_MS), Ok(Caller(UserId(8))));
        let late = NOW_MS + (60 + LEEWAY_S + 1) * 1_000;
        assert_eq!(
            id.verify(Some(&bearer(&t)), late).unwrap_err().kind,
            "invalid_token"
        );
    }

    #[test]
    fn missing_forged_and_malformed_identities_are_refused() {
        let id = Identity::hs256(SECRET, None, None).unwrap();
        assert_eq!(id.verify(None, NOW_MS).unwrap_err().kind, "missing");
        let forged = mint(
            b"another secret, long enough to pass",
            UserId(8),
            NOW_MS / 1_000 + 60,
            None,
            None,
        );
        assert!(id.verify(Some(&bearer(&forged)), NOW_MS).is_err());
        for bad in [&b"Basic abc"[..], b"Bearer ", b"Bearer a.b.c", b"\xff"] {
            assert_eq!(id.verify(Some(bad), NOW_MS).unwrap_err().kind, "invalid_token");
        }
        let zero = mint(SECRET, UserId(0), NOW_MS / 1_000 + 60, None, None);
        assert!(id
            .verify(Some(&bearer(&zero)), NOW_MS)
            .unwrap_err()
            .reason
            .contains("sub"));
    }

    #[test]
    fn issuer_and_audience_are_checked_when_configured() {
        let id = Identity::hs256(SECRET, Some("login".into()), Some("seckill".into())).unwrap();
        let exp = NOW_MS / 1_000 + 60;
        let good = mint(SECRET, UserId(3), exp, Some("login"), Some("seckill"));
        assert_eq!(id.verify(Some(&bearer(&good)), NOW_MS), Ok(Caller(UserId(3))));
        for t in [
            mint(SECRET, UserId(3), exp, Some("other"), Some("seckill")),
            mint(SECRET, UserId(3), exp, Some("login"), Some("other")),
            mint(SECRET, UserId(3), exp, None, Some("seckill")),
            mint(SECRET, UserId(3), exp, Some("login"), None),
        ] {
            assert!(id.verify(Some(&bearer(&t)), NOW_MS).is_err());
        }
    }

    /// A test-only Ed25519 key (made with `openssl genpkey -algorithm ed25519`) and its JWK `x`.
    const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFw8VcBmhx9O8s1x5LrOoKS9kDrsd5DXxFcsjnRqYIz7\n-----END PRIVATE KEY-----\n";
    const ED_X: &str = "jVIpzkYW5gs3RSN98c2u3_AITHW4d8CcJyrNwJY1bTc";

    #[test]
    fn an_eddsa_jwt_verifies_against_the_jwks_key_its_kid_names() {
        let jwks = format!(
            r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","alg":"EdDSA","kid":"login-1","x":"{ED_X}"}},
                         {{"kty":"oct","alg":"HS256","kid":"other","k":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}]}}"#
        );
        let id = Identity::jwks(&jwks, None, None).unwrap();
        let key = EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
        let sign = |kid: Option<&str>| {
            let mut h = Header::new(Algorithm::EdDSA);
            h.kid = kid.map(str::to_string);
            let claims = serde_json::json!({"sub": "12", "exp": NOW_MS / 1_000 + 60});
            jsonwebtoken::encode(&h, &claims, &key).unwrap()
        };
        assert_eq!(
            id.verify(Some(&bearer(&sign(Some("login-1")))), NOW_MS),
            Ok(Caller(UserId(12)))
        );
        assert!(
            id.verify(Some(&bearer(&sign(Some("other")))), NOW_MS).is_err(),
            "wrong key's kid"
        );
        assert!(
            id.verify(Some(&bearer(&sign(None))), NOW_MS).is_err(),
            "no kid among two keys"
        );
    }

    #[test]
    fn a_jwks_key_is_used_only_for_its_algorithm() {
        // An HS256 token presented to a key set that publishes an "oct" key for HS384 only.
        let k = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, SECRET);
        let jwks = format!(r#"{{"keys":[{{"kty":"oct","alg":"HS384","kid":"a","k":"{k}"}}]}}"#);
        let id = Identity::jwks(&jwks, None, None).unwrap();
        let t = mint(SECRET, UserId(3), NOW_MS / 1_000 + 60, None, None);
        assert!(id
            .verify(Some(&bearer(&t)), NOW_MS)
            .unwrap_err()
            .reason
            .contains("HS384"));
        assert!(Identity::jwks(r#"{"keys":[]}"#, None, None).is_err());
        let no_alg = Identity::jwks(r#"{"keys":[{"kty":"oct","k":"AA"}]}"#, None, None);
        assert!(no_alg.err().unwrap().contains("alg"));
    }

    #[test]
    fn a_reloaded_key_set_replaces_the_old_one_and_a_bad_one_changes_nothing() {
        let set = |secret: &[u8]| {
            let k = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, secret);
            format!(r#"{{"keys":[{{"kty":"oct","alg":"HS256","kid":"k","k":"{k}"}}]}}"#)
        };
        let (old, new) = (SECRET, b"fedcba9876543210fedcba9876543210");
        let id = Identity::jwks(&set(old), None, None).unwrap();
        let by = |secret: &[u8]| bearer(&mint(secret, UserId(5), NOW_MS / 1_000 + 60, None, None));
        assert!(id.verify(Some(&by(old)), NOW_MS).is_ok());
        assert!(id.verify(Some(&by(new)), NOW_MS).is_err());
        assert_eq!(id.reload_jwks(&set(new)), Ok(1));
        assert_eq!(id.verify(Some(&by(new)), NOW_MS), Ok(Caller(UserId(5))));
        assert!(id.verify(Some(&by(old)), NOW_MS).is_err(), "the old key is gone");
        for bad in ["", "{\"keys\": [", r#"{"keys":[]}"#] {
            assert!(id.reload_jwks(bad).is_err(), "{bad:?}");
            assert!(
                id.verify(Some(&by(new)), NOW_MS).is_ok(),
                "a bad document changed the keys"
            );
        }
        let hs = Identity::hs256(SECRET, None, None).unwrap();
        assert!(
            hs.reload_jwks(&set(new)).is_err(),
            "a shared secret is not a key set"
        );
    }

    /// Public moduli of test-only RSA keys (`openssl genrsa`), base64url.
    const RSA_2048_N: &str = "wfuFFypq8a_hg8mCkFpUNzYq_TNBi1vI2S4vEph7OIUeRyqL6mS_ccj28ua91WJ2EtFLJECO1abEttLFtUUbGNvKJw3ob9MyMpfE1GqvBYOUXN2ZDJvRFS2PraGjTnUqj5nkVK6BZczF98pUy_Y4yYSFjz9NOu-hV0wCfM9AE_QjOAbXEq3snDcpBuI2qB3k5xHLzXQotxLJxZMTwHlQ4Pz0yFQzuPu6DJru0IPdnW8833vxLcoyX4aPclkeTpfYH2ntNg1kupaKak8JUBNT10shPjJnwGNvYCGDc_84NhQlow_XZ5nSCVz9Rc_UwBcKar31B02pOjyzFE2O74VC7Q";
    const RSA_1024_N: &str = "uNk1k14QDwRsxQThKrudwSWdD2yppxjmMG63e6FC-r35UuhllFqh0p0hTdnwXhsWBBIF7ISTUTUpb7vICoUuEvmsRyOeviZlSPsEiV_nmIWsH29UpGnTkJU3Bq0yMZAGeHb6J6ZjdoypWoEydwNvPALkICXgqe14JRXD1Ur0XE0";

    fn rsa_jwks(n: &str) -> String {
        format!(r#"{{"keys":[{{"kty":"RSA","alg":"RS256","kid":"rsa","n":"{n}","e":"AQAB"}}]}}"#)
    }

    #[test]
    fn weak_jwks_keys_are_refused_by_name() {
        assert!(Identity::jwks(&rsa_jwks(RSA_2048_N), None, None).is_ok());
        let e = Identity::jwks(&rsa_jwks(RSA_1024_N), None, None).err().unwrap();
        assert!(e.contains("key rsa") && e.contains("1024 bits"), "{e}");
        let e = Identity::jwks(
            r#"{"keys":[{"kty":"oct","alg":"HS256","kid":"s","k":"c2hvcnQ"}]}"#,
            None,
            None,
        )
        .err()
        .unwrap();
        assert!(e.contains("key s") && e.contains("5 bytes"), "{e}");
    }

    /// The attacks a JWT library is known for: a token that claims no signature (`alg: none`),
    /// and an HS256 token keyed with the RSA public key the verifier trusts (algorithm confusion).
    #[test]
    fn unsigned_tokens_and_algorithm_confusion_are_refused() {
        let b64 = |v: &serde_json::Value| {
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, v.to_string())
        };
        let claims = serde_json::json!({"sub": "12", "exp": NOW_MS / 1_000 + 60});
        let none = format!(
            "{}.{}.",
            b64(&serde_json::json!({"alg": "none", "typ": "JWT"})),
            b64(&claims)
        );
        for id in [
            Identity::hs256(SECRET, None, None).unwrap(),
            Identity::jwks(&rsa_jwks(RSA_2048_N), None, None).unwrap(),
        ] {
            assert!(
                id.verify(Some(&bearer(&none)), NOW_MS).is_err(),
                "alg none accepted"
            );
        }
        let rsa = Identity::jwks(&rsa_jwks(RSA_2048_N), None, None).unwrap();
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("rsa".into());
        let confused =
            jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(RSA_2048_N.as_bytes())).unwrap();
        let e = rsa.verify(Some(&bearer(&confused)), NOW_MS).unwrap_err();
        assert!(e.reason.contains("RS256"), "{}", e.reason);
    }

    #[test]
    fn a_token_is_refused_before_its_not_before() {
        let id = Identity::hs256(SECRET, None, None).unwrap();
        let key = EncodingKey::from_secret(SECRET);
        let sign = |nbf: u64| {
            let claims = serde_json::json!({"sub": "4", "exp": NOW_MS / 1_000 + 3_600, "nbf": nbf});
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
        };
        let later = sign(NOW_MS / 1_000 + LEEWAY_S + 60);
        assert!(id
            .verify(Some(&bearer(&later)), NOW_MS)
            .unwrap_err()
            .reason
            .contains("nbf"));
        assert_eq!(
            id.verify(Some(&bearer(&later)), NOW_MS + 61_000),
            Ok(Caller(UserId(4)))
        );
        let now = sign(NOW_MS / 1_000);
        assert_eq!(id.verify(Some(&bearer(&now)), NOW_MS), Ok(Caller(UserId(4))));
    }

    #[test]
    fn a_development_key_file_somebody_else_could_have_made_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("seckill-dev-key-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = "ab".repeat(32);
        let file = dir.join("key");
        std::fs::write(&file, &key).unwrap();

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_dev_secret(&file), Ok(Some(key.clone())));
        assert_eq!(read_dev_secret(&dir.join("absent")), Ok(None));

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_dev_secret(&file).unwrap_err();
        assert!(e.contains("may be read or written by others (mode 644)"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();

        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = read_dev_secret(&link).unwrap_err();
        assert!(e.contains("is not a plain file"), "{e}");

        // Another user's file: only root can make one here (CI runs as root).
        let me = unsafe { libc::geteuid() };
        if me == 0 {
            std::os::unix::fs::chown(&file, Some(1), None).unwrap();
            let e = read_dev_secret(&file).unwrap_err();
            assert!(e.contains("belongs to uid 1, not to this user (uid 0)"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
