//! The quota header families (`RateLimit`, `RateLimit-Policy`,
//! `RateLimit-*`, `X-RateLimit-*`, and the dialects' own: Shopify's call
//! limit, Salesforce's usage) from arbitrary bytes: lines of
//! `name: value`. Never panics; an answer is either advertised, absent or
//! malformed.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 12] = [
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "retry-after",
    "x-shopify-shop-api-call-limit",
    "sforce-limit-info",
];

fuzz_target!(|data: &[u8]| {
    let mut headers = http::HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some((&which, value)) = line.split_first() else {
            continue;
        };
        let name = NAMES[usize::from(which) % NAMES.len()];
        if let Ok(v) = http::HeaderValue::from_bytes(value) {
            headers.append(name, v);
        }
    }
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let _ = sluice_policy::quota::advertised(&headers, now);
    for (_, dialect) in sluice_policy::classify::Dialect::ALL {
        let _ = sluice_policy::quota::advertised_by(dialect, &headers, now);
    }
});
