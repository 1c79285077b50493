//! The time and number formats providers write their budgets in (R-PD4),
//! read once for every header and body field that carries one.
//!
//! Providers agree on little: `Retry-After: 2.0` (Shopify, a decimal),
//! `retry-after-ms: 1500` (OpenAI, Anthropic, Azure), `x-ratelimit-reset:
//! 1733` (delta seconds) or `1733400000` (a Unix time) or `1733400000.25`,
//! `x-ratelimit-reset-tokens: 6m0s` (a Go duration, OpenAI),
//! `anthropic-ratelimit-tokens-reset: 2026-11-28T16:00:00Z` (RFC 3339),
//! Jira's `X-RateLimit-Reset: 2026-11-28T16:00Z` (ISO 8601 without
//! seconds), the HTTP date of RFC 9110, and `x-ratelimit-remaining: 996.0`
//! (Reddit, a float). Each reader here takes one family and answers `None`
//! for anything else — never a panic, never a wait longer than
//! [`MAX_BELIEVED`], never a negative one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::format_description::well_known::{Iso8601, Rfc3339};
use time::OffsetDateTime;

/// The longest wait believed (a day). A provider asking for more is taken
/// to ask for a day: the hold still protects it, and the request is handed
/// back to the client long before that matters.
pub const MAX_BELIEVED: Duration = Duration::from_secs(24 * 60 * 60);

/// A number at least this large, read where a reset is expected, is a
/// Unix time in seconds (2001 on): no window lasts 30 years.
const EPOCH_SECONDS_FROM: f64 = 1e9;

/// A non-negative decimal number: `"2"`, `"2.0"`, `" 1.5 "`, `".5"`, or
/// with an exponent (`"1e3"`); not signed, not `inf` or `NaN`.
pub fn decimal(v: &str) -> Option<f64> {
    let v = v.trim();
    if !v.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0)
}

/// A count that may be written as a float (`996.0`, Reddit): rounded down,
/// as what remains is whole requests. Digits and a point only: a count
/// with an exponent is someone else's number.
pub fn count(v: &str) -> Option<u64> {
    let plain = v.trim().bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let x = decimal(v).filter(|_| plain)?;
    // `as` saturates: an absurdly large count is as large as counts go.
    Some(x.floor() as u64)
}

/// Delta seconds, whole or decimal (`"2"`, `"2.0"`, `"0.75"`), capped at
/// [`MAX_BELIEVED`].
pub fn delta_seconds(v: &str) -> Option<Duration> {
    let secs = decimal(v)?;
    Some(Duration::from_secs_f64(
        secs.min(MAX_BELIEVED.as_secs_f64()),
    ))
}

/// Milliseconds (`retry-after-ms: 1500`, or `1500.5`), capped at
/// [`MAX_BELIEVED`].
pub fn milliseconds(v: &str) -> Option<Duration> {
    let ms = decimal(v)?;
    Some(Duration::from_secs_f64(
        (ms / 1000.0).min(MAX_BELIEVED.as_secs_f64()),
    ))
}

/// A Go duration as `time.Duration.String()` writes it and
/// `time.ParseDuration` reads it: `"6m0s"`, `"1.5s"`, `"12ms"`,
/// `"1h2m3.5s"`, `"250us"` / `"250µs"`, `"0"`. Unsigned (a negative wait
/// means nothing here); capped at [`MAX_BELIEVED`].
pub fn go_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    if v == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = v;
    let mut secs = 0.0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n = decimal(&rest[..num_len])?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        secs += n * scale;
    }
    Some(Duration::from_secs_f64(
        secs.min(MAX_BELIEVED.as_secs_f64()),
    ))
}

/// A point in time as RFC 3339 (`2026-11-28T16:00:00Z`,
/// `2026-11-28T17:00:00.5+01:00`) or ISO 8601 (`2026-11-28T16:00Z`):
/// the wait from `now_wall` until it, zero if it has passed.
pub fn timestamp(v: &str, now_wall: SystemTime) -> Option<Duration> {
    let v = v.trim();
    // Every such time starts with a four-digit year: anything else is not
    // one (and the parsers need not look).
    if v.len() < 10 || !v.as_bytes()[..4].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let at = OffsetDateTime::parse(v, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(v, &Iso8601::DEFAULT))
        .ok()?;
    let nanos = at.unix_timestamp_nanos();
    Some(until(system_time(nanos)?, now_wall))
}

/// A Unix time in seconds, whole or fractional: the wait until it.
pub fn epoch_seconds(v: &str, now_wall: SystemTime) -> Option<Duration> {
    let secs = decimal(v)?;
    Some(until(epoch(secs), now_wall))
}

/// A reset as providers write one where the format is not fixed: delta
/// seconds or a Unix time (told apart by size), a Go duration, an RFC 3339
/// or ISO 8601 time, or an HTTP date. The wait from `now_wall` until it.
pub fn reset(v: &str, now_wall: SystemTime) -> Option<Duration> {
    if let Some(secs) = decimal(v) {
        return Some(if secs >= EPOCH_SECONDS_FROM {
            until(epoch(secs), now_wall)
        } else {
            Duration::from_secs_f64(secs.min(MAX_BELIEVED.as_secs_f64()))
        });
    }
    go_duration(v)
        .or_else(|| timestamp(v, now_wall))
        .or_else(|| http_date(v, now_wall))
}

/// An HTTP date in any of RFC 9110's three formats: the wait until it.
pub fn http_date(v: &str, now_wall: SystemTime) -> Option<Duration> {
    let at = httpdate::parse_http_date(v.trim()).ok()?;
    Some(until(at, now_wall))
}

/// Whether a reset was written to the whole second (the true reset may be
/// up to a second earlier).
pub fn whole_seconds(v: &str) -> bool {
    decimal(v).is_some() && !v.contains('.')
}

fn epoch(secs: f64) -> SystemTime {
    Duration::try_from_secs_f64(secs)
        .ok()
        .and_then(|d| UNIX_EPOCH.checked_add(d))
        // Beyond what a clock can hold: as far off as anything is believed.
        .unwrap_or_else(|| UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX)) * 64)
}

fn system_time(nanos: i128) -> Option<SystemTime> {
    if nanos <= 0 {
        return Some(UNIX_EPOCH);
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, sub))
}

fn until(at: SystemTime, now_wall: SystemTime) -> Duration {
    at.duration_since(now_wall)
        .unwrap_or(Duration::ZERO)
        .min(MAX_BELIEVED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// 2026-11-28T16:00:00Z.
    const NOW: u64 = 1_795_881_600;

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    /// R-PD4: numbers as providers write them — Reddit's float remaining,
    /// Shopify's decimal `Retry-After`, `retry-after-ms`.
    #[test]
    fn decimals_counts_and_milliseconds() {
        assert_eq!(count("996.0"), Some(996));
        assert_eq!(count("996.7"), Some(996));
        assert_eq!(count(" 12 "), Some(12));
        assert_eq!(delta_seconds("2.0"), ms(2000));
        assert_eq!(delta_seconds("0.75"), ms(750));
        assert_eq!(delta_seconds("1."), ms(1000));
        assert_eq!(delta_seconds(".5"), ms(500));
        assert_eq!(milliseconds("1500"), ms(1500));
        assert_eq!(delta_seconds("99999999999"), Some(MAX_BELIEVED));
        assert_eq!(count("1e3"), None);
        assert_eq!(decimal("1e3"), Some(1000.0));
        for bad in [
            "", ".", "-1", "inf", "NaN", "1,5", "2 s", "0x10", "+1", "1e400",
        ] {
            assert_eq!(decimal(bad), None, "{bad:?}");
            assert_eq!(count(bad), None, "{bad:?}");
        }
    }

    /// R-PD4: Go durations, as OpenAI writes its resets.
    #[test]
    fn go_durations() {
        assert_eq!(go_duration("6m0s"), ms(360_000));
        assert_eq!(go_duration("1.5s"), ms(1500));
        assert_eq!(go_duration("12ms"), ms(12));
        assert_eq!(go_duration("1h2m3.5s"), ms(3_723_500));
        assert_eq!(go_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(go_duration("250µs"), Some(Duration::from_micros(250)));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("0s"), Some(Duration::ZERO));
        assert_eq!(go_duration("48h"), Some(MAX_BELIEVED));
        for bad in ["", "6", "s", "-1s", "1x", "1s2", "m1s", "1.2.3s", "1 s"] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
    }

    /// R-PD4: points in time — RFC 3339 (Anthropic), ISO 8601 without
    /// seconds (Jira), offsets, fractions; past times are no wait.
    #[test]
    fn timestamps() {
        let now = at(NOW);
        assert_eq!(timestamp("2026-11-28T16:00:30Z", now), ms(30_000));
        assert_eq!(timestamp("2026-11-28T16:00:00.25Z", now), ms(250));
        assert_eq!(timestamp("2026-11-28T17:00:10+01:00", now), ms(10_000));
        assert_eq!(timestamp("2026-11-28T16:01Z", now), ms(60_000));
        assert_eq!(timestamp("2026-11-28T15:00:00Z", now), Some(Duration::ZERO));
        assert_eq!(timestamp("2030-01-01T00:00:00Z", now), Some(MAX_BELIEVED));
        for bad in [
            "",
            "2026",
            "2026-13-01T00:00:00Z",
            "yesterday",
            "1795881600",
        ] {
            assert_eq!(timestamp(bad, now), None, "{bad:?}");
        }
    }

    /// R-PD4: a reset in whatever form it comes.
    #[test]
    fn resets_in_every_form() {
        let now = at(NOW);
        assert_eq!(reset("30", now), ms(30_000));
        assert_eq!(reset("1.2", now), ms(1200));
        assert_eq!(reset("1795881630", now), ms(30_000));
        assert_eq!(reset("1795881600.5", now), ms(500));
        assert_eq!(reset("6m0s", now), ms(360_000));
        assert_eq!(reset("2026-11-28T16:00:05Z", now), ms(5000));
        assert_eq!(reset("Sat, 28 Nov 2026 16:00:07 GMT", now), ms(7000));
        assert_eq!(reset("soon", now), None);
        assert!(whole_seconds("30") && !whole_seconds("30.0") && !whole_seconds("6m0s"));
    }

    proptest::proptest! {
        /// Never a panic, never a wait past what is believed.
        #[test]
        fn never_panics_nor_waits_past_a_day(s in ".{0,40}") {
            let now = at(NOW);
            for wait in [
                reset(&s, now),
                go_duration(&s),
                delta_seconds(&s),
                milliseconds(&s),
                timestamp(&s, now),
            ]
            .into_iter()
            .flatten()
            {
                proptest::prop_assert!(wait <= MAX_BELIEVED);
            }
            let _ = count(&s);
        }

        /// Go durations as Go writes them read back.
        #[test]
        fn go_durations_read_back(h in 0u64..24, m in 0u64..60, ms in 0u64..60_000) {
            let text = format!("{h}h{m}m{}.{:03}s", ms / 1000, ms % 1000);
            let want = Duration::from_millis(((h * 60 + m) * 60) * 1000 + ms);
            let got = go_duration(&text).unwrap();
            proptest::prop_assert!(got.abs_diff(want) < Duration::from_micros(1), "{text}: {got:?}");
        }
    }
}
