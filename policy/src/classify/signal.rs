//! What an outcome says about the provider: one [`Signal`] per outcome,
//! the one reading the rate controller dispatches on and the outage watch
//! reads.

use std::time::Duration;

use super::outcome::Outcome;

/// What an outcome says about the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// It works: a success, or the client's own mistake (a 404 for a
    /// deleted record is the provider working normally).
    Clean,
    /// It asks us to slow down and said so: a 429, or a 503 with
    /// `Retry-After` — held exactly that long if it said how long.
    Throttle {
        /// The status, 429 or 503.
        status: u16,
        /// The provider's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// Pressure or noise, the evidence decides: a bare 503 (many providers
    /// throttle that way; many fail that way at random), a timeout.
    Ambiguous {
        /// A timeout (sluice's or a 408), rather than a bare 503.
        timeout: bool,
    },
    /// It failed: another 5xx, no connection. Never a throttle by itself.
    Failure,
}

impl Signal {
    /// Whether the provider answered as a working server does (clean, or a
    /// throttle it named): not a sign of an outage.
    pub fn alive(self) -> bool {
        matches!(self, Signal::Clean | Signal::Throttle { .. })
    }
}

impl Outcome {
    /// What this outcome says about the provider (see [`Signal`]).
    pub fn signal(&self) -> Signal {
        match *self {
            Outcome::Success | Outcome::ClientError { .. } => Signal::Clean,
            Outcome::Throttled {
                status: 503,
                retry_after: None,
            } => Signal::Ambiguous { timeout: false },
            Outcome::Throttled {
                status,
                retry_after,
            } => Signal::Throttle {
                status,
                retry_after,
            },
            Outcome::Overloaded { .. } => Signal::Ambiguous { timeout: false },
            Outcome::Timeout => Signal::Ambiguous { timeout: true },
            Outcome::ServerError { .. } | Outcome::ConnectError { .. } => Signal::Failure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signals, as every layer reads them: a bare 503 and a timeout are
    /// ambiguous, a 429 or a 503 that says when is a named throttle, a 404
    /// is clean.
    #[test]
    fn each_outcome_gives_one_signal() {
        let throttled = |status, retry_after| Outcome::Throttled {
            status,
            retry_after,
        };
        let wait = Some(Duration::from_secs(2));
        assert_eq!(Outcome::Success.signal(), Signal::Clean);
        assert_eq!(Outcome::ClientError { status: 404 }.signal(), Signal::Clean);
        assert_eq!(
            throttled(429, None).signal(),
            Signal::Throttle {
                status: 429,
                retry_after: None
            }
        );
        assert_eq!(
            throttled(503, wait).signal(),
            Signal::Throttle {
                status: 503,
                retry_after: wait
            }
        );
        assert_eq!(
            throttled(503, None).signal(),
            Signal::Ambiguous { timeout: false }
        );
        assert_eq!(
            Outcome::Timeout.signal(),
            Signal::Ambiguous { timeout: true }
        );
        assert_eq!(
            Outcome::ServerError { status: 502 }.signal(),
            Signal::Failure
        );
        assert_eq!(
            Outcome::ConnectError { retryable: true }.signal(),
            Signal::Failure
        );
        assert!(throttled(429, None).signal().alive());
        assert!(!throttled(503, None).signal().alive());
    }
}
