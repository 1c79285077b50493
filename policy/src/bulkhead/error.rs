use std::time::Duration;

/// The bulkhead refused: too many attempts in flight and waiting.
/// It reaches the layers as [`crate::error::Cause::BulkheadFull`].
#[derive(Debug, Clone)]
pub struct BulkheadFull {
    /// A suggestion for when to come back.
    pub retry_after: Duration,
}
