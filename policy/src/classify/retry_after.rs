//! Parsing `Retry-After` (RFC 9110 §10.2.3) and `retry-after-ms`.
//!
//! A provider that says when to come back has told us the one number no
//! controller can learn as well, so sluice honours it exactly. The header is
//! delta-seconds or an HTTP-date. RFC 9110 §5.6.7 requires recipients to
//! accept the IMF-fixdate format and the two obsolete ones (RFC 850 and
//! asctime); `httpdate` parses all three. Providers also write decimal
//! seconds (Shopify's `Retry-After: 2.0`), and OpenAI, Anthropic and Azure
//! send `retry-after-ms` beside it, the finer of the two (R-PD4). Anything
//! else is ignored — a malformed header never panics and never becomes a
//! wait of its own.

use std::time::{Duration, SystemTime};

use super::formats;

/// The longest wait sluice will believe (one day). A provider asking for
/// more is treated as asking for a day: the hold still protects it, and the
/// request is handed back to the client long before that matters.
pub const MAX_BELIEVED: Duration = formats::MAX_BELIEVED;

/// Parses a `Retry-After` value into a wait from `now_wall`.
///
/// * `"120"` → 120 s, `"2.0"` → 2 s, `"0.5"` → 500 ms; leading/trailing
///   whitespace is tolerated.
/// * An HTTP-date in any of the three RFC 9110 formats → the time until that
///   date; a date in the past → zero.
/// * Anything else (negative numbers, garbage, empty) → `None`.
///
/// `now_wall` is injected so that HTTP-dates can be tested without a clock.
pub fn parse(value: &str, now_wall: SystemTime) -> Option<Duration> {
    formats::delta_seconds(value).or_else(|| formats::http_date(value, now_wall))
}

/// Reads the wait a response asks for: `retry-after-ms` where it is sent
/// and readable (the finer), else `Retry-After`.
pub fn from_headers(headers: &http::HeaderMap, now_wall: SystemTime) -> Option<Duration> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    text("retry-after-ms")
        .and_then(formats::milliseconds)
        .or_else(|| parse(text(http::header::RETRY_AFTER.as_str())?, now_wall))
}

/// Formats a wait as delta-seconds for a `Retry-After` header sluice writes,
/// rounding up so that a client never comes back early.
pub fn format_delta(wait: Duration) -> String {
    let mut secs = wait.as_secs();
    if wait.subsec_nanos() > 0 {
        secs += 1;
    }
    secs.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    // Sun, 06 Nov 1994 08:49:37 GMT, the example of RFC 9110 §5.6.7.
    const EXAMPLE: u64 = 784_111_777;

    #[test]
    fn delta_seconds() {
        let now = at(EXAMPLE);
        assert_eq!(parse("0", now), Some(Duration::ZERO));
        assert_eq!(parse("2", now), Some(Duration::from_secs(2)));
        assert_eq!(parse(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(parse("99999999999999999999999", now), Some(MAX_BELIEVED));
    }

    #[test]
    fn the_three_date_formats_of_rfc_9110() {
        let now = at(EXAMPLE - 30);
        let want = Some(Duration::from_secs(30));
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:37 GMT", now), want);
        assert_eq!(parse("Sunday, 06-Nov-94 08:49:37 GMT", now), want);
        assert_eq!(parse("Sun Nov  6 08:49:37 1994", now), want);
    }

    #[test]
    fn past_dates_are_zero() {
        let now = at(EXAMPLE + 3600);
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn garbage_is_ignored() {
        let now = at(EXAMPLE);
        for bad in [
            "",
            " ",
            "-5",
            "soon",
            "5s",
            "Sun, 99 Nov 1994 08:49:37 GMT",
            "\u{0}",
        ] {
            assert_eq!(parse(bad, now), None, "{bad:?}");
        }
    }

    /// R-PD4: decimal seconds (Shopify) and `retry-after-ms` (OpenAI,
    /// Anthropic, Azure), the finer read first.
    #[test]
    fn decimals_and_milliseconds() {
        let now = at(EXAMPLE);
        assert_eq!(parse("2.0", now), Some(Duration::from_secs(2)));
        assert_eq!(parse("1.5", now), Some(Duration::from_millis(1500)));
        let mut h = http::HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(from_headers(&h, now), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "1250".parse().unwrap());
        assert_eq!(from_headers(&h, now), Some(Duration::from_millis(1250)));
        h.insert("retry-after-ms", "soon".parse().unwrap());
        assert_eq!(from_headers(&h, now), Some(Duration::from_secs(2)));
        h.remove(http::header::RETRY_AFTER);
        h.insert("retry-after-ms", "800".parse().unwrap());
        assert_eq!(from_headers(&h, now), Some(Duration::from_millis(800)));
    }

    #[test]
    fn header_that_is_not_text_is_ignored() {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        assert_eq!(from_headers(&h, at(EXAMPLE)), None);
    }

    #[test]
    fn formatting_rounds_up() {
        assert_eq!(format_delta(Duration::from_millis(0)), "0");
        assert_eq!(format_delta(Duration::from_millis(1)), "1");
        assert_eq!(format_delta(Duration::from_millis(2000)), "2");
        assert_eq!(format_delta(Duration::from_millis(2001)), "3");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = parse(&s, at(EXAMPLE));
        }
    }
}
