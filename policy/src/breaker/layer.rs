use std::sync::Arc;

use tower::Layer;

use super::service::Breaker;
use super::HasBreaker;

/// Applies a provider's breaker. Cloning the layer shares the same state.
#[derive(Debug)]
pub struct BreakerLayer<P> {
    shared: Arc<P>,
}

impl<P> Clone for BreakerLayer<P> {
    fn clone(&self) -> Self {
        BreakerLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<P: HasBreaker> BreakerLayer<P> {
    /// A layer over the breaker `shared` holds.
    pub fn new(shared: Arc<P>) -> Self {
        BreakerLayer { shared }
    }

    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Breaker<S, P> {
        Breaker {
            inner,
            shared: self.shared,
        }
    }
}

impl<S, P: HasBreaker> Layer<S> for BreakerLayer<P> {
    type Service = Breaker<S, P>;

    fn layer(&self, inner: S) -> Breaker<S, P> {
        Breaker {
            inner,
            shared: self.shared.clone(),
        }
    }
}
