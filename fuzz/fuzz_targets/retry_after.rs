//! `Retry-After` as providers send it: delta seconds or an HTTP date, or
//! anything else. Never panics; a wait it returns is bounded by what the
//! header could say.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    if let Some(wait) = sluice_policy::classify::retry_after::parse(text, now) {
        // Formatting it back never panics either.
        let _ = sluice_policy::classify::retry_after::format_delta(wait);
    }
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_bytes(data) {
        headers.insert(http::header::RETRY_AFTER, v);
        let _ = sluice_policy::classify::retry_after::from_headers(&headers, now);
    }
});
