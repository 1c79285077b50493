use std::sync::Arc;

use tower::Layer;

use super::{Bulkhead, HasBulkhead};

/// Applies a provider's bulkhead. Cloning shares the permits.
#[derive(Debug)]
pub struct BulkheadLayer<P> {
    shared: Arc<P>,
}

impl<P> Clone for BulkheadLayer<P> {
    fn clone(&self) -> Self {
        BulkheadLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<P: HasBulkhead> BulkheadLayer<P> {
    /// A layer over the permits of the bulkhead `shared` holds.
    pub fn new(shared: Arc<P>) -> Self {
        BulkheadLayer { shared }
    }

    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Bulkhead<S, P> {
        Bulkhead::new(inner, self.shared)
    }
}

impl<S, P: HasBulkhead> Layer<S> for BulkheadLayer<P> {
    type Service = Bulkhead<S, P>;

    fn layer(&self, inner: S) -> Bulkhead<S, P> {
        Bulkhead::new(inner, self.shared.clone())
    }
}
