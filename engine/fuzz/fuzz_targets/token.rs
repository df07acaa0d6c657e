//! Any string as a purchase token: decoding never panics, and a token that decodes re-encodes
//! its numbers exactly; nothing the fuzzer makes up passes verification.
#![no_main]
use libfuzzer_sys::fuzz_target;
use seckill_api::token::{decode, TokenSigner};
use seckill_core::domain::{ActivityId, UserId};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(t) = decode(s) {
        assert!(s.starts_with(&format!("{}.{}.{}.", t.activity, t.user, t.expires_ms)));
    }
    let signer = TokenSigner::new(&[9u8; 32], 60_000).unwrap();
    assert!(signer.verify(s, ActivityId(1), UserId(1), 0).is_err(), "forged token accepted: {s}");
});
