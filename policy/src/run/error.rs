use super::StopReason;

/// A run's envelope refused an attempt. Nothing was sent.
/// It reaches the layers as [`crate::error::Cause::RunStopped`].
#[derive(Debug, Clone)]
pub struct RunStopped {
    /// Why.
    pub reason: StopReason,
}
