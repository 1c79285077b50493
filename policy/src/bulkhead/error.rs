use std::time::Duration;

/// The bulkhead refused: too many attempts in flight and waiting.
#[derive(Debug, Clone, thiserror::Error)]
#[error("too many requests in flight to this provider")]
pub struct BulkheadFull {
    /// A suggestion for when to come back.
    pub retry_after: Duration,
}
