//! Classification: what an attempt's result means, decided once for every
//! layer (R-SG3, R-SG4, R-RA1).
//!
//! The pacer, the breaker, the retry policy, the parking layer, the run
//! envelope and the metrics all ask of an attempt "did it reach the
//! provider? was that a throttle? may it be retried? does it count against
//! the provider? is the provider down?". Each asking it its own way is how
//! a bare `503` came to be read three ways. Here it is read once:
//!
//! * [`Outcome`] (`outcome.rs`) — what came back: a response head's status
//!   and `Retry-After` ([`retry_after`]), or a failure below the layers
//!   ([`Outcome::of_result`], the one place a [`Cause`] becomes an
//!   outcome; sluice's own refusals are none);
//! * [`Signal`] — what it says about the provider: clean, a throttle it
//!   named, ambiguous (a bare `503`, a timeout: noise or pressure, the
//!   controller weighs it), or a failure. The rate controller dispatches on
//!   it; the outage watch reads clean and named throttles as a live
//!   provider, the rest as failing (`crate::park::watch`).
//!
//! * [`Dialect`] (`dialect.rs`) — how a provider says it (R-PD2, R-PD3): a
//!   GitHub throttle answered `403`, an OpenAI `429` no wait will fix, an
//!   Anthropic `529` that is capacity, a Google delay in the body — a
//!   table that maps a response to an outcome, not a change to every
//!   layer.
//! * [`Resource`] (`resource.rs`) — which of a provider's budgets a
//!   request draws on when one host keeps several (R-PD1): GitHub's
//!   `search` beside `core`, Discord's per-route buckets.

pub mod dialect;
pub mod formats;
pub mod outcome;
pub mod resource;
pub mod retry_after;
mod signal;

use std::time::SystemTime;

pub use self::dialect::{Dialect, ErrorBody};
pub use self::outcome::Outcome;
pub use self::resource::Resource;
pub use self::signal::Signal;
use crate::attempt::{CarriesReport, Report};
use crate::error::Cause;

/// The outcome of a response: classified once by the innermost layer that
/// measures it ([`Report`]), so that every layer above
/// reads the same verdict.
pub fn of_response<R: CarriesReport>(resp: &http::Response<R>, now_wall: SystemTime) -> Outcome {
    Report::of(resp)
        .map(|r| r.outcome)
        .unwrap_or_else(|| Outcome::of(resp.status(), resp.headers(), now_wall))
}

/// [`of_response`], reading the wall clock only for a response that was
/// never stamped (a `Retry-After` date needs it).
pub fn of_response_now<R: CarriesReport>(resp: &http::Response<R>) -> Outcome {
    match Report::of(resp) {
        Some(r) => r.outcome,
        None => Outcome::of(resp.status(), resp.headers(), SystemTime::now()),
    }
}

impl Outcome {
    /// Classifies an error from below a layer. `None` means the error is
    /// sluice's own refusal (pacer queue full, breaker open, bulkhead full,
    /// run stopped) or the client's fault: no request reached the provider,
    /// so the provider's state must not learn anything from it.
    pub fn of_error(err: &Cause) -> Option<Self> {
        err.info().outcome
    }

    /// What an attempt came back with — a response or a failure — as every
    /// layer sees it; `None` when it never reached the provider (see
    /// [`Outcome::of_error`]). The one place a result becomes an outcome.
    pub fn of_result<R: CarriesReport>(
        result: &Result<http::Response<R>, Cause>,
        now_wall: SystemTime,
    ) -> Option<Self> {
        match result {
            Ok(resp) => Some(of_response(resp, now_wall)),
            Err(e) => Outcome::of_error(e),
        }
    }

    /// [`Outcome::of_result`], reading the wall clock only for a response
    /// no layer stamped (a `Retry-After` date needs it): a stamped answer
    /// costs each layer that reads it no clock read.
    pub fn of_result_now<R: CarriesReport>(
        result: &Result<http::Response<R>, Cause>,
    ) -> Option<Self> {
        match result {
            Ok(resp) => Some(of_response_now(resp)),
            Err(e) => Outcome::of_error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// One decision for every layer: a failure that reached the provider
    /// is classified the same whether the retry policy, the breaker or the
    /// run asks; sluice's own refusals and the client's faults are nothing.
    #[test]
    fn results_are_classified_once() {
        use crate::error::{CircuitOpen, Upstream, UpstreamKind};
        let now = SystemTime::UNIX_EPOCH;
        let err =
            |kind| -> Result<http::Response<()>, Cause> { Err(Upstream::new(kind, "x").into()) };
        let dns = Outcome::of_result(&err(UpstreamKind::Dns), now).unwrap();
        assert_eq!(dns, Outcome::ConnectError { retryable: false });
        assert!(!dns.is_retryable(), "a name that does not resolve stays so");
        assert!(dns.is_breaker_failure(), "but the provider is unreachable");
        let refused = Outcome::of_result(&err(UpstreamKind::ConnectionRefused), now).unwrap();
        assert!(refused.is_retryable() && refused.is_breaker_failure());
        assert_eq!(
            Outcome::of_result(&err(UpstreamKind::ConnectionTimeout), now),
            Some(Outcome::Timeout)
        );
        assert_eq!(
            Outcome::of_result(&err(UpstreamKind::ClientBody), now),
            None
        );
        assert_eq!(
            Outcome::of_result(&err(UpstreamKind::Prohibited), now),
            None
        );
        let open: Result<http::Response<()>, Cause> = Err(CircuitOpen {
            retry_after: Duration::from_secs(1),
            cycle: 1,
            throttled: false,
        }
        .into());
        assert_eq!(Outcome::of_result(&open, now), None);
        let ok: Result<http::Response<()>, Cause> = Ok(http::Response::new(()));
        assert_eq!(Outcome::of_result(&ok, now), Some(Outcome::Success));
    }
}
