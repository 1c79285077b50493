use std::sync::Arc;

use tower::Layer;

use super::{Park, ParkShared};

/// Parks a provider's requests through its outages. Cloning the layer
/// shares the same watch.
#[derive(Debug, Clone)]
pub struct ParkLayer {
    provider: Arc<str>,
    shared: Arc<ParkShared>,
}

impl ParkLayer {
    /// The parking of `provider` (the name a run's cycle guard counts
    /// under).
    pub fn new(provider: impl Into<Arc<str>>, shared: Arc<ParkShared>) -> Self {
        ParkLayer {
            provider: provider.into(),
            shared,
        }
    }
}

impl ParkLayer {
    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Park<S> {
        Park {
            inner,
            provider: self.provider,
            shared: self.shared,
        }
    }
}

impl<S> Layer<S> for ParkLayer {
    type Service = Park<S>;

    fn layer(&self, inner: S) -> Park<S> {
        Park {
            inner,
            provider: self.provider.clone(),
            shared: self.shared.clone(),
        }
    }
}
