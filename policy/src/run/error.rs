use super::StopReason;

/// A run's envelope refused an attempt. Nothing was sent.
#[derive(Debug, Clone, thiserror::Error)]
#[error("run stopped: {}", reason.label())]
pub struct RunStopped {
    /// Why.
    pub reason: StopReason,
}
