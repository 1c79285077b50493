//! What an attempt came back with, as one value: [`Outcome`], read from a
//! response head ([`Outcome::of`]), with the predicates every layer asks of
//! it. (A failure from below a layer becomes an outcome in the module
//! above: [`Outcome::of_result`].)

use std::time::{Duration, SystemTime};

use http::StatusCode;

/// What one upstream attempt came back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response that says the provider is fine: 1xx–3xx.
    Success,
    /// 429 or 503: the provider asks us to slow down, maybe saying until when.
    Throttled {
        /// The status, 429 or 503.
        status: u16,
        /// The parsed `Retry-After`, if the provider sent one.
        retry_after: Option<Duration>,
    },
    /// The provider's capacity ran short, not the client's budget
    /// (Anthropic's `529 overloaded_error`, by its dialect): weighed as a
    /// bare `503` is, never held.
    Overloaded {
        /// The status.
        status: u16,
    },
    /// Any other 5xx.
    ServerError {
        /// The status.
        status: u16,
    },
    /// A 4xx other than 408 and 429: the request itself is wrong. Never
    /// retried, never held against the provider.
    ClientError {
        /// The status.
        status: u16,
    },
    /// The attempt timed out (sluice's per-attempt timeout or a 408 from the
    /// provider).
    Timeout,
    /// No connection could be made (refused, reset before a response, DNS,
    /// TLS handshake).
    ConnectError {
        /// Whether a new attempt might get through: a refused or reset
        /// connection might; a name that does not resolve, an untrusted
        /// certificate or a peer that does not speak HTTP will not.
        retryable: bool,
    },
}

impl Outcome {
    /// Classifies a response head. `now_wall` turns an HTTP-date
    /// `Retry-After` into a wait.
    pub fn of(status: StatusCode, headers: &http::HeaderMap, now_wall: SystemTime) -> Self {
        let code = status.as_u16();
        match code {
            429 | 503 => Outcome::Throttled {
                status: code,
                retry_after: super::retry_after::from_headers(headers, now_wall),
            },
            408 => Outcome::Timeout,
            500..=599 => Outcome::ServerError { status: code },
            400..=499 => Outcome::ClientError { status: code },
            _ => Outcome::Success,
        }
    }

    /// Whether a retry may help: 429, 408, 5xx, timeouts, and connections
    /// that were refused or reset (R-RB1). Other 4xx never are, nor
    /// failures a new attempt cannot change (DNS, TLS, not HTTP).
    pub fn is_retryable(&self) -> bool {
        match self {
            Outcome::Success | Outcome::ClientError { .. } => false,
            Outcome::ConnectError { retryable } => *retryable,
            Outcome::Throttled { .. }
            | Outcome::Overloaded { .. }
            | Outcome::ServerError { .. }
            | Outcome::Timeout => true,
        }
    }

    /// Whether the breaker counts this as a failure (R-CB1: failure or
    /// throttle), and a run waits for a sound answer after it (R-RN8):
    /// everything but a success and the client's own mistake — a provider
    /// whose name does not resolve is as unreachable as one that refuses,
    /// though retrying will not help.
    pub fn is_breaker_failure(&self) -> bool {
        !matches!(self, Outcome::Success | Outcome::ClientError { .. })
    }

    /// A short, bounded label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Throttled { .. } => "throttled",
            Outcome::Overloaded { .. } => "overloaded",
            Outcome::ServerError { .. } => "server_error",
            Outcome::ClientError { .. } => "client_error",
            Outcome::Timeout => "timeout",
            Outcome::ConnectError { .. } => "connect_error",
        }
    }

    /// The provider's `Retry-After`, if this outcome carries one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::Throttled { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(code: u16, retry_after: Option<&str>) -> Outcome {
        let mut h = http::HeaderMap::new();
        if let Some(v) = retry_after {
            h.insert(http::header::RETRY_AFTER, v.parse().unwrap());
        }
        Outcome::of(
            StatusCode::from_u16(code).unwrap(),
            &h,
            SystemTime::UNIX_EPOCH,
        )
    }

    #[test]
    fn classification() {
        assert_eq!(of(200, None), Outcome::Success);
        assert_eq!(of(304, None), Outcome::Success);
        assert_eq!(
            of(429, Some("3")),
            Outcome::Throttled {
                status: 429,
                retry_after: Some(Duration::from_secs(3))
            }
        );
        assert_eq!(
            of(503, None),
            Outcome::Throttled {
                status: 503,
                retry_after: None
            }
        );
        assert_eq!(of(408, None), Outcome::Timeout);
        assert_eq!(of(502, None), Outcome::ServerError { status: 502 });
        assert_eq!(of(404, None), Outcome::ClientError { status: 404 });
    }

    #[test]
    fn only_pressure_is_retryable() {
        assert!(!of(200, None).is_retryable());
        assert!(!of(404, None).is_retryable());
        assert!(!of(400, None).is_breaker_failure());
        for code in [429, 408, 500, 502, 503, 504] {
            assert!(of(code, None).is_retryable(), "{code}");
            assert!(of(code, None).is_breaker_failure(), "{code}");
        }
        assert!(Outcome::ConnectError { retryable: true }.is_retryable());
    }
}
