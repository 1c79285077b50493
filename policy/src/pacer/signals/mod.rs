//! Telling a throttle from noise (R-SG3): the evidence the AIMD controller
//! weighs before it cuts.
//!
//! Real providers answer a percent or two of requests with a bare `503` or
//! another 5xx whatever the load, and some requests cost more than others.
//! A controller that cuts on every such answer throttles itself to a crawl
//! (measured: a 1,000 req/s provider with 2 % random 503s got 3 % of the
//! clean throughput). Two pieces of evidence keep it honest:
//!
//! * [`ErrorTally`] asks whether ambiguous errors (bare 503, other 5xx,
//!   connect errors, timeouts) *rise with the rate*. It keeps a decaying
//!   count of answers and errors per rate band; an error at the current
//!   rate weighs as pressure only when the errors near that rate are
//!   significantly more frequent than at the rates below it (a Poisson tail
//!   test). Noise is as frequent at every rate; a throttle makes none below
//!   the limit and many above it. Where no lower rate has been seen (a long
//!   stretch at one rate) the errors of the last two windows are judged
//!   against the provider's learned *baseline* share instead; errors at or
//!   below it neither cut the rate nor spoil a window's growth. With
//!   neither yet, every error is significant, so a cold provider's first
//!   `503` still cuts (the seeds' scenario).
//! * [`LatencyWatch`] judges latency by the lower quartile of recent
//!   time-to-first-byte samples against a learned baseline of the same
//!   statistic. Up to three in four requests may be slow without moving it,
//!   so heavy requests mixed in at random never look like a provider
//!   slowing down; a provider that queues because it is pushed past its
//!   limit delays every request, and the quartile moves.
//!
//! Whether a cut on ambiguous evidence was right is settled afterwards by a
//! trial (see `aimd`): a cut that bought no fewer errors at the lower
//! rate is undone.

mod errors;
mod latency;
mod stats;

pub use self::errors::{
    Attribution, ErrorTally, Evidence, ERROR_BASELINE_MIN_ANSWERS, ERROR_MEMORY_WINDOWS, NOISE_MAX,
    RATE_AT_MIN_ANSWERS, RATE_BAND, RATE_BELOW, RATE_BELOW_MIN_ANSWERS,
};
pub use self::latency::{
    LatencyVerdict, LatencyWatch, LATENCY_ALPHA_DOWN, LATENCY_ALPHA_UP,
    LATENCY_BASELINE_MIN_SAMPLES, LATENCY_MIN_SAMPLES, LATENCY_PATIENCE, LATENCY_SAMPLES,
    LATENCY_SLACK, LATENCY_WORSE,
};
pub use self::stats::{
    binomial_tail, poisson_below, poisson_tail, rate_test, Count, Wide, SIGNIFICANCE,
};

/// A measure or none, in one word — a rate delivered, a rate to return
/// to, a latency baseline: none is NaN, which no measure is (an
/// `Option<f64>` takes two words: issue 38, R-PF1).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Maybe(f64);

impl Default for Maybe {
    fn default() -> Self {
        Maybe::NONE
    }
}

impl From<Option<f64>> for Maybe {
    fn from(value: Option<f64>) -> Self {
        Maybe(value.filter(|v| !v.is_nan()).unwrap_or(f64::NAN))
    }
}

impl Maybe {
    /// None.
    pub(crate) const NONE: Maybe = Maybe(f64::NAN);

    pub(crate) fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }
}
