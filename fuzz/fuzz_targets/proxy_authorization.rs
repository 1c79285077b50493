//! `Proxy-Authorization` from a client: any bytes are a known identity or
//! refused — never a panic, never an identity for a wrong pair.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::PROXY_AUTHORIZATION, value);
    let credentials: HashMap<String, String> =
        [("collector-a".to_string(), "s3cret".to_string())].into();
    if let Ok(identity) = sluice::serve::auth::authenticate(&headers, &credentials) {
        // Only the one right pair gets through (its user may name a run
        // mode: `collector-a+catchup`).
        assert_eq!(identity.user.as_deref(), Some("collector-a"));
    }
});
