//! Any bytes as `X-Forwarded-For` values (split at NUL into several instances of the header)
//! from a trusted proxy and from any other peer: the client address is never made up — from an
//! untrusted peer it is the peer, from a trusted one the peer or one of the header's own hops —
//! and nothing panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use seckill_api::limits::client_ip;
use std::net::IpAddr;

fuzz_target!(|data: &[u8]| {
    let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
    let values: Vec<&[u8]> = data.split(|b| *b == 0).collect();
    let stranger: IpAddr = "192.0.2.7".parse().unwrap();
    assert_eq!(client_ip(stranger, values.iter().copied(), &trusted), Ok(stranger));
    let proxy: IpAddr = "10.1.2.3".parse().unwrap();
    if let Ok(client) = client_ip(proxy, values.iter().copied(), &trusted) {
        let text: Vec<String> = values.iter().map(|v| String::from_utf8_lossy(v).into_owned()).collect();
        let named = text
            .iter()
            .flat_map(|v| v.split(','))
            .any(|hop| hop.trim().parse::<IpAddr>() == Ok(client));
        assert!(client == proxy || named, "{client} is neither the peer nor a hop of {text:?}");
    }
});
