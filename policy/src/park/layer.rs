use std::sync::Arc;

use tower::Layer;

use super::{HasPark, Park};

/// Parks a provider's requests through its outages. Cloning the layer
/// shares the same watch.
#[derive(Debug)]
pub struct ParkLayer<P> {
    provider: Arc<str>,
    shared: Arc<P>,
}

impl<P> Clone for ParkLayer<P> {
    fn clone(&self) -> Self {
        ParkLayer {
            provider: self.provider.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<P: HasPark> ParkLayer<P> {
    /// The parking of `provider` (the name a run's cycle guard counts
    /// under), in what `shared` holds.
    pub fn new(provider: impl Into<Arc<str>>, shared: Arc<P>) -> Self {
        ParkLayer {
            provider: provider.into(),
            shared,
        }
    }

    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Park<S, P> {
        Park {
            inner,
            provider: self.provider,
            shared: self.shared,
        }
    }
}

impl<S, P: HasPark> Layer<S> for ParkLayer<P> {
    type Service = Park<S, P>;

    fn layer(&self, inner: S) -> Park<S, P> {
        Park {
            inner,
            provider: self.provider.clone(),
            shared: self.shared.clone(),
        }
    }
}
