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

impl PacerLayer {
    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Pacer<S> {
        Pacer::new(inner, self.shared)
    }
}

impl<S> Layer<S> for PacerLayer {
    type Service = Pacer<S>;

    fn layer(&self, inner: S) -> Pacer<S> {
        Pacer::new(inner, self.shared.clone())
    }
}
