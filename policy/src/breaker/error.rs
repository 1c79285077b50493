use std::time::Duration;

/// The provider's breaker is open: the call failed fast without reaching
/// the provider and without spending retry budget.
/// It reaches the layers as [`crate::error::Cause::CircuitOpen`].
#[derive(Debug, Clone)]
pub struct CircuitOpen {
    /// Time until the breaker lets a probe through.
    pub retry_after: Duration,
    /// The open period it belongs to ([`super::Breaker::cycle`]): a run's
    /// requests waiting out the same one count as one wait (R-RN8).
    pub cycle: u64,
    /// It opened for throttles — the provider asking to slow down, not
    /// failing: answered as a throttle (`429`), not as an unavailable
    /// provider (R-PD3).
    pub throttled: bool,
}
