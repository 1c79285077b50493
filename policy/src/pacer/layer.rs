use std::sync::Arc;

use tower::Layer;

use super::{HasPacer, Pacer};

/// Applies a provider's pacer. Cloning the layer shares the same state.
#[derive(Debug)]
pub struct PacerLayer<P> {
    shared: Arc<P>,
}

impl<P> Clone for PacerLayer<P> {
    fn clone(&self) -> Self {
        PacerLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<P: HasPacer> PacerLayer<P> {
    /// A layer over the pacer `shared` holds.
    pub fn new(shared: Arc<P>) -> Self {
        PacerLayer { shared }
    }

    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> Pacer<S, P> {
        Pacer::new(inner, self.shared)
    }
}

impl<S, P: HasPacer> Layer<S> for PacerLayer<P> {
    type Service = Pacer<S, P>;

    fn layer(&self, inner: S) -> Pacer<S, P> {
        Pacer::new(inner, self.shared.clone())
    }
}
