use std::time::Duration;

/// The provider's breaker is open: the call failed fast without reaching
/// the provider and without spending retry budget.
#[derive(Debug, Clone, thiserror::Error)]
#[error("circuit open for this provider, retry after {retry_after:?}")]
pub struct CircuitOpen {
    /// Time until the breaker lets a probe through.
    pub retry_after: Duration,
}
