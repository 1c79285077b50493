//! Every time and number format providers write their budgets in (R-PD4):
//! delta seconds, milliseconds, Unix times, Go durations, RFC 3339, ISO
//! 8601, HTTP dates, float counts. Never panics; no wait is longer than
//! what is believed.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use sluice_policy::classify::formats;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    for wait in [
        formats::reset(text, now),
        formats::go_duration(text),
        formats::delta_seconds(text),
        formats::milliseconds(text),
        formats::timestamp(text, now),
        formats::epoch_seconds(text, now),
        formats::http_date(text, now),
    ]
    .into_iter()
    .flatten()
    {
        assert!(wait <= formats::MAX_BELIEVED);
    }
    let _ = formats::count(text);
});
