//! Any bytes as the login service's JWKS file, loaded at start and reloaded while serving: a
//! document either loads or is refused with a reason (never a panic), a refused reload leaves
//! the keys in use, and a token checked against whatever loaded never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use seckill_api::identity::{mint, Identity};
use seckill_core::domain::UserId;

const KEY: &[u8] = b"fuzz-login-service-key-0123456789";
const NOW_MS: u64 = 1_800_000_000_000;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(id) = Identity::jwks(&text, None, None) {
        let _ = id.verify(Some(data), NOW_MS);
    }
    // A reload of the same bytes over a key set that works.
    let k = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, KEY);
    let good = format!(r#"{{"keys":[{{"kty":"oct","alg":"HS256","kid":"k","k":"{k}"}}]}}"#);
    let id = Identity::jwks(&good, None, None).unwrap();
    let token = format!("Bearer {}", mint(KEY, UserId(9), NOW_MS / 1_000 + 60, None, None));
    if id.reload_jwks(&text).is_err() {
        assert!(id.verify(Some(token.as_bytes()), NOW_MS).is_ok(), "a refused reload changed the keys");
    }
    let _ = id.verify(Some(data), NOW_MS);
});

