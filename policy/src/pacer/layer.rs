use std::sync::Arc;

use tower::Layer;

use super::{Pacer, PacerShared};

/// Applies a provider's pacer. Cloning the layer shares the same state.
#[derive(Debug, Clone)]
pub struct PacerLayer {
    shared: Arc<PacerShared>,
}

impl PacerLayer {
    /// A layer over the given shared pacer.
    pub fn new(shared: Arc<PacerShared>) -> Self {
        PacerLayer { shared }
    }
}

impl<S> Layer<S> for PacerLayer {
    type Service = Pacer<S>;

    fn layer(&self, inner: S) -> Pacer<S> {
        Pacer::new(inner, self.shared.clone())
    }
}
