//! Any bytes as a purchase / token / admin body: the decoders return a value or an error naming
//! a field — never panic — and a decoded purchase is always within its documented ranges.
#![no_main]
use libfuzzer_sys::fuzz_target;
use seckill_api::body;

fuzz_target!(|data: &[u8]| {
    match body::purchase_request(data) {
        Ok(p) => assert!(p.user_id.is_none_or(|u| u >= 1) && (1..=1_000).contains(&p.qty)),
        Err(e) => assert!(!e.field.is_empty() && !e.message.is_empty()),
    }
    if let Err(e) = body::token_request(data) {
        assert!(!e.field.is_empty());
    }
    if let Err(e) = body::activity_spec(data) {
        assert!(!e.field.is_empty());
    }
    if let Err(e) = seckill_api::payment::callback(data) {
        assert!(!e.field.is_empty());
    }
});
