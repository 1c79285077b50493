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

impl<S> Layer<S> for BreakerLayer {
    type Service = Breaker<S>;

    fn layer(&self, inner: S) -> Breaker<S> {
        Breaker {
            inner,
            shared: self.shared.clone(),
        }
    }
}
