use std::sync::Arc;

use tower::Layer;

use super::{Bulkhead, BulkheadShared};

/// Applies a provider's bulkhead. Cloning shares the permits.
#[derive(Debug, Clone)]
pub struct BulkheadLayer {
    shared: Arc<BulkheadShared>,
}

impl BulkheadLayer {
    /// A layer over the given shared permits.
    pub fn new(shared: Arc<BulkheadShared>) -> Self {
        BulkheadLayer { shared }
    }
}

impl BulkheadLayer {
    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Bulkhead<S> {
        Bulkhead::new(inner, self.shared)
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;

    fn layer(&self, inner: S) -> Bulkhead<S> {
        Bulkhead::new(inner, self.shared.clone())
    }
}
