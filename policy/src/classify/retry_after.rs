//! Parsing `Retry-After` (RFC 9110 §10.2.3).
//!
//! A provider that says when to come back has told us the one number no
//! controller can learn as well, so sluice honours it exactly. The header is
//! either delta-seconds or an HTTP-date. RFC 9110 §5.6.7 requires recipients
//! to accept the IMF-fixdate format and the two obsolete ones (RFC 850 and
//! asctime); `httpdate` parses all three. Anything else is ignored — a
//! malformed header never panics and never becomes a wait of its own.

use std::time::{Duration, SystemTime};

/// The longest wait sluice will believe (one day). A provider asking for
/// more is treated as asking for a day: the hold still protects it, and the
/// request is handed back to the client long before that matters.
pub const MAX_BELIEVED: Duration = Duration::from_secs(24 * 60 * 60);

/// Parses a `Retry-After` value into a wait from `now_wall`.
///
/// * `"120"` → 120 s; leading/trailing whitespace is tolerated.
/// * An HTTP-date in any of the three RFC 9110 formats → the time until that
///   date; a date in the past → zero.
/// * Anything else (negative numbers, fractions, garbage, empty) → `None`.
///
/// `now_wall` is injected so that HTTP-dates can be tested without a clock.
pub fn parse(value: &str, now_wall: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // delta-seconds = 1*DIGIT; an overlong number saturates.
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_BELIEVED));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(
        date.duration_since(now_wall)
            .unwrap_or(Duration::ZERO)
            .min(MAX_BELIEVED),
    )
}

/// Reads and parses the `Retry-After` header of a response, if any.
pub fn from_headers(headers: &http::HeaderMap, now_wall: SystemTime) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    parse(value, now_wall)
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
            "1.5",
            "soon",
            "5s",
            "Sun, 99 Nov 1994 08:49:37 GMT",
            "\u{0}",
        ] {
            assert_eq!(parse(bad, now), None, "{bad:?}");
        }
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
