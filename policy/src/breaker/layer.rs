use std::sync::Arc;

use tower::Layer;

use super::service::Breaker;
use super::BreakerShared;

/// Applies a provider's breaker. Cloning the layer shares the same state.
#[derive(Debug, Clone)]
pub struct BreakerLayer {
    shared: Arc<BreakerShared>,
}

impl BreakerLayer {
    /// A layer over the given shared breaker.
    pub fn new(shared: Arc<BreakerShared>) -> Self {
        BreakerLayer { shared }
    }
}

impl BreakerLayer {
    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            shared: self.shared,
        }
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            shared: self.shared.clone(),
        }
    }
}
