//! The values that cross layers (issue 33): what a request is, and what
//! its attempt learned.
//!
//! tower's layers know nothing of each other; ours must share a few facts
//! of each request — its price in units, its run, its departure — and of
//! each answer — its time to first byte, its outcome, what the provider
//! charged. Carried as a type per fact, each layer came to import the
//! layer that wrote it (the bulkhead imported the pacer for `Ttfb`, the
//! run gate the pacer for `Charged`). Here they are two values, owned by
//! no layer: every layer reads what it needs from them and imports no
//! other.
//!
//! * [`Report`] — what one attempt learned, stamped on its response by the
//!   innermost measuring layer (the bulkhead: time to first byte from the
//!   permit, the outcome classified once); the pacer adds the units the
//!   provider said it charged beyond the price.

use std::time::{Duration, SystemTime};

use crate::classify::Outcome;

/// What one attempt learned, in its response's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// From the moment the attempt held its permit (waiting inside sluice
    /// never reads as a slow provider) to the response head.
    pub ttfb: Duration,
    /// The answer, classified once for every layer (`crate::classify`).
    pub outcome: Outcome,
    /// Units the provider said it charged beyond the request's price (its
    /// cost header), for the run's count (R-FS2); 0 if none.
    pub charged: u32,
}

impl Report {
    /// The report of `resp`, if a measuring layer stamped one.
    pub fn of<R>(resp: &http::Response<R>) -> Option<&Report> {
        resp.extensions().get::<Report>()
    }

    /// Stamps `resp` with its report: `ttfb`, and the outcome classified at
    /// `now_wall` (a `Retry-After` date needs it).
    pub fn stamp<R>(resp: &mut http::Response<R>, ttfb: Duration, now_wall: SystemTime) -> Outcome {
        let outcome = Outcome::of(resp.status(), resp.headers(), now_wall);
        resp.extensions_mut().insert(Report {
            ttfb,
            outcome,
            charged: 0,
        });
        outcome
    }
}
