use std::time::Duration;

use super::DownReason;

/// A request parked through an outage waited as long as it may
/// (`max_outage_wait`) and the provider is still down. Nothing more was
/// sent for it. It reaches the layers as
/// [`crate::error::Cause::ProviderDown`].
#[derive(Debug, Clone)]
pub struct ProviderDown {
    /// How long the request waited parked.
    pub waited: Duration,
    /// When the next probe goes: worth coming back after.
    pub retry_after: Duration,
    /// Why the provider is taken to be down.
    pub reason: DownReason,
}
