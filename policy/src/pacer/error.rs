use std::time::Duration;

use super::core::Refusal;

/// The pacer refused a request: its slot would come later than it may
/// wait, or the waiting room is full. Nothing was sent to the provider.
/// It reaches the layers as [`crate::error::Cause::RateLimited`].
#[derive(Debug, Clone)]
pub struct RateLimited {
    /// Why.
    pub refusal: Refusal,
    /// When the slot would have come.
    pub retry_after: Duration,
}

impl RateLimited {
    pub(crate) fn new(refusal: Refusal, retry_after: Duration) -> Self {
        RateLimited {
            refusal,
            retry_after,
        }
    }
}
