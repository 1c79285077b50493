use super::StopReason;

/// A run's envelope refused an attempt. Nothing was sent.
/// It reaches the layers as [`crate::error::Cause::RunStopped`].
#[derive(Debug, Clone)]
pub struct RunStopped {
    /// Why.
    pub reason: StopReason,
    /// The provider whose part of the run stopped (source pressure,
    /// R-RN8); `None` when the whole run stopped (a budget).
    pub provider: Option<String>,
}

impl RunStopped {
    /// The whole run stopped.
    pub fn run(reason: StopReason) -> Self {
        RunStopped {
            reason,
            provider: None,
        }
    }

    /// Only `provider`'s part of the run stopped.
    pub fn provider(reason: StopReason, provider: &str) -> Self {
        RunStopped {
            reason,
            provider: Some(provider.to_string()),
        }
    }
}
