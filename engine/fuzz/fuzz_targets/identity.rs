//! Any bytes as an `Authorization` header and as a payment callback's signature: verification
//! never panics, and nothing the fuzzer makes up is believed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use seckill_api::identity::Identity;
use seckill_api::payment::CallbackVerifier;

fuzz_target!(|data: &[u8]| {
    let id = Identity::hs256(&[7u8; 32], None, None).unwrap();
    assert!(id.verify(Some(data), 1_800_000_000_000).is_err(), "forged identity accepted");
    let v = CallbackVerifier::new(b"fuzz-payment-secret");
    assert!(v.verify(Some(data), b"{}", 1_800_000_000_000).is_err(), "forged callback accepted");
});
